"""KILT scoring against hand-computed values of the official definitions, and file handling."""

from __future__ import annotations

import json

import pytest

from common.io import InputError
from tasks.kilt_scoring import (
    align_predictions,
    downstream_metrics,
    r_precision,
    retrieval_metrics,
    score_kilt_files,
    write_kilt_predictions,
)
from tasks.metrics import rouge_l


def gold(gid, answers, provenance_sets):
    outputs = [{"answer": a} for a in answers]
    outputs += [{"provenance": [{"wikipedia_id": p, "title": f"T{p}"} for p in s]} for s in provenance_sets]
    return {"id": gid, "input": "q", "output": outputs}


def guess(gid, answer, pages):
    return {
        "id": gid,
        "output": [{"answer": answer, "provenance": [{"wikipedia_id": p} for p in pages]}],
    }


TWO_SETS = gold("1", ["Paris"], [["1", "2"], ["3"]])


def test_r_precision_max_over_sets_and_repeated_pages():
    assert r_precision(guess("1", "", ["1", "2"]), TWO_SETS) == 1.0
    assert r_precision(guess("1", "", ["3", "1"]), TWO_SETS) == 1.0  # set {3}: R = 1
    # a repeated page counts once: distinct ranking [1, 5] → set {1,2}: 1/2, set {3}: 0
    assert r_precision(guess("1", "", ["1", "1", "5"]), TWO_SETS) == 0.5
    assert r_precision(guess("1", "", []), TWO_SETS) == 0.0
    assert r_precision({"id": "1", "output": [{"answer": "x"}]}, TWO_SETS) == 0.0  # no provenance
    # ids are compared as stripped strings
    assert r_precision(guess("1", "", [3]), TWO_SETS) == 1.0


def test_ranking_metrics_by_hand():
    # ranking 3, 1, 9, 2: set {3} complete at 1; set {1,2} completes at page 2 and its point
    # moves there; so the ranking of points is [True, False, True]
    scores = retrieval_metrics([TWO_SETS], [guess("1", "", ["3", "1", "9", "2"])], ks=[1, 2, 5])
    assert scores == {
        "Rprec": 1.0,  # set {3}: first page is 3
        "precision@1": 1.0,
        "precision@2": 0.5,
        "precision@5": 2 / 5,
        "recall@2": 1 / 2,
        "success_rate@2": 1.0,
        "recall@5": 2 / 2,
        "success_rate@5": 1.0,
    }
    # a gold set counts only once all of its pages are retrieved
    partial = retrieval_metrics([TWO_SETS], [guess("1", "", ["1", "9"])], ks=[2])
    assert partial["recall@2"] == 0.0 and partial["success_rate@2"] == 0.0
    # duplicate gold sets are one set; a repeated predicted page is one point
    dup = gold("2", ["x"], [["7"], ["7"]])
    repeated = retrieval_metrics([dup], [guess("2", "", ["8", "7", "7"])], ks=[2])
    assert repeated["recall@2"] == 1.0 and repeated["precision@2"] == 0.5


