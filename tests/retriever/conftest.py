"""Helpers shared by the retriever tests: a stand-in vector source and synthetic corpora."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from retriever.corpus import prepare_corpus


class ClusteredSource:
    """Stands in for a retriever's passage side: passage "s{i}" → a fixed clustered unit vector
    (so FAISS indexes that need thousands of training points can be built in a second)."""

    passage_format, passage_maxlength = "{title} {text}", 64

    def __init__(self, dim: int = 32):
        self.dim = dim
        self.centres = np.random.default_rng(0).standard_normal((50, dim)).astype(np.float32)

    def passage_fingerprint(self) -> str:
        return f"clustered-{self.dim}"

    def passage_lengths(self, passages) -> np.ndarray:
        return np.zeros(len(passages), dtype=np.int64)  # no tokens: a build takes a chunk in row order

    def embed_passages(self, passages, **_) -> np.ndarray:
        rows = np.array([int(p["id"][1:]) for p in passages])
        noise = np.stack([np.random.default_rng(int(r)).standard_normal(self.dim) for r in rows])
        x = self.centres[rows % 50] + 0.3 * noise.astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def synthetic_corpus(folder: Path, n: int) -> Path:
    docs = folder / f"synthetic-{n}.jsonl"
    docs.write_text("".join(json.dumps({"id": f"s{i}", "text": f"passage {i}"}) + "\n" for i in range(n)))
    prepare_corpus([docs], folder / f"corpus-{n}", chunk_words=0, progress=False)
    return folder / f"corpus-{n}"


@pytest.fixture(scope="session")
def clustered_source() -> type[ClusteredSource]:
    """The `ClusteredSource` class (conftest helpers are not importable under importlib mode)."""
    return ClusteredSource


@pytest.fixture(scope="session")
def make_synthetic_corpus():
    """`synthetic_corpus(folder, n)`: a prepared corpus of n one-line passages "s0".."s{n-1}"."""
    return synthetic_corpus
