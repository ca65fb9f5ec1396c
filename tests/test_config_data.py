"""`atlas.config.validate_data` at config load: training and evaluation files never share an example
(unless the recipe says so), and KILT evaluation files carry the provenance their scores need."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from atlas.config import ConfigError, load_config
from common.io import InputError

QA = [
    {"question": "what is the capital of zorbland", "answers": ["Quimper"]},
    {"question": "who first climbed mount olo", "answers": ["Anna Brook"]},
    {"question": "what is the currency of tarsia", "answers": ["florin"]},
]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def qa_config(train: Path, evaluated: Path, *overrides: str):
    return load_config(
        None, ["task.name=qa", f"task.train_data=[{train}]", f"task.eval_data=[{evaluated}]", *overrides]
    )


def test_the_same_file_for_training_and_evaluation_is_refused(tmp_path):
    data = write(tmp_path / "qa.jsonl", QA)
    with pytest.raises(ConfigError) as error:
        qa_config(data, data)
    assert str(error.value).startswith(
        f"override 'task.train_data=[{data}]' and override 'task.eval_data=[{data}]': training file {data} "
        f"and evaluation file {data} (the same file) "
        f"share 3 of the evaluation file's 3 examples (the same question text; e.g. train id '0' = eval id '0', "
        "train id '1' = eval id '1', train id '2' = eval id '2'). Scores on examples the model trained on "
        "measure nothing: use disjoint files (`atlas data split FILE --train N --out DIR` splits one file), "
        "or set task.allow_overlap: true"
    )
    # reloading a finished run's config need not read its data again
    assert load_config(
        None, ["task.name=qa", f"task.train_data=[{data}]", f"task.eval_data=[{data}]"], check_data=False
    ).task.eval_data == [str(data)]


def test_files_sharing_one_question_up_to_case_and_spaces_are_refused_naming_both(tmp_path):
    train = write(tmp_path / "train.jsonl", [QA[0], {"question": "who is  Anna BROOK", "answers": ["a"]}])
    evaluated = write(tmp_path / "dev.jsonl", [QA[1], QA[2], {"question": "Who is Anna Brook ", "answers": ["b"]}])
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"training file {train} and evaluation file {evaluated} share 1 of the evaluation file's 3 "
            "examples (the same question text; e.g. train id '1' = eval id '2')"
        ),
    ):
        qa_config(train, evaluated)
    assert qa_config(train, write(tmp_path / "dev.jsonl", QA[1:])).task.eval_data == [str(evaluated)]


def test_a_recipe_file_is_named_and_a_second_pair_counted(tmp_path):
    data = write(tmp_path / "qa.jsonl", QA)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"task:\n  name: qa\n  train_data: [{data}]\n  eval_data: [{data}, {data}]\n")
    with pytest.raises(ConfigError, match=re.escape(f"{recipe}: training file {data}")) as error:
        load_config(recipe)
    assert "; and 1 more file pair(s). Scores" in str(error.value)


def test_allow_overlap_loads_with_a_warning(tmp_path, caplog):
    data = write(tmp_path / "qa.jsonl", QA)
    with caplog.at_level(logging.WARNING, logger="atlas.config"):
        config = qa_config(data, data, "task.allow_overlap=true")
    assert config.task.allow_overlap
    assert caplog.messages == [
        (
            f"task.allow_overlap is set: training file {data} and evaluation file {data} (the "
            "same file) share 3 of the evaluation file's 3 examples (the same question text; "
            "e.g. train id '0' = eval id '0', train id '1' = eval id '1', train id '2' = eval "
            "id '2')"
        )
    ]


def test_missing_files_are_left_to_the_run_and_a_bad_record_is_reported_at_load(tmp_path):
    assert qa_config(tmp_path / "absent.jsonl", tmp_path / "absent.jsonl").task.name == "qa"
    bad = tmp_path / "dev.jsonl"
    bad.write_text(json.dumps(QA[0]) + "\n" + '{"question": 7}\n')
    with pytest.raises(InputError, match=re.escape(f"{bad}:2: field 'question': expected a string, got int")):
        qa_config(write(tmp_path / "train.jsonl", QA[1:]), bad)


def test_mmlu_splits_share_five_questions_as_published(shared_data, monkeypatch, caplog):
    """MMLU's dev and test hold 5 questions word for word (across two medical subjects): the multitask
    recipes allow them explicitly, and the check refuses them otherwise."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    with pytest.raises(
        ConfigError,
        match=r"share 5 of the evaluation file's 14042 examples \(the same question "
        r"text; e\.g\. train id 'college_medicine_dev:5' = eval id "
        r"'clinical_knowledge_test:57'",
    ):
        load_config("configs/small/mmlu-5shot-multitask.yaml", ["task.allow_overlap=false"])
    with caplog.at_level(logging.WARNING, logger="atlas.config"):
        load_config("configs/small/mmlu-5shot-multitask.yaml")
    assert len(caplog.messages) == 1 and "share 5 of" in caplog.messages[0]


KILT_TRAIN = {
    "id": "t1",
    "input": "what is the capital of zorbland",
    "output": [{"answer": "Quimper", "provenance": [{"wikipedia_id": "1"}]}],
}


@pytest.mark.parametrize(
    ("record", "field", "message"),
    [
        (
            {"id": "d2", "input": "who first climbed mount olo", "output": [{"answer": "Anna Brook"}]},
            "output[].provenance",
            (
                "no provenance in any output: R-precision, recall@k and the KILT- scores compare "
                "the retrieved pages with the record's gold pages; give them, or set "
                "task.options.provenance_metrics=false "
                "to score the answers only"
            ),
        ),
        (
            {
                "id": "d2",
                "input": "who first climbed mount olo",
                "output": [{"answer": "Anna Brook", "provenance": [{"wikipedia_id": "2"}, {"title": "Olo"}]}],
            },
            "output[0].provenance[1].wikipedia_id",
            "missing: each provenance entry names its Wikipedia page",
        ),
    ],
)
def test_a_kilt_evaluation_record_without_provenance_names_file_line_and_field(tmp_path, record, field, message):
    train = write(tmp_path / "nq-train-kilt.jsonl", [KILT_TRAIN])
    good = {
        "id": "d1",
        "input": "what is the currency of tarsia",
        "output": [{"answer": "florin", "provenance": [{"wikipedia_id": "3"}]}],
    }
    evaluated = write(tmp_path / "nq-dev-kilt.jsonl", [good, record])
    overrides = ["task.name=kilt", f"task.train_data=[{train}]", f"task.eval_data=[{evaluated}]"]
    with pytest.raises(InputError) as error:
        load_config(None, overrides)
    assert str(error.value) == f"{evaluated}:2: field '{field}': {message}"
    # scored without provenance metrics, or closed-book, it loads; an unlabelled record is not checked
    assert load_config(None, [*overrides, "task.options.provenance_metrics=false"]).task.name == "kilt"
    assert load_config(None, [*overrides, "task.closed_book=true"]).task.closed_book
    write(evaluated, [good, {"id": "d3", "input": "an unlabelled question"}])
    assert load_config(None, overrides).task.eval_data == [str(evaluated)]
