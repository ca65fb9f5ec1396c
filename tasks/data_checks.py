"""Checks of a task's data files before any model is built: evaluation examples that are also training examples,
and KILT evaluation files without the gold pages their retrieval scores need. The recipe loader
(`atlas.config.validate_data`) runs them on the files a recipe names and says which file or override set them."""

from __future__ import annotations

import logging

from tasks.base import Task, find_overlaps
from tasks.kilt import KiltTask, check_provenance

logger = logging.getLogger(__name__)


class DataOverlapError(ValueError):
    """Evaluation examples that a training file also holds; the message says which files, how many and what to do."""


def check_task_data(
    task: Task,
    train: list[str],
    evaluated: list[str],
    *,
    skip_invalid: bool = False,
    allow_overlap: bool = False,
    closed_book: bool = False,
) -> None:
    """Check `task`'s evaluation files against its training files, reading them with the task's loader (so a
    malformed record is reported here, with its file and line).

    - No evaluation example may also be a training example (the same reader input, `tasks.base.find_overlaps`):
      `DataOverlapError` naming both files, how many examples they share and the first ids, unless
      `allow_overlap` (then a warning).
    - KILT evaluation files scored with retrieval need each record's gold pages (`tasks.kilt.check_provenance`):
      a record without them raises `InputError` (file, line, field).
    """
    if not evaluated:
        return
    if train:
        overlaps = find_overlaps(task, train, evaluated, skip_invalid=skip_invalid)
        if overlaps and allow_overlap:
            for overlap in overlaps:
                logger.warning("task.allow_overlap is set: %s", overlap.describe())
        elif overlaps:
            raise DataOverlapError(
                overlaps[0].describe()
                + (f"; and {len(overlaps) - 1} more file pair(s)" if len(overlaps) > 1 else "")
                + ". Scores on examples the model trained on measure nothing: use disjoint files (`atlas data "
                "split FILE --train N --out DIR` splits one file), or set task.allow_overlap: true for a run "
                "that knowingly evaluates on its training data"
            )
    if isinstance(task, KiltTask) and not closed_book and task.options["provenance_metrics"]:
        for path in evaluated:
            check_provenance(task.load(path, skip_invalid=skip_invalid))
