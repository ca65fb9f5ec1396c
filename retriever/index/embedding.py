"""How the index engine embeds passages: the one place it calls the encoder, and the precision it asks for.

`precision` is "auto", "fp32" or "bf16" (`retriever.embedding_precision`, one vocabulary for every caller), or
None: the retriever's own setting (`Retriever.precision`, a recipe's `retriever.precision`; "auto" unless set).
"auto" is bfloat16 where the hardware multiplies it natively (on a CPU: `types.native_bf16_speedup`, the detection
exact search uses), float32 elsewhere. The index records what its vectors were embedded at
(`Manifest.embedding_precision`, per segment); a query embedded at another precision searches them all the same
(bfloat16 embeddings of MiniLM agree with float32 to a cosine ≥ 0.9999: docs/results/speed.md), and the encoder
check (its fingerprint) does not depend on it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np

from retriever.embedding_precision import (
    DEFAULT_EMBEDDING_PRECISION,
    check_embedding_precision,
    resolve_embedding_precision,
)


def _encoder_takes_precision(retriever) -> bool:
    # stand-in passage encoders (benches, tests) may embed without one: their vectors are float32, and recorded so
    # (the record says what was done, not what was asked)
    return "precision" in inspect.signature(retriever.embed_passages).parameters


def embedding_precision(retriever, precision: str | None) -> str:
    """What passages embedded by `retriever` with `precision` ("auto", "fp32", "bf16"; None: the retriever's own
    setting) are embedded at: "fp32" or "bf16"; ValueError naming the valid choices for another value."""
    if precision is not None:
        check_embedding_precision(precision)
    if retriever is None or not _encoder_takes_precision(retriever):
        return "fp32"
    if precision is None:  # a `Retriever` carries its setting; a stand-in without one gets the default
        precision = getattr(retriever, "precision", DEFAULT_EMBEDDING_PRECISION)
    devices = {p.device for p in retriever.parameters()}
    return resolve_embedding_precision(precision, devices.pop() if len(devices) == 1 else "cpu")


def embed_passages(
    retriever, passages: Sequence[dict], *, batch_size: int, precision: str, progress: bool = False
) -> np.ndarray:
    """(N, d) float32 embeddings of passage records, at `precision` ("fp32" or "bf16": `embedding_precision`)."""
    if _encoder_takes_precision(retriever):
        return retriever.embed_passages(passages, batch_size=batch_size, progress=progress, precision=precision)
    return retriever.embed_passages(passages, batch_size=batch_size, progress=progress)
