"""MMLU: the real CSV folders, broken rows, permutations, de-biasing, categories, settings."""

from __future__ import annotations

import itertools
import math

import pytest

from common.io import InputError
from tasks import get_task
from tasks.base import Example
from tasks.mmlu import build_train_sets
from tasks.mmlu_subjects import SUBCATEGORIES, subject_category
from tasks.multiple_choice import aggregate, orderings, parse_letter, permute, predict_letter


@pytest.mark.parametrize(("split", "count"), [("dev", 285), ("val", 1531), ("test", 14042)])
def test_real_folders(shared_data, split, count):
    examples = get_task("mmlu").load(shared_data / "mmlu" / split)
    assert len(examples) == count
    subjects = {e.metadata["subject"] for e in examples}
    assert subjects == set(SUBCATEGORIES)  # all 57 subjects, every one with a category
    assert all(e.metadata["category"] is not None for e in examples)
    if split == "dev":
        first = examples[0]
        assert first.id == "abstract_algebra_dev:1"
        assert first.query == (
            "question: Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field. "
            "answers: (A) 0 (B) 1 (C) 2 (D) 3 Answer: <extra_id_0>"
        )
        assert first.target == "<extra_id_0> B" and first.answers == ["B"]


def test_data_root_with_split_option(shared_data):
    assert len(get_task("mmlu", split="dev").load(shared_data / "mmlu")) == 285


def test_categories():
    assert subject_category("college_physics") == "STEM"
    assert subject_category("jurisprudence") == "humanities"
    assert subject_category("sociology") == "social sciences"
    assert subject_category("virology") == "other"
    assert subject_category("arc_easy") is None
    assert len(SUBCATEGORIES) == 57


