"""Sharded search and the scale simulation.

Part 1 (`--part shard`): the same 1M × d synthetic Flat index searched by 1 process and by
2 processes (gloo, `ShardedPassageIndex`): queries/s and peak RSS per rank, ratio 2p / 1p.
Part 2 (`--part scale`): N (default 30M) synthetic clustered 768-d vectors generated chunk by
chunk from a seed, added to an IVF-PQ index (trained on a sample), peak RSS tracked; then
queries/s and recall@100 against exact search over the first `--slice` vectors (both searches
restricted to that slice by an id selector).

    python bench/sharded_search.py --part shard [--n 1000000 --dim 384]
    python bench/sharded_search.py --part scale [--n 30000000 --spec IVF4096,PQ64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def clustered(rng: np.random.Generator, centroids: np.ndarray, n: int, subspace: int = 32) -> np.ndarray:
    """n unit vectors: a random centroid plus noise in a fixed low-dimensional subspace, as real
    embeddings have (isotropic noise in 768-d would make every neighbour equally far), (n, d)."""
    d = centroids.shape[1]
    basis = np.random.default_rng(12345).standard_normal((subspace, d), dtype=np.float32) / np.sqrt(subspace)
    which = rng.integers(0, len(centroids), n)
    x = centroids[which] + rng.standard_normal((n, subspace), dtype=np.float32) @ basis
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fake_index(vectors: np.ndarray):
    """A `PassageIndex` over raw vectors (no corpus: only search_vectors is used)."""
    from retriever.index import PassageIndex

    n, d = vectors.shape
    manifest = {"segments": [{"offset": 0}], "total": n, "count": n, "dim": d, "spec": "Flat"}
    return PassageIndex(Path("."), manifest, corpora=[], vectors=vectors, faiss_index=None,
                        removed=np.zeros(n, dtype=bool))


def _shard_worker(rank: int, world: int, path: str, queries_path: str, k: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from retriever.sharded import ShardedPassageIndex

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    vectors = np.load(path, mmap_mode="r")
    queries = np.load(queries_path)
    index = ShardedPassageIndex.from_index(fake_index(vectors), rank, world)
    mine = np.array_split(queries, world)[rank]
    dist.barrier()
    start = time.perf_counter()
    scores, rows = index.search_vectors(mine, k)
    dist.barrier()
    seconds = time.perf_counter() - start
    np.save(f"{out}.rows{rank}.npy", rows)
    Path(f"{out}.stats{rank}.json").write_text(json.dumps({"seconds": seconds, "peak_rss_mib": peak_rss_mib()}))
    dist.destroy_process_group()


def part_shard(args) -> dict:
    import torch.multiprocessing as mp

    from retriever.index_types import exact_search

    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="sharded-bench-", dir=args.workdir))
    centroids = rng.standard_normal((1024, args.dim), dtype=np.float32) / np.sqrt(args.dim) * 2
    vectors = np.lib.format.open_memmap(tmp / "vectors.npy", mode="w+", dtype=np.float16, shape=(args.n, args.dim))
    for start in range(0, args.n, 250_000):
        end = min(args.n, start + 250_000)
        vectors[start:end] = clustered(rng, centroids, end - start)
    vectors.flush()
    queries = clustered(rng, centroids, args.queries)
    np.save(tmp / "queries.npy", queries)
    results = {}
    for world in (1, 2):
        out = str(tmp / f"w{world}")
        mp.spawn(_shard_worker, args=(world, str(tmp / "vectors.npy"), str(tmp / "queries.npy"), args.k,
                                      29500 + world, out), nprocs=world, join=True)
        stats = [json.loads(Path(f"{out}.stats{r}.json").read_text()) for r in range(world)]
        rows = np.concatenate([np.load(f"{out}.rows{r}.npy") for r in range(world)])
        results[world] = {"qps": args.queries / max(s["seconds"] for s in stats),
                          "peak_rss_mib_per_rank": [round(s["peak_rss_mib"]) for s in stats], "rows": rows}
    _, exact = exact_search(queries, np.load(tmp / "vectors.npy", mmap_mode="r"), args.k)
    return {
        "n": args.n, "dim": args.dim, "k": args.k, "queries": args.queries,
        "one_process_qps": results[1]["qps"], "two_process_qps": results[2]["qps"],
        "speedup_2p_over_1p": results[2]["qps"] / results[1]["qps"],
        "peak_rss_mib_1p": results[1]["peak_rss_mib_per_rank"],
        "peak_rss_mib_2p_per_rank": results[2]["peak_rss_mib_per_rank"],
        "identical_to_exact_1p": bool((results[1]["rows"] == exact).all()),
        "identical_to_exact_2p": bool((results[2]["rows"] == exact).all()),
    }


def part_scale(args) -> dict:
    import faiss

    from retriever.index_types import build_faiss_index, exact_search

    rng = np.random.default_rng(0)
    dim = 768
    centroids = rng.standard_normal((4096, dim), dtype=np.float32) / np.sqrt(dim) * 2
    index = build_faiss_index(args.spec, dim, "ip")
    t0 = time.perf_counter()
    index.train(clustered(np.random.default_rng(1), centroids, args.train_sample))
    train_s = time.perf_counter() - t0
    first_slice = None
    t0 = time.perf_counter()
    chunk = 250_000  # bounded generation memory (n × d float32 temporaries)
    for start in range(0, args.n, chunk):
        block = clustered(rng, centroids, min(chunk, args.n - start))
        if start == 0:
            first_slice = block[: args.slice].astype(np.float16)
        index.add(block)
        if (start // chunk) % 8 == 7:
            print(f"added {start + len(block):,} vectors, {time.perf_counter() - t0:.0f} s, "
                  f"peak RSS {peak_rss_mib():.0f} MiB", file=sys.stderr, flush=True)
    add_s = time.perf_counter() - t0
    queries = clustered(np.random.default_rng(2), centroids, args.queries)
    ivf = faiss.extract_index_ivf(index)
    ivf.nprobe = args.nprobe
    t0 = time.perf_counter()
    index.search(queries, args.k)
    search_s = time.perf_counter() - t0
    selector = faiss.IDSelectorRange(0, args.slice)
    params = faiss.SearchParametersIVF(sel=selector, nprobe=args.nprobe)
    _, approx = index.search(queries, args.k, params=params)
    _, exact = exact_search(queries, first_slice, args.k)
    recall = float(np.mean([len(set(a) & set(e)) / args.k for a, e in zip(approx, exact)]))
    return {"n": args.n, "dim": dim, "spec": args.spec, "train_s": train_s, "add_s": add_s,
            "add_s_per_million": add_s / (args.n / 1e6), "qps": args.queries / search_s, "nprobe": args.nprobe,
            f"recall@{args.k}_on_first_{args.slice}": recall, "peak_rss_mib": peak_rss_mib(),
            "index_bytes_per_vector": faiss.serialize_index(index).size / args.n if args.n <= 5_000_000 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["shard", "scale"], required=True)
    parser.add_argument("--n", type=int)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--spec", default="IVF4096,PQ64")
    parser.add_argument("--nprobe", type=int, default=64)
    parser.add_argument("--train-sample", type=int, default=200_000)
    parser.add_argument("--slice", type=int, default=1_000_000)
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parents[1] / "runs"))
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.part == "shard":
        args.n = args.n or 1_000_000
        result = part_shard(args)
        print(json.dumps({"benchmark": "sharded_search", **result}, indent=2))
        print(f"\n{'':<12}{'q/s':>9}{'peak RSS MiB / rank':>22}\n{'1 process':<12}{result['one_process_qps']:>9.1f}"
              f"{str(result['peak_rss_mib_1p']):>22}\n{'2 processes':<12}{result['two_process_qps']:>9.1f}"
              f"{str(result['peak_rss_mib_2p_per_rank']):>22}\nratio 2p/1p: {result['speedup_2p_over_1p']:.2f}")
    else:
        args.n = args.n or 30_000_000
        result = part_scale(args)
        print(json.dumps({"benchmark": "scale_simulation", **result}, indent=2))
        print(f"\nN={result['n']:,} {result['spec']}: add {result['add_s_per_million']:.1f} s/M, "
              f"{result['qps']:.0f} q/s, recall@{args.k} {result[f'recall@{args.k}_on_first_{args.slice}']:.3f}, "
              f"peak RSS {result['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
