"""SIGKILL at random moments (bench/crash.py): an index update, a compaction, an index build and training each
killed once at a seeded random time (add and remove, which commit as update does, in the bench too), then
checked: every file verifies, every edited passage is all old or all new, every checkpoint is whole, and the
same command finishes the work. A longer run of the same harness gives the figures on the results page."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_killing_any_writing_command_loses_nothing_and_leaves_nothing_half_done(
    tmp_path, tiny_encoder_path, monkeypatch
):
    spec = importlib.util.spec_from_file_location("bench_crash", REPO / "bench" / "crash.py")
    crash = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, crash)  # its dataclasses look their module up there
    spec.loader.exec_module(crash)
    kinds = ("update", "compact", "build", "train")  # add and remove commit as update does (bench/crash.py runs all)
    result = crash.run_trials(len(kinds), seed=3, encoder=Path(tiny_encoder_path), root=tmp_path, kinds=kinds)
    assert result["trials"] == 4 and set(result["by_kind"]) == set(kinds)
    problems = [t for t in result["details"] if t["problems"]]
    assert problems == [], problems
    assert result["killed"] >= 2  # most kills land while the command runs (delays are drawn within its duration)


def load_crash(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_crash", REPO / "bench" / "crash.py")
    crash = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, crash)
    spec.loader.exec_module(crash)
    return crash


CHILD = """
import os, sys
from pathlib import Path
from bench import power_loss
from tasks.io import atomic_directory, write_jsonl
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


def test_a_power_cut_during_or_after_a_build_and_a_run_keeps_them_whole(tmp_path, tiny_encoder_path, monkeypatch):
    """The commands whose folders tasks/io.py's atomic_directory commits: cut once at a random moment, once after
    they returned (then the build must be there and the run at its last step: what fsync makes durable)."""
    crash = load_crash(monkeypatch)
    kinds = ("build", "train")
    result = crash.run_trials(4, seed=5, encoder=Path(tiny_encoder_path), root=tmp_path, kinds=kinds, power_cut=True)
    assert result["mode"] == "power cut" and result["trials"] == 4
    problems = [t for t in result["details"] if t["problems"]]
    assert problems == [], problems
    returned = result["details"][2:]  # the second round: cut after the command returned
    assert [t["killed"] for t in returned] == [False, False]
    assert [t["outcome"] for t in returned] == ["complete", "resumed"]
    assert all(t["power_cut"]["fsyncs"] > 0 for t in returned)
