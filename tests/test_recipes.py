"""Every recipe of configs/ opens with a header that says what it is and how to launch it, with no measured
figure (those live in docs/results/), and configs/README.md lists it. Every small-model recipe
(configs/small/) states only what differs from its parent (`base:`), and runs: one training step and a short
evaluation on its real data, made by its own header's `atlas data` commands, with the reader and retriever
swapped for tiny ones (the recipe's task, data, loss and schedule are what is exercised). The reader's training
stages (configs/reader-stages/) resolve to the settings that trained the shipped reader."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import yaml

from atlas.cli import build_parser, main
from atlas.config import config_to_dict, load_config
from atlas.training.loop import train

REPO = Path(__file__).resolve().parents[1]
SMALL = sorted((REPO / "configs" / "small").glob("*.yaml"))
RECIPES = sorted((REPO / "configs").rglob("*.yaml"))
STAGES = REPO / "configs" / "reader-stages"
# what a header must not hold: a wall time, a speed, a score (docs/results/*.md keep those, with the command,
# date and machine), or a pointer to a document a reader of the repository cannot open
MEASURED = re.compile(
    r"\b\d+(?:[.,]\d+)?\s?(?:min|minutes|h|hours|s|seconds|ms|steps/s)\b"
    r"|\b(?:EM|F1|accuracy|loss|recall)\s*[=:]?\s*\d|\d(?:\.\d+)?\s?×|→"
)
PRIVATE = re.compile(r"\bSPEC\b|\b[Ii]ssue #?\d+")
SHIPPED_READER = "atlas/demo/atlas-reader"
# the extractive decoding of configs/small/nq-64shot.yaml, which every recipe with the shipped reader keeps
DECODING = ("num_beams", "length_penalty", "span_answers", "retrieval_prior", "generation_max_length")


def header(path: Path) -> list[str]:
    """The comment lines a config opens with, without their '# '."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def launch_commands(path: Path) -> list[list[str]]:
    """The commands under the header's "Launch" line (indented; `\\` continues a line), as argv lists
    without the leading `atlas` and environment assignments."""
    lines = header(path)
    start = next(n for n, line in enumerate(lines) if line.startswith("Launch"))
    commands, current = [], ""
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        current += " " + line.strip()
        if current.endswith("\\"):
            current = current[:-1]
            continue
        argv = shlex.split(current)
        while argv and "=" in argv[0]:  # OMP_NUM_THREADS=1 atlas …
            argv.pop(0)
        assert argv[0] == "atlas", f"{path.name}: a launch command that is not atlas's: {current}"
        commands.append(argv[1:])
        current = ""
    return commands


def outputs(commands: list[list[str]]) -> list[str]:
    return [argv[argv.index("--out") + 1] for argv in commands if "--out" in argv]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@pytest.mark.parametrize("path", RECIPES, ids=[_rel(p) for p in RECIPES])
def test_every_recipe_says_what_it_is_and_how_to_launch_itself_and_holds_no_figure(path):
    lines = header(path)
    assert len(lines) >= 2 and lines[0].strip(), f"{_rel(path)}: opens with a comment saying what the recipe is"
    assert any(
        f"atlas train {_rel(path)}" in line or f"atlas mmlu-per-subject {_rel(path)}" in line for line in lines
    ), f"{_rel(path)}: says how to launch itself"
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        comment = line[line.index("#") :] if "#" in line else ""
        assert not MEASURED.search(comment), f"{_rel(path)}:{n}: a measured figure belongs in docs/results/: {line}"
        assert not PRIVATE.search(comment), f"{_rel(path)}:{n}: names a document the repository does not hold"


def test_configs_readme_lists_every_recipe():
    readme = (REPO / "configs" / "README.md").read_text(encoding="utf-8")
    missing = [_rel(p) for p in RECIPES if f"`{p.relative_to(REPO / 'configs').as_posix()}`" not in readme]
    assert not missing, f"configs/README.md does not list {missing}"


DERIVED = [*SMALL, *(p for p in sorted(STAGES.glob("*.yaml")) if p.stem != "reader-squad")]


