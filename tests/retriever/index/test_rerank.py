"""Two-stage search (issue 16): a compressed index proposes k' candidates, exact scores come
from the memory-mapped float16 vectors. Exactness vs brute force, memory mapping, manifest,
removed rows, sharded re-rank, CLI and errors."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from atlas.cli import corpus_commands as cli_corpus
from atlas.cli import index_commands as cli_index
from retriever.index import InvalidIndexError, PassageIndex
from retriever.index.build import build_index
from retriever.index.exact_search import best_first, exact_search
from retriever.index.rerank import gather_rows, read_runs, rerank_candidates
from retriever.index.settings import IndexSettings
from retriever.index.sharded import ShardedPassageIndex
from retriever.index.update import remove_passages

N = 2000
SPECS = ["PQ4", "OPQ4,PQ4", "IVF8,PQ4", "PQ8x4fs", "IVF8,PQ8x4fs"]  # 4 B/vector: very lossy on its own


@pytest.fixture(scope="module")
def rerank_indexes(tmp_path_factory, make_synthetic_corpus, clustered_source):
    """One re-ranking index (k' = 300) per compressed spec over 2,000 clustered 32-d vectors."""
    import faiss

    root = tmp_path_factory.mktemp("exact_rerank")
    corpus = make_synthetic_corpus(root, N)
    # FAISS's OpenMP k-means stalls 10-50x on an oversubscribed machine (bench/index_compressed.py);
    # one thread trains these tiny codebooks in well under a second (OPQ: ~3 s)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return {
            spec: build_index(
                corpus,
                clustered_source(),
                root / spec.replace(",", "_"),
                progress=False,
                settings=IndexSettings(spec=spec, exact_rerank=300, nprobe=8, train_sample=1024),
            )
            for spec in SPECS
        }
    finally:
        faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def queries(clustered_source) -> np.ndarray:
    return clustered_source().embed_passages([{"id": f"s{i}"} for i in range(0, N, 41)])


