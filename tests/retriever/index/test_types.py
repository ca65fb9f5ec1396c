"""Index-type registry and chunked exact search, against brute-force numpy in float64."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch

from retriever.index.exact_search import exact_search
from retriever.index.types import INDEX_TYPES, build_faiss_index, parse_spec, set_search_params


def brute_force(queries: np.ndarray, vectors: np.ndarray, k: int, metric: str):
    q, v = queries.astype(np.float64), vectors.astype(np.float64)
    if metric == "ip":
        scores = q @ v.T
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    else:
        scores = ((q[:, None, :] - v[None, :, :]) ** 2).sum(-1)
        order = np.argsort(scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_exact_search_equals_brute_force(metric, dtype):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1500, 24)).astype(dtype)
    queries = rng.standard_normal((7, 24)).astype(np.float32)
    scores, ids = exact_search(queries, vectors, 25, metric, chunk_rows=128)  # many chunks, k < chunk
    ref_scores, ref_ids = brute_force(queries, vectors, 25, metric)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-4, atol=1e-4)


def test_exact_search_k_larger_than_chunk_and_exclusion():
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((300, 8)).astype(np.float32)
    queries = rng.standard_normal((3, 8)).astype(np.float32)
    exclude = np.zeros(300, dtype=bool)
    exclude[rng.choice(300, 120, replace=False)] = True
    scores, ids = exact_search(torch.from_numpy(queries), vectors, 50, chunk_rows=16, exclude=exclude)
    kept = np.flatnonzero(~exclude)
    ref_scores, ref_local = brute_force(queries, vectors[kept], 50, "ip")
    np.testing.assert_array_equal(ids, kept[ref_local])
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    # k beyond the eligible rows: only the eligible ones come back
    _, ids = exact_search(queries, vectors, 500, exclude=exclude)
    assert ids.shape == (3, 180) and not exclude[ids].any()


def test_registry_specs_build_the_right_faiss_types():
    expected = {
        "Flat": faiss.IndexFlat,
        "IVF8,Flat": faiss.IndexIVFFlat,
        "IVF8,PQ4": faiss.IndexIVFPQ,
        "PQ4": faiss.IndexPQ,
        "OPQ4,PQ4": faiss.IndexPreTransform,  # a learned rotation, then PQ
        "HNSW8": faiss.IndexHNSWFlat,
        "SQ8": faiss.IndexScalarQuantizer,
        "PQ8x4fs": faiss.IndexPQFastScan,  # 4-bit codes, SIMD scan
        "IVF8,PQ8x4fs": faiss.IndexIVFPQFastScan,
    }
    assert {parse_spec(s, 16)[0] for s in [*expected, "OPQ4,IVF8,PQ4"]} == set(INDEX_TYPES)
    assert isinstance(faiss.downcast_index(build_faiss_index("OPQ4,IVF8,PQ4", 16)), faiss.IndexPreTransform)
    rng = np.random.default_rng(2)
    data = rng.standard_normal((2000, 16)).astype(np.float32)
    for spec, cls in expected.items():
        index = build_faiss_index(spec, 16, "ip")
        assert isinstance(faiss.downcast_index(index), cls) and index.metric_type == faiss.METRIC_INNER_PRODUCT
        index.train(data)
        index.add(data)
        set_search_params(index, nprobe=8, ef_search=64)
        assert index.search(data[:2], 1)[1].shape == (2, 1)
    assert build_faiss_index("Flat", 16, "l2").metric_type == faiss.METRIC_L2


def test_bad_specs_and_metrics_are_named():
    with pytest.raises(ValueError, match=r"unknown index spec 'IVF,PQ'; valid forms .*HNSW32, SQ8"):
        build_faiss_index("IVF,PQ", 16)
    with pytest.raises(ValueError, match="PQ5 needs m > 0 dividing the dimension 16"):
        build_faiss_index("IVF4,PQ5", 16)
    with pytest.raises(ValueError, match="valid: ip, l2"):
        build_faiss_index("Flat", 16, "cosine")
