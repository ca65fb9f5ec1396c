"""Beam search that reads each question's passages once, not once per beam.

Hugging Face's beam search repeats the fused encoder states for every beam, (B·beams, K·L, H), so T5's
cross-attention projects keys and values of beams identical copies of every passage token on the first
step and reads all beams copies at every later step. With K·L = 1,600 those two costs dominate a K=5
beam search of 4 on CPU (profiled; bench/reading.py's figures: docs/results/reader.md). Every beam of one
example attends to the same keys/values, and beam search only moves beams within their example, so:

- `BeamSharedCrossAttentionCache.prefilled` projects the keys/values from the B unexpanded rows before
  decoding starts, and never reorders them;
- `BeamFoldedCrossAttention` (installed on a T5 decoder's cross-attention modules by
  `fold_beams_in_cross_attention`) attends with the beams of an example folded into the query axis,
  queries (B, heads, beams·T, d) against keys/values (B, heads, K·L, d): the same scores, the same
  softmax rows, one read of the keys/values per example.

Anything else takes T5's own attention: training, scoring, a cache filled the usual way, and greedy
decoding (which reads the prefilled per-example keys/values as they are: one row per example).

A reader trained under transformers 3 (FiD's) also adds a relative position bias to every
cross-attention score (`reader.cross_attention_bias`): the first decoder block's
`BeamFoldedCrossAttention` computes it from the decoder positions and the cache's
`encoder_positions` (packed decoding), and T5's stack hands it to the later blocks, on every path.
"""

from __future__ import annotations

import torch
import transformers
from packaging.version import Version
from torch.nn import functional as F
from transformers import DynamicCache, EncoderDecoderCache
from transformers.models.t5.modeling_t5 import T5Attention

from reader.cross_attention_bias import cross_attention_bias, decoder_offset

# the decoder cache's keyword in `generate` and the models' forward: `cache` since transformers 5.24
# (`past_key_values` still works there, with a deprecation warning on every call)
CACHE_KWARG = "cache" if Version(transformers.__version__) >= Version("5.24.0.dev0") else "past_key_values"


def output_cache(output):
    """The decoder cache a model output carries, read under its own name (the old name warns from 5.24 on)."""
    return getattr(output, CACHE_KWARG)


