"""One way to load a model: a typed `ModelSpec` (where the weights come from, the index it reads, its config
with the `inference` settings) → `load_model` → an `AtlasModel`. A spec comes from a name (`model_spec`) or
from a training recipe (`recipe_spec`).

Every caller loads through `load_model`: the Python API (`atlas.Atlas.from_pretrained`), `atlas ask|evaluate|
serve`, training, `atlas mmlu-per-subject`, the quickstart and the benches. Loading is a read path: it never
builds an index (that is `atlas.run_index.prepare_index`'s verb, called before), never reads training data
and never writes; a run folder that was moved still finds its index (paths recorded in its config are tried
as written, then at the same place relative to the run folder), or one line says what is missing.

A name is, in this order: a run folder or checkpoint folder (a saved model: `config.yaml` with `reader/`), a
reader folder (`config.json`; its `atlas.yaml`, where it has one, gives the settings it reads and answers
with), a shipped reader's name (`atlas-reader`), a reader preset (random weights), or a Hugging Face Hub id
(`org/name`, resolved through `huggingface_hub`: its cache first, nothing downloaded when `HF_HUB_OFFLINE=1`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from atlas.assembly import build_model
from atlas.config import (
    AtlasConfig,
    ConfigError,
    LossConfig,
    TaskConfig,
    apply_overrides,
    config_from_tree,
    load_config,
    validate_components,
)
from atlas.index_api import Index, checked_device, compute_device
from atlas.run_index import open_index
from common.modeling import DEFAULT_ENCODER, is_hub_id
from reader.fid import READER_PRESETS, WARM_START_PRESETS
from retriever.index.files import check_encoder
from retriever.index.manifest import EncoderSettings, Manifest

logger = logging.getLogger(__name__)

SHIPPED_READER = Path(__file__).resolve().parent / "demo" / "atlas-reader"
SHIPPED_READERS = {"atlas-reader": SHIPPED_READER}
READER_SETTINGS_FILE = "atlas.yaml"  # in a reader folder: the `reader` and `inference` settings it runs with


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from: a checkpoint folder (reader/, retriever/, config.yaml), or a reader
    (a folder, or a preset name) run with the retriever of the index it reads."""

    kind: Literal["checkpoint", "reader", "preset", "recipe"]  # recipe: built as a training config says
    path: str  # the folder (absolute), or the preset's name
    name: str  # as the user gave it

    @property
    def folder(self) -> Path | None:
        return None if self.kind in ("preset", "recipe") else Path(self.path)


@dataclass(frozen=True)
class ModelSpec:
    """A runnable model: its weights (`source`), the index folder it reads (None: closed book, or none given
    yet), and the resolved config it is built from (`config.inference`: how it answers)."""

    source: ModelSource
    config: AtlasConfig
    index: Path | None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from itself, a run's output folder, or its `checkpoints/` folder."""
    path = Path(path)
    for root in (path, path / "checkpoints"):
        if (root / "latest").is_file():
            return root / (root / "latest").read_text().strip()
    if (path / "config.yaml").is_file() and (path / "reader").is_dir():
        return path
    raise FileNotFoundError(
        f"{path}: no checkpoint here (expected a checkpoint folder with reader/ and config.yaml, "
        "or a run folder with checkpoints/latest)"
    )


def checkpoint_config(checkpoint: str | Path, overrides: list[str] = ()) -> AtlasConfig:
    """The config a checkpoint was trained with, plus optional overrides."""
    # the run's data were checked when it started; reloading its config to run it must not re-read them
    return load_config(Path(checkpoint) / "config.yaml", list(overrides), check_data=False)


