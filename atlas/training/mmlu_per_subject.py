"""MMLU "5-shot per subject" for real: one fine-tuned model per subject, one merged table.

The Atlas paper's 5-shot setting trains a separate model for each of MMLU's 57 subjects on that
subject's 5 `dev` questions, evaluates it on the subject's `test` questions, and reports accuracy
and de-biased accuracy per category and overall as averages over *questions* (not over subjects).
`run_per_subject` does exactly that with one recipe (configs/mmlu-5shot.yaml): for each subject,
`atlas train` with `task.train_data = [dev/<subject>_dev.csv]`, then `atlas evaluate` of the
result on `test/<subject>_test.csv`, then `MMLUTask.evaluate` over every subject's predictions.

    OUT/config.yaml                   the recipe as resolved (its data paths are replaced per subject)
    OUT/index/                        the index, built once when the recipe names only index.corpus
    OUT/subjects/<subject>/           that subject's training run (log, config; checkpoints are
                                      deleted once evaluated unless `keep_checkpoints`)
    OUT/subjects/<subject>/eval/      its config.yaml, predictions.jsonl, metrics.json
    OUT/predictions.jsonl             every subject's predictions, subjects in alphabetical order
    OUT/metrics.json                  accuracy and debiased_accuracy: overall, per category, per subject
    OUT/subjects.json                 {subject: number of test questions evaluated}

A subject whose `eval/metrics.json` exists is not run again, so a killed run continues with the
next subject when started again with the same arguments.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import torch.distributed as dist

from atlas.config import AtlasConfig, save_config
from atlas.distributed import DistributedContext, init_distributed
from atlas.evaluate import evaluate
from atlas.loading import load_model, recipe_spec, resolve_checkpoint
from atlas.run_index import prepare_index
from atlas.training.loop import train
from common.io import InputError, atomic_write_json, read_jsonl, write_jsonl
from tasks.base import Example, get_task

logger = logging.getLogger(__name__)


def subject_files(data_dir: str | Path, subjects: list[str] | None = None) -> dict[str, tuple[Path, Path]]:
    """{subject: (dev CSV, test CSV)} of an MMLU root with `dev/` and `test/` folders.

    All subjects that have both files (sorted), or exactly `subjects`; a named subject without
    both files is an error listing the valid ones.
    """
    data_dir = Path(data_dir)
    for split in ("dev", "test"):
        if not (data_dir / split).is_dir():
            raise InputError(
                data_dir / split, None, None, "folder not found (expected the MMLU root with dev/ and test/)"
            )
    dev = {p.name[: -len("_dev.csv")]: p for p in (data_dir / "dev").glob("*_dev.csv")}
    test = {p.name[: -len("_test.csv")]: p for p in (data_dir / "test").glob("*_test.csv")}
    available = sorted(set(dev) & set(test))
    if not available:
        raise InputError(data_dir, None, None, "no subject has both dev/<subject>_dev.csv and test/<subject>_test.csv")
    chosen = available if subjects is None else list(dict.fromkeys(subjects))
    unknown = [s for s in chosen if s not in dev or s not in test]
    if unknown:
        raise ValueError(
            f"{data_dir}: no dev and test files for subject(s) {', '.join(unknown)}; valid: {', '.join(available)}"
        )
    return {s: (dev[s], test[s]) for s in chosen}


def _subject_config(config: AtlasConfig, out: Path, subject: str, dev: Path, index_path: str | None) -> AtlasConfig:
    """The recipe for one subject: trained on its dev file, no evaluation inside training."""
    subject_config = copy.deepcopy(config)
    subject_config.task.train_data = [str(dev)]
    subject_config.task.eval_data = []  # evaluated afterwards, into eval/ (see run_per_subject)
    subject_config.training.output_dir = str(out / "subjects" / subject)
    if index_path is not None:
        subject_config.index.path = index_path
    return subject_config


def _shared_index(config: AtlasConfig, out: Path) -> str | None:
    """The index every subject searches: `index.path`, or `index.corpus` built once as OUT/index.

    All ranks call this: under torchrun `atlas.run_index.prepare_index` builds the index with every
    rank embedding its share of the corpus (and agrees on whether it already exists).
    """
    if config.index.path is not None or not config.index.corpus or config.task.closed_book:
        return config.index.path

    built = copy.deepcopy(config)
    built.training.output_dir = str(out)
    return str(prepare_index(built))  # builds OUT/index unless it exists


def _on_rank0(value, context: DistributedContext):
    """Rank 0's `value` on every rank (a file check whose answer every rank must share, the merged metrics)."""
    if not context.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _read_predictions(path: Path, examples: list[Example]) -> tuple[list[str], list[dict[str, float]]]:
    """A subject's predictions.jsonl, checked against its test examples (same ids, same order)."""
    rows = list(read_jsonl(path))
    if [str(r.get("id")) for _, r in rows] != [e.id for e in examples]:
        raise InputError(
            path,
            None,
            "id",
            f"the predictions are not those of the {len(examples)} test questions "
            "evaluated (delete this subject's eval/ folder to run it again)",
        )
    for line, record in rows:
        if not isinstance(record.get("probabilities"), dict):
            raise InputError(path, line, "probabilities", "missing: not an MMLU evaluation output")
    return [r["prediction"] for _, r in rows], [r["probabilities"] for _, r in rows]


