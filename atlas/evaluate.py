"""Evaluation: predict on a data file, write the predictions, then score them with the task's
own metrics and add retrieval metrics.

Outputs under `out_dir`, in this order (so that a scoring failure never loses the predictions):
- `config.yaml`: the fully resolved run config, when the caller passes it (`run_config`);
- `predictions.jsonl`: one line per example — the prediction, the gold answers, for multiple
  choice the de-biased `probabilities` of the original options, the retrieved passages
  with their scores, and (tasks whose answers are words of a passage) its `citations`: where the
  prediction stands in the passages read (`tasks.citations`: passage id, field, offsets, quote);
- `kilt_predictions.jsonl` (KILT tasks): KILT's own output format, one line per input id,
  `{"id", "output": [{"answer", "provenance": [{"wikipedia_id", "title"?}]}]}`;
- `metrics.json`: the metrics in percent under the project's names (`tasks.metrics.METRIC_NAMES`),
  unrounded: 100 × the official scorers' numbers to the last digit;
- `kilt_scores.json` (KILT tasks): the same scores as KILT's official scorers print them (their
  key names, [0, 1]), to compare with their output or a leaderboard submission.
Every example must have gold answers: one without is an `InputError` naming its file, line and
field, raised before anything is predicted. An unlabelled test set (a KILT `test` file without
`output`) is evaluated with `predict_only`: the predictions are written, nothing is scored.

Under `torchrun` (pass `context`) the examples are split across the ranks, each rank predicts
its share, and rank 0 gathers, writes and scores; every rank returns the same metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from atlas.config import AtlasConfig, EvaluationConfig, save_config
from atlas.distributed import DistributedContext
from common.io import atomic_write_json, write_jsonl
from common.progress import progress_bar as tqdm
from retriever.retrieval_eval import RetrievalExample, score_retrieval
from tasks.base import Example
from tasks.citations import NO_ANSWER, Span, supported_answer
from tasks.kilt import KiltTask, write_kilt_predictions
from tasks.multiple_choice import aggregate
from tasks.passage import Passage
from tasks.score import check_labelled

logger = logging.getLogger(__name__)


def retrieval_metrics(examples: list[Example], passages: list[list[Passage]], ks: list[int]) -> dict[str, float]:
    """Answer recall@k (DPR's has-answer match) and MRR, plus gold-passage recall@k and MRR where
    examples name gold ids (`metadata["gold_ids"]`), all in percent; examples without answers are
    left out. The scorer of `atlas index evaluate` (`retriever.retrieval_eval.score_retrieval`), × 100."""
    scored = [(e, ps) for e, ps in zip(examples, passages) if e.answers]
    if not scored:
        return {}
    # a given (not retrieved) passage has no score: the scorer's per-question records, unused here, round one
    hits = [[p if p.score is not None else replace(p, score=0.0) for p in ps[: max(ks)]] for _, ps in scored]
    queries = [
        RetrievalExample(question=e.query, answers=e.answers, gold_ids=list(e.metadata.get("gold_ids", [])))
        for e, _ in scored
    ]
    metrics, _ = score_retrieval(queries, hits, ks)
    return {k: 100 * v for k, v in metrics.items() if not k.startswith("n")}  # `n`, `n_with_gold`: counts


RECALL_DROP_WARNING = 1.0  # points of answer recall a retriever loss may cost before the log warns


def retriever_recall(model, examples: list[Example], ks: list[int], batch_size: int = 32) -> dict[str, float]:
    """Answer recall@k (percent) of `model`'s current retriever on `examples` (those with answers):
    one search for max(ks) passages per example, in batches. The training loop's guard (below)."""
    examples = [e for e in examples if e.answers]
    if not examples:
        return {}
    passages = [
        ps
        for start in range(0, len(examples), batch_size)
        for ps in model.retrieve(examples[start : start + batch_size], max(ks))
    ]
    metrics = retrieval_metrics(examples, passages, ks)
    return {k: v for k, v in metrics.items() if k.startswith("answer_recall@")}


def recall_drops(before: dict[str, float], now: dict[str, float], tolerance: float = RECALL_DROP_WARNING) -> list[str]:
    """Messages for each answer recall@k that fell by more than `tolerance` points from `before` to `now`."""
    return [
        f"{key} {before[key]:.1f} → {value:.1f}"
        for key, value in now.items()
        if key in before and value < before[key] - tolerance
    ]


def _batches(items: list, size: int, desc: str = "evaluating", show: bool = True):
    """Consecutive batches of `items`, with a progress bar (on stderr) for long evaluations."""
    with tqdm(
        total=len(items), desc=desc, unit="ex", disable=not show or len(items) < 2 * size, mininterval=2.0
    ) as bar:
        for start in range(0, len(items), size):
            yield items[start : start + size]
            bar.update(min(size, len(items) - start))


def _passage_summary(passages: list[Passage] | None) -> list[dict]:
    return [p.summary() for p in passages or []]


@dataclass
class Predictions:
    """What the model produced for a list of examples (all lists in example order).

    `texts`: raw generated text (generation) or the letter chosen on the original option order
    (multiple choice); `passages`: the passages per example (retrieved, or given with the
    example), None when closed-book; `probabilities`: multiple choice
    only, the de-biased probability of each original option letter; `copied`: where span-constrained decoding
    says each answer stands in the passages read (`Reading.copied`), else None.
    """

    texts: list[str]
    passages: list[list[Passage]] | None
    probabilities: list[dict[str, float]] | None = None
    copied: list[list[Span]] | None = None

    def take(self, n: int) -> Predictions:
        """The first `n` examples' predictions (drops the padding of a rank's share)."""
        return Predictions(
            self.texts[:n],
            None if self.passages is None else self.passages[:n],
            None if self.probabilities is None else self.probabilities[:n],
            None if self.copied is None else self.copied[:n],
        )


@torch.no_grad()
def predict_generation(model, task, examples: list[Example], config: EvaluationConfig, *, show: bool = True):
    """Generate answers: → (raw generated texts, passages per example (all retrieved) or None, None (no option
    probabilities), where span-constrained decoding copied each answer from or None).

    Retrieves max(n_read, max(retrieval_k)) passages per example (one index search per batch of
    `config.batch_size`); the reader reads the first `model.n_read` (`AtlasModel.read`, the one answer path).
    """
    n_retrieve = max([model.n_read, *config.retrieval_k])
    predictions, retrieved, copied = [], [], []
    for batch in _batches(examples, config.batch_size, show=show):
        passages = model.passages_for(batch, n_retrieve)
        read = None if passages is None else [ps[: model.n_read] for ps in passages]
        reading = model.read([e.query for e in batch], read)
        predictions.extend(reading.texts)
        retrieved.extend(passages or [None] * len(batch))
        copied.extend(reading.copied or [None] * len(batch))
    return predictions, (None if model.closed_book else retrieved), None, copied


@torch.no_grad()
def predict_multiple_choice(model, task, examples: list[Example], config: EvaluationConfig, *, show: bool = True):
    """Score the option letters of every eval presentation (the task's permutations, identity
    first) and average the probabilities back onto the original options (de-biased).

    One index search per batch of `config.batch_size` questions; each question's P
    presentations share its passages. → (letters predicted on the original order, passages per
    example or None, de-biased probabilities of the original options per example).
    """
    predictions, retrieved, probabilities = [], [], []
    for batch in _batches(examples, config.batch_size, show=show):
        passages = model.passages_for(batch, model.n_read)
        for n, example in enumerate(batch):
            shown = task.eval_presentations(example)
            letters = sorted(example.options)
            context = None if passages is None else [passages[n]] * len(shown)
            probs = model.option_logits(shown, letters, context).float().softmax(-1)  # (P, n_options)
            per_presentation = [dict(zip(letters, row.tolist())) for row in probs]
            identity = per_presentation[0]
            predictions.append(max(letters, key=lambda letter: identity[letter]))
            probabilities.append(aggregate(shown, per_presentation))
            retrieved.append(None if passages is None else passages[n])
    return predictions, (None if model.closed_book else retrieved), probabilities


# ----------------------------------------------------------------------------- ranks


def rank_share(examples: list[Example], rank: int, world_size: int) -> tuple[list[Example], int]:
    """This rank's contiguous share of `examples`, padded to ceil(N / world_size) items.

    → (share, n_real): every rank gets the same number of items, so that every rank runs the
    same number of batches and therefore calls a sharded index's collective search the same
    number of times; the padding repeats an example and its results are dropped (`n_real`).
    """
    total = len(examples)
    start, end = total * rank // world_size, total * (rank + 1) // world_size
    share = examples[start:end]
    size = -(-total // world_size)  # ceil
    filler = share[-1] if share else examples[-1]
    return share + [filler] * (size - len(share)), len(share)


def _strip_texts(passages: list[list[Passage]] | None, has_index: bool) -> list[list[Passage]] | None:
    """The passages with the text of index passages (those with a `row`) emptied: rank 0 re-reads
    it by `row` from the memory-mapped corpus (`_restore_texts`), so passage text never travels
    between ranks."""
    if passages is None or not has_index:
        return passages
    return [None if ps is None else [p if p.row is None else replace(p, text="") for p in ps] for ps in passages]


def _restore_texts(passages: list[list[Passage]] | None, index) -> None:
    """Fill in, in place, the text of the index passages that `_strip_texts` sent without it."""
    stripped = [p for ps in passages or [] if ps for p in ps if p.row is not None]
    if stripped:
        for p, full in zip(stripped, index.passages([p.row for p in stripped])):
            p.text = full["text"]


def _gather(predictions: Predictions, context: DistributedContext, has_index: bool) -> Predictions | None:
    """All ranks' predictions on rank 0, in rank order (= example order); None on other ranks."""
    payload = replace(predictions, passages=_strip_texts(predictions.passages, has_index))
    gathered: list[Any] | None = [None] * context.world_size if context.is_main else None
    dist.gather_object(payload, gathered, dst=0)
    if not context.is_main:
        return None
    texts = [t for part in gathered for t in part.texts]
    passages = None if gathered[0].passages is None else [ps for part in gathered for ps in part.passages]
    probabilities = None if gathered[0].probabilities is None else [p for part in gathered for p in part.probabilities]
    copied = None if gathered[0].copied is None else [c for part in gathered for c in part.copied]
    return Predictions(texts, passages, probabilities, copied)


def _share_result(result: dict | Exception, context: DistributedContext) -> dict[str, float]:
    """Rank 0's metrics (or its error) on every rank: no rank is left waiting on a failure.

    Rank 0 raises its own exception; the other ranks raise a ValueError carrying its message
    (exceptions such as `InputError` do not survive pickling, their messages do).
    """
    if context.enabled:
        message = f"{type(result).__name__}: {result}" if isinstance(result, Exception) else None
        box = [(result, None) if context.is_main and message is None else (None, message)]
        dist.broadcast_object_list(box, src=0)
        metrics, message = box[0]
        if message is not None and not isinstance(result, Exception):
            raise ValueError(f"evaluation failed on rank 0: {message}")
        if metrics is not None:
            result = metrics
    if isinstance(result, Exception):
        raise result
    return result


# ----------------------------------------------------------------------------- evaluate


def evaluate(
    model,
    task,
    data_path: str | Path | None,
    config: EvaluationConfig,
    *,
    out_dir: str | Path | None = None,
    examples: list[Example] | None = None,
    run_config: AtlasConfig | None = None,
    context: DistributedContext | None = None,
    predict_only: bool = False,
    show: bool = True,
) -> dict[str, float]:
    """Predict on `data_path` (or on `examples`), write the outputs under `out_dir`, then score.

    Returns the metrics in percent, primary first. Every example must have gold answers
    (`check_labelled`, before anything is predicted) unless `predict_only`: then the predictions
    are written and nothing is scored ({} is returned). `run_config`, where given, is saved as
    `out_dir/config.yaml`.

    `context`: under `torchrun`, the process group's ranks (all of them must call this): each
    predicts ceil(N / world_size) examples (the last rank's share padded, so that a sharded
    index is searched in lockstep), rank 0 gathers the predictions, writes and scores, and
    every rank returns rank 0's metrics. Without it, this process evaluates everything alone.
    `show`: a progress bar (on rank 0).
    """
    context = context or DistributedContext()
    model.eval()
    source = str(data_path) if data_path is not None else "the given examples"
    if examples is None:
        examples = task.load(data_path, skip_invalid=bool(run_config and run_config.task.skip_invalid))
    if config.max_examples is not None:
        examples = examples[: config.max_examples]
    if not examples:
        raise ValueError(f"{source}: no examples to evaluate")
    if not predict_only:
        check_labelled(task, data_path, examples)
    multiple_choice = all(e.options for e in examples)

    share, n_real = rank_share(examples, context.rank, context.world_size)  # all of them for one process
    predict = predict_multiple_choice if multiple_choice else predict_generation
    mine = Predictions(*predict(model, task, share, config, show=show and context.is_main)).take(n_real)
    has_index = getattr(model, "index", None) is not None
    outputs = _gather(mine, context, has_index) if context.enabled else mine

    result: dict | Exception = {}
    if context.is_main:
        try:
            result = _write_and_score(
                model,
                task,
                examples,
                outputs,
                config,
                multiple_choice,
                source,
                out_dir=Path(out_dir) if out_dir is not None else None,
                run_config=run_config,
                restore_texts=context.enabled and has_index,
                predict_only=predict_only,
            )
        except Exception as error:  # handed to every rank, then raised on each
            if not context.enabled:
                raise
            result = error
    return _share_result(result, context)


def _write_and_score(
    model,
    task,
    examples: list[Example],
    outputs: Predictions,
    config: EvaluationConfig,
    multiple_choice: bool,
    source: str,
    *,
    out_dir: Path | None,
    run_config: AtlasConfig | None,
    restore_texts: bool,
    predict_only: bool,
) -> dict[str, float]:
    """Write config, predictions and KILT predictions, then score (unless `predict_only`) → metrics."""
    retrieved, probabilities = outputs.passages, outputs.probabilities
    if restore_texts:  # the citations and the scores read the passages' text
        _restore_texts(retrieved, model.passage_index)
    answers = (
        list(outputs.texts) if multiple_choice else [task.postprocess(e, p) for e, p in zip(examples, outputs.texts)]
    )
    cites = task.cites_passages and not multiple_choice and retrieved is not None
    citations = [[] for _ in answers]
    if cites:
        require_support = model.inference_config.require_support
        for i, passages in enumerate(retrieved):  # cited among the passages read, not the further ones scored
            copied = None if outputs.copied is None else outputs.copied[i]
            answers[i], citations[i] = supported_answer(
                answers[i], (passages or [])[: model.n_read], None, require_support=require_support, copied=copied
            )
        if require_support:  # an abstention is scored as its text
            outputs.texts = [a if a == NO_ANSWER else t for a, t in zip(answers, outputs.texts)]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        if run_config is not None:
            save_config(run_config, out_dir / "config.yaml")
        if config.write_predictions:
            write_jsonl(
                out_dir / "predictions.jsonl",
                (
                    {
                        "id": e.id,
                        "query": e.query,
                        "prediction": p,
                        "answers": e.answers,
                        **({"probabilities": probabilities[i]} if probabilities else {}),
                        "passages": _passage_summary(retrieved[i] if retrieved else None),
                        **({"citations": [c.record() for c in citations[i]]} if cites else {}),
                    }
                    for i, (e, p) in enumerate(zip(examples, answers))
                ),
            )
            if task.has_provenance:  # KILT: its own output format, provenance from retrieval
                write_kilt_predictions(
                    out_dir / "kilt_predictions.jsonl",
                    [e.id for e in examples],
                    answers,
                    [task.provenance(ps or []) for ps in (retrieved or [None] * len(examples))],
                )

    if predict_only:
        if out_dir is not None:  # never leave an older run's scores beside these predictions
            for name in ("metrics.json", "kilt_scores.json"):
                (out_dir / name).unlink(missing_ok=True)
        return {}

    report = None
    if multiple_choice:
        metrics = dict(task.evaluate(examples, outputs.texts, letter_probs=probabilities))
    else:
        metrics = dict(task.evaluate(examples, outputs.texts, retrieved=retrieved))
        if isinstance(task, KiltTask):
            report = task.official_report(examples, outputs.texts, retrieved=retrieved)
        if retrieved is not None:
            metrics.update(retrieval_metrics(examples, retrieved, config.retrieval_k))
    if out_dir is not None:
        if report is not None:
            atomic_write_json(out_dir / "kilt_scores.json", report)
        atomic_write_json(out_dir / "metrics.json", metrics)
    return metrics
