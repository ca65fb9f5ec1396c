"""Constrained decoding: answers are spans of the passages read."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from reader.inputs import encode_reader_inputs
from reader.span_constraint import (
    DeviceSpanConstraint,
    PassageSpanConstraint,
    StepPrefixConstraint,
    continuation_token_ids,
    copied_spans,
)
from reader.tokenizer import build_reader_tokenizer, train_t5_tokenizer
from tasks.citations import find_citations
from tasks.passage import Passage
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


# ----------------------------------------------------------------------------- exact citations from the tokens
# (title, text, the occurrence a constrained reader copies: (field, the passage's words, n-th substring occurrence),
#  the citations expected: [(field, words, n)], and where a tokenizer differs: {"spm" or "wp": its citations}).
# "spm" is a SentencePiece tokenizer trained here on ASCII text (it is cased, and the letters it never saw are
# <unk>); "wp" is MiniLM's WordPiece (uncased: it lower-cases and strips accents, and splits CJK by character).
EXACT = [
    ("Biole", "Biole's capital is Stafairk.", ("text", "Stafairk", 0), [("text", "Stafairk", 0)], {}),
    (
        "Biole",
        "The capital is Stafairk; Stafairk lies inland.",
        ("text", "Stafairk", 1),
        [("text", "Stafairk", 0), ("text", "Stafairk", 1)],
        {},
    ),
    ("Biole", "Biole is an island nation.", ("title", "Biole", 0), [("title", "Biole", 0), ("text", "Biole", 0)], {}),
    ("Quimper", "", ("title", "Quimper", 0), [("title", "Quimper", 0)], {}),
    (
        "Olo",
        "Mount Olo was first climbed by Anna Brook in 1820.",
        ("text", "Anna Brook", 0),
        [("text", "Anna Brook", 0)],
        {},
    ),
    ("Belmont", "Belmont has a clock tower built in 1820.", ("text", "1820", 0), [("text", "1820", 0)], {}),
    ("Olo", "Mount Olo is 3,000 metres high.", ("text", "3,000 metres", 0), [("text", "3,000 metres", 0)], {}),
    ("Start", "The start of the art movement.", ("text", "art", 1), [("text", "art", 1)], {}),
    (
        "Tarsia",
        "The currency of Tarsia is the florin. A florin is gold.",
        ("text", "florin", 0),
        [("text", "florin", 0), ("text", "florin", 1)],
        {},
    ),
    ("Tarsia", "The currency of Tarsia is the florin.", ("text", "the florin", 0), [("text", "the florin", 0)], {}),
    (
        "Olo",
        "mount olo, MOUNT OLO and Mount Olo.",
        ("text", "Mount Olo", 0),
        [("text", "mount olo", 0), ("text", "MOUNT OLO", 0), ("text", "Mount Olo", 0)],
        {"spm": [("text", "Mount Olo", 0)]},  # cased pieces: other spellings are other ids
    ),
    (
        "Biole",
        "STAFAIRK or Stafairk.",
        ("text", "Stafairk", 0),
        [("text", "STAFAIRK", 0), ("text", "Stafairk", 0)],
        {"spm": [("text", "Stafairk", 0)]},
    ),
    ("Brazil", "Its largest city is São Paulo.", ("text", "São Paulo", 0), [("text", "São Paulo", 0)], {}),
    (
        "São Paulo",
        "São Paulo is large.",
        ("text", "São Paulo", 0),
        [("title", "São Paulo", 0), ("text", "São Paulo", 0)],
        {},
    ),
    (
        "Zurich",
        "The bank moved to Zürich and then to Zurich.",
        ("text", "Zürich", 0),
        [("title", "Zurich", 0), ("text", "Zürich", 0), ("text", "Zurich", 0)],
        {"spm": [("text", "Zürich", 0)]},  # "ü" is <unk> there, "u" is not
    ),
    ("Zürich", "Zürich is a city.", ("title", "Zürich", 0), [("title", "Zürich", 0), ("text", "Zürich", 0)], {}),
    ("Composers", "A symphony by Antonín Dvořák.", ("text", "Dvořák", 0), [("text", "Dvořák", 0)], {}),
    (
        "Dvořák",
        "Antonín Dvořák wrote nine symphonies; Dvořák died in 1904.",
        ("text", "Dvořák", 1),
        [("title", "Dvořák", 0), ("text", "Dvořák", 0), ("text", "Dvořák", 1)],
        {},
    ),
    (
        "日本",
        "首都: 東京, Tokyo.",
        ("text", "東京", 0),
        [("text", "東京", 0)],
        {
            "spm": [("title", "日本", 0), ("text", "首都", 0), ("text", "東京", 0)]
        },  # all "▁ <unk>": "<unk>" cannot choose
    ),
    ("日本", "首都: 東京, Tokyo.", ("text", "Tokyo", 0), [("text", "Tokyo", 0)], {}),
    (
        "Ports",
        "Ostra, Varn and Ostra-on-Sea.",
        ("text", "Ostra", 0),
        [("text", "Ostra", 0), ("text", "Ostra", 1)],
        {},
    ),
    ("Ports", "Ostra, Varn and Ostra-on-Sea.", ("text", "Ostra-on-Sea", 0), [("text", "Ostra-on-Sea", 0)], {}),
    ("Plays", "A play by Eugene O'Neill.", ("text", "O'Neill", 0), [("text", "O'Neill", 0)], {}),
    (
        "Letters",
        "The letter e is common; see e.g. here.",
        ("text", "e", 3),
        [("text", "e", 3), ("text", "e", 6)],
        {},
    ),
    ("Paris", "Le Cafe\u0301 de Flore.", ("text", "Cafe\u0301", 0), [("text", "Cafe\u0301", 0)], {}),  # accent kept
    ("Numbers", "It holds 1,000 or 1000 things.", ("text", "1,000", 0), [("text", "1,000", 0)], {}),
    ("Dates", "In 1820 and again in 1820.", ("text", "1820", 1), [("text", "1820", 0), ("text", "1820", 1)], {}),
    (
        "Stafairk",
        "Stafairk is a city. Stafairk harbour.",
        ("title", "Stafairk", 0),
        [("title", "Stafairk", 0), ("text", "Stafairk", 0), ("text", "Stafairk", 1)],
        {},
    ),
    (
        "Island",
        "Stafairkian ships sail from Stafairk.",
        ("text", "Stafairk", 1),
        [("text", "Stafairk", 1)],  # not the start of "Stafairkian"
        {},
    ),
    (
        "Olo",
        "Anna Brook, Anna  Brook and Anna\nBrook.",
        ("text", "Anna Brook", 0),
        [("text", "Anna Brook", 0), ("text", "Anna  Brook", 0), ("text", "Anna\nBrook", 0)],
        {},
    ),
]


def _located(title: str, text: str, expected) -> list[tuple[str, int, int]]:
    """(field, words, n) → (field, start, end): the n-th occurrence of the words as a substring, by str.index."""
    spans = []
    for field, words, nth in expected:
        value = title if field == "title" else text
        at = -1
        for _ in range(nth + 1):
            at = value.index(words, at + 1)
        spans.append((field, at, at + len(words)))
    return spans


@pytest.fixture(scope="module")
def citation_tokenizers(tmp_path_factory):
    """SentencePiece trained here on a few hundred ASCII lines of the table's words; MiniLM's WordPiece."""
    words = sorted({w for title, text, *_ in EXACT for w in f"{title} {text}".split() if w.isascii()})
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)]
    spm = train_t5_tokenizer(lines, tmp_path_factory.mktemp("spm"), pieces=150)
    assert spm.is_fast  # offsets
    return {"spm": spm, "wp": build_reader_tokenizer(None)}


def _copied_ids(tokenizer, value: str, start: int, end: int) -> list[int]:
    """The ids a constrained reader writes to copy `value[start:end]`: the field's own tokens there."""
    encoded = tokenizer(value, add_special_tokens=False, return_offsets_mapping=True)
    return [i for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if a >= start and b <= end]


