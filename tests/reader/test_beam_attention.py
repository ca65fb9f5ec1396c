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
        expected = [
            block.layer[1].EncDecAttention(queries, mask=rows_mask, key_value_states=repeated_states)[0]
            for block in t5.decoder.block
        ]
        fold_beams_in_cross_attention(t5)
        assert all(type(b.layer[1].EncDecAttention) is BeamFoldedCrossAttention for b in t5.decoder.block)
        cache = BeamSharedCrossAttentionCache.prefilled(t5.decoder, encoder_states, mask if padded else None)
        for index, block in enumerate(t5.decoder.block):
            keys = cache.cross_attention_cache.layers[index].keys
            assert keys.shape == (batch, t5.config.num_heads, length, t5.config.d_kv)  # one copy per example
            if padded:
                assert keys[0, :, 4:].eq(0).all()  # padding is not projected
            folded = block.layer[1].EncDecAttention(
                queries, mask=rows_mask, key_value_states=repeated_states, **{CACHE_KWARG: cache}
            )[0]
            torch.testing.assert_close(folded, expected[index], atol=1e-6, rtol=0)


def test_folded_cross_attention_refuses_rows_that_are_not_whole_beams():
    t5 = tiny_t5()
    fold_beams_in_cross_attention(t5)
    cache = BeamSharedCrossAttentionCache.prefilled(t5.decoder, torch.randn(2, 5, t5.config.d_model))
    attention = t5.decoder.block[0].layer[1].EncDecAttention
    with pytest.raises(ValueError, match="5 query rows are not a whole number of beams for 2 cached examples"):
        attention(
            torch.randn(5, 1, t5.config.d_model),
            key_value_states=torch.randn(5, 5, t5.config.d_model),
            **{CACHE_KWARG: cache},
        )


@pytest.mark.parametrize("beams", [1, 3])
def test_generation_matches_t5s_own_beam_search_and_projects_each_token_once(beams, monkeypatch):
    reader = FiDReader(tiny_t5(seed=4))
    input_ids, mask, _ = random_batch(batch=3, n_passages=3, length=6, seed=5)
    projected_rows = []
    hook = (
        reader.seq2seq.decoder.block[0]
        .layer[1]
        .EncDecAttention.k.register_forward_hook(
            lambda _m, args, _out: projected_rows.append(args[0].shape[:-1].numel())
        )
    )
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
    constraint = PassageSpanConstraint.from_passages(
        tokenizer, SPAN_PASSAGES, answer_prefix="<extra_id_0>", vocab_size=reader.seq2seq.config.vocab_size
    )
    shared = [
        reader.generate(ids, mask, max_length=6, num_beams=4, prefix_allowed_tokens_fn=fn, length_penalty=0.0)
        for fn in (None, constraint)
    ]
    monkeypatch.setattr(BeamSharedCrossAttentionCache, "prefilled", classmethod(_own_path_cache))
    own = [
        reader.generate(ids, mask, max_length=6, num_beams=4, prefix_allowed_tokens_fn=fn, length_penalty=0.0)
        for fn in (None, constraint)
    ]
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


def test_fuse_packed_keeps_each_examples_real_tokens_in_order():
    states = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 2, 3, 1)  # state = its K·L position (+6 for b=1)
    mask = torch.tensor([[[1, 1, 0], [1, 0, 0]], [[1, 1, 1], [1, 1, 0]]])
    packed, packed_mask, positions = FiDReader.fuse_packed(states, mask)
    assert positions[0, :3].tolist() == [0, 1, 3] and positions[1].tolist() == [0, 1, 2, 3, 4]
    assert packed_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert packed.last_hidden_state[..., 0].tolist() == [[0, 1, 3, 0, 0], [6, 7, 8, 9, 10]]  # padding zeroed


