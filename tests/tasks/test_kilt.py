"""KILT adapter: the real HotpotQA file, per-dataset targets, provenance and scoring."""

from __future__ import annotations

import random

import pytest

from common.io import InputError
from tasks import get_task
from tasks.kilt import infer_kilt_dataset
from tasks.kilt_scoring import score_kilt
from tasks.passage import Passage


def test_hotpotqa_dev(shared_data):
    examples = get_task("kilt").load(shared_data / "kilt" / "hotpotqa-dev-kilt.jsonl")
    assert len(examples) == 5600
    first = examples[0]
    assert first.id == "5a8b57f25542995d1e6f1371"
    assert first.query == "question: Were Scott Derrickson and Ed Wood of the same nationality? answer: <extra_id_0>"
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
    scores = task.evaluate(examples, ["true", "true"], retrieved=[[Passage("p10", wikipedia_id="10")], [Passage("x")]])
    assert next(iter(scores)) == "accuracy"  # FEVER's leaderboard metric first
    assert scores["accuracy"] == 50.0 and scores["kilt_accuracy"] == 50.0 and scores["r_precision"] == 50.0

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
        [Passage("p2", wikipedia_id="2", title="P"), Passage("p0", text="no page id"), Passage("p1", wikipedia_id="1")],
        [Passage("p4", wikipedia_id="4")],
    ]
    scores = task.evaluate(examples, ["<extra_id_0> paris", "Rome"], retrieved=retrieved)
    guesses = [
        {
            "id": "a",
            "output": [{"answer": "paris", "provenance": [{"wikipedia_id": "2"}, {"wikipedia_id": "1"}]}],
        },
        {"id": "b", "output": [{"answer": "Rome", "provenance": [{"wikipedia_id": "4"}]}]},
    ]
    official = score_kilt(records, guesses)
    # the project's names, each exactly 100 × the official value; the primary metric first
    renamed = {
        "em": "exact_match",
        "rougel": "rouge_l",
        "KILT-accuracy": "kilt_accuracy",
        "KILT-em": "kilt_exact_match",
        "KILT-f1": "kilt_f1",
        "KILT-rougel": "kilt_rouge_l",
        "Rprec": "r_precision",
        "precision": "provenance_precision",
        "recall": "provenance_recall",
        "success_rate": "provenance_success",
    }

    def name(key):
        base, at, k = key.partition("@")
        return renamed.get(base, base) + at + k

    expected = {name(k): 100 * v for k, v in official.items()}
    assert scores == {"exact_match": expected["exact_match"], **expected} and next(iter(scores)) == "exact_match"
    assert scores["exact_match"] == 100.0 and scores["accuracy"] == 50.0 and scores["kilt_exact_match"] == 50.0
    assert {"provenance_precision@1", "provenance_recall@5", "provenance_success@20"} <= set(scores)
    assert list(task.evaluate(examples, ["x", "y"])) == ["exact_match", "accuracy", "f1", "rouge_l"]
    # the official report: KILT's own keys and scale, grouped as its scorers print them
    report = task.official_report(examples, ["<extra_id_0> paris", "Rome"], retrieved=retrieved)
    assert report == {
        "downstream": {k: official[k] for k in ("accuracy", "em", "f1", "rougel")},
        "kilt": {k: official[k] for k in ("KILT-accuracy", "KILT-em", "KILT-f1", "KILT-rougel")},
        "retrieval": {k: v for k, v in official.items() if k == "Rprec" or "@" in k},
    }


def test_dialogue_input_and_bad_records(tmp_path, write_jsonl):
    task = get_task("kilt", dialogue_separator=" | ")
    path = write_jsonl(
        tmp_path / "wow-dev-kilt.jsonl",
        [{"id": "w", "input": "Hi\nI like cats\n", "output": [{"answer": "Me too"}]}],
    )
    (example,) = task.load(path)
    assert example.query == "question: Hi | I like cats answer: <extra_id_0>"
    write_jsonl(path, [{"id": "w", "input": "x", "output": [{"answer": 3}]}])
    with pytest.raises(InputError, match=r"wow-dev-kilt\.jsonl:1: field 'output\[0\]\.answer': expected a string"):
        task.load(path)
    write_jsonl(path, [{"id": "w", "output": []}])
    with pytest.raises(InputError, match=r":1: field 'input': missing required field"):
        task.load(path)
    with pytest.raises(ValueError, match="unknown kilt_task 'squad'; valid: auto, fever"):
        get_task("kilt", kilt_task="squad")
