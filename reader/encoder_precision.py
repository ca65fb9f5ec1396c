"""The precision of no-grad passes: the retriever losses' eval-mode gold pass (and, opted in, answering)
in bfloat16.

With dropout in the reader's encoder, the training pass's encoder states are not the eval-mode states
the gold scores are defined on (SPEC: gold scores in eval mode, no grad), so a retriever loss pays a
second encoder pass over every scored passage (bench/train_step.py times it).
That pass needs no gradient, so it can run under bfloat16 autocast where the hardware multiplies
bfloat16 natively (CPUs with AVX512-BF16 or AMX, CUDA GPUs with bf16), where it is faster and its states
stay close to float32's (both measured: docs/results/retriever.md, "The cost of a step"). The gold scores
keep their meaning (the same reader, eval mode, no grad); their change is
measured by bench/gold_signal.py (`--gold-precision fp32,bf16`). Only the encoder runs in bfloat16: the
decoder passes that turn states into likelihoods and attention masses stay in the reader's precision.
Answering runs its encoder pass the same way at `inference.precision: bf16` or `bf16-int8` (and `auto` on a
GPU; on a CPU `auto` keeps the encoder in float32, where a bf16 encoder moved answers); its decoder is never
autocast (autocast slowed the small per-step products of beam search on CPU).

Not kept for the encoder: PyTorch's dynamic int8 quantisation (per-tensor activation scales) is faster still, but
MiniLM's activation outliers against per-tensor scales move its states far more, enough to change `adist`'s gold
ranking (docs/results/retriever.md) and answers; the decoder keeps its answers in int8 (`reader.int8_decoding`).
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch
from torch import nn

# One vocabulary for every precision setting (`training.precision`, `inference.precision`,
# `retriever.gold_precision`)
PRECISIONS = ("auto", "fp32", "bf16")


def native_bf16(device: torch.device) -> bool:
    """True where bfloat16 pays on `device`: a CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX on
    which a bfloat16 matrix product of an encoder's shape is measured faster than float32 (once per
    process: on one Xeon with AVX512-BF16 an earlier setup found bf16 autocast slower; without those
    instructions bfloat16 is emulated)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        cpu = torch.cpu
        checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return any(check() for check in checks if check is not None) and _cpu_bf16_speedup() >= 1.2
    return False


@functools.lru_cache(maxsize=1)
def _cpu_bf16_speedup() -> float:
    """float32 time / bfloat16 time of a (2048 × 384) · (384 × 1536) product on this CPU."""

    def best_time(dtype: torch.dtype) -> float:
        # a private generator: a probe must not move the global RNG (a run's dropout masks would then
        # depend on whether this process had measured before)
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(2048, 384, generator=generator).to(dtype)
        b = torch.randn(384, 1536, generator=generator).to(dtype)
        a @ b  # warm-up: kernel selection, packing
        times = []
        for _ in range(3):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.no_grad():
        return best_time(torch.float32) / best_time(torch.bfloat16)


def resolve_precision(precision: str, encoder: nn.Module) -> str:
    """ "auto" → "bf16" where the encoder is float32 on a device with native bfloat16, else "fp32";
    "fp32" and "bf16" as given. ValueError for an unknown name."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {list(PRECISIONS)}")
    if precision != "auto":
        return precision
    weight = next(encoder.parameters(), None)
    if weight is None or weight.dtype != torch.float32:
        return "fp32"
    return "bf16" if native_bf16(weight.device) else "fp32"


def precision_autocast(precision: str, device: torch.device):
    """The context a pass at `precision` ("fp32" or "bf16", resolved) runs in: bfloat16 autocast or none."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
