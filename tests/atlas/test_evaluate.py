"""Evaluation's retrieval metrics on hand-made rankings."""

from __future__ import annotations

import pytest

from atlas.evaluate import retrieval_metrics
from tasks.base import Example


def test_answer_and_gold_recall_by_hand():
    examples = [
        Example(id="a", query="q1", target=None, answers=["Paris"], metadata={"gold_ids": ["d2"]}),
        Example(id="b", query="q2", target=None, answers=["Rome"]),
        Example(id="c", query="q3", target=None, answers=[]),  # no answers: left out
    ]
    passages = [
        [{"id": "p1", "doc_id": "d1", "text": "Lyon is big", "score": 3.0},
         {"id": "p2", "doc_id": "d2", "text": "the capital is paris .", "score": 2.0}],
        [{"id": "p3", "doc_id": "d3", "text": "Rome, Italy", "score": 5.0},
         {"id": "p4", "doc_id": "d4", "text": "nothing", "score": 1.0}],
        [{"id": "p5", "doc_id": "d5", "text": "x", "score": 0.0}],
    ]
    metrics = retrieval_metrics(examples, passages, [1, 2])
    assert metrics["answer_recall@1"] == pytest.approx(0.5)  # only q2 at rank 1
    assert metrics["answer_recall@2"] == pytest.approx(1.0)
    assert metrics["answer_mrr"] == pytest.approx((1 / 2 + 1) / 2)
    assert metrics["gold_recall@1"] == 0.0 and metrics["gold_recall@2"] == 1.0  # q1's d2 at rank 2
    assert retrieval_metrics(examples[2:], passages[2:], [1]) == {}
