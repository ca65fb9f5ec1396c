"""Representation dispersion: mean pairwise cosine distance of hidden states, per layer.

    dispersion(h_1 … h_M) = mean over pairs i ≠ j of (1 − cos(h_i, h_j))

With unit vectors u_i, Σ_{i≠j} u_i·u_j = ‖Σ u_i‖² − M, so the mean over all M(M−1) ordered
pairs needs only the running sum of unit vectors: memory O(d) per layer however many tokens
are read, and the value is exact over every pair of the tokens read (no pair sampling error).
Tokens can be subsampled (`sample_fraction`) to bound time rather than memory.

Higher dispersion goes with lower perplexity, and the most dispersed layer is a good kNN-LM
key ("On the predictive power of representation dispersion in language models"). The same
quantity on a training batch gives the auxiliary loss L = CE − μ · dispersion (`reader.dispersion_weight`
= μ; atlas/model.py computes it with `reader.dispersion_loss.mean_pairwise_cosine_distance`, which lives beside the
reader whose decoder states it reads, so that the model never reaches into this room).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from atlas.knnlm.lm import ARCHITECTURES, KeyedLM, architecture_of


class DispersionAccumulator:
    """Running Σ unit vectors and count per key: the exact all-pairs dispersion at any time."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, vectors: torch.Tensor) -> None:
        """Add rows of vectors (n, d) under `name`."""
        unit = F.normalize(vectors.double(), dim=-1)
        self.sums[name] = self.sums.get(name, 0) + unit.sum(dim=0)
        self.counts[name] = self.counts.get(name, 0) + unit.shape[0]

    def dispersion(self) -> dict[str, float]:
        """{name: mean pairwise cosine distance} over everything added so far."""
        out = {}
        for name, total in self.sums.items():
            m = self.counts[name]
            # Zero vectors normalise to zero and would bias the identity; hidden states never are.
            out[name] = float(1.0 - (total.pow(2).sum() - m) / (m * (m - 1)))
        return out


def default_dispersion_keys(model: nn.Module) -> list[str]:
    """Every block's output plus the three sublayer keys of the last block."""
    n_blocks = len(ARCHITECTURES[architecture_of(model)].blocks(model))
    return [f"layer_output:{i}" for i in range(n_blocks)] + [
        "ffn_input:-1",
        "attn_output:-1",
        "ffn_output:-1",
    ]


@torch.no_grad()
def layer_dispersion(
    model: nn.Module,
    token_ids: np.ndarray,
    *,
    key_specs: list[str] | None = None,
    context: int = 128,
    batch_size: int = 8,
    max_tokens: int | None = None,
    sample_fraction: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """Dispersion of each key type over a text's tokens (N,), read in non-overlapping windows.

    max_tokens bounds how much text is read; sample_fraction keeps a seeded random subset of
    positions. Returns {key spec: dispersion}, in `key_specs` order.
    """
    key_specs = key_specs or default_dispersion_keys(model)
    ids = np.asarray(token_ids, dtype=np.int64)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    n_windows = len(ids) // context
    if n_windows == 0:
        raise ValueError(f"text has {len(ids)} tokens, fewer than one window of {context}")
    windows = torch.from_numpy(ids[: n_windows * context].reshape(n_windows, context))
    generator = torch.Generator().manual_seed(seed)
    keyed = KeyedLM(model, key_specs)
    accumulator = DispersionAccumulator()
    try:
        for start in range(0, n_windows, batch_size):
            _, keys = keyed(windows[start : start + batch_size])
            shape = next(iter(keys.values())).shape[:2]
            keep = torch.rand(shape, generator=generator) < sample_fraction if sample_fraction < 1.0 else None
            for spec, hidden in keys.items():
                flat = hidden.reshape(-1, hidden.shape[-1]).cpu()
                accumulator.add(spec, flat if keep is None else flat[keep.reshape(-1)])
    finally:
        keyed.remove()
    values = accumulator.dispersion()
    return {spec: values[spec] for spec in keyed.key_specs}


def recommend_key(dispersions: dict[str, float]) -> str:
    """The most dispersed key: the recommended kNN-LM key."""
    if not dispersions:
        raise ValueError("no dispersion values to choose from")
    return max(dispersions, key=dispersions.get)
