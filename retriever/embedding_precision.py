"""The precision passages and questions are embedded at: one vocabulary for every caller (the commands'
`--precision`, `precision=` in Python), light to import (the command line reads its choices from here).

"fp32"; "bf16": the encoder's forward pass under bfloat16 autocast (matrix products in bfloat16 with float32
accumulation; layer norms, softmax and pooling in float32), the vectors returned in float32; "auto" (the default):
bfloat16 where the hardware multiplies it natively, else float32 (`resolve_embedding_precision`). Where bfloat16
is emulated (no AVX512-BF16 or AMX) it is several times slower than float32, so `auto` never picks it there; a
forced "bf16" still runs there and gives the same vectors, slowly.
"""

# Lazy imports: torch (and faiss, through exact search's probe) only when a precision is resolved, so that the
# command line reads its choices from here at once.

from __future__ import annotations

import contextlib

EMBEDDING_PRECISIONS = ("auto", "fp32", "bf16")
DEFAULT_EMBEDDING_PRECISION = "auto"
# What `auto` asks of a CPU's bfloat16 product before it embeds in bfloat16: the threshold exact search's
# `auto` uses, on the same probe, so that one machine gets one answer
BF16_MIN_SPEEDUP = 1.5


def check_embedding_precision(precision: str) -> str:
    """`precision` if it is one of `EMBEDDING_PRECISIONS`, else a ValueError naming the valid ones."""
    if precision not in EMBEDDING_PRECISIONS:
        raise ValueError(f"unknown embedding precision {precision!r}; valid: {', '.join(EMBEDDING_PRECISIONS)}")
    return precision


def resolve_embedding_precision(precision: str, device="cpu") -> str:
    """The precision an embedding pass runs at on `device`: "fp32" or "bf16".

    "fp32" and "bf16" as given; "auto": "bf16" on a CUDA GPU that supports it, or on a CPU with AVX512-BF16
    or AMX whose bfloat16 product `native_bf16_speedup` measures ≥ `BF16_MIN_SPEEDUP`× float32's (once per
    process), else "fp32". ValueError naming the valid values for anything else.
    """
    check_embedding_precision(precision)
    if precision != "auto":
        return precision
    import torch

    from retriever.index.exact_search import native_bf16_speedup

    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if native_bf16_speedup() >= BF16_MIN_SPEEDUP else "fp32"
    return "fp32"


def embedding_autocast(precision: str, device):
    """The context an embedding pass at a resolved `precision` ("fp32" / "bf16") runs in on `device`
    (a `torch.device`)."""
    if precision == "bf16":
        import torch

        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
