"""Surface forms of copied answers (reader.surface)."""

from __future__ import annotations

import pytest

from reader.surface import decode_answers, find_surface, fold, restore_surface
from reader.tokenizer import build_reader_tokenizer
from tasks.metrics import exact_match

PASSAGE = {
    "title": "Pelé",
    "text": "About 3.2 million farmers; every car has a rear-view mirror. Pelé scored 1,000 goals.",
}


@pytest.mark.parametrize(
    ("generated", "expected"),
    [
        ("3. 2 million", "3.2 million"),
        ("rear - view mirror", "rear-view mirror"),
        ("pele", "Pelé"),  # from the text (or the title): accents and case come back
        ("1, 000 goals", "1,000 goals"),
        ("h. g. wells", "h. g. wells"),  # not in the passage: kept as generated
    ],
)
def test_a_copied_span_gets_the_passage_characters(generated, expected):
    assert restore_surface(generated, [PASSAGE]) == expected


def test_special_tokens_stay_and_each_stretch_is_restored_on_its_own():
    generated = "<pad><extra_id_0> 3. 2 million<extra_id_1> rear - view</s>"
    specials = ["<pad>", "</s>", "<extra_id_0>", "<extra_id_1>"]
    assert restore_surface(generated, [PASSAGE], specials) == "<pad><extra_id_0> 3.2 million<extra_id_1> rear-view</s>"
    assert restore_surface(generated, None, specials) == generated  # closed book: nothing to restore from


def test_fold_and_find_map_back_to_original_offsets():
    assert fold("Rear - View É") == "rear-viewe"
    assert find_surface("ROUGH", ["no match", "A  rough\tsea"]) == "rough"
    assert find_surface("a rough sea", ["A  rough\tsea"]) == "A  rough\tsea"  # the passage's own whitespace
    assert find_surface("", ["anything"]) is None


def test_the_wordpiece_reader_tokenizer_loses_the_surface_and_decode_answers_restores_it():
    tokenizer = build_reader_tokenizer(None)
    answers = ["3.2 million", "rear-view mirror", "Pelé"]
    generated = tokenizer(answers, padding=True, return_tensors="pt")["input_ids"]
    plain = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert [exact_match(p, a) for p, a in zip(plain, answers)] == [
        False,
        False,
        False,
    ]  # "3. 2 million", "rear - view mirror", "pele"
    restored = decode_answers(tokenizer, generated, [[PASSAGE]] * 3)
    assert restored == answers
    assert decode_answers(tokenizer, generated, None) == plain


def _small_t5_tokenizer(folder):
    """A T5 SentencePiece-layout tokenizer (Unigram; sentinels last), as transformers 5 saves one."""
    from transformers import T5Tokenizer

    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.'-")
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -5.0), ("▁tal", -2.0), ("▁crown", -2.0)]
    vocab += [("▁" + c, -6.0) for c in chars] + [(c, -8.0) for c in chars] + [("at", -3.0), ("hi", -3.0)]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(9, -1, -1)]
    T5Tokenizer(vocab=vocab, extra_ids=10).save_pretrained(str(folder))
    return build_reader_tokenizer(folder)


def test_a_sentencepiece_reader_is_decoded_as_its_tokenizer_decodes_not_restored(tmp_path):
    """The symptom of an imported reference reader: generated "talat crown" (▁tal at ▁crown) was returned as
    "tal at crown", the passage's spelling, because restoring the surface form ignores whitespace. A lossless
    tokenizer's answers are decoded as they are, as the reference decoded them; only a lossy one's restored."""
    from reader.surface import decoding_is_lossless

    t5 = _small_t5_tokenizer(tmp_path / "t5")
    assert decoding_is_lossless(t5) and not decoding_is_lossless(build_reader_tokenizer(None))
    pieces = [["<extra_id_0>", "▁tal", "at", "▁crown", "</s>"], ["<extra_id_0>", "▁s", "t", "hi", "</s>"]]
    generated = [[t5.convert_tokens_to_ids(p) for p in row] for row in pieces]
    passages = [[{"title": "", "text": "the tal at crown"}], [{"title": "", "text": "an s t hi"}]]
    as_reference = [t5.decode(row, skip_special_tokens=True) for row in generated]
    assert as_reference == ["talat crown", "sthi"]
    assert decode_answers(t5, generated, None, skip_special_tokens=True) == as_reference  # what `read` decodes
    # what restoring would have made of them: the passage's spacing, not the reader's answer
    assert decode_answers(t5, generated, passages, skip_special_tokens=True) == ["tal at crown", "s t hi"]
