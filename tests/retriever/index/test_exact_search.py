"""Exact search on both paths (fp32; bf16 scoring + float32 re-scoring), against numpy in float64.

The reference ranks by the float64 inner product of the float32 queries with the stored rows
(float16 rows are exact in float64), ties to the lower row. Both paths must return those ids up to
exact ties: the float64 score of the row returned at each rank is the reference's at that rank,
exactly (copies of a row tie in float64 but may differ by an ulp in a float32 product, where a
blocked product takes them through different kernels, so their order among themselves is free);
scores to float32 rounding. The bf16 path runs here whatever the CPU (forced): it is slow where
bfloat16 is emulated, but its results may not depend on that.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import retriever.index.exact_search as search_module
from retriever.index import PassageIndex
from retriever.index.exact_search import bf16_score_ceiling, exact_search, resolve_exact_precision
from retriever.index.manifest import Manifest, Segment

PRECISIONS = ["fp32", "bf16"]


def reference(queries: np.ndarray, vectors: np.ndarray, k: int, exclude: np.ndarray | None = None):
    """float64 brute force: (scores, rows), best first, ties to the lower row, excluded rows never."""
    queries = np.asarray(queries)
    scores = queries.astype(np.float64) @ vectors.astype(np.float64).T
    if exclude is not None:
        scores[:, exclude] = -np.inf
    rows = np.broadcast_to(np.arange(len(vectors)), scores.shape)
    order = np.lexsort((rows, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), order


def assert_same_up_to_ties(queries, vectors, rows, ref_scores, exclude=None):
    """Every query's rows are distinct and score (in float64, as the reference computed it) exactly
    the reference's, rank by rank."""
    queries = np.asarray(queries)
    assert rows.shape == ref_scores.shape
    assert all(len(set(r)) == len(r) for r in rows)
    full = queries.astype(np.float64) @ vectors.astype(np.float64).T  # the reference's own product
    if exclude is not None:
        full[:, exclude] = -np.inf
    np.testing.assert_array_equal(np.take_along_axis(full, rows, 1), ref_scores)


def check(queries, vectors, k, precision, exclude=None, **kwargs):
    stats: dict = {}
    scores, rows = exact_search(queries, vectors, k, precision=precision, exclude=exclude, stats=stats, **kwargs)
    ref_scores, ref_rows = reference(queries, vectors, k, exclude)
    n_live = len(vectors) - (0 if exclude is None else int(exclude.sum()))
    ref_scores, ref_rows = ref_scores[:, :n_live], ref_rows[:, :n_live]
    assert_same_up_to_ties(queries, vectors, rows, ref_scores, exclude)
    np.testing.assert_allclose(scores, ref_scores, rtol=2e-6, atol=2e-6 * np.abs(ref_scores).max())
    assert scores.dtype == np.float32 and rows.dtype == np.int64
    assert stats["path"] == precision
    return stats, scores, rows


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_equals_float64_reference(precision, dtype):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5000, 48)).astype(dtype)
    queries = rng.standard_normal((23, 48)).astype(np.float32)
    stats, _, _ = check(queries, vectors, 30, precision, chunk_rows=700)  # many chunks, a short last one
    if precision == "bf16":
        assert stats["redone"] == 0  # no near-ties in Gaussian data: every query proven from bf16 scores