def test_downstream_and_kilt_variants_by_hand():
    golds = [
        gold("a", ["Paris", "paris city"], [["1"]]),
        gold("b", ["The Beatles"], [["2"]]),
        gold("c", ["42"], [["3"]]),
        gold("d", ["yes"], [["4"]]),
    ]
    guesses = [
        guess("a", " Paris ", ["1"]),  # strict match after stripping; Rprec 1
        guess("b", "beatles", ["9"]),  # EM after normalisation only; Rprec 0
        guess("c", "", ["3"]),  # empty answer: 0 everywhere, still counted
        guess("d", "no yes", ["4"]),  # F1 = 2/3 (p = 1/2, r = 1); Rprec 1
    ]
    scores = downstream_metrics(golds, guesses)
    rl_d = rouge_l("no yes", "yes")
    assert scores["accuracy"] == 1 / 4
    assert scores["em"] == 2 / 4
    assert scores["f1"] == pytest.approx((1 + 1 + 0 + 2 / 3) / 4, rel=1e-15)
    assert scores["rougel"] == (rouge_l("Paris", "Paris") + rouge_l("beatles", "The Beatles") + rl_d) / 4
    assert scores["KILT-accuracy"] == 1 / 4
    assert scores["KILT-em"] == 1 / 4  # "b" is right but its page is wrong
    assert scores["KILT-f1"] == pytest.approx((1 + 2 / 3) / 4, rel=1e-15)
    with pytest.raises(ValueError, match="has no answer"):
        downstream_metrics([gold("z", [], [["1"]])], [guess("z", "x", [])])


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_files_round_trip_and_id_errors(tmp_path):
    gold_path = write(tmp_path / "g.jsonl", [gold("a", ["Paris"], [["1"]]), gold("b", ["Rome"], [["2"]])])
    pred_path = tmp_path / "p.jsonl"
    assert write_kilt_predictions(pred_path, ["b", "a"], ["Rome", "Lyon"], [[{"wikipedia_id": "2"}], []]) == 2
    scores = score_kilt_files(gold_path, pred_path, ks=[1, 5])
    assert scores["accuracy"] == 0.5 and scores["KILT-accuracy"] == 0.5 and scores["Rprec"] == 0.5

    write(pred_path, [guess("a", "x", []), guess("a", "y", [])])
    with pytest.raises(InputError, match=r"p\.jsonl:2: field 'id': duplicate prediction id 'a'"):
        score_kilt_files(gold_path, pred_path)
    write(pred_path, [guess("a", "x", [])])
    with pytest.raises(ValueError, match="no prediction for 1 gold id"):
        score_kilt_files(gold_path, pred_path)
    write(pred_path, [guess("a", "x", []), guess("b", "x", []), guess("c", "x", [])])
    with pytest.raises(InputError, match=r"p\.jsonl:3: field 'id': prediction id 'c' is not in the gold"):
        score_kilt_files(gold_path, pred_path)
    write(pred_path, [guess("a", "x", []), {"id": "b", "output": [{"answer": "x"}, {"answer": "y"}]}])
    with pytest.raises(InputError, match=r"p\.jsonl:2: field 'output'"):
        score_kilt_files(gold_path, pred_path)
    with pytest.raises(InputError, match="duplicate gold id"):
        align_predictions([(1, {"id": "a"}), (2, {"id": "a"})], [], "g", "p")
    with pytest.raises(ValueError, match="differ in length"):
        write_kilt_predictions(pred_path, ["a"], [], [[]])


def test_retrieval_only_scoring(tmp_path):
    gold_path = write(tmp_path / "g.jsonl", [gold("a", ["Paris"], [["1"]])])
    pred_path = write(tmp_path / "p.jsonl", [{"id": "a", "output": [{"provenance": [{"wikipedia_id": "1"}]}]}])
    scores = score_kilt_files(gold_path, pred_path, ks=[1], downstream=False)
    assert scores == {"Rprec": 1.0, "precision@1": 1.0}


def test_gold_hotpotqa_scores_perfectly_against_itself(shared_data, tmp_path):
    gold_path = shared_data / "kilt" / "hotpotqa-dev-kilt.jsonl"
    records = [json.loads(line) for line in gold_path.open()]
    assert len(records) == 5600
    ids, answers, provenance = [], [], []
    for record in records:
        ids.append(record["id"])
        answers.append(next(o["answer"] for o in record["output"] if o.get("answer")))
        provenance.append(next(o["provenance"] for o in record["output"] if o.get("provenance")))
    pred_path = tmp_path / "pred.jsonl"
    write_kilt_predictions(pred_path, ids, answers, provenance)
    scores = score_kilt_files(gold_path, pred_path, ks=[1, 5])
    for name in ("accuracy", "em", "KILT-accuracy", "KILT-em", "Rprec", "recall@5"):
        assert scores[name] == 1.0, name
    # one gold answer is "!!!": it normalises to no token, so EM is 1 but SQuAD F1 is 0
    assert scores["f1"] == scores["KILT-f1"] == 5599 / 5600
    assert scores["rougel"] == pytest.approx(1.0, abs=1e-7)  # the package's 1e-8 in F
