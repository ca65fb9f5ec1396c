"""Every small-model recipe (configs/small/) loads, opens with its header — what it shows, the exact
commands that launch it (data and corpus preparation included), how long it takes here — and runs: one
training step and a short evaluation on its real data, made by its own header's `atlas data`
commands, with the reader and retriever swapped for tiny ones (the recipe's task, data, loss and
schedule are what is exercised)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pytest
import yaml

from atlas.cli import build_parser, main
from atlas.config import load_config
from atlas.training.loop import train

REPO = Path(__file__).resolve().parents[1]
SMALL = sorted((REPO / "configs" / "small").glob("*.yaml"))
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
    for line in lines[start + 1:]:
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


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_small_recipe_loads_and_says_what_it_is_how_to_launch_it_and_its_time(path, monkeypatch):
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
    assert sum(line.startswith("Time here:") for line in lines) == 1, f"{path.name}: says how long it takes"
    # every input under runs/ is made by a command of the header
    made = outputs(commands)
    for data in [config.index.corpus or "", *config.task.train_data, *config.task.eval_data]:
        if data.startswith("runs/"):
            assert any(data == out or data.startswith(out + "/") for out in made), f"{path.name}: who makes {data}?"
    # the reader: the shipped one with nq-64shot's extractive decoding, or the header says why not
    assert "shipped reader" in text, f"{path.name}: says what the shipped reader can do here"
    if config.reader.model == SHIPPED_READER:
        reference = load_config(REPO / "configs" / "small" / "nq-64shot.yaml").reader
        assert {k: getattr(config.reader, k) for k in DECODING} == {k: getattr(reference, k) for k in DECODING}
    else:
        assert "cannot" in text or "not used" in text, f"{path.name}: says why the shipped reader is not used"
    if set(config.task.train_data) & set(config.task.eval_data):
        assert config.task.allow_overlap and "allow_overlap" in text, f"{path.name}: trains on its eval file"


def test_the_shipped_reader_starts_every_extractive_recipe():
    uses = {p.stem for p in SMALL if yaml.safe_load(p.read_text())["reader"]["model"] == SHIPPED_READER}
    assert uses == {"nq-64shot", "triviaqa-64shot", "kilt-nq824", "kilt-nq", "kilt-triviaqa", "kilt-hotpotqa",
                    "kilt-trex", "kilt-zsre"}


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
        argv = [*argv[:out], moved[argv[out]], *argv[out + 1:]]
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
                p = new + p[len(old):]
        out.append(p)
    return out


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_small_recipe_runs_a_step(path, tiny_world, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name ../shared/data relative to the repo
    config = load_config(path)
    overrides = [
        f"retriever.model={tiny_world['encoder']}", f"index.path={tiny_world['index']}", "index.corpus=null",
        "index.refresh=never", "reader.model=t5-tiny", "reader.trainable_encoder_layers=null", "reader.text_maxlength=64",
        "retriever.n_context=2", "reader.n_context=2", f"training.output_dir={tmp_path / 'run'}",
        f"training.steps={min(config.training.steps, 1)}", "training.batch_size=1", "training.save_every=0",
        "evaluation.max_examples=2", "evaluation.batch_size=2", "reader.generation_max_length=4",
        "retriever.tied=false", "retriever.train_passage_encoder=false", "retriever.passage_maxlength=256",
    ]
    if config.reader.retrieval_prior:  # the prior weighs a copy head's pointer: a tiny reader that has one
        overrides += ["reader.model=minilm-fid-tiny", f"reader.encoder={tiny_world['encoder']}"]
    if config.task.shots:
        overrides.append("task.shots=2")
    if config.task.name in ("mlm", "lm", "section"):
        overrides.append(f"task.train_data=[{tiny_world['corpus']}]")
    moved = _prepare_data(path, tmp_path)
    if moved:
        overrides += [f"task.train_data=[{','.join(_relocated(config.task.train_data, moved))}]",
                      f"task.eval_data=[{','.join(_relocated(config.task.eval_data, moved))}]"]
    if config.task.name == "fever":  # no FEVER data ships here: hand-written claims, disjoint files
        claims = tmp_path / "claims.jsonl"
        claims.write_text('{"claim": "Quimper is the capital of Zorbland.", "label": "SUPPORTS"}\n'
                          '{"claim": "Belmont is in Zorbland.", "label": "REFUTES"}\n'
                          '{"claim": "Olo is a mountain.", "label": "SUPPORTS"}\n')
        held_out = tmp_path / "held-out-claims.jsonl"
        held_out.write_text('{"claim": "Fenwick is a city.", "label": "NOT ENOUGH INFO"}\n'
                            '{"claim": "Tarsia uses the florin.", "label": "SUPPORTS"}\n')
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