@pytest.mark.parametrize("path", DERIVED, ids=[_rel(p) for p in DERIVED])
def test_a_derived_recipe_states_only_what_differs_from_its_parent(path):
    """A small recipe's `base:` is the paper-scale recipe of the same name (kilt-nq824: the small kilt-nq); a
    reader stage's, an earlier stage. The file repeats none of its parent's values: each key it sets changes
    the resolved config."""
    tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    parent = path.parent / tree.pop("base")
    if path.parent == STAGES:
        assert parent.parent == STAGES and parent.is_file()
    else:
        expected = path.parent / "kilt-nq.yaml" if path.stem == "kilt-nq824" else REPO / "configs" / path.name
        assert parent.resolve() == expected.resolve(), f"{path.name}: base {parent}"
    resolved = config_to_dict(load_config(parent, check_data=False))
    for section, values in tree.items():
        for key, value in values.items():
            if key == "options":
                continue  # task options merge: checked through the resolved config below
            typed = _typed(section, key, value)
            assert typed != resolved[section][key], f"{path.name}: repeats {section}.{key}"


def _typed(section: str, key: str, value):
    """`section.key: value` as the config holds it once typed (`1e-4` and `0.0001` are one value)."""
    return config_to_dict(load_config(None, [f"{section}.{key}={json.dumps(value)}"], check_data=False))[section][key]


# The shipped reader's parts, as its card records them (atlas/demo/atlas-reader/card.json): a change to one
# stage's file changes every stage after it, so each resolved stage is pinned here.
STAGE_SETTINGS = {  # file: (reader.model, n_context, text_maxlength, trainable_encoder_layers, max_words,
    #                  distractors, seed, steps, batch_size, lr, lr_encoder, precision, output_dir)
    "reader-squad": ("minilm-fid", 1, 192, 3, 100, None, None, 1100, 24, 1e-3, 1e-4, "fp32", "runs/reader-squad"),
    "reader-squad-stage2": (
        "runs/reader-squad/checkpoints/step-000700/reader",
        1,
        192,
        3,
        100,
        None,
        1,
        400,
        24,
        4e-4,
        4e-5,
        "fp32",
        "runs/reader-squad-stage2",
    ),
    "reader-squad-stage3": (
        "runs/reader-squad-stage2/checkpoints/step-000400/reader",
        2,
        192,
        3,
        100,
        1,
        2,
        450,
        24,
        3e-4,
        3e-5,
        "fp32",
        "runs/reader-squad-stage3",
    ),
    "reader-squad-stage4": (
        SHIPPED_READER,
        2,
        192,
        3,
        100,
        1,
        3,
        1800,
        24,
        3e-4,
        3e-5,
        "fp32",
        "runs/reader-squad-stage4",
    ),
    "reader-squad-stage5": (
        SHIPPED_READER,
        3,
        192,
        3,
        100,
        2,
        4,
        1500,
        16,
        3e-4,
        3e-5,
        "fp32",
        "runs/reader-squad-stage5",
    ),
    "reader-squad-stage6": (
        SHIPPED_READER,
        3,
        192,
        3,
        100,
        2,
        5,
        1500,
        16,
        2e-4,
        2e-5,
        "fp32",
        "runs/reader-squad-stage6",
    ),
    "reader-squad-stage7": (
        SHIPPED_READER,
        3,
        320,
        3,
        0,
        2,
        6,
        1200,
        16,
        1e-4,
        1e-5,
        "bf16",
        "runs/reader-squad-stage7",
    ),
    "reader-squad-stage8": (
        SHIPPED_READER,
        3,
        320,
        4,
        0,
        2,
        7,
        2000,
        16,
        1e-4,
        2e-5,
        "bf16",
        "runs/reader-squad-stage8",
    ),
    "reader-squad-stage9-counterfactual": (
        SHIPPED_READER,
        3,
        320,
        4,
        0,
        2,
        9,
        600,
        16,
        1e-4,
        2e-5,
        "bf16",
        "runs/reader-squad-stage9",
    ),
    "reader-squad-gpu": (SHIPPED_READER, 3, 320, 4, 0, 2, 8, 400, 64, 1e-4, 2e-5, "fp32", "runs/reader-squad-gpu"),
    # part 10, not yet trained: the gold among the 4 train paragraphs MiniLM ranks highest, from its own file
    "reader-squad-stage10-gpu": (
        SHIPPED_READER,
        5,
        320,
        4,
        0,
        4,
        10,
        400,
        64,
        1e-4,
        2e-5,
        "bf16",
        "runs/reader-squad-stage10",
    ),
    # part 10 sized for 2 CPU cores: 15% of the examples, part 8's batch, float32
    "reader-squad-stage10-cpu": (
        SHIPPED_READER,
        5,
        320,
        4,
        0,
        4,
        10,
        240,
        16,
        1e-4,
        2e-5,
        "fp32",
        "runs/reader-squad-stage10-cpu",
    ),
}