def test_the_exact_citation_table_is_at_least_thirty_questions():
    assert len(EXACT) >= 30


@pytest.mark.parametrize("name", ["spm", "wp"])
@pytest.mark.parametrize(
    ("title", "text", "copied", "expected", "differs"), EXACT, ids=[str(n) for n in range(len(EXACT))]
)
def test_copied_tokens_are_cited_at_the_passage_characters(
    citation_tokenizers, name, title, text, copied, expected, differs
):
    """The reader copies an occurrence's tokens and decodes them; the citations are the occurrences of those
    tokens, at the characters found by hand, and each slices its field back to the passage's words."""
    tokenizer = citation_tokenizers[name]
    ((field, start, end),) = _located(title, text, [copied])
    ids = _copied_ids(tokenizer, title if field == "title" else text, start, end)
    assert ids and ids[0] not in set(continuation_token_ids(tokenizer).tolist())  # a span the constraint allows
    spans = copied_spans(tokenizer, [ids], [[{"title": title, "text": text}]])[0]
    answer = tokenizer.decode(ids)  # what the reader writes, the tokenizer's spelling
    passage = Passage(id="p", title=title, text=text)
    cited = find_citations(answer, [passage], copied=spans)
    assert [(c.field, c.start, c.end) for c in cited] == _located(title, text, differs.get(name, expected))
    for c in cited:
        assert c.quote == (title if c.field == "title" else text)[c.start : c.end]


def test_an_answer_the_reader_respelled_chooses_among_unknown_pieces(citation_tokenizers):
    """SentencePiece writes "首都" and "東京" alike (▁ <unk>); the answer respelled from the passage ("東京", as
    `reader.surface` restores it) keeps the citation of its own words."""
    spm, text = citation_tokenizers["spm"], "首都: 東京, Tokyo."
    start = text.index("東京")
    spans = copied_spans(spm, [_copied_ids(spm, text, start, start + 2)], [[{"title": "", "text": text}]])[0]
    assert [(s[2], s[3]) for s in spans] == [(0, 2), (start, start + 2)]
    cited = find_citations("東京", [Passage(id="p", title="", text=text)], copied=spans)
    assert [(c.start, c.end, c.quote) for c in cited] == [(start, start + 2, "東京")]


def test_a_span_cut_mid_word_or_from_no_passage_is_not_copied(citation_tokenizers):
    wp = citation_tokenizers["wp"]
    text = "Biole's capital is Stafairk."
    start = text.index("Stafairk")
    ids = _copied_ids(wp, text, start, start + len("Stafairk"))
    passages = [[{"title": "Biole", "text": text}]]
    assert copied_spans(wp, [ids[:-1]], passages) == [[]]  # the length limit cut it before the word's end
    assert copied_spans(wp, [ids], [None]) == [[]]  # closed book
    assert copied_spans(wp, [[]], passages) == [[]]  # an empty answer
    assert copied_spans(wp, [ids], passages) == [[(0, "text", start, start + len("Stafairk"))]]
