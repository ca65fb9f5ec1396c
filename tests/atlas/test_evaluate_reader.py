"""`atlas evaluate` / `atlas ask` with a reader and no training: the shipped atlas-reader by name, over
a MiniLM index of part of the demo encyclopedia, with the settings its folder carries (the quickstart recipe's);
nothing is written but predictions and metrics (percent), and the numbers are the quickstart's "no fine-tuning"
ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import atlas
from atlas.cli import main
from atlas.config import load_config
from atlas.demo.quickstart import DEMO, RECIPE
from atlas.loading import SHIPPED_READER
from common.io import read_jsonl
from retriever.index.settings import IndexSettings
from tasks.metrics import normalize_answer

N_QUESTIONS = 6

needs_reader = pytest.mark.skipif(not (SHIPPED_READER / "config.json").is_file(), reason="atlas-reader not exported")


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> dict:
    """The first held-out questions, a corpus of their gold documents and as many others, and its
    MiniLM index built as the quickstart builds it (the recipe's retriever, its encoder recorded)."""
    from atlas.config import load_config
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever

    root = tmp_path_factory.mktemp("demo-index")
    questions = [record for _, record in read_jsonl(DEMO / "heldout.jsonl")][:N_QUESTIONS]
    (root / "dev.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    gold = {q["gold_doc"] for q in questions}
    documents = [d for _, d in read_jsonl(DEMO / "encyclopedia.jsonl")]
    chosen = [d for d in documents if d["id"] in gold] + [d for d in documents if d["id"] not in gold][:N_QUESTIONS]
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in chosen), encoding="utf-8")
    prepare_corpus([root / "docs.jsonl"], root / "corpus", chunk_words=100, progress=False)
    recipe = load_config(RECIPE)
    build_index(
        root / "corpus",
        Retriever.from_config(recipe.retriever),
        root / "index",
        progress=False,
        encoder_source=recipe.retriever.model,
        settings=IndexSettings(spec="Flat", batch_size=recipe.retriever.batch_size),
    )
    return {"root": root, "index": root / "index", "dev": root / "dev.jsonl", "questions": questions}


