"""Retrieval evaluation: answer recall@k, gold-passage recall@k and MRR over a question file.

- answer recall@k (DPR / FiD): the fraction of questions with at least one of the top-k
  passages that "has the answer" (`tasks.metrics.has_answer`: a gold answer's normalised
  token sequence occurs in the passage text's normalised tokens);
- gold recall@k: where examples name their gold passages or documents (`gold_doc`,
  `gold_docs`, `gold_id`, `gold_ids`), the fraction with a gold one in the top k; a gold
  id matches a passage's id or its document id (so a chunked gold document counts);
- MRR: the mean over questions of 1 / rank of the first hit (0 when none in the top K).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from common.io import InputError, read_jsonl, require_str
from tasks.metrics import has_answer

GOLD_KEYS = ("gold_doc", "gold_docs", "gold_id", "gold_ids")


@dataclass
class RetrievalExample:
    """A question, its gold answers, and (optionally) the ids of its gold passages/documents."""

    question: str
    answers: list[str]
    gold_ids: list[str] = field(default_factory=list)


def _string_list(record: dict, key: str, path, line: int) -> list[str]:
    value = record[key]
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
        raise InputError(path, line, key, "expected a string or a list of strings")
    return [str(v) for v in values]


def read_retrieval_examples(path: str | os.PathLike) -> list[RetrievalExample]:
    """Read NQ-open style JSONL: `question` plus `answers` (or NQ-open's `answer`), a string or
    list; optional gold ids under one of `GOLD_KEYS`. Errors name file, line and field."""
    examples = []
    for line, record in read_jsonl(path):
        question = require_str(record, "question", path, line)
        key = "answers" if "answers" in record else "answer" if "answer" in record else None
        if key is None:
            raise InputError(path, line, "answers", "missing required field (also accepted: 'answer')")
        gold = [g for k in GOLD_KEYS if record.get(k) is not None for g in _string_list(record, k, path, line)]
        examples.append(RetrievalExample(question, _string_list(record, key, path, line), gold))
    return examples


def first_rank(flags: list[bool]) -> int | None:
    """1-based rank of the first True, or None."""
    return next((i + 1 for i, flag in enumerate(flags) if flag), None)


def score_retrieval(examples: list[RetrievalExample], hits: list[list], ks: list[int]) -> tuple[dict, list[dict]]:
    """Metrics and per-question records for retrieved `hits` (one ranked `Passage` list per example).

    Returns `(metrics, records)`: metrics holds `answer_recall@k`, `answer_mrr`, and where any
    example names gold ids `gold_recall@k`, `gold_mrr` (over those examples only), plus `n`.
    """
    if len(examples) != len(hits):
        raise ValueError(f"{len(examples)} examples but {len(hits)} hit lists")
    records = []
    for example, ranked in zip(examples, hits):
        answer_flags = [has_answer(example.answers, hit.text) for hit in ranked]
        gold = set(example.gold_ids)
        gold_flags = [hit.id in gold or hit.doc_id in gold for hit in ranked]
        records.append(
            {
                "question": example.question,
                "answers": example.answers,
                "gold_ids": example.gold_ids,
                "answer_rank": first_rank(answer_flags),
                "gold_rank": first_rank(gold_flags) if gold else None,
                "hits": [
                    {
                        "id": h.id,
                        "score": round(h.score, 6),
                        "title": h.title,
                        "has_answer": a,
                        **({"gold": g} if gold else {}),
                    }
                    for h, a, g in zip(ranked, answer_flags, gold_flags)
                ],
            }
        )
    metrics: dict[str, float] = {"n": len(records), **_rank_metrics("answer", [r["answer_rank"] for r in records], ks)}
    with_gold = [r for r in records if r["gold_ids"]]
    if with_gold:
        metrics |= _rank_metrics("gold", [r["gold_rank"] for r in with_gold], ks)
        metrics["n_with_gold"] = len(with_gold)
    return metrics, records


def _rank_metrics(kind: str, ranks: list[int | None], ks: list[int]) -> dict[str, float]:
    """`{kind}_recall@k` for each k and `{kind}_mrr` over the first-hit ranks of some questions (None: no hit)."""
    n = max(len(ranks), 1)
    recalls = {f"{kind}_recall@{k}": sum(r is not None and r <= k for r in ranks) / n for k in ks}
    return recalls | {f"{kind}_mrr": sum(1 / r for r in ranks if r) / n}


def evaluate_retrieval(
    index, examples: list[RetrievalExample], *, ks: list[int] = (1, 5, 20), batch_size: int = 64
) -> tuple[dict, list[dict]]:
    """Search `index` (a `PassageIndex` loaded with a retriever) for every question down to
    max(ks) and score the results with `score_retrieval`."""
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] <= 0:
        raise ValueError(f"ks must be positive integers, got {ks}")
    hits = []
    for start in range(0, len(examples), batch_size):
        batch = examples[start : start + batch_size]
        hits.extend(index.search([e.question for e in batch], ks[-1], batch_size=batch_size))
    return score_retrieval(examples, hits, ks)