@pytest.mark.parametrize("precision", PRECISIONS)
def test_ties_come_back_lowest_rows_first(precision):
    """Duplicated rows tie exactly; copies straddle the k-th place and chunk borders. On the bf16
    path the proof cannot hold there (copies let go score as high as those kept): those queries
    are searched again on the fp32 path, and the answer is still the reference's."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((400, 32)).astype(np.float16)
    vectors = np.concatenate([base, base[:50], base[:50], base[:50]])[rng.permutation(550)]
    vectors = np.concatenate([vectors, np.repeat(vectors[:1], 300, axis=0)])  # 301 copies of one row
    queries = np.concatenate([rng.standard_normal((6, 32)), vectors[:1].astype(np.float64) * 3]).astype(np.float32)
    stats, _, _ = check(queries, vectors, 40, precision, chunk_rows=97)
    ref_scores, _ = reference(queries, vectors, 300)
    assert (ref_scores[-1] == ref_scores[-1, 0]).all()  # the copies tie all through the last query's top 300
    if precision == "bf16":
        assert stats["redone"] >= 1


@pytest.mark.parametrize("precision", PRECISIONS)
def test_removed_rows_never_come_back(precision):
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((3000, 40)).astype(np.float16)
    queries = rng.standard_normal((9, 40)).astype(np.float32)
    exclude = np.zeros(3000, dtype=bool)
    exclude[rng.choice(3000, 900, replace=False)] = True
    exclude[1000:1500] = True  # whole chunks removed
    top = reference(queries, vectors, 5)[1].ravel()
    exclude[top] = True  # the best rows of every query removed
    _, _, rows = check(queries, vectors, 50, precision, exclude=exclude, chunk_rows=250)
    assert not exclude[rows].any()
    # k beyond the live rows: every live row, once
    few = np.ones(3000, dtype=bool)
    few[rng.choice(3000, 12, replace=False)] = False
    _, _, rows = check(queries, vectors, 100, precision, exclude=few, chunk_rows=250)
    assert rows.shape == (9, 12) and not few[rows].any()


@pytest.mark.parametrize("n_queries", [7, 40])  # FAISS: one dot product per pair under 20 queries, a GEMM above
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("k", [5, 120])  # FAISS keeps a heap under 100 results, a reservoir from 100
def test_a_few_removed_rows_are_masked_and_scores_equal_the_compacted_store(n_queries, dtype, k):
    """Chunks with a quarter or fewer rows removed are searched whole with those rows masked (NaN in
    the widened float16 chunk; wider searches of a float32 store). The results equal a search of the
    live rows alone, scores to the bit, so a compaction or a sharding changes no score; a chunk with
    fewer live rows than k gives what it has."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((2000, 32)).astype(dtype)
    queries = rng.standard_normal((n_queries, 32)).astype(np.float32)
    exclude = np.zeros(2000, dtype=bool)
    exclude[rng.choice(1900, 150, replace=False)] = True  # ~8% of each chunk of 250
    exclude[1900:1960] = True  # 60 of the last chunk's 250: a quarter or fewer still
    top = reference(queries, vectors, 3)[1].ravel()
    exclude[top] = True  # the best rows removed
    _, scores, rows = check(queries, vectors, k, "fp32", exclude=exclude, chunk_rows=250)
    assert not exclude[rows].any()
    live = np.flatnonzero(~exclude)
    compact_scores, compact_rows = exact_search(queries, vectors[live], k, precision="fp32", chunk_rows=250)
    np.testing.assert_array_equal(rows, live[compact_rows])
    np.testing.assert_array_equal(scores, compact_scores)
    # a chunk of 100 rows with 20 removed, k = 90: it holds fewer live rows than k
    small = rng.standard_normal((100, 32)).astype(dtype)
    gone = np.zeros(100, dtype=bool)
    gone[rng.choice(100, 20, replace=False)] = True
    _, _, rows = check(queries, small, 90, "fp32", exclude=gone, chunk_rows=100)
    assert rows.shape == (n_queries, 80) and not gone[rows].any()


