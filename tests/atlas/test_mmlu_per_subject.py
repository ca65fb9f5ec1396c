"""MMLU 5-shot per subject on 2 real subjects with a tiny model: one fine-tuned model per subject
(trained on its own dev split only), evaluated on its own test split, merged into one table of
per-question averages; a second start resumes without training again."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from atlas.cli import main
from atlas.config import load_config, save_config

# different categories and different test sizes: per-question ≠ per-subject averaging
TEST_ROWS = {"anatomy": 2, "philosophy": 4}


@pytest.fixture
def mmlu_root(shared_data, tmp_path):
    root = tmp_path / "mmlu"
    (root / "dev").mkdir(parents=True)
    (root / "test").mkdir()
    for subject, n in TEST_ROWS.items():
        shutil.copy(shared_data / "mmlu" / "dev" / f"{subject}_dev.csv", root / "dev")
        with open(shared_data / "mmlu" / "test" / f"{subject}_test.csv", newline="", encoding="utf-8") as f:
            rows = [row for _, row in zip(range(n), csv.reader(f))]
        with open(root / "test" / f"{subject}_test.csv", "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)
    # a subject with a dev file but no test file is not a subject of the run
    shutil.copy(shared_data / "mmlu" / "dev" / "astronomy_dev.csv", root / "dev")
    return root


def recipe(world, out):
    return load_config(
        None,
        [
            f"retriever.model={world['encoder']}",
            "retriever.loss=pdist",
            "retriever.n_context=2",
            "retriever.temperature_gold=0.1",
            "retriever.temperature_score=0.1",
            f"index.path={world['index']}",
            "reader.model=t5-tiny",
            "reader.n_context=2",
            "reader.text_maxlength=64",
            "reader.answer_maxlength=4",
            "task.name=mmlu",
            "task.train_data=[unused-dev.csv]",
            "task.eval_data=[unused-test.csv]",
            "task.options={train_permutations: cyclic, eval_permutations: cyclic}",
            f"training.output_dir={out}",
            "training.steps=2",
            "training.batch_size=2",
            "training.warmup_steps=0",
            "training.lr=1e-3",
            "evaluation.batch_size=4",
        ],
    )


def test_per_subject_runs_merge_and_resume(tiny_world, mmlu_root, tmp_path, capsys, monkeypatch):
    from atlas.training.mmlu_per_subject import run_per_subject
    from tasks.base import get_task

    out = tmp_path / "per-subject"
    save_config(recipe(tiny_world, tmp_path / "unused"), tmp_path / "recipe.yaml")
    assert (
        main(["mmlu-per-subject", str(tmp_path / "recipe.yaml"), "--data-dir", str(mmlu_root), "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.loads(printed[: printed.rindex("}") + 1]) == {k: v for k, v in metrics.items() if "/subject/" not in k}
    assert json.loads((out / "subjects.json").read_text()) == TEST_ROWS  # astronomy has no test file

    for subject in TEST_ROWS:
        run = out / "subjects" / subject
        # trained on this subject's 5 dev questions alone (4 cyclic presentations each)
        trained = json.loads((run / "train_examples.json").read_text())
        assert len(trained) == 20 and all(i.startswith(f"{subject}_dev:") for i in trained)
        assert json.loads((run / "summary.json").read_text())["step"] == 2
        assert not (run / "checkpoints").exists()  # deleted once evaluated
        evaluated = load_config(run / "eval" / "config.yaml")
        assert evaluated.task.eval_data == [str(mmlu_root / "test" / f"{subject}_test.csv")]
        assert evaluated.task.train_data == [str(mmlu_root / "dev" / f"{subject}_dev.csv")]

    # the merged table: per-question averages over both subjects' questions
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["subject"] for r in rows] == ["anatomy"] * 2 + ["philosophy"] * 4
    for key in ("accuracy", "debiased_accuracy"):
        correct = [
            float(
                (r["prediction"] if key == "accuracy" else max(sorted(r["probabilities"]), key=r["probabilities"].get))
                == r["answers"][0]
            )
            for r in rows
        ]
        assert metrics[key] == pytest.approx(100 * (sum(correct) / 6), abs=1e-15)  # percent
        assert metrics[f"{key}/other"] == pytest.approx(100 * (sum(correct[:2]) / 2), abs=1e-15)  # anatomy
        assert metrics[f"{key}/humanities"] == pytest.approx(100 * (sum(correct[2:]) / 4), abs=1e-15)  # philosophy
        for subject in TEST_ROWS:
            per_subject = json.loads((out / "subjects" / subject / "eval" / "metrics.json").read_text())
            assert metrics[f"{key}/subject/{subject}"] == per_subject[key]
    examples = get_task("mmlu").load(mmlu_root / "test")
    assert (
        get_task("mmlu").evaluate(
            examples, [r["prediction"] for r in rows], letter_probs=[r["probabilities"] for r in rows]
        )
        == metrics
    )

    # started again: every subject is already evaluated, nothing trains, the same table
    def no_training(*args, **kwargs):
        raise AssertionError("a finished subject was trained again")

    monkeypatch.setattr("atlas.training.loop.train", no_training)
    again = run_per_subject(recipe(tiny_world, out), mmlu_root, progress=False)
    assert again == metrics


def test_subject_selection_errors(mmlu_root, tiny_world, tmp_path):
    from atlas.training.mmlu_per_subject import run_per_subject, subject_files

    assert list(subject_files(mmlu_root)) == ["anatomy", "philosophy"]
    assert list(subject_files(mmlu_root, ["philosophy"])) == ["philosophy"]
    with pytest.raises(
        ValueError,
        match=r"no dev and test files for subject\(s\) astronomy, chess; "
        r"valid: anatomy, philosophy",
    ):
        subject_files(mmlu_root, ["astronomy", "chess"])
    with pytest.raises(ValueError, match=r"mmlu/dev/dev: folder not found \(expected the MMLU root"):
        subject_files(mmlu_root / "dev")
    qa = load_config(None, ["task.name=qa"])
    with pytest.raises(ValueError, match="the per-subject setting is MMLU's; the recipe's task is 'qa'"):
        run_per_subject(qa, mmlu_root)
