"""Our ROUGE-L against the real `rouge` package (1.0.1) that KILT's official scorer calls.

KILT's `eval_downstream.py` scores ROUGE-L as `Rouge().get_scores(guess, gold, avg=True)
["rouge-l"]["f"]` (0.0 where the package raises on an empty text), maximised over the gold answers.
These tests run the package itself on varied strings and on KILT records and demand equal floats
(==, not approx). They are skipped where the package is not installed (it is a test extra).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tasks.kilt_scoring import score_kilt
from tasks.metrics import rouge_l

rouge = pytest.importorskip("rouge")

ELI5 = Path(__file__).resolve().parents[1] / "fixtures" / "kilt" / "eli5-dev-kilt.jsonl"

PAIRS = [
    ("the cat sat on the mat", "the cat is on the mat"),
    ("Paris", "Paris"),
    ("Paris", "paris"),  # no normalisation: case matters
    ("The Beatles", "beatles"),
    ("b a", "a b"),
    ("a b. c d", "c d. a b"),  # sentence order: summary-level LCS
    ("b a. a", "a b"),
    ("the the the cat", "the cat the cat"),  # repeated words count once (sets)
    ("Paris is big", "paris. is big"),
    ("...", "Paris"),  # no sentence left: the package raises, KILT scores 0
    ("Paris", "..."),
    ("", "Paris"),
    ("   ", "Paris"),
    (" . ", "a . b"),  # sentences that are only white space
    ("Paris,France", "Paris, France"),
    ("U.S. president", "president of the U.S."),
    ("3.14 is pi", "pi is 3.14"),
    ("Beyoncé and Bruno Mars", "Coldplay with special guest performers Beyoncé and Bruno Mars"),
    ("北京 是 首都", "首都 是 北京"),
    ("naïve café", "naive cafe"),
    ("yes", "no"),
    ("a  b\tc\nd", "a b c d"),  # the package splits words on single spaces after re-joining
    ("It's 5 o'clock", "it's five o'clock"),
    ("SUPPORTS", "SUPPORTS"),
    ("one two three four five six seven eight", "eight seven six five four three two one"),
    ("x y z x y z x y z", "z y x"),
]


def official(prediction: str, gold: str) -> float:
    """KILT's `_rougel_score`, verbatim in behaviour."""
    try:
        scores = rouge.Rouge().get_scores(prediction, gold, avg=True)
    except ValueError:  # "Hypothesis is empty." / "Reference is empty."
        return 0.0
    return scores["rouge-l"]["f"]


def long_texts() -> list[str]:
    texts = [
        o["answer"]
        for line in ELI5.read_text(encoding="utf-8").splitlines()
        for o in json.loads(line)["output"]
        if o.get("answer")
    ]
    assert len(texts) >= 4
    return texts


@pytest.mark.parametrize(("prediction", "gold"), PAIRS)
def test_hand_picked_pairs_equal_the_package(prediction, gold):
    assert rouge_l(prediction, gold) == official(prediction, gold)


def test_long_answers_equal_the_package():
    texts = long_texts()
    for a in texts:
        for b in texts:
            assert rouge_l(a, b) == official(a, b)
            assert rouge_l(a[: len(a) // 3], b) == official(a[: len(a) // 3], b)


def test_random_strings_equal_the_package():
    rng = random.Random(20240601)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "mat",
        "a",
        "Paris",
        "paris",
        "é",
        "北京",
        "x",
        ",",
        "!",
        "it's",
        "3.5",
    ]
    joiners = [" ", "", ".", "  ", "\n", ". ", " . "]
    checked = 0
    for _ in range(400):
        texts = ["".join(rng.choice(words) + rng.choice(joiners) for _ in range(rng.randint(0, 14))) for _ in range(2)]
        assert rouge_l(*texts) == official(*texts), texts
        checked += 1
    assert checked == 400


def test_kilt_max_over_gold_answers_equals_the_official_wrapper():
    """`score_kilt`'s rougel = mean over records of max over gold answers of the package's F;
    an empty predicted answer scores 0 but counts, as in `eval_downstream.py`."""
    texts = long_texts()
    gold = [
        {
            "id": "1",
            "output": [
                {"answer": texts[0]},
                {"answer": texts[1]},
                {"provenance": [{"wikipedia_id": "9"}]},
            ],
        },
        {
            "id": "2",
            "output": [
                {"answer": "Sunlight is scattered."},
                {"answer": "Blue light scatters more."},
            ],
        },
        {"id": "3", "output": [{"answer": "Paris"}, {"answer": "City of Paris"}]},
        {"id": "4", "output": [{"answer": "anything"}]},
    ]
    guesses = [
        "blue light is scattered by the air more than red light.",
        "Blue light scatters more. Sunlight",
        "the city of Paris",
        "   ",
    ]
    records = [{"id": g["id"], "output": [{"answer": a}]} for g, a in zip(gold, guesses)]
    expected = []
    for record, guess in zip(gold, guesses):
        answers = {o["answer"].strip() for o in record["output"] if o.get("answer", "").strip()}
        guess = guess.strip()
        expected.append(0 if not guess else max(official(guess, answer) for answer in answers))
        if guess:
            assert max(rouge_l(guess, answer) for answer in answers) == expected[-1]
    total = 0
    for value in expected:
        total += value
    assert score_kilt(gold, records)["rougel"] == total / len(gold)
    assert 0 < total / len(gold) < 1
