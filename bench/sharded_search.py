"""Sharded search (issue 7) and the scale simulation: 30M vectors into IVF-PQ under 12 GiB.

Part 1 (`--part shard`): a 1M × d synthetic clustered index (saved by `build_index` over a
synthetic corpus, one folder per spec, kept in --workdir) is loaded and searched through the
project's own path (`PassageIndex.load`, `ShardedPassageIndex.from_index`, `search_vectors`)
by
    1 process × 1 thread, 1 process × 2 threads (the baseline: the same two cores),
    2 processes × 1 thread (gloo; each rank holds and searches its half),
each in fresh spawned processes. Per process: load seconds, queries/s, and peak RSS = the
kernel's high-water mark (VmHWM) after resetting it (/proc/self/clear_refs) once the imports
and a warm-up of the thread pools and collectives are done (ru_maxrss would report the
parent's RSS in a spawned child); "growth" is that peak minus the RSS at the reset: what
loading and searching the index cost. It includes the file pages a process maps and touches
(a Flat rank touches only its rows). Results of 2 processes
must equal 1 process (and, for Flat, exact search).

Part 2 (`--part scale`): N (default 30M) synthetic clustered 768-d vectors, generated block
by block from a seed (never all in memory, nothing on disk), go through the project's index
code: `retriever.index.build.train_and_fill` (trained on a seeded sample, filled chunk by
chunk), saved with FAISS, then in a fresh process loaded with `read_faiss` and the family's
memory-map flags and searched with `search_live` (queries/s; recall@100 against the project's
`exact_search` over the first --slice vectors, the IVF search restricted to the same slice).
`atlas index build` itself is not used at this size: it first embeds a prepared corpus into a
float16 memmap on disk (30M × 768 × 2 B = 46 GB, plus a 30M-passage corpus), which generated
vectors stand in for. Reported: peak RSS against the 12 GiB limit, wall and memory per million
vectors, and (when N < 30M) the extrapolation to 30M.

    python bench/sharded_search.py --part shard [--n 1000000 --dim 384 --specs Flat IVF1024,PQ64]
    python bench/sharded_search.py --part scale [--n 30000000 --spec IVF4096,PQ64]
Prints JSON, then a table with ratios to the baseline of the same run, then the issue targets.
"""

from __future__ import annotations

import os

# OpenMP threads that spin-wait stall FAISS on a busy 2-core machine; sleep instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from index_data import (
    current_rss_bytes,
    peak_rss_bytes,
    print_targets,
    reset_peak_rss,
    target,
)

GIB = 2**30
RSS_LIMIT_GIB = 12.0
SCALE_TARGET_N = 30_000_000


