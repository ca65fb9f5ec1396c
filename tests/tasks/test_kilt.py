"""KILT adapter: the real HotpotQA file, per-dataset targets, provenance and scoring."""

from __future__ import annotations

import random

import pytest

from tasks import get_task
from tasks.io import InputError
from tasks.kilt import infer_kilt_dataset
from tasks.kilt_scoring import score_kilt


def test_hotpotqa_dev(shared_data):
    examples = get_task("kilt").load(shared_data / "kilt" / "hotpotqa-dev-kilt.jsonl")
    assert len(examples) == 5600
    first = examples[0]
    assert first.id == "5a8b57f25542995d1e6f1371"
    assert (
        first.query
        == "question: Were Scott Derrickson and Ed Wood of the same nationality? answer: <extra_id_0>"
    )
    assert first.answers == ["yes"] and first.target == "<extra_id_0> yes"
    assert first.metadata["kilt_task"] == "hotpotqa"


@pytest.mark.parametrize(
    ("name", "dataset"),
    [
        ("fever-dev-kilt.jsonl", "fever"),
        ("aidayago2-dev-kilt.jsonl", "aidayago2"),
        ("structured_zeroshot-dev-kilt.jsonl", "structured_zeroshot"),
        ("trex-dev-kilt.jsonl", "trex"),
        ("nq-dev-kilt.jsonl", "nq"),
        ("triviaqa-dev_id-kilt.jsonl", "triviaqa"),
        ("eli5-dev-kilt.jsonl", "eli5"),
        ("wow-dev-kilt.jsonl", "wow"),
        ("dev.jsonl", "generic"),
    ],
)
def test_dataset_from_file_name(name, dataset):
    assert infer_kilt_dataset(f"/data/{name}") == dataset


def test_fever_targets_and_predictions_map_to_kilt_labels(tmp_path, write_jsonl):
    path = write_jsonl(
        tmp_path / "fever-dev-kilt.jsonl",
        [
            {
                "id": "1",
                "input": "Paris is in France.",
                "output": [{"answer": "SUPPORTS", "provenance": [{"wikipedia_id": "10"}]}],
            },
            {"id": "2", "input": "Paris is in Peru.", "output": [{"answer": "REFUTES"}]},
        ],
    )
    task = get_task("kilt")
    examples = task.load(path)
    assert [e.target for e in examples] == ["<extra_id_0> true", "<extra_id_0> false"]
    assert task.train_target(examples[1], random.Random(0)) == "<extra_id_0> false"
    assert task.postprocess(examples[0], "<extra_id_0> true") == "SUPPORTS"
    scores = task.evaluate(
        examples, ["true", "true"], retrieved=[[{"wikipedia_id": "10"}], [{"id": "x"}]]
    )
    assert next(iter(scores)) == "accuracy"  # FEVER's leaderboard metric first
    assert scores["accuracy"] == 0.5 and scores["KILT-accuracy"] == 0.5 and scores["Rprec"] == 0.5

    write_jsonl(path, [{"id": "1", "input": "x", "output": [{"answer": "MAYBE"}]}])
    with pytest.raises(
        InputError,
        match=r"fever-dev-kilt\.jsonl:1: field 'output\.answer': unknown FEVER label 'MAYBE'",
    ):
        task.load(path)


def test_evaluate_equals_official_scoring_of_the_same_records(tmp_path, write_jsonl):
    records = [
        {
            "id": "a",
            "input": "q1",
            "output": [
                {"answer": "Paris"},
                {
                    "answer": "City of Paris",
                    "provenance": [{"wikipedia_id": "1"}, {"wikipedia_id": "2"}],
                },
            ],
        },
        {
            "id": "b",
            "input": "q2",
            "output": [{"answer": "Rome", "provenance": [{"wikipedia_id": "3"}]}],
        },
    ]
    task = get_task("kilt")
    examples = task.load(write_jsonl(tmp_path / "nq-dev-kilt.jsonl", records))
    assert examples[0].answers == ["Paris", "City of Paris"]  # file order, distinct
    retrieved = [
        [{"wikipedia_id": "2", "title": "P"}, {"text": "no page id"}, {"wikipedia_id": "1"}],
        [{"wikipedia_id": "4"}],
    ]
    scores = task.evaluate(examples, ["<extra_id_0> paris", "Rome"], retrieved=retrieved)
    guesses = [
        {
            "id": "a",
            "output": [
                {"answer": "paris", "provenance": [{"wikipedia_id": "2"}, {"wikipedia_id": "1"}]}
            ],
        },
        {"id": "b", "output": [{"answer": "Rome", "provenance": [{"wikipedia_id": "4"}]}]},
    ]
    official = score_kilt(records, guesses)
    assert scores == {"em": official["em"], **{k: v for k, v in official.items() if k != "em"}}
    assert scores["em"] == 1.0 and scores["accuracy"] == 0.5 and scores["KILT-em"] == 0.5
    assert list(task.evaluate(examples, ["x", "y"])) == ["em", "accuracy", "f1", "rougel"]


def test_dialogue_input_and_bad_records(tmp_path, write_jsonl):
    task = get_task("kilt", dialogue_separator=" | ")
    path = write_jsonl(
        tmp_path / "wow-dev-kilt.jsonl",
        [{"id": "w", "input": "Hi\nI like cats\n", "output": [{"answer": "Me too"}]}],
    )
    (example,) = task.load(path)
    assert example.query == "question: Hi | I like cats answer: <extra_id_0>"
    write_jsonl(path, [{"id": "w", "input": "x", "output": [{"answer": 3}]}])
    with pytest.raises(
        InputError, match=r"wow-dev-kilt\.jsonl:1: field 'output\[0\]\.answer': expected a string"
    ):
        task.load(path)
    write_jsonl(path, [{"id": "w", "output": []}])
    with pytest.raises(InputError, match=r":1: field 'input': missing required field"):
        task.load(path)
    with pytest.raises(ValueError, match="unknown kilt_task 'squad'; valid: auto, fever"):
        get_task("kilt", kilt_task="squad")