class BeamSharedCrossAttentionCache(EncoderDecoderCache):
    """Decoder cache for beam search whose cross-attention keys/values are never reordered.

    Re-indexing the cross-attention cache would copy identical rows, (B·beams, heads, K·L, d_kv) per
    layer per step, which at K·L = 1,600 costs more than the decoder itself. Only the self-attention
    cache (the beams' own prefixes) is reordered.

    `copy_source` (a `reader.copy_head.CopySource`, or None) carries the same per-example view for a
    reader with a copy head: its pointer reads one copy of each example's passages for all its beams.
    `encoder_positions` ((B, S) or None) gives each key's index in the K·L layout when the keys are
    packed (`FiDReader.fuse_packed`), for a cross-attention position bias (`reader.cross_attention_bias`).
    """

    copy_source = None
    encoder_positions = None

    @classmethod
    def prefilled(
        cls, decoder: torch.nn.Module, encoder_states: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> BeamSharedCrossAttentionCache:
        """A cache whose cross-attention keys/values are projected from one copy of each example.

        Args:
            decoder: a T5 decoder stack (`T5Stack` with `.block`).
            encoder_states: (B, K·L, H) fused encoder states, not repeated per beam.
            attention_mask: (B, K·L), 1 for real tokens: only those are projected (a K=5 batch of
                SQuAD paragraphs is ~40% padding); masked positions get zero keys/values, which the
                same mask hides from every query.
        Returns:
            the cache, every layer's cross-attention (B, heads, K·L, d_kv) marked filled; decode with
            a decoder whose cross-attention is `BeamFoldedCrossAttention` (or with greedy search).
        """
        cache = cls(DynamicCache(), DynamicCache())
        real = None if attention_mask is None else attention_mask.ne(0)
        real_states = encoder_states if real is None else encoder_states[real]  # (B, K·L, H) or (N, H)
        for index, block in enumerate(decoder.block):
            attention = block.layer[1].EncDecAttention
            shape = (*encoder_states.shape[:-1], -1, attention.key_value_proj_dim)
            projected = []
            for projection in (attention.k, attention.v):
                states = projection(real_states)
                if real is not None:  # back to (B, K·L, inner), zeros at the masked positions
                    states = states.new_zeros(*real.shape, states.shape[-1]).index_put_((real,), states)
                projected.append(states.view(shape).transpose(1, 2))
            cache.cross_attention_cache.update(*projected, index)
            cache.is_updated[index] = True
        return cache

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the self-attention cache rows to `beam_idx` (B·beams,); cross-attention stays."""
        self.self_attention_cache.reorder_cache(beam_idx)


class BeamFoldedCrossAttention(T5Attention):
    """T5 cross-attention that, given per-example keys/values for beam-expanded queries, folds the
    beams into the query axis. Same parameters and state dict as `T5Attention`."""

    def forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None, **kwargs):
        """As `T5Attention.forward`; hidden_states (B·beams, T, H), mask (B·beams, 1, T or 1, K·L) or None.
        Returns (attention output (B·beams, T, H), position_bias, None)."""
        cache = kwargs.get(CACHE_KWARG)
        if position_bias is None and self.has_relative_attention_bias and key_value_states is not None:
            # a transformers-3 reader's cross-attention bias (reader.cross_attention_bias), computed here
            # and not by T5Attention, which knows neither the packed positions nor, with a cache, the
            # decoder position (it would count the token its block's self-attention has just appended)
            position_bias = cross_attention_bias(
                self,
                hidden_states.shape[1],
                key_value_states.shape[1],
                offset=decoder_offset(cache, self.layer_idx, hidden_states.shape[1]),
                encoder_positions=getattr(cache, "encoder_positions", None),
            )
        shared = self._per_example_keys_values(hidden_states, key_value_states, cache)
        if shared is None:
            if position_bias is not None and position_bias.shape[0] not in (1, hidden_states.shape[0]):
                # per-example bias for beam-expanded rows (a cache that does not fold beams)
                position_bias = position_bias.repeat_interleave(hidden_states.shape[0] // position_bias.shape[0], 0)
            return super().forward(
                hidden_states, mask=mask, key_value_states=key_value_states, position_bias=position_bias, **kwargs
            )
        keys, values = shared  # (B, heads, S, d)
        batch = keys.shape[0]
        rows, length, _ = hidden_states.shape
        beams = rows // batch
        # rows b·beams … b·beams + beams − 1 are example b's beams (`generate` repeats them in place)
        queries = self.q(hidden_states).view(batch, beams * length, self.n_heads, self.key_value_proj_dim)
        queries = queries.transpose(1, 2)  # (B, heads, beams·T, d), beam-major
        if mask is not None:
            mask = mask[::beams]  # the beams of an example share its passages' mask
            if mask.shape[2] > 1:
                mask = mask.repeat(1, 1, beams, 1)
        if position_bias is not None:  # (1 or B, heads, T, S): every beam of an example at the same positions
            if position_bias.shape[0] == rows and rows != batch:
                position_bias = position_bias[::beams]
            folded_bias = position_bias.to(queries.dtype).repeat(1, 1, beams, 1)  # (1 or B, heads, beams·T, S)
            if mask is not None and mask.dtype == torch.bool:
                mask = torch.where(mask, folded_bias, torch.finfo(queries.dtype).min)
            else:
                mask = folded_bias if mask is None else mask + folded_bias
        output = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=self.scaling)
        output = output.transpose(1, 2).reshape(rows, length, self.inner_dim)
        return self.o(output), position_bias, None

    def _per_example_keys_values(self, hidden_states, key_value_states, cache):
        """The cached (keys, values), each (B, heads, S, d), when they hold fewer rows than the queries
        (a `prefilled` cache under beam search, eval mode); None for T5's own path."""
        if key_value_states is None or self.training or not isinstance(cache, BeamSharedCrossAttentionCache):
            return None
        if not cache.is_updated.get(self.layer_idx):
            return None
        layer = cache.cross_attention_cache.layers[self.layer_idx]
        rows, batch = hidden_states.shape[0], layer.keys.shape[0]
        if batch == rows:
            return None
        if rows % batch:
            raise ValueError(f"{rows} query rows are not a whole number of beams for {batch} cached examples")
        return layer.keys, layer.values


def fold_beams_in_cross_attention(t5: torch.nn.Module) -> None:
    """Make every cross-attention module of `t5`'s decoder a `BeamFoldedCrossAttention` (in place).

    The class is swapped on the existing modules, not rebuilt: parameters, hooks (adist's query
    capture) and the state dict stay as they are. Modules of other types are left alone.
    """
    for block in getattr(t5.decoder, "block", []):
        attention = block.layer[1].EncDecAttention
        if type(attention) is T5Attention:
            attention.__class__ = BeamFoldedCrossAttention
