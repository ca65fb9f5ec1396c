"""Benchmark index loading: seconds and peak RSS against the index's size on disk.

Index folders are built once under --workdir by `build_index` over a synthetic corpus of N
one-line documents; the vectors are clustered synthetic vectors handed out by a stand-in
vector source (embedding N passages with a real encoder is not what is measured here).
Each load runs in a fresh child process: peak RSS growth = the kernel's high-water mark
(VmHWM, reset just before) after the load minus the RSS before it (after imports).
`PassageIndex.load` memory-maps float16 vectors and every FAISS family with the flags FAISS
supports for it (IVF lists on disk, flat codes and HNSW storage in place), so growth is far
below the size. Each index is loaded twice: as `atlas index search` and every torchrun rank
load it (sizes checked), and with `verify=True` (`atlas index info --verify`: SHA-256 of every
byte, which costs time, not memory). Issue 3 target: peak RSS growth ≤ 1.2 × size on disk,
for every spec, on the default load. A first search is timed too (it pages the data in).

    python bench/index_load.py [--n 200000] [--dim 384] [--workdir runs/bench-index-load]
"""

from __future__ import annotations

import os

# On a shared, oversubscribed machine OpenMP threads that spin-wait at barriers stall FAISS
# training by 10-50x (measured: PQ training 4.3 s active vs 0.08 s passive); sleep instead.
# Set before numpy/torch/faiss load their OpenMP runtimes; applies to ours and baselines alike.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from index_data import peak_rss_bytes, print_targets, reset_peak_rss, target  # bench/index_data.py

ROOT = Path(__file__).resolve().parents[1]
SPECS = ["Flat", "IVF256,PQ64", "SQ8", "IVF256,Flat", "PQ64", "HNSW32"]


class ClusteredVectors:
    """Stands in for a Retriever's passage side: passage "s{i}" → a fixed clustered unit vector."""

    def __init__(self, dim: int):
        self.dim, self.passage_format, self.passage_maxlength = dim, "{title} {text}", 256
        self.centres = np.random.default_rng(0).standard_normal((1000, dim)).astype(np.float32)

    def passage_fingerprint(self) -> str:
        return f"synthetic-clustered-{self.dim}"

    def passage_lengths(self, passages) -> np.ndarray:
        return np.zeros(len(passages), dtype=np.int64)  # no tokens: a build takes a chunk in row order

    def embed_passages(self, passages, **_) -> np.ndarray:
        rows = np.array([int(p["id"][1:]) for p in passages])
        noise = np.stack([np.random.default_rng(int(r)).standard_normal(self.dim) for r in rows]).astype(np.float32)
        x = self.centres[rows % 1000] + 0.5 * noise
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def build(workdir: Path, n: int, dim: int) -> list[Path]:
    sys.path.insert(0, str(ROOT))
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.index.settings import IndexSettings

    corpus = workdir / f"corpus-{n}"
    if not corpus.exists():
        docs = workdir / f"docs-{n}.jsonl"
        docs.write_text(
            "".join(json.dumps({"id": f"s{i}", "title": "", "text": f"passage {i}"}) + "\n" for i in range(n))
        )
        prepare_corpus([docs], corpus, chunk_words=0, progress=False)
    source, folders = ClusteredVectors(dim), []
    for spec in SPECS:
        out = workdir / f"index-{n}-{dim}-{spec.replace(',', '_')}"
        if not out.exists():
            build_index(
                corpus, source, out, IndexSettings(spec=spec, chunk_size=65536, train_sample=65536), progress=False
            )
        folders.append(out)
    return folders


def child(folder: str, verify: str) -> None:
    import time

    sys.path.insert(0, str(ROOT))
    import datasets  # noqa: F401  (imported lazily by the corpus; import cost is not load cost)

    from retriever.corpus import Corpus
    from retriever.index import PassageIndex
    from retriever.index.manifest import Manifest

    # one-time costs that do not scale with the index (lazy imports and Arrow set-up of the
    # corpus reader, ~3.5 MB) are paid before the measurement
    for segment in Manifest.load(folder).segments:
        Corpus.load(segment.corpus)
    # ru_maxrss is inherited from the parent across fork+exec, so use the kernel's high-water
    # mark instead, reset to the current RSS just before the load
    before = reset_peak_rss()
    start = time.perf_counter()
    index = PassageIndex.load(folder, verify=verify == "verify")
    load_s = time.perf_counter() - start
    peak_growth = peak_rss_bytes() - before
    query = np.random.default_rng(1).standard_normal((1, index.dim)).astype(np.float32)
    start = time.perf_counter()
    index.search_vectors(query, 10)
    print(
        json.dumps(
            {
                "load_s": load_s,
                "peak_growth_bytes": peak_growth,
                "first_search_s": time.perf_counter() - start,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--workdir", type=Path, default=ROOT / "runs" / "bench-index-load")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "VERIFY"))
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    args.workdir.mkdir(parents=True, exist_ok=True)
    from retriever.index.manifest import Manifest  # heavy: faiss (the children measure their own imports)

    results = []
    for folder in build(args.workdir, args.n, args.dim):
        manifest = Manifest.load(folder)
        size = sum(r.bytes for r in manifest.files.values())
        for verify in ("no-verify", "verify"):
            out = (
                subprocess.run(
                    [sys.executable, __file__, "--child", str(folder), verify],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            r = json.loads(out)
            results.append(
                {
                    "spec": manifest.spec,
                    "verify_sha256": verify == "verify",
                    "size_mb": size / 1e6,
                    "load_s": round(r["load_s"], 3),
                    "peak_growth_mb": round(r["peak_growth_bytes"] / 1e6, 1),
                    "growth_vs_size": round(r["peak_growth_bytes"] / size, 2),
                    "first_search_s": round(r["first_search_s"], 3),
                }
            )
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    targets = [
        target(f"{r['spec']}: load peak RSS growth / size on disk", r["growth_vs_size"], "<=", 1.2)
        for r in results
        if not r["verify_sha256"]
    ]
    print(
        json.dumps(
            {"benchmark": "index_load", "n": args.n, "dim": args.dim, "results": results, "targets": targets},
            indent=1,
        )
    )
    print(
        f"\n{'spec':14s} {'sha256':>6s} {'size MB':>8s} {'load s':>7s} {'peak+ MB':>9s} {'peak/size':>9s} "
        f"{'1st search s':>12s}"
    )
    for r in results:
        print(
            f"{r['spec']:14s} {r['verify_sha256']!s:>6s} {r['size_mb']:8.1f} {r['load_s']:7.3f} "
            f"{r['peak_growth_mb']:9.1f} {r['growth_vs_size']:9.2f} {r['first_search_s']:12.3f}"
        )
    print_targets(targets)


if __name__ == "__main__":
    main()
