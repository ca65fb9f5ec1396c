"""The dispersion loss term: mean pairwise cosine distance of the decoder's hidden states
(`reader.dispersion_weight`; L = CE − μ · dispersion). atlas/knnlm/dispersion.py measures the same quantity
per layer of a language model.

    dispersion(h_1 … h_M) = mean over pairs i ≠ j of (1 − cos(h_i, h_j))

With unit vectors u_i, Σ_{i≠j} u_i·u_j = ‖Σ u_i‖² − M: the mean over all M(M−1) ordered pairs from one sum.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def mean_pairwise_cosine_distance(hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of 1 − cos over all ordered pairs i ≠ j of the rows of hidden (..., d), differentiable.

    mask (...) bool/0-1 selects rows (e.g. non-padding tokens). Needs at least 2 rows.
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    if mask is not None:
        flat = flat[mask.reshape(-1).bool()]
    count = flat.shape[0]
    if count < 2:
        raise ValueError(f"dispersion needs at least 2 vectors, got {count}")
    unit = F.normalize(flat, dim=-1)
    total = unit.sum(dim=0)
    mean_cosine = (total.pow(2).sum() - unit.pow(2).sum()) / (count * (count - 1))
    return 1.0 - mean_cosine
