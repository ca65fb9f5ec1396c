"""Constrained decoding: answers are spans of the passages read."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reader.inputs import encode_reader_inputs
from reader.span_constraint import (
    DeviceSpanConstraint,
    PassageSpanConstraint,
    StepPrefixConstraint,
    continuation_token_ids,
)
from reader.tokenizer import build_reader_tokenizer
from tests.reader.conftest import SPAN_PASSAGES, copy_head_reader_batch

START, EOS, PAD, SENTINEL = 0, 1, 0, 3


def _constraint():
    # example 0: two sequences, [5 6 7 8] and [6 9]; 7 continues a word. example 1: closed book.
    return PassageSpanConstraint(
        [[[5, 6, 7, 8], [6, 9]], []],
        answer_prefix=[SENTINEL],
        eos_token_id=EOS,
        pad_token_id=PAD,
        continuation_ids=np.array([7]),
        vocab_size=12,
    )


HAND_CASES = [
    ([], [SENTINEL]),  # the answer prefix first
    ([SENTINEL], [5, 6, 8, 9]),  # a span starts a word: not with 7
    ([SENTINEL, 6], [EOS, 7, 9]),  # "6" ends a word before 9 (second sequence), not before 7
    ([SENTINEL, 5, 6], [7]),  # "5 6" is only followed by the continuation 7: no end there
    ([SENTINEL, 5, 6, 7], [EOS, 8]),
    ([SENTINEL, 5, 6, 7, 8], [EOS]),  # the end of a sequence: nothing crosses into the next
    ([SENTINEL, 6, 9], [EOS]),
    ([SENTINEL, 8, EOS], [PAD, EOS]),  # a finished greedy row is padded
]


@pytest.mark.parametrize(("generated", "allowed"), HAND_CASES)
def test_allowed_tokens_by_hand(generated, allowed):
    assert _constraint()(0, torch.tensor([START, *generated])) == allowed


def test_a_closed_book_example_is_unconstrained_after_the_prefix():
    constraint = _constraint()
    assert constraint(1, torch.tensor([START])) == [SENTINEL]
    assert constraint(1, torch.tensor([START, SENTINEL, 4])) == list(range(12))


def test_continuation_pieces_of_both_tokenizer_families():
    class Vocab:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    assert continuation_token_ids(Vocab({"[PAD]": 0, "the": 1, "##s": 2, "##ing": 3, ",": 4})).tolist() == [2, 3]
    # SentencePiece: "▁" starts a word; a bare letter or digit piece continues one, punctuation does not
    assert continuation_token_ids(Vocab({"<pad>": 0, "▁the": 1, "s": 2, "92": 3, ",": 4, "▁": 5})).tolist() == [2, 3]


@pytest.fixture(scope="module")
def tokenizer():
    return build_reader_tokenizer(None)


def test_spans_of_real_passages_match_the_reader_tokenisation(tokenizer):
    passages = [[{"title": "Super Bowl 50", "text": "The Denver Broncos defeated the Carolina Panthers 24–10."}]]
    constraint = PassageSpanConstraint.from_passages(
        tokenizer, passages, answer_prefix="<extra_id_0>", vocab_size=len(tokenizer)
    )
    prefix = tokenizer("<extra_id_0>", add_special_tokens=False)["input_ids"]

    def walk(text):  # every step of `text`'s tokens allowed, then whether it may end there
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        sequence = [START, *prefix]
        for token in ids:
            if token not in constraint(0, torch.tensor(sequence)):
                return None
            sequence.append(token)
        return tokenizer.eos_token_id in constraint(0, torch.tensor(sequence))

    assert walk("Carolina Panthers") is True
    assert walk("super bowl 50") is True  # the title, lower-cased as the reader reads it
    assert walk("24–10") is True
    assert walk("Panthers Carolina") is None  # a splice of two places is not a span
    assert walk("bowl 50 the") is None  # nor one across the title and the text
    reader_ids, _ = encode_reader_inputs(tokenizer, ["question: who won? answer: <extra_id_0>"], passages, 64)
    inside = set(reader_ids.flatten().tolist())
    assert set(tokenizer("Carolina Panthers", add_special_tokens=False)["input_ids"]) <= inside


@pytest.mark.parametrize("beams", [1, 3])
def test_an_untrained_reader_constrained_generates_only_spans(tokenizer, tiny_encoder_path, beams):
    reader, ids, mask = copy_head_reader_batch(tokenizer, tiny_encoder_path, seed=0)
    model, passages = reader.seq2seq, SPAN_PASSAGES
    spans = [
        [tokenizer(p[key], add_special_tokens=False)["input_ids"] for p in ps for key in ("title", "text")]
        for ps in passages
    ]
    free = reader.generate(ids, mask, max_length=6, num_beams=beams)
    constraint = PassageSpanConstraint.from_passages(
        tokenizer, passages, answer_prefix="<extra_id_0>", vocab_size=model.config.vocab_size
    )
    constrained = reader.generate(ids, mask, max_length=6, num_beams=beams, prefix_allowed_tokens_fn=constraint)
    prefix = tokenizer("<extra_id_0>", add_special_tokens=False)["input_ids"]

    def is_span(answer, sequences):
        n = len(answer)
        return n > 0 and any(seq[i : i + n] == answer for seq in sequences for i in range(len(seq) - n + 1))

    for b in range(2):
        row = [t for t in constrained[b, 1:].tolist() if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)]
        assert row[: len(prefix)] == prefix and is_span(row[len(prefix) :], spans[b])
    # without the constraint a random decoder writes no such span (the test can fail)
    free_rows = [
        [t for t in free[b, 1:].tolist() if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)] for b in range(2)
    ]
    assert not all(r[: len(prefix)] == prefix and is_span(r[len(prefix) :], spans[b]) for b, r in enumerate(free_rows))


def test_the_step_constraint_gives_transformers_rowwise_scores_bit_for_bit():
    from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

    constraint, beams = _constraint(), 2
    # rows: example 0's two beams (answer prefix only; inside the span 6 7), example 1's (closed book)
    ids = torch.tensor([[START, SENTINEL, 0], [START, SENTINEL, 6], [START, SENTINEL, 4], [START, 5, 5]])
    ids[0, 2] = 5
    scores = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))
    scores[2:, :] = -math.inf  # example 1: every score already -inf, the unsatisfiable rule's case
    expected = PrefixConstrainedLogitsProcessor(constraint, beams)(ids, scores.clone())
    got = StepPrefixConstraint(constraint, beams)(ids, scores.clone())
    assert torch.equal(got, expected)
    assert torch.isfinite(got[0]).sum() == len(constraint(0, ids[0]))  # the mask did something


def test_an_empty_allowed_set_is_named():
    with pytest.raises(ValueError, match="allowed no token for example 1"):
        StepPrefixConstraint(lambda batch, _ids: [] if batch == 1 else [0], 1)(
            torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, 3)
        )


@pytest.mark.parametrize("beams", [1, 3])
def test_constrained_generation_is_transformers_rowwise_generation(tokenizer, tiny_encoder_path, beams, monkeypatch):
    from reader import fid

    reader, ids, mask = copy_head_reader_batch(tokenizer, tiny_encoder_path, seed=0)
    constraint = PassageSpanConstraint.from_passages(
        tokenizer, SPAN_PASSAGES, answer_prefix="<extra_id_0>", vocab_size=reader.seq2seq.config.vocab_size
    )
    stepped = reader.generate(ids, mask, max_length=6, num_beams=beams, prefix_allowed_tokens_fn=constraint)
    processor = fid.constraint_kwargs(constraint, beams, ids.device)["logits_processor"][0]
    assert isinstance(processor, DeviceSpanConstraint)  # the span constraint runs on the device
    monkeypatch.setattr(
        fid, "constraint_kwargs", lambda fn, beams, _device: {"logits_processor": [StepPrefixConstraint(fn, beams)]}
    )
    on_host = reader.generate(ids, mask, max_length=6, num_beams=beams, prefix_allowed_tokens_fn=constraint)
    monkeypatch.setattr(fid, "constraint_kwargs", lambda fn, _beams, _device: {"prefix_allowed_tokens_fn": fn})
    rowwise = reader.generate(ids, mask, max_length=6, num_beams=beams, prefix_allowed_tokens_fn=constraint)
    assert torch.equal(stepped, rowwise) and torch.equal(on_host, rowwise)


@pytest.mark.parametrize(("generated", "allowed"), HAND_CASES)
def test_the_device_constraint_allows_what_the_passage_constraint_does_by_hand(generated, allowed):
    constraint = _constraint()
    ids = torch.tensor([[START, *generated]] * 2)  # example 0, then the closed-book example 1
    got = DeviceSpanConstraint(constraint, 1, "cpu").allowed(ids, 12)
    assert torch.nonzero(got[0]).flatten().tolist() == allowed
    assert torch.nonzero(got[1]).flatten().tolist() == constraint(1, ids[1])


def test_the_device_constraint_gives_the_step_constraints_scores_on_random_spans():
    """Random passages, continuation pieces and answers (real spans, spans cut short, made-up sequences and
    finished rows), at every length from the answer prefix on, in beams: the same scores bit for bit."""
    rng = np.random.default_rng(0)
    vocab, beams, prefix = 40, 3, [SENTINEL, 4]
    passages = [[rng.integers(5, vocab, size=rng.integers(1, 30)).tolist() for _ in range(3)] for _ in range(5)]
    passages[2] = []  # closed book
    constraint = PassageSpanConstraint(
        passages,
        answer_prefix=prefix,
        eos_token_id=EOS,
        pad_token_id=PAD,
        continuation_ids=np.arange(5, vocab, 3),
        vocab_size=vocab,
    )
    device = DeviceSpanConstraint(constraint, beams, "cpu")
    host = StepPrefixConstraint(constraint, beams)
    checked = 0
    for length in range(9):  # generated ids after the start token: every row of a step has as many
        rows = []
        for example, sequences in enumerate(passages):
            for beam in range(beams):
                source = sequences[rng.integers(len(sequences))] if sequences else []
                start = int(rng.integers(max(1, len(source))))
                span = (source[start:] + rng.integers(5, vocab, size=length).tolist())[: max(0, length - len(prefix))]
                if beam == 2:  # made up
                    span = rng.integers(5, vocab, size=len(span)).tolist()
                generated = (prefix + span)[:length]
                if example == 3 and beam == 1 and length > len(prefix) + 1:  # a finished greedy row, padded
                    generated = prefix + [span[0], EOS] + [PAD] * (length - len(prefix) - 2)
                rows.append([START, *generated])
        ids = torch.tensor(rows)
        scores = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(length))
        expected = host(ids, scores.clone())
        assert torch.equal(device(ids, scores.clone()), expected), length
        checked += int(torch.isfinite(expected).sum() < expected.numel())
    assert checked > 0
