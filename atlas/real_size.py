"""A recipe's real architectures without their weights: random-weight reader and retriever folders of the sizes the
recipe names, for dry runs, memory and speed measurements, and tests.

The paper recipes name `google/t5-base-lm-adapt` and `contriever` (facebook/contriever), which cannot be downloaded
here. `write_real_size(config, out, texts=…)` writes, under `out`:

- `reader/`: the recipe's T5 (`reader.t5_architectures`: T5 v1.1 / lm-adapt, untied `lm_head`, 32,128 rows) with
  random weights and a 32,000-piece SentencePiece unigram tokenizer trained on `texts` (`train_t5_tokenizer`);
- `retriever/`: the recipe's encoder (`retriever.encoder_architectures`: BERT-base, mean pooling) with random
  weights and BERT-base's own uncased WordPiece vocabulary;
- `t5-sentencepiece-<pieces>-<digest>/`: the trained tokenizer, reused by the next call with the same text and
  size (training the full size takes about a quarter of a minute);
- `README.md`: what the folders are.

`RealSizeFolders.overrides()` are the dotted overrides that make the recipe read them. They differ from the real
checkpoints in their weights (random: the losses and answers mean nothing) and in the reader tokenizer's pieces
(the same count, ids of the special tokens and sentinels, and settings as T5's, learnt from other text: a passage
tokenizes to about as many tokens, not to the same ones). `head_dim` and `layers` narrow both for tests.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from atlas.config import AtlasConfig
from common.io import atomic_directory
from reader.t5_architectures import t5_architecture, write_random_t5
from reader.tokenizer import T5_PIECES, build_reader_tokenizer, train_t5_tokenizer
from retriever.encoder_architectures import encoder_architecture, write_random_contriever

# WikiText's tokenization of punctuation, undone so that the tokenizer learns text as people write it
_WIKITEXT_JOINS = [
    (re.compile(r" ?@([-,.])@ ?"), r"\1"),  # "1 @,@ 000", "well @-@ known"
    (re.compile(r" ([,.;:!?)\]%]|'s|n't|'re|'ve|'ll|'d|'m)(?=\s|$)"), r"\1"),
    (re.compile(r"([(\[$]) "), r"\1"),
]


@dataclass(frozen=True)
class RealSizeFolders:
    """The folders `write_real_size` wrote: the reader (model and tokenizer) and the retriever's encoder."""

    reader: Path
    retriever: Path

    def overrides(self) -> list[str]:
        """The dotted overrides that make a recipe read these folders."""
        return [f"reader.model={self.reader}", f"reader.tokenizer={self.reader}", f"retriever.model={self.retriever}"]


def training_paragraphs(path: str | Path) -> list[str]:
    """The paragraphs of a text file for `train_t5_tokenizer`: a WikiText `.txt` file (headings and blank lines
    dropped, `<unk>` removed, its spacing around punctuation undone) or a SQuAD `.json` file (its contexts)."""
    path = Path(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        return [paragraph["context"] for article in data for paragraph in article["paragraphs"]]
    paragraphs = []
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        line = line.strip()
        if not line or (line.startswith("=") and line.endswith("=")):
            continue
        line = " ".join(word for word in line.split() if word != "<unk>")
        for pattern, joined in _WIKITEXT_JOINS:
            line = pattern.sub(joined, line)
        paragraphs.append(line)
    return paragraphs


def write_real_size(
    config: AtlasConfig,
    out: str | Path,
    *,
    texts: Sequence[str],
    head_dim: int | None = None,
    layers: int | None = None,
    pieces: int = T5_PIECES,
    seed: int = 0,
    overwrite: bool = False,
) -> RealSizeFolders:
    """Write random-weight folders of the architectures `config` names (`reader.model`, `retriever.model`) under
    `out` (module docstring); → the folders.

    Args:
        texts: the paragraphs the reader's SentencePiece tokenizer is trained on (`training_paragraphs`).
        head_dim, layers: a narrower (heads of this size; the published are 64) and shallower copy of both models,
            for tests (`t5_architecture`, `encoder_architecture`); None keeps the published sizes.
        pieces: the tokenizer's pieces (T5's 32,000; fewer for tests: the model keeps its 32,128 rows).
        overwrite: replace `out/reader` and `out/retriever` where they exist.
    Raises ValueError when the recipe names a model that is not a known published architecture.
    """
    out = Path(out)
    reader_name, encoder_name = config.reader.model, config.retriever.model
    t5_architecture(reader_name, head_dim=head_dim, layers=layers)  # a bad name fails before a tokenizer is trained
    encoder_architecture(encoder_name, head_dim=head_dim, layers=layers)
    tokenizer = _cached_tokenizer(texts, out, pieces)
    folders = RealSizeFolders(reader=out / "reader", retriever=out / "retriever")
    write_random_t5(
        reader_name, folders.reader, tokenizer, head_dim=head_dim, layers=layers, seed=seed, overwrite=overwrite
    )
    write_random_contriever(
        encoder_name, folders.retriever, head_dim=head_dim, layers=layers, seed=seed, overwrite=overwrite
    )
    size = "the published sizes" if head_dim is None and layers is None else f"head_dim {head_dim}, layers {layers}"
    (out / "README.md").write_text(
        f"Random weights, not trained models: `reader/` has the architecture of {reader_name} and `retriever/` "
        f"that of {encoder_name} ({size}, seed {seed}). The reader's tokenizer is a {pieces}-piece SentencePiece "
        "model trained here, with T5's layout; the retriever's is BERT-base's uncased WordPiece vocabulary. "
        f"A recipe reads them with: {' '.join(folders.overrides())}\n",
        encoding="utf-8",
    )
    return folders


def _cached_tokenizer(texts: Sequence[str], out: Path, pieces: int):
    """The T5 tokenizer trained on `texts` with `pieces` pieces, from `out`'s cache or trained into it."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\n")
    folder = out / f"t5-sentencepiece-{pieces}-{digest.hexdigest()[:12]}"
    if not folder.is_dir():
        with atomic_directory(folder) as tmp:
            train_t5_tokenizer(texts, tmp, pieces=pieces)
    return build_reader_tokenizer(folder)
