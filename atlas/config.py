"""Typed configuration: YAML recipes → nested dataclasses, dotted overrides, strict validation.

A recipe is a YAML mapping with one section per component (`retriever`, `index`, `reader`,
`task`, `training`, `evaluation`). Every key is checked by pydantic against the section dataclasses
(`common.config_section`'s rules): an unknown key or a value of the wrong type raises `ConfigError` naming the
key and the file (or the command-line override it came from).

Names that select a registered component are checked against their registry once the
overrides are applied: `task.name` against the task registry (`tasks.base.TASKS`),
`task.options.*` against that task's `default_options` (name, and type = the default's
type), and `retriever.loss` against `retriever.losses.RETRIEVER_LOSSES` (its options, written beside the
name as in `retriever.loss: {name: emdr, granularity: token}`, against that loss's `default_options`
likewise; the plain `retriever.loss: emdr` means the loss's default options).

A recipe may start from another: a top-level `base: OTHER.yaml` (a path relative to the file that
names it) loads OTHER first, itself with its own `base` if it has one, and lays the file's keys over
it: mappings merge key by key, any other value (a list included) replaces the base's. So a variant
states only what differs from its parent. A `base` cycle or a base file that does not exist is
refused with `ConfigError` naming the file; an error in a key names the file that set it. Dotted
overrides apply after the whole chain, and the resolved config a run saves has no `base`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

import tasks  # noqa: F401  (importing the package registers every task)
from common.config_section import check_value, config_section, first_error
from common.io import atomic_write_text
from reader.reader_config import ReaderConfig
from retriever.index.settings import IndexConfig, IndexSettings
from retriever.retriever_config import LossConfig, RetrieverConfig
from tasks.base import TASKS, get_task
from tasks.data_checks import DataOverlapError, check_task_data

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration value that cannot be accepted; the message names key and source."""


@config_section
class InferenceConfig:
    """How a model answers (`Atlas.answer`, `atlas ask|evaluate|serve`, a run's evaluations): the passages it
    reads, their input length, the decoding and its precision. Saved with every model, so a fine-tuned run
    answers as it was evaluated; a reader folder may carry its own (`atlas.yaml`, beside its weights)."""

    # passages read per question (the first n retrieved); None = reader.n_context, what the reader trains on
    n_context: int | None = None
    # tokens of each (question, passage) input; None = reader.text_maxlength
    text_maxlength: int | None = None
    generation_max_length: int = 32  # generated tokens at most (after the decoder's start token)
    # Beams of beam search when answering (1 = greedy).
    num_beams: int = 1
    # beam search ranks hypotheses by log-probability / length**length_penalty: Hugging Face's 1.0
    # favours longer answers (a copying reader runs on past the answer's end); 0.0 ranks by
    # log-probability alone
    length_penalty: float = 1.0
    # every answer is a span of a passage read (constrained decoding, reader/span_constraint.py), for
    # extractive QA; closed-book examples and option scoring are unconstrained
    span_answers: bool = False
    # "auto" (the default): on a CPU "int8", where the answers held; elsewhere the encoder in bf16 where the
    # hardware multiplies it natively. "fp32": every pass in float32, for figures that must not depend on the
    # machine; "bf16": the encoder pass under bfloat16 autocast; "int8": the decoder and LM head with int8
    # weights, the encoder in float32 (CPU only: reader/int8_decoding.py); "bf16-int8": both, the fastest on a
    # CPU with native bf16, at some cost in answers (docs/results/speed.md). Training is unaffected.
    precision: Literal["auto", "fp32", "bf16", "int8", "bf16-int8"] = "auto"
    # w of the retrieval prior: a copy head copies from retrieved passage k in proportion to its own pointer
    # times softmax_k(score_k / prior_temperature)^w (0 = off; readers with a copy head). Given passages
    # without retrieval scores get none.
    retrieval_prior: float = 0.0
    # the temperature of that softmax over the passages' retrieval scores: where the prior was measured with
    # MiniLM's scores (a colder one all but picks the top passage: docs/results/reader.md)
    prior_temperature: float = 0.1
    # give a generated answer its spelling in the passages read (reader/surface.py: "3. 2 million" → "3.2
    # million"); None = where the reader's tokenizer loses text in a round trip (a lower-casing WordPiece), false
    # = decode as the tokenizer does (an imported reference model: its reference never respelled)
    restore_surface: bool | None = None
    # decode answers as facebookresearch/atlas and FiD did (an imported reference model: reader/surface.py
    # `reference_decode`): every special token dropped (a sentinel or `<unk>` the reader wrote inside an answer
    # leaves no space), then transformers 4's clean-up (" ." → "."); false = the tokenizer's decode, sentinels
    # kept for the task
    reference_decoding: bool = False
    # Answer "no answer in the passages" (tasks.citations.NO_ANSWER, scored as that text) instead of an answer that
    # no passage read holds (tasks whose answers are words of a passage; closed-book runs keep their answers)
    require_support: bool = False


