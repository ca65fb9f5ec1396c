"""Config loading: YAML → typed dataclasses, overrides, and every rejection path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from atlas.config import AtlasConfig, ConfigError, load_config, save_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_yaml_and_overrides_load_into_typed_sections(tmp_path):
    path = write(tmp_path, "training:\n  lr: 4e-5\n  steps: 10\nretriever:\n  loss: adist\n")
    config = load_config(path, ["training.lr=1e-4", "index.spec=IVF1024,PQ64", "task.shots=64"])
    assert isinstance(config, AtlasConfig)
    assert config.training.lr == pytest.approx(1e-4) and isinstance(config.training.lr, float)
    assert config.training.steps == 10
    assert config.retriever.loss.name == "adist"
    assert config.index.spec == "IVF1024,PQ64"
    assert config.task.shots == 64
    assert config.reader.n_context == 40  # untouched defaults survive


def test_yaml_1_1_exponent_strings_become_floats(tmp_path):
    config = load_config(write(tmp_path, "training:\n  lr: 5e-5\n"))
    assert config.training.lr == pytest.approx(5e-5)


def test_no_shipped_recipe_evaluates_on_its_training_examples():
    """`validate_data` on every shipped recipe whose data files are here, once per distinct task and files (the
    reader stages share SQuAD: reading it takes seconds); a refused overlap raises ConfigError."""
    from atlas.config import validate_data

    checked = set()
    for path in CONFIGS:
        config = load_config(path, check_data=False)
        task = config.task
        files = (task.name, tuple(task.train_data), tuple(task.eval_data), task.allow_overlap)
        if files not in checked and any(Path(p).exists() for p in task.eval_data):
            validate_data(config, source=str(path))
            checked.add(files)


@pytest.mark.parametrize(
    "text, message",
    [
        ("training:\n  lrr: 1\n", "unknown key 'training.lrr' (valid keys: accumulation_steps"),
        ("trainer:\n  lr: 1\n", "unknown key 'trainer'"),
        ("training:\n  steps: ten\n", "'training.steps' must be int, got 'ten'"),
        ("training:\n  steps: 1.5\n", "'training.steps' must be int, got 1.5"),
        ("retriever:\n  tied: 'yes'\n", "'retriever.tied' must be bool"),
        ("retriever:\n  pooling: max\n", "'retriever.pooling' must be one of 'mean', 'cls', got 'max'"),
        ("task:\n  train_data: a.jsonl\n", "'task.train_data' must be a list"),
        ("training: 3\n", "'training' must be a mapping"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("training: [\n", "invalid YAML"),
    ],
)
def test_rejections_name_key_and_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_override_rejections_name_the_override():
    with pytest.raises(ConfigError, match=r"override 'training\.nope=1': unknown key 'training\.nope'"):
        load_config(None, ["training.nope=1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["training.lr"])
    with pytest.raises(ConfigError, match="'training.lr' must be float, got 'fast'"):
        load_config(None, ["training.lr=fast"])


def test_missing_file():
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config("nope.yaml")


def test_saved_config_reloads_identically(tmp_path):
    config = load_config(None, ["training.lr=3e-5", "task.train_data=[a.jsonl, b.jsonl]"])
    save_config(config, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == config
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text())["training"]["lr"] == 3e-5


def test_recipes_exist():
    names = {p.stem for p in CONFIGS}
    assert {
        "nq-64shot",
        "triviaqa-64shot",
        "mmlu-5shot",
        "mmlu-5shot-multitask",
        "mmlu-zeroshot",
        "fever-64shot",
        "pretrain-mlm",
    } <= names
    assert {
        f"kilt-{t}" for t in ("fever", "aida", "trex", "zsre", "nq", "hotpotqa", "triviaqa", "eli5", "wow")
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(p.parents[1])) for p in CONFIGS])
def test_every_shipped_recipe_validates(path):
    """Types and keys, and every named component exists: task + options, loss, index spec, schedule."""
    from atlas.training.refresh import parse_refresh_schedule
    from retriever.index.types import index_type
    from retriever.losses import build_retriever_loss
    from tasks.base import get_task

    config = load_config(path, check_data=False)  # the data files: the next test, once per distinct set
    get_task(config.task.name, **config.task.options)
    build_retriever_loss(config.retriever.loss.name, **config.retriever.loss.options)
    index_type(config.index.spec, 768)
    parse_refresh_schedule(config.index.refresh)
    assert config.reader.n_context <= config.retriever.n_context


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "task:\n  name: mlm\n  options:\n    noise_densty: 0.2\n",
            (
                "unknown key 'task.options.noise_densty' for task 'mlm' (valid options: max_words, "
                "mean_span_length, min_words, noise_density, seed, source_passage)"
            ),
        ),
        (
            "task:\n  name: mlm\n  options:\n    noise_density: high\n",
            "'task.options.noise_density' must be float, got 'high'",
        ),
        ("task:\n  name: mlm\n  options:\n    seed: 1.5\n", "'task.options.seed' must be int, got 1.5"),
        (
            "task:\n  name: qa\n  options:\n    noise_density: 0.2\n",
            ("unknown key 'task.options.noise_density' for task 'qa' (valid options: query_template, target_template)"),
        ),
        (
            "task:\n  name: qa\n  options:\n    query_template: [a, b]\n",
            "'task.options.query_template' must be str, got ['a', 'b']",
        ),
        ("task:\n  name: trivia\n", "'task.name' must be one of fever, kilt, lm, mlm, mmlu, "),
        ("task:\n  name: trivia\n", "; got 'trivia'"),
        ("retriever:\n  loss: kl\n", "'retriever.loss' must be one of adist, emdr, loop, none, pdist; got 'kl'"),
    ],
)
def test_registry_names_and_task_options_are_checked_at_load(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_task_option_errors_name_the_override_that_set_them(tmp_path):
    path = write(tmp_path, "task:\n  name: mlm\n")
    with pytest.raises(
        ConfigError,
        match=r"^override 'task\.options\.noise_density=lots': "
        r"'task\.options\.noise_density' must be float",
    ):
        load_config(path, ["training.steps=3", "task.options.noise_density=lots"])
    with pytest.raises(
        ConfigError,
        match=r"^override 'task\.options=\{span: 3\}': unknown key "
        r"'task\.options\.span' for task 'mlm'",
    ):
        load_config(path, ["task.options={span: 3}"])
    with pytest.raises(
        ConfigError,
        match=r"^override 'retriever\.loss=adistt': 'retriever\.loss' "
        r"must be one of adist, emdr, loop, none, pdist",
    ):
        load_config(path, ["retriever.loss=adistt"])
    # an option set in the file but invalid for the task chosen by an override: blame the file
    mlm = write(tmp_path, "task:\n  name: mlm\n  options:\n    noise_density: 0.3\n")
    with pytest.raises(
        ConfigError,
        match=rf"^{mlm}: unknown key 'task\.options\.noise_density' "
        r"for task 'qa'",
    ):
        load_config(mlm, ["task.name=qa"])


def test_task_options_are_typed_like_their_defaults(tmp_path):
    from tasks.base import TASKS, get_task

    path = write(tmp_path, "task:\n  name: mlm\n  options:\n    mean_span_length: 2\n    seed: 7\n")
    config = load_config(path, ["task.options.noise_density=0.3"])
    assert config.task.options == {"mean_span_length": 2.0, "seed": 7, "noise_density": 0.3}
    assert isinstance(config.task.options["mean_span_length"], float)  # an int where a float goes
    # an override can switch the task together with the options written for it
    qa = write(tmp_path, "task:\n  name: qa\n  options:\n    query_template: 'q: {question}'\n")
    assert load_config(qa).task.options == {"query_template": "q: {question}"}
    switched = load_config(qa, ["task.name=mlm", "task.options={noise_density: 0.2}"])
    assert switched.task.name == "mlm" and switched.task.options == {"noise_density": 0.2}
    get_task(switched.task.name, **switched.task.options)
    # every registered task's defaults pass their own check
    for name, task in TASKS.items():
        overrides = [f"task.name={name}"] + [
            f"task.options.{k}={v!r}" if isinstance(v, str) else f"task.options.{k}={v}"
            for k, v in task.default_options.items()
        ]
        assert load_config(None, overrides).task.options == task.default_options, name


def test_counts_that_cannot_work_are_rejected_before_any_training():
    with pytest.raises(
        ConfigError, match=r"override 'evaluation.max_examples=0'.*'evaluation.max_examples' must be at least 1"
    ):
        load_config(None, ["evaluation.max_examples=0"])
    with pytest.raises(ConfigError, match="'reader.trainable_encoder_layers' must be at least 0"):
        load_config(None, ["reader.trainable_encoder_layers=-1"])
    assert load_config(None, ["evaluation.max_examples=1"]).evaluation.max_examples == 1


# `base:` inheritance


def write_at(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_base_is_merged_under_the_file_keys(tmp_path):
    write_at(
        tmp_path / "grand.yaml",
        "retriever:\n  model: minilm\n  n_context: 20\n"
        "task:\n  name: qa\n  train_data: [a.jsonl, b.jsonl]\n  eval_data: [dev.jsonl]\n"
        "training:\n  steps: 10\n  lr: 1.0e-4\n  seed: 3\n",
    )
    write_at(
        tmp_path / "parent.yaml",
        "base: grand.yaml\nretriever:\n  n_context: 10\n"
        "task:\n  name: mlm\n  options:\n    noise_density: 0.2\n    seed: 1\n"
        "training:\n  steps: 20\nevaluation:\n  retrieval_k: [1, 5, 20]\n",
    )
    child = write_at(
        tmp_path / "child.yaml",
        "base: parent.yaml\n"
        "task:\n  train_data: [c.jsonl]\n  options:\n    seed: 2\n"
        "training:\n  lr: 3.0e-5\nevaluation:\n  retrieval_k: [2]\n",
    )
    config = load_config(child, check_data=False)
    # scalars: the nearest file that sets one wins, the rest come from further up, then the defaults
    assert config.retriever.model == "minilm" and config.retriever.n_context == 10
    assert config.training.steps == 20 and config.training.lr == 3e-5 and config.training.seed == 3
    assert config.task.name == "mlm"
    assert config.reader.n_context == 40  # set by no file: the dataclass default
    # mappings merge key by key
    assert config.task.options == {"noise_density": 0.2, "seed": 2}
    # lists replace, never concatenate
    assert config.task.train_data == ["c.jsonl"] and config.task.eval_data == ["dev.jsonl"]
    assert config.evaluation.retrieval_k == [2]


def test_overrides_apply_after_the_whole_base_chain(tmp_path):
    write_at(tmp_path / "parent.yaml", "training:\n  steps: 20\n  lr: 1.0e-4\n")
    child = write_at(tmp_path / "child.yaml", "base: parent.yaml\ntraining:\n  steps: 30\n")
    config = load_config(child, ["training.steps=5", "training.lr=2e-5"], check_data=False)
    assert config.training.steps == 5 and config.training.lr == 2e-5


def test_base_path_is_relative_to_the_file_that_names_it(tmp_path, monkeypatch):
    write_at(tmp_path / "configs" / "nq.yaml", "training:\n  steps: 30\n  batch_size: 8\n")
    write_at(tmp_path / "configs" / "small" / "base.yaml", "base: ../nq.yaml\ntraining:\n  batch_size: 4\n")
    child = write_at(
        tmp_path / "configs" / "small" / "deeper" / "nq.yaml", "base: ../base.yaml\ntraining:\n  lr: 3.0e-5\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the file's folder: the bases are found all the same
    config = load_config(child, check_data=False)
    assert (config.training.steps, config.training.batch_size, config.training.lr) == (30, 4, 3e-5)
    monkeypatch.chdir(tmp_path)
    assert load_config("configs/small/deeper/nq.yaml", check_data=False) == config


def test_a_base_cycle_is_refused_naming_the_files(tmp_path):
    write_at(tmp_path / "a.yaml", "base: b.yaml\ntraining:\n  steps: 1\n")
    write_at(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "a.yaml")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'b.yaml'}: 'base: a.yaml' makes a cycle of base files: ")
    assert message.endswith(f"{tmp_path / 'a.yaml'} -> {tmp_path / 'b.yaml'} -> {tmp_path / 'a.yaml'}")
    itself = write_at(tmp_path / "self.yaml", "base: ./self.yaml\n")
    with pytest.raises(ConfigError, match=r"self\.yaml: 'base: \./self\.yaml' makes a cycle"):
        load_config(itself)


def test_a_missing_base_file_is_refused_naming_the_file(tmp_path):
    child = write_at(tmp_path / "small" / "child.yaml", "base: ../nope.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_config(child)
    assert str(info.value) == f"{child}: base file '../nope.yaml' not found (looked for {tmp_path / 'nope.yaml'})"
    for bad in ("base: [a.yaml]\n", "base:\n", "base: ''\n"):
        with pytest.raises(ConfigError, match=r"child\.yaml: 'base' must be the path of another recipe"):
            load_config(write_at(child, bad))


def test_an_error_in_a_base_key_names_the_base_file(tmp_path):
    parent = write_at(tmp_path / "parent.yaml", "training:\n  lrr: 1.0e-4\n  steps: ten\n")
    child = write_at(tmp_path / "child.yaml", "base: parent.yaml\ntraining:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=rf"^{parent}: unknown key 'training\.lrr'"):
        load_config(child)
    write_at(parent, "training:\n  steps: ten\n")
    assert load_config(child, check_data=False).training.steps == 3  # the child's value replaced the bad one
    write_at(parent, "retriever:\n  loss: kl\n")
    with pytest.raises(ConfigError, match=rf"^{parent}: 'retriever\.loss' must be one of"):
        load_config(child)


def test_the_saved_config_is_flat(tmp_path):
    write_at(tmp_path / "parent.yaml", "task:\n  name: mlm\ntraining:\n  steps: 20\n")
    child = write_at(tmp_path / "child.yaml", "base: parent.yaml\ntraining:\n  lr: 3.0e-5\n")
    config = load_config(child, check_data=False)
    save_config(config, tmp_path / "run" / "config.yaml")
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert "base" not in saved and saved["task"]["name"] == "mlm" and saved["training"]["steps"] == 20
    assert load_config(tmp_path / "run" / "config.yaml", check_data=False) == config


# --- a loss's own options, one precision vocabulary, index names that say what they do (old spellings kept)


def test_a_loss_takes_its_options_beside_its_name(tmp_path):
    config = load_config(write(tmp_path, "retriever:\n  loss: {name: emdr, granularity: token}\n"))
    assert (config.retriever.loss.name, config.retriever.loss.options) == ("emdr", {"granularity": "token"})
    # the plain name means the loss's default options, filled in so that the saved config says what ran
    plain = load_config(write(tmp_path, "retriever:\n  loss: adist\n"))
    assert (plain.retriever.loss.name, plain.retriever.loss.options) == ("adist", {"attention": "auto"})
    assert load_config(None).retriever.loss.name == "pdist" and load_config(None).retriever.loss.options == {}


def test_dotted_overrides_reach_the_loss_name_and_options(tmp_path):
    path = write(tmp_path, "retriever:\n  loss: adist\n")
    for overrides in (
        ["retriever.loss.name=emdr", "retriever.loss.granularity=token"],
        ["retriever.loss=emdr", "retriever.loss.granularity=token"],
        ["retriever.loss={name: emdr, granularity: token}"],
    ):
        config = load_config(path, overrides)
        assert (config.retriever.loss.name, config.retriever.loss.options) == ("emdr", {"granularity": "token"})
    # the plain form replaces the whole loss section: default options
    emdr = write(tmp_path, "retriever:\n  loss: {name: emdr, granularity: token}\n")
    assert load_config(emdr, ["retriever.loss=emdr"]).retriever.loss.options == {"granularity": "sequence"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("retriever:\n  loss: emdr\n  emdr_granularity: token\n", "unknown key 'retriever.emdr_granularity'"),
        ("reader:\n  num_beams: 4\n", "unknown key 'reader.num_beams'"),
        ("index:\n  rerank: 100\n", "unknown key 'index.rerank' .*exact_rerank"),
        ("training:\n  precision: full\n", "'training.precision' must be one of"),
        ("retriever:\n  gold_precision: full\n", "'retriever.gold_precision' must be one of"),
    ],
)
def test_spellings_from_before_a_release_are_refused_naming_the_key(tmp_path, text, message):
    """Keys and values this project renamed before it shipped are not rewritten: one error names the file and key."""
    path = tmp_path / "old.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"old\.yaml.*" + message):
        load_config(path)


@pytest.mark.parametrize(
    "text, overrides, message",
    [
        (
            "retriever:\n  loss: {name: emdr, attention: copy}\n",
            [],
            (
                r"recipe\.yaml: unknown key 'retriever\.loss\.attention' for retriever loss 'emdr' "
                r"\(valid options: granularity\)"
            ),
        ),
        (
            "retriever:\n  loss: adist\n",
            ["retriever.loss.granularity=token"],
            (
                r"override 'retriever\.loss\.granularity=token': unknown key 'retriever\.loss\.granularity' "
                r"for retriever "
                r"loss 'adist' \(valid options: attention\)"
            ),
        ),
        (
            "retriever:\n  loss: {name: pdist, granularity: token}\n",
            [],
            r"unknown key 'retriever\.loss\.granularity' for retriever loss 'pdist' \(valid options: \(none\)\)",
        ),
        (
            "retriever:\n  loss: {name: emdr, granularity: word}\n",
            [],
            r"recipe\.yaml: 'retriever\.loss\.granularity' must be one of 'sequence', 'token', got 'word'",
        ),
        (
            "retriever:\n  loss: {name: emdr, granularity: 3}\n",
            [],
            r"'retriever\.loss\.granularity' must be one of 'sequence', 'token', got 3",
        ),
        (
            "retriever:\n  loss: {name: kl}\n",
            [],
            r"'retriever\.loss' must be one of adist, emdr, loop, none, pdist; got 'kl'",
        ),
        (
            "inference:\n  precision: fp16\n",
            [],
            r"'inference\.precision' must be one of 'auto', 'fp32', 'bf16', 'int8', 'bf16-int8'",
        ),
    ],
)
def test_bad_loss_options_and_precisions_are_refused(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), overrides)


def test_a_recipe_lays_its_loss_over_its_bases_loss(tmp_path):
    """Options alone keep the base's loss; naming another loss drops the base's options (they were
    that loss's)."""
    (tmp_path / "parent.yaml").write_text("retriever:\n  loss: emdr\n")
    (tmp_path / "options.yaml").write_text("base: parent.yaml\nretriever:\n  loss: {granularity: token}\n")
    (tmp_path / "grand.yaml").write_text("base: options.yaml\nretriever:\n  loss: pdist\n")
    config = load_config(tmp_path / "options.yaml", check_data=False)
    assert config.retriever.loss.name == "emdr" and config.retriever.loss.options["granularity"] == "token"
    assert load_config(tmp_path / "grand.yaml", check_data=False).retriever.loss.name == "pdist"


def test_a_recipes_relative_paths_are_read_beside_it_then_from_the_working_directory(tmp_path, monkeypatch, capsys):
    from atlas.cli import main

    recipes = tmp_path / "recipes"
    (recipes / "data").mkdir(parents=True)
    (recipes / "data" / "train.jsonl").write_text('{"question": "q", "answers": ["a"]}\n')
    (recipes / "r.yaml").write_text(
        "task:\n  train_data: [data/train.jsonl]\n  eval_data: [elsewhere.jsonl]\nreader:\n  model: t5-tiny\n"
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(recipes / "r.yaml", check_data=False)
    assert config.task.train_data == [str((recipes / "data" / "train.jsonl").resolve())]  # beside the recipe
    assert config.task.eval_data == ["elsewhere.jsonl"]  # found nowhere beside it: as written, from here
    assert load_config(
        recipes / "r.yaml", ["task.train_data=[data/train.jsonl]"], check_data=False
    ).task.train_data == ["data/train.jsonl"]  # an override is the user's own, from the working directory
    # a shipped recipe run from another directory: its first relative input is named with where it was looked for
    shipped = Path(__file__).resolve().parents[1] / "configs" / "small" / "nq-64shot.yaml"
    assert main(["train", str(shipped), "training.steps=1", f"training.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nq824/dev.jsonl: file not found (looked for /" in err[0], err


# --- the type rules (common/config_section.py): strict, with YAML's two leniencies


@pytest.mark.parametrize(
    "text, message",
    [
        ("training:\n  steps: '10'\n", "'training.steps' must be int, got '10'"),
        ("training:\n  steps: 2.0\n", "'training.steps' must be int, got 2.0"),
        ("training:\n  steps: true\n", "'training.steps' must be int, got True"),
        ("retriever:\n  tied: 1\n", "'retriever.tied' must be bool, got 1"),
        ("training:\n  lr: true\n", "'training.lr' must be float, got True"),
        ("training:\n  output_dir: true\n", "'training.output_dir' must be str, got True"),
        ("evaluation:\n  retrieval_k: [1, five]\n", "'evaluation.retrieval_k[1]' must be int, got 'five'"),
        ("evaluation:\n  max_examples: many\n", "'evaluation.max_examples' must be int, got 'many'"),
        ("retriever:\n  loss: 3\n", "'retriever.loss' must be a mapping, got 3"),
        ("task:\n  options: [a]\n", "'task.options' must be a mapping, got ['a']"),
    ],
)
def test_values_are_checked_strictly(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: {message}"


def test_yaml_leniencies_numbers_for_strings_strings_for_floats_and_empty_sections(tmp_path):
    path = write(
        tmp_path,
        "training:\n  output_dir: 2024\n  lr: '3e-5'\n  clip_norm: 2\ntask:\n  train_data: [1, a.jsonl]\nreader:\n",
    )
    config = load_config(path, check_data=False)
    assert config.training.output_dir == "2024" and config.task.train_data == ["1", "a.jsonl"]
    assert (
        config.training.lr == 3e-5 and config.training.clip_norm == 2.0 and isinstance(config.training.clip_norm, float)
    )
    assert config.reader == AtlasConfig().reader  # `reader:` with nothing under it: the defaults


def test_an_unknown_key_is_named_before_a_bad_value_in_the_same_section(tmp_path):
    path = write(tmp_path, "training:\n  steps: ten\n  zeta: 1\n  alpha: 2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'training\.alpha'"):
        load_config(path)


def test_a_list_element_error_names_the_file_that_set_the_list(tmp_path):
    parent = write_at(tmp_path / "parent.yaml", "evaluation:\n  retrieval_k: [1, x]\n")
    child = write_at(tmp_path / "child.yaml", "base: parent.yaml\ntraining:\n  steps: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(child)
    assert str(info.value) == f"{parent}: 'evaluation.retrieval_k[1]' must be int, got 'x'"
    with pytest.raises(ConfigError, match=r"^override 'evaluation\.retrieval_k=\[2, y\]': .*\[1\]' must be int"):
        load_config(None, ["evaluation.retrieval_k=[2, y]"])


def test_a_section_built_in_code_is_checked_too():
    from atlas.config import TrainingConfig
    from retriever.retriever_config import LossConfig

    with pytest.raises(ValueError, match="steps"):
        TrainingConfig(steps="ten")
    with pytest.raises(ValueError, match="lrr"):
        TrainingConfig(lrr=1.0)
    assert LossConfig(name="emdr", options={"granularity": "token"}).options == {"granularity": "token"}