def test_reader_stages_resolve_to_the_settings_that_trained_the_shipped_reader():
    assert sorted(p.stem for p in STAGES.glob("*.yaml")) == sorted(STAGE_SETTINGS)
    for name, expected in STAGE_SETTINGS.items():
        config = load_config(STAGES / f"{name}.yaml", check_data=False)
        reader, options, training = config.reader, config.task.options, config.training
        got = (
            reader.model,
            reader.n_context,
            reader.text_maxlength,
            reader.trainable_encoder_layers,
            options.get("max_words"),
            options.get("distractors"),
            options.get("seed"),
            training.steps,
            training.batch_size,
            training.lr,
            training.lr_encoder,
            training.precision,
            training.output_dir,
        )
        assert got == expected, name
        listed = ["runs/squad-train-k5.jsonl"] if name.startswith("reader-squad-stage10") else []
        assert config.task.train_data == (listed or ["../shared/data/squad/train-v1.1.json"]), name
        assert config.retriever.loss.name == "none", name
    assert (
        load_config(STAGES / "reader-squad-stage9-counterfactual.yaml", check_data=False).task.options["counterfactual"]
        == 0.3
    )
    # every later stage starts from the one before (or, for the GPU and counterfactual runs, from part 8)
    for path in STAGES.glob("*.yaml"):
        base = yaml.safe_load(path.read_text(encoding="utf-8")).get("base")
        assert (base is None) == (path.stem == "reader-squad"), path.name


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_small_recipe_loads_and_says_what_it_is_and_how_to_launch_it(path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(path)  # the data that is here is checked too: no overlap, KILT provenance
    lines = header(path)
    text = " ".join(lines)
    assert len(lines) >= 4 and lines[0].strip(), f"{path.name}: opens with what it shows"
    commands = launch_commands(path)
    parser = build_parser()
    for argv in commands:  # every command exists with these options (argparse exits otherwise)
        _, extra = parser.parse_known_args(argv)
        assert all("=" in e and not e.startswith("-") for e in extra), f"{path.name}: {extra}"  # as `main` takes them
    runner = [a for a in commands if a[0] in ("train", "mmlu-per-subject")]
    assert any(a[1] == f"configs/small/{path.name}" for a in runner), f"{path.name}: says how to run itself"
    # every input under runs/ is made by a command of the header
    made = outputs(commands)
    for data in [config.index.corpus or "", *config.task.train_data, *config.task.eval_data]:
        if data.startswith("runs/"):
            assert any(data == out or data.startswith(out + "/") for out in made), f"{path.name}: who makes {data}?"
    # the reader: the shipped one with nq-64shot's extractive decoding, or the header says why not
    assert "shipped reader" in text, f"{path.name}: says what the shipped reader can do here"
    if config.reader.model == SHIPPED_READER:
        reference = load_config(REPO / "configs" / "small" / "nq-64shot.yaml")
        assert {k: getattr(config.inference, k) for k in DECODING} == {
            k: getattr(reference.inference, k) for k in DECODING
        }
    else:
        assert "cannot" in text or "not used" in text, f"{path.name}: says why the shipped reader is not used"
    if set(config.task.train_data) & set(config.task.eval_data):
        assert config.task.allow_overlap and "allow_overlap" in text, f"{path.name}: trains on its eval file"


def test_the_shipped_reader_starts_every_extractive_recipe():
    uses = {p.stem for p in SMALL if load_config(p, check_data=False).reader.model == SHIPPED_READER}
    assert uses == {
        "nq-64shot",
        "triviaqa-64shot",
        "kilt-nq824",
        "kilt-nq",
        "kilt-triviaqa",
        "kilt-hotpotqa",
        "kilt-trex",
        "kilt-zsre",
    }


def test_mmlu_recipes_say_how_to_run_every_subject():
    for name in ("mmlu-5shot", "mmlu-5shot-multitask", "mmlu-zeroshot"):
        text = " ".join(header(REPO / "configs" / "small" / f"{name}.yaml"))
        assert "mmlu-per-subject" in text and "google/t5-base-lm-adapt" in text, name


def _prepare_data(path: Path, root: Path) -> dict[str, str]:
    """Run the header's `atlas data` commands with their outputs under `root` → {runs/… : root/…}."""
    moved = {}
    for argv in launch_commands(path):
        if argv[0] != "data":
            continue
        out = argv.index("--out") + 1
        moved[argv[out]] = str(root / argv[out])
        argv = [*argv[:out], moved[argv[out]], *argv[out + 1 :]]
        if not all(Path(a).exists() for a in argv if a.startswith("../shared/")):
            pytest.skip(f"{path.name}: the data of `atlas {' '.join(argv)}` is not on this machine")
        if argv[1] == "kilt-knowledge":  # KILT's Wikipedia is not here: the index is the tiny one anyway
            continue
        assert main(argv) == 0
    return moved


def _relocated(paths: list[str], moved: dict[str, str]) -> list[str]:
    out = []
    for p in paths:
        for old, new in moved.items():
            if p == old or p.startswith(old + "/"):
                p = new + p[len(old) :]
        out.append(p)
    return out


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_small_recipe_runs_a_step(path, tiny_world, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name ../shared/data relative to the repo
    config = load_config(path)
    overrides = [
        f"retriever.model={tiny_world['encoder']}",
        f"index.path={tiny_world['index']}",
        "index.corpus=null",
        "index.refresh=never",
        "reader.model=t5-tiny",
        "reader.trainable_encoder_layers=null",
        "reader.text_maxlength=64",
        "retriever.n_context=2",
        "reader.n_context=2",
        f"training.output_dir={tmp_path / 'run'}",
        f"training.steps={min(config.training.steps, 1)}",
        "training.batch_size=1",
        "training.save_every=0",
        "evaluation.max_examples=2",
        "evaluation.batch_size=2",
        "inference.generation_max_length=4",
        "retriever.tied=false",
        "retriever.train_passage_encoder=false",
        "retriever.passage_maxlength=256",
    ]
    if config.inference.retrieval_prior:  # the prior weighs a copy head's pointer: a tiny reader that has one
        overrides += ["reader.model=minilm-fid-tiny", f"reader.encoder={tiny_world['encoder']}"]
    if config.task.shots:
        overrides.append("task.shots=2")
    if config.task.name in ("mlm", "lm", "section"):
        overrides.append(f"task.train_data=[{tiny_world['corpus']}]")
    moved = _prepare_data(path, tmp_path)
    if moved:
        overrides += [
            f"task.train_data=[{','.join(_relocated(config.task.train_data, moved))}]",
            f"task.eval_data=[{','.join(_relocated(config.task.eval_data, moved))}]",
        ]
    if config.task.name == "fever":  # no FEVER data ships here: hand-written claims, disjoint files
        claims = tmp_path / "claims.jsonl"
        claims.write_text(
            '{"claim": "Quimper is the capital of Zorbland.", "label": "SUPPORTS"}\n'
            '{"claim": "Belmont is in Zorbland.", "label": "REFUTES"}\n'
            '{"claim": "Olo is a mountain.", "label": "SUPPORTS"}\n'
        )
        held_out = tmp_path / "held-out-claims.jsonl"
        held_out.write_text(
            '{"claim": "Fenwick is a city.", "label": "NOT ENOUGH INFO"}\n'
            '{"claim": "Tarsia uses the florin.", "label": "SUPPORTS"}\n'
        )
        overrides += [f"task.train_data=[{claims}]", f"task.eval_data=[{held_out}]"]
    resolved = load_config(path, overrides)
    missing = [p for p in resolved.task.train_data + resolved.task.eval_data if not Path(p).exists()]
    if missing:
        pytest.skip(f"{path.name}: data {missing} is not on this machine")
    summary = train(resolved, progress=False)
    assert summary["step"] == min(config.training.steps, 1)
    assert all(math.isfinite(loss) and loss > 0 for loss in summary["losses"])
    if resolved.task.eval_data:
        assert summary["eval"], "an evaluation ran and produced metrics"