@config_section
class TaskConfig:
    """Which task adapter formats the examples, and where the data is."""

    # The task adapter (`qa`, `kilt`, `mmlu`, `fever`, `reading`, `mlm`, `lm`, `section`, `ssm`); an unknown name is
    # refused listing the valid ones.
    name: str = "qa"
    # Training files (JSONL, or the task's own format: MMLU CSV, KILT JSONL).
    train_data: list[str] = field(default_factory=list)
    # Evaluation files, scored at every evaluation and at the end of training.
    eval_data: list[str] = field(default_factory=list)
    shots: int | None = None  # a seeded k-shot subset of the training data
    # No retrieval: the reader reads the query alone.
    closed_book: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # task-specific settings
    skip_invalid: bool = False  # count, log and skip malformed records instead of stopping at the first
    # Training and evaluation files that share examples (the same question) are refused at config load
    # (`validate_data`); true lets them through with a warning, for a pipeline check that knowingly
    # evaluates on what it trained on, or a benchmark whose own splits share a few questions (MMLU)
    allow_overlap: bool = False


@config_section
class TrainingConfig:
    """The optimisation recipe."""

    # The run folder: resolved config, logs, evaluations and checkpoints.
    output_dir: str = "runs/default"
    # Optimizer steps of the run.
    steps: int = 30
    batch_size: int = 1  # per rank and micro-batch; a resumed run keeps the global batch instead
    # Micro-batches per optimizer step (the loss is divided by it; no all-reduce but on the last).
    accumulation_steps: int = 1
    # The reader's peak learning rate (AdamW).
    lr: float = 4e-5
    # The query encoder's peak learning rate (its own AdamW).
    lr_retriever: float = 4e-5
    # the reader encoder's learning rate when it is pre-trained and the decoder is new
    # (warm-started readers); None = lr
    lr_encoder: float | None = None
    # AdamW weight decay, for both optimizers.
    weight_decay: float = 0.01
    # Linear warm-up steps before the schedule.
    warmup_steps: int = 5
    # The learning-rate schedule after warm-up.
    scheduler: Literal["linear", "cosine", "constant"] = "linear"
    # Gradient norm clipping (per optimizer).
    clip_norm: float = 1.0
    # `bf16` runs forward passes under bfloat16 autocast with float32 weights; `fp32` is plain float32.
    precision: Literal["fp32", "bf16"] = "fp32"
    # Seed of the few-shot sample, data order, dropout and initialisation.
    seed: int = 0
    # Steps between lines of `log.jsonl` and the progress output.
    log_every: int = 1
    eval_every: int = 0  # 0 = only at the end
    save_every: int = 0  # 0 = only at the end
    # Checkpoints kept in {output_dir}/checkpoints (the newest n; 0 = all). Each holds the weights
    # (reader/, retriever/) and training_state.pt: both optimizers' state (AdamW: two moments per
    # trained weight, about twice the trained weights in fp32), read only by --resume. `atlas train`
    # prints the sizes at the end; docs/guides/evaluate.md lists what a run folder holds.
    keep_last: int = 2
    # A DeepSpeed JSON config (e.g. configs/deepspeed/zero3.json): ZeRO stage 1–3 for the reader
    # (atlas/training/deepspeed_engine.py); batch sizes, accumulation and clipping come from the fields above.
    deepspeed: str | None = None


@config_section
class EvaluationConfig:
    """How predictions are made and scored."""

    # Questions per forward pass when evaluating.
    batch_size: int = 8
    # Write each evaluated example's prediction and retrieved passages to the run's `evals/` folder.
    write_predictions: bool = True
    # The k of the retrieval metrics (answer recall@k, provenance recall@k) reported beside the reader's scores.
    retrieval_k: list[int] = field(default_factory=lambda: [1, 5, 20])
    max_examples: int | None = None  # the first n examples of an evaluation file (n ≥ 1); None = all
    # When a retriever loss trains: answer recall of the retriever on the first n training questions,
    # logged at the start and at every evaluation, with a warning when it falls (0 = off)
    train_recall_examples: int = 64


