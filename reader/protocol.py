"""What the per-passage scoring functions need of a reader: the seam that lets `fid.FiDReader`
delegate to `passage_scores` and `attention_scores` without those modules importing it back."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput


class FusionReader(Protocol):
    """A Fusion-in-Decoder reader as the scoring functions see it (`fid.FiDReader` is one)."""

    seq2seq: nn.Module  # the seq2seq model: `.decoder.block[i].layer[1].EncDecAttention`, optional `.copy_head`

    def fuse(self, encoder_states: torch.Tensor, attention_mask: torch.Tensor) -> tuple[BaseModelOutput, torch.Tensor]:
        """(B, K, L, H) states and (B, K, L) mask → the decoder's (B, K·L, H) memory and (B, K·L) mask."""
        ...

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, T) targets → (B, T) decoder inputs (start token prepended, -100 → pad)."""
        ...

    def source_kwargs(self, input_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Extra decoder-pass arguments (the copy head's `source_ids`), or {}."""
        ...
