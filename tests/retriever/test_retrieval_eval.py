"""Retrieval metrics against hand-computed values, and the question-file reader's errors."""

from __future__ import annotations

import json

import pytest

from common.io import InputError
from retriever.retrieval_eval import RetrievalExample, read_retrieval_examples, score_retrieval
from tasks.passage import Passage


def hit(passage_id: str, text: str, doc_id: str = "") -> Passage:
    return Passage(id=passage_id, score=0.0, title="", text=text, row=0, doc_id=doc_id)


def test_metrics_by_hand():
    examples = [
        RetrievalExample("q1", ["Johannes Gutenberg"], ["doc-a"]),
        RetrievalExample("q2", ["1972"], ["doc-z"]),
        RetrievalExample("q3", ["Paris"], []),
    ]
    hits = [
        # answer first at rank 2 (case and punctuation normalised); gold doc (by doc id) at rank 3
        [
            hit("x-0", "nothing here"),
            hit("y-0", "Printing: JOHANNES GUTENBERG, a goldsmith."),
            hit("doc-a-1", "chunk of the gold document", doc_id="doc-a"),
        ],
        # "19722" must not count as "1972" (token match, not substring); answer at rank 3
        [hit("p-0", "in 19722"), hit("p-1", "no"), hit("doc-z", "landed in 1972.", doc_id="d")],
        # no answer anywhere
        [hit("r-0", "Parisian cafe"), hit("r-1", "London"), hit("r-2", "Rome")],
    ]
    metrics, records = score_retrieval(examples, hits, [1, 2, 3])
    assert [r["answer_rank"] for r in records] == [2, 3, None]
    assert [r["gold_rank"] for r in records] == [3, 3, None]
    assert metrics["answer_recall@1"] == 0.0
    assert metrics["answer_recall@2"] == pytest.approx(1 / 3)
    assert metrics["answer_recall@3"] == pytest.approx(2 / 3)
    assert metrics["answer_mrr"] == pytest.approx((1 / 2 + 1 / 3) / 3)
    # gold metrics cover only the two examples that name gold ids
    assert metrics["n_with_gold"] == 2 and metrics["gold_recall@2"] == 0.0 and metrics["gold_recall@3"] == 1.0
    assert metrics["gold_mrr"] == pytest.approx(1 / 3)
    assert records[0]["hits"][1]["has_answer"] and records[0]["hits"][2]["gold"]
    assert "gold" not in records[2]["hits"][0]


def test_reader_accepts_nq_open_and_names_bad_lines(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps({"question": "a?", "answer": ["x", "y"]})
        + "\n"
        + json.dumps({"question": "b?", "answers": "z", "gold_doc": "nq-1"})
        + "\n"
    )
    examples = read_retrieval_examples(path)
    assert examples == [
        RetrievalExample("a?", ["x", "y"], []),
        RetrievalExample("b?", ["z"], ["nq-1"]),
    ]
    path.write_text(json.dumps({"question": "a?", "answers": ["x"]}) + "\n" + json.dumps({"question": "b?"}) + "\n")
    with pytest.raises(InputError, match=r"q.jsonl:2: field 'answers': missing required field"):
        read_retrieval_examples(path)
    path.write_text(json.dumps({"question": "a?", "answers": [{"text": "x"}]}) + "\n")
    with pytest.raises(InputError, match=r"q.jsonl:1: field 'answers': expected a string or a list of strings"):
        read_retrieval_examples(path)
