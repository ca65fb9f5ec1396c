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
    assert config.retriever.loss == "adist"
    assert config.index.spec == "IVF1024,PQ64"
    assert config.task.shots == 64
    assert config.reader.n_context == 40  # untouched defaults survive


def test_yaml_1_1_exponent_strings_become_floats(tmp_path):
    config = load_config(write(tmp_path, "training:\n  lr: 5e-5\n"))
    assert config.training.lr == pytest.approx(5e-5)


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


def test_missing_required_value_is_reported():
    from dataclasses import dataclass

    from atlas.config import _build

    @dataclass
    class Needs:
        path: str
        n: int = 1

    with pytest.raises(ConfigError, match="x.yaml: missing required value 'section.path'"):
        _build(Needs, {"n": 2}, "section", "x.yaml")


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
    assert {"nq-64shot", "triviaqa-64shot", "mmlu-5shot", "mmlu-5shot-multitask", "mmlu-zeroshot",
            "fever-64shot", "pretrain-mlm"} <= names
    assert {f"kilt-{t}" for t in ("fever", "aida", "trex", "zsre", "nq", "hotpotqa", "triviaqa", "eli5", "wow")} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(p.parents[1])) for p in CONFIGS])
def test_every_shipped_recipe_validates(path):
    """Types and keys, and every named component exists: task + options, loss, index spec, schedule."""
    from atlas.training.refresh import parse_refresh_schedule
    from retriever.index_types import index_type
    from retriever.losses import build_retriever_loss
    from tasks.base import get_task

    config = load_config(path)
    get_task(config.task.name, **config.task.options)
    build_retriever_loss(config.retriever.loss, emdr_granularity=config.retriever.emdr_granularity)
    index_type(config.index.spec, 768)
    parse_refresh_schedule(config.index.refresh)
    assert config.reader.n_context <= config.retriever.n_context


@pytest.mark.parametrize(
    "text, message",
    [
        ("task:\n  name: mlm\n  options:\n    noise_densty: 0.2\n",
         ("unknown key 'task.options.noise_densty' for task 'mlm' (valid options: max_words, "
          "mean_span_length, min_words, noise_density, seed, source_passage)")),
        ("task:\n  name: mlm\n  options:\n    noise_density: high\n",
         "'task.options.noise_density' must be float, got 'high'"),
        ("task:\n  name: mlm\n  options:\n    seed: 1.5\n",
         "'task.options.seed' must be int, got 1.5"),
        ("task:\n  name: qa\n  options:\n    noise_density: 0.2\n",
         ("unknown key 'task.options.noise_density' for task 'qa' (valid options: "
          "query_template, target_template)")),
        ("task:\n  name: qa\n  options:\n    query_template: [a, b]\n",
         "'task.options.query_template' must be str, got ['a', 'b']"),
        ("task:\n  name: trivia\n", "'task.name' must be one of fever, kilt, lm, mlm, mmlu, "),
        ("task:\n  name: trivia\n", "; got 'trivia'"),
        ("retriever:\n  loss: kl\n",
         "'retriever.loss' must be one of adist, emdr, loop, none, pdist; got 'kl'"),
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
    with pytest.raises(ConfigError, match=r"^override 'task\.options\.noise_density=lots': "
                                          r"'task\.options\.noise_density' must be float"):
        load_config(path, ["training.steps=3", "task.options.noise_density=lots"])
    with pytest.raises(ConfigError, match=r"^override 'task\.options=\{span: 3\}': unknown key "
                                          r"'task\.options\.span' for task 'mlm'"):
        load_config(path, ["task.options={span: 3}"])
    with pytest.raises(ConfigError, match=r"^override 'retriever\.loss=adistt': 'retriever\.loss' "
                                          r"must be one of adist, emdr, loop, none, pdist"):
        load_config(path, ["retriever.loss=adistt"])
    # an option set in the file but invalid for the task chosen by an override: blame the file
    mlm = write(tmp_path, "task:\n  name: mlm\n  options:\n    noise_density: 0.3\n")
    with pytest.raises(ConfigError, match=rf"^{mlm}: unknown key 'task\.options\.noise_density' "
                                          r"for task 'qa'"):
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
    with pytest.raises(ConfigError, match=r"override 'evaluation.max_examples=0'.*'evaluation.max_examples' must be at least 1"):
        load_config(None, ["evaluation.max_examples=0"])
    with pytest.raises(ConfigError, match="'reader.trainable_encoder_layers' must be at least 0"):
        load_config(None, ["reader.trainable_encoder_layers=-1"])
    assert load_config(None, ["evaluation.max_examples=1"]).evaluation.max_examples == 1
