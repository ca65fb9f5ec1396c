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


# ----------------------------------------------------------------------------- evaluate()


class CannedReader:
    """A stand-in for the FiD reader + tokenizer: "generates" a fixed answer per query."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.queries: list[str] = []

    def generate(self, input_ids, attention_mask, **kwargs):
        return list(input_ids)

    def batch_decode(self, generated, skip_special_tokens=False):
        return [f"<extra_id_0> {self.answers[q]}</s>" for q in generated]


class CannedModel:
    """Closed-book `Atlas` look-alike with canned answers (what `evaluate` calls, nothing more)."""

    closed_book = True
    index = None

    def __init__(self, answers: dict[str, str]):
        from atlas.config import ReaderConfig

        self.reader = self.reader_tokenizer = CannedReader(answers)
        self.reader_config = ReaderConfig(n_context=1)

    def eval(self):
        return self

    def passages_for(self, batch, k):
        return None

    def reader_inputs(self, queries, passages):
        return queries, None

    def generate(self, input_ids, attention_mask, passages, encoder_states=None):
        return self.reader.generate(input_ids, attention_mask)


def qa_file(tmp_path, records):
    import json

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


QUERY = "question: {} answer: <extra_id_0>"


def test_metrics_are_not_rounded_and_config_is_saved(tmp_path):
    from atlas.config import EvaluationConfig, load_config
    from atlas.evaluate import evaluate
    from tasks.base import get_task

    data = qa_file(tmp_path, [{"question": "when?", "answers": ["1999"]}, {"question": "who?", "answers": ["Bob"]},
                              {"question": "where?", "answers": ["Paris"]}])
    model = CannedModel({QUERY.format("when?"): "in 1999", QUERY.format("who?"): "Bob",
                         QUERY.format("where?"): "Rome"})
    config = load_config(None, ["evaluation.retrieval_k=[1,3]"])
    metrics = evaluate(model, get_task("qa"), data, EvaluationConfig(), out_dir=tmp_path / "out", run_config=config)
    # F1 = (2/3 + 1 + 0) / 3 to the last bit: no rounding to 6 digits (0.555556)
    assert metrics == {"exact_match": 1 / 3, "f1": (2 / 3 + 1.0 + 0.0) / 3}
    import json

    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == metrics
    assert load_config(tmp_path / "out" / "config.yaml") == config
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == ["in 1999", "Bob", "Rome"]  # sentinels stripped


def test_unlabelled_data_is_predicted_not_scored(tmp_path, caplog):
    import json

    from atlas.config import EvaluationConfig
    from atlas.evaluate import evaluate
    from tasks.base import get_task

    data = qa_file(tmp_path, [{"question": "when?"}, {"question": "who?"}])
    model = CannedModel({QUERY.format("when?"): "1999", QUERY.format("who?"): "Bob"})
    with caplog.at_level("WARNING", logger="atlas.evaluate"):
        metrics = evaluate(model, get_task("qa"), data, EvaluationConfig(), out_dir=tmp_path / "out")
    assert metrics == {}
    assert "none of the 2 examples has a gold answer (an unlabelled test set): metrics skipped" in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [(r["prediction"], r["answers"]) for r in rows] == [("1999", []), ("Bob", [])]
    assert not (tmp_path / "out" / "metrics.json").exists()


def test_partly_labelled_data_is_an_error_after_the_predictions_are_written(tmp_path):
    from atlas.config import EvaluationConfig
    from atlas.evaluate import evaluate
    from tasks.base import get_task

    data = qa_file(tmp_path, [{"question": "when?", "answers": ["1999"]}, {"question": "who?"}])
    model = CannedModel({QUERY.format("when?"): "1999", QUERY.format("who?"): "Bob"})
    with pytest.raises(ValueError, match=r"qa\.jsonl: 1 of 2 examples have no gold answer \(1\); a partly labelled "
                                         r"file cannot be scored \(predictions were written to .*out\)"):
        evaluate(model, get_task("qa"), data, EvaluationConfig(), out_dir=tmp_path / "out")
    assert len((tmp_path / "out" / "predictions.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(("total", "world", "expected"), [
    (5, 2, [(["e0", "e1"], 2), (["e2", "e3", "e4"], 3)]),   # padded to ceil(5/2) = 3
    (4, 2, [(["e0", "e1"], 2), (["e2", "e3"], 2)]),
    (1, 3, [([], 0), ([], 0), (["e0"], 1)]),                # ranks with nothing still run one batch
])
def test_rank_share_splits_and_pads_to_lockstep(total, world, expected):
    from atlas.evaluate import rank_share

    examples = [Example(id=f"e{n}", query=f"q{n}", target=None, answers=[]) for n in range(total)]
    shares = [rank_share(examples, rank, world) for rank in range(world)]
    size = -(-total // world)
    assert all(len(share) == size for share, _ in shares)  # the same number of batches on every rank
    assert [([e.id for e in share[:n_real]], n_real) for share, n_real in shares] == expected
    assert [e.id for share, n_real in shares for e in share[:n_real]] == [e.id for e in examples]
