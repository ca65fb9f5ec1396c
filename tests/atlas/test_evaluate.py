"""Evaluation's retrieval metrics on hand-made rankings."""

from __future__ import annotations

import pytest

from atlas.evaluate import retrieval_metrics
from tasks.base import Example
from tasks.passage import Passage


def test_answer_and_gold_recall_by_hand():
    examples = [
        Example(id="a", query="q1", target=None, answers=["Paris"], metadata={"gold_ids": ["d2"]}),
        Example(id="b", query="q2", target=None, answers=["Rome"]),
        Example(id="c", query="q3", target=None, answers=[]),  # no answers: left out
    ]
    passages = [
        [
            Passage("p1", doc_id="d1", text="Lyon is big", score=3.0),
            Passage("p2", doc_id="d2", text="the capital is paris ."),
        ],  # given, not retrieved: no score
        [
            Passage("p3", doc_id="d3", text="Rome, Italy", score=5.0),
            Passage("p4", doc_id="d4", text="nothing", score=1.0),
        ],
        [Passage("p5", doc_id="d5", text="x", score=0.0)],
    ]
    metrics = retrieval_metrics(examples, passages, [1, 2])  # percent
    assert metrics["answer_recall@1"] == 50.0  # only q2 at rank 1
    assert metrics["answer_recall@2"] == 100.0
    assert metrics["answer_mrr"] == 100 * ((1 / 2 + 1) / 2)
    assert metrics["gold_recall@1"] == 0.0 and metrics["gold_recall@2"] == 100.0  # q1's d2 at rank 2
    assert set(metrics) == {
        "answer_recall@1",
        "answer_recall@2",
        "answer_mrr",
        "gold_recall@1",
        "gold_recall@2",
        "gold_mrr",
    }
    assert retrieval_metrics(examples[2:], passages[2:], [1]) == {}


def test_passage_texts_cross_ranks_without_the_index_texts():
    """Under torchrun, the text of index passages stays behind (rank 0 re-reads it by row); the
    text of a passage the index does not hold travels; the predictions file lists each passage the same."""
    from atlas.evaluate import _passage_summary, _restore_texts, _strip_texts

    class Index:
        def passages(self, rows):
            return [{"id": f"r{r}", "text": f"text of row {r}"} for r in rows]

    read = [
        [
            Passage("a", title="A", text="text of row 4", score=2.0, row=4, wikipedia_id="7"),
            Passage("g", title="G", text="given text"),
        ],
        None,
    ]
    sent = _strip_texts(read, has_index=True)
    assert [p.text for p in sent[0]] == ["", "given text"] and sent[1] is None
    assert read[0][0].text == "text of row 4"  # the caller's records are not changed
    _restore_texts(sent, Index())
    assert sent[0] == read[0]
    assert _strip_texts(read, has_index=False) is read
    assert _passage_summary(read[0]) == [
        {"id": "a", "score": 2.0, "title": "A", "wikipedia_id": "7"},
        {"id": "g", "score": None, "title": "G"},
    ]
    assert _passage_summary(None) == []


# ----------------------------------------------------------------------------- evaluate()


class CannedModel:
    """Closed-book model look-alike with canned answers: what `evaluate` calls of `AtlasModel` (its one answer
    path, `read`), "generating" a fixed answer per query in the reader's raw form."""

    closed_book = True
    index = None
    n_read = 1

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def eval(self):
        return self

    def passages_for(self, batch, k):
        return None

    def read(self, queries, passages, *, with_attention=False):
        from atlas.model import Reading

        return Reading([f"<extra_id_0> {self.answers[q]}</s>" for q in queries])


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

    data = qa_file(
        tmp_path,
        [
            {"question": "when?", "answers": ["1999"]},
            {"question": "who?", "answers": ["Bob"]},
            {"question": "where?", "answers": ["Paris"]},
        ],
    )
    model = CannedModel({QUERY.format("when?"): "in 1999", QUERY.format("who?"): "Bob", QUERY.format("where?"): "Rome"})
    config = load_config(None, ["evaluation.retrieval_k=[1,3]"])
    metrics = evaluate(model, get_task("qa"), data, EvaluationConfig(), out_dir=tmp_path / "out", run_config=config)
    # percent; F1 = 100 · (2/3 + 1 + 0) / 3 to the last bit: no rounding to 6 digits (55.5556)
    assert metrics == {"exact_match": 100 * (1 / 3), "f1": 100 * ((2 / 3 + 1.0 + 0.0) / 3)}
    import json

    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == metrics
    assert load_config(tmp_path / "out" / "config.yaml") == config
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows] == ["in 1999", "Bob", "Rome"]  # sentinels stripped


