"""The task interface: an `Example`, the `Task` base class, and the one task registry.

A task turns raw records into `Example`s (query text for the reader, target text, gold
answers) and scores predictions with the benchmark's own metric. Adding a task = adding one
module that defines a `Task` subclass decorated with `@register_task("name")` and importing it
in `tasks/__init__.py`.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from common.io import InputError, read_jsonl
from tasks.passage import Passage

logger = logging.getLogger(__name__)


@dataclass
class Example:
    """One task instance, ready for the reader.

    `query` is the reader's input text (the passages are appended by the reader), `target` the
    training target text (None where unknown), `answers` the gold answers used for scoring,
    `passages` passages given with the example (None: retrieve them), `options` the choices of
    a multiple-choice question (letter → text), `source_id` the id of the corpus passage the
    example was made from (pretext tasks: retrieving it would be trivial, so it is filtered out),
    `evidence` a passage known to hold the answer (pretext tasks that teach reading): it is read
    as given, in place of its own retrieved copy, or of the last passage retrieved where the
    search missed it. Passages given as dicts (`{id, title, text, ...}`, as data files hold
    them) become `Passage` records here, where examples are made.
    """

    id: str
    query: str
    target: str | None
    answers: list[str]
    passages: list[Passage] | None = None
    options: dict[str, str] | None = None
    source_id: str | None = None
    evidence: Passage | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the boundary where dict passages (data files, callers' own examples) become records
        if self.passages is not None:
            self.passages = [p if isinstance(p, Passage) else Passage.from_record(p) for p in self.passages]
        if self.evidence is not None and not isinstance(self.evidence, Passage):
            self.evidence = Passage.from_record(self.evidence)


class Task:
    """Base class of task adapters.

    Subclasses set `metrics` (the primary metric first) and `default_options`, and implement
    `parse_record` (one raw record → an Example) and `evaluate`; `@register_task(name)` gives a
    task its `name`. The optional hooks (`query`, `eval_presentations`, `provenance` with
    `has_provenance`) have defaults that suit a task without the feature; a task overrides those
    it has.
    """

    name: ClassVar[str] = ""  # set by `register_task`
    metrics: ClassVar[tuple[str, ...]] = ()
    default_options: ClassVar[dict[str, Any]] = {}
    # the record field that holds the gold answers (named by the error for an example without them)
    answer_field: ClassVar[str] = "answers"
    # whether `provenance` is implemented: the task writes its own predictions file with the pages
    # of the passages read (KILT); evaluation writes it only then
    has_provenance: ClassVar[bool] = False
    # whether an answer is words a passage may hold, so that it is cited where it stands (`tasks.citations`); a
    # task whose answers are labels (an option letter, true/false) cites nothing
    cites_passages: ClassVar[bool] = True

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            valid = ", ".join(sorted(self.default_options)) or "(none)"
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for task '{self.name}'; valid: {valid}")
        self.options: dict[str, Any] = {**self.default_options, **options}

    # ---------------------------------------------------------------- loading

    def iter_records(
        self, path: str | os.PathLike, on_error: Callable[[InputError], None] | None = None
    ) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """Yield `(file, line_number, raw_record)` from `path` (JSON lines unless overridden).

        `file` is the file the record came from (a task may read a folder of files); unreadable
        lines go to `on_error` where given (else they raise).
        """
        for line, record in read_jsonl(path, on_error):
            yield str(path), line, record

    def parse_record(self, record: dict[str, Any], path: str, line: int, index: int) -> Example | None:
        """Turn one raw record into an Example; raise `InputError(path, line, field, ...)`.

        None means a valid record this task has no use for (e.g. a passage with no section for
        the `section` pretext task); it is counted and left out.
        """
        raise NotImplementedError

    def load(self, path: str | os.PathLike, *, skip_invalid: bool = False) -> list[Example]:
        """Read every example of `path`.

        A malformed record raises `common.io.InputError` naming the file, the line and the field;
        with `skip_invalid` it is logged and skipped instead (file-level errors still raise).
        Example ids must be unique within the file.
        """
        examples: list[Example] = []
        seen: dict[str, str] = {}
        skipped = unused = 0

        def skip(error: InputError) -> None:
            nonlocal skipped
            skipped += 1
            logger.warning("skipping invalid record: %s", error)

        records = self.iter_records(path, skip if skip_invalid else None)
        for index, (source, line, record) in enumerate(records):
            try:
                example = self.parse_record(record, source, line, index)
                if example is None:
                    unused += 1
                    continue
                if example.id in seen:
                    raise InputError(
                        source,
                        line,
                        "id",
                        f"duplicate id '{example.id}' (first at {seen[example.id]})",
                    )
            except InputError as error:
                if not skip_invalid:
                    raise
                skip(error)
                continue
            seen[example.id] = f"{source}:{line}"
            examples.append(example)
        if unused:
            logger.info("%s: %d record(s) not usable by task '%s'", path, unused, self.name)
        if skipped:
            logger.warning("%s: skipped %d invalid record(s), kept %d", path, skipped, len(examples))
        return examples

    # ---------------------------------------------------------------- optional hooks

    def query(self, question: str) -> str:
        """The reader input for a bare question typed by a user (`atlas ask`, `atlas serve`).

        Default: the question itself. A task whose examples wrap their question in a template
        (QA: `query_template`) overrides it, so that a typed question reads as its examples do.
        """
        return question

    def eval_presentations(self, example: Example) -> list[Example]:
        """The presentations of a multiple-choice example scored at evaluation, the example as
        given first; their option probabilities are averaged back onto its options.

        Default: the example alone. A task that de-biases by permuting the options (MMLU) overrides it.
        """
        return [example]

    def provenance(self, passages: list[Passage]) -> list[dict]:
        """The task's provenance entries for the passages read for one example (in rank order),
        written beside the predictions in the task's own format.

        Only a task with `has_provenance = True` implements it (KILT: `{wikipedia_id, title}` of
        each page); the default raises `NotImplementedError`.
        """
        raise NotImplementedError(f"task '{self.name}' writes no provenance (has_provenance is False)")

    # ---------------------------------------------------------------- training

    def train_target(self, example: Example, rng: random.Random) -> str:
        """The target text for one training presentation (default: the example's target)."""
        if example.target is None:
            raise ValueError(f"example '{example.id}' has no target to train on")
        return example.target

    def training_examples(self, examples: list[Example]) -> list[Example]:
        """The training set built from loaded examples (default: unchanged; MMLU permutes)."""
        return examples

    def training_pair(self, example: Example, rng: random.Random) -> tuple[str, str]:
        """`(query, target)` for one training presentation; pretext tasks re-noise the query."""
        return example.query, self.train_target(example, rng)

    # ---------------------------------------------------------------- scoring

    def postprocess(self, example: Example, prediction: str) -> str:
        """Turn the reader's generated text into the answer that is scored and written out."""
        return strip_sentinels(prediction)

    def evaluate(
        self,
        examples: list[Example],
        predictions: list[str],
        *,
        retrieved: list[list[Passage]] | None = None,
    ) -> dict[str, float]:
        """Score `predictions` (one per example, raw generated text) → metrics, primary first.

        `retrieved` (per example, the retrieved passages) is used by tasks that score
        provenance (KILT); the others ignore it.
        """
        raise NotImplementedError


def strip_sentinels(text: str) -> str:
    """Drop T5 sentinel tokens (`<extra_id_N>`) and the pad/eos markers, then strip spaces."""
    return " ".join(re.sub(r"<extra_id_\d+>|</s>|<pad>", " ", text).split())


def check_lengths(examples: list[Example], predictions: list[str]) -> None:
    """Raise ValueError unless there is exactly one prediction per example."""
    if len(examples) != len(predictions):
        raise ValueError(f"{len(predictions)} predictions for {len(examples)} examples")


def format_template(template: str, option: str, **fields: str) -> str:
    """`template.format(**fields)`, with an error naming the option on a bad placeholder."""
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as error:
        valid = ", ".join("{" + name + "}" for name in fields)
        raise ValueError(f"bad {option} {template!r}: {error}; placeholders: {valid}") from None


@dataclass
class Overlap:
    """Examples of an evaluation file that a training file also holds (the same reader input).

    `shared` is the number of evaluation examples that are also training examples (`find_overlaps`);
    `pairs` the (training id, evaluation id) of the first few of them."""

    train_path: str
    eval_path: str
    shared: int
    eval_size: int
    pairs: list[tuple[str, str]]

    def describe(self) -> str:
        """One sentence for an error or a warning: both files, how many examples, the first ids."""
        shown = ", ".join(f"train id {a!r} = eval id {b!r}" for a, b in self.pairs)
        same = " (the same file)" if Path(self.train_path).resolve() == Path(self.eval_path).resolve() else ""
        return (
            f"training file {self.train_path} and evaluation file {self.eval_path}{same} share "
            f"{self.shared} of the evaluation file's {self.eval_size} examples (the same question "
            f"text; e.g. {shown})"
        )


def _example_key(example: Example) -> str:
    """The reader's input up to case and white space; with the pages of its own passages where the
    example brings them (reading comprehension: the same question of another page is another example)."""
    key = " ".join(example.query.casefold().split())
    if example.passages:
        key += "\n" + "\n".join(sorted({p.title for p in example.passages}))
    return key


def _example_keys(task: Task, path: str, skip_invalid: bool) -> list[tuple[str, str]]:
    return [(_example_key(e), e.id) for e in task.load(path, skip_invalid=skip_invalid)]


def find_overlaps(
    task: Task, train_paths: list[str], eval_paths: list[str], *, skip_invalid: bool = False, show: int = 3
) -> list[Overlap]:
    """Every (training file, evaluation file) pair whose examples share a reader input.

    Two examples are the same when their queries (the reader's input text: the question, with
    the options for multiple choice) are equal up to case and white space, and, for examples that
    bring their own passages, those come from the same pages (titles: SQuAD asks "What is the
    capital?" of many articles). Ids are not compared, since files without ids number their records
    from 0. Each file is read once with the task's own loader, so a malformed record raises
    `InputError` here already.
    """
    overlaps = []
    keys_of = {path: _example_keys(task, path, skip_invalid) for path in dict.fromkeys(eval_paths)}  # each read once
    for train_path in train_paths:
        train_keys: dict[str, str] = {}
        for key, example_id in _example_keys(task, train_path, skip_invalid):
            train_keys.setdefault(key, example_id)
        for eval_path in eval_paths:
            evaluated = keys_of[eval_path]
            pairs = [(train_keys[key], example_id) for key, example_id in evaluated if key in train_keys]
            if pairs:
                overlaps.append(Overlap(str(train_path), str(eval_path), len(pairs), len(evaluated), pairs[:show]))
    return overlaps


TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: add a Task subclass to `TASKS` under `name`, which becomes its `name`."""

    def decorate(cls: type[Task]) -> type[Task]:
        if name in TASKS:
            raise ValueError(f"task '{name}' is registered twice")
        cls.name = name
        TASKS[name] = cls
        return cls

    return decorate


def get_task(name: str, **options: Any) -> Task:
    """Build the task registered as `name`; an unknown name raises ValueError listing the valid.
    (Every task module is registered by then: importing `tasks.base` runs `tasks/__init__.py` first.)"""
    if name not in TASKS:
        raise ValueError(f"unknown task '{name}'; valid: {', '.join(sorted(TASKS))}")
    return TASKS[name](**options)
