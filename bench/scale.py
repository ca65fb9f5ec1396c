"""Indexes at millions of passages on one machine: corpus, builds, load, search, edits, compaction and two ranks,
at N = 1M, 3M, 10M (30M where the disk allows), every cost measured, for the growth curve to Wikipedia.

Run it in the background; it is resumable (each finished step is saved atomically in WORK/state.json; the same
command with --resume continues after the last one):

    nohup python bench/scale.py --work /data/atlas-scale --sizes 1M,3M,10M > scale.log 2>&1 &
    python bench/scale.py --work /data/atlas-scale --resume          # after a stop, a kill or a new session
    python bench/scale.py --work /data/atlas-scale --report          # the table from what is measured so far

Data, realistic rather than noise (i.i.d. Gaussian vectors flatter exact search and say nothing of recall):
- the base: every real passage we have (nq824, WikiText-2, the SQuAD train and dev paragraphs, 100-word
  passages: bench/index_data.py's large set) embedded once with all-MiniLM-L6-v2, and real questions (NQ-open
  dev, SQuAD dev) embedded the same way;
- N passages grown from it: row i is a real passage drawn at random (its text, with a fresh id) and its vector
  that passage's vector plus Gaussian noise whose norm is the base's median nearest-neighbour distance,
  renormalised (so a grown vector is as far from its source as real neighbours are from each other). Shard s
  of 1M rows is drawn from seed (seed, s) alone: any machine regenerates any shard.
The compressed index's recall is also measured on the real vectors alone (the row "real").

Each step of each size runs in its own process (`python -m atlas …`, or this file's --probe), so that its wall
time and peak resident memory are its own (wait4's ru_maxrss; for probes, VmRSS/VmHWM read inside).
The JSON (--out, default bench/results/cpu/scale.json) is rewritten after every step.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SIZES = {"real": 0, "100K": 100_000, "1M": 1_000_000, "3M": 3_000_000, "10M": 10_000_000, "30M": 30_000_000}
SHARD_ROWS = 1_000_000
COMPRESSED = "IVF4096,PQ96x4fs"  # 48 B of codes + 8 B of id per passage at d = 384: 0.56 GB at 10M
EXACT_RERANK = 500
NPROBE = 64
# the compressed searches measured: (nprobe, k', step name). The codes alone, re-ranked over k' candidates, and
# with more lists probed: where recall is lost (the codes or the lists) and what it costs to get it back; the
# last three where 10M's recall fell short of 0.95 at (256, 2000): more lists, or more candidates
COMPRESSED_SEARCH_SETTINGS = [
    (nprobe, rerank, f"search_compressed{f'_nprobe{nprobe}' if nprobe != NPROBE else ''}_rerank{rerank}")
    for nprobe, rerank in (
        (NPROBE, 0),
        (NPROBE, EXACT_RERANK),
        (4 * NPROBE, EXACT_RERANK),
        (NPROBE, 4 * EXACT_RERANK),
        (4 * NPROBE, 4 * EXACT_RERANK),
        (8 * NPROBE, 4 * EXACT_RERANK),
        (4 * NPROBE, 6 * EXACT_RERANK),
        (4 * NPROBE, 8 * EXACT_RERANK),
    )
]
COMPRESSED_SEARCHES = [name for _, _, name in COMPRESSED_SEARCH_SETTINGS]
K = 100
N_EDITS = 1000
# bytes per passage on disk while a size is measured: JSONL (deleted after prepare) + corpus + vector shards +
# Flat's float16 + the compressed index's kept float16 + its codes
DISK_PER_PASSAGE = 800 + 700 + 768 + 768 + 768 + 40


# ----------------------------------------------------------------------------- measuring


def _timed(cmd: list[str], cwd: str | None, env: dict) -> tuple[int, float, int, str, str]:
    """In the launcher process: run `cmd` under GNU time → (exit code, wall s, peak RSS bytes, stdout, stderr)."""
    import tempfile

    started = time.perf_counter()
    with (
        tempfile.NamedTemporaryFile("r") as peak,
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", peak.name, *cmd], cwd=cwd, env=env, stdout=out, stderr=err, check=False
        )
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        lines = peak.read().strip().splitlines()
        return done.returncode, wall, int(lines[-1]) * 1024 if lines else 0, out.read(), err.read()


# Commands are started from a small process forked before this one loads anything: on Linux a child's peak RSS
# (ru_maxrss, what time(1) reports) starts from the high-water mark of the process it was forked from.
LAUNCHER: list = []


def run_measured(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None) -> dict:
    """Run `cmd`; → {"wall_s", "peak_rss_bytes" (the command's own high-water mark), "stdout"}; RuntimeError naming
    the command and its last stderr lines when it fails."""
    call = ([str(c) for c in cmd], None if cwd is None else str(cwd), {**os.environ, **(env or {})})
    code, wall, peak, stdout, stderr = LAUNCHER[0].submit(_timed, *call).result() if LAUNCHER else _timed(*call)
    if code:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({code}):\n{stderr[-2000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_bytes": peak, "stdout": stdout}


def run_probe(*args: str) -> dict:
    """This file's --probe in a child process: its JSON result, with the child's wall time."""
    result = run_measured([sys.executable, __file__, "--probe", *map(str, args)])
    return {**json.loads(result["stdout"].strip().splitlines()[-1]), "process_wall_s": result["wall_s"]}


def atlas_cli(*args) -> list[str]:
    return [sys.executable, "-m", "atlas", *map(str, args)]


def folder_bytes(path: Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


# ----------------------------------------------------------------------------- state


class State:
    """WORK/state.json: the settings and every finished step's result, rewritten atomically after each."""

    def __init__(self, work: Path, settings: dict, resume: bool):
        self.path = work / "state.json"
        if self.path.is_file():
            self.data = json.loads(self.path.read_text())
            if not resume:
                raise SystemExit(f"{work} holds a run already: --resume continues it (or give another --work)")
            if self.data["settings"] != settings:
                raise SystemExit(
                    f"{self.path}: started with other settings ({self.data['settings']}); use another --work"
                )
        else:
            self.data = {"settings": settings, "base": {}, "sizes": {}}

    def done(self, size: str, step: str) -> dict | None:
        return self.data["sizes"].get(size, {}).get(step)

    def forget(self, size: str, step: str) -> None:
        """Drop a step's result, so that the run measures it again (`--redo`)."""
        if self.data["sizes"].get(size, {}).pop(step, None) is not None:
            self.save()

    def record(self, size: str, step: str, result: dict) -> None:
        self.data["sizes"].setdefault(size, {})[step] = result
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


# ----------------------------------------------------------------------------- data


def base_data(work: Path, state: State, base_index: Path | None = None) -> dict:
    """The real base: vectors (N0, d) float16 of the large real set, its passages' texts and titles, the real
    questions' vectors, and the generator's noise norm."""
    from index_data import LARGE_QUESTIONS, LARGE_RUN, ensure_large_index

    from common.modeling import encoder_source
    from retriever.corpus import Corpus
    from retriever.index.manifest import Manifest
    from retriever.retrieval_eval import read_retrieval_examples
    from retriever.retriever import Retriever

    base = work / "base"
    base.mkdir(parents=True, exist_ok=True)
    folder = base_index or ensure_large_index(LARGE_RUN / "index")
    if folder is None:
        raise SystemExit("the shared data (../shared/data) is not here: nothing to grow the corpus from")
    manifest = Manifest.load(folder)
    vectors = np.load(manifest.path_of(folder, manifest.files["vectors"]), mmap_mode="r")
    if not (base / "queries.npy").is_file():
        questions = [e.question for e in read_retrieval_examples(LARGE_QUESTIONS[0])][:1000]
        for article in json.loads(LARGE_QUESTIONS[1].read_text())["data"]:
            questions += [qa["question"] for p in article["paragraphs"] for qa in p["qas"]]
        questions = questions[:2000]
        retriever = Retriever.from_pretrained(encoder_source("minilm"))
        # the first 500 of each set, alternating: 1,000 real questions
        questions = [q for pair in zip(questions[:500], questions[1000:1500]) for q in pair]
        np.save(base / "queries.npy", retriever.embed_queries(questions).astype(np.float32))
        (base / "questions.json").write_text(json.dumps(questions))
    if not state.data["base"]:
        import faiss

        sample = np.random.default_rng(0).choice(len(vectors), size=min(2000, len(vectors)), replace=False)
        full = np.asarray(vectors, dtype=np.float32)
        index = faiss.IndexFlatIP(full.shape[1])
        index.add(full)
        scores, _ = index.search(full[sample], 2)  # the first hit is the vector itself
        # unit vectors: |a - b|^2 = 2 - 2 a·b
        distances = np.sqrt(np.maximum(0.0, 2.0 - 2.0 * scores[:, 1]))
        state.data["base"] = {
            "passages": len(vectors),
            "dim": int(vectors.shape[1]),
            "questions": 1000,
            "median_nn_distance": round(float(np.median(distances)), 4),
            "encoder": dataclasses.asdict(manifest.encoder),
            "encoder_fingerprint": manifest.encoder_fingerprint,
            "generator": "a real passage drawn at random (its text, a fresh id) and its vector plus Gaussian noise of "
            "norm = the base's median nearest-neighbour distance, renormalised",
        }
        state.save()
    corpus = Corpus.load(manifest.segments[0].corpus)
    return {
        "vectors": vectors,
        "corpus": corpus,
        "queries": np.load(base / "queries.npy"),
        "questions": json.loads((base / "questions.json").read_text()),
        "noise": state.data["base"]["median_nn_distance"],
        "index": folder,
    }


def shard_rows(n: int) -> list[tuple[int, int]]:
    return [(s, min(s + SHARD_ROWS, n)) for s in range(0, n, SHARD_ROWS)]


def grown_shard(base: dict, shard: int, start: int, stop: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(the base rows drawn for rows [start, stop), their grown vectors (rows, d) float16)."""
    rng = np.random.default_rng([seed, shard])
    drawn = rng.integers(0, len(base["vectors"]), size=stop - start)
    vectors = np.asarray(base["vectors"][np.sort(drawn)], dtype=np.float32)[np.argsort(np.argsort(drawn))]
    noise = rng.standard_normal(vectors.shape, dtype=np.float32) * (base["noise"] / np.sqrt(vectors.shape[1]))
    vectors += noise
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return drawn, vectors.astype(np.float16)


def write_size_data(base: dict, folder: Path, n: int, seed: int) -> None:
    """docs.jsonl (N passages {id, title, text}) and vectors/part-*.npy + encoder.json, shard by shard."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vectors").mkdir(exist_ok=True)
    titles = base["corpus"].table.column("title")
    texts = base["corpus"].table.column("text")
    with (folder / "docs.jsonl.tmp").open("w", encoding="utf-8") as out:
        for shard, (start, stop) in enumerate(shard_rows(n)):
            drawn, vectors = grown_shard(base, shard, start, stop, seed)
            np.save(folder / "vectors" / f"part-{shard:04d}.npy", vectors)
            t, x = titles.take(drawn).to_pylist(), texts.take(drawn).to_pylist()
            out.writelines(
                json.dumps({"id": f"x{start + i:09d}", "title": t[i], "text": x[i]}, ensure_ascii=False) + "\n"
                for i in range(len(drawn))
            )
    write_encoder_json(folder / "vectors")
    os.replace(folder / "docs.jsonl.tmp", folder / "docs.jsonl")


def write_encoder_json(vectors_dir: Path) -> None:
    """The encoder.json that `atlas index build --vectors` checks the vectors against (the base's encoder)."""
    encoder = {"fingerprint": STATE_BASE["encoder_fingerprint"], "dim": STATE_BASE["dim"], **STATE_BASE["encoder"]}
    (vectors_dir / "encoder.json").write_text(json.dumps(encoder))


STATE_BASE: dict = {}


# ----------------------------------------------------------------------------- probes (child processes)


def probe_load(index: str) -> dict:
    import faiss  # noqa: F401  (imported before the baseline: the library is not the index)

    from retriever.index import PassageIndex

    baseline = status_bytes("VmRSS")
    started = time.perf_counter()
    loaded = PassageIndex.load(index)
    load_s = time.perf_counter() - started
    after = status_bytes("VmRSS")
    codes = loaded.faiss_index.sa_code_size() * len(loaded) if loaded.faiss_index is not None else 0
    return {
        "load_s": round(load_s, 3),
        "rss_after_load_bytes": after,
        "rss_beyond_interpreter_bytes": after - baseline,
        "codes_bytes": int(codes),
        "passages": len(loaded),
    }


def probe_search(index: str, queries: str, ids_out: str, nprobe: str, rerank: str) -> dict:
    from retriever.index import PassageIndex

    vectors = np.load(queries)
    loaded = PassageIndex.load(index, nprobe=int(nprobe) or None, exact_rerank=None if rerank == "-" else int(rerank))
    baseline = status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    single = vectors[:20]
    started = time.perf_counter()
    for row in single:
        loaded.search_vectors(row[None, :], K)
    batch1 = len(single) / (time.perf_counter() - started)
    started = time.perf_counter()
    ids = []
    for start in range(0, len(vectors), 64):
        ids.append(loaded.search_vectors(vectors[start : start + 64], K)[1])
    batch64 = len(vectors) / (time.perf_counter() - started)
    np.save(ids_out, np.concatenate(ids))
    return {
        "qps_batch1": round(batch1, 2),
        "qps_batch64": round(batch64, 2),
        "queries": len(vectors),
        "rss_after_load_bytes": baseline,
        "peak_rss_during_search_bytes": status_bytes("VmHWM"),
    }


def probe_faiss(shards: str, queries: str, ids_out: str) -> dict:
    """FAISS IndexFlatIP (float32) over the same vectors, shard by shard (1M rows each), results merged: the
    baseline exact search a user with 24 GiB would run (the whole of it at 10M would be 15 GiB). Only the
    searches are timed."""
    import faiss

    vectors = np.load(queries)
    scores_all, ids_all, searching, offset = [], [], 0.0, 0
    for path in sorted(Path(shards).glob("*.npy")):
        shard = np.load(path).astype(np.float32)
        index = faiss.IndexFlatIP(shard.shape[1])
        index.add(shard)
        started = time.perf_counter()
        for start in range(0, len(vectors), 64):
            s, i = index.search(vectors[start : start + 64], K)
            scores_all.append((start, s))
            ids_all.append((start, i + offset))
        searching += time.perf_counter() - started
        offset += len(shard)
        del index, shard
    # merge the shards' top-K per query
    per_query_scores = np.full((len(vectors), 0), 0.0, dtype=np.float32)
    per_query_ids = np.zeros((len(vectors), 0), dtype=np.int64)
    by_start: dict[int, list] = {}
    for (start, s), (_, i) in zip(scores_all, ids_all):
        by_start.setdefault(start, []).append((s, i))
    merged_ids = []
    for start in sorted(by_start):
        s = np.concatenate([p[0] for p in by_start[start]], axis=1)
        i = np.concatenate([p[1] for p in by_start[start]], axis=1)
        order = np.argsort(-s, axis=1, kind="stable")[:, :K]
        merged_ids.append(np.take_along_axis(i, order, axis=1))
    del per_query_scores, per_query_ids
    np.save(ids_out, np.concatenate(merged_ids))
    return {"qps_batch64": round(len(vectors) / searching, 2), "search_s": round(searching, 2)}


def probe_sharded(index: str, queries: str, ids_out: str) -> dict:
    """Under torchrun (gloo): each rank holds its shard of the index; rank 0 writes the merged results."""
    from atlas.distributed import init_distributed, shutdown
    from retriever.index import PassageIndex
    from retriever.index.sharded import ShardedPassageIndex

    context = init_distributed()
    vectors = np.load(queries)[:256]
    loaded = PassageIndex.load(index)
    shard = ShardedPassageIndex.from_index(loaded, context.rank, context.world_size)
    del loaded
    rows = [shard.search_vectors(vectors[s : s + 64], K)[1] for s in range(0, len(vectors), 64)]
    mine = {"rank": context.rank, "rss_bytes": status_bytes("VmRSS"), "peak_rss_bytes": status_bytes("VmHWM")}
    import torch.distributed as dist

    everyone = [None] * context.world_size
    dist.all_gather_object(everyone, mine)
    shutdown(context)
    if context.rank == 0:
        np.save(ids_out, np.concatenate(rows))
        print(json.dumps({"ranks": everyone}))
    return {}


def probe(argv: list[str]) -> None:
    name, *args = argv
    result = {"load": probe_load, "search": probe_search, "faiss": probe_faiss, "sharded": probe_sharded}[name](*args)
    if result:
        print(json.dumps(result))


# ----------------------------------------------------------------------------- one size


COMPRESSED_BUILD = ("--spec", COMPRESSED, "--exact-rerank", EXACT_RERANK, "--nprobe", NPROBE)


def run_step(state: State, size: str, out: Path, name: str, fn) -> dict:
    """Step `name` of `size`: its recorded result, or `fn()`'s, then recorded in the state and the JSON."""
    done = state.done(size, name)
    if done is not None:
        return done
    print(f"[{size}] {name} …", flush=True)
    result = fn()
    state.record(size, name, result)
    write_json(state, out)
    print(f"[{size}] {name}: {json.dumps(result)[:300]}", flush=True)
    return result


def measured_with_disk(cmd: list, path: Path) -> dict:
    """Run `cmd`, which writes `path` → its wall time, peak RSS and the bytes of `path`."""
    result = run_measured(cmd)
    return {"wall_s": result["wall_s"], "peak_rss_bytes": result["peak_rss_bytes"], "disk_bytes": folder_bytes(path)}


def top_overlap(ids: Path, other_ids: Path) -> float:
    """Mean |top-K ∩ other top-K| / K over the queries of two saved (Q, K) id arrays."""
    pairs = zip(np.load(ids), np.load(other_ids))
    return round(float(np.mean([len(set(a) & set(b)) / K for a, b in pairs])), 4)


def real_data(base: dict, folder: Path) -> dict:
    """The real set's vectors as one vector file, for `atlas index build --vectors`."""
    (folder / "vectors").mkdir(parents=True, exist_ok=True)
    np.save(folder / "vectors" / "part-0000.npy", np.asarray(base["vectors"]))
    write_encoder_json(folder / "vectors")
    return {"passages": len(base["vectors"])}


def grown_data(base: dict, folder: Path, n: int, seed: int) -> dict:
    started = time.perf_counter()
    write_size_data(base, folder, n, seed)
    return {"wall_s": round(time.perf_counter() - started, 1), "jsonl_bytes": folder_bytes(folder / "docs.jsonl")}


def prepare_corpus(base: dict, folder: Path, n: int, seed: int) -> dict:
    """`atlas corpus prepare` of the grown docs.jsonl into `folder`/corpus, measured; the JSONL deleted after."""
    if not (folder / "docs.jsonl").is_file():  # a prepare stopped after it deleted its input: make it again
        write_size_data(base, folder, n, seed)
    shutil.rmtree(folder / "corpus", ignore_errors=True)
    cmd = atlas_cli("corpus", "prepare", folder / "docs.jsonl", "--out", folder / "corpus", "--chunk-words", "0")
    result = measured_with_disk(cmd, folder / "corpus")
    (folder / "docs.jsonl").unlink()
    return result


def build_index(corpus: Path, folder: Path, index: Path, *extra) -> dict:
    shutil.rmtree(index, ignore_errors=True)
    cmd = atlas_cli("index", "build", "--corpus", corpus, "--vectors", folder / "vectors", "--out", index, *extra)
    return measured_with_disk(cmd, index)


def real_exact(base: dict, queries: Path, exact_ids: Path) -> dict:
    """The real set's exact top-K, by FAISS's flat inner product (the real size has no Flat index of ours)."""
    import faiss

    full = np.asarray(base["vectors"], dtype=np.float32)
    index = faiss.IndexFlatIP(full.shape[1])
    index.add(full)
    np.save(exact_ids, index.search(np.load(queries), K)[1])
    return {}


def compressed_search(folder: Path, queries: Path, name: str, nprobe: int, rerank: int) -> dict:
    ids = folder / f"ids-{name}.npy"
    result = run_probe("search", folder / "index-pq", queries, ids, nprobe, rerank)
    result["recall_at_100_of_exact"] = top_overlap(ids, folder / "ids-exact.npy")
    return result


def faiss_baseline(folder: Path, queries: Path) -> dict:
    result = run_probe("faiss", folder / "vectors", queries, folder / "ids-faiss.npy")
    result["same_top100_as_flat"] = top_overlap(folder / "ids-exact.npy", folder / "ids-faiss.npy")
    return result


def data_steps(step, size: str, n: int, base: dict, folder: Path, seed: int) -> Path:
    """`data` (and, for a grown size, `corpus_prepare`) → the size's corpus folder."""
    if size == "real":
        step("data", lambda: real_data(base, folder))
        return base["corpus"].path
    step("data", lambda: grown_data(base, folder, n, seed))
    step("corpus_prepare", lambda: prepare_corpus(base, folder, n, seed))
    return folder / "corpus"


def index_steps(step, size: str, folder: Path, corpus: Path, state: State) -> None:
    """The builds (Flat but at `real`, compressed), then each index's load and verify."""
    flat, pq = folder / "index-flat", folder / "index-pq"
    if size != "real":
        step("build_flat", lambda: build_index(corpus, folder, flat))
    step("build_compressed", lambda: build_index(corpus, folder, pq, *COMPRESSED_BUILD))
    from retriever.index.manifest import Manifest  # heavy: faiss

    pending = [name for name in (*COMPRESSED_SEARCHES, "edits") if state.done(size, name) is None]
    if pending and pq.is_dir() and Manifest.load(pq).generation > 1:
        # edited by an earlier run (its edits step, or one interrupted): searches and edits are measured on the
        # index as built, so it is built again first (not measured: `build_compressed` was)
        print(f"[{size}] the compressed index was edited before: building it again for {pending[0]}", flush=True)
        build_index(corpus, folder, pq, *COMPRESSED_BUILD)
    for kind, index in (("flat", flat), ("compressed", pq)):
        if size == "real" and kind == "flat":
            continue
        step(f"load_{kind}", lambda index=index: run_probe("load", index))
        verify = atlas_cli("index", "info", "--index", index, "--verify")
        step(f"verify_{kind}", lambda verify=verify: {"wall_s": run_measured(verify)["wall_s"]})


def search_steps(step, size: str, base: dict, folder: Path, queries: Path) -> None:
    """The exact top-K (Flat's, or FAISS's at `real`), then every compressed search setting against it."""
    exact_ids = folder / "ids-exact.npy"
    if size == "real":
        step("search_exact", lambda: real_exact(base, queries, exact_ids))
    else:
        step("search_flat", lambda: run_probe("search", folder / "index-flat", queries, exact_ids, 0, "-"))
    for nprobe, rerank, name in COMPRESSED_SEARCH_SETTINGS:
        step(name, lambda n=name, p=nprobe, r=rerank: compressed_search(folder, queries, n, p, r))


def measure_size(size: str, n: int, base: dict, work: Path, state: State, args) -> None:
    """Every measured step of one size in order, each skipped when the state says it is done."""
    folder, queries = work / size, work / "base" / "queries.npy"
    step = functools.partial(run_step, state, size, args.out)
    corpus = data_steps(step, size, n, base, folder, args.seed)
    index_steps(step, size, folder, corpus, state)
    search_steps(step, size, base, folder, queries)
    if size == "real":
        return
    step("faiss_flat_ip", lambda: faiss_baseline(folder, queries))
    if size == args.frontends_at:
        step("frontends", lambda: frontends(folder / "index-flat", base, folder))
    step("edits", lambda: edits(folder / "index-pq", base, folder, args.seed))
    step("two_ranks", lambda: two_ranks(folder / "index-flat", queries, folder))


def frontends(index: Path, base: dict, folder: Path) -> dict:
    """The same questions through `atlas index search` and the HTTP server's /api/search: the same hits."""
    import socket
    import urllib.request

    from tasks.base import get_task

    # the server embeds a question as the model retrieves with it, in the task's form: so does the CLI here
    questions = [get_task("qa").query(q) for q in base["questions"][:20]]
    cli = run_measured(atlas_cli("index", "search", "--index", index, *questions, "-k", "10", "--json"))
    by_cli = [[h["id"] for h in json.loads(line)["hits"]] for line in cli["stdout"].splitlines()]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        atlas_cli("serve", "atlas-reader", "--index", index, "--port", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        by_server = []
        for question in base["questions"][:20]:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/search",
                data=json.dumps({"query": question, "k": 10}).encode(),
                headers={"Content-Type": "application/json"},
            )
            by_server.append([h["id"] for h in json.loads(urllib.request.urlopen(request, timeout=120).read())["hits"]])
    finally:
        server.terminate()
        server.wait(timeout=60)
    return {"questions": len(questions), "cli_equals_server": by_cli == by_server, "cli_s": cli["wall_s"]}


def edits(index: Path, base: dict, folder: Path, seed: int) -> dict:
    """Add, update and remove 1,000 passages in the compressed index, then compact it: each one command."""
    rng = np.random.default_rng([seed, 99])
    texts = base["corpus"].table.column("text")
    drawn = rng.integers(0, len(texts), size=2 * N_EDITS)
    added = [{"id": f"new{i:06d}", "title": "", "text": texts[int(d)].as_py()} for i, d in enumerate(drawn[:N_EDITS])]
    count = json.loads((index / "manifest.json").read_text())["count"]
    targets = rng.choice(count, size=2 * N_EDITS, replace=False)
    updated = [
        {"id": f"x{int(t):09d}", "text": texts[int(d)].as_py()} for t, d in zip(targets[:N_EDITS], drawn[N_EDITS:])
    ]
    removed = [f"x{int(t):09d}" for t in targets[N_EDITS:]]
    for name, records in (("add.jsonl", added), ("update.jsonl", updated)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "remove.txt").write_text("\n".join(removed) + "\n")
    result = {}
    for name, argv in (
        ("add", ["index", "add", "--index", index, "--corpus", folder / "add.jsonl", "--no-compact"]),
        ("update", ["index", "update", "--index", index, "--corpus", folder / "update.jsonl", "--no-compact"]),
        ("remove", ["index", "remove", "--index", index, "--ids", f"@{folder / 'remove.txt'}", "--no-compact"]),
        ("compact", ["index", "compact", "--index", index]),
    ):
        measured = run_measured(atlas_cli(*argv))
        result[name] = {"wall_s": measured["wall_s"], "peak_rss_bytes": measured["peak_rss_bytes"]}
    # what of an edit is the encoder's: embedding 1,000 passages with MiniLM alone
    from atlas.quiet import quiet_libraries
    from common.modeling import encoder_source
    from retriever.retriever import Retriever

    with quiet_libraries():  # transformers' load report of MiniLM, as the CLI hides it
        retriever = Retriever.from_pretrained(encoder_source("minilm"))
    started = time.perf_counter()
    retriever.embed_passages(added)
    result["embedding_1000_s"] = round(time.perf_counter() - started, 2)
    return result


def two_ranks(index: Path, queries: Path, folder: Path) -> dict:
    """torchrun, 2 ranks on gloo, each holding half of the Flat index: each rank's memory, and the merged results
    equal to one process's."""
    single = folder / "ids-single-256.npy"
    exact = np.load(folder / "ids-exact.npy")[:256]
    np.save(single, exact)
    probe_argv = [__file__, "--probe", "sharded", str(index), str(queries), str(folder / "ids-two-ranks.npy")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *probe_argv]
    measured = run_measured(cmd, env={"OMP_NUM_THREADS": "1"})
    ranks = json.loads(measured["stdout"].strip().splitlines()[-1])["ranks"]
    return {
        "ranks": ranks,
        "identical_to_one_process": bool(np.array_equal(np.load(folder / "ids-two-ranks.npy"), exact)),
        "wall_s": measured["wall_s"],
    }


# ----------------------------------------------------------------------------- report


# The compressed search the tables follow: the setting that reaches recall@100 0.95 of exact at 10M
HEADLINE = f"search_compressed_nprobe{8 * NPROBE}_rerank{4 * EXACT_RERANK}"

# The costs the growth curve follows: (name, step, key, unit)
COSTS = [
    ("corpus prepare time", "corpus_prepare", "wall_s", "s"),
    ("corpus on disk", "corpus_prepare", "disk_bytes", "B"),
    ("Flat build time", "build_flat", "wall_s", "s"),
    ("Flat build peak RSS", "build_flat", "peak_rss_bytes", "B"),
    ("compressed build time", "build_compressed", "wall_s", "s"),
    ("compressed build peak RSS", "build_compressed", "peak_rss_bytes", "B"),
    ("compressed index on disk", "build_compressed", "disk_bytes", "B"),
    ("compressed load time", "load_compressed", "load_s", "s"),
    ("compressed resident after load", "load_compressed", "rss_beyond_interpreter_bytes", "B"),
    ("Flat verify time", "verify_flat", "wall_s", "s"),
    ("Flat search, batch 64", "search_flat", "qps_batch64", "q/s"),
    ("compressed search + re-rank, batch 64", HEADLINE, "qps_batch64", "q/s"),
    ("update 1,000 passages", "edits", "update.wall_s", "s"),
    ("remove 1,000 passages", "edits", "remove.wall_s", "s"),
    ("edit peak RSS (add)", "edits", "add.peak_rss_bytes", "B"),
    ("compaction peak RSS", "edits", "compact.peak_rss_bytes", "B"),
    ("add 1,000 passages", "edits", "add.wall_s", "s"),
    ("add 1,000 passages, beyond embedding them", "edits", "add.beyond_embedding_s", "s"),
    ("update 1,000 passages, beyond embedding them", "edits", "update.beyond_embedding_s", "s"),
    ("compaction after the edits", "edits", "compact.wall_s", "s"),
]


def _with_derived(steps: dict) -> dict:
    """`steps` with what an edit costs beyond MiniLM's embedding of its 1,000 passages (measured on its own in
    the same step): the part of an edit that depends on the index, not on the encoder."""
    edits = steps.get("edits")
    if not edits or "embedding_1000_s" not in edits:
        return steps
    derived = {
        name: {**edits[name], "beyond_embedding_s": round(edits[name]["wall_s"] - edits["embedding_1000_s"], 2)}
        for name in ("add", "update")
    }
    return {**steps, "edits": {**edits, **derived}}


def _value(steps: dict, step: str, key: str):
    value = _with_derived(steps).get(step, {})
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def growth(state: State) -> list[dict]:
    """Each cost against N on the grown sizes: the points, the power law a·N^b fitted to them (least squares in
    log-log), and its projections to 30M (Atlas's Wikipedia) and 100M passages."""
    rows = []
    for name, step, key, unit in COSTS:
        points = [
            (SIZES[size], _value(steps, step, key))
            for size, steps in state.data["sizes"].items()
            if SIZES.get(size) and _value(steps, step, key)
        ]
        row = {"cost": name, "unit": unit, "points": [[n, v] for n, v in points]}
        if len(points) >= 2:
            x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
            b, log_a = np.polyfit(x, y, 1)
            row.update(
                exponent=round(float(b), 3),
                coefficient=float(np.exp(log_a)),
                at_30M=float(np.exp(log_a) * 30e6**b),
                at_100M=float(np.exp(log_a) * 100e6**b),
            )
        rows.append(row)
    return rows


def write_json(state: State, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    data = {
        "command": "python bench/scale.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU cores, {memory / 2**30:.0f} GiB ({platform.machine()})",
        **state.data,
        "growth": growth(state),
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, out)


def _shown(value: float, unit: str) -> str:
    if unit == "B":
        return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"
    if unit == "s":
        return f"{value:.3g} s" if value < 100 else f"{value / 60:.1f} min"
    return f"{value:,.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


def report(state: State) -> None:
    """The two tables of the results page: what each size measured, and each cost's growth with N."""
    gib = 2**30
    rerank = HEADLINE
    rows = []
    for size, steps in state.data["sizes"].items():

        def get(step, key, scale=1.0, steps=steps):
            value = _value(steps, step, key)
            return "–" if value is None else f"{value / scale:,.3g}"

        rows.append(
            f"| {size} | {get('corpus_prepare', 'wall_s')} | {get('build_flat', 'wall_s')} | "
            f"{get('build_compressed', 'wall_s')} | {get('load_compressed', 'load_s')} | "
            f"{get('load_compressed', 'rss_beyond_interpreter_bytes', gib)} | {get('search_flat', 'qps_batch64')} | "
            f"{get('faiss_flat_ip', 'qps_batch64')} | {get(rerank, 'qps_batch64')} | "
            f"{get(rerank, 'recall_at_100_of_exact')} | {get('edits', 'add.wall_s')} | "
            f"{get('edits', 'add.beyond_embedding_s')} | {get('edits', 'compact.wall_s')} |"
        )
    print(
        "| N | prepare s | build Flat s | build compressed s | load s | resident after load GiB | Flat q/s | "
        f"FAISS Flat q/s | compressed q/s (nprobe {8 * NPROBE}, k' {4 * EXACT_RERANK}) | recall@100 | "
        "add 1,000 s | of it beyond embedding s | compact s |"
    )
    print("|---" * 13 + "|")
    print("\n".join(rows))
    print("\n| cost | measured | growth N^b | at 30M | at 100M |\n|---|---|---|---|---|")
    for row in growth(state):
        if not row["points"]:
            continue
        measured = ", ".join(f"{n / 1e6:g}M: {_shown(v, row['unit'])}" for n, v in row["points"])
        fitted = (
            (f"b = {row['exponent']:.2f}", _shown(row["at_30M"], row["unit"]), _shown(row["at_100M"], row["unit"]))
            if "exponent" in row
            else ("–", "–", "–")
        )
        print(f"| {row['cost']} | {measured} | {' | '.join(fitted)} |")
    print_compressed_searches(state)


def print_compressed_searches(state: State) -> None:
    """The third table: each compressed search setting's q/s, its ratio to Flat and its recall, per grown size."""
    sizes = [size for size, steps in state.data["sizes"].items() if SIZES.get(size) and "search_flat" in steps]
    print(
        "\n| compressed search (nprobe, k') | "
        + " | ".join(f"{size}: q/s, × Flat, recall@100" for size in sizes)
        + " |\n|---"
        + "|---" * len(sizes)
        + "|"
    )

    def setting(name: str) -> tuple[int, int]:
        """(nprobe, k') of a compressed search step's name."""
        nprobe, k_prime = re.search(r"nprobe(\d+)", name), re.search(r"rerank(\d+)", name)
        return int(nprobe.group(1)) if nprobe else NPROBE, int(k_prime.group(1))

    names = {name for size in sizes for name in state.data["sizes"][size] if name.startswith("search_compressed_")}
    for name in sorted(names, key=setting):
        cells = []
        for size in sizes:
            steps = state.data["sizes"][size]
            if name not in steps:
                cells.append("–")
                continue
            qps, flat = steps[name]["qps_batch64"], steps["search_flat"]["qps_batch64"]
            cells.append(f"{qps:,.0f}, {qps / flat:.1f}×, {steps[name]['recall_at_100_of_exact']:.3f}")
        print(f"| {', '.join(map(str, setting(name)))} | {' | '.join(cells)} |")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags; `sizes` and `redo` as lists."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, type=Path, help="where the data, indexes and state go")
    parser.add_argument("--sizes", default="real,1M,3M,10M", help="comma-separated: real, 100K, 1M, 3M, 10M, 30M")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue the run in --work")
    parser.add_argument("--report", action="store_true", help="print the table of what is measured, run nothing")
    parser.add_argument("--frontends-at", default="1M", help="the size whose CLI and server results are compared")
    parser.add_argument(
        "--redo", default="", help="comma-separated steps to measure again at --sizes (e.g. edits, after a change)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu" / "scale.json")
    parser.add_argument(
        "--base-index",
        type=Path,
        help="a MiniLM Flat index of real passages to grow from (default: bench/index_data.py's large real set)",
    )
    args = parser.parse_args(argv)
    args.sizes, args.redo = ([s.strip() for s in flag.split(",") if s.strip()] for flag in (args.sizes, args.redo))
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)} (choose from {', '.join(SIZES)})")
    return args


def start_launcher() -> None:
    """The process that starts every measured command (see LAUNCHER), started while this one is small."""
    import concurrent.futures
    import multiprocessing

    LAUNCHER.append(concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")))
    LAUNCHER[0].submit(time.time).result()


def fits_on_disk(size: str, n: int, work: Path, state: State) -> bool:
    """Whether `work` has the disk a size needs (DISK_PER_PASSAGE); when not, the size is recorded as skipped."""
    free = shutil.disk_usage(work).free
    need = n * DISK_PER_PASSAGE - folder_bytes(work / size) if (work / size).exists() else n * DISK_PER_PASSAGE
    if need <= free:
        return True
    message = f"needs about {need / 2**30:.0f} GiB of disk, {free / 2**30:.0f} GiB free: not measured"
    print(f"[{size}] {message}", flush=True)
    state.record(size, "skipped", {"reason": message})
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--probe":
        probe(argv[1:])
        return 0
    args = parse_args(argv)
    start_launcher()
    args.work.mkdir(parents=True, exist_ok=True)
    settings = {"seed": args.seed, "compressed": COMPRESSED, "exact_rerank": EXACT_RERANK, "nprobe": NPROBE, "k": K}
    settings["base"] = str(args.base_index or "the large real set")
    state = State(args.work, settings, resume=args.resume or args.report)
    if args.report:
        report(state)
        return 0
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from atlas.quiet import quiet_libraries

    with quiet_libraries():
        base = base_data(args.work, state, args.base_index)
    STATE_BASE.update(state.data["base"])
    for size in args.sizes:
        for name in args.redo:
            state.forget(size, name)
        n = SIZES[size] or len(base["vectors"])
        if fits_on_disk(size, n, args.work, state):
            measure_size(size, n, base, args.work, state, args)
            write_json(state, args.out)
    report(state)
    LAUNCHER[0].shutdown()  # before the interpreter's own teardown, which finds its modules gone and says so
    return 0


if __name__ == "__main__":
    sys.exit(main())
