"""Sharded search: merging is exact, and 2 ranks under torchrun return what 1 process returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from retriever.sharded import merge_top_k, shard_bounds


def test_shard_bounds_cover_every_position_once():
    for total in (0, 1, 7, 100):
        for world in (1, 2, 3, 8):
            spans = [shard_bounds(total, r, world) for r in range(world)]
            assert spans[0][0] == 0 and spans[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_merge_top_k_equals_a_global_sort():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(5, 12)).astype(np.float32)
    rows = rng.permutation(60)[:60].reshape(5, 12).astype(np.int64)
    scores[0, 3] = scores[0, 7]  # a tie: the lower position wins
    rows[1, 4], scores[1, 4] = -1, -np.inf  # a missing candidate comes last
    got_scores, got_rows = merge_top_k(scores, rows, 4)
    for q in range(5):
        expected = sorted(zip(-scores[q], np.where(rows[q] < 0, 10**9, rows[q])))[:4]
        assert list(got_rows[q]) == [r for _, r in expected]
        assert list(got_scores[q]) == [-s for s, _ in expected]


@pytest.fixture(scope="module")
def index_folders(tmp_path_factory, tiny_encoder_path):
    from atlas.config import RetrieverConfig
    from retriever.corpus import prepare_corpus
    from retriever.encoder import build_retriever
    from retriever.index_build import build_index

    root = tmp_path_factory.mktemp("sharded")
    words = "alpha beta gamma delta river mountain capital city flag colour north south".split()
    rng = np.random.default_rng(1)
    docs = [{"id": f"d{i}", "title": f"T{i}", "text": " ".join(rng.choice(words, 8))} for i in range(61)]
    (root / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    prepare_corpus([root / "docs.jsonl"], root / "corpus", chunk_words=0, progress=False)
    retriever = build_retriever(RetrieverConfig(model=str(tiny_encoder_path)))
    folders = {}
    for spec in ("Flat", "IVF4,Flat"):
        folders[spec] = root / spec.replace(",", "_")
        build_index(root / "corpus", retriever, folders[spec], spec=spec, progress=False, train_sample=61,
                    nprobe=4)
    return folders


def search(folder, encoder, *, nproc: int | None, cwd) -> list[dict]:
    args = ["-m", "atlas", "index", "search", str(folder), "river capital", "north flag colour",
            "-k", "7", "--json", "--encoder", str(encoder)]
    if nproc is None:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               *args, "--sharded"]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "atlas",
           "index", "build", "--corpus", str(corpus), "--encoder", str(tiny_encoder_path), "--out", str(out),
           "--chunk-size", "7"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    single = np.load(index_folders["Flat"] / "vectors.g1.npy")
    assert np.array_equal(np.load(out / "vectors.g1.npy"), single)
    assert search(out, tiny_encoder_path, nproc=None, cwd=tmp_path) == search(
        index_folders["Flat"], tiny_encoder_path, nproc=None, cwd=tmp_path)
