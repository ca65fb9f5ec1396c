"""Kill atlas at random moments and check that nothing is lost or half-done.

Each trial starts one command in its own process — `atlas index add | update | remove | compact`, `atlas index
build` or `atlas train` — on a small index or run, sends SIGKILL after a random delay (seeded; drawn up to the
command's own uninterrupted duration, so kills land everywhere in it, the commit included), then checks:
- index edits: `atlas index info --verify` passes, and the edited passages are all the old versions or all the
  new ones (an edit is one commit), never a mix; the same command then runs to its end;
- index build: the folder is either absent or complete (it verifies), and the same command, run again, writes
  the uninterrupted build's vectors byte for byte;
- train: every checkpoint folder is complete, `latest` names one of them, and `--resume` reaches the last step.

With `--power-loss` the kill is a power cut: the command runs under bench/power_loss.py's recording layer, and
after the kill its folder is replaced by what the disk would hold (only what was fsync'd). The same checks follow,
and one more: a command that had finished before the cut must have kept its result (an edit "new", a build
"complete", a training run its last checkpoint) — a command that returned has promised its work is on disk.
Every other round of trials cuts the power at a random moment of the command (drawn as for kills), the others
once it has returned.

    python bench/crash.py --trials 60 --seed 0 --out bench/results/cpu/crash.json
    python bench/crash.py --power-loss --trials 12 --seed 0 --out bench/results/cpu/crash_power_loss.json

The suite runs a few trials of each kind (tests/test_crash.py); the figures on the results page come from a
longer run of this file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import power_loss  # after the path: the bench runs as a script

KINDS = ("add", "update", "remove", "compact", "build", "train")
N_PASSAGES = 60
N_EDITED = 12


@dataclass
class Trial:
    kind: str
    delay_s: float
    killed: bool = False  # False: the command had finished before the kill
    outcome: str = ""  # "old", "new" (edits), "absent" / "complete" (build), "resumed" (train)
    problems: list[str] = field(default_factory=list)
    power_cut: dict = field(default_factory=dict)  # --power-loss: fsyncs recorded, files left without data


@dataclass
class PowerCut:
    """A trial's power cut: the folder the command writes in (`root`), the layer's journal, and the draw of what
    a never-fsync'd file reads as."""

    root: Path
    journal: Path
    rng: random.Random
    kept: dict = field(default_factory=dict)  # power_loss.rebuild's record, once cut

    def prefix(self) -> list:
        return [ROOT / "bench" / "power_loss.py", "--journal", self.journal, "--root", self.root, "--"]


def atlas(*args, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "atlas", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})},
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"atlas {' '.join(map(str, args))} failed:\n{done.stderr[-2000:]}")
    return done


