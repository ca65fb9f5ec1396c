"""The reader's settings (a recipe's `reader` section): which model, what it reads, how it trains.
`FiDReader.from_config` builds from it; `atlas.config.AtlasConfig` holds it; the comment above each field is its
description in the configuration reference."""

from __future__ import annotations

from common.config_section import config_section


@config_section
class ReaderConfig:
    """The Fusion-in-Decoder T5 reader."""

    model: str = "t5-tiny"  # a local HF folder, a hub name, or a preset built from config
    # warm-start presets (reader.warm_start, e.g. "minilm-fid"): the pre-trained encoder under the
    # new T5 decoder ("minilm", a folder or hub name); None = the preset's own
    encoder: str | None = None
    # train only the top n encoder blocks of a warm-started reader (its token embedding frozen);
    # None = all of it
    trainable_encoder_layers: int | None = None
    tokenizer: str | None = None  # defaults to the model folder
    n_context: int = 40  # passages the reader reads (the first n of the retrieved ones)
    # Tokens of each (query, passage) input the reader encodes.
    text_maxlength: int = 512
    # Tokens of a training target kept (longer answers are truncated).
    answer_maxlength: int = 32
    # How the reader's input for one passage is written (fields `{query}`, `{title}`, `{text}`, `{section}`).
    passage_format: str = "{query} title: {title} context: {text}"
    # Recompute the reader's activations in the backward pass instead of keeping them (less memory, slower steps).
    gradient_checkpointing: bool = False
    # The reader's dropout rate; null keeps the model's own (0.1 for the warm-started presets).
    dropout: float | None = None
    # false: no dropout in the reader's encoder (the decoder keeps `dropout`). A retriever loss's gold
    # scores need eval-mode encoder states; with a dropout-free encoder the training pass's states are
    # those, so the loss skips a second encoder pass over the passages the reader reads.
    encoder_dropout: bool = True
    # A preset reader (random init) starts its token embeddings from this encoder's ("minilm",
    # a folder or hub name) for the tokens both vocabularies have; None = random
    init_embeddings: str | None = None
    # μ of the auxiliary loss CE − μ·dispersion (mean pairwise cosine distance of the final
    # decoder states; "On the predictive power of representation dispersion"); 0 = off.
    dispersion_weight: float = 0.0
