"""Sharded search: merging is exact, each rank holds only its part, and 2 ranks under torchrun
return what 1 process returns (every index type, HNSW included: it is searched replicated)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retriever.index import PassageIndex
from retriever.index.exact_search import best_first
from retriever.index.settings import IndexSettings
from retriever.index.sharded import ShardedPassageIndex, shard_bounds


def test_shard_bounds_cover_every_position_once():
    for total in (0, 1, 7, 100):
        for world in (1, 2, 3, 8):
            spans = [shard_bounds(total, r, world) for r in range(world)]
            assert spans[0][0] == 0 and spans[-1][1] == total
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_best_first_equals_a_global_sort():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(5, 12)).astype(np.float32)
    rows = rng.permutation(60)[:60].reshape(5, 12).astype(np.int64)
    scores[0, 3] = scores[0, 7]  # a tie: the lower position wins
    rows[1, 4], scores[1, 4] = -1, -np.inf  # a missing candidate comes last
    got_scores, got_rows = best_first(scores, rows, 4)
    for q in range(5):
        expected = sorted(zip(-scores[q], np.where(rows[q] < 0, 10**9, rows[q])))[:4]
        assert list(got_rows[q]) == [r for _, r in expected]
        assert list(got_scores[q]) == [-s for s, _ in expected]


@pytest.fixture(scope="module")
def index_folders(tmp_path_factory, tiny_encoder_path):
    from atlas.config import RetrieverConfig
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever

    root = tmp_path_factory.mktemp("sharded")
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "river",
        "mountain",
        "capital",
        "city",
        "flag",
        "colour",
        "north",
        "south",
    ]
    rng = np.random.default_rng(1)
    docs = [{"id": f"d{i}", "title": f"T{i}", "text": " ".join(rng.choice(words, 8))} for i in range(61)]
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    prepare_corpus([root / "docs.jsonl"], root / "corpus", chunk_words=0, progress=False)
    retriever = Retriever.from_config(RetrieverConfig(model=str(tiny_encoder_path)))
    folders = {}
    for spec in ("Flat", "IVF4,Flat"):
        folders[spec] = root / spec.replace(",", "_")
        build_index(
            root / "corpus",
            retriever,
            folders[spec],
            progress=False,
            settings=IndexSettings(spec=spec, train_sample=61, nprobe=4),
        )
    return folders


def search(folder, encoder, *, nproc: int | None, cwd) -> list[dict]:
    args = [
        "-m",
        "atlas",
        "index",
        "search",
        "--index",
        str(folder),
        "river capital",
        "north flag colour",
        "-k",
        "7",
        "--json",
        "--encoder",
        str(encoder),
    ]
    if nproc is None:
        cmd = [sys.executable, *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *args,
            "--sharded",
        ]
    result = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
# end to end under torchrun for a flat and an IVF index; every type's shard merge (SQ8, HNSW8, PQ8 too) is checked
# in one process by test_shards_merge_to_the_single_process_search, at 2 and 3 ranks
@pytest.mark.parametrize("spec", ["Flat", "IVF4,Flat"])
def test_two_ranks_equal_one_process(index_folders, tiny_encoder_path, spec, tmp_path):
    single = search(index_folders[spec], tiny_encoder_path, nproc=None, cwd=tmp_path)
    sharded = search(index_folders[spec], tiny_encoder_path, nproc=2, cwd=tmp_path)
    assert len(single) == len(sharded) == 2
    for a, b in zip(single, sharded):
        assert [h["id"] for h in a["hits"]] == [h["id"] for h in b["hits"]]
        assert [h["score"] for h in a["hits"]] == [h["score"] for h in b["hits"]]


@pytest.mark.slow
def test_index_built_on_two_ranks_equals_a_single_process_build(index_folders, tiny_encoder_path, tmp_path):
    """Chunks of 7 passages split over 2 ranks: the same vectors file, the same search results."""
    corpus = index_folders["Flat"].parent / "corpus"
    out = tmp_path / "two-rank-index"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "atlas",
        "index",
        "build",
        "--corpus",
        str(corpus),
        "--encoder",
        str(tiny_encoder_path),
        "--out",
        str(out),
        "--chunk-size",
        "7",
    ]
    result = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    single = np.load(index_folders["Flat"] / "vectors.g1.npy")
    assert np.array_equal(np.load(out / "vectors.g1.npy"), single)
    assert search(out, tiny_encoder_path, nproc=None, cwd=tmp_path) == search(
        index_folders["Flat"], tiny_encoder_path, nproc=None, cwd=tmp_path
    )


SPECS = ["Flat", "IVF8,Flat", "IVF8,PQ8", "PQ8", "SQ8", "HNSW8"]


@pytest.fixture(scope="module")
def synthetic_indexes(tmp_path_factory, make_synthetic_corpus, clustered_source):
    """One index per spec over 3,000 clustered 32-d vectors (enough to train PQ codebooks)."""
    from retriever.index.build import build_index

    root = tmp_path_factory.mktemp("sharded-synthetic")
    corpus = make_synthetic_corpus(root, 3000)
    return {
        spec: build_index(
            corpus,
            clustered_source(),
            root / spec.replace(",", "_"),
            progress=False,
            settings=IndexSettings(spec=spec, nprobe=4),
        )
        for spec in SPECS
    }


def sharded_results(folder, queries: np.ndarray, k: int, world: int):
    """What `world` ranks would return, simulated in one process: each rank's own shard
    (built from a fresh load, as on a real rank), searched for all queries, merged."""
    shards = [ShardedPassageIndex.from_index(PassageIndex.load(folder), r, world) for r in range(world)]
    if shards[0].mode == "replicate":
        return shards, shards[0].search_vectors(queries, k)
    candidates = [s._search_shard(queries, k) for s in shards]
    merged = best_first(
        np.concatenate([c[0] for c in candidates], axis=1), np.concatenate([c[1] for c in candidates], axis=1), k
    )
    return shards, merged


def assert_same_top_k(scores, rows, expected_scores, expected_rows) -> None:
    """Equal results, order included (ties go to the lower position on both sides); where
    the k-th score is tied with passages beyond k, which of them made the cut may differ
    (PQ codes make exact ties common), so there only the scores must agree."""
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
    for q in range(len(rows)):
        cut = scores[q, -1]
        sure = scores[q] > cut  # strictly above the boundary score
        np.testing.assert_array_equal(rows[q][sure], expected_rows[q][sure])
        assert not set(rows[q][~sure]) & set(expected_rows[q][sure])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("world", [2, 3])
def test_shards_merge_to_the_single_process_search(synthetic_indexes, clustered_source, tmp_path, spec, world):
    import gc
    import shutil

    from retriever.index.update import remove_passages

    folder = tmp_path / "ix"
    shutil.copytree(synthetic_indexes[spec], folder)
    queries = clustered_source().embed_passages([{"id": f"s{i}"} for i in range(0, 3000, 97)])
    for removal in (False, True):
        if removal:  # some of every shard's best passages, and the last position
            remove_passages(folder, [f"s{i}" for i in range(0, 3000, 7)] + ["s2999"])
        single = PassageIndex.load(folder)
        expected_scores, expected_rows = single.search_vectors(queries, 25)
        shards, (scores, rows) = sharded_results(folder, queries, 25, world)
        assert_same_top_k(scores, rows, expected_scores, expected_rows)
        live, files = len(single), single.manifest.files
        del single
        gc.collect()
        if spec == "HNSW8":  # not split: every rank searches the whole graph for its own queries
            assert all(s.mode == "replicate" and s.faiss_index is not None for s in shards)
            continue
        held = [s.holdings() for s in shards]
        assert [h["positions"] for h in held] == [list(shard_bounds(3000, r, world)) for r in range(world)]
        if spec != "Flat":  # each rank's own FAISS index holds only its live positions...
            assert sum(h["shard_vectors"] for h in held) == live
            for s in shards:
                _, own = s._search_shard(queries, 3000)
                own = own[own >= 0]
                assert ((own >= s.start) & (own < s.end)).all() and not s.removed[own].any()
            # ...and no longer maps the whole file (the loading index was dropped)
            assert str((folder / files["faiss"].name).resolve()) not in Path("/proc/self/maps").read_text()


def test_sharded_flat_rank_reads_only_its_rows(tmp_path, make_synthetic_corpus, clustered_source):
    """A Flat rank searches its row range of the memory-mapped vectors: pages of the other
    ranks' rows are never touched (RSS of the mapping measured in /proc/self/smaps)."""
    from retriever.index.build import build_index

    folder = build_index(
        make_synthetic_corpus(tmp_path, 20000),
        clustered_source(128),
        tmp_path / "flat",
        progress=False,
        settings=IndexSettings(chunk_size=20000),
    )
    vectors_file = str((folder / "vectors.g1.npy").resolve())

    def mapped_rss() -> int:
        total, current = 0, False
        for line in Path("/proc/self/smaps").read_text().splitlines():
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                current = fields[-1] == vectors_file
            elif current and line.startswith("Rss:"):
                total += int(fields[1]) * 1024
        return total

    shard = ShardedPassageIndex.from_index(PassageIndex.load(folder), 0, 4)
    shard._search_shard(clustered_source(128).embed_passages([{"id": "s1"}]), 5)
    size = Path(vectors_file).stat().st_size  # 5 MB
    assert 0.2 * size < mapped_rss() < 0.25 * size + 256 * 1024  # its quarter (+ kernel read-around)