def test_unlabelled_data_is_predicted_not_scored_with_predict_only(tmp_path):
    import json

    from atlas.config import EvaluationConfig
    from atlas.evaluate import evaluate
    from tasks.base import get_task

    data = qa_file(tmp_path, [{"question": "when?"}, {"question": "who?"}])
    model = CannedModel({QUERY.format("when?"): "1999", QUERY.format("who?"): "Bob"})
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.json").write_text('{"exact_match": 50.0}\n')  # an older run's: must go
    metrics = evaluate(model, get_task("qa"), data, EvaluationConfig(), out_dir=tmp_path / "out", predict_only=True)
    assert metrics == {}
    rows = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [(r["prediction"], r["answers"]) for r in rows] == [("1999", []), ("Bob", [])]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["predictions.jsonl"]


@pytest.mark.parametrize(
    "records",
    [
        [{"question": "when?", "answers": ["1999"]}, {"question": "who?"}],  # partly labelled
        [{"question": "when?", "answer_text": "1999"}, {"question": "who?", "answer_text": "Bob"}],  # a misnamed field
    ],
)
def test_an_example_without_answers_is_an_error_naming_file_line_and_field_before_anything_is_written(
    tmp_path, records
):
    from atlas.config import EvaluationConfig
    from atlas.evaluate import evaluate
    from common.io import InputError
    from tasks.base import get_task

    data = qa_file(tmp_path, records)
    model = CannedModel({QUERY.format("when?"): "1999", QUERY.format("who?"): "Bob"})
    line = 2 if "answers" in records[0] else 1
    n = 1 if "answers" in records[0] else 2
    message = (
        f"{data}:{line}: field 'answers': no gold answer to score against ({n} of 2 examples have none); "
        "an unlabelled test set is predicted without scores by `atlas evaluate … --predict-only`"
    )
    with pytest.raises(InputError) as error:
        evaluate(model, get_task("qa"), data, EvaluationConfig(), out_dir=tmp_path / "out")
    assert str(error.value) == message
    assert not (tmp_path / "out").exists()


def test_an_mmlu_question_without_its_answer_names_its_line_and_the_answer_field(tmp_path):
    import json

    from atlas.evaluate import check_labelled
    from common.io import InputError
    from tasks.base import get_task

    options = {"A": "a", "B": "b", "C": "c", "D": "d"}
    path = tmp_path / "anatomy_test.jsonl"
    labelled = json.dumps({"question": "What?", "options": options, "answer": "B"})
    unlabelled = json.dumps({"question": "Which?", "options": options})
    path.write_text(f"{labelled}\n\n{unlabelled}\n")  # a blank line 2: the unlabelled record is on line 3
    task = get_task("mmlu")
    with pytest.raises(
        InputError,
        match=r"anatomy_test\.jsonl:3: field 'answer': no gold answer to score against "
        r"\(1 of 2 examples have none\)",
    ):
        check_labelled(task, path, task.load(path))
    check_labelled(task, path, task.load(path)[:1])  # labelled: nothing raised


@pytest.mark.parametrize(
    ("total", "world", "expected"),
    [
        (5, 2, [(["e0", "e1"], 2), (["e2", "e3", "e4"], 3)]),  # padded to ceil(5/2) = 3
        (4, 2, [(["e0", "e1"], 2), (["e2", "e3"], 2)]),
        (1, 3, [([], 0), ([], 0), (["e0"], 1)]),  # ranks with nothing still run one batch
    ],
)
def test_rank_share_splits_and_pads_to_lockstep(total, world, expected):
    from atlas.evaluate import rank_share

    examples = [Example(id=f"e{n}", query=f"q{n}", target=None, answers=[]) for n in range(total)]
    shares = [rank_share(examples, rank, world) for rank in range(world)]
    size = -(-total // world)
    assert all(len(share) == size for share, _ in shares)  # the same number of batches on every rank
    assert [([e.id for e in share[:n_real]], n_real) for share, n_real in shares] == expected
    assert [e.id for share, n_real in shares for e in share[:n_real]] == [e.id for e in examples]
