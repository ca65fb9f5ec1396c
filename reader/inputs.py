"""Tokenising reader inputs: (query, passages) → (B, K, L) tensors, targets → (B, T) labels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from common.modeling import IGNORE_INDEX

DEFAULT_PASSAGE_FORMAT = "{query} title: {title} context: {text}"


def format_passage(query: str, passage: Mapping[str, str], passage_format: str = DEFAULT_PASSAGE_FORMAT) -> str:
    """The reader text for one (query, passage) pair; missing title/text count as empty."""
    fields = {"title": "", "text": "", **passage, "query": query}
    return passage_format.format(**fields)


def encode_reader_inputs(
    tokenizer: PreTrainedTokenizerBase,
    queries: Sequence[str],
    passages: Sequence[Sequence[Mapping[str, str]]],
    max_length: int,
    passage_format: str = DEFAULT_PASSAGE_FORMAT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise every (query, passage_k) pair of a batch.

    An example with fewer passages than the longest is padded with fully masked rows; an
    example with no passages (closed book) reads its query alone.

    Args:
        queries: B query strings.
        passages: per query, a list of passage dicts with "title" and "text".
        max_length: `text_maxlength`, tokens per (query, passage) pair including `</s>`.
    Returns:
        input_ids (B, K, L) and attention_mask (B, K, L), L = the longest pair (≤ max_length).
    """
    if len(queries) != len(passages):
        raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
    n_passages = max(1, max(len(p) for p in passages)) if passages else 1
    texts: list[str] = []
    real: list[bool] = []
    for query, example_passages in zip(queries, passages):
        if not example_passages:
            example_texts = [query]
        else:
            example_texts = [format_passage(query, p, passage_format) for p in example_passages]
        real += [True] * len(example_texts) + [False] * (n_passages - len(example_texts))
        texts += example_texts + [""] * (n_passages - len(example_texts))
    encoded = tokenizer(texts, max_length=max_length, truncation=True, padding="longest", return_tensors="pt")
    input_ids = encoded["input_ids"]
    attention_mask = encoded["attention_mask"] * torch.tensor(real, dtype=torch.long).unsqueeze(-1)
    input_ids = input_ids.masked_fill(attention_mask == 0, tokenizer.pad_token_id)
    batch = len(queries)
    return input_ids.view(batch, n_passages, -1), attention_mask.view(batch, n_passages, -1)


def encode_targets(tokenizer: PreTrainedTokenizerBase, targets: Sequence[str], max_length: int) -> torch.Tensor:
    """Target strings → labels (B, T) ending in `</s>`, -100 at padding (ignored positions)."""
    encoded = tokenizer(
        list(targets),
        max_length=max_length,
        truncation=True,
        padding="longest",
        return_tensors="pt",
    )
    return encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, IGNORE_INDEX)