BUILD_SCRIPT = r"""
import json, sys
from pathlib import Path
from atlas.run_index import open_index, prepare_index
from atlas.config import AtlasConfig, IndexConfig, RetrieverConfig, TrainingConfig
from atlas.distributed import init_distributed, shutdown
from retriever.retriever import Retriever

context = init_distributed()
corpus, out_dir, encoder = sys.argv[1:4]
config = AtlasConfig(retriever=RetrieverConfig(model=encoder),
                     index=IndexConfig(corpus=corpus, chunk_size=7),
                     training=TrainingConfig(output_dir=out_dir))
retriever = Retriever.from_config(config.retriever)
embedded = []
original = retriever.embed_passages
def counting(passages, **kwargs):
    embedded.extend(p["id"] for p in passages)
    return original(passages, **kwargs)
retriever.embed_passages = counting
index = open_index(prepare_index(config, retriever=retriever), retriever, config.index)
# one file per rank: two ranks printing to one stdout can interleave their lines
report = {"rank": context.rank, "embedded": embedded, "count": len(index)}
Path(out_dir, f"report-{context.rank}.json").write_text(json.dumps(report))
shutdown(context)
"""


@pytest.mark.slow
def test_run_index_is_built_once_shared_by_the_ranks(index_folders, tiny_encoder_path, tmp_path):
    """`index.corpus` under torchrun: the ranks split the embedding (no passage twice, no two
    ranks writing one file) and the result equals a single-process build."""
    corpus = index_folders["Flat"].parent / "corpus"
    script = tmp_path / "build.py"
    script.write_text(BUILD_SCRIPT)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(corpus),
        str(tmp_path / "run"),
        str(tiny_encoder_path),
    ]
    result = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / "run" / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["rank"] for r in reports) == [0, 1] and all(r["count"] == 61 for r in reports)
    embedded = [set(r["embedded"]) for r in reports]
    assert embedded[0] and embedded[1] and not embedded[0] & embedded[1]
    assert len(embedded[0] | embedded[1]) == 61
    assert np.array_equal(
        np.load(tmp_path / "run" / "index" / "vectors.g1.npy"), np.load(index_folders["Flat"] / "vectors.g1.npy")
    )