def brute_force(index: PassageIndex, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over the live float16 vectors, in the canonical order."""
    exclude = index.removed if index.removed.any() else None
    scores, rows = exact_search(queries, np.asarray(index.vectors), k, exclude=exclude)
    return best_first(scores, rows, k)


@pytest.mark.parametrize("spec", SPECS)
def test_rerank_equals_brute_force_when_candidates_cover_the_neighbours(rerank_indexes, queries, spec):
    index = PassageIndex.load(rerank_indexes[spec])
    assert index.manifest.exact_rerank == 300 and index.exact_rerank == 300 and index.manifest.keep_embeddings
    expected_scores, expected_rows = brute_force(index, queries, 10)
    candidates = index.faiss_index.search(queries, 300)[1]
    covered = [set(e) <= set(c) for e, c in zip(expected_rows, candidates)]
    assert np.mean(covered) > 0.9  # the setting the claim is about (checked, not assumed)
    scores, rows = index.search_vectors(queries, 10)
    np.testing.assert_array_equal(rows[covered], expected_rows[covered])
    np.testing.assert_allclose(scores[covered], expected_scores[covered], rtol=1e-5)
    plain = PassageIndex.load(rerank_indexes[spec], exact_rerank=0)  # the codes alone rank worse
    assert plain.exact_rerank == 0
    plain_rows = plain.search_vectors(queries, 10)[1]
    assert np.mean(plain_rows == expected_rows) < np.mean(rows == expected_rows)


def test_rerank_candidates_with_missing_rows_and_wide_candidate_lists():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((50, 8)).astype(np.float16)
    q = rng.standard_normal((7, 8)).astype(np.float32)
    candidates = np.stack([rng.permutation(50)[:20] for _ in range(7)])
    candidates[:, -3:] = -1  # fewer than k' proposed
    scores, rows = rerank_candidates(q, vectors, candidates, 5, batch_bytes=1)  # one query a batch
    exact = np.where(candidates >= 0, np.einsum("qd,qcd->qc", q, vectors[candidates].astype(np.float32)), -np.inf)
    expected_scores, expected_rows = best_first(exact.astype(np.float32), candidates, 5)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)
    _, rows = rerank_candidates(q, vectors, np.full((7, 4), -1), 3)
    assert (rows == -1).all()


def test_read_runs_joins_near_rows_and_caps_each_read():
    rows = np.array([0, 1, 2, 10, 11, 40, 1000])
    # 8-byte rows, gaps of up to 8 rows joined: 0-11 one read, 40 and 1000 alone
    assert read_runs(rows, 8, gap_bytes=64, max_read_bytes=1 << 20).tolist() == [0, 5, 6, 7]
    # reads of at most 4 rows: 0-2 (span 3), then 10-11
    assert read_runs(rows, 8, gap_bytes=64, max_read_bytes=32).tolist() == [0, 3, 5, 6, 7]
    assert read_runs(rows, 8, gap_bytes=0, max_read_bytes=8).tolist() == list(range(8))
    assert read_runs(np.array([], dtype=np.int64), 8).tolist() == [0]


@pytest.mark.parametrize("gap_bytes,max_read_bytes", [(0, 1), (256, 1 << 20), (256, 512), (1 << 20, 1 << 20)])
def test_gather_rows_from_the_file_equals_indexing(tmp_path, gap_bytes, max_read_bytes):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 16)).astype(np.float16)  # 32-byte rows
    np.save(tmp_path / "v.npy", vectors)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    dense = np.arange(100, 160)  # consecutive rows: read straight into place
    sparse = np.sort(rng.choice(3000, 200, replace=False))
    mixed = np.unique(np.concatenate([dense, sparse, [0, 2999]]))
    for rows in (dense, sparse, mixed, np.array([2999])):
        got = gather_rows(mapped, rows, gap_bytes=gap_bytes, max_read_bytes=max_read_bytes)
        assert got.dtype == np.float16 and np.array_equal(got, vectors[rows])


def test_vectors_stay_memory_mapped(rerank_indexes, queries):
    index = PassageIndex.load(rerank_indexes["PQ4"])
    (stored,) = index.vectors.files
    assert isinstance(stored, np.memmap) and stored.dtype == np.float16 and index.vectors.dtype == np.float16
    assert not stored.flags.writeable
    index.search_vectors(queries, 10)
    assert index.vectors.files == [stored]  # never swapped for an in-memory copy
    mapped = (rerank_indexes["PQ4"] / index.manifest.files["vectors"].name).resolve()
    assert str(mapped) in Path("/proc/self/maps").read_text()


def test_manifest_round_trip_and_override(rerank_indexes, queries, tmp_path):
    folder = rerank_indexes["IVF8,PQ4"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["exact_rerank"] == 300 and "vectors" in manifest["files"]
    assert PassageIndex.load(folder).manifest.exact_rerank == 300
    narrow = PassageIndex.load(folder, exact_rerank=20)
    assert narrow.exact_rerank == 20
    assert narrow.search_vectors(queries, 10)[1].shape == (len(queries), 10)
    with pytest.raises(ValueError, match="exact_rerank must be an integer"):
        PassageIndex.load(folder, exact_rerank=-1)
    # a manifest written when the field was named "rerank" loads with its k'
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    (old / "manifest.json").write_text(
        json.dumps({**{k: v for k, v in manifest.items() if k != "exact_rerank"}, "rerank": 300})
    )
    assert PassageIndex.load(old).exact_rerank == 300


@pytest.mark.parametrize("spec", ["PQ4", "PQ8x4fs", "IVF8,PQ8x4fs"])
def test_removed_rows_are_never_returned(rerank_indexes, queries, tmp_path, spec):
    folder = tmp_path / "ix"
    shutil.copytree(rerank_indexes[spec], folder)
    remove_passages(folder, [f"s{i}" for i in range(0, N, 3)])
    index = PassageIndex.load(folder, exact_rerank=N)  # every live row re-scored: exactly brute force
    scores, rows = index.search_vectors(queries, 20)
    assert not index.removed[rows].any()
    expected_scores, expected_rows = brute_force(index, queries, 20)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


@pytest.mark.parametrize("spec", ["PQ4", "IVF8,PQ4", "OPQ4,PQ4", "IVF8,PQ8x4fs"])
def test_sharded_ranks_rerank_their_own_rows(rerank_indexes, queries, spec):
    folder = rerank_indexes[spec]
    expected_scores, expected_rows = PassageIndex.load(folder, exact_rerank=N).search_vectors(queries, 10)
    shards = [ShardedPassageIndex.from_index(PassageIndex.load(folder, exact_rerank=N), r, 2) for r in range(2)]
    if shards[0].mode == "replicate":  # OPQ + flat codes, fast scan: each rank searches (and re-ranks) all
        scores, rows = shards[0].search_vectors(queries, 10)
    else:
        candidates = [s._search_shard(queries, 10) for s in shards]
        for s, (_, own) in zip(shards, candidates):
            assert ((own >= s.start) & (own < s.end)).all()  # re-ranked where the rows live
        scores, rows = best_first(
            np.concatenate([c[0] for c in candidates], axis=1), np.concatenate([c[1] for c in candidates], axis=1), 10
        )
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


def test_rerank_without_vectors_is_a_clear_error(tmp_path, make_synthetic_corpus, clustered_source):
    corpus = make_synthetic_corpus(tmp_path, 600)
    folder = build_index(
        corpus, clustered_source(), tmp_path / "pq", progress=False, settings=IndexSettings(spec="PQ4")
    )
    assert PassageIndex.load(folder).exact_rerank == 0  # an index built before re-ranking: works as it was
    with pytest.raises(
        InvalidIndexError, match=r"pq: re-ranking 50 candidates needs the float16 vectors file.*files\.vectors"
    ):
        PassageIndex.load(folder, exact_rerank=50)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "exact_rerank": "many"}))
    with pytest.raises(ValueError, match=r"manifest.json: field exact_rerank must be an integer"):
        PassageIndex.load(folder)
    flat = build_index(
        corpus, clustered_source(), tmp_path / "flat", progress=False, settings=IndexSettings(exact_rerank=10)
    )
    assert PassageIndex.load(flat).exact_rerank == 0  # Flat is exact already


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="atlas")
    subparsers = parser.add_subparsers(dest="command")
    cli_corpus.register(subparsers)
    cli_index.register(subparsers)
    args = parser.parse_args([str(a) for a in argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def save_tiny_retriever(folder):
    """A 1-layer, 32-d random BERT with MiniLM's tokenizer, saved as a retriever folder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from common.modeling import encoder_source
    from retriever.encoder import ContrieverEncoder
    from retriever.retriever import Retriever

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    encoder = ContrieverEncoder(
        BertModel(config, add_pooling_layer=False).eval(),
        AutoTokenizer.from_pretrained(encoder_source("minilm")),
        normalize=True,
    )
    Retriever(query_encoder=encoder, passage_maxlength=64).save_pretrained(folder)
    return folder


def test_cli_build_and_search_with_rerank(tmp_path, capsys):
    encoder = save_tiny_retriever(tmp_path / "enc")
    words = ["river", "mountain", "city", "music", "king", "war", "bridge", "island", "science", "novel"]
    rng = np.random.default_rng(0)
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(
            json.dumps({"id": f"d{i}", "title": "", "text": " ".join(rng.choice(words, 8))}) + "\n" for i in range(300)
        )
    )
    assert run_cli(capsys, "corpus", "prepare", docs, "--out", tmp_path / "corpus")[0] == 0
    common = ["--corpus", tmp_path / "corpus", "--encoder", encoder]
    assert run_cli(capsys, "index", "build", *common, "--out", tmp_path / "flat")[0] == 0
    assert (
        run_cli(capsys, "index", "build", *common, "--out", tmp_path / "pq", "--spec", "PQ4", "--exact-rerank", "300")[
            0
        ]
        == 0
    )
    assert run_cli(capsys, "index", "build", *common, "--out", tmp_path / "bare", "--spec", "PQ4")[0] == 0
    assert (
        run_cli(
            capsys, "index", "build", *common, "--out", tmp_path / "fast", "--spec", "PQ4x4fs", "--exact-rerank", "300"
        )[0]
        == 0
    )  # 4-bit fast scan: 2 B a passage
    code, out, _ = run_cli(capsys, "index", "info", "--index", tmp_path / "pq", "--json")
    assert code == 0 and json.loads(out)["exact_rerank"] == 300 and "vectors" in json.loads(out)["files"]

    def ids(folder, *extra):
        code, out, err = run_cli(
            capsys, "index", "search", "--index", folder, "river king music", "-k", "5", "--json", *extra
        )
        assert code == 0, err
        return [(h["id"], round(h["score"], 4)) for h in json.loads(out)["hits"]]

    assert ids(tmp_path / "pq") == ids(tmp_path / "flat")  # k' = every passage: exact
    assert ids(tmp_path / "fast") == ids(tmp_path / "flat")
    assert ids(tmp_path / "bare", "--exact-rerank", "0") == ids(
        tmp_path / "pq", "--exact-rerank", "0"
    )  # the codes alone
    code, _, err = run_cli(capsys, "index", "search", "--index", tmp_path / "bare", "river", "--exact-rerank", "50")
    assert code == 2 and "needs the float16 vectors file" in err and "--exact-rerank" in err
