"""`Retriever`: a query encoder and a passage encoder (tied or untied), s(q, d) = E_q(q) · E_p(d); built from its
settings (`Retriever.from_config`, a `retriever.retriever_config.RetrieverConfig`) or a saved folder
(`from_pretrained`). The encoders are `retriever.encoder.ContrieverEncoder`s."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.modeling import encoder_source
from retriever.embedding_precision import DEFAULT_EMBEDDING_PRECISION, check_embedding_precision
from retriever.encoder import ContrieverEncoder, Pooling
from retriever.fingerprint import hash_json
from retriever.retriever_config import RetrieverConfig

RETRIEVER_CONFIG = "retriever.json"


class Retriever(nn.Module):
    """A query encoder E_q and a passage encoder E_p; s(q, d) = E_q(q) · E_p(d).

    Tied: one encoder serves both sides (`passage_encoder is query_encoder`). Untied: two
    encoders; query-side fine-tuning trains E_q only, so an index built with E_p stays valid.
    Passages are dicts with `title` and `text` (and optionally `section`), rendered with
    `passage_format` (default "{title} {text}"). `precision` (`EMBEDDING_PRECISIONS`, default "auto") is the
    precision `embed_queries` and `embed_passages` run at unless a call names another.
    """

    def __init__(
        self,
        *,
        query_encoder: ContrieverEncoder,
        passage_encoder: ContrieverEncoder | None = None,
        passage_format: str = "{title} {text}",
        query_maxlength: int = 64,
        passage_maxlength: int = 256,
        precision: str = DEFAULT_EMBEDDING_PRECISION,
    ):
        super().__init__()
        self.query_encoder = query_encoder
        # registered as a submodule only when untied, so a tied pair has one set of parameters
        self.passage_encoder = passage_encoder if passage_encoder is not None else query_encoder
        self.passage_format = passage_format
        self.query_maxlength = query_maxlength
        self.passage_maxlength = passage_maxlength
        self.precision = precision  # checked by the setter; not saved: it is the machine's, not the model's
        self.format_passage({"title": "", "text": "", "section": ""})  # fail early on a bad format

    @property
    def precision(self) -> str:
        """The precision `embed_queries` / `embed_passages` run at (`EMBEDDING_PRECISIONS`) unless a call
        names another; set it to change it (a bad value is a ValueError, at once)."""
        return self._precision

    @precision.setter
    def precision(self, precision: str) -> None:
        self._precision = check_embedding_precision(precision)

    @property
    def tied(self) -> bool:
        """Whether queries and passages share one encoder."""
        return self.passage_encoder is self.query_encoder

    @property
    def dim(self) -> int:
        """The embedding dimension d."""
        return self.query_encoder.dim

    def freeze_passage_side(self, train_passage_encoder: bool = False) -> None:
        """Freeze an untied passage encoder unless `train_passage_encoder` (`retriever.train_passage_encoder`):
        query-side training then leaves an index built with E_p valid. A tied encoder is left alone."""
        if not self.tied and not train_passage_encoder:
            self.passage_encoder.requires_grad_(False)

    def format_passage(self, passage) -> str:
        """Render a passage dict as the passage encoder's input text."""
        try:
            text = self.passage_format.format(
                title=passage.get("title") or "",
                text=passage.get("text") or "",
                section=passage.get("section") or "",
            )
        except KeyError as e:
            raise ValueError(
                f"passage_format {self.passage_format!r} names unknown field {e}; "
                "valid: {title}, {text}, {section}"
            ) from None
        return text.strip()

    def encode_queries(self, queries: Sequence[str]) -> torch.Tensor:
        """Embed queries with gradients (train mode is respected): → (B, d)."""
        return self.query_encoder.encode(queries, self.query_maxlength)

    def encode_passages(self, passages: Sequence) -> torch.Tensor:
        """Embed passage dicts with gradients through E_p: → (B, d)."""
        return self.passage_encoder.encode([self.format_passage(p) for p in passages], self.passage_maxlength)

    def embed_queries(
        self, queries: Sequence[str], *, batch_size: int = 64, precision: str | None = None
    ) -> np.ndarray:
        """Embed queries for search (inference mode): → (Q, d) float32. precision: None = `self.precision`."""
        return self.query_encoder.embed_texts(
            queries,
            batch_size=batch_size,
            max_length=self.query_maxlength,
            precision=(precision if precision is not None else self.precision),
        )

    def embed_passages(
        self,
        passages: Sequence,
        *,
        batch_size: int = 64,
        progress: bool = False,
        sort_by_length: bool = True,
        precision: str | None = None,
    ) -> np.ndarray:
        """Embed passage dicts for indexing (inference mode, length-sorted batches): → (N, d) float32.
        precision: None = `self.precision`."""
        return self.passage_encoder.embed_texts(
            [self.format_passage(p) for p in passages],
            batch_size=batch_size,
            max_length=self.passage_maxlength,
            progress=progress,
            sort_by_length=sort_by_length,
            precision=(precision if precision is not None else self.precision),
        )

    def passage_lengths(self, passages: Sequence) -> np.ndarray:
        """(N,) int64: the tokens each passage dict is embedded with by `embed_passages` (which sorts its batches by
        them); the index build cuts a chunk into blocks in this order (`retriever.index.build.chunk_order`)."""
        return self.passage_encoder.token_lengths([self.format_passage(p) for p in passages], self.passage_maxlength)

    def passage_fingerprint(self) -> str:
        """Hash of everything that fixes a passage's embedding: E_p weights, tokenizer, pooling,
        normalisation, passage format and passage max length. An index records it."""
        return hash_json(
            {
                **self.passage_encoder.fingerprint(),
                "passage_format": self.passage_format,
                "passage_maxlength": self.passage_maxlength,
            }
        )

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write `retriever.json` and the encoder folder(s): `query/` (and `passage/` when untied)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.query_encoder.save_pretrained(directory / "query")
        if not self.tied:
            self.passage_encoder.save_pretrained(directory / "passage")
        settings = {
            "tied": self.tied,
            "passage_format": self.passage_format,
            "query_maxlength": self.query_maxlength,
            "passage_maxlength": self.passage_maxlength,
        }
        (directory / RETRIEVER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        tied: bool | None = None,
        pooling: Pooling | None = None,
        **settings,
    ) -> Retriever:
        """Load a folder written by `save_pretrained`, or build a pair from one encoder folder.

        From a plain encoder folder (HF or sentence-transformers), `tied=False` copies the
        encoder so that the two sides can diverge. `pooling` ("mean" / "cls") overrides the
        pooling stored with the encoder(s) (None: keep it). Keyword settings
        (`passage_format`, `query_maxlength`, `passage_maxlength`) override the stored ones.
        """
        folder = Path(path)
        if (folder / RETRIEVER_CONFIG).is_file():
            stored = json.loads((folder / RETRIEVER_CONFIG).read_text())
            query_encoder = ContrieverEncoder.from_pretrained(folder / "query", pooling=pooling)
            passage_encoder = (
                None if stored.pop("tied") else ContrieverEncoder.from_pretrained(folder / "passage", pooling=pooling)
            )
            if tied is True and passage_encoder is not None:
                raise ValueError(f"{folder}: the stored retriever is untied and cannot be loaded tied")
            if tied is False and passage_encoder is None:
                passage_encoder = copy.deepcopy(query_encoder)
            stored.update(settings)
            return cls(query_encoder=query_encoder, passage_encoder=passage_encoder, **stored)
        query_encoder = ContrieverEncoder.from_pretrained(path, pooling=pooling)
        settings.setdefault("passage_maxlength", query_encoder.max_length or 256)
        passage_encoder = None if tied in (None, True) else copy.deepcopy(query_encoder)
        return cls(query_encoder=query_encoder, passage_encoder=passage_encoder, **settings)

    @classmethod
    def from_config(cls, config: RetrieverConfig) -> Retriever:
        """The retriever a `RetrieverConfig` describes (`config.model`: a folder, a hub name or "minilm").

        `config.precision` is the precision it embeds at (`Retriever.precision`). `config.pooling`, where set,
        decides the pooling of both encoders (a folder saved with another pooling is overridden, with a
        warning); None keeps the folder's own. The passage encoder is frozen unless it is tied or
        `train_passage_encoder` is set.
        """
        retriever = cls.from_pretrained(
            encoder_source(config.model),
            tied=config.tied,
            pooling=config.pooling,
            passage_format=config.passage_format,
            query_maxlength=config.query_maxlength,
            passage_maxlength=config.passage_maxlength,
            precision=config.precision,
        )
        retriever.freeze_passage_side(config.train_passage_encoder)
        return retriever
