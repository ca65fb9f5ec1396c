"""Score a prediction file against a gold file with the task's own metrics (`atlas score`).

The metrics are those `atlas evaluate` writes: the project's names, in percent
(`tasks.metrics.METRIC_NAMES`), primary metric first.
- `kilt`: both files in KILT's formats; KILT's official downstream + retrieval metrics (× 100, the
  project's names), or with `official=True` the official scorers' own report (their keys, [0, 1]).
- `qa`, `fever`, pretext tasks: prediction lines `{"id" | "question", "answer" | "prediction"}`
  (`question` matches the gold question text when the line has no id).
- `mmlu`: prediction lines `{"id", "prediction": "B"}` (ids as the `mmlu` task assigns them,
  `<file stem>:<line>`), optionally with the de-biased probabilities of the original options,
  `"probabilities": {"A": …}` (as `atlas evaluate` writes them in predictions.jsonl) or
  `"probs"`, which adds the de-biased accuracy. `atlas evaluate`'s own predictions.jsonl scores
  to the metrics it printed.
Every gold example needs exactly one prediction: missing, duplicate and unknown ids are errors,
and gold answers (`check_labelled`, also what `atlas evaluate` checks before predicting).
"""

from __future__ import annotations

import os
from typing import Any

from common.io import InputError, read_jsonl
from tasks.base import Example, get_task
from tasks.kilt import KILT_DATASETS, KiltTask
from tasks.kilt_scoring import DEFAULT_KS, as_metrics, official_report, score_kilt_files

# Where a prediction line may carry the de-biased letter probabilities (MMLU): the name
# `atlas evaluate` writes, and the short form.
PROBABILITY_KEYS = ("probabilities", "probs")


def _prediction_text(record: dict, path, line: int) -> str:
    for key in ("prediction", "answer"):
        if key in record:
            value = record[key]
            if isinstance(value, list) and len(value) == 1:
                value = value[0]
            if not isinstance(value, str):
                raise InputError(path, line, key, "expected a string")
            return value
    raise InputError(path, line, "prediction", "missing required field (or 'answer')")


def _match_predictions(
    examples: list[Example], pred_path: str | os.PathLike, gold_path: str | os.PathLike
) -> tuple[list[str], list[dict[str, float]] | None]:
    """One prediction (and optional letter probabilities) per gold example, in gold order."""
    by_id = {example.id: n for n, example in enumerate(examples)}
    by_question: dict[str, int] = {}
    for n, example in enumerate(examples):
        by_question.setdefault(example.metadata.get("question", ""), n)
    predictions: list[str | None] = [None] * len(examples)
    probs: list[dict[str, float] | None] = [None] * len(examples)
    where: dict[int, int] = {}
    for line, record in read_jsonl(pred_path):
        if "id" in record:
            key = str(record["id"]).strip()
            if key not in by_id:
                raise InputError(pred_path, line, "id", f"id '{key}' is not in the gold file {gold_path}")
            n = by_id[key]
        elif isinstance(record.get("question"), str):
            if record["question"] not in by_question:
                raise InputError(pred_path, line, "question", f"question not in the gold file {gold_path}")
            n = by_question[record["question"]]
        else:
            raise InputError(pred_path, line, "id", "missing required field (or 'question')")
        if n in where:
            raise InputError(
                pred_path,
                line,
                "id",
                f"second prediction for '{examples[n].id}' (first at line {where[n]})",
            )
        where[n] = line
        predictions[n] = _prediction_text(record, pred_path, line)
        keys = [key for key in PROBABILITY_KEYS if key in record]
        if len(keys) > 1:
            raise InputError(pred_path, line, keys[1], f"give either '{keys[0]}' or '{keys[1]}', not both")
        if keys:
            value = record[keys[0]]
            if (
                not isinstance(value, dict)
                or not value
                or not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in value.values())
            ):
                raise InputError(pred_path, line, keys[0], "expected an object letter → probability")
            probs[n] = {str(k): float(v) for k, v in value.items()}
    missing = [examples[n].id for n, p in enumerate(predictions) if p is None]
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise ValueError(f"{pred_path}: no prediction for {len(missing)} gold example(s): {shown}")
    with_probs = sum(p is not None for p in probs)
    if 0 < with_probs < len(examples):
        raise ValueError(
            f"{pred_path}: letter probabilities ('probabilities' or 'probs') given for "
            f"{with_probs} of {len(examples)} predictions"
        )
    return predictions, (probs if with_probs else None)  # type: ignore[return-value]


def check_labelled(task, data_path: str | os.PathLike | None, examples: list[Example]) -> None:
    """Raise unless every example has gold answers to score against: an `InputError` naming the
    file, line and the task's answer field (`Task.answer_field`) of the first that has none, or,
    for examples given without a file, a ValueError naming their ids."""
    unlabelled = [e for e in examples if not e.answers]
    if not unlabelled:
        return
    message = (
        f"no gold answer to score against ({len(unlabelled)} of {len(examples)} examples have "
        "none); an unlabelled test set is predicted without scores by `atlas evaluate … "
        "--predict-only`"
    )
    if data_path is not None:
        location = record_location(task, data_path, unlabelled[0].id)
        if location is not None:
            raise InputError(location[0], location[1], task.answer_field, message)
    shown = ", ".join(e.id for e in unlabelled[:5]) + (" …" if len(unlabelled) > 5 else "")
    raise ValueError(f"{data_path or 'the given examples'}: examples {shown}: {message}")


def record_location(task, data_path: str | os.PathLike, example_id: str) -> tuple[str, int] | None:
    """(file, line) of the record that `task.load(data_path)` turns into the example `example_id`
    (records are read again: only on the way to an error)."""
    records = task.iter_records(data_path, lambda error: None)
    for index, (source, line, record) in enumerate(records):
        try:
            example = task.parse_record(record, source, line, index)
        except InputError:  # a record that `skip_invalid` left out
            continue
        if example is not None and example.id == example_id:
            return source, line
    return None


def score_files(
    task_name: str,
    gold_path: str | os.PathLike,
    pred_path: str | os.PathLike,
    *,
    ks: tuple[int, ...] = DEFAULT_KS,
    retrieval_only: bool = False,
    official: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Metrics (percent) of the predictions in `pred_path` against `gold_path`, primary first.

    `ks`, `retrieval_only` and `official` apply to KILT (`official`: KILT's scorers' own report,
    `{"downstream": {"em", …}, "kilt": {"KILT-em", …}, "retrieval": {"Rprec", …}}` in [0, 1]);
    `options` are the task's options (e.g. `kilt_task`).
    """
    task = get_task(task_name, **options)
    if isinstance(task, KiltTask):
        scores = score_kilt_files(gold_path, pred_path, ks=ks, downstream=not retrieval_only)
        if official:
            return official_report(scores)
        metrics = as_metrics(scores)
        if retrieval_only:
            return metrics
        primary = KILT_DATASETS[task.dataset_for(gold_path)][1]
        return {primary: metrics[primary], **{k: v for k, v in metrics.items() if k != primary}}
    if retrieval_only or official:
        raise ValueError(
            f"{'retrieval_only' if retrieval_only else 'official'} scoring needs KILT files, not task '{task_name}'"
        )
    examples = task.load(gold_path)
    check_labelled(task, gold_path, examples)
    predictions, probs = _match_predictions(examples, pred_path, gold_path)
    if probs is not None:
        if task_name != "mmlu":
            raise ValueError(f"letter probabilities in predictions are only used by the mmlu task, not '{task_name}'")
        return task.evaluate(examples, predictions, letter_probs=probs)
    return task.evaluate(examples, predictions)