@needs_reader
def test_zero_shot_evaluate_of_the_shipped_reader_writes_predictions_and_metrics_only(demo_index, tmp_path, capsys):
    out = tmp_path / "zero-shot"
    assert (
        main(
            [
                "evaluate",
                "atlas-reader",
                "--index",
                str(demo_index["index"]),
                "--data",
                str(demo_index["dev"]),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    # predictions, metrics and the config that made them: no checkpoint, no weights, no optimizer state
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "config.yaml",
        "metrics.json",
        "predictions.jsonl",
    ]
    metrics = json.loads((out / "metrics.json").read_text())
    printed = capsys.readouterr().out
    assert json.loads(printed[: printed.rindex("}") + 1]) == metrics
    assert list(metrics) == [
        "exact_match",
        "f1",
        "answer_recall@1",
        "answer_recall@5",
        "answer_recall@20",
        "answer_mrr",
    ]

    # exact match in percent, by hand from the written predictions
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["answers"] for r in rows] == [q["answers"] for q in demo_index["questions"]]
    right = sum(any(normalize_answer(r["prediction"]) == normalize_answer(a) for a in r["answers"]) for r in rows)
    assert metrics["exact_match"] == 100 * (right / N_QUESTIONS)
    assert right >= N_QUESTIONS // 2  # the shipped reader reads: it answers most demo questions from retrieval
    # every passage retrieved for the deepest recall (retrieval_k [1, 5, 20]), up to the index's size
    from retriever.index.manifest import Manifest

    assert all(len(r["passages"]) == min(20, Manifest.load(demo_index["index"]).count) for r in rows)

    # the settings that ran: the reader folder's own (atlas.yaml) with the index's own encoder, nothing trained
    from atlas.config import load_config

    config = load_config(out / "config.yaml")
    assert config.reader.model == str(SHIPPED_READER)
    assert (
        config.inference.span_answers,
        config.inference.length_penalty,
        config.inference.num_beams,
        config.reader.n_context,
    ) == (True, 0.0, 4, 2)
    assert (config.retriever.model, config.retriever.loss.name, config.training.steps) == ("minilm", "none", 0)
    assert config.task.eval_data == [str(demo_index["dev"])]


@needs_reader
def test_zero_shot_scores_are_the_quickstarts_no_fine_tuning_scores(demo_index, tmp_path):
    """The quickstart's "no fine-tuning" row is `evaluate(load_model(recipe_spec(quickstart_config(…))), …)`: the
    same answers as `atlas evaluate atlas-reader` on the same questions and index (the reader's own settings,
    its folder's atlas.yaml, are the recipe's)."""
    from atlas.demo.quickstart import demo_data, quickstart_config
    from atlas.evaluate import evaluate
    from atlas.loading import load_model, model_spec, recipe_spec
    from tasks.base import get_task

    quickstart = quickstart_config(demo_index["root"], demo_data())  # its index: demo_index["root"] / "index"
    mine = model_spec("atlas-reader", index=demo_index["index"]).config
    for section in ("reader", "inference"):
        assert vars(getattr(mine, section)) == vars(getattr(quickstart, section)), section
    # the retriever as it searches (retriever.n_context is what a retriever loss covers: training only)
    for key in ("model", "passage_format", "query_maxlength", "passage_maxlength", "tied"):
        assert getattr(mine.retriever, key) == getattr(quickstart.retriever, key), key
    assert mine.evaluation.max_examples is None

    before = evaluate(load_model(recipe_spec(quickstart)), get_task("qa"), demo_index["dev"], quickstart.evaluation)
    out = tmp_path / "zero-shot"
    assert (
        main(
            [
                "evaluate",
                "atlas-reader",
                "--index",
                str(demo_index["index"]),
                "--data",
                str(demo_index["dev"]),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    shared = ("exact_match", "f1", "answer_recall@1")  # the quickstart measures recall at 1 and 2, ours at 1, 5, 20
    assert {k: metrics[k] for k in shared} == {k: before[k] for k in shared}


@needs_reader
def test_ask_the_shipped_reader_by_name(demo_index, tmp_path, capsys):
    question = demo_index["questions"][0]["question"]
    out = tmp_path / "zero-shot"
    assert (
        main(
            [
                "evaluate",
                "atlas-reader",
                "--index",
                str(demo_index["index"]),
                "--data",
                str(demo_index["dev"]),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    predicted = records[0]["prediction"]
    index = atlas.Index.load(demo_index["index"])
    n_read = load_config(out / "config.yaml", check_data=False).reader.n_context
    assert len(records[0]["passages"]) > n_read  # retrieval_k scores more passages than the reader reads
    for record in records:  # every citation slices a passage read back to the prediction's words
        for citation in record["citations"]:
            assert citation["passage_id"] in {p["id"] for p in record["passages"][:n_read]}
            field = getattr(index.get(citation["passage_id"]), citation["field"])
            assert field[citation["start"] : citation["end"]] == citation["quote"]
            assert " ".join(citation["quote"].lower().split()) == " ".join(record["prediction"].lower().split())
    assert sum(bool(r["citations"]) for r in records) >= len(records) / 2  # the shipped reader reads its answers
    capsys.readouterr()
    assert main(["ask", "atlas-reader", "--index", str(demo_index["index"]), question, "--show", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"Q: {question}\nA: {predicted}\n")  # the answer `atlas evaluate` scored
    assert "  [1] " in printed and "  [2] " in printed
    cited = printed.splitlines()[2]
    assert cited.startswith("cited: ") and (f"»{records[0]['citations'][0]['quote']}«" in cited) == bool(
        records[0]["citations"]
    )


def test_a_bare_reader_needs_an_index(tmp_path, capsys):
    data = tmp_path / "dev.jsonl"
    data.write_text('{"question": "q", "answers": ["a"]}\n')
    assert main(["evaluate", "atlas-reader", "--data", str(data)]) == 2
    assert capsys.readouterr().err == (
        "atlas evaluate: error: atlas-reader is a reader, not a run: it has no index of its own; give --index "
        "IDX (an index folder made by `atlas index build`)\n"
    )
    assert main(["ask", str(SHIPPED_READER), "what?"]) == 2
    assert "atlas ask: error: " in capsys.readouterr().err
    assert not Path("runs", f"eval-atlas-reader-{data.stem}").exists()


def test_a_folder_that_is_neither_a_run_a_checkpoint_nor_a_reader_is_named_with_what_was_looked_for(tmp_path, capsys):
    from reader.fid import READER_PRESETS, WARM_START_PRESETS

    folder = tmp_path / "nothing"
    folder.mkdir()
    data = tmp_path / "dev.jsonl"
    data.write_text('{"question": "q", "answers": ["a"]}\n')
    presets = ", ".join(sorted(READER_PRESETS | WARM_START_PRESETS))
    expected = (
        f"{folder}: neither a run, a checkpoint nor a reader: looked for checkpoints/latest (a run folder), "
        f"latest or config.yaml with reader/ (a checkpoint folder), config.json (a reader folder), a shipped "
        f"reader (atlas-reader), the reader presets ({presets}) and a Hub id (org/name)"
    )
    assert main(["evaluate", str(folder), "--index", str(tmp_path), "--data", str(data)]) == 2
    assert capsys.readouterr().err == f"atlas evaluate: error: {expected}\n"
    (folder / "config.yaml").write_text("training:\n  steps: 0\n")  # a run of 0 steps: no checkpoint
    assert main(["ask", str(folder), "what?"]) == 2
    assert capsys.readouterr().err == (
        f"atlas ask: error: {expected}; it has a config.yaml but no checkpoint (a run of training.steps 0 writes "
        "none): run the reader its reader.model names, with an index\n"
    )
