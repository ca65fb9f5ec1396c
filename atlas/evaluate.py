"""Evaluation: predict on a data file, score with the task's own metrics, add retrieval metrics.

Writes `predictions.jsonl` (one line per example: the prediction, the gold answers and the
retrieved passages with their scores), `metrics.json`, and for KILT tasks `kilt_predictions.jsonl`
in KILT's own output format.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from atlas.config import EvaluationConfig
from tasks.base import Example
from tasks.io import atomic_write_json, write_jsonl
from retriever.index import Hit
from retriever.retrieval_eval import RetrievalExample, score_retrieval


def retrieval_metrics(examples: list[Example], passages: list[list[dict]], ks: list[int]) -> dict[str, float]:
    """Answer recall@k (DPR's has-answer match) and MRR, plus gold-passage recall@k where
    examples name gold ids (`metadata["gold_ids"]`); examples without answers are left out.
    The same scorer as `atlas evaluate-retrieval` (`retriever.retrieval_eval.score_retrieval`)."""
    scored = [(e, ps) for e, ps in zip(examples, passages) if e.answers]
    if not scored:
        return {}
    hits = [[Hit(**{f: p.get(f, "") for f in ("id", "title", "text", "doc_id")}, score=float(p.get("score") or 0.0),
                 row=int(p.get("row", -1))) for p in ps[: max(ks)]] for _, ps in scored]
    queries = [RetrievalExample(question=e.query, answers=e.answers, gold_ids=list(e.metadata.get("gold_ids", [])))
               for e, _ in scored]
    metrics, _ = score_retrieval(queries, hits, ks)
    return {k: v for k, v in metrics.items() if not k.startswith("n")}


def _batches(items: list, size: int, desc: str = "evaluating"):
    """Consecutive batches of `items`, with a progress bar (on stderr) for long evaluations."""
    from tqdm.auto import tqdm

    with tqdm(total=len(items), desc=desc, unit="ex", disable=len(items) < 2 * size, mininterval=2.0) as bar:
        for start in range(0, len(items), size):
            yield items[start : start + size]
            bar.update(min(size, len(items) - start))


def _passage_summary(passages: list[dict] | None) -> list[dict]:
    return [{"id": p.get("id"), "score": p.get("score"), "title": p.get("title"),
             **({"wikipedia_id": p["wikipedia_id"]} if p.get("wikipedia_id") else {})} for p in passages or []]


@torch.no_grad()
def predict_generation(model, task, examples: list[Example], config: EvaluationConfig):
    """Generate answers: → (raw generated texts, passages per example (all retrieved) or None)."""
    n_read = model.reader_config.n_context
    n_retrieve = max([n_read, *config.retrieval_k])
    predictions, retrieved = [], []
    for batch in _batches(examples, config.batch_size):
        passages = model.passages_for(batch, n_retrieve)
        read = None if passages is None else [ps[:n_read] for ps in passages]
        input_ids, attention_mask = model.reader_inputs([e.query for e in batch], read)
        generated = model.reader.generate(input_ids, attention_mask, max_length=model.reader_config.generation_max_length,
                                          num_beams=model.reader_config.num_beams)
        texts = model.reader_tokenizer.batch_decode(generated, skip_special_tokens=False)
        predictions.extend(texts)
        retrieved.extend(passages or [None] * len(batch))
    return predictions, (None if model.closed_book else retrieved)


@torch.no_grad()
def predict_multiple_choice(model, task, examples: list[Example], config: EvaluationConfig):
    """Score the option letters of every eval presentation (the task's permutations, identity
    first) and average the probabilities back onto the original options (de-biased).

    → (letters predicted on the original order, passages per example or None,
       de-biased probabilities of the original options per example).
    """
    from tasks.multiple_choice import aggregate

    predictions, retrieved, probabilities = [], [], []
    for batch in _batches(examples, config.batch_size):
        passages = model.passages_for(batch, model.reader_config.n_context)
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


def evaluate(model, task, data_path: str | Path, config: EvaluationConfig, *, out_dir: str | Path | None = None,
             examples: list[Example] | None = None) -> dict[str, float]:
    """Predict on `data_path` (or on `examples`), score, and write the outputs under `out_dir`."""
    model.eval()
    if examples is None:
        examples = task.load(data_path)
    if config.max_examples is not None:
        examples = examples[: config.max_examples]
    multiple_choice = all(e.options for e in examples)
    probabilities = None
    if multiple_choice:
        predictions, retrieved, probabilities = predict_multiple_choice(model, task, examples, config)
    else:
        predictions, retrieved = predict_generation(model, task, examples, config)
    if multiple_choice:
        metrics = dict(task.evaluate(examples, predictions, letter_probs=probabilities))
    else:
        metrics = dict(task.evaluate(examples, predictions, retrieved=retrieved))
    if retrieved is not None and not multiple_choice:
        metrics.update(retrieval_metrics(examples, retrieved, config.retrieval_k))
    metrics = {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}
    if not multiple_choice:
        predictions = [task.postprocess(e, p) for e, p in zip(examples, predictions)]
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out_dir / "metrics.json", metrics)
        if config.write_predictions:
            write_jsonl(out_dir / "predictions.jsonl", (
                {"id": e.id, "query": e.query, "prediction": p, "answers": e.answers,
                 **({"probabilities": probabilities[i]} if probabilities else {}),
                 "passages": _passage_summary(retrieved[i] if retrieved else None)}
                for i, (e, p) in enumerate(zip(examples, predictions))
            ))
            if hasattr(task, "provenance"):  # KILT: its own output format, provenance from retrieval
                from tasks.kilt import write_kilt_predictions

                write_kilt_predictions(out_dir / "kilt_predictions.jsonl", [e.id for e in examples], predictions,
                                       [task.provenance(ps or []) for ps in (retrieved or [None] * len(examples))])
    return metrics
