"""Seeded, reproducible k-shot subsets of a training set.

Each example is ranked by SHA-256 of `"{seed}:{id}"` and the k lowest are kept: the choice
depends only on the seed and the ids (not on the Python version, the platform, the hash seed or
the order of the file), and growing the pool never changes which of the old examples win.
"""

from __future__ import annotations

import hashlib

from tasks.base import Example


def _rank_key(seed: int, example_id: str) -> bytes:
    return hashlib.sha256(f"{seed}:{example_id}".encode()).digest()


def sample_shots(examples: list[Example], k: int, seed: int) -> list[Example]:
    """The k-shot subset of `examples` for `seed`, in the examples' original order.

    Raises ValueError for k < 0, k larger than the pool, or duplicate example ids.
    """
    if k < 0:
        raise ValueError(f"the number of shots must be >= 0, got {k}")
    if k > len(examples):
        raise ValueError(f"asked for {k} shots but only {len(examples)} examples are available")
    ids = [example.id for example in examples]
    if len(set(ids)) != len(ids):
        duplicate = next(i for n, i in enumerate(ids) if i in ids[:n])
        raise ValueError(f"example ids must be unique to sample shots; '{duplicate}' repeats")
    chosen = set(sorted(range(len(examples)), key=lambda n: _rank_key(seed, ids[n]))[:k])
    return [example for n, example in enumerate(examples) if n in chosen]
