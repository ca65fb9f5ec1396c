"""Fixtures for the task tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_jsonl() -> Callable[[Path, list], Path]:
    """A function writing records (dicts, or raw strings as-is) one per line; returns the path."""

    def write(path: Path, records: list) -> Path:
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    return write
