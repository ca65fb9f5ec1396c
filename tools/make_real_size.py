"""A recipe's real architectures with random weights: reader and retriever folders the recipe runs with, offline.

The paper recipes name google/t5-base-lm-adapt and facebook/contriever, which cannot be downloaded here. This
writes, under OUT, `reader/` (the T5 v1.1 / lm-adapt architecture, random weights, a 32,000-piece SentencePiece
tokenizer trained on WikiText-2 and SQuAD's Wikipedia paragraphs from ../shared/data) and `retriever/` (BERT-base,
random weights, BERT-base's uncased vocabulary), and prints the overrides that make the recipe read them
(docs/guides/real-size.md; `atlas.real_size`):

    python tools/make_real_size.py configs/nq-64shot.yaml runs/real-size/base
    python tools/make_real_size.py configs/nq-64shot.yaml runs/real-size/large reader.model=google/t5-large-lm-adapt
    python tools/make_real_size.py configs/nq-64shot.yaml runs/real-size/w48 --head-dim 4 --layers 2 --pieces 2000

Dotted overrides after OUT change the recipe first (which architectures it names). The trained tokenizer is kept
under OUT and reused. Written atomically, folder by folder.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

SHARED_DATA = Path(os.environ.get("ATLAS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
# WikiText-2's valid and test splits support about 11,000 unigram pieces; SQuAD v1.1's paragraphs take it to 32,000
DEFAULT_TEXTS = (
    SHARED_DATA / "wikitext-2" / "valid.txt",
    SHARED_DATA / "wikitext-2" / "test.txt",
    SHARED_DATA / "squad" / "train-v1.1.json",
)


def main(argv: list[str] | None = None) -> int:
    from atlas.config import load_config
    from atlas.real_size import training_paragraphs, write_real_size
    from reader.tokenizer import T5_PIECES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path, help="the recipe whose reader.model and retriever.model to build")
    parser.add_argument("out", type=Path, help="folder for reader/, retriever/ and the trained tokenizer")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the recipe (reader.model=…)")
    parser.add_argument("--head-dim", type=int, help="a narrower copy: heads of this size (the published are 64)")
    parser.add_argument("--layers", type=int, help="a shallower copy: layers of each stack")
    parser.add_argument("--pieces", type=int, default=T5_PIECES, help="the tokenizer's SentencePiece pieces")
    parser.add_argument(
        "--text",
        type=Path,
        action="append",
        help="a WikiText .txt or SQuAD .json file to train the tokenizer on (repeatable; default: WikiText-2's "
        "valid and test splits and SQuAD v1.1's training paragraphs from ../shared/data)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the random weights")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT/reader and OUT/retriever")
    args = parser.parse_args(argv)

    files = args.text or [path for path in DEFAULT_TEXTS if path.is_file()]
    if not files:
        parser.error(f"no training text: none of {', '.join(map(str, DEFAULT_TEXTS))} is here (give --text FILE)")
    texts = [paragraph for path in files for paragraph in training_paragraphs(path)]
    config = load_config(args.recipe, args.overrides, check_data=False)
    folders = write_real_size(
        config,
        args.out,
        texts=texts,
        head_dim=args.head_dim,
        layers=args.layers,
        pieces=args.pieces,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    overrides = [*args.overrides, *folders.overrides()]
    print(f"wrote {folders.reader} and {folders.retriever} (random weights); run the recipe with them:")
    print(shlex.join(["atlas", "train", str(args.recipe), *overrides]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
