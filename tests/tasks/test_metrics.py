"""Answer metrics against hand-derived values (SQuAD EM/F1, `rouge` ROUGE-L, DPR has_answer)."""

from __future__ import annotations

import pytest

from tasks.metrics import (
    dpr_tokenize,
    exact_match,
    f1,
    has_answer,
    max_exact_match,
    max_f1,
    normalize_answer,
    rouge_l,
    wilson_interval,
)


def rouge_f(p: float, r: float) -> float:
    """The `rouge` package's F formula, with its 1e-8."""
    return 2.0 * ((p * r) / (p + r + 1e-8))


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The Cat!", "cat"),
        ("an apple, a day", "apple day"),
        ("  lots\tof \n space ", "lots of space"),
        ("theater then", "theater then"),  # articles only as whole words
        ("A.B.C.", "abc"),  # punctuation removed before articles are looked for
        ("Café Noir", "café noir"),  # non-ASCII letters are kept
        ("“quoted”", "“quoted”"),  # curly quotes are not in string.punctuation
        ("", ""),
    ],
)
def test_normalize_answer(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_and_f1_by_hand():
    assert exact_match("The  Eiffel tower.", "eiffel Tower")
    assert not exact_match("Eiffel towers", "eiffel tower")
    # pred tokens [cat, sat], gold [cat, sat, down]: p = 1, r = 2/3 → 0.8
    assert f1("the cat sat", "cat sat down") == pytest.approx(0.8, abs=0)
    # bag of tokens: x x y vs x y y share one x and one y → p = r = 2/3
    assert f1("x x y", "x y y") == pytest.approx(2 / 3, rel=1e-15)
    assert f1("", "anything") == 0.0
    assert f1("", "") == 0.0  # SQuAD v1.1: no common token → 0, even for two empty strings
    assert f1("the", "a") == 0.0  # both normalise to nothing


def test_max_over_several_golds():
    golds = ["Barack Obama", "Obama", "President Barack Hussein Obama"]
    assert max_exact_match("obama", golds) == 1.0
    # against "President Barack Hussein Obama": p = 1, r = 2/4 → 2/3; against "Barack Obama": 1
    assert max_f1("barack obama", golds) == 1.0
    assert max_f1("hussein obama", golds) == pytest.approx(max(2 * 0.5 * 1 / 1.5, 2 / 3, 2 / 3))
    with pytest.raises(ValueError, match="no gold answers"):
        max_f1("x", [])


def test_rouge_l_hand_cases():
    # LCS "the cat on the mat" → distinct LCS words {the, cat, on, mat}; 5 distinct words each
    assert rouge_l("the cat sat on the mat", "the cat is on the mat") == rouge_f(4 / 5, 4 / 5)
    # sentences split on "." and matched across: union of LCS words {a, b, c, d}
    assert rouge_l("a b. c d", "c d. a b") == rouge_f(1.0, 1.0)
    # "b a" vs "a b": one LCS word out of 2 distinct words each
    assert rouge_l("b a", "a b") == rouge_f(0.5, 0.5)
    # the back-track recovers "b" from "b a", and "a" from "a": the union covers both words
    # (recovering "a" first would give 0.5)
    assert rouge_l("b a. a", "a b") == rouge_f(1.0, 1.0)
    # case-sensitive, no normalisation; reference sentences {paris}, {is big}
    assert rouge_l("Paris is big", "paris. is big") == rouge_f(2 / 3, 2 / 3)
    assert rouge_l("Paris", "paris") == 0.0
    # a trailing ". " leaves an empty word in the hypothesis: 2 distinct words, 1 matched
    assert rouge_l("x. ", "x") == rouge_f(1 / 2, 1.0)


def test_rouge_l_empty_texts_score_zero():
    assert rouge_l("", "gold") == 0.0
    assert rouge_l("...", "gold") == 0.0  # "Hypothesis is empty." in the package → 0 in KILT
    assert rouge_l("pred", ".") == 0.0


def test_rouge_l_long_texts_do_not_recurse():
    words = [f"w{i % 97}" for i in range(1200)]  # deeper than the recursion limit
    text = " ".join(words)
    assert rouge_l(text, text) == rouge_f(1.0, 1.0)


def test_dpr_tokenize():
    assert dpr_tokenize("U.S. Army's 1st") == ["u", ".", "s", ".", "army", "'", "s", "1st"]
    assert dpr_tokenize("Café") == ["cafe\u0301"]  # NFD: the accent is a mark inside the token


def test_has_answer():
    passage = "In 2009, President Barack Obama visited the U.S. Army base."
    assert has_answer(["barack OBAMA"], passage)
    assert has_answer(["nothing here", "u.s. army"], passage)
    assert not has_answer(["Obam"], passage)  # whole tokens only
    assert not has_answer(["Obama Barack"], passage)  # token order matters
    assert has_answer(["Café"], "the cafe\u0301 opened")  # composed vs decomposed accent
    assert not has_answer(["Cafe"], "the café opened")  # the accent is part of the token
    assert not has_answer([], passage)
    assert has_answer([""], passage)  # DPR quirk: an empty answer matches any passage


def test_wilson_interval_against_hand_computed_values():
    # 17 of 25 at z = 1.96: centre (0.68 + 3.8416/50) / (1 + 3.8416/25) = 0.656023, half-width
    # 1.96 * sqrt(0.68 * 0.32 / 25 + 3.8416 / 2500) / 1.153664 = 0.171930
    assert wilson_interval(17, 25) == pytest.approx((0.4841, 0.8280), abs=1e-4)  # the hand rounding: 4 places
    assert wilson_interval(0, 10) == pytest.approx((0.0, 3.8416 / 13.8416))  # the upper end z²/(n + z²)
    assert wilson_interval(10, 10) == pytest.approx((10 / 13.8416, 1.0))
    assert wilson_interval(0, 0) == (0.0, 1.0)
