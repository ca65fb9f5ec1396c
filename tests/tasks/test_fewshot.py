"""Seeded k-shot sampling."""

from __future__ import annotations

import hashlib

import pytest

from tasks.base import Example
from tasks.fewshot import sample_shots


def _pool(n: int) -> list[Example]:
    return [Example(id=f"ex{i}", query="q", target="t", answers=["t"]) for i in range(n)]


def test_shots_are_the_lowest_hashes_in_original_order():
    pool = _pool(200)
    shots = sample_shots(pool, 5, seed=3)
    expected = sorted(pool, key=lambda e: hashlib.sha256(f"3:{e.id}".encode()).digest())[:5]
    assert [e.id for e in shots] == [e.id for e in pool if e in expected]
    assert sample_shots(pool, 5, seed=3) == shots
    assert sample_shots(pool, 5, seed=4) != shots
    assert sample_shots(list(reversed(pool)), 5, seed=3) == list(reversed(shots))  # order-free
    # growing the pool never swaps out old winners for other old examples
    assert {e.id for e in sample_shots(pool + _pool(300)[200:], 5, seed=3)} <= {e.id for e in shots} | {
        f"ex{i}" for i in range(200, 300)
    }


def test_shot_errors():
    with pytest.raises(ValueError, match="asked for 5 shots but only 3"):
        sample_shots(_pool(3), 5, seed=0)
    with pytest.raises(ValueError, match="'ex0' repeats"):
        sample_shots(_pool(2) + _pool(1), 1, seed=0)
    assert sample_shots(_pool(3), 0, seed=0) == []
