"""KILT scoring, equal to KILT's official `eval_downstream.py` and `eval_retrieval.py`.

Ported from the definitions in facebookresearch/KILT (`kilt/eval_downstream.py`,
`kilt/eval_retrieval.py`, master), including their quirks, so the numbers match to the last digit:
- downstream: accuracy = the stripped answer is one of the stripped gold answers (strict);
  em / f1 / rougel = SQuAD EM and F1 and `rouge` ROUGE-L F, each the max over gold answers; an
  empty predicted answer scores 0 everywhere but still counts in the denominator;
- KILT-accuracy/em/f1/rougel: the instance's downstream score counts only where its
  R-precision (on `wikipedia_id`) is exactly 1;
- R-precision: for each gold output's provenance set (its distinct page ids, R of them), the share
  of the first R *distinct* predicted pages that are in the set; the max over the gold sets;
- precision@k / recall@k / success_rate@k: each distinct gold evidence set is one point of the
  ranking, placed where its last page is retrieved (a set counts once all its pages are in);
  recall and success are reported for k > 1 only, as the official scorer does.
Differences, on purpose: a missing, duplicate or unknown prediction id, or a gold record with no
answer, is an error naming the file and line instead of a bare assertion.

`score_kilt` returns the official key names (`em`, `KILT-em`, `Rprec`, `recall@5`, …) in the
official [0, 1] scale; `official_report` groups them as the official scorers print them. What atlas
shows everywhere else is `as_metrics`: the same numbers × 100 under the project's metric names
(`tasks.metrics.METRIC_NAMES`: `exact_match`, `kilt_exact_match`, `r_precision`,
`provenance_recall@5`, …).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from common.io import InputError, read_jsonl, write_jsonl
from tasks.metrics import exact_match, f1, rouge_l

RANK_KEYS = ("wikipedia_id",)
DEFAULT_KS = (1, 5, 10, 20)
DOWNSTREAM_KEYS = ("accuracy", "em", "f1", "rougel")

# the official scorers' key → the project's metric name (the prefix of the `@k` keys)
OFFICIAL_NAMES = {
    "accuracy": "accuracy",
    "em": "exact_match",
    "f1": "f1",
    "rougel": "rouge_l",
    "KILT-accuracy": "kilt_accuracy",
    "KILT-em": "kilt_exact_match",
    "KILT-f1": "kilt_f1",
    "KILT-rougel": "kilt_rouge_l",
    "Rprec": "r_precision",
    "precision": "provenance_precision",
    "recall": "provenance_recall",
    "success_rate": "provenance_success",
}


def metric_name(official: str) -> str:
    """The project's name of an official KILT key: `em` → `exact_match`, `recall@5` →
    `provenance_recall@5`."""
    base, at, k = official.partition("@")
    if base not in OFFICIAL_NAMES:
        raise ValueError(f"unknown KILT metric {official!r}; known: {', '.join(OFFICIAL_NAMES)} (and their @k)")
    return OFFICIAL_NAMES[base] + at + k


def as_metrics(scores: dict[str, float]) -> dict[str, float]:
    """`score_kilt`'s official scores → the project's names, in percent (100 × the official
    value), in the same order."""
    return {metric_name(key): 100 * value for key, value in scores.items()}


def official_report(scores: dict[str, float]) -> dict[str, dict[str, float]]:
    """`score_kilt`'s flat scores grouped as KILT's scorers print them, official names and scale:
    `{"downstream": {accuracy, em, f1, rougel}, "kilt": {KILT-…}, "retrieval": {Rprec, …}}`
    (`downstream` and `kilt` only when the downstream metrics were computed)."""
    report: dict[str, dict[str, float]] = {}
    downstream = {k: v for k, v in scores.items() if k in DOWNSTREAM_KEYS}
    if downstream:
        report["downstream"] = downstream
        report["kilt"] = {k: v for k, v in scores.items() if k.startswith("KILT-")}
    report["retrieval"] = {k: v for k, v in scores.items() if k not in DOWNSTREAM_KEYS and not k.startswith("KILT-")}
    return report


# ----------------------------------------------------------------------------- files


def load_kilt_file(path: str | os.PathLike, *, predictions: bool) -> list[tuple[int, dict]]:
    """Read a KILT jsonl file → `[(line, record)]`, checking the fields the scorers use.

    Gold records need `id` and a non-empty `output` list of objects whose `answer` (if any) is a
    string and whose `provenance` (if any) is a list of objects. Prediction records need `id` and
    exactly one output with an `answer`.
    """
    records = []
    for line, record in read_jsonl(path):
        if not isinstance(record.get("id"), (str, int)) or isinstance(record.get("id"), bool):
            raise InputError(path, line, "id", "missing or not a string")
        outputs = record.get("output")
        if not isinstance(outputs, list) or not outputs:
            raise InputError(path, line, "output", "expected a non-empty list")
        if predictions and len(outputs) != 1:
            raise InputError(path, line, "output", f"a prediction needs exactly one output, got {len(outputs)}")
        check_outputs(outputs, path, line, prediction=predictions)
        records.append((line, record))
    return records


def check_outputs(outputs: list, path: str | os.PathLike, line: int | None, *, prediction: bool = False) -> None:
    """Raise `InputError` (file, line, field) unless each of a KILT record's `outputs` is an object whose
    `provenance` (if any) is a list of objects and whose `answer` is a string where given (gold) or is given
    (a prediction)."""
    for n, output in enumerate(outputs):
        if not isinstance(output, dict):
            raise InputError(path, line, f"output[{n}]", "expected an object")
        if prediction and "answer" not in output:
            raise InputError(path, line, "output[0].answer", "missing required field")
        if not prediction and output.get("answer") is not None and not isinstance(output["answer"], str):
            raise InputError(path, line, f"output[{n}].answer", "expected a string")
        provenance = output.get("provenance")
        if provenance is not None and (
            not isinstance(provenance, list) or not all(isinstance(p, dict) for p in provenance)
        ):
            raise InputError(path, line, f"output[{n}].provenance", "expected a list of objects")


def align_predictions(
    gold: Sequence[tuple[int, dict]],
    guess: Sequence[tuple[int, dict]],
    gold_path: str | os.PathLike = "<gold>",
    guess_path: str | os.PathLike = "<predictions>",
) -> tuple[list[dict], list[dict]]:
    """Order the predictions as the gold records; duplicate, missing or unknown ids are errors."""
    gold_lines: dict[str, int] = {}
    for line, record in gold:
        key = str(record["id"]).strip()
        if key in gold_lines:
            raise InputError(
                gold_path,
                line,
                "id",
                f"duplicate gold id '{key}' (first at line {gold_lines[key]})",
            )
        gold_lines[key] = line
    by_id: dict[str, tuple[int, dict]] = {}
    for line, record in guess:
        key = str(record["id"]).strip()
        if key in by_id:
            raise InputError(
                guess_path,
                line,
                "id",
                f"duplicate prediction id '{key}' (first at line {by_id[key][0]})",
            )
        if key not in gold_lines:
            raise InputError(guess_path, line, "id", f"prediction id '{key}' is not in the gold file {gold_path}")
        by_id[key] = (line, record)
    missing = [key for key in gold_lines if key not in by_id]
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise ValueError(f"{guess_path}: no prediction for {len(missing)} gold id(s): {shown}")
    return [record for _, record in gold], [by_id[str(r["id"]).strip()][1] for _, r in gold]


def write_kilt_predictions(
    path: str | os.PathLike,
    ids: Sequence[str],
    answers: Sequence[str],
    provenance_lists: Sequence[Sequence[dict[str, Any]]],
) -> int:
    """Write predictions in KILT's format, atomically; returns the number of records.

    Each line is `{"id", "output": [{"answer", "provenance": [...]}]}`; each provenance entry is
    a dict with at least `wikipedia_id` (a retrieved passage's page), e.g. also `title`, `text`.
    """
    if not (len(ids) == len(answers) == len(provenance_lists)):
        raise ValueError(
            f"ids ({len(ids)}), answers ({len(answers)}) and provenance lists ({len(provenance_lists)}) "
            f"differ in length"
        )
    records = []
    for example_id, answer, provenance in zip(ids, answers, provenance_lists):
        for n, entry in enumerate(provenance):
            if "wikipedia_id" not in entry:
                raise ValueError(f"id '{example_id}': provenance[{n}] has no 'wikipedia_id'")
        records.append({"id": example_id, "output": [{"answer": answer, "provenance": list(provenance)}]})
    return write_jsonl(path, records)


# ----------------------------------------------------------------------------- retrieval


def gold_answers(gold_record: dict) -> set[str]:
    """The distinct non-empty stripped answers of a gold KILT record (as the official scorer)."""
    answers = set()
    for output in gold_record["output"]:
        answer = output.get("answer")
        if answer and len(answer.strip()) > 0:
            answers.add(answer.strip())
    return answers


def _ids_lists(record: dict, rank_keys: Sequence[str]) -> list[list[str]]:
    """Per output, its provenance ids (rank keys joined by '+') without duplicates, in order."""
    ids_lists = []
    for output in record["output"]:
        ids: list[str] = []
        for provenance in output.get("provenance") or []:
            if all(key in provenance for key in rank_keys):
                item = "+".join(str(provenance[key]).strip() for key in rank_keys)
                if item not in ids:
                    ids.append(item)
        ids_lists.append(ids)
    return ids_lists


def _rank(guess: dict, gold: dict, rank_keys: Sequence[str]) -> tuple[list, int]:
    """The ranking of evidence-set points (True = a completed gold set) and the number of sets."""
    guess_ids = _ids_lists(guess, rank_keys)[0]
    if not guess_ids:
        return [], 0
    evidence_sets: list[set[str]] = []
    for output in gold["output"]:
        if "provenance" in output:
            # Official quirk: a provenance entry without a rank key contributes an id of "".
            e_set = {"+".join(str(p[key]).strip() for key in rank_keys if key in p) for p in output["provenance"]}
            if e_set not in evidence_sets:
                evidence_sets.append(e_set)
    rank: list = []
    for guess_id in guess_ids:
        guess_id = str(guess_id).strip()
        found = False
        for index, e_set in enumerate(evidence_sets):
            point = f"evidence_set:{index}"
            if guess_id in e_set:
                found = True
                if point in rank:
                    rank.remove(point)  # the set's point moves to its latest retrieved page
                e_set.remove(guess_id)
                rank.append(True if len(e_set) == 0 else point)
        if not found:
            rank.append(False)
    return rank, len(evidence_sets)


def r_precision(guess: dict, gold: dict, rank_keys: Sequence[str] = RANK_KEYS) -> float:
    """R-precision of one prediction, the max over the gold provenance sets."""
    guess_ids = _ids_lists(guess, rank_keys)[0]
    best = None
    for gold_ids in _ids_lists(gold, rank_keys):
        r = len(gold_ids)
        score = sum(1 for p in guess_ids[:r] if str(p).strip() in gold_ids) / r if r > 0 else 0
        best = score if best is None or score > best else best
    return best


def retrieval_metrics(
    gold_records: Sequence[dict],
    guess_records: Sequence[dict],
    ks: Sequence[int] = DEFAULT_KS,
    rank_keys: Sequence[str] = RANK_KEYS,
) -> dict[str, float]:
    """Rprec, precision@k (k > 0), recall@k and success_rate@k (k > 1), averaged over records.

    The records must be aligned (see `align_predictions`).
    """
    ks = sorted(int(k) for k in ks)
    if any(k <= 0 for k in ks):
        raise ValueError(f"k must be positive, got {ks}")
    totals: dict[str, float] = defaultdict(float)
    for guess, gold in zip(guess_records, gold_records):
        totals["Rprec"] += r_precision(guess, gold, rank_keys)
        rank, num_sets = _rank(guess, gold, rank_keys)  # the same for every k
        for k in ks:
            if num_sets > 0:
                top = rank[:k]
                totals[f"precision@{k}"] += top.count(True) / k
                totals[f"recall@{k}"] += top.count(True) / num_sets
                totals[f"success_rate@{k}"] += int(True in top)
    n = len(guess_records)
    result = {"Rprec": totals["Rprec"] / n if n else 0.0}
    for k in ks:
        result[f"precision@{k}"] = totals[f"precision@{k}"] / n if n else 0.0
    for k in ks:
        if k > 1:
            result[f"recall@{k}"] = totals[f"recall@{k}"] / n if n else 0.0
            result[f"success_rate@{k}"] = totals[f"success_rate@{k}"] / n if n else 0.0
    return result


# ----------------------------------------------------------------------------- downstream


def downstream_metrics(gold_records: Sequence[dict], guess_records: Sequence[dict]) -> dict[str, float]:
    """accuracy, em, f1, rougel and their KILT- variants, averaged over the (aligned) records."""
    sums = dict.fromkeys(["accuracy", "em", "f1", "rougel", "KILT-accuracy", "KILT-em", "KILT-f1", "KILT-rougel"], 0)
    for guess, gold in zip(guess_records, gold_records):
        golds = gold_answers(gold)
        if not golds:
            raise ValueError(f"gold record '{gold['id']}' has no answer: it cannot be scored downstream")
        answer = str(guess["output"][0]["answer"]).strip()
        if len(answer) == 0:
            continue  # an empty answer scores 0 but still counts (official behaviour)
        local = {
            "accuracy": 1 if answer in golds else 0,
            "em": max(exact_match(answer, g) for g in golds),
            "f1": max(f1(answer, g) for g in golds),
            "rougel": max(rouge_l(answer, g) for g in golds),
        }
        kilt_counts = r_precision(guess, gold, RANK_KEYS) == 1
        for name, value in local.items():
            sums[name] += value
            if kilt_counts:
                sums[f"KILT-{name}"] += value
    n = len(gold_records)
    return {name: (total / n if n else 0.0) for name, total in sums.items()}


def score_kilt(
    gold_records: Sequence[dict],
    guess_records: Sequence[dict],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    downstream: bool = True,
) -> dict[str, float]:
    """Every KILT metric of aligned records: downstream (unless disabled), KILT-, retrieval."""
    result: dict[str, float] = {}
    if downstream:
        result.update(downstream_metrics(gold_records, guess_records))
    result.update(retrieval_metrics(gold_records, guess_records, ks))
    return {name: float(value) for name, value in result.items()}


def score_kilt_files(
    gold_path: str | os.PathLike,
    guess_path: str | os.PathLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    downstream: bool = True,
) -> dict[str, float]:
    """Score a KILT prediction file against a KILT gold file (both jsonl in KILT's format)."""
    gold = load_kilt_file(gold_path, predictions=False)
    guess = load_kilt_file(guess_path, predictions=downstream)
    if not downstream:
        guess = [(line, _provenance_output_only(record, guess_path, line)) for line, record in guess]
    gold_records, guess_records = align_predictions(gold, guess, gold_path, guess_path)
    return score_kilt(gold_records, guess_records, ks=ks, downstream=downstream)


def _provenance_output_only(record: dict, path: str | os.PathLike, line: int) -> dict:
    """Keep the one output that carries provenance (the official retrieval scorer's filter)."""
    outputs = [output for output in record["output"] if "provenance" in output]
    if len(outputs) != 1:
        raise InputError(path, line, "output", f"expected exactly one output with provenance, got {len(outputs)}")
    return {**record, "output": outputs}