def resolve_source(name: str | os.PathLike) -> ModelSource:
    """`name` → where its weights are (module docstring's order); FileNotFoundError naming what was looked for."""
    # heavy: torch and transformers, loaded when a model is (this module is imported by the command line)

    text = str(name)
    path = Path(text)
    try:
        return ModelSource("checkpoint", str(resolve_checkpoint(path).resolve()), text)
    except FileNotFoundError:
        pass
    if (path / "config.json").is_file():
        return ModelSource("reader", str(path.resolve()), text)
    if not path.exists() and text in SHIPPED_READERS:
        return ModelSource("reader", str(SHIPPED_READERS[text]), text)
    if not path.exists() and (text in READER_PRESETS or text in WARM_START_PRESETS):
        logger.warning("reader preset %s is randomly initialised: expect scores near 0", text)
        return ModelSource("preset", text, text)
    if not path.exists() and is_hub_id(text):
        return dataclasses.replace(resolve_source(hub_snapshot(text)), name=text)
    hint = ""
    if (path / "config.yaml").is_file():
        hint = (
            "; it has a config.yaml but no checkpoint (a run of training.steps 0 writes none): run the reader "
            "its reader.model names, with an index"
        )
    raise FileNotFoundError(
        f"{text}: neither a run, a checkpoint nor a reader: looked for checkpoints/latest (a run folder), "
        f"latest or config.yaml with reader/ (a checkpoint folder), config.json (a reader folder), a shipped "
        f"reader ({', '.join(SHIPPED_READERS)}), the reader presets "
        f"({', '.join(sorted(READER_PRESETS | WARM_START_PRESETS))}) and a Hub id (org/name)" + hint
    )


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of the Hub model repository `repo_id`: from the cache (`HF_HUB_CACHE`, else the
    default), downloaded only when the hub is online; with `HF_HUB_OFFLINE=1` a repository not in the cache
    is one error line."""

    # the library reads HF_HUB_OFFLINE when it is imported; the environment says what the user set since
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        folder = snapshot_download(repo_id, cache_dir=os.environ.get("HF_HUB_CACHE") or None, local_files_only=offline)
    except LocalEntryNotFoundError:
        why = (
            "HF_HUB_OFFLINE is set, so nothing is downloaded"
            if offline
            else "the Hub could not be reached or holds no such model; nothing was downloaded"
        )
        raise FileNotFoundError(f"{repo_id}: not a local folder, and not in the Hugging Face cache ({why})") from None
    return Path(folder)


def reader_settings(folder: Path | None) -> dict:
    """The `reader` and `inference` sections a reader folder carries (`atlas.yaml`), as a config tree; {}
    where it has none."""
    if folder is None or not (folder / READER_SETTINGS_FILE).is_file():
        return {}
    path = folder / READER_SETTINGS_FILE
    tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = sorted(set(tree) - {"reader", "inference"})
    if not isinstance(tree, dict) or unknown:
        raise ConfigError(f"{path}: holds only 'reader' and 'inference' sections (found {', '.join(unknown)})")
    return tree


def index_encoder(index: str | os.PathLike | None):
    """The encoder record of an index's manifest (`retriever.index.manifest.EncoderSettings`: `source`,
    `passage_settings()`); an empty record without an index."""

    return Manifest.load(index).encoder if index is not None else EncoderSettings()


def _reader_config(source: ModelSource, index: Path | None, task: str | None) -> AtlasConfig:
    """The config that runs a reader without training: the defaults, the reader folder's own settings, the
    index's encoder as retriever (MiniLM where the index records none), no retriever loss, no data."""
    tree = reader_settings(source.folder)
    config = config_from_tree(tree, str((source.folder or Path(source.path)) / READER_SETTINGS_FILE))
    encoder = index_encoder(index)
    if index is not None and not encoder.source:
        logger.warning(
            "%s does not record the encoder it was built with; searching it with %s "
            "(give retriever.model=ENCODER if it was another)",
            index,
            DEFAULT_ENCODER,
        )
    retriever = dataclasses.replace(
        config.retriever,
        model=encoder.source or DEFAULT_ENCODER,
        loss=LossConfig(name="none"),
        **encoder.passage_settings(),
    )
    config = dataclasses.replace(
        config,
        reader=dataclasses.replace(config.reader, model=source.path),
        retriever=retriever,
        index=dataclasses.replace(config.index, path=None if index is None else str(index), corpus=None),
        task=TaskConfig(name=task or "qa"),
        training=dataclasses.replace(config.training, steps=0),
    )
    validate_components(config)
    return config


