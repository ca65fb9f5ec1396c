"""Builders: an `Atlas` from a config, or from a checkpoint folder."""

from __future__ import annotations

import logging
from pathlib import Path

from atlas.config import AtlasConfig
from atlas.model import Atlas
from reader.fid import FiDReader, build_reader
from reader.tokenizer import build_reader_tokenizer
from retriever.encoder import Retriever, build_retriever
from retriever.losses import build_retriever_loss

logger = logging.getLogger(__name__)


def _reader_tokenizer(config: AtlasConfig, checkpoint: Path | None):
    if checkpoint is not None:
        return build_reader_tokenizer(checkpoint / "reader")
    if config.reader.tokenizer:
        return build_reader_tokenizer(config.reader.tokenizer)
    from reader.fid import READER_PRESETS

    if config.reader.model in READER_PRESETS:
        return build_reader_tokenizer(None)  # the MiniLM WordPiece vocabulary with T5 sentinels
    return build_reader_tokenizer(config.reader.model)  # the model's own folder or hub name


def _freeze_passage_side(retriever: Retriever, config: AtlasConfig) -> None:
    if not retriever.tied and not config.retriever.train_passage_encoder:
        retriever.passage_encoder.requires_grad_(False)


def build_index(config: AtlasConfig, retriever: Retriever):
    """Open `index.path`, or build an index of `index.corpus` under the run folder once."""
    from retriever.index import PassageIndex

    path = config.index.path
    if path is None and config.index.corpus:
        from retriever.index_build import build_index as build

        path = Path(config.training.output_dir) / "index"
        if not path.exists():
            logger.info("building the index of %s at %s", config.index.corpus, path)
            build(config.index.corpus, retriever, path, spec=config.index.spec,
                  batch_size=config.retriever.batch_size, chunk_size=config.index.chunk_size,
                  train_sample=config.index.train_sample, keep_embeddings=config.index.keep_embeddings,
                  nprobe=config.index.nprobe, ef_search=config.index.ef_search)
    if path is None:
        return None
    index = PassageIndex.load(path, retriever=retriever, allow_encoder_mismatch=config.index.allow_encoder_mismatch,
                              nprobe=config.index.nprobe, ef_search=config.index.ef_search)
    if config.index.sharded:
        import torch.distributed as dist

        from retriever.sharded import ShardedPassageIndex

        if dist.is_initialized():
            index = ShardedPassageIndex.from_index(index, dist.get_rank(), dist.get_world_size())
    return index


def build_atlas(config: AtlasConfig, *, checkpoint: str | Path | None = None, with_index: bool = True) -> Atlas:
    """Build the model a config describes; weights from `checkpoint` when given.

    The reader is a preset built from config (random init), a local HF T5 folder, or the
    checkpoint's `reader/`; the retriever likewise from `retriever.model` or `retriever/`.
    """
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    tokenizer = _reader_tokenizer(config, checkpoint)
    if checkpoint is not None:
        reader = FiDReader.from_pretrained(checkpoint / "reader")
    else:
        reader = build_reader(config.reader.model, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=tokenizer.eos_token_id, dropout=config.reader.dropout,
                              seed=config.training.seed)
    if config.reader.gradient_checkpointing:
        reader.gradient_checkpointing_enable()

    needs_retriever = not config.task.closed_book
    retriever = None
    if needs_retriever:
        if checkpoint is not None and (checkpoint / "retriever").is_dir():
            retriever = Retriever.from_pretrained(checkpoint / "retriever")
        else:
            retriever = build_retriever(config.retriever)
        _freeze_passage_side(retriever, config)
    index = build_index(config, retriever) if (with_index and retriever is not None) else None
    loss = build_retriever_loss(config.retriever.loss, temperature_gold=config.retriever.temperature_gold,
                                temperature_score=config.retriever.temperature_score,
                                emdr_granularity=config.retriever.emdr_granularity)
    return Atlas(reader=reader, reader_tokenizer=tokenizer, retriever=retriever, index=index, retriever_loss=loss,
                 reader_config=config.reader, retriever_config=config.retriever, index_config=config.index,
                 closed_book=config.task.closed_book)