def test_csv_line_numbers_and_broken_rows(tmp_path):
    folder = tmp_path / "test"
    folder.mkdir()
    path = folder / "anatomy_test.csv"
    path.write_text('"two\nlines",a,b,c,d,A\nq2,a,b,c,d,B\nq3,a,b,c,D\nq4,a,b,c,d,E\n', encoding="utf-8")
    task = get_task("mmlu")
    with pytest.raises(InputError, match=r"anatomy_test\.csv:4: field 'row': expected 6 columns .* got 5"):
        task.load(folder)
    examples = task.load(folder, skip_invalid=True)
    assert [e.id for e in examples] == [
        "anatomy_test:1",
        "anatomy_test:3",
    ]  # row 2 starts on line 3
    assert examples[0].metadata["question"] == "two\nlines"
    path.write_text("q,a,b,c,d,E\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"anatomy_test\.csv:1: field 'answer': 'E' is not a letter"):
        task.load(path)


def test_jsonl_form(tmp_path, write_jsonl):
    path = write_jsonl(
        tmp_path / "mc.jsonl",
        [
            {
                "question": "2+2?",
                "options": {"A": "3", "B": "4", "C": "5", "D": "6"},
                "answer": "B",
                "subject": "elementary_mathematics",
            },
            {"question": "x", "options": {"A": "1", "B": "2"}, "answer": "A"},
        ],
    )
    with pytest.raises(InputError, match=r"mc\.jsonl:2: field 'options': expected an object with keys A, B, C, D"):
        get_task("mmlu").load(path)
    (example,) = get_task("mmlu").load(path, skip_invalid=True)
    assert example.id == "mc:1" and example.metadata["category"] == "STEM"


def _example(answer: str = "B") -> Example:
    task = get_task("mmlu")
    record = {
        "question": "Capital of France?",
        "options": {"A": "Rome", "B": "Paris", "C": "Oslo", "D": "Bern"},
        "answer": answer,
        "subject": "geography",
        "id": "q",
    }
    return task.parse_record(record, "f", 1, 0)


@pytest.mark.parametrize(("mode", "count"), [("single", 1), ("cyclic", 4), ("all", 24)])
def test_permutations_keep_option_text_and_gold(mode, count):
    example = _example("B")
    permuted = permute(example, mode)
    assert len(permuted) == count
    assert permuted[0].options == example.options  # identity first
    seen_orders = set()
    for p in permuted:
        letter_map = p.metadata["letter_map"]
        for shown, original in letter_map.items():
            assert p.options[shown] == example.options[original]
        assert p.options[p.answers[0]] == "Paris"
        assert p.target == f"<extra_id_0> {p.answers[0]}"
        assert f"({p.answers[0]}) Paris" in p.query
        seen_orders.add(tuple(p.options.values()))
    assert len(seen_orders) == count
    if mode == "cyclic":  # each option is shown once under each letter
        for letter in "ABCD":
            assert {p.options[letter] for p in permuted} == set(example.options.values())
    with pytest.raises(ValueError, match="unknown permutation mode 'some'; valid: single, cyclic, all"):
        orderings(4, "some")


def _always_a(permuted):
    return [{"A": 1.0, "B": 0.0, "C": 0.0, "D": 0.0} for _ in permuted]


@pytest.mark.parametrize("mode", ["cyclic", "all"])
def test_a_reader_that_always_answers_a_is_at_chance_when_de_biased(mode):
    task = get_task("mmlu")
    examples = [_example(answer) for answer in "ABCD" * 3]  # balanced gold letters
    for n, e in enumerate(examples):
        e.id = f"q{n}"
    probs = [aggregate(permute(e, mode), _always_a(permute(e, mode))) for e in examples]
    # every original option was shown as "A" equally often: a uniform de-biased distribution
    assert all(p == {"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25} for p in probs)
    scores = task.evaluate(examples, ["A"] * len(examples), letter_probs=probs)
    assert scores["accuracy"] == 25.0
    assert scores["debiased_accuracy"] == 25.0
    assert next(iter(scores)) == "debiased_accuracy"


def test_de_biasing_recovers_a_weak_signal_under_a_letter_bias():
    """A reader putting 0.6 on "A" whatever it shows and 0.4 on the right option."""
    task = get_task("mmlu")
    examples = [_example(answer) for answer in "ABCD"]
    probs = []
    for e in examples:
        permuted = permute(e, "cyclic")
        letter_probs = []
        for p in permuted:
            gold = p.answers[0]
            letter_probs.append({x: 0.6 * (x == "A") + 0.4 * (x == gold) for x in "ABCD"})
        probs.append(aggregate(permuted, letter_probs))
    # original gold option: 0.4 every time + 0.6 once in 4 → 0.55; the others 0.15
    for e, p in zip(examples, probs):
        assert p[e.answers[0]] == pytest.approx(0.55, abs=1e-15)
        assert math.fsum(p.values()) == pytest.approx(1.0, abs=1e-15)
    scores = task.evaluate(examples, ["A"] * 4, letter_probs=probs)
    assert scores["accuracy"] == 25.0 and scores["debiased_accuracy"] == 100.0


def test_per_category_and_subject_metrics():
    task = get_task("mmlu")
    rows = [
        ("college_physics", "A", "A"),
        ("college_physics", "B", "C"),
        ("sociology", "C", "C"),
        ("jurisprudence", "D", "(D) Bern"),
    ]
    examples = []
    for n, (subject, gold, _) in enumerate(rows):
        record = {
            "question": "q",
            "options": dict(zip("ABCD", "wxyz")),
            "answer": gold,
            "subject": subject,
            "id": str(n),
        }
        examples.append(task.parse_record(record, "f", n + 1, n))
    scores = task.evaluate(examples, [r[2] for r in rows])
    assert scores["accuracy"] == 75.0  # percent
    assert scores["accuracy/STEM"] == 50.0
    assert scores["accuracy/social sciences"] == 100.0
    assert scores["accuracy/humanities"] == 100.0
    assert "accuracy/other" not in scores
    assert scores["accuracy/subject/college_physics"] == 50.0


def test_letter_parsing_and_ties():
    letters = list("ABCD")
    assert parse_letter("<extra_id_0> B", letters) == "B"
    assert parse_letter("(C) Oslo", letters) == "C"
    assert parse_letter("D.", letters) == "D"
    assert parse_letter("Paris", letters) is None
    assert parse_letter("E", letters) is None
    assert predict_letter({"A": 0.3, "B": 0.3, "C": 0.2, "D": 0.2}) == "A"
    assert predict_letter({"D": 0.5, "C": 0.5}) == "C"


def test_aggregate_checks_its_inputs():
    example = _example()
    permuted = permute(example, "cyclic")
    with pytest.raises(ValueError, match="3 probability dicts for 4 permuted examples"):
        aggregate(permuted, _always_a(permuted)[:3])
    with pytest.raises(ValueError, match="expected letters"):
        aggregate(permuted[:1], [{"A": 1.0}])
    assert len(list(itertools.permutations(range(4)))) == len(orderings(4, "all"))


def test_settings(shared_data, tmp_path):
    root = shared_data / "mmlu"
    assert build_train_sets("zero-shot", root) == {"all": []}
    per_subject = build_train_sets("5-shot", root)
    assert len(per_subject) == 57 and all(len(v) == 5 for v in per_subject.values())
    assert len(build_train_sets("5-shot-multitask", root)["all"]) == 285
    with pytest.raises(InputError, match="auxiliary_train"):
        build_train_sets("full", root)
    with pytest.raises(ValueError, match="unknown MMLU setting 'few'; valid: zero-shot, 5-shot"):
        build_train_sets("few", root)


def test_task_permutation_options():
    task = get_task("mmlu", train_permutations="cyclic", eval_permutations="single")
    examples = [_example("A"), _example("C")]
    examples[1].id = "q2"
    assert len(task.training_examples(examples)) == 8
    assert [p.id for p in task.eval_presentations(examples[0])] == ["q#p0"]
    with pytest.raises(ValueError, match="unknown train_permutations 'every'; valid: single, cyclic"):
        get_task("mmlu", train_permutations="every")


def test_full_setting_reads_auxiliary_train(tmp_path):
    for folder, name in (("auxiliary_train", "arc_easy.csv"), ("dev", "anatomy_dev.csv")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text("q,a,b,c,d,A\nr,a,b,c,d,B\n", encoding="utf-8")
    (train,) = build_train_sets("full", tmp_path).values()
    assert [e.id for e in train] == ["arc_easy:1", "arc_easy:2", "anatomy_dev:1", "anatomy_dev:2"]
    assert train[0].metadata["category"] is None and train[2].metadata["category"] == "other"