def test_previous_source_ids_restart_at_each_passage_and_after_padding():
    from reader.copy_head import previous_source_ids

    ids = torch.tensor([[5, 6, 0, 7, 8, 9]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1]])
    assert previous_source_ids(ids, mask, passage_length=3).tolist() == [[-1, 5, 6, -1, 7, 8]]
    assert previous_source_ids(ids, mask).tolist() == [[-1, 5, 6, -1, 7, 8]]  # 7 follows padding
    assert previous_source_ids(ids, torch.ones_like(mask)).tolist() == [[-1, 5, 6, 0, 7, 8]]


def test_copy_head_reads_one_copy_of_the_passages_for_all_beams_in_float64():
    from reader.copy_head import CopyHead, previous_source_ids

    torch.manual_seed(0)
    head = CopyHead(8).double()
    head.continuation.data.fill_(0.1)  # β ≠ 0, so the span-continuation bias is compared too
    batch, beams, steps = 2, 3, 2
    states = torch.randn(batch * beams, steps, 8, dtype=torch.float64)
    vocab = torch.randn(batch * beams, steps, 12, dtype=torch.float64)
    encoder = torch.randn(batch, 6, 8, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    ids = torch.tensor([[4, 7, 4, 9, 0, 0], [5, 4, 7, 3, 10, 4]])
    inputs = torch.randint(2, 12, (batch * beams, steps))
    with torch.no_grad():
        repeated = head(
            states,
            vocab,
            encoder.repeat_interleave(beams, 0),
            mask.repeat_interleave(beams, 0),
            ids.repeat_interleave(beams, 0),
            decoder_input_ids=inputs,
            passage_length=3,
        )
        folded = head(states, vocab, encoder, mask, ids, decoder_input_ids=inputs, passage_length=3)
        given = head(
            states, vocab, encoder, mask, ids, decoder_input_ids=inputs, previous_ids=previous_source_ids(ids, mask, 3)
        )
    torch.testing.assert_close(folded, repeated, atol=1e-12, rtol=0)
    assert torch.equal(given, folded)
    with pytest.raises(ValueError, match="5 decoder rows are not a whole number of beams for 2 encoded examples"):
        head(states[:5], vocab[:5], encoder, mask, ids)


@pytest.mark.parametrize("beams", [1, 3])
def test_packed_generation_gives_the_padded_layouts_answers(beams, monkeypatch):
    reader = FiDReader(tiny_t5(seed=6))
    input_ids, mask, _ = random_batch(batch=3, n_passages=3, length=6, seed=7)
    mask[1, 0, 2:] = 0  # much padding in the middle of an example
    widths, shipped = [], BeamSharedCrossAttentionCache.__dict__["prefilled"].__func__

    def recording(cls, decoder, encoder_states, attention_mask=None):
        widths.append(encoder_states.shape[1])
        return shipped(cls, decoder, encoder_states, attention_mask)

    monkeypatch.setattr(BeamSharedCrossAttentionCache, "prefilled", classmethod(recording))
    packed = reader.generate(input_ids, mask, max_length=6, num_beams=beams)
    padded = reader.generate(input_ids, mask, max_length=6, num_beams=beams, pack_passages=False)
    assert torch.equal(packed, padded)
    assert widths == [int(mask.sum((1, 2)).max()), 3 * 6]  # the decoder reads the most real tokens, not K·L


def test_copy_head_reader_packed_generation_gives_the_padded_layouts_answers(tiny_encoder_path):
    from reader.span_constraint import PassageSpanConstraint

    tokenizer = build_reader_tokenizer(None)
    reader, ids, mask = copy_head_reader_batch(tokenizer, tiny_encoder_path, seed=3)
    reader.seq2seq.copy_head.continuation.data.fill_(0.2)  # a span-continuation bias that matters
    constraint = PassageSpanConstraint.from_passages(
        tokenizer, SPAN_PASSAGES, answer_prefix="<extra_id_0>", vocab_size=reader.seq2seq.config.vocab_size
    )
    for beams in (1, 4):
        for fn in (None, constraint):
            packed = reader.generate(
                ids, mask, max_length=6, num_beams=beams, prefix_allowed_tokens_fn=fn, length_penalty=0.0
            )
            padded = reader.generate(
                ids,
                mask,
                max_length=6,
                num_beams=beams,
                prefix_allowed_tokens_fn=fn,
                length_penalty=0.0,
                pack_passages=False,
            )
            assert torch.equal(packed, padded)


def test_a_passage_prior_reweights_the_pointer_but_not_the_gate_in_float64():
    from reader.copy_head import CopyHead

    torch.manual_seed(1)
    head = CopyHead(8).double()
    states, encoder = torch.randn(2, 1, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    mask, ids = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]), torch.tensor([[4, 7, 5, 9, 0], [5, 4, 7, 3, 4]])
    log_prior = torch.log(torch.tensor([[0.7, 0.7, 0.3, 0.3, 0.0], [0.5, 0.5, 0.5, 0.25, 0.25]], dtype=torch.float64))
    log_prior = log_prior.masked_fill(mask.eq(0), 0)
    with torch.no_grad():
        plain, plain_gate = head.copy_attention(states, encoder, mask, ids)
        weighted, gate = head.copy_attention(states, encoder, mask, ids, log_prior=log_prior)
    expected = plain * log_prior.exp().unsqueeze(1) * mask.unsqueeze(1)
    torch.testing.assert_close(weighted, expected / expected.sum(-1, keepdim=True), atol=1e-12, rtol=0)
    assert torch.equal(gate, plain_gate)


