"""`score_files`: scoring prediction files from anywhere with the tasks' metrics."""

from __future__ import annotations

import pytest

from common.io import InputError
from tasks.score import score_files


def test_qa_by_id_or_question(tmp_path, write_jsonl):
    gold = write_jsonl(
        tmp_path / "gold.jsonl",
        [
            {"question": "who?", "answer": ["Bob", "Robert"]},
            {"question": "when?", "answer": ["1999"]},
        ],
    )
    pred = write_jsonl(
        tmp_path / "pred.jsonl",
        [{"id": "1", "answer": "in 1999"}, {"question": "who?", "prediction": "robert"}],
    )
    scores = score_files("qa", gold, pred)
    assert scores == {
        "exact_match": 50.0,
        "f1": pytest.approx(100 * (1 + 2 / 3) / 2, rel=1e-15),
    }  # percent

    write_jsonl(pred, [{"id": "1", "answer": "x"}])
    with pytest.raises(ValueError, match=r"pred\.jsonl: no prediction for 1 gold example\(s\): 0"):
        score_files("qa", gold, pred)
    write_jsonl(pred, [{"id": "0", "answer": "x"}, {"question": "who?", "answer": "y"}])
    with pytest.raises(InputError, match=r"pred\.jsonl:2: field 'id': second prediction for '0'"):
        score_files("qa", gold, pred)
    write_jsonl(pred, [{"id": "9", "answer": "x"}])
    with pytest.raises(InputError, match=r"pred\.jsonl:1: field 'id': id '9' is not in the gold file"):
        score_files("qa", gold, pred)
    write_jsonl(pred, [{"id": "0", "answer": 3}, {"id": "1", "answer": "x"}])
    with pytest.raises(InputError, match=r"pred\.jsonl:1: field 'answer': expected a string"):
        score_files("qa", gold, pred)


def test_a_gold_file_without_answers_is_named_by_file_line_and_field(tmp_path, write_jsonl):
    gold = write_jsonl(tmp_path / "gold.jsonl", [{"question": "who?", "answer": ["Bob"]}, {"question": "when?"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"id": "0", "answer": "Bob"}, {"id": "1", "answer": "1999"}])
    with pytest.raises(InputError) as error:
        score_files("qa", gold, pred)
    assert str(error.value) == (
        f"{gold}:2: field 'answers': no gold answer to score against (1 of 2 examples have none); an unlabelled "
        "test set is predicted without scores by `atlas evaluate … --predict-only`"
    )


def test_kilt_files_primary_metric_first(shared_data, tmp_path, write_jsonl):
    gold = write_jsonl(
        tmp_path / "eli5-dev-kilt.jsonl",
        [
            {
                "id": "a",
                "input": "why?",
                "output": [{"answer": "because it is"}, {"provenance": [{"wikipedia_id": "5"}]}],
            }
        ],
    )
    pred = write_jsonl(
        tmp_path / "pred.jsonl",
        [{"id": "a", "output": [{"answer": "because", "provenance": [{"wikipedia_id": "5"}]}]}],
    )
    scores = score_files("kilt", gold, pred, ks=(1, 5))
    assert (
        next(iter(scores)) == "rouge_l"
        and scores["r_precision"] == 100.0
        and scores["kilt_rouge_l"] == scores["rouge_l"]
    )
    official = score_files("kilt", gold, pred, ks=(1, 5), official=True)  # KILT's own keys and [0, 1]
    assert official["downstream"]["rougel"] * 100 == scores["rouge_l"] and official["retrieval"]["Rprec"] == 1.0
    assert official["kilt"]["KILT-rougel"] == official["downstream"]["rougel"]
    with pytest.raises(ValueError, match="official scoring needs KILT files, not task 'qa'"):
        score_files("qa", gold, pred, official=True)


def test_mmlu_predictions_with_probabilities(shared_data, tmp_path, write_jsonl):
    gold = shared_data / "mmlu" / "dev" / "anatomy_dev.csv"
    answers = [line.rstrip("\n").rsplit(",", 1)[1] for line in gold.open()]
    records = [
        {
            "id": f"anatomy_dev:{n + 1}",
            "prediction": "A",
            "probs": {a: float(a == answers[n]) for a in "ABCD"},
        }
        for n in range(5)
    ]
    pred = write_jsonl(tmp_path / "pred.jsonl", records)
    scores = score_files("mmlu", gold, pred)
    assert scores["debiased_accuracy"] == 100.0 and scores["accuracy"] == 100 * (answers.count("A") / 5)
    assert scores["debiased_accuracy/other"] == 100.0  # anatomy → health → other
    records[0].pop("probs")
    write_jsonl(pred, records)
    with pytest.raises(
        ValueError,
        match=r"probabilities \('probabilities' or 'probs'\) given for 4 of 5 predictions",
    ):
        score_files("mmlu", gold, pred)


def test_mmlu_scores_evaluate_output_with_probabilities(shared_data, tmp_path, write_jsonl):
    """`atlas evaluate` writes `probabilities` (not `probs`) beside each prediction, with its query,
    gold answers and passages: `atlas score` reads that file and adds the de-biased accuracy."""
    gold = shared_data / "mmlu" / "dev" / "anatomy_dev.csv"
    answers = [line.rstrip("\n").rsplit(",", 1)[1] for line in gold.open()]
    records = [
        {
            "id": f"anatomy_dev:{n + 1}",
            "query": "question: … answers: (A) … Answer: <extra_id_0>",
            "prediction": "A",
            "answers": [answers[n]],
            # de-biased: right on the first 3 questions, "D" (wrong unless the answer is D) after
            "probabilities": {a: (0.7 if a == (answers[n] if n < 3 else "D") else 0.1) for a in "ABCD"},
            "passages": [{"id": "p1", "score": 1.5, "title": "Anatomy"}],
        }
        for n in range(5)
    ]
    pred = write_jsonl(tmp_path / "predictions.jsonl", records)
    scores = score_files("mmlu", gold, pred)
    debiased = 100 * ((3 + sum(answers[n] == "D" for n in (3, 4))) / 5)  # percent
    assert scores["debiased_accuracy"] == debiased and scores["accuracy"] == 100 * (answers.count("A") / 5)
    assert scores["debiased_accuracy/subject/anatomy"] == debiased
    records[2]["probs"] = records[2]["probabilities"]
    write_jsonl(pred, records)
    with pytest.raises(
        InputError,
        match=r"predictions\.jsonl:3: field 'probs': give either 'probabilities' or 'probs', not both",
    ):
        score_files("mmlu", gold, pred)
    records[2].pop("probs")
    records[2]["probabilities"] = {"A": "high"}
    write_jsonl(pred, records)
    with pytest.raises(InputError, match=r":3: field 'probabilities': expected an object letter → probability"):
        score_files("mmlu", gold, pred)
