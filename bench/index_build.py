"""Benchmark passage embedding for index builds: length-sorted vs naive batches, and a roofline.

Workload: a seeded random sample of passages of the chunked nq824 + WikiText-2 corpus
(`atlas corpus prepare` output), embedded with the default encoder (all-MiniLM-L6-v2,
max 256 tokens, batch 64) by `ContrieverEncoder.embed_texts`:
- sorted: batches formed from length-sorted texts (ours);
- naive: the same texts batched in corpus order, each batch padded to its longest text.
Roofline: achieved GFLOP/s (useful FLOPs = those on non-padding tokens, counted from the
model's shapes) against the GFLOP/s of a plain float32 matmul of the encoder's FFN shape,
measured in the same run. Targets: sorted ≥ 1.5× naive passages/s (issue 3), and sorted useful
GFLOP/s ≥ 0.85× the matmul roofline (issue 16; issue 3 asked 0.7×).

Default corpus: runs/bench-nq824/corpus (made by bench/nq824.py, or here when absent).

    python bench/index_build.py [--corpus runs/bench-nq824/corpus] [--sample 768]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from index_data import NQ824_RUN, ensure_nq824_corpus, print_targets, target  # bench/index_data.py

from common.modeling import encoder_source
from retriever.corpus import Corpus
from retriever.retriever import Retriever


def flops_per_sequence(config, length: int) -> float:
    """Forward FLOPs of a BERT encoder on one sequence of `length` tokens (matmuls only)."""
    d, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    linear = 2 * length * (4 * d * d + 2 * d * ffn)  # Q, K, V, output projections + FFN
    attention = 2 * 2 * length * length * d  # scores and weighted values
    return layers * (linear + attention)


def matmul_gflops(d: int, ffn: int, rows: int = 8192, repeats: int = 5, device: torch.device | None = None) -> float:
    """GFLOP/s of a plain (rows, d) @ (d, ffn) matmul: float32 on the CPU, bfloat16 on CUDA (the
    precision `ContrieverEncoder` autocasts to there)."""
    device = device or torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    repeats = repeats * 20 if device.type == "cuda" else repeats
    a, b = torch.randn(rows, d, device=device, dtype=dtype), torch.randn(d, ffn, device=device, dtype=dtype)
    a @ b  # warm-up
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * rows * d * ffn * repeats / (time.perf_counter() - start) / 1e9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--corpus",
        type=Path,
        default=NQ824_RUN / "corpus",
        help="a prepared corpus (default: the nq824 + WikiText-2 one, built if absent)",
    )
    parser.add_argument("--sample", type=int, default=768)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast there)")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    return parser.parse_args()


def sample_texts(args, retriever) -> tuple[list[str], np.ndarray]:
    """The seeded sample of the corpus as the encoder reads it → (texts, token count of each)."""
    if args.corpus == NQ824_RUN / "corpus":
        ensure_nq824_corpus(args.corpus)
    corpus = Corpus.load(args.corpus)
    rows = np.sort(np.random.default_rng(0).choice(len(corpus), size=min(args.sample, len(corpus)), replace=False))
    texts = [retriever.format_passage(p) for p in corpus.rows(rows)]
    tokenized = retriever.passage_encoder.tokenizer(texts, truncation=True, max_length=retriever.passage_maxlength)
    return texts, np.array([len(ids) for ids in tokenized["input_ids"]])


def measure_batching(retriever, texts: list[str], lengths: np.ndarray, batch_size: int) -> dict:
    """Embeds the texts in corpus order (`naive`) and length-sorted (`sorted`) → {name: seconds, rates, padding}."""
    encoder = retriever.passage_encoder
    config = encoder.model.config
    useful = sum(flops_per_sequence(config, int(n)) for n in lengths)
    encoder.embed_texts(texts[:16], batch_size=16)  # warm-up
    results = {}
    for name, sort in (("naive", False), ("sorted", True)):
        start = time.perf_counter()
        encoder.embed_texts(texts, batch_size=batch_size, max_length=retriever.passage_maxlength, sort_by_length=sort)
        seconds = time.perf_counter() - start
        order = np.argsort(-lengths, kind="stable") if sort else np.arange(len(texts))
        padded = sum(
            len(batch) * flops_per_sequence(config, int(batch.max()))
            for batch in (lengths[order[i : i + batch_size]] for i in range(0, len(order), batch_size))
        )
        results[name] = {
            "seconds": round(seconds, 2),
            "passages_per_s": round(len(texts) / seconds, 2),
            "useful_gflops_per_s": round(useful / seconds / 1e9, 1),
            "computed_gflops_per_s": round(padded / seconds / 1e9, 1),
            "padding_fraction": round(1 - useful / padded, 3),
        }
    return results


def print_table(report: dict) -> None:
    print(f"\n{'batches':8s} {'passages/s':>11s} {'useful GFLOP/s':>15s} {'computed GFLOP/s':>17s} {'padding':>8s}")
    for name in ("naive", "sorted"):
        r = report[name]
        print(
            f"{name:8s} {r['passages_per_s']:11.2f} {r['useful_gflops_per_s']:15.1f} "
            f"{r['computed_gflops_per_s']:17.1f} {r['padding_fraction']:8.3f}"
        )
    print(
        f"plain matmul {report['matmul_gflops_per_s']:.1f} GFLOP/s; sorted/naive {report['sorted_vs_naive']}x; "
        f"sorted useful/roofline {report['sorted_useful_vs_roofline']}"
    )
    print_targets(report["targets"])


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    retriever = Retriever.from_pretrained(encoder_source("minilm")).to(device)
    texts, lengths = sample_texts(args, retriever)
    results = measure_batching(retriever, texts, lengths, args.batch_size)
    config = retriever.passage_encoder.model.config
    peak = matmul_gflops(config.hidden_size, config.intermediate_size, device=device)
    report = {
        "benchmark": "index_build",
        "passages": len(texts),
        "mean_tokens": round(float(lengths.mean()), 1),
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        **results,
        "matmul_gflops_per_s": round(peak, 1),
        "sorted_vs_naive": round(results["sorted"]["passages_per_s"] / results["naive"]["passages_per_s"], 2),
        "sorted_useful_vs_roofline": round(results["sorted"]["useful_gflops_per_s"] / peak, 2),
    }
    report["targets"] = [
        target("sorted / naive passages/s", report["sorted_vs_naive"], ">=", 1.5),
        target("sorted useful GFLOP/s / matmul roofline", report["sorted_useful_vs_roofline"], ">=", 0.85),
    ]
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print_table(report)


if __name__ == "__main__":
    main()
