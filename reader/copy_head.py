"""The copy head of the warm-started reader: a pointer-generator (See et al., 2017) that mixes
the decoder's vocabulary distribution with a pointer distribution over the K·L input tokens:
    p(w) = g · softmax(z)_w + (1 − g) · Σ_{j : x_j = w} a_j,
with a_j = softmax_j(q(h_t) · k(e_j) / √d + β · [x_{j-1} = y_{t-1}]) over unmasked input positions
(β, learnt from 0, favours the token that follows the one just produced in the passage, so that a
copied span goes on instead of jumping back: measured, without it the reader loops, "june june
june …"), and g = σ(w_g · [h_t; Σ_j a_j e_j] + b_g). Its `logits` are log p (already normalised, so any
log-softmax downstream returns them unchanged). Answers that are spans of a passage are then
learnt as "where", not as "which of 30k words" — far fewer examples to learn to read.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

CONTINUATION_SCALE = 25.0


class CopyHead(nn.Module):
    """Pointer-generator output: mixes the vocabulary distribution with a copy distribution over
    the input tokens (see the module docstring). Args: d_model, the decoder's width."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.key = nn.Linear(d_model, d_model, bias=False)
        self.gate = nn.Linear(2 * d_model, 1)
        # β = CONTINUATION_SCALE · this; 0 = no span-continuation bias. The scale lets a scalar that
        # must reach a few units move at a useful pace under the decoder's learning rate.
        self.continuation = nn.Parameter(torch.zeros(()))
        for layer in (self.query, self.key):
            nn.init.normal_(layer.weight, std=d_model**-0.5)
        nn.init.normal_(self.gate.weight, std=(2 * d_model) ** -0.5)
        nn.init.zeros_(self.gate.bias)

    @property
    def beta(self) -> torch.Tensor:
        """β, the span-continuation bias (a scalar tensor)."""
        return CONTINUATION_SCALE * self.continuation

    def copy_attention(self, decoder_states: torch.Tensor, encoder_states: torch.Tensor, encoder_mask: torch.Tensor,
                       source_ids: torch.Tensor, decoder_input_ids: torch.Tensor | None = None,
                       passage_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The copy distribution over input positions and the gate's logit of generating.

        Args: as `forward` (without vocab_logits).
        Returns:
            attention (B, T, S), rows summing to 1 over the real input tokens; gate (B, T, 1), the logit
            of generating from the vocabulary (σ(−gate) is the probability of copying).
        """
        dtype = torch.promote_types(self.query.weight.dtype, torch.float32)  # float32, or float64 in tests
        h = decoder_states.to(dtype)
        e = encoder_states.to(dtype)
        # q·(W_k e)ᵀ = (q W_k)·eᵀ: moving W_k to the query side costs T·D² instead of S·D², and in
        # generation (T = 1 per step, S = K·L fixed) it avoids re-projecting every input token each step
        scores = (self.query(h) @ self.key.weight.to(dtype)) @ e.transpose(1, 2) / math.sqrt(h.shape[-1])  # (B, T, S)
        if decoder_input_ids is not None:
            previous = F.pad(source_ids, (1, 0), value=-1)[:, :-1]  # (B, S): x_{j-1}
            previous = previous.masked_fill(~F.pad(encoder_mask.bool(), (1, 0))[:, :-1], -1)
            if passage_length:
                previous[:, ::passage_length] = -1
            follows = previous.unsqueeze(1) == decoder_input_ids.unsqueeze(-1)  # (B, T, S)
            scores = scores + self.beta.to(dtype) * follows.to(dtype)
        scores = scores.masked_fill(~encoder_mask.bool().unsqueeze(1), torch.finfo(scores.dtype).min)
        attention = scores.softmax(-1)
        gate = self.gate(torch.cat([h, attention @ e], dim=-1))  # (B, T, 1), logit of generating
        return attention, gate

    def forward(self, decoder_states: torch.Tensor, vocab_logits: torch.Tensor, encoder_states: torch.Tensor,
                encoder_mask: torch.Tensor, source_ids: torch.Tensor,
                decoder_input_ids: torch.Tensor | None = None, passage_length: int | None = None) -> torch.Tensor:
        """Mixed log-probabilities.

        Args:
            decoder_states: (B, T, D) final decoder states; vocab_logits: (B, T, V).
            encoder_states: (B, S, D) fused encoder states; encoder_mask: (B, S), 1 = real token.
            source_ids: (B, S) the token ids at those positions.
            decoder_input_ids: (B, T) the decoder inputs (y_{t-1}), for the span-continuation bias.
            passage_length: L, where S = K·L: a passage's first token has no predecessor.
        Returns:
            (B, T, V) log p(w) (normalised over V), float32 (float64 for a float64 head).
        """
        attention, gate = self.copy_attention(decoder_states, encoder_states, encoder_mask, source_ids,
                                              decoder_input_ids, passage_length)
        copy = torch.zeros_like(vocab_logits, dtype=attention.dtype)
        copy.scatter_add_(2, source_ids.unsqueeze(1).expand(-1, decoder_states.shape[1], -1), attention)
        log_copy = copy.clamp_min(1e-30).log().masked_fill(copy == 0, float("-inf"))
        return torch.logaddexp(F.logsigmoid(gate) + F.log_softmax(vocab_logits.to(attention.dtype), dim=-1),
                               F.logsigmoid(-gate) + log_copy)
