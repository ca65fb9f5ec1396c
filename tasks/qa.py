"""Open-domain QA: NaturalQuestions-open, TriviaQA and any `{question, answers}` file.

Accepted record forms (one JSON object per line):
- `{"question", "answers": [...]}` (FiD / Atlas),
- `{"question", "answer": [...]}` (NQ-open's own files; a single string is accepted too),
- `{"context": "Question: …\\nAnswer:", "answer", "aliases": [...]}` (TriviaQA as packaged by
  llm-foundry): the question is cut out of the context, the answers are answer + aliases.
An `"id"` field is used where present, else the 0-based record index. Metrics: exact match and
F1 with SQuAD normalisation, maximised over the gold answers, in percent.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from common.io import InputError, require_str
from tasks.base import (
    Example,
    Task,
    check_lengths,
    format_template,
    register_task,
)
from tasks.metrics import max_exact_match, max_f1, percent
from tasks.passage import Passage

_TRIVIAQA_PREFIX = "Question:"
_TRIVIAQA_SUFFIX = "Answer:"


def _string_list(record: dict, key: str, path: str, line: int) -> list[str]:
    value = record[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(path, line, key, "expected a string or a list of strings")
    return value


def _question_from_context(context: str, path: str, line: int) -> str:
    text = context.strip()
    if not text.startswith(_TRIVIAQA_PREFIX) or not text.endswith(_TRIVIAQA_SUFFIX):
        raise InputError(path, line, "context", "expected the form 'Question: …\\nAnswer:' (TriviaQA)")
    question = text[len(_TRIVIAQA_PREFIX) : len(text) - len(_TRIVIAQA_SUFFIX)].strip()
    if not question:
        raise InputError(path, line, "context", "the question is empty")
    return question


@register_task("qa")
class QATask(Task):
    """Question answering with EM / F1 (SQuAD normalisation, max over gold answers)."""

    metrics = ("exact_match", "f1")
    default_options: ClassVar[dict[str, Any]] = {
        "query_template": "question: {question} answer: <extra_id_0>",
        "target_template": "<extra_id_0> {answer}",
    }

    def __init__(self, **options: Any):
        super().__init__(**options)
        # Fail at construction, not at the first example, on a template with a wrong placeholder.
        format_template(self.options["query_template"], "query_template", question="q")
        format_template(self.options["target_template"], "target_template", answer="a")

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example:
        """One QA record (any of the accepted forms) → Example; target = the first answer."""
        if "question" in record:
            if not isinstance(record["question"], str):  # an id-like number is not a question
                raise InputError(path, line, "question", f"expected a string, got {type(record['question']).__name__}")
            question = record["question"].strip()
            if not question:
                raise InputError(path, line, "question", "the question is empty")
        elif "context" in record:
            question = _question_from_context(require_str(record, "context", path, line), path, line)
        else:
            raise InputError(path, line, "question", "missing required field (or 'context')")
        answers: list[str] = []
        if "answers" in record:
            answers = _string_list(record, "answers", path, line)
        elif "answer" in record:
            answers = _string_list(record, "answer", path, line)
        if "aliases" in record:
            answers = answers + _string_list(record, "aliases", path, line)
        answers = list(dict.fromkeys(answers))  # without repeats, in order
        if ("answers" in record or "answer" in record) and not answers:
            raise InputError(path, line, "answers", "the list of answers is empty")
        example_id = require_str(record, "id", path, line) if "id" in record else str(index)
        return Example(
            id=example_id,
            query=self.query(question),
            target=self.target(answers[0]) if answers else None,
            answers=answers,
            metadata={"question": question},
        )

    def query(self, question: str) -> str:
        """The reader input for `question`."""
        return format_template(self.options["query_template"], "query_template", question=question)

    def target(self, answer: str) -> str:
        """The target text for `answer`."""
        return format_template(self.options["target_template"], "target_template", answer=answer)

    def train_target(self, example: Example, rng: random.Random) -> str:
        """A gold answer drawn at random for each presentation (as FiD and Atlas do)."""
        if not example.answers:
            raise ValueError(f"example '{example.id}' has no answers to train on")
        return self.target(rng.choice(example.answers))

    def evaluate(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, float]:
        """Exact match and F1 over the examples, in percent; `retrieved` is not used."""
        check_lengths(examples, predictions)
        em_scores, f1_scores = [], []
        for example, prediction in zip(examples, predictions):
            if not example.answers:
                raise ValueError(f"example '{example.id}' has no gold answers to score against")
            answer = self.postprocess(example, prediction)
            em_scores.append(max_exact_match(answer, example.answers))
            f1_scores.append(max_f1(answer, example.answers))
        return {"exact_match": percent(em_scores), "f1": percent(f1_scores)}
