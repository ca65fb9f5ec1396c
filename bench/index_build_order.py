"""Benchmark the order an index build cuts a chunk into blocks: row order against length order.

`retriever.index.build.embed_corpus` embeds a chunk (`chunk_size` passages) in blocks of BLOCK_ROWS, and the encoder
sorts by token length only within a block. `block_order="corpus"` takes the blocks in row order (builds before the
length order: each block a random mix of lengths, its batches padded to that mix); "length" (the default) cuts them
from the chunk sorted longest first by tokens (`Retriever.passage_lengths`). Both embed the same seeded sample of the
chunked nq824 + WikiText-2 corpus with MiniLM (batch 64, max 256 tokens, the retriever's own precision), as the
embedding step of a `Flat` build (a Flat index is these vectors; the rest of its build is a hard link and a
manifest), alternating the two orders round by round so that a load from other processes falls on both. Reported:
passages/s of each, the ratio, and the padding of each order's batches counted from the token lengths (the share of
the computed tokens that are padding; machine-free).

    python bench/index_build_order.py [--passages 4096] [--rounds 2] [--out bench/results/cpu/index-build-order.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index_data import NQ824_RUN, ensure_nq824_corpus  # bench/index_data.py

from atlas.config import RetrieverConfig
from retriever.corpus import Corpus, merge_corpora
from retriever.index import build as index_build
from retriever.index.embedding import embedding_precision
from retriever.retriever import Retriever

ORDERS = ("corpus", "length")  # the baseline first


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--corpus", type=Path, default=NQ824_RUN / "corpus", help="a prepared corpus (default: nq824 + WikiText-2)"
    )
    parser.add_argument("--passages", type=int, default=4096, help="the seeded sample of the corpus embedded")
    parser.add_argument("--chunk-size", type=int, default=8192, help="the build's chunk_size")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="builds of each order, alternated")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    return parser.parse_args()


def sample_corpus(args, folder: Path) -> Corpus:
    """The seeded sample of `--passages` rows of the corpus, in corpus order, as a corpus of its own in `folder`."""
    if args.corpus == NQ824_RUN / "corpus":
        ensure_nq824_corpus(args.corpus)
    corpus = Corpus.load(args.corpus)
    rows = np.sort(np.random.default_rng(0).choice(len(corpus), size=min(args.passages, len(corpus)), replace=False))
    return merge_corpora([(corpus, rows)], folder / "sample")


def padding(corpus: Corpus, retriever: Retriever, chunk_size: int, batch_size: int) -> dict[str, float]:
    """For each order, the share of the tokens its batches compute that are padding: blocks of BLOCK_ROWS cut from
    each chunk in that order, each block batched longest first by token length, as `embed_texts` does."""
    texts = [retriever.format_passage(p) for p in corpus.rows(range(len(corpus)))]
    encoder = retriever.passage_encoder
    tokens = encoder.tokenizer(texts, truncation=True, max_length=retriever.passage_maxlength)["input_ids"]
    lengths = np.array([len(ids) for ids in tokens])
    shares = {}
    for order in ORDERS:
        computed = 0
        for start in range(0, len(corpus), chunk_size):
            rows = index_build.chunk_order(corpus, start, chunk_size, retriever, order)
            for first in range(0, len(rows), index_build.BLOCK_ROWS):
                block = np.sort(lengths[rows[first : first + index_build.BLOCK_ROWS]])[::-1]
                computed += sum(
                    len(b) * int(b.max()) for b in np.split(block, range(batch_size, len(block), batch_size))
                )
        shares[order] = round(1 - int(lengths.sum()) / computed, 4)
    return shares


def timed_builds(corpus: Corpus, retriever: Retriever, args, folder: Path) -> dict[str, list[float]]:
    """Seconds of each embedding of the whole sample, per order, `--rounds` of each, the orders alternated (round r
    starts with the baseline when r is even)."""
    seconds: dict[str, list[float]] = {order: [] for order in ORDERS}
    for r in range(args.rounds):
        for order in ORDERS if r % 2 == 0 else ORDERS[::-1]:
            work = folder / f"{order}-{r}"
            start = time.perf_counter()
            index_build.embed_corpus(
                corpus,
                retriever,
                work,
                batch_size=args.batch_size,
                chunk_size=args.chunk_size,
                progress=False,
                precision=embedding_precision(retriever, None),
                block_order=order,
            )
            seconds[order].append(round(time.perf_counter() - start, 2))
            shutil.rmtree(work)
            print(f"round {r} {order}: {seconds[order][-1]} s", file=sys.stderr, flush=True)
    return seconds


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    args = parse_args()
    retriever = Retriever.from_config(RetrieverConfig(model="minilm"))
    with tempfile.TemporaryDirectory(prefix="index-build-order-") as tmp:
        corpus = sample_corpus(args, Path(tmp))
        shares = padding(corpus, retriever, args.chunk_size, args.batch_size)
        seconds = timed_builds(corpus, retriever, args, Path(tmp))
    rates = {order: [round(len(corpus) / s, 2) for s in seconds[order]] for order in ORDERS}
    mean = {order: round(float(np.mean(rates[order])), 2) for order in ORDERS}
    report = {
        "benchmark": "index_build_order",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "command": "python " + " ".join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
        "passages": len(corpus),
        "chunk_size": args.chunk_size,
        "block_rows": index_build.BLOCK_ROWS,
        "batch_size": args.batch_size,
        "embedding_precision": embedding_precision(retriever, None),
        "rounds": args.rounds,
        "seconds": seconds,
        "passages_per_s": rates,
        "mean_passages_per_s": mean,
        "length_vs_corpus": round(mean["length"] / mean["corpus"], 3),
        "length_vs_corpus_per_round": [round(a / b, 3) for a, b in zip(rates["length"], rates["corpus"])],
        "padding_share": shares,
    }
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
