"""`atlas evaluate` end to end on the real data files with a tiny reader: KILT HotpotQA (with
provenance from a corpus that carries page ids), MMLU subject folders and NQ-open. The scores of
a random tiny model are near zero; what is checked is the pipeline, the output files, their
schemas and that every metric equals the official scorer run on the written files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from atlas.cli import main
from atlas.config import load_config
from retriever.index.settings import IndexSettings

# four subjects, one per MMLU category
SUBJECTS = {
    "abstract_algebra": "STEM",
    "anatomy": "other",
    "philosophy": "humanities",
    "high_school_geography": "social sciences",
}
ROWS_PER_SUBJECT = 3


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def real_world(shared_data, tiny_encoder_path, tmp_path_factory):
    """Slices of the real files, a corpus whose pages are the HotpotQA slice's gold pages (so
    provenance and R-precision are exercised), its index, and a tiny-reader checkpoint."""
    from atlas.loading import load_model, recipe_spec
    from atlas.training.checkpoint import save_checkpoint
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever

    root = tmp_path_factory.mktemp("real-world")
    kilt_rows = (shared_data / "kilt" / "hotpotqa-dev-kilt.jsonl").read_text(encoding="utf-8").splitlines()[:20]
    (root / "hotpotqa-dev-kilt.jsonl").write_text("\n".join(kilt_rows) + "\n", encoding="utf-8")
    nq_rows = (shared_data / "nq-open" / "NQ-open.dev.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    (root / "nq-dev.jsonl").write_text("\n".join(nq_rows) + "\n", encoding="utf-8")
    (root / "mmlu" / "test").mkdir(parents=True)
    for subject in SUBJECTS:
        with open(shared_data / "mmlu" / "test" / f"{subject}_test.csv", newline="", encoding="utf-8") as f:
            rows = [row for _, row in zip(range(ROWS_PER_SUBJECT), csv.reader(f))]
        with open(root / "mmlu" / "test" / f"{subject}_test.csv", "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)

    pages = {}
    for line in kilt_rows:
        for output in json.loads(line)["output"]:
            for p in output.get("provenance", []):
                pages[p["wikipedia_id"]] = p["title"]
    docs = [
        {"id": f"page-{wid}", "title": title, "text": f"{title}. An article about {title}.", "wikipedia_id": wid}
        for wid, title in sorted(pages.items())
    ]
    docs.append({"id": "no-page", "title": "Nowhere", "text": "A passage without a page id."})
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    prepare_corpus([root / "docs.jsonl"], root / "corpus", chunk_words=0, progress=False)
    build_index(
        root / "corpus",
        Retriever.from_config(load_config(None, [f"retriever.model={tiny_encoder_path}"]).retriever),
        root / "index",
        progress=False,
        settings=IndexSettings(spec="Flat"),
    )

    config = load_config(
        None,
        [
            f"retriever.model={tiny_encoder_path}",
            f"index.path={root / 'index'}",
            "reader.model=t5-tiny",
            "reader.n_context=2",
            "reader.text_maxlength=48",
            "inference.generation_max_length=5",
            "task.name=qa",
            f"training.output_dir={root / 'run'}",
            "evaluation.retrieval_k=[1,2,5]",
            "evaluation.batch_size=8",
        ],
    )
    model = load_model(recipe_spec(config))
    checkpoint = save_checkpoint(root / "run", 0, model=model, config=config, training_state={})
    return {
        "root": root,
        "checkpoint": checkpoint,
        "kilt": root / "hotpotqa-dev-kilt.jsonl",
        "nq": root / "nq-dev.jsonl",
        "mmlu": root / "mmlu",
        "n_pages": len(pages),
    }


def test_kilt_hotpotqa_outputs_and_official_scores(real_world, tmp_path, capsys):
    from tasks.kilt_scoring import score_kilt_files
    from tasks.score import score_files

    out = tmp_path / "kilt"
    assert (
        main(
            [
                "evaluate",
                str(real_world["checkpoint"]),
                "--data",
                str(real_world["kilt"]),
                "--task",
                "kilt",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert {p.name for p in out.iterdir()} == {
        "config.yaml",
        "predictions.jsonl",
        "kilt_predictions.jsonl",
        "metrics.json",
        "kilt_scores.json",
    }
    metrics = json.loads((out / "metrics.json").read_text())
    printed = capsys.readouterr().out
    assert json.loads(printed[: printed.rindex("}") + 1]) == metrics

    # KILT's output schema, one line per input id, in input order
    gold_ids = [json.loads(line)["id"] for line in real_world["kilt"].read_text().splitlines()]
    kilt = read_jsonl(out / "kilt_predictions.jsonl")
    assert [r["id"] for r in kilt] == gold_ids and len(kilt) == 20
    for record in kilt:
        assert set(record) == {"id", "output"} and len(record["output"]) == 1
        (output,) = record["output"]
        assert set(output) == {"answer", "provenance"} and isinstance(output["answer"], str)
        # the reader read 2 passages, retrieval_k asks for 5: the passage without a page id is left out
        assert 4 <= len(output["provenance"]) <= 5
        assert all(isinstance(p["wikipedia_id"], str) and p["wikipedia_id"] for p in output["provenance"])

    # the metric table: KILT's downstream, KILT- and retrieval metrics under the project's names, in
    # percent, primary (exact_match) first
    assert next(iter(metrics)) == "exact_match"
    assert {
        "exact_match",
        "accuracy",
        "f1",
        "rouge_l",
        "kilt_exact_match",
        "kilt_accuracy",
        "kilt_f1",
        "kilt_rouge_l",
        "r_precision",
        "provenance_precision@1",
        "provenance_recall@5",
        "provenance_success@5",
        "answer_recall@5",
    } <= set(metrics)
    assert not {"em", "rougel", "KILT-em", "Rprec", "recall@5"} & set(metrics)
    assert 0.0 <= metrics["r_precision"] <= 100.0 and metrics["kilt_exact_match"] <= metrics["exact_match"]
    # unrounded, and exactly what `atlas score` gives on the written file: 100 × the official scorer's figures
    scored = score_files("kilt", real_world["kilt"], out / "kilt_predictions.jsonl", ks=(1, 5, 10, 20))
    assert {k: metrics[k] for k in scored} == scored
    official = score_kilt_files(real_world["kilt"], out / "kilt_predictions.jsonl", ks=(1, 5, 10, 20))
    assert scored["exact_match"] == 100 * official["em"] and scored["r_precision"] == 100 * official["Rprec"]
    assert scored["provenance_recall@5"] == 100 * official["recall@5"]
    # the official report beside them: KILT's key names and [0, 1] scale, as its scorers print them
    report = json.loads((out / "kilt_scores.json").read_text())
    assert report == score_files(
        "kilt", real_world["kilt"], out / "kilt_predictions.jsonl", ks=(1, 5, 10, 20), official=True
    )
    assert report["downstream"]["em"] == official["em"] and report["retrieval"]["Rprec"] == official["Rprec"]

    # the resolved config of this evaluation sits beside its outputs
    recorded = load_config(out / "config.yaml")
    assert recorded.task.name == "kilt" and recorded.task.eval_data == [str(real_world["kilt"])]
    assert recorded.reader.n_context == 2


def test_mmlu_subject_folders_per_category_and_score_roundtrip(real_world, tmp_path):
    from tasks.score import score_files

    out = tmp_path / "mmlu"
    assert (
        main(
            [
                "evaluate",
                str(real_world["checkpoint"]),
                "--data",
                str(real_world["mmlu"]),
                "--task",
                "mmlu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    rows = read_jsonl(out / "predictions.jsonl")
    n = ROWS_PER_SUBJECT * len(SUBJECTS)
    assert len(rows) == n and not (out / "kilt_predictions.jsonl").exists()
    for row in rows:
        assert row["prediction"] in "ABCD" and sorted(row["probabilities"]) == ["A", "B", "C", "D"]
        assert sum(row["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
        assert len(row["passages"]) == 2

    # per-question averages in percent: overall, per category, per subject, from the written predictions
    def correct(row, key):
        letter = (
            row["prediction"] if key == "accuracy" else max(sorted(row["probabilities"]), key=row["probabilities"].get)
        )
        return float(letter == row["answers"][0])

    for key in ("accuracy", "debiased_accuracy"):
        assert metrics[key] == pytest.approx(100 * (sum(correct(r, key) for r in rows) / n), abs=1e-15)
        for subject, category in SUBJECTS.items():
            mine = [r for r in rows if r["id"].startswith(f"{subject}_test:")]
            assert len(mine) == ROWS_PER_SUBJECT
            expected = 100 * (sum(correct(r, key) for r in mine) / ROWS_PER_SUBJECT)
            assert metrics[f"{key}/{category}"] == pytest.approx(expected, abs=1e-15)
            assert metrics[f"{key}/subject/{subject}"] == pytest.approx(expected, abs=1e-15)

    # `atlas score` reads evaluate's own file, probabilities included: the same numbers, de-biased too
    scored = score_files("mmlu", real_world["mmlu"], out / "predictions.jsonl")
    assert "debiased_accuracy" in scored and scored == metrics


def test_nq_open_exact_match_f1_and_answer_recall(real_world, tmp_path):
    from tasks.score import score_files

    out = tmp_path / "nq"
    assert (
        main(
            [
                "evaluate",
                str(real_world["checkpoint"]),
                "--data",
                str(real_world["nq"]),
                "--out",
                str(out),
                "evaluation.retrieval_k=[1,2]",
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics)[:2] == ["exact_match", "f1"]
    assert {"answer_recall@1", "answer_recall@2", "answer_mrr"} <= set(metrics)
    rows = read_jsonl(out / "predictions.jsonl")
    questions = [json.loads(line)["question"] for line in real_world["nq"].read_text().splitlines()]
    assert [r["query"] for r in rows] == [f"question: {q} answer: <extra_id_0>" for q in questions]
    assert all(isinstance(r["prediction"], str) and "<extra_id" not in r["prediction"] for r in rows)
    official = score_files("qa", real_world["nq"], out / "predictions.jsonl")
    assert {k: metrics[k] for k in ("exact_match", "f1")} == official
    assert load_config(out / "config.yaml").evaluation.retrieval_k == [1, 2]


def test_unlabelled_kilt_test_file_writes_predictions_and_skips_metrics(real_world, tmp_path, capsys):
    """A KILT test file (inputs, no output) is predicted and written in KILT's format, not scored."""
    rows = [json.loads(line) for line in real_world["kilt"].read_text().splitlines()[:4]]
    test_file = tmp_path / "hotpotqa-test_without_answers-kilt.jsonl"
    test_file.write_text("".join(json.dumps({"id": r["id"], "input": r["input"]}) + "\n" for r in rows))
    out = tmp_path / "kilt-test"
    out.mkdir()
    (out / "metrics.json").write_text(
        '{"exact_match": 50.0}\n'
    )  # an older run's: must not survive beside new predictions
    (out / "kilt_scores.json").write_text("{}\n")
    # without --predict-only an unlabelled file is an error naming its first record, and nothing is written
    assert (
        main(["evaluate", str(real_world["checkpoint"]), "--data", str(test_file), "--task", "kilt", "--out", str(out)])
        == 2
    )
    assert capsys.readouterr().err == (
        f"atlas evaluate: error: {test_file}:1: field 'output[].answer': no gold answer to score against (4 of 4 "
        "examples have none); an unlabelled test set is predicted without scores by `atlas evaluate … --predict-only`\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["kilt_scores.json", "metrics.json"]
    assert (
        main(
            [
                "evaluate",
                str(real_world["checkpoint"]),
                "--data",
                str(test_file),
                "--task",
                "kilt",
                "--out",
                str(out),
                "--predict-only",
            ]
        )
        == 0
    )
    assert "predicted, not scored (--predict-only)" in capsys.readouterr().out
    assert not (out / "metrics.json").exists() and not (out / "kilt_scores.json").exists()
    kilt = read_jsonl(out / "kilt_predictions.jsonl")
    assert [r["id"] for r in kilt] == [r["id"] for r in rows]
    assert all(r["output"][0]["provenance"] for r in kilt)
    assert len(read_jsonl(out / "predictions.jsonl")) == 4