def run_per_subject(
    config: AtlasConfig,
    data_dir: str | Path,
    *,
    out_dir: str | Path | None = None,
    subjects: list[str] | None = None,
    keep_checkpoints: bool = False,
    progress: bool = True,
    context: DistributedContext | None = None,
) -> dict[str, float]:
    """Fine-tune and evaluate one model per MMLU subject, then merge → the overall metrics.

    `config` is the per-subject recipe (its train/eval data are replaced by each subject's dev
    and test files); `data_dir` the MMLU root; `out_dir` defaults to `training.output_dir`.
    The merged metrics are `MMLUTask.evaluate` over all subjects' test questions together:
    `accuracy`, `debiased_accuracy`, `…/<category>`, `…/subject/<subject>` (per-question averages;
    `evaluation.max_examples`, when set, limits each subject's test questions).
    """
    # heavy: transformers (the model stack), loaded when the subjects are trained, not when this module is imported

    if config.task.name != "mmlu":
        raise ValueError(f"the per-subject setting is MMLU's; the recipe's task is '{config.task.name}'")
    context = context or init_distributed()
    out = Path(out_dir or config.training.output_dir)
    files = subject_files(data_dir, subjects)
    task = get_task("mmlu", **config.task.options)
    if context.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(config, out / "config.yaml")
    index_path = _shared_index(config, out)

    for n, (subject, (dev, test)) in enumerate(files.items(), start=1):
        subject_config = _subject_config(config, out, subject, dev, index_path)
        eval_dir = Path(subject_config.training.output_dir) / "eval"
        if _on_rank0((eval_dir / "metrics.json").is_file(), context):
            if context.is_main:
                logger.info("[%d/%d] %s: already evaluated, kept", n, len(files), subject)
            continue
        if context.is_main:
            logger.info("[%d/%d] %s: training on %s", n, len(files), subject, dev)
        train(subject_config, progress=progress, context=context)
        checkpoint = resolve_checkpoint(subject_config.training.output_dir)
        model = load_model(recipe_spec(subject_config, checkpoint=checkpoint), context=context)
        recorded = copy.deepcopy(subject_config)
        recorded.task.eval_data = [str(test)]
        evaluate(
            model,
            task,
            test,
            subject_config.evaluation,
            out_dir=eval_dir if context.is_main else None,
            run_config=recorded,
            context=context,
        )
        del model
        if context.is_main and not keep_checkpoints:
            shutil.rmtree(Path(subject_config.training.output_dir) / "checkpoints", ignore_errors=True)
        context.barrier()

    metrics: dict[str, float] = {}
    if context.is_main:
        metrics = merge_subjects(out, files, task, max_examples=config.evaluation.max_examples)
    return _on_rank0(metrics, context)


def merge_subjects(
    out: str | Path, files: dict[str, tuple[Path, Path]], task, *, max_examples: int | None = None
) -> dict[str, float]:
    """Merge `OUT/subjects/<subject>/eval/predictions.jsonl` of every subject into one table.

    Writes OUT/predictions.jsonl, OUT/metrics.json and OUT/subjects.json; returns the metrics
    (per-question averages over all subjects' questions, as `MMLUTask.evaluate` computes them).
    """
    out = Path(out)
    examples: list[Example] = []
    predictions: list[str] = []
    probabilities: list[dict[str, float]] = []
    counts: dict[str, int] = {}
    for subject, (_, test) in files.items():
        subject_examples = task.load(test)
        if max_examples is not None:
            subject_examples = subject_examples[:max_examples]
        path = out / "subjects" / subject / "eval" / "predictions.jsonl"
        letters, probs = _read_predictions(path, subject_examples)
        examples += subject_examples
        predictions += letters
        probabilities += probs
        counts[subject] = len(subject_examples)
    write_jsonl(
        out / "predictions.jsonl",
        (
            {
                "id": e.id,
                "subject": e.metadata.get("subject"),
                "prediction": p,
                "answers": e.answers,
                "probabilities": q,
            }
            for e, p, q in zip(examples, predictions, probabilities)
        ),
    )
    metrics = task.evaluate(examples, predictions, letter_probs=probabilities)
    atomic_write_json(out / "subjects.json", counts)
    atomic_write_json(out / "metrics.json", metrics)
    logger.info(
        "merged %d subjects, %d questions: %s",
        len(counts),
        len(examples),
        json.dumps({k: metrics[k] for k in ("accuracy", "debiased_accuracy")}),
    )
    return metrics