def killed_after(args: list, delay: float, cut: PowerCut | None = None) -> bool:
    """Run `atlas ARGS`, SIGKILL it after `delay` seconds; → whether it was still running then. With `cut`, the
    command runs under the power-loss layer and its folder is then rebuilt as a power cut would leave it."""
    if cut is not None:
        power_loss.snapshot(cut.root, cut.journal)
    command = [*cut.prefix()] if cut is not None else ["-m", "atlas"]
    process = subprocess.Popen(
        [sys.executable, *map(str, command), *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    try:
        process.wait(timeout=delay)
        killed = False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed = True
    if cut is not None:
        cut.kept = power_loss.power_cut(cut.root, cut.journal, cut.rng)
    return killed


def record_cut(trial: Trial, cut: PowerCut | None) -> None:
    if cut is not None:
        lost = cut.kept["files_without_data"]
        trial.power_cut = {**cut.kept, "files_without_data": len(lost), "examples": lost[:5]}


class World:
    """A tiny encoder, a corpus of N_PASSAGES passages, its index, a training recipe, and the edits' inputs."""

    def __init__(self, root: Path, encoder: Path):
        self.root, self.encoder = root, encoder
        words = ["river", "mountain", "city", "king", "music", "war", "island", "queen", "ocean", "forest"]
        rng = random.Random(0)
        docs = [
            {"id": f"p{i}", "title": f"T{i}", "text": " ".join(rng.choice(words) for _ in range(30))}
            for i in range(N_PASSAGES)
        ]
        (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        atlas("corpus", "prepare", root / "docs.jsonl", "--out", root / "corpus", "--chunk-words", "0")
        atlas("index", "build", "--corpus", root / "corpus", "--encoder", encoder, "--out", root / "index")
        self.old = {d["id"]: d["text"] for d in docs[:N_EDITED]}
        self.new = {i: t.upper() + " edited" for i, t in self.old.items()}
        (root / "update.jsonl").write_text(
            "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in self.new.items())
        )
        (root / "add.jsonl").write_text(
            "".join(
                json.dumps({"id": f"n{i}", "title": "", "text": f"new passage {i} river"}) + "\n"
                for i in range(N_EDITED)
            )
        )
        (root / "remove.txt").write_text("\n".join(self.old) + "\n")
        # an index with something to compact: three edits' segments and their dead rows
        shutil.copytree(root / "index", root / "edited")
        for n in range(3):
            (root / f"u{n}.jsonl").write_text(
                "".join(json.dumps({"id": i, "text": f"{t} v{n}"}) + "\n" for i, t in self.old.items())
            )
            atlas("index", "update", "--index", root / "edited", "--corpus", root / f"u{n}.jsonl", "--no-compact")
        (root / "qa.jsonl").write_text(
            "".join(json.dumps({"question": f"what about {w}", "answers": [w]}) + "\n" for w in words)
        )
        recipe = {
            "retriever": {"model": str(encoder), "loss": "none"},
            "index": {"path": str(root / "index")},
            "reader": {"model": "t5-tiny", "n_context": 2, "text_maxlength": 48, "dropout": 0.0},
            "task": {"train_data": [str(root / "qa.jsonl")]},
            "training": {"steps": 12, "batch_size": 2, "save_every": 2, "keep_last": 2, "log_every": 1},
        }
        (root / "recipe.json").write_text(json.dumps(recipe))
        import yaml

        (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))

    def edit_args(self, kind: str, index: Path) -> list:
        if kind == "add":
            return [
                "index",
                "add",
                "--index",
                index,
                "--corpus",
                self.root / "add.jsonl",
                "--encoder",
                self.encoder,
                "--no-compact",
            ]
        if kind == "update":
            return [
                "index",
                "update",
                "--index",
                index,
                "--corpus",
                self.root / "update.jsonl",
                "--encoder",
                self.encoder,
                "--no-compact",
            ]
        if kind == "remove":
            return ["index", "remove", "--index", index, "--ids", f"@{self.root / 'remove.txt'}", "--no-compact"]
        return ["index", "compact", "--index", index]


def passages(index: Path, encoder: Path, ids: list[str]) -> dict[str, str | None]:
    """The live text of each id (None: not live)."""
    from retriever.index import PassageIndex

    loaded = PassageIndex.load(index)
    found = {}
    for i in ids:
        position = loaded.position_of(i)
        found[i] = None if position is None else loaded.passages([position])[0]["text"]
    return found


def edit_trial(world: World, kind: str, delay: float, work: Path, cut: PowerCut | None = None) -> Trial:
    index = work / "index"
    shutil.copytree(world.root / ("edited" if kind == "compact" else "index"), index)
    before = passages(index, world.encoder, [*world.old, *(f"n{i}" for i in range(N_EDITED))])
    trial = Trial(kind, round(delay, 3), killed_after(world.edit_args(kind, index), delay, cut))
    record_cut(trial, cut)
    verify = atlas("index", "info", "--index", index, "--verify", check=False)
    if verify.returncode != 0:
        trial.problems.append(f"does not verify: {verify.stderr.strip()[-300:]}")
        return trial
    after = passages(index, world.encoder, list(before))
    if kind == "compact":
        trial.outcome = "same passages" if after == before else "changed"
        if after != before:
            trial.problems.append("a compaction changed live passages")
    else:
        expected_new = dict(before)
        if kind == "add":
            expected_new.update({f"n{i}": f"new passage {i} river" for i in range(N_EDITED)})
        elif kind == "update":
            expected_new.update(world.new)
        else:
            expected_new.update(dict.fromkeys(world.old))
        trial.outcome = "old" if after == before else "new" if after == expected_new else "mixed"
        if trial.outcome == "mixed":
            trial.problems.append(f"a mix of old and new versions: {after}")
        if cut is not None and not trial.killed and trial.outcome != "new":
            trial.problems.append("the edit had returned, and the power cut undid it")
    finished = atlas(*world.edit_args(kind, index), check=False)  # the same command, run again, completes
    if trial.outcome == "old" and finished.returncode != 0:
        trial.problems.append(f"re-running the edit failed: {finished.stderr.strip()[-300:]}")
    return trial


def build_trial(world: World, delay: float, work: Path, cut: PowerCut | None = None) -> Trial:
    args = ["index", "build", "--corpus", world.root / "corpus", "--encoder", world.encoder, "--out", work / "index"]
    trial = Trial("build", round(delay, 3), killed_after(args, delay, cut))
    record_cut(trial, cut)
    if (work / "index").exists():
        verify = atlas("index", "info", "--index", work / "index", "--verify", check=False)
        trial.outcome = "complete"
        if verify.returncode != 0:
            trial.problems.append(f"a folder that does not verify: {verify.stderr.strip()[-300:]}")
            return trial
    else:
        trial.outcome = "absent"
        if cut is not None and not trial.killed:
            trial.problems.append("the build had returned, and the power cut lost its folder")
        rerun = atlas(*args, check=False)  # the same command continues where it stopped
        if rerun.returncode != 0:
            trial.problems.append(f"running the build again failed: {rerun.stderr.strip()[-300:]}")
            return trial
    from retriever.index.manifest import Manifest  # heavy: faiss, once per trial

    resumed, reference = Manifest.load(work / "index"), Manifest.load(world.root / "index")
    if resumed.files["vectors"].sha256 != reference.files["vectors"].sha256:
        trial.problems.append("the resumed build's vectors differ from the uninterrupted build's")
    return trial


def train_trial(world: World, delay: float, work: Path, cut: PowerCut | None = None) -> Trial:
    out = work / "run"
    args = ["train", world.root / "recipe.yaml", f"training.output_dir={out}"]
    trial = Trial("train", round(delay, 3), killed_after(args, delay, cut))
    record_cut(trial, cut)
    checkpoints = out / "checkpoints"
    if cut is not None and not trial.killed:
        latest = checkpoints / "latest"
        if not latest.is_file() or latest.read_text().strip() != "step-000012":
            trial.problems.append("the run had returned, and the power cut lost its last checkpoint")
    for folder in sorted(checkpoints.glob("step-*")) if checkpoints.is_dir() else []:
        missing = [n for n in ("config.yaml", "reader", "training_state.pt") if not (folder / n).exists()]
        if missing:
            trial.problems.append(f"{folder.name} lacks {', '.join(missing)}")
    latest = checkpoints / "latest"
    if latest.is_file() and not (checkpoints / latest.read_text().strip()).is_dir():
        trial.problems.append(f"latest names {latest.read_text().strip()}, which is not there")
    resumed = atlas(*args, check=False)  # the same command continues the run (or --resume once it has one)
    if resumed.returncode != 0:
        trial.problems.append(f"running it again failed: {resumed.stderr.strip()[-300:]}")
    elif (checkpoints / "latest").read_text().strip() != "step-000012":
        trial.problems.append("the continued run did not reach its last step")
    trial.outcome = "resumed"
    return trial


def durations(world: World, work: Path, kinds: tuple[str, ...] = KINDS) -> dict[str, float]:
    """Each command's uninterrupted wall time here: the range kill delays are drawn from."""
    timing = {}
    for kind in kinds:
        folder = work / f"timing-{kind}"
        folder.mkdir()
        started = time.perf_counter()
        if kind == "build":
            atlas(
                "index", "build", "--corpus", world.root / "corpus", "--encoder", world.encoder, "--out", folder / "i"
            )
        elif kind == "train":
            atlas("train", world.root / "recipe.yaml", f"training.output_dir={folder / 'run'}")
        else:
            shutil.copytree(world.root / ("edited" if kind == "compact" else "index"), folder / "i")
            atlas(*world.edit_args(kind, folder / "i"))
        timing[kind] = time.perf_counter() - started
        shutil.rmtree(folder)
    return timing


def run_trials(
    trials: int,
    seed: int,
    encoder: Path,
    root: Path,
    kinds: tuple[str, ...] = KINDS,
    *,
    power_cut: bool = False,
    first_round: int = 0,
    world: World | None = None,
    timing: dict[str, float] | None = None,
) -> dict:
    """`trials` trials, the kinds in turn. With `power_cut`, round r (of len(kinds) trials) cuts after the command
    returned when r + `first_round` is odd. `world` and `timing` (`durations`) may come from an earlier call."""
    rng = random.Random(seed)
    world = world or World(root, encoder)
    timing = timing or durations(world, root, kinds)
    results = []
    for n in range(trials):
        kind = kinds[n % len(kinds)]
        delay = rng.uniform(0.3, timing[kind])  # from the interpreter's start to the command's end
        if power_cut and (n // len(kinds) + first_round) % 2:
            delay = 10 * timing[kind] + 60  # every other round: the cut comes once the command has returned
        work = root / f"trial-{n}"
        work.mkdir()
        cut = PowerCut(work, root / f"journal-{n}", random.Random(f"{seed}-{n}")) if power_cut else None
        if kind == "build":
            trial = build_trial(world, delay, work, cut)
        elif kind == "train":
            trial = train_trial(world, delay, work, cut)
        else:
            trial = edit_trial(world, kind, delay, work, cut)
        results.append(trial)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(root / f"journal-{n}", ignore_errors=True)
    by_kind = {}
    for kind in kinds:
        mine = [t for t in results if t.kind == kind]
        by_kind[kind] = {
            "trials": len(mine),
            "killed": sum(t.killed for t in mine),
            "outcomes": {o: sum(t.outcome == o for t in mine) for o in sorted({t.outcome for t in mine})},
            "problems": sum(bool(t.problems) for t in mine),
        }
    return {
        "mode": "power cut" if power_cut else "SIGKILL",
        "seed": seed,
        "trials": len(results),
        "killed": sum(t.killed for t in results),
        "problems": sum(bool(t.problems) for t in results),
        "uninterrupted_s": {k: round(v, 2) for k, v in timing.items()},
        "by_kind": by_kind,
        "details": [asdict(t) for t in results],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument(
        "--power-loss", action="store_true", help="a power cut instead of a kill: keep only what was fsync'd"
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"commands to run, in turn (default: {KINDS})")
    args = parser.parse_args(argv)
    from common.modeling import encoder_source

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="atlas-crash-") as tmp:
        result = run_trials(
            args.trials,
            args.seed,
            Path(encoder_source("minilm")),
            Path(tmp),
            tuple(args.kinds.split(",")),
            power_cut=args.power_loss,
        )
    result = {
        "command": "python bench/crash.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores",
        "wall_s": round(time.perf_counter() - started, 1),
        **result,
    }
    print("| command | trials | killed mid-run | outcomes | problems |\n|---|---|---|---|---|")
    for kind, row in result["by_kind"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in row["outcomes"].items())
        print(f"| {kind} | {row['trials']} | {row['killed']} | {outcomes} | {row['problems']} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
