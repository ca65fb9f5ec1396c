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
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

CONTINUATION_SCALE = 25.0


class CopySource(NamedTuple):
    """What the copy head points into, one row per example: states (B, S, D) fused encoder states,
    mask (B, S) 1 = real token, ids (B, S) their token ids, previous_ids (B, S) the id before each
    position in its passage (`previous_source_ids`) or None (then computed from passage_length),
    log_prior (B, S) a log-weight of each position's passage (the retrieval prior) or None."""

    states: torch.Tensor
    mask: torch.Tensor
    ids: torch.Tensor
    previous_ids: torch.Tensor | None = None
    log_prior: torch.Tensor | None = None


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

    def copy_attention(
        self,
        decoder_states: torch.Tensor,
        encoder_states: torch.Tensor,
        encoder_mask: torch.Tensor,
        source_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor | None = None,
        passage_length: int | None = None,
        previous_ids: torch.Tensor | None = None,
        log_prior: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The copy distribution over input positions and the gate's logit of generating.

        Args: as `forward` (without vocab_logits).
        Returns:
            attention (N, T, S), rows summing to 1 over the real input tokens; gate (N, T, 1), the logit
            of generating from the vocabulary (σ(−gate) is the probability of copying).
        """
        # computed with the beams of an example folded into its query axis, (B, beams·T, ·), rows beam-major
        # (example b's beams are decoder rows b·beams … b·beams + beams − 1, as `generate` lays them out)
        rows, steps, width = decoder_states.shape
        batch = encoder_states.shape[0]
        if rows % batch:
            raise ValueError(f"{rows} decoder rows are not a whole number of beams for {batch} encoded examples")
        beams = rows // batch
        dtype = torch.promote_types(self.query.weight.dtype, torch.float32)  # float32, or float64 in tests
        h = decoder_states.to(dtype).reshape(batch, beams * steps, width)
        e = encoder_states.to(dtype)
        # q·(W_k e)ᵀ = (q W_k)·eᵀ: moving W_k to the query side costs T·D² instead of S·D², and in
        # generation (T = 1 per step, S = K·L fixed) it avoids re-projecting every input token each step
        scores = (self.query(h) @ self.key.weight.to(dtype)) @ e.transpose(1, 2) / math.sqrt(width)  # (B, beams·T, S)
        if decoder_input_ids is not None:
            if previous_ids is None:
                previous_ids = previous_source_ids(source_ids, encoder_mask, passage_length)
            inputs = decoder_input_ids.reshape(batch, beams * steps)
            follows = previous_ids.unsqueeze(1) == inputs.unsqueeze(-1)  # (B, beams·T, S)
            scores = scores + self.beta.to(dtype) * follows.to(dtype)
        scores = scores.masked_fill(~encoder_mask.bool().unsqueeze(1), torch.finfo(scores.dtype).min)
        attention = scores.softmax(-1)
        gate = self.gate(torch.cat([h, attention @ e], dim=-1))  # (B, beams·T, 1), logit of generating
        if log_prior is not None:  # where to copy from, re-weighted by the passages' prior; the gate keeps
            # the reader's own reading (a_j ∝ a_j · prior_j)
            attention = (scores + log_prior.to(dtype).unsqueeze(1)).softmax(-1)
        return attention.reshape(rows, steps, -1), gate.reshape(rows, steps, 1)

    def forward(
        self,
        decoder_states: torch.Tensor,
        vocab_logits: torch.Tensor,
        encoder_states: torch.Tensor,
        encoder_mask: torch.Tensor,
        source_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor | None = None,
        passage_length: int | None = None,
        previous_ids: torch.Tensor | None = None,
        log_prior: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Mixed log-probabilities.

        Args:
            decoder_states: (N, T, D) final decoder states; vocab_logits: (N, T, V). N = B, or B·beams in
                beam search, each example's beams in consecutive rows: they point into one copy of its
                passages (reading that copy once per step, not once per beam).
            encoder_states: (B, S, D) fused encoder states; encoder_mask: (B, S), 1 = real token.
            source_ids: (B, S) the token ids at those positions.
            decoder_input_ids: (N, T) the decoder inputs (y_{t-1}), for the span-continuation bias.
            passage_length: L, where S = K·L: a passage's first token has no predecessor.
            previous_ids: (B, S) the id before each position in its passage (`previous_source_ids`), given
                instead of passage_length when the positions are not K blocks of L (packed passages).
            log_prior: (B, S) log-weights of the positions' passages, added to the pointer's scores after the
                gate is read (the copy distribution becomes a_j · prior_j, renormalised); None = no prior.
        Returns:
            (N, T, V) log p(w) (normalised over V), float32 (float64 for a float64 head).
        """
        attention, gate = self.copy_attention(
            decoder_states,
            encoder_states,
            encoder_mask,
            source_ids,
            decoder_input_ids,
            passage_length,
            previous_ids,
            log_prior,
        )
        rows, steps, width = attention.shape
        batch = len(source_ids)
        vocab = vocab_logits.shape[-1]
        generated = F.logsigmoid(gate) + F.log_softmax(vocab_logits.to(attention.dtype), dim=-1)  # (N, T, V)
        # the copy distribution is zero but at the source's own ids: it is summed into one slot per distinct id
        # of an example and mixed in there alone, instead of being spread over the V ids and mixed at each
        slot_ids, slots, unused = distinct_id_slots(source_ids)  # (B, S) each
        attention = attention.reshape(batch, -1, width)  # (B, beams·T, S): beams folded into the query axis
        queries = attention.shape[1]
        copy = attention.new_zeros(batch, queries, width)
        copy.scatter_add_(2, slots.unsqueeze(1).expand(-1, queries, -1), attention)
        copy = copy.view(rows, steps, width)
        log_copy = copy.clamp_min(1e-30).log().masked_fill(copy == 0, float("-inf"))
        beams = rows // batch
        if torch.is_grad_enabled():  # unused slots to an extra column, cut off: an exact gradient
            slot_ids = slot_ids.masked_fill(unused, vocab)
            generated = F.pad(generated, (0, 1))
        index = slot_ids.repeat_interleave(beams, dim=0).unsqueeze(1).expand(-1, steps, -1)  # (N, T, S)
        copied = torch.logaddexp(generated.gather(2, index), F.logsigmoid(-gate) + log_copy)
        if torch.is_grad_enabled():
            return generated.scatter(2, index, copied)[..., :vocab]
        # in place: an unused slot repeats its example's first id with nothing to copy, so that its value
        # (logaddexp(x, -inf) = x) never exceeds the mixed one written there, and the larger is kept
        return generated.scatter_reduce_(2, index, copied, reduce="amax")


def distinct_id_slots(source_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each example's distinct source ids, one slot each: source_ids (B, S) → slot_ids (B, S), the distinct
    ids in ascending order, then the first of them again in the slots left over; slots (B, S), the slot of
    each position's id; unused (B, S) bool, the slots left over."""
    ordered, order = source_ids.sort(dim=1, stable=True)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    slot_of_ordered = first.cumsum(1) - 1
    slots = torch.empty_like(slot_of_ordered).scatter_(1, order, slot_of_ordered)
    unused = torch.arange(source_ids.shape[1], device=source_ids.device) > slot_of_ordered[:, -1:]
    slot_ids = ordered[:, :1].expand_as(ordered).scatter(1, slot_of_ordered, ordered)
    return slot_ids, slots, unused


def previous_source_ids(
    source_ids: torch.Tensor, encoder_mask: torch.Tensor, passage_length: int | None = None
) -> torch.Tensor:
    """The token id before each input position within its passage (the x_{j-1} of the span-continuation
    bias): −1 at a passage's first position and after a masked one.

    Args:
        source_ids: (B, S) input ids; encoder_mask: (B, S), 1 = real token.
        passage_length: L when S = K·L (each passage starts at a multiple of L); None: one passage.
    Returns:
        (B, S) ids, −1 where there is no predecessor.
    """
    previous = F.pad(source_ids, (1, 0), value=-1)[:, :-1]
    previous = previous.masked_fill(~F.pad(encoder_mask.bool(), (1, 0))[:, :-1], -1)
    if passage_length:
        previous[:, ::passage_length] = -1
    return previous
