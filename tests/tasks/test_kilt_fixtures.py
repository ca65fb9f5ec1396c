"""The shipped KILT fixtures (tests/fixtures/kilt/): one per KILT task, each in that task's real
KILT format, loaded by the `kilt` adapter as its own dataset; each small KILT recipe runs on its
own task's fixture."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from atlas.config import load_config
from tasks import get_task
from tasks.kilt import KILT_DATASETS, infer_kilt_dataset
from tasks.kilt_scoring import as_metrics, score_kilt

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kilt"
# small recipe → (fixture dataset, its primary metric)
RECIPES = {
    "kilt-fever": "fever",
    "kilt-aida": "aidayago2",
    "kilt-trex": "trex",
    "kilt-zsre": "structured_zeroshot",
    "kilt-nq": "nq",
    "kilt-hotpotqa": "hotpotqa",
    "kilt-triviaqa": "triviaqa",
    "kilt-eli5": "eli5",
    "kilt-wow": "wow",
}
DATASETS = sorted(set(RECIPES.values()))


def records(dataset: str) -> list[dict]:
    path = FIXTURES / f"{dataset}-dev-kilt.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("dataset", DATASETS)
def test_fixture_is_kilt_format_and_loads_as_its_dataset(dataset):
    path = FIXTURES / f"{dataset}-dev-kilt.jsonl"
    assert infer_kilt_dataset(path) == dataset
    raw = records(dataset)
    assert 4 <= len(raw) <= 10 and len({r["id"] for r in raw}) == len(raw)
    for record in raw:
        assert isinstance(record["id"], str) and isinstance(record["input"], str) and record["input"].strip()
        assert isinstance(record["output"], list) and record["output"]
        assert any(o.get("answer") for o in record["output"])
        pages = [p for o in record["output"] for p in o.get("provenance", [])]
        assert pages and all(isinstance(p["wikipedia_id"], str) and p["title"] for p in pages)
    examples = get_task("kilt", kilt_task=dataset).load(path)
    assert len(examples) == len(raw) and all(e.metadata["kilt_task"] == dataset and e.target for e in examples)


def test_task_conventions():
    fever = records("fever")
    assert {o["answer"] for r in fever for o in r["output"]} == {"SUPPORTS", "REFUTES"}
    assert [e.target for e in get_task("kilt").load(FIXTURES / "fever-dev-kilt.jsonl")][:2] == [
        "<extra_id_0> true",
        "<extra_id_0> false",
    ]
    for dataset in ("trex", "structured_zeroshot"):  # slot filling: "subject [SEP] relation"
        assert all(re.fullmatch(r"[^\[\]]+ \[SEP\] [^\[\]]+", r["input"]) for r in records(dataset))
    assert all(r["meta"]["template_questions"] for r in records("structured_zeroshot"))
    for record in records("aidayago2"):  # entity linking: exactly one marked mention
        assert record["input"].count("[START_ENT]") == 1 and record["input"].count("[END_ENT]") == 1
        mention = re.search(r"\[START_ENT\] (.+?) \[END_ENT\]", record["input"]).group(1)
        assert mention == record["meta"]["mention"]
        assert record["output"][0]["answer"] == record["output"][0]["provenance"][0]["title"]
    wow = records("wow")
    assert all(len(r["input"].split("\n")) >= 2 for r in wow)  # dialogue history, one turn per line
    (example, *_) = get_task("kilt").load(FIXTURES / "wow-dev-kilt.jsonl")
    assert " / " in example.query and "\n" not in example.query
    eli5 = records("eli5")
    assert all(len(o["answer"].split()) > 20 for r in eli5 for o in r["output"] if "answer" in o)


@pytest.mark.parametrize("dataset", DATASETS)
def test_gold_as_prediction_scores_perfectly(dataset):
    """The fixture scored against itself (first answer, first provenance set) with KILT's scorer."""
    gold = records(dataset)
    guesses = []
    for record in gold:
        answer = next(o["answer"] for o in record["output"] if o.get("answer"))
        provenance = next(o["provenance"] for o in record["output"] if o.get("provenance"))
        guesses.append({"id": record["id"], "output": [{"answer": answer, "provenance": provenance}]})
    scores = as_metrics(score_kilt(gold, guesses))  # percent, the project's names
    primary = KILT_DATASETS[dataset][1]
    assert scores[primary] == pytest.approx(100.0, abs=1e-5) and scores["r_precision"] == 100.0
    assert scores[f"kilt_{primary}"] == scores[primary]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_small_recipe_runs_its_own_task(recipe):
    config = load_config(REPO / "configs" / "small" / f"{recipe}.yaml")
    dataset = RECIPES[recipe]
    assert config.task.name == "kilt" and config.task.options["kilt_task"] == dataset
    data = config.task.train_data + config.task.eval_data
    assert len(data) == 2
    for path in data:
        assert infer_kilt_dataset(path) == dataset
        if recipe != "kilt-hotpotqa":  # HotpotQA runs on the real dev file in ../shared/data
            assert path == f"tests/fixtures/kilt/{dataset}-dev-kilt.jsonl" and (REPO / path).is_file()