@pytest.mark.parametrize("spec", ["IVF8,Flat", "IVF8,PQ8"])
def test_ivf_shard_read_from_the_file_equals_faiss_copy(synthetic_indexes, spec):
    """The `pread` of a mapped index's lists (only this rank's entries enter memory) gives the
    same lists as FAISS's own `copy_subset_to` from an index read into memory."""
    import faiss
    from faiss.contrib.inspect_tools import get_invlist

    from retriever.index.sharded import ivf_shard

    folder = synthetic_indexes[spec]
    path = folder / PassageIndex.load(folder).manifest.files["faiss"].name
    removed = np.zeros(3000, dtype=bool)
    removed[::5] = True
    mapped = ivf_shard(path, PassageIndex.load(folder).faiss_index, 1000, 2500, removed)
    in_memory = ivf_shard(path, PassageIndex.load(folder, mmap=False).faiss_index, 1000, 2500, removed)
    assert mapped.ntotal == in_memory.ntotal == 1500 - 300
    for list_no in range(8):
        ids_a, codes_a = get_invlist(faiss.extract_index_ivf(mapped).invlists, list_no)
        ids_b, codes_b = get_invlist(faiss.extract_index_ivf(in_memory).invlists, list_no)
        order_a, order_b = np.argsort(ids_a), np.argsort(ids_b)
        np.testing.assert_array_equal(ids_a[order_a], ids_b[order_b])
        np.testing.assert_array_equal(codes_a[order_a], codes_b[order_b])
