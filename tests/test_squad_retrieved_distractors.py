"""tools/squad_retrieved_distractors.py: each question's highest-scored other paragraphs, best first, never
its own, written as reading-task records that the task reads back."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from tasks.base import get_task

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "squad_retrieved_distractors", REPO / "tools" / "squad_retrieved_distractors.py"
)
tool = importlib.util.module_from_spec(_spec)
sys.modules["squad_retrieved_distractors"] = tool
_spec.loader.exec_module(tool)


def test_the_highest_scored_others_best_first_the_gold_left_out():
    paragraphs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0]])
    questions = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 0.1]])
    gold = torch.tensor([0, 2, 2])
    # scores by hand: q0 = q2 = [1, .1, .77, -1]; q1 = [.1, 1, .77, -.1]
    assert tool.retrieved_distractors(questions, paragraphs, gold, 2, block=2) == [[2, 1], [1, 0], [0, 1]]


def test_the_file_reads_back_as_the_gold_among_its_retrieved_paragraphs(tmp_path, tiny_encoder_path):
    contexts = [
        "The Normans gave their name to Normandy, a region in France.",
        "Rollo was the first ruler of the Normans and signed a treaty in 911.",
        "Norman architecture is known for its round arches.",
        "The Panthers lost Super Bowl 50 to the Broncos.",
    ]
    squad = {
        "data": [
            {
                "title": "Normans",
                "paragraphs": [
                    {
                        "context": c,
                        "qas": [
                            {
                                "id": f"q{n}",
                                "question": f"What about {c.split()[1]}?",
                                "answers": [{"text": c.split()[1], "answer_start": len(c.split()[0]) + 1}],
                            }
                        ],
                    }
                    for n, c in enumerate(contexts)
                ],
            }
        ]
    }
    source, out = tmp_path / "squad.json", tmp_path / "k3.jsonl"
    source.write_text(json.dumps(squad))
    assert tool.main([str(source), str(out), "--distractors", "2", "--encoder", str(tiny_encoder_path)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["q0", "q1", "q2", "q3"]
    for record in records:
        listed = [d["text"] for d in record["distractors"]]
        assert len(listed) == 2 and record["context"] not in listed and set(listed) <= set(contexts)
    examples = get_task("reading", distractors=2).load(out)
    assert all(len(e.passages) == 3 for e in examples)
    assert [e.answers for e in examples] == [[c.split()[1]] for c in contexts]
