"""SIGKILL at random moments (bench/crash.py): an index update, a compaction, an index build and training each
killed once at a seeded random time (add and remove, which commit as update does, in the bench too), then
checked: every file verifies, every edited passage is all old or all new, every checkpoint is whole, and the
same command finishes the work. A longer run of the same harness gives the figures on the results page."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
