"""QA adapter: real NQ-open / TriviaQA files, broken records, targets, EM/F1, the registry."""

from __future__ import annotations

import random

import pytest

from common.io import InputError
from tasks import TASKS, get_task


def test_registry_lists_valid_names_and_options():
    assert {"qa", "kilt", "mmlu", "fever", "mlm", "lm", "section"} <= set(TASKS)
    with pytest.raises(ValueError, match=r"unknown task 'nq'; valid: fever, kilt, lm, mlm, mmlu, qa"):
        get_task("nq")
    with pytest.raises(ValueError, match=r"unknown option\(s\) prompt for task 'qa'; valid: query_template"):
        get_task("qa", prompt="x")
    with pytest.raises(ValueError, match="bad query_template"):
        get_task("qa", query_template="{query}")


def test_nq_open_dev(shared_data):
    examples = get_task("qa").load(shared_data / "nq-open" / "NQ-open.dev.jsonl")
    assert len(examples) == 3610
    first = examples[0]
    assert first.id == "0"
    assert first.query == "question: when was the last time anyone was on the moon answer: <extra_id_0>"
    assert first.answers == ["14 December 1972 UTC", "December 1972"]
    assert first.target == "<extra_id_0> 14 December 1972 UTC"
    assert len({e.id for e in examples}) == 3610


def test_triviaqa_context_form(shared_data):
    examples = get_task("qa").load(shared_data / "triviaqa" / "triviaqa_sm_sub.jsonl")
    assert len(examples) == 3000
    first = examples[0]
    assert first.metadata["question"] == ("Brunswick, Lancastrian and Pearl Pickler are types of which vegetable?")
    assert first.answers[0] == "Onion" and "Allium cepa" in first.answers
    assert len(first.answers) == len(set(first.answers))  # "Onion" is also an alias: kept once


def test_answers_form_custom_templates_and_random_targets(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"id": "q1", "question": "Who?", "answers": ["A", "B", "C"]}])
    task = get_task("qa", query_template="Q: {question}", target_template="{answer}")
    (example,) = task.load(path)
    assert example.id == "q1" and example.query == "Q: Who?" and example.target == "A"
    rng = random.Random(0)
    drawn = {task.train_target(example, rng) for _ in range(60)}
    assert drawn == {"A", "B", "C"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"answers": ["x"]}', r"bad\.jsonl:2: field 'question': missing required field"),
        ('{"question": "q", "answers": "x"}', None),  # a single string is accepted
        ('{"question": "q", "answers": [1]}', r"bad\.jsonl:2: field 'answers': expected a string"),
        (
            '{"question": "q", "answers": []}',
            r"bad\.jsonl:2: field 'answers': the list of answers is empty",
        ),
        (
            '{"question": "", "answers": ["x"]}',
            r"bad\.jsonl:2: field 'question': the question is empty",
        ),
        (
            '{"question": 5, "answers": ["x"]}',
            r"bad\.jsonl:2: field 'question': expected a string, got int",
        ),
        (
            '{"context": "What?", "answer": "x"}',
            r"bad\.jsonl:2: field 'context': expected the form",
        ),
        ('{"question": "q", "answers": ["x"]', r"bad\.jsonl:2: invalid JSON"),
        (
            '{"id": "a", "question": "q", "answers": ["x"]}',
            r"bad\.jsonl:2: field 'id': duplicate id 'a'",
        ),
    ],
)
def test_broken_records_name_file_line_field(tmp_path, write_jsonl, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"id": "a", "question": "ok", "answers": ["y"]}', line])
    task = get_task("qa")
    if message is None:
        assert len(task.load(path)) == 2
        return
    with pytest.raises(InputError, match=message):
        task.load(path)
    assert len(task.load(path, skip_invalid=True)) == 1


def test_evaluate_em_f1():
    task = get_task("qa")
    examples = [
        task.parse_record({"question": "q", "answers": ["The Beatles", "Beatles band"]}, "f", 1, 0),
        task.parse_record({"question": "q", "answers": ["42"]}, "f", 2, 1),
        task.parse_record({"question": "q", "answers": ["New York City"]}, "f", 3, 2),
    ]
    predictions = ["<extra_id_0> beatles", "", "new york"]
    scores = task.evaluate(examples, predictions)
    assert list(scores) == ["exact_match", "f1"]
    assert scores["exact_match"] == 100 * (1 / 3)  # percent
    # f1: 1, 0, and p = 1, r = 2/3 → 0.8
    assert scores["f1"] == pytest.approx(100 * (1 + 0 + 0.8) / 3, rel=1e-15)
    with pytest.raises(ValueError, match="2 predictions for 3 examples"):
        task.evaluate(examples, predictions[:2])
