"""The model a config describes: each part built from its own settings section (`FiDReader.from_config`,
`Retriever.from_config`, `build_retriever_loss`), then wired into an `AtlasModel` with no index
(`atlas.loading.load_model`, the one way to a model, gives it one)."""

from __future__ import annotations

from pathlib import Path

from atlas.config import AtlasConfig
from atlas.model import AtlasModel
from reader.fid import FiDReader
from reader.tokenizer import reader_tokenizer
from retriever.losses import build_retriever_loss
from retriever.retriever import Retriever


def run_retriever(config: AtlasConfig, checkpoint: str | Path | None) -> Retriever:
    """The retriever of a run (its passage encoder builds the run's index): the checkpoint's, else the config's."""
    if checkpoint is not None and (Path(checkpoint) / "retriever").is_dir():
        return Retriever.from_pretrained(
            Path(checkpoint) / "retriever",
            passage_format=config.retriever.passage_format,
            passage_maxlength=config.retriever.passage_maxlength,
        )
    return Retriever.from_config(config.retriever)


def build_model(config: AtlasConfig, *, checkpoint: str | Path | None = None) -> AtlasModel:
    """The model a config describes, with no index; weights from `checkpoint` (a run's `reader/` and
    `retriever/`) when given, else as `reader.model` and `retriever.model` say."""
    folder = Path(checkpoint) / "reader" if checkpoint is not None else None
    tokenizer = reader_tokenizer(config.reader, folder)
    reader = FiDReader.from_config(config.reader, tokenizer, folder=folder, seed=config.training.seed)
    if config.inference.retrieval_prior and not reader.copies_from_source:
        raise ValueError(
            "inference.retrieval_prior weights a copy head's pointer; this reader has no copy head (set it to 0)"
        )
    retriever = None
    if not config.task.closed_book:
        retriever = run_retriever(config, checkpoint)
        retriever.freeze_passage_side(config.retriever.train_passage_encoder)
    loss = build_retriever_loss(
        config.retriever.loss.name,
        temperature_gold=config.retriever.temperature_gold,
        temperature_score=config.retriever.temperature_score,
        gold_precision=config.retriever.gold_precision,
        **config.retriever.loss.options,
    )
    return AtlasModel(
        reader=reader,
        reader_tokenizer=tokenizer,
        retriever=retriever,
        index=None,
        retriever_loss=loss,
        reader_config=config.reader,
        retriever_config=config.retriever,
        index_config=config.index,
        inference_config=config.inference,
        closed_book=config.task.closed_book,
    )