@pytest.mark.parametrize("n_queries", [3, 19, 20, 64])
@pytest.mark.parametrize("k", [1, 10, 100, 150])
def test_faiss_never_returns_a_nan_row(n_queries, k):
    """What the fp32 path relies on to mask removed rows: `faiss.knn` takes no NaN score into its
    results (heap, reservoir, top-1; inner product and L2), and the other rows' scores are the same
    bits as without the NaN rows; where fewer rows are left than k, the rest is id -1."""
    import faiss

    rng = np.random.default_rng(k * 100 + n_queries)
    vectors = rng.standard_normal((600, 16)).astype(np.float32)
    queries = rng.standard_normal((n_queries, 16)).astype(np.float32)
    nan = rng.random(600) < 0.2
    masked = vectors.copy()
    masked[nan] = np.nan
    live = np.flatnonzero(~nan)
    for metric in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
        distances, ids = faiss.knn(queries, masked, k, metric=metric)
        want_distances, want_ids = faiss.knn(queries, vectors[live], k, metric=metric)
        np.testing.assert_array_equal(ids, live[want_ids])
        np.testing.assert_array_equal(distances, want_distances)
    distances, ids = faiss.knn(queries, masked[:20], 20, metric=faiss.METRIC_INNER_PRODUCT)
    n_live = int((~nan[:20]).sum())
    assert (ids[:, :n_live] >= 0).all() and (ids[:, n_live:] == -1).all()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_non_gaussian_scales_and_small_stores(precision):
    """Rows of very different norms (the bound uses the largest), k near N, one row."""
    rng = np.random.default_rng(3)
    vectors = (rng.standard_normal((900, 16)) * rng.lognormal(0, 2, (900, 1))).astype(np.float32)
    queries = (rng.standard_normal((5, 16)) * rng.lognormal(0, 2, (5, 1))).astype(np.float32)
    check(queries, vectors, 10, precision, chunk_rows=64)
    check(queries, vectors, 899, precision, chunk_rows=64)
    check(queries, vectors[:1], 3, precision)
    check(torch.from_numpy(queries), vectors, 7, precision)  # a torch tensor of queries


@pytest.mark.parametrize("precision", PRECISIONS)
def test_negative_and_mixed_thresholds(precision):
    """Scores all negative for some queries (τ < 0: the screening compares bfloat16 values, not their
    bits) and positive for others, in one batch."""
    rng = np.random.default_rng(6)
    vectors = np.abs(rng.standard_normal((4000, 24))).astype(np.float16)  # every entry positive
    queries = rng.standard_normal((8, 24)).astype(np.float32)
    queries[:4] = -np.abs(queries[:4])  # these score every row below 0
    _, scores, _ = check(queries, vectors, 20, precision, chunk_rows=512)
    assert (scores[:4] < 0).all() and (scores[4:, 0] > 0).all()


def test_the_bf16_ceiling_holds_for_the_scores_the_path_computes():
    """Every exact (float64) inner product is at most the ceiling of its bfloat16 score, computed
    the way the bf16 path computes it (this CPU's own kernel), for rows and queries whose entries
    differ in magnitude (the worst case for the bound); and the ceiling is tight enough to prove a
    top-k from a few more candidates (its margin ≪ the scores' spread)."""
    rng = np.random.default_rng(4)
    for dim in (16, 384, 768):
        vectors = (rng.standard_normal((2000, dim)) * rng.lognormal(0, 1.5, (2000, dim))).astype(np.float16)
        queries = (rng.standard_normal((50, dim)) * rng.lognormal(0, 1.5, (50, dim))).astype(np.float32)
        q_b = torch.from_numpy(queries).bfloat16()
        approx = (q_b @ torch.from_numpy(vectors).bfloat16().T).double().numpy()
        exact = queries.astype(np.float64) @ vectors.astype(np.float64).T
        q_rounded = q_b.double().numpy()
        error = np.linalg.norm(queries.astype(np.float64) - q_rounded, axis=1)
        norm = np.linalg.norm(q_rounded, axis=1)
        row_norm_max = np.linalg.norm(vectors.astype(np.float64), axis=1).max()
        ceiling = np.stack(
            [bf16_score_ceiling(approx[:, j], error, norm, row_norm_max, dim) for j in range(approx.shape[1])], axis=1
        )
        assert (exact <= ceiling).all()
        margin = (ceiling - approx) / (norm[:, None] * row_norm_max)
        assert margin.max() < 0.02


