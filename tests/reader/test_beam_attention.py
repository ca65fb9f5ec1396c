"""Beam search that reads each example's passages once: the folded cross-attention and the prefilled
cache give T5's own beam search's answers, and project keys/values of real tokens only."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

from reader.beam_attention import (
    CACHE_KWARG,
    BeamFoldedCrossAttention,
    BeamSharedCrossAttentionCache,
    fold_beams_in_cross_attention,
)
from reader.fid import FiDReader
from reader.tokenizer import build_reader_tokenizer
from tests.reader.conftest import SPAN_PASSAGES, copy_head_reader_batch, random_batch, tiny_t5


def _own_path_cache(cls, decoder, encoder_states, attention_mask=None):
    """What `generate` used before: an empty cache that T5 fills from the beam-repeated states."""
    return EncoderDecoderCache(DynamicCache(), DynamicCache())


@pytest.mark.parametrize("query_positions", [1, 3])
@pytest.mark.parametrize("padded", [True, False])
def test_folded_cross_attention_equals_t5_attention_over_repeated_rows(query_positions, padded):
    t5 = tiny_t5(seed=2)
    batch, beams, length, hidden = 2, 3, 7, t5.config.d_model
    gen = torch.Generator().manual_seed(0)
    encoder_states = torch.randn(batch, length, hidden, generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        mask[0, 4:] = 0
        mask[1, 6:] = 0
    queries = torch.randn(batch * beams, query_positions, hidden, generator=gen)
    repeated_states = encoder_states.repeat_interleave(beams, 0)
    # T5's decoder hands cross-attention a boolean (rows, 1, T, S) mask under sdpa
    rows_mask = mask.repeat_interleave(beams, 0).bool()[:, None, None, :].expand(-1, 1, query_positions, -1)
    with torch.no_grad():
        expected = [block.layer[1].EncDecAttention(queries, mask=rows_mask, key_value_states=repeated_states)[0]
                    for block in t5.decoder.block]
        fold_beams_in_cross_attention(t5)
        assert all(type(b.layer[1].EncDecAttention) is BeamFoldedCrossAttention for b in t5.decoder.block)
        cache = BeamSharedCrossAttentionCache.prefilled(t5.decoder, encoder_states, mask if padded else None)
        for index, block in enumerate(t5.decoder.block):
            keys = cache.cross_attention_cache.layers[index].keys
            assert keys.shape == (batch, t5.config.num_heads, length, t5.config.d_kv)  # one copy per example
            if padded:
                assert keys[0, :, 4:].eq(0).all()  # padding is not projected
            folded = block.layer[1].EncDecAttention(queries, mask=rows_mask, key_value_states=repeated_states,
                                                    **{CACHE_KWARG: cache})[0]
            torch.testing.assert_close(folded, expected[index], atol=1e-6, rtol=0)


def test_folded_cross_attention_refuses_rows_that_are_not_whole_beams():
    t5 = tiny_t5()
    fold_beams_in_cross_attention(t5)
    cache = BeamSharedCrossAttentionCache.prefilled(t5.decoder, torch.randn(2, 5, t5.config.d_model))
    attention = t5.decoder.block[0].layer[1].EncDecAttention
    with pytest.raises(ValueError, match="5 query rows are not a whole number of beams for 2 cached examples"):
        attention(torch.randn(5, 1, t5.config.d_model), key_value_states=torch.randn(5, 5, t5.config.d_model),
                  **{CACHE_KWARG: cache})


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_matches_t5s_own_beam_search_and_projects_each_token_once(beams, monkeypatch):
    reader = FiDReader(tiny_t5(seed=4))
    input_ids, mask, _ = random_batch(batch=3, n_passages=3, length=6, seed=5)
    projected_rows = []
    hook = reader.t5.decoder.block[0].layer[1].EncDecAttention.k.register_forward_hook(
        lambda _m, args, _out: projected_rows.append(args[0].shape[:-1].numel()))
    shared = reader.generate(input_ids, mask, max_length=6, num_beams=beams)
    assert projected_rows == [int(mask.sum())]  # real tokens of each example, once
    projected_rows.clear()
    monkeypatch.setattr(BeamSharedCrossAttentionCache, "prefilled", classmethod(_own_path_cache))
    own = reader.generate(input_ids, mask, max_length=6, num_beams=beams)
    hook.remove()
    assert projected_rows == [3 * beams * 3 * 6]  # every position of every beam's copy
    assert torch.equal(shared, own)


def test_copy_head_reader_beam_search_matches_t5s_own_path(tiny_encoder_path, monkeypatch):
    from reader.span_constraint import PassageSpanConstraint

    tokenizer = build_reader_tokenizer(None)
    reader, ids, mask = copy_head_reader_batch(tokenizer, tiny_encoder_path, seed=3)
    constraint = PassageSpanConstraint.from_passages(tokenizer, SPAN_PASSAGES, answer_prefix="<extra_id_0>",
                                                     vocab_size=reader.t5.config.vocab_size)
    shared = [reader.generate(ids, mask, max_length=6, num_beams=4, prefix_allowed_tokens_fn=fn, length_penalty=0.0)
              for fn in (None, constraint)]
    monkeypatch.setattr(BeamSharedCrossAttentionCache, "prefilled", classmethod(_own_path_cache))
    own = [reader.generate(ids, mask, max_length=6, num_beams=4, prefix_allowed_tokens_fn=fn, length_penalty=0.0)
           for fn in (None, constraint)]
    for a, b in zip(shared, own, strict=True):
        assert torch.equal(a, b)


def test_beam_search_reorders_only_within_examples_and_never_the_cross_attention(monkeypatch):
    reader = FiDReader(tiny_t5())
    input_ids, mask, _ = random_batch()
    reordered, caches = [], []
    shipped_reorder = BeamSharedCrossAttentionCache.reorder_cache

    def recording_reorder(cache, beam_idx):
        reordered.append(beam_idx.clone())
        caches.append(cache)
        shipped_reorder(cache, beam_idx)

    monkeypatch.setattr(BeamSharedCrossAttentionCache, "reorder_cache", recording_reorder)
    reader.generate(input_ids, mask, max_length=6, num_beams=3)
    assert reordered and any(not torch.equal(i, torch.arange(len(i))) for i in reordered)  # beams did move
    assert all(torch.equal(i // 3, torch.arange(len(i)) // 3) for i in reordered)  # never across examples
    assert caches[-1].cross_attention_cache.layers[0].keys.shape[0] == 2  # still one copy per example


def test_training_and_scoring_take_t5s_own_path():
    reader = FiDReader(tiny_t5())
    plain = tiny_t5()  # same seed, same weights, never folded
    assert type(plain.decoder.block[0].layer[1].EncDecAttention) is not BeamFoldedCrossAttention
    input_ids, mask, labels = random_batch()
    states = reader.encode(input_ids, mask)
    encoder_outputs, fused_mask = reader.fuse(states, mask)
    expected = plain(encoder_outputs=encoder_outputs, attention_mask=fused_mask, labels=labels)
    got = reader.train()(attention_mask=mask, encoder_states=states, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=0, rtol=0)