class ClusteredVectors:
    """N synthetic unit vectors (N, d) float32, generated block by block from a seed.

    Row i is a random centroid plus noise in a fixed 32-d subspace (real embeddings have
    such structure; isotropic noise in 768-d would make every neighbour equally far).
    Indexing with a slice or a sorted int array generates only the blocks it needs (one
    block cached), so N can exceed memory. Also serves as a retriever's passage side for
    `build_index` (passage "s{i}" → row i).
    """

    def __init__(self, n: int, dim: int, *, seed: int = 0, centroids: int = 4096, block: int = 32768):
        self.shape = (n, dim)
        self.dim, self.seed, self.block = dim, seed, block
        rng = np.random.default_rng([seed, 1])
        self.centroids = rng.standard_normal((centroids, dim), dtype=np.float32) / np.sqrt(dim) * 2
        self.basis = rng.standard_normal((32, dim), dtype=np.float32) / np.sqrt(32)
        self._cached: tuple[int, np.ndarray] | None = None
        # the passage-side interface of a Retriever, for build_index
        self.passage_format, self.passage_maxlength = "{title} {text}", 0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n new vectors (n, d) from `rng`, around the same centroids."""
        x = self.centroids[rng.integers(0, len(self.centroids), n)]
        x = x + rng.standard_normal((n, 32), dtype=np.float32) @ self.basis
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def _block(self, b: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != b:
            rows = min(self.block, self.shape[0] - b * self.block)
            self._cached = (b, self.draw(np.random.default_rng([self.seed, 2, b]), rows))
        return self._cached[1]

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, _ = key.indices(self.shape[0])
            key = np.arange(start, stop)
        rows = np.asarray(key, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        blocks = rows // self.block
        for b in np.unique(blocks):  # rows are sorted in every use here: one pass per block
            sel = blocks == b
            out[sel] = self._block(int(b))[rows[sel] - b * self.block]
        return out

    def passage_fingerprint(self) -> str:
        return f"clustered-{self.shape[0]}-{self.dim}-seed{self.seed}"

    def passage_lengths(self, passages) -> np.ndarray:
        return np.zeros(len(passages), dtype=np.int64)  # no tokens: a build takes a chunk in row order

    def embed_passages(self, passages, **_) -> np.ndarray:
        return self[np.array([int(p["id"][1:]) for p in passages])]


# ---------------------------------------------------------------- part 1: sharded search


def build_folders(workdir: Path, n: int, dim: int, specs: list[str]) -> dict[str, Path]:
    """Index folders (one per spec) over one synthetic corpus of n passages; reused if there."""
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.index.settings import IndexSettings

    corpus = workdir / f"corpus-{n}"
    if not (corpus / "corpus.json").is_file():
        docs = workdir / f"docs-{n}.jsonl"
        with open(docs, "w") as f:
            f.writelines(f'{{"id": "s{i}", "text": "passage {i}"}}\n' for i in range(n))
        prepare_corpus([docs], corpus, chunk_words=0, progress=False, overwrite=True)
        docs.unlink()
    source, folders = ClusteredVectors(n, dim), {}
    for spec in specs:
        out = workdir / f"index-{n}-{dim}-{spec.replace(',', '_')}"
        if not (out / "manifest.json").is_file():
            print(f"building {spec} over {n:,} × {dim}", file=sys.stderr, flush=True)
            build_index(
                corpus,
                source,
                out,
                IndexSettings(spec=spec, chunk_size=65536, train_sample=min(n, 131072)),
                progress=False,
                overwrite=out.exists(),
            )
        folders[spec] = out
    return folders


def _warm_up(queries: np.ndarray, k: int, world: int) -> None:
    """Pay the constant costs that do not depend on the index before measuring: thread pools
    of torch and FAISS, and (several processes) gloo's buffers for collectives of the sizes a
    sharded search exchanges (queries, then scores and positions)."""
    import faiss
    import torch
    import torch.distributed as dist

    probe = faiss.IndexFlatIP(queries.shape[1])
    probe.add(queries)
    probe.search(queries, min(k, len(queries)))
    scores = torch.from_numpy(queries) @ torch.from_numpy(queries).T
    scores.topk(min(k, len(queries)), dim=1)
    if world > 1:
        rows = -(-len(queries) // world)
        for tensor in (
            torch.zeros(1, dtype=torch.long),
            torch.zeros(rows, queries.shape[1]),
            torch.zeros(rows * world, k),
            torch.zeros(rows * world, k, dtype=torch.long),
        ):
            dist.all_gather([torch.empty_like(tensor) for _ in range(world)], tensor)


def _shard_worker(
    rank: int, world: int, threads: int, folder: str, queries_path: str, k: int, port: int, out: str
) -> None:
    """One process of a run: load (sharded when world > 1), search its share of the queries."""
    import gc

    import faiss
    import torch
    import torch.distributed as dist

    from retriever.corpus import Corpus
    from retriever.index import PassageIndex
    from retriever.index.manifest import Manifest
    from retriever.index.sharded import ShardedPassageIndex

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    for segment in Manifest.load(folder).segments:  # one-time corpus-reader set-up
        Corpus.load(segment.corpus)
    queries = np.load(queries_path)
    _warm_up(queries, k, world)
    baseline = reset_peak_rss()
    start = time.perf_counter()
    loaded = PassageIndex.load(folder)
    index = ShardedPassageIndex.from_index(loaded, rank, world)
    del loaded  # this rank keeps only its shard
    gc.collect()
    load_s = time.perf_counter() - start
    after_load = current_rss_bytes()
    mine = np.array_split(queries, world)[rank]
    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    scores, rows = index.search_vectors(mine, k)
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    np.save(f"{out}.rows{rank}.npy", rows)
    np.save(f"{out}.scores{rank}.npy", scores)
    Path(f"{out}.stats{rank}.json").write_text(
        json.dumps(
            {
                "seconds": seconds,
                "load_s": load_s,
                "baseline_rss": baseline,
                "rss_after_load": after_load,
                "peak_rss": peak_rss_bytes(),
                "holdings": index.holdings(),
            }
        )
    )
    if world > 1:
        dist.destroy_process_group()


def part_shard(args) -> dict:
    import torch.multiprocessing as mp

    from retriever.index.exact_search import exact_search

    workdir = Path(args.workdir) / "bench-sharded"
    workdir.mkdir(parents=True, exist_ok=True)
    folders = build_folders(workdir, args.n, args.dim, args.specs)
    queries = ClusteredVectors(args.n, args.dim).draw(np.random.default_rng(7), args.queries)
    np.save(workdir / "queries.npy", queries)
    runs = [("1 process × 1 thread", 1, 1), ("1 process × 2 threads", 1, 2), ("2 processes × 1 thread", 2, 1)]
    report: dict = {"n": args.n, "dim": args.dim, "k": args.k, "queries": args.queries, "specs": {}}
    for spec, folder in folders.items():
        size = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in {".npy", ".faiss"})
        rows_by_run, spec_report = {}, {"size_on_disk_mib": size / 2**20, "runs": []}
        for i, (name, world, threads) in enumerate(runs):
            out = str(workdir / f"run-{spec.replace(',', '_')}-{world}x{threads}")
            mp.spawn(
                _shard_worker,
                args=(world, threads, str(folder), str(workdir / "queries.npy"), args.k, 29500 + 10 * i, out),
                nprocs=world,
                join=True,
            )
            stats = [json.loads(Path(f"{out}.stats{r}.json").read_text()) for r in range(world)]
            rows_by_run[name] = (
                np.concatenate([np.load(f"{out}.scores{r}.npy") for r in range(world)]),
                np.concatenate([np.load(f"{out}.rows{r}.npy") for r in range(world)]),
            )
            spec_report["runs"].append(
                {
                    "run": name,
                    "processes": world,
                    "threads": threads,
                    "qps": args.queries / max(s["seconds"] for s in stats),
                    "load_s": max(s["load_s"] for s in stats),
                    "peak_rss_mib_per_process": [round(s["peak_rss"] / 2**20) for s in stats],
                    "growth_mib_per_process": [round((s["peak_rss"] - s["baseline_rss"]) / 2**20) for s in stats],
                    "holdings": [s["holdings"] for s in stats],
                }
            )
            print(json.dumps({"spec": spec, **spec_report["runs"][-1]}), file=sys.stderr, flush=True)
        baseline = next(r for r in spec_report["runs"] if r["run"] == "1 process × 2 threads")
        for r in spec_report["runs"]:
            r["qps_vs_baseline"] = r["qps"] / baseline["qps"]
            r["max_growth_vs_baseline"] = max(r["growth_mib_per_process"]) / max(
                1, max(baseline["growth_mib_per_process"])
            )
        one = rows_by_run["1 process × 1 thread"]
        spec_report["two_processes_vs_one"] = compare(rows_by_run["2 processes × 1 thread"], one)
        if spec == "Flat":
            exact = exact_search(queries, np.load(folder / "vectors.g1.npy", mmap_mode="r"), args.k)
            spec_report["one_process_vs_exact"] = compare(one, exact)
        report["specs"][spec] = spec_report
    return report


def compare(got: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray]) -> dict:
    """(scores, rows) against (scores, rows), both (Q, k): identical, or identical up to exact
    ties in score at the k-th place (which of equally scored passages made the cut)."""
    (scores, rows), (want_scores, want_rows) = got, expected
    same_scores = bool(np.array_equal(scores, want_scores))
    above = scores > scores[:, -1:]  # strictly better than the k-th score
    return {
        "identical": bool(np.array_equal(rows, want_rows)) and same_scores,
        "identical_up_to_ties_at_k": same_scores and bool((rows[above] == want_rows[above]).all()),
        "queries_differing": int((rows != want_rows).any(axis=1).sum()),
    }


def shard_targets(report: dict) -> list[dict]:
    targets = []
    for spec, r in report["specs"].items():
        same = r["two_processes_vs_one"]
        targets.append(
            target(
                f"{spec}: 2-process results = 1 process (up to exact score ties at k)",
                float(same["identical_up_to_ties_at_k"]),
                ">=",
                1,
                f"{same['queries_differing']} queries differ at all",
            )
        )
        two = next(x for x in r["runs"] if x["processes"] == 2)
        one = next(x for x in r["runs"] if x["run"] == "1 process × 2 threads")
        if not spec.startswith("HNSW"):  # split by rows (HNSW is searched replicated: no split)
            targets.append(
                target(
                    f"{spec}: peak RSS growth per rank / 1 process",
                    two["max_growth_vs_baseline"],
                    "<",
                    1.0,
                    f"{two['growth_mib_per_process']} vs {one['growth_mib_per_process']} MiB; "
                    "issue 7 sets no figure: sharding must divide memory",
                )
            )
    return targets


def print_shard(report: dict) -> None:
    print(f"\n{'spec':<14}{'run':<24}{'q/s':>8}{'× base':>8}{'load s':>8}{'peak RSS MiB':>16}{'growth MiB':>14}")
    for spec, r in report["specs"].items():
        for x in r["runs"]:
            print(
                f"{spec:<14}{x['run']:<24}{x['qps']:>8.1f}{x['qps_vs_baseline']:>8.2f}{x['load_s']:>8.2f}"
                f"{x['peak_rss_mib_per_process']!s:>16}{x['growth_mib_per_process']!s:>14}"
            )
    print("baseline: 1 process × 2 threads (same cores as 2 × 1)")


# ---------------------------------------------------------------- part 2: scale simulation


def part_scale(args) -> dict:
    """An IVF index of `args.n` generated vectors built in this process (time, memory), searched in a fresh one."""
    from retriever.index.exact_search import exact_search
    from retriever.index.types import index_type

    if index_type(args.spec, 768).search_param != "nprobe":
        raise SystemExit(f"--spec {args.spec}: the scale simulation is for IVF specs")
    workdir = Path(args.workdir) / "bench-scale"
    workdir.mkdir(parents=True, exist_ok=True)
    vectors = ClusteredVectors(args.n, 768, seed=0)
    baseline = reset_peak_rss()
    path = workdir / "index.faiss"
    built = build_at_scale(args, vectors, path)
    queries = vectors.draw(np.random.default_rng(3), args.queries)
    np.save(workdir / "queries.npy", queries)
    slice_n = min(args.slice, args.n)
    t0 = time.perf_counter()
    _, exact = exact_search(queries, vectors[0:slice_n], args.k)
    exact_s = time.perf_counter() - t0
    searched = search_in_child(args, path, workdir / "queries.npy", slice_n)
    approx = np.load(workdir / "approx.npy")
    recall = float(np.mean([len(set(a) & set(e)) / args.k for a, e in zip(approx, exact)]))
    size = path.stat().st_size
    report = {
        "n": args.n,
        "dim": 768,
        "spec": args.spec,
        "train_sample": args.train_sample,
        "threads": os.cpu_count(),
        "train_s": built["train_s"],
        "add_s": built["add_s"],
        "build_wall_s": built["total_s"],
        "add_s_per_million": built["add_s"] * 1e6 / args.n,
        "baseline_rss_gib": baseline / GIB,
        "peak_rss_gib": built["peak_rss"] / GIB,
        "rss_after_add_gib": built["rss_after_add"] / GIB,
        "rss_limit_gib": RSS_LIMIT_GIB,
        "index_ram_mib_per_million": built["ram_per_vector"] * 1e6 / 2**20,
        "index_bytes_per_vector": size / args.n,
        "index_file_gib": size / GIB,
        "load_s": searched["load_s"],
        "load_peak_growth_mib": searched["load_growth"] / 2**20,
        "qps": searched["qps"],
        "nprobe": args.nprobe,
        "exact_qps_on_slice": args.queries / exact_s,
        f"recall@{args.k}_on_first_{slice_n}": recall,
    }
    if args.n < SCALE_TARGET_N:
        scale = SCALE_TARGET_N / args.n
        report["extrapolated_to_30M"] = {
            "build_wall_s": built["train_s"] + built["add_s"] * scale,
            "peak_rss_gib": (built["peak_rss"] + built["ram_per_vector"] * (SCALE_TARGET_N - args.n)) / GIB,
            "index_file_gib": size * scale / GIB,
        }
    path.unlink()
    return report


def build_at_scale(args, vectors: ClusteredVectors, path: Path) -> dict:
    """Train and fill the index of `args.spec` over `vectors`, write it at `path`; its times and memory."""
    import faiss

    from retriever.index.build import train_and_fill

    added_at: list[tuple[float, int, int]] = []  # (time, vectors added so far, RSS) after each chunk
    last_report = [0.0]

    def on_added(added: int) -> None:
        added_at.append((time.perf_counter(), added, current_rss_bytes()))
        if len(added_at) == 1 or added_at[-1][0] - last_report[0] > 60 or added == args.n:
            last_report[0] = added_at[-1][0]
            print(
                f"added {added:,}/{args.n:,} vectors, {added_at[-1][0] - t0:.0f} s, RSS "
                f"{current_rss_bytes() / GIB:.2f} GiB (peak {peak_rss_bytes() / GIB:.2f})",
                file=sys.stderr,
                flush=True,
            )

    t0 = time.perf_counter()
    index = train_and_fill(
        args.spec, vectors, train_sample=args.train_sample, seed=0, add_chunk=vectors.block, on_added=on_added
    )
    total_s = time.perf_counter() - t0
    peak_build, rss_built = peak_rss_bytes(), current_rss_bytes()
    # training (drawing the sample included) ends where the first chunk's add began; a chunk
    # takes the mean time of the later ones
    per_chunk = (added_at[-1][0] - added_at[0][0]) / max(1, len(added_at) - 1)
    train_s = max(0.0, added_at[0][0] - t0 - per_chunk)
    # what the index itself costs in memory: RSS growth per vector over the second half of the
    # adding (early on, memory freed after training is reused, which hides growth), and never
    # less than its size on disk per vector (codes + ids); transients do not grow with N
    half = added_at[len(added_at) // 2 :]
    (_, first_n, first_rss), (_, last_n, last_rss) = half[0], half[-1]
    faiss.write_index(index, str(path))
    ram_per_vector = max((last_rss - first_rss) / max(1, last_n - first_n), path.stat().st_size / args.n)
    return {
        "train_s": train_s,
        "add_s": total_s - train_s,
        "total_s": total_s,
        "peak_rss": peak_build,
        "rss_after_add": rss_built,
        "ram_per_vector": ram_per_vector,
    }


def search_in_child(args, path: Path, queries: Path, slice_n: int) -> dict:
    """`scale_search_child` in a fresh process (load time and memory measured from a clean start)."""
    options = {"--index": path, "--spec": args.spec, "--k": args.k, "--nprobe": args.nprobe, "--slice": slice_n}
    command = [sys.executable, __file__, "--part", "scale-search", "--queries-file", str(queries)]
    command += [str(word) for option in options.items() for word in option]
    child = subprocess.run(command, check=False, capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(child.stderr[-3000:])
    return json.loads(child.stdout.strip().splitlines()[-1])


def scale_search_child(args) -> None:
    """Fresh process: load the saved index memory-mapped (project path), search, save ids."""
    import faiss

    from retriever.index.files import read_faiss
    from retriever.index.passage_index import search_live
    from retriever.index.types import faiss_read_flags, set_search_params

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    queries = np.load(args.queries_file)
    before = reset_peak_rss()
    t0 = time.perf_counter()
    index = read_faiss(Path(args.index), io_flags=faiss_read_flags(args.spec, queries.shape[1]))
    load_s = time.perf_counter() - t0
    load_growth = peak_rss_bytes() - before
    set_search_params(index, nprobe=args.nprobe)
    t0 = time.perf_counter()
    index.search(queries, args.k)
    qps = len(queries) / (time.perf_counter() - t0)
    outside = np.ones(index.ntotal, dtype=bool)  # "removed" = everything past the slice
    outside[: args.slice] = False
    _, approx = search_live(index, queries, args.k, removed=outside, nprobe=args.nprobe)
    np.save(Path(args.queries_file).with_name("approx.npy"), approx)
    print(json.dumps({"load_s": load_s, "load_growth": load_growth, "qps": qps}))


def scale_targets(report: dict) -> list[dict]:
    key = next(k for k in report if k.startswith("recall@"))
    targets = [target(f"peak RSS (GiB) adding {report['n']:,} vectors", report["peak_rss_gib"], "<", RSS_LIMIT_GIB)]
    if "extrapolated_to_30M" in report:
        targets.append(
            target(
                "peak RSS (GiB) extrapolated to 30M",
                report["extrapolated_to_30M"]["peak_rss_gib"],
                "<",
                RSS_LIMIT_GIB,
                "this run's peak + its index RAM per vector × the rest",
            )
        )
    targets.append(target(f"{key} (reported, no issue threshold)", report[key], ">=", 0.0))
    return targets


def print_scale(report: dict) -> None:
    key = next(k for k in report if k.startswith("recall@"))
    print(
        f"\nN={report['n']:,} × 768 {report['spec']}: train {report['train_s']:.0f} s, add "
        f"{report['add_s_per_million']:.1f} s per million, peak RSS {report['peak_rss_gib']:.2f} GiB "
        f"(limit {RSS_LIMIT_GIB:g}; index RAM {report['index_ram_mib_per_million']:.0f} MiB per million), index "
        f"{report['index_bytes_per_vector']:.1f} B/vector"
    )
    print(
        f"search (fresh process, memory-mapped load {report['load_s']:.2f} s, "
        f"+{report['load_peak_growth_mib']:.0f} MiB): "
        f"{report['qps']:.0f} q/s at nprobe {report['nprobe']} = {report['qps'] / report['exact_qps_on_slice']:.2f}× "
        f"exact search over only the first {key.rsplit('_', 1)[-1]} vectors ({report['exact_qps_on_slice']:.0f} q/s); "
        f"{key} {report[key]:.3f}"
    )
    if "extrapolated_to_30M" in report:
        e = report["extrapolated_to_30M"]
        print(
            f"extrapolated to 30M: build {e['build_wall_s'] / 60:.0f} min, peak RSS {e['peak_rss_gib']:.2f} GiB, "
            f"index {e['index_file_gib']:.1f} GiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["shard", "scale", "scale-search"], required=True)
    parser.add_argument("--n", type=int, help="vectors (default: 1M for shard, 30M for scale)")
    parser.add_argument("--dim", type=int, default=384, help="shard part only (scale is 768-d)")
    parser.add_argument("--specs", nargs="+", default=["Flat", "IVF1024,PQ64"], help="shard part")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--spec", default="IVF4096,PQ64", help="scale part")
    parser.add_argument("--nprobe", type=int, default=64)
    parser.add_argument("--train-sample", type=int, default=200_000)
    parser.add_argument("--slice", type=int, default=1_000_000)
    parser.add_argument("--workdir", default=str(ROOT / "runs"))
    parser.add_argument("--index", help=argparse.SUPPRESS)
    parser.add_argument("--queries-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "scale-search":
        return scale_search_child(args)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.part == "shard":
        args.n = args.n or 1_000_000
        report = part_shard(args)
        targets = shard_targets(report)
        print(json.dumps({"benchmark": "sharded_search", **report, "targets": targets}, indent=1))
        print_shard(report)
    else:
        args.n = args.n or SCALE_TARGET_N
        report = part_scale(args)
        targets = scale_targets(report)
        print(json.dumps({"benchmark": "scale_simulation", **report, "targets": targets}, indent=1))
        print_scale(report)
    print_targets(targets)


if __name__ == "__main__":
    main()
