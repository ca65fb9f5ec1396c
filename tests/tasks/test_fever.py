"""FEVER `{claim, label}` adapter."""

from __future__ import annotations

import pytest

from common.io import InputError
from tasks import get_task


def test_labels_targets_and_accuracy(tmp_path, write_jsonl):
    path = write_jsonl(
        tmp_path / "fever.jsonl",
        [
            {"id": 7, "claim": "Paris is in France.", "label": "SUPPORTS"},
            {"claim": "Paris is in Peru.", "label": "REFUTES"},
            {"claim": "Paris is nice.", "label": "NOT ENOUGH INFO"},
            {"claim": "Paris is big.", "label": "true"},
        ],
    )
    task = get_task("fever")
    examples = task.load(path)
    assert [e.id for e in examples] == ["7", "1", "2", "3"]
    assert [e.answers for e in examples] == [["true"], ["false"], ["maybe"], ["true"]]
    assert examples[0].query == "question: Paris is in France. answer: <extra_id_0>"
    assert examples[2].target == "<extra_id_0> maybe"
    scores = task.evaluate(examples, ["<extra_id_0> true", " False", "false", ""])
    assert scores == {"accuracy": 50.0}  # percent


def test_unknown_label(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "fever.jsonl", [{"claim": "c", "label": "SUPPORT"}])
    with pytest.raises(InputError, match=r"fever\.jsonl:1: field 'label': unknown label 'SUPPORT'; valid: SUPPORTS"):
        get_task("fever").load(path)
