"""FEVER fact verification from `{"claim", "label"}` records: the label becomes true/false/maybe.

(The native KILT FEVER file, `{"id", "input", "output": [{"answer": "SUPPORTS"}]}`, is read by
the `kilt` task and written back with the KILT labels.)
"""

from __future__ import annotations

from typing import Any, ClassVar

from common.io import InputError, require_str
from tasks.base import Example, Task, check_lengths, format_template, register_task
from tasks.metrics import percent
from tasks.passage import Passage

# FEVER's three labels and the words the reader is trained to generate for them.
LABEL_TO_WORD = {"SUPPORTS": "true", "REFUTES": "false", "NOT ENOUGH INFO": "maybe"}
WORD_TO_LABEL = {word: label for label, word in LABEL_TO_WORD.items()}


@register_task("fever")
class FeverTask(Task):
    """Claim verification; metric: accuracy (the generated word equals the gold word)."""

    cites_passages = False  # its answer is a label, not words of a passage

    metrics = ("accuracy",)
    answer_field = "label"
    default_options: ClassVar[dict[str, Any]] = {
        "query_template": "question: {claim} answer: <extra_id_0>",
        "target_template": "<extra_id_0> {answer}",
    }

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example:
        """`{claim, label, id?}` → Example with answers `[true|false|maybe]` (label optional)."""
        claim = require_str(record, "claim", path, line).strip()
        if not claim:
            raise InputError(path, line, "claim", "the claim is empty")
        answers: list[str] = []
        if record.get("label") is not None:
            label = require_str(record, "label", path, line).strip()
            if label in LABEL_TO_WORD:
                word = LABEL_TO_WORD[label]
            elif label.lower() in WORD_TO_LABEL:
                word = label.lower()
            else:
                valid = ", ".join([*LABEL_TO_WORD, *WORD_TO_LABEL])
                raise InputError(path, line, "label", f"unknown label {label!r}; valid: {valid}")
            answers = [word]
        example_id = require_str(record, "id", path, line) if "id" in record else str(index)
        query = format_template(self.options["query_template"], "query_template", claim=claim)
        target = None
        if answers:
            target = format_template(self.options["target_template"], "target_template", answer=answers[0])
        return Example(id=example_id, query=query, target=target, answers=answers, metadata={"claim": claim})

    def evaluate(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, float]:
        """Accuracy in percent: the generated word, stripped and lower-cased, is the gold word."""
        check_lengths(examples, predictions)
        correct = []
        for example, prediction in zip(examples, predictions):
            if not example.answers:
                raise ValueError(f"example '{example.id}' has no label to score against")
            answer = self.postprocess(example, prediction).lower()
            correct.append(float(answer == example.answers[0]))
        return {"accuracy": percent(correct)}
