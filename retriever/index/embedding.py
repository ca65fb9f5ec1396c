"""How the index engine embeds passages: the one place it calls the encoder, and the precision it asks for.

`precision` is "auto", "fp32" or "bf16" (issue 51): "auto" is bfloat16 where the CPU multiplies it natively
(`types.native_bf16_speedup`, the detection exact search uses) and the encoder runs on the CPU, float32
elsewhere. The index records what its vectors were embedded at (`Manifest.embedding_precision`, per segment);
a query embedded at another precision searches them all the same (bfloat16 embeddings of MiniLM agree with
float32 to a cosine of 1.0000), and the encoder check (its fingerprint) does not depend on it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np

from retriever.index.types import native_bf16_speedup

PRECISION_CHOICES = ("auto", "fp32", "bf16")


def _encoder_takes_precision(retriever) -> bool:
    # retriever/encoder.py's `embed_passages` gains `precision` in issue 51; until then passages are embedded in
    # float32 and recorded as such (the record says what was done, not what was asked)
    return "precision" in inspect.signature(retriever.embed_passages).parameters


def embedding_precision(retriever, precision: str) -> str:
    """What passages embedded by `retriever` with `precision` ("auto", "fp32", "bf16") are embedded at: "fp32" or
    "bf16"; ValueError naming the valid choices for another value."""
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    if retriever is None or not _encoder_takes_precision(retriever):
        return "fp32"
    if precision == "auto":
        on_cpu = all(p.device.type == "cpu" for p in retriever.parameters())
        return "bf16" if on_cpu and native_bf16_speedup() >= 1.5 else "fp32"
    return precision


def embed_passages(
    retriever, passages: Sequence[dict], *, batch_size: int, precision: str, progress: bool = False
) -> np.ndarray:
    """(N, d) float32 embeddings of passage records, at `precision` ("fp32" or "bf16": `embedding_precision`)."""
    if _encoder_takes_precision(retriever):
        return retriever.embed_passages(passages, batch_size=batch_size, progress=progress, precision=precision)
    return retriever.embed_passages(passages, batch_size=batch_size, progress=progress)
