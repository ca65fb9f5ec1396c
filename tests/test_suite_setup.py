"""The suite's own set-up (docs/contributing.md): a test that hangs fails with pytest-timeout's message naming it,
after the default `timeout`, or after `slow_timeout` when it is marked slow; a slow test is skipped, saying how to
run it, unless RUN_SLOW=1. Run in a subprocess on a copy of tests/conftest.py, so that the suite itself never
hangs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HANGING = """
import time

import pytest


def test_sleeps_forever():
    time.sleep(10**6)


@pytest.mark.slow
def test_slow_sleeps_forever():
    time.sleep(10**6)
"""


def run_pytest(folder: Path, run_slow: bool) -> str:
    shutil.copy(ROOT / "tests" / "conftest.py", folder / "conftest.py")
    (folder / "test_hang.py").write_text(HANGING)
    (folder / "pytest.ini").write_text("[pytest]\ntimeout = 1\nslow_timeout = 2\nmarkers =\n    slow: slow\n")
    env = {**os.environ, "RUN_SLOW": "1" if run_slow else "", "COLUMNS": "200"}  # summary lines unabridged
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rfs", str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout + done.stderr


def test_a_hanging_test_fails_naming_itself_after_its_tiers_timeout(tmp_path):
    out = run_pytest(tmp_path, run_slow=True)
    assert "FAILED test_hang.py::test_sleeps_forever - Failed: Timeout (>1.0s) from pytest-timeout." in out, out
    assert "FAILED test_hang.py::test_slow_sleeps_forever - Failed: Timeout (>2.0s) from pytest-timeout." in out, out
    assert "2 failed" in out, out


def test_a_slow_test_is_skipped_saying_how_to_run_it(tmp_path):
    out = run_pytest(tmp_path, run_slow=False)
    assert "slow: run with RUN_SLOW=1 (make test-slow, make test-all)" in out, out
    assert "1 failed, 1 skipped" in out, out


def test_the_project_sets_both_timeouts_and_prints_the_slowest_tests():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(settings["timeout"]) < int(settings["slow_timeout"]) <= 1800
    assert "--durations=20" in settings["addopts"].split()
