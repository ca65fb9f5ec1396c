"""`reference_t5_tokenizer`: a T5 SentencePiece tokenizer that splits text as transformers 4 did (the
reference's 4.18), on a SentencePiece model trained here (with its NFKC character map)."""

from __future__ import annotations

import json
import random

import pytest
import sentencepiece as spm
from transformers import T5Tokenizer

from reader.tokenizer import build_reader_tokenizer, check_reader_tokenizer, reference_t5_tokenizer

WORDS = [
    "question",
    "answer",
    "title",
    "context",
    "who",
    "what",
    "where",
    "when",
    "the",
    "of",
    "in",
    "is",
    "was",
    "by",
    "paris",
    "france",
    "capital",
    "river",
    "king",
]


@pytest.fixture(scope="module")
def t5_spm_tokenizer(tmp_path_factory) -> T5Tokenizer:
    """A T5 tokenizer over a small unigram SentencePiece model (nmt_nfkc, `▁` a piece of its own)."""
    folder = tmp_path_factory.mktemp("spm")
    rng = random.Random(0)
    lines = [
        " ".join(rng.choice([*WORDS, "1", "2", "(", ")", "-"]) for _ in range(rng.randint(3, 12)))
        + rng.choice([":", "?", ".", ""])
        for _ in range(300)
    ]
    (folder / "corpus.txt").write_text("\n".join(lines))
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"),
        model_prefix=str(folder / "spiece"),
        vocab_size=60,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return T5Tokenizer.from_pretrained(str(folder), extra_ids=10)


def tokens(tokenizer, text: str) -> list[str]:
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


def test_a_space_before_a_special_token_is_a_token_of_its_own(t5_spm_tokenizer):
    reference = reference_t5_tokenizer(t5_spm_tokenizer)
    prompt = "question: who is the king? answer: <extra_id_0>"
    assert tokens(reference, prompt)[-4:] == [":", "▁", "<extra_id_0>", "</s>"]
    assert tokens(t5_spm_tokenizer, prompt)[-3:] == [":", "<extra_id_0>", "</s>"]  # transformers 5 drops it
    # with a passage after the sentinel: "<extra_id_0> title: …" starts its stretch with one '▁'
    with_passage = f"{prompt} title: paris context: the capital of france"
    assert tokens(reference, with_passage) == [
        *tokens(reference, prompt)[:-1],
        *tokens(t5_spm_tokenizer, "title: paris context: the capital of france"),
    ]
    # the reference's empty passage: "title:  context: " (two spaces collapse, the trailing one stays)
    assert tokens(reference, f"{prompt} title:  context: ")[-6:] == ["▁title", ":", "▁context", ":", "▁", "</s>"]


def test_everything_else_is_the_tokenizer_it_came_from(t5_spm_tokenizer, tmp_path):
    reference = reference_t5_tokenizer(t5_spm_tokenizer)
    assert reference.get_vocab() == t5_spm_tokenizer.get_vocab()
    assert (reference.eos_token_id, reference.pad_token_id, reference.unk_token_id) == (1, 0, 2)
    for text in [
        "question: who  is the king? title: paris context: the capital of france",
        "  where was the river (1) - 2",
        "ｑｕｅｓｔｉｏｎ： ｗｈｏ",
    ]:  # full width: the NFKC map is kept
        assert reference(text)["input_ids"] == t5_spm_tokenizer(text)["input_ids"]
    assert tokens(reference, "ｑｕｅｓｔｉｏｎ")[0] == "▁question"
    ids = reference("the king answer: <extra_id_0> paris")["input_ids"]
    assert reference.decode(ids, skip_special_tokens=True) == t5_spm_tokenizer.decode(ids, skip_special_tokens=True)
    spec = json.loads(reference.backend_tokenizer.to_str())
    assert [n["type"] for n in spec["normalizer"]["normalizers"]] == ["Precompiled", "Replace"]
    check_reader_tokenizer(reference, "test")

    # saved, the folder loads back with the same pipeline (it is not rebuilt as a T5Tokenizer)
    reference.save_pretrained(str(tmp_path / "tokenizer"))
    loaded = build_reader_tokenizer(tmp_path / "tokenizer")
    prompt = "question: who is the king? answer: <extra_id_0>"
    assert loaded(prompt)["input_ids"] == reference(prompt)["input_ids"]
    assert reference_t5_tokenizer(loaded)(prompt)["input_ids"] == reference(prompt)["input_ids"]  # idempotent


def test_a_wordpiece_tokenizer_is_refused():
    with pytest.raises(ValueError, match="not a T5 SentencePiece"):
        reference_t5_tokenizer(build_reader_tokenizer(None))