def test_generation_maps_the_passage_prior_onto_each_read_position(tiny_encoder_path):
    tokenizer = build_reader_tokenizer(None)
    reader, ids, mask = copy_head_reader_batch(tokenizer, tiny_encoder_path, seed=3)
    prior = torch.log_softmax(torch.tensor([[2.0, 0.5], [1.0, 3.0]]), dim=-1)
    seen = []
    hook = reader.seq2seq.copy_head.register_forward_hook(
        lambda _m, _args, kwargs, _out: seen.append(kwargs["log_prior"]), with_kwargs=True
    )
    answers = {}
    for pack in (True, False):
        answers[pack] = reader.generate(
            ids, mask, max_length=5, num_beams=2, passage_log_prior=prior, pack_passages=pack
        )
        log_prior = seen[-1]
        _, packed_mask, positions = FiDReader.fuse_packed(torch.zeros(*ids.shape, 1), mask)
        passage = (
            positions // ids.shape[2]
            if pack
            else torch.arange(ids.shape[1] * ids.shape[2]).expand(2, -1) // ids.shape[2]
        )
        real = packed_mask.bool() if pack else mask.reshape(2, -1).bool()
        assert torch.equal(log_prior[real], prior.gather(1, passage)[real])
        assert log_prior[~real].eq(0).all()
    hook.remove()
    assert torch.equal(answers[True], answers[False])
    with pytest.raises(ValueError, match="this reader has no copy head"):
        FiDReader(tiny_t5()).generate(*random_batch()[:2], passage_log_prior=torch.zeros(2, 3))


def test_the_retrieval_prior_is_a_tempered_log_softmax_of_the_scores():
    import math

    from atlas.model import passage_log_prior
    from tasks.passage import Passage

    passages = [[Passage("a", score=0.8), Passage("b", score=0.6)], [Passage("c", score=0.5)]]
    prior = passage_log_prior(passages, 2, temperature=0.1, weight=0.5)
    first = 0.5 * (8 - math.log(math.exp(8) + math.exp(6)))
    assert prior[0, 0].item() == pytest.approx(first, abs=1e-6)
    assert prior[0, 1].item() == pytest.approx(first - 0.5 * 2, abs=1e-6)
    assert prior[1].tolist() == [0.0, 0.0]  # one passage: log 1; the padding slot: 0
    assert passage_log_prior([[Passage("a", score=0.8), Passage("g", text="given")]], 2, 0.1, 1.0) is None
