"""SIGKILL at random moments (bench/crash.py): an index update, a compaction, an index build and training each
killed once at a seeded random time (add and remove, which commit as update does, in the bench too), then
checked: every file verifies, every edited passage is all old or all new, every checkpoint is whole, and the
same command finishes the work. A longer run of the same harness gives the figures on the results page.

The fast tier kills one index update (the harness and its checks whole, one command); the slow tier every
writing command, and the power cuts."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def crash(tmp_path_factory, tiny_encoder_path):
    """bench/crash.py as a module, with one world (corpus, index, recipe) and the commands' uninterrupted
    durations, shared by the kill and the power-cut trials."""
    spec = importlib.util.spec_from_file_location("bench_crash", REPO / "bench" / "crash.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        root = tmp_path_factory.mktemp("crash-world")
        module.world = module.World(root, Path(tiny_encoder_path))
        module.timing = {}
        module.root = root
        yield module
    finally:
        sys.modules.pop(spec.name, None)


KINDS = ("update", "compact", "build", "train")  # add and remove commit as update does (bench/crash.py runs all)


def timed(crash, kinds: tuple[str, ...]) -> dict[str, float]:
    """The commands' uninterrupted durations (the range kill delays are drawn from), each measured once a module."""
    missing = tuple(kind for kind in kinds if kind not in crash.timing)
    if missing:
        crash.timing.update(crash.durations(crash.world, crash.root, missing))
    return {kind: crash.timing[kind] for kind in kinds}


def test_killing_an_index_update_loses_nothing_and_leaves_nothing_half_done(tmp_path, crash):
    result = crash.run_trials(
        1,
        seed=3,
        encoder=crash.world.encoder,
        root=tmp_path,
        kinds=("update",),
        world=crash.world,
        timing=timed(crash, ("update",)),
    )
    assert result["trials"] == 1 and set(result["by_kind"]) == {"update"}
    problems = [t for t in result["details"] if t["problems"]]
    assert problems == [], problems


@pytest.mark.slow
def test_killing_any_writing_command_loses_nothing_and_leaves_nothing_half_done(tmp_path, crash):
    result = crash.run_trials(
        len(KINDS),
        seed=3,
        encoder=crash.world.encoder,
        root=tmp_path,
        kinds=KINDS,
        world=crash.world,
        timing=timed(crash, KINDS),
    )
    assert result["trials"] == 4 and set(result["by_kind"]) == set(KINDS)
    problems = [t for t in result["details"] if t["problems"]]
    assert problems == [], problems
    assert result["killed"] >= 2  # most kills land while the command runs (delays are drawn within its duration)


CHILD = """
import os, sys
from pathlib import Path
from bench import power_loss
from common.io import atomic_directory, write_jsonl
root = Path(sys.argv[1])
power_loss.install(power_loss.Journal(Path(sys.argv[2]), root))
write_jsonl(root / "durable.jsonl", [{"a": 1}])
with open(root / ".plain.tmp", "w") as f:  # written and renamed, never fsync'd
    f.write("plain")
os.replace(root / ".plain.tmp", root / "plain.txt")
with atomic_directory(root / "folder", overwrite=True) as tmp:
    (tmp / "x").write_text("new")
"""


def test_a_power_cut_keeps_what_was_fsynced_and_loses_the_rest(tmp_path, monkeypatch):
    """bench/power_loss.py: a durable write survives the cut, a renamed file never fsync'd is left without its
    data (empty or zeros), and the folder an overwrite swapped in is the new one with no copy of the old left."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench import power_loss

    root, journal = tmp_path / "root", tmp_path / "journal"
    (root / "folder").mkdir(parents=True)
    (root / "folder" / "x").write_text("old")
    power_loss.snapshot(root, journal)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", CHILD, str(root), str(journal)], check=True, env=env)
    assert (root / "plain.txt").read_text() == "plain"  # a kill keeps it: the page cache survives a process
    kept = power_loss.power_cut(root, journal, random.Random(0))
    assert (root / "durable.jsonl").read_text() == '{"a": 1}\n'
    assert (root / "folder" / "x").read_text() == "new"
    assert (root / "plain.txt").read_bytes() in (b"", b"\0" * 5) and kept["files_without_data"] == ["plain.txt"]
    assert sorted(p.name for p in root.iterdir()) == ["durable.jsonl", "folder", "plain.txt"]


@pytest.mark.slow
def test_a_power_cut_after_a_build_or_a_run_returned_keeps_them_whole(tmp_path, crash):
    """The commands whose folders common/io.py's atomic_directory commits, cut once they returned: the build must be
    there and the run at its last step (what fsync makes durable; cuts at random moments: bench/crash.py)."""
    kinds = ("build", "train")
    result = crash.run_trials(
        2,
        seed=5,
        encoder=crash.world.encoder,
        root=tmp_path,
        kinds=kinds,
        power_cut=True,
        first_round=1,
        world=crash.world,
        timing=timed(crash, kinds),
    )
    assert result["mode"] == "power cut" and result["trials"] == 2
    problems = [t for t in result["details"] if t["problems"]]
    assert problems == [], problems
    assert [t["killed"] for t in result["details"]] == [False, False]
    assert [t["outcome"] for t in result["details"]] == ["complete", "resumed"]
    assert all(t["power_cut"]["fsyncs"] > 0 for t in result["details"])
    # everything the commands wrote was fsync'd (the run's log.jsonl too: read back whole, not only tolerated)
    assert [t["power_cut"]["files_without_data"] for t in result["details"]] == [0, 0]