@config_section
class AtlasConfig:
    """A whole run: one section per component."""

    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)

    def index_settings(self) -> IndexSettings:
        """How this run builds an index of `index.corpus`: the `index` section's settings, embedded in batches of
        `retriever.batch_size`."""
        return IndexSettings.of(self.index, batch_size=self.retriever.batch_size)


_CHECKER = pydantic.TypeAdapter(AtlasConfig)


def config_from_tree(tree: Any, source: str, origins: dict[str, str] | None = None) -> AtlasConfig:
    """The recipe mapping `tree` checked and typed into an `AtlasConfig` (`common.config_section`'s rules); an error
    names `source`, or the file `origins` says set the key."""
    try:
        return _CHECKER.validate_python(tree)
    except pydantic.ValidationError as e:
        error = first_error(e, AtlasConfig)
        raise ConfigError(f"{_source_of(error.key, origins or {}, source)}: {error.message}") from None


def _checked(value: Any, tp: Any, key: str, where: str) -> Any:
    """`value` checked and converted as a field of type `tp` at `key`; a `ConfigError` naming `where` if not."""
    try:
        return check_value(value, tp)
    except pydantic.ValidationError as e:
        raise ConfigError(f"{where}: {first_error(e, tp, key).message}") from None


def _set_dotted(tree: dict, dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Split `a.b=value` into the dotted key and a YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected KEY=VALUE, e.g. training.lr=4e-5")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}': empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _option_type(default: Any) -> Any:
    """The annotation a task option's value is checked against: its default's type."""
    if default is None:
        return Any
    if isinstance(default, list):
        return list[Any]
    if isinstance(default, dict):
        return dict[str, Any]
    return type(default)


def _source_of(key: str, origins: dict[str, str], default: str) -> str:
    """The file or override that last set `key` (or a section containing it; `a.b[2]` is set with `a.b`)."""
    parts = re.sub(r"\[\d+\]", "", key).split(".")
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        if prefix in origins:
            return origins[prefix]
    return default


def validate_components(config: AtlasConfig, origins: dict[str, str] | None = None, source: str = "<defaults>") -> None:
    """Check registry names and task and loss options; coerce option values to their defaults' types
    (and fill a loss's options with its defaults, so that the saved config says what ran).

    `origins` maps dotted keys set by overrides to the override's text, so that an error
    names where the offending value came from (else `source`, the file).
    """
    from retriever.losses import RETRIEVER_LOSSES  # heavy: torch; atlas.config stays light for the command line

    origins = origins or {}
    loss = config.retriever.loss
    if loss.name not in RETRIEVER_LOSSES:
        where = _source_of("retriever.loss.name", origins, source)
        raise ConfigError(
            f"{where}: 'retriever.loss' must be one of {', '.join(sorted(RETRIEVER_LOSSES))}; got {loss.name!r}"
        )
    loss_class = RETRIEVER_LOSSES[loss.name]
    checked = {}
    for option, value in loss.options.items():
        key = f"retriever.loss.{option}"
        where = _source_of(key, origins, source)
        if option not in loss_class.default_options:
            valid = ", ".join(sorted(loss_class.default_options)) or "(none)"
            raise ConfigError(f"{where}: unknown key '{key}' for retriever loss '{loss.name}' (valid options: {valid})")
        checked[option] = _checked(value, _option_type(loss_class.default_options[option]), key, where)
        choices = loss_class.option_choices.get(option)
        if choices is not None and checked[option] not in choices:
            raise ConfigError(f"{where}: '{key}' must be one of {', '.join(map(repr, choices))}, got {value!r}")
    loss.options = {**loss_class.default_options, **checked}
    for key, value, minimum, meaning in (
        ("evaluation.max_examples", config.evaluation.max_examples, 1, "all examples"),
        ("reader.trainable_encoder_layers", config.reader.trainable_encoder_layers, 0, "the whole encoder"),
        ("inference.n_context", config.inference.n_context, 1, "reader.n_context"),
        ("inference.text_maxlength", config.inference.text_maxlength, 1, "reader.text_maxlength"),
    ):
        if value is not None and value < minimum:
            raise ConfigError(
                f"{_source_of(key, origins, source)}: '{key}' must be at least {minimum} (or null for {meaning}); "
                f"got {value}"
            )
    for key, value in (
        ("evaluation.train_recall_examples", config.evaluation.train_recall_examples),
        ("inference.retrieval_prior", config.inference.retrieval_prior),
    ):
        if value < 0:
            raise ConfigError(f"{_source_of(key, origins, source)}: '{key}' must be at least 0 (0 = off); got {value}")
    name = config.task.name
    if name not in TASKS:
        where = _source_of("task.name", origins, source)
        raise ConfigError(f"{where}: 'task.name' must be one of {', '.join(sorted(TASKS))}; got {name!r}")
    defaults = TASKS[name].default_options
    checked = {}
    for option, value in config.task.options.items():
        key = f"task.options.{option}"
        where = _source_of(key, origins, source)
        if option not in defaults:
            valid = ", ".join(sorted(defaults)) or "(none)"
            raise ConfigError(f"{where}: unknown key '{key}' for task '{name}' (valid options: {valid})")
        checked[option] = _checked(value, _option_type(defaults[option]), key, where)
    config.task.options = checked


def validate_data(config: AtlasConfig, origins: dict[str, str] | None = None, source: str = "<defaults>") -> None:
    """Check the task's data files that exist (missing ones are the training's to report) with the task's own
    checks (`tasks.data_checks.check_task_data`: no evaluation example that is also a training example, KILT gold
    pages where retrieval is scored); an overlap is a `ConfigError` naming the file or override that set the files."""
    task_config = config.task
    try:
        check_task_data(
            get_task(task_config.name, **task_config.options),
            [p for p in task_config.train_data if Path(p).exists()],
            [p for p in task_config.eval_data if Path(p).exists()],
            skip_invalid=task_config.skip_invalid,
            allow_overlap=task_config.allow_overlap,
            closed_book=task_config.closed_book,
        )
    except DataOverlapError as e:
        where = " and ".join(
            dict.fromkeys(_source_of(key, origins or {}, source) for key in ("task.train_data", "task.eval_data"))
        )
        raise ConfigError(f"{where}: {e}") from None


def _merge(base: dict, over: dict) -> dict:
    """`over` laid onto `base`: where both hold a mapping they merge, key by key; else `over`'s value wins
    (a list replaces the base's list: a recipe that names its data files means exactly those)."""
    return base | {
        key: _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
        for key, value in over.items()
    }


def _set_keys(tree: dict, prefix: str = "") -> list[str]:
    """The dotted keys `tree` sets a value at: every leaf, and every non-mapping that replaces a section.

    An empty mapping sets nothing (it merges into the base's mapping unchanged)."""
    keys = []
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        keys += _set_keys(value, dotted) if isinstance(value, dict) else [dotted]
    return keys


def _loss_as_mapping(tree: dict) -> dict | None:
    """The tree's `retriever.loss` as a mapping, made one in place where a recipe wrote a name alone (`emdr` →
    `{name: emdr}`), so that a base's options or a dotted override (`retriever.loss.granularity=token`) can lay
    over it; None where the tree sets no loss."""
    retriever = tree.get("retriever")
    loss = retriever.get("loss") if isinstance(retriever, dict) else None
    if isinstance(loss, str):
        retriever["loss"] = loss = {"name": loss}
    return loss if isinstance(loss, dict) else None


def _loss_over_base(base_tree: dict, tree: dict) -> None:
    """Let a recipe's `retriever.loss` lay over its base's as a loss, not as a plain value: both are
    made mappings, so that `{granularity: token}` keeps the base's loss; and a recipe that names another loss
    drops the base's options, which were that loss's."""
    base_loss, loss = _loss_as_mapping(base_tree), _loss_as_mapping(tree)
    if base_loss is not None and loss is not None and loss.get("name", base_loss.get("name")) != base_loss.get("name"):
        del base_tree["retriever"]["loss"]


def _read_recipe(path: Path, source: str, chain: tuple[tuple[Path, str], ...] = ()) -> tuple[dict, dict[str, str]]:
    """The YAML mapping of `path` laid over its `base` chain → (tree, {dotted key: the file that set it}).

    `source` is how errors name `path`; `chain` holds the files that led here, (resolved path, source),
    to refuse a cycle."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    try:
        tree = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    if "base" not in tree:
        return tree, dict.fromkeys(_set_keys(tree), source)
    base = tree.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{source}: 'base' must be the path of another recipe, relative to this file; got {base!r}")
    chain = (*chain, (path.resolve(), source))
    base_path = path.parent / base
    base_source = os.path.normpath(base_path)
    if base_path.resolve() in [resolved for resolved, _ in chain]:
        cycle = " -> ".join([name for _, name in chain] + [base_source])
        raise ConfigError(f"{source}: 'base: {base}' makes a cycle of base files: {cycle}")
    if not base_path.is_file():
        raise ConfigError(f"{source}: base file '{base}' not found (looked for {base_source})")
    base_tree, origins = _read_recipe(base_path, base_source, chain)
    _loss_over_base(base_tree, tree)
    own = _set_keys(tree)
    # a value this file sets replaces everything the base set under that key
    origins = {
        key: where
        for key, where in origins.items()
        if not any(key == mine or key.startswith(mine + ".") for mine in own)
    }
    return _merge(base_tree, tree), {**origins, **dict.fromkeys(own, source)}


# Keys whose values name files or folders a run reads. A relative one in a recipe is looked up beside the
# recipe that set it first, then in the working directory (`_resolve_recipe_paths`).
INPUT_PATH_KEYS = (
    "reader.model",
    "reader.tokenizer",
    "reader.encoder",
    "reader.init_embeddings",
    "retriever.model",
    "index.path",
    "index.corpus",
    "task.train_data",
    "task.eval_data",
    "training.deepspeed",
)


def _resolve_recipe_paths(tree: dict, origins: dict[str, str]) -> None:
    """Relative input paths (INPUT_PATH_KEYS) that exist beside the recipe file that set them become absolute
    there, so a recipe's own files are found from any directory; others (found from the working directory,
    hub ids, preset names) stay as written. A value found nowhere is named with both places by the step that
    reads it (`missing_input`)."""
    for key in INPUT_PATH_KEYS:
        section, name = key.split(".")
        node = tree.get(section)
        source = origins.get(key) or origins.get(section)
        if not isinstance(node, dict) or name not in node or not source or source.startswith("override"):
            continue
        folder = Path(source).parent
        value = node[name]
        node[name] = [_beside(folder, v) for v in value] if isinstance(value, list) else _beside(folder, value)


def _beside(folder: Path, value: Any) -> Any:
    """`value` as an absolute path where it is a relative one that exists in `folder`; else as it is."""
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    beside = folder / value
    return str(beside.resolve()) if beside.exists() else value


def load_config(path: str | Path | None = None, overrides: list[str] = (), *, check_data: bool = True) -> AtlasConfig:
    """Load a YAML recipe (or the defaults when `path` is None) and apply dotted overrides.

    The recipe's `base` chain, if any, is resolved first (module docstring); the overrides apply to the
    merged result. Raises `ConfigError` naming the offending key and the file or override it came from.
    Registry names and task options are checked on the final config (`validate_components`),
    so an override may fix what the file alone would get wrong (say, `task.name` with the
    options written for it); then, with `check_data`, the data files that exist (`validate_data`: no
    training example among the evaluation ones, KILT provenance where it is scored; it reads them, so a
    caller that only reloads a finished run's config may pass False).
    """
    tree: dict = {}
    source = "<defaults>"
    origins: dict[str, str] = {}
    if path is not None:
        source = str(path)
        tree, origins = _read_recipe(Path(path), source)  # `base` chain resolved: the tree holds no `base`
        _resolve_recipe_paths(tree, origins)
    config = config_from_tree(tree, source, origins)
    for text in overrides:
        key, value = parse_override(text)
        _loss_as_mapping(tree)
        _set_dotted(tree, key, value, f"override '{text}'")
        config = config_from_tree(tree, f"override '{text}'")
        # A later override of a section replaces what earlier ones set inside it.
        origins = {k: v for k, v in origins.items() if not k.startswith(key + ".")}
        origins[key] = f"override '{text}'"
    validate_components(config, origins, source)
    if check_data:
        validate_data(config, origins, source)
    return config


def apply_overrides(config: AtlasConfig, overrides: list[str], *, source: str = "<config>") -> AtlasConfig:
    """`config` with dotted `overrides` (`a.b=value`, as on the command line) applied and checked; `config`
    itself is unchanged. An error names the override."""
    if not overrides:
        return config
    tree = config_to_dict(config)
    origins: dict[str, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        _loss_as_mapping(tree)
        _set_dotted(tree, key, value, f"override '{text}'")
        config = config_from_tree(tree, f"override '{text}'")
        origins[key] = f"override '{text}'"
    validate_components(config, origins, source)
    return config


def config_to_dict(config: Any) -> Any:
    """The config as plain nested dicts (for YAML/JSON), in the spelling a recipe uses: a loss's options
    beside its name (`{name: emdr, granularity: token}`), so that the saved config loads again."""
    if isinstance(config, LossConfig):
        return {"name": config.name, **config_to_dict(config.options)}
    if dataclasses.is_dataclass(config):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (list, tuple)):
        return type(config)(config_to_dict(v) for v in config)
    if isinstance(config, dict):
        return {k: config_to_dict(v) for k, v in config.items()}
    return copy.deepcopy(config)


def save_config(config: AtlasConfig, path: str | Path) -> None:
    """Write the fully resolved config as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(config), sort_keys=False))
