"""MMLU (and any 4-way multiple choice): loading, the four few-shot settings, and scoring.

Inputs: the original headerless CSV (`question,A,B,C,D,answer`; `<subject>_<split>.csv` in
`dev/`, `val/`, `test/` folders: a folder, one CSV, or the data root with `--split`), or JSON lines
`{"question", "options": {"A": …}, "answer": "B", "subject"?, "id"?}`.
Metrics: accuracy (the reader's letter on the original option order) and, when aggregated
letter probabilities are given, de-biased accuracy (argmax of the probabilities averaged over
option permutations, see `tasks.multiple_choice`), each overall (per question), per category and
per subject, in percent.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

from common.io import InputError, read_jsonl, require_str
from tasks.base import Example, Task, check_lengths, register_task
from tasks.metrics import percent
from tasks.mmlu_subjects import CATEGORIES, subject_category
from tasks.multiple_choice import (
    DEFAULT_QUERY_TEMPLATE,
    DEFAULT_TARGET_TEMPLATE,
    PERMUTATION_MODES,
    multiple_choice_query,
    multiple_choice_target,
    parse_letter,
    permute,
    predict_letter,
)
from tasks.passage import Passage

LETTERS = ("A", "B", "C", "D")
SPLITS = ("dev", "val", "test", "train", "auxiliary_train")
SETTINGS = ("zero-shot", "5-shot", "5-shot-multitask", "full")


def _subject_and_split(path: Path) -> tuple[str, str]:
    stem = path.stem
    for split in SPLITS:
        if stem.endswith("_" + split):
            return stem[: -len(split) - 1], split
    return stem, path.parent.name


def _csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """`(first line of the row, row)` for each non-blank row of a CSV file (fields may span lines)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            start = 1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as error:
                    raise InputError(path, reader.line_num, None, f"invalid CSV: {error}") from None
                if row:
                    yield start, row
                start = reader.line_num + 1
    except UnicodeDecodeError as error:
        raise InputError(path, None, None, f"invalid UTF-8 ({error.reason})") from None