def test_precision_is_chosen_at_run_time(monkeypatch):
    with pytest.raises(ValueError, match="valid: auto, fp32, bf16"):
        resolve_exact_precision("fp16", "ip")
    assert resolve_exact_precision("bf16", "l2") == "fp32"  # L2: fp32 path only
    assert resolve_exact_precision("fp32", "ip") == "fp32"
    monkeypatch.setattr(search_module, "native_bf16_speedup", lambda: 0.0)  # no AVX512-BF16 / AMX
    assert resolve_exact_precision("auto", "ip") == "fp32"
    monkeypatch.setattr(search_module, "native_bf16_speedup", lambda: 2.0)  # measured 2x faster
    assert resolve_exact_precision("auto", "ip") == "bf16"
    # a short scan keeps the fp32 path: too few rows, or too few queries
    assert resolve_exact_precision("auto", "ip", n_rows=search_module.BF16_MIN_ROWS - 1, n_queries=1000) == "fp32"
    assert resolve_exact_precision("auto", "ip", n_rows=10**6, n_queries=search_module.BF16_MIN_QUERIES - 1) == "fp32"
    assert resolve_exact_precision("auto", "ip", n_rows=10**6, n_queries=1000) == "bf16"
    stats: dict = {}
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((300, 8)).astype(np.float16)
    exact_search(rng.standard_normal((2, 8)), vectors, 3, stats=stats)
    assert stats["path"] == "fp32"  # 300 rows, 2 queries
    monkeypatch.setattr(search_module, "BF16_MIN_ROWS", 0)
    monkeypatch.setattr(search_module, "BF16_MIN_QUERIES", 0)
    exact_search(rng.standard_normal((2, 8)), vectors, 3, stats=stats)
    assert stats["path"] == "bf16"


def test_this_cpu_detection_matches_its_flags():
    """auto never picks bf16 on a CPU that lacks AVX512-BF16 and AMX (bfloat16 emulated)."""
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    if not native:
        assert search_module.native_bf16_speedup() == 0.0


@pytest.mark.parametrize("precision", PRECISIONS)
def test_passage_index_flat_search_on_both_paths(precision, monkeypatch):
    """`PassageIndex.search_vectors` (what `atlas index search` runs) with removed rows and ties."""
    monkeypatch.setattr(search_module, "native_bf16_speedup", lambda: 2.0 if precision == "bf16" else 0.0)
    monkeypatch.setattr(search_module, "BF16_MIN_ROWS", 0)  # auto takes bf16 at any size here
    monkeypatch.setattr(search_module, "BF16_MIN_QUERIES", 0)
    rng = np.random.default_rng(6)
    vectors = rng.standard_normal((2000, 24)).astype(np.float16)
    vectors[1500:1510] = vectors[7]  # copies of row 7
    removed = np.zeros(2000, dtype=bool)
    removed[::7] = True  # row 7 itself among them
    segments = [Segment(corpus="", fingerprint="", count=2000, offset=0)]
    live = int((~removed).sum())
    manifest = Manifest(
        spec="Flat", dim=24, count=live, total=2000, encoder_fingerprint="e", segments=segments, files={}
    )
    index = PassageIndex(".", manifest, corpora=[], vectors=vectors, faiss_index=None, removed=removed)
    queries = np.concatenate([rng.standard_normal((4, 24)), vectors[7:8] * 2.0]).astype(np.float32)
    scores, rows = index.search_vectors(queries, 20)
    ref_scores, _ = reference(queries, vectors, 20, removed)
    assert_same_up_to_ties(queries, vectors, rows, ref_scores, removed)
    np.testing.assert_allclose(scores, ref_scores, rtol=2e-6, atol=1e-5)
    # the 9 live copies of row 7 first (1505 = 7 · 215 is removed, as row 7 is)
    assert set(rows[-1, :9]) == {1500, 1501, 1502, 1503, 1504, 1506, 1507, 1508, 1509}


def test_bf16_path_in_query_blocks(monkeypatch):
    """Many queries are scanned in blocks (each block's score matrix stays bounded): same answers."""
    monkeypatch.setattr(search_module, "_BF16_QUERIES", 4)
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((2500, 20)).astype(np.float16)
    queries = rng.standard_normal((11, 20)).astype(np.float32)
    queries[5] = vectors[3]  # a query equal to a stored row
    check(queries, vectors, 12, "bf16", chunk_rows=300)


def test_the_speed_probe_leaves_the_global_random_state_alone():
    search_module.native_bf16_speedup.cache_clear()
    before = torch.get_rng_state()
    search_module.native_bf16_speedup()
    assert torch.equal(before, torch.get_rng_state())