def saved_run_index(checkpoint: Path, config: AtlasConfig) -> Path | None:
    """The index a saved run reads: `index.path` as recorded, else at the same place relative to the run
    folder (a run folder moved with its index), else the run's own index (`index.corpus` runs:
    RUN/index); None for a closed-book run or one with no index. FileNotFoundError (one line) where it
    recorded one and none is found."""
    if config.task.closed_book:
        return None
    # the run folder a checkpoint folder belongs to (RUN/checkpoints/step-N → RUN); a saved model's own folder
    here = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint
    recorded_run = Path(config.training.output_dir)
    candidates: list[Path] = []
    if config.index.path:
        recorded = Path(config.index.path)
        candidates.append(recorded)
        relative = os.path.relpath(os.path.abspath(recorded), os.path.abspath(recorded_run))
        candidates.append(here / relative)
    elif config.index.corpus:
        candidates.append(here / "index")
    else:
        return None
    for candidate in candidates:
        if (candidate / "manifest.json").is_file():
            return candidate.resolve()
    looked = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise FileNotFoundError(
        f"{checkpoint}: the index it was run with is missing (looked at {looked}); give one with "
        "--index IDX (Python: index=)"
    )


def model_spec(
    name: str | os.PathLike | ModelSource,
    *,
    index: str | os.PathLike | None = None,
    task: str | None = None,
    overrides: list[str] = (),
) -> ModelSpec:
    """What `name` runs: its weights, its index (`index` given: that folder, searched with the passage format
    and length its manifest records; else the run's own), and its config with `task` and dotted `overrides`
    applied. A reader needs an `index` unless it is to answer closed-book."""
    source = name if isinstance(name, ModelSource) else resolve_source(name)
    index_path = Path(index).resolve() if index is not None else None
    if index_path is not None and not (index_path / "manifest.json").is_file():
        raise FileNotFoundError(f"{index}: not an index folder (no manifest.json); build one with `atlas index build`")
    if source.kind == "checkpoint":
        checkpoint = Path(source.path)
        config = checkpoint_config(checkpoint)
        if index_path is None:
            index_path = saved_run_index(checkpoint, config)
        else:
            passage_settings = index_encoder(index_path).passage_settings()
            config = dataclasses.replace(config, retriever=dataclasses.replace(config.retriever, **passage_settings))
        config = dataclasses.replace(
            config, index=dataclasses.replace(config.index, path=None if index_path is None else str(index_path))
        )
        if task:
            config = dataclasses.replace(config, task=TaskConfig(name=task))
    else:
        config = _reader_config(source, index_path, task)
    config = apply_overrides(config, list(overrides), source=str(source.name))
    return ModelSpec(source, config, index_path)


def recipe_spec(
    config: AtlasConfig, *, checkpoint: str | os.PathLike | None = None, index: str | os.PathLike | None = None
) -> ModelSpec:
    """A training recipe's model: built as `config` says, or with the weights of `checkpoint` (a run's),
    reading the index folder `index` (default: `index.path`; a recipe's own index of `index.corpus` is
    made first by `atlas.run_index.prepare_index`, which returns its folder)."""
    if checkpoint is not None:
        source = ModelSource("checkpoint", str(Path(checkpoint).resolve()), str(checkpoint))
    else:
        source = ModelSource("recipe", config.reader.model, config.reader.model)
    index = index if index is not None else config.index.path
    return ModelSpec(source, config, None if config.task.closed_book or not index else Path(index))


def load_model(spec: ModelSpec, *, index=None, context=None, device=None):
    """The one way to a model: the `AtlasModel` of `spec`, in eval mode, on `device` (default: the rank's
    under `context`, else the first GPU, else the CPU), reading `index` (an opened `atlas.Index`, shared: its
    edits are seen at once; the encoder that built it is checked) or else the spec's index folder (this
    rank's shard of it under `context` with `index.sharded`). Nothing is ever built or written."""

    checkpoint = Path(spec.source.path) if spec.source.kind == "checkpoint" else None
    model = build_model(spec.config, checkpoint=checkpoint).to(
        checked_device(device) if device is not None else compute_device(context)
    )
    settings = spec.config.index
    if index is not None and model.retriever is not None:
        check_encoder(
            index.manifest,
            model.retriever.passage_fingerprint(),
            str(index.path),
            allow_mismatch=settings.allow_encoder_mismatch,
        )
    elif index is None and spec.index is not None and model.retriever is not None:
        # the index's own copy of the retriever embeds edited passages (and string searches), so that an edit
        # on another thread never shares a tokenizer with answering
        retriever = copy.deepcopy(model.retriever).eval()
        rank, world_size = (context.rank, context.world_size) if context is not None else (0, 1)
        opened = open_index(spec.index, retriever, settings, rank=rank, world_size=world_size)
        index = Index(opened, retriever, allow_encoder_mismatch=settings.allow_encoder_mismatch)
    model.index = index
    return model.eval()