@register_task("mmlu")
class MMLUTask(Task):
    """Four-way multiple choice with MMLU's files, prompts, permutations and category metrics."""

    cites_passages = False  # its answer is a label, not words of a passage

    metrics = ("accuracy", "debiased_accuracy")
    answer_field = "answer"
    default_options: ClassVar[dict[str, Any]] = {
        "query_template": DEFAULT_QUERY_TEMPLATE,
        "target_template": DEFAULT_TARGET_TEMPLATE,
        "train_permutations": "all",
        "eval_permutations": "cyclic",
        "split": "test",  # the folder read when the path given is the MMLU data root
    }

    def __init__(self, **options: Any):
        super().__init__(**options)
        for key in ("train_permutations", "eval_permutations"):
            if self.options[key] not in PERMUTATION_MODES:
                raise ValueError(f"unknown {key} '{self.options[key]}'; valid: {', '.join(PERMUTATION_MODES)}")
        multiple_choice_query("q", dict(zip(LETTERS, "abcd")), self.options["query_template"])
        multiple_choice_target("A", self.options["target_template"])

    def iter_records(
        self, path: str | os.PathLike, on_error: Callable[[InputError], None] | None = None
    ) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """Records of a CSV or JSONL file, or of every such file in a folder (sorted by name)."""
        path = Path(path)
        if path.is_dir() and (path / self.options["split"]).is_dir():
            path = path / self.options["split"]
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".csv", ".jsonl"))
            if not files:
                raise InputError(path, None, None, "no .csv or .jsonl files in this folder")
        elif path.exists():
            files = [path]
        else:
            raise InputError(path, None, None, "file not found")
        for file in files:
            subject, split = _subject_and_split(file)
            if file.suffix == ".csv":
                for line, row in _csv_rows(file):
                    record: dict[str, Any] = {
                        "subject": subject,
                        "split": split,
                        "id": f"{file.stem}:{line}",
                    }
                    if len(row) == 6:
                        record.update(question=row[0], options=dict(zip(LETTERS, row[1:5])), answer=row[5])
                    else:
                        record["bad_row"] = row  # reported by parse_record (skippable)
                    yield str(file), line, record
            else:
                for line, record in read_jsonl(file, on_error):
                    record.setdefault("subject", subject)
                    record.setdefault("split", split)
                    record.setdefault("id", f"{file.stem}:{line}")
                    yield str(file), line, record

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example:
        """`{question, options{A..D}, answer}` → Example with the MMLU prompt and target."""
        if "bad_row" in record:
            raise InputError(
                path,
                line,
                "row",
                f"expected 6 columns (question,A,B,C,D,answer), got {len(record['bad_row'])}",
            )
        question = require_str(record, "question", path, line)
        if not question.strip():
            raise InputError(path, line, "question", "the question is empty")
        options = record.get("options")
        if not isinstance(options, dict) or sorted(options) != list(LETTERS):
            raise InputError(path, line, "options", f"expected an object with keys {', '.join(LETTERS)}")
        for letter in LETTERS:
            if not isinstance(options[letter], (str, int, float)) or isinstance(options[letter], bool):
                raise InputError(path, line, f"options.{letter}", "expected a string")
        options = {letter: str(options[letter]) for letter in LETTERS}
        answers: list[str] = []
        if record.get("answer") is not None:
            answer = require_str(record, "answer", path, line).strip()
            if answer not in LETTERS:
                raise InputError(path, line, "answer", f"{answer!r} is not a letter; valid: {', '.join(LETTERS)}")
            answers = [answer]
        subject = require_str(record, "subject", path, line, optional=True)
        metadata = {
            "question": question,
            "subject": subject,
            "category": subject_category(subject),
            "split": require_str(record, "split", path, line, optional=True),
            "query_template": self.options["query_template"],
            "target_template": self.options["target_template"],
        }
        return Example(
            id=require_str(record, "id", path, line),
            query=multiple_choice_query(question, options, self.options["query_template"]),
            target=multiple_choice_target(answers[0], self.options["target_template"]) if answers else None,
            answers=answers,
            options=options,
            metadata=metadata,
        )

    def training_examples(self, examples: list[Example]) -> list[Example]:
        """Every training example under each ordering of the `train_permutations` option."""
        mode = self.options["train_permutations"]
        return [permuted for example in examples for permuted in permute(example, mode)]

    def eval_presentations(self, example: Example) -> list[Example]:
        """The presentations of one eval question (`eval_permutations`; identity first).

        Score each, then `tasks.multiple_choice.aggregate(presentations, letter_probs)`.
        """
        return permute(example, self.options["eval_permutations"])

    def postprocess(self, example: Example, prediction: str) -> str:
        """The option letter named by the generated text, or "" where it names none."""
        return parse_letter(prediction, sorted(example.options or {})) or ""

    def evaluate(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
        letter_probs: list[dict[str, float]] | None = None,
    ) -> dict[str, float]:
        """Accuracy (and de-biased accuracy from `letter_probs`) overall, per category, per subject.

        `predictions` are the reader's outputs on the original option order (a letter, or text
        naming one); `letter_probs[i]` are example i's de-biased probabilities of the original
        letters (`tasks.multiple_choice.aggregate`). Keys: `accuracy`, `accuracy/<category>`,
        `accuracy/subject/<subject>`, and the same with `debiased_accuracy`, in percent. Overall and
        category figures are per-question averages. `retrieved` is not used.
        """
        check_lengths(examples, predictions)
        if letter_probs is not None and len(letter_probs) != len(examples):
            raise ValueError(f"{len(letter_probs)} probability dicts for {len(examples)} examples")
        kinds = {"accuracy": [self.postprocess(e, p) for e, p in zip(examples, predictions)]}
        if letter_probs is not None:
            kinds = {"debiased_accuracy": [predict_letter(p) for p in letter_probs], **kinds}
        for example in examples:
            if not example.answers:
                raise ValueError(f"example '{example.id}' has no gold answer to score against")
        result: dict[str, float] = {}
        for kind, letters in kinds.items():
            correct = [float(letter == e.answers[0]) for e, letter in zip(examples, letters)]
            result[kind] = percent(correct)
            for category in CATEGORIES:
                chosen = [c for c, e in zip(correct, examples) if e.metadata.get("category") == category]
                if chosen:
                    result[f"{kind}/{category}"] = percent(chosen)
            by_subject: dict[str, list[float]] = {}
            for c, e in zip(correct, examples):
                by_subject.setdefault(e.metadata.get("subject") or "unknown", []).append(c)
            for subject in sorted(by_subject):
                result[f"{kind}/subject/{subject}"] = percent(by_subject[subject])
        return result


def build_train_sets(
    setting: str, data_dir: str | os.PathLike, task: MMLUTask | None = None
) -> dict[str, list[Example]]:
    """The training set(s) of an MMLU setting: {run name: training examples}.

    - `zero-shot`: {"all": []} (no training);
    - `5-shot`: one run per subject, {subject: its 5 `dev` examples} (Atlas trains one model each);
    - `5-shot-multitask`: {"all": every `dev` example (285)};
    - `full`: {"all": `auxiliary_train` + `dev`} (the auxiliary_train folder of the MMLU release).
    """
    task = task or MMLUTask()
    data_dir = Path(data_dir)
    if setting == "zero-shot":
        return {"all": []}
    if setting == "5-shot":
        runs: dict[str, list[Example]] = {}
        for example in task.load(data_dir / "dev"):
            runs.setdefault(example.metadata["subject"], []).append(example)
        return runs
    if setting == "5-shot-multitask":
        return {"all": task.load(data_dir / "dev")}
    if setting == "full":
        auxiliary = data_dir / "auxiliary_train"
        if not auxiliary.is_dir():
            raise InputError(auxiliary, None, None, "the 'full' setting needs the MMLU auxiliary_train folder")
        return {"all": task.load(auxiliary) + task.load(data_dir / "dev")}
    raise ValueError(f"unknown MMLU setting '{setting}'; valid: {', '.join(SETTINGS)}")
