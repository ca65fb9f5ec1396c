"""Index types: a registry of FAISS `index_factory` specs, and chunked exact search in torch.

Two things live here because every vector store in atlas needs them (the passage index,
the kNN-LM datastore):

* `build_faiss_index(spec, dim, metric)` turns a spec from the registry `INDEX_TYPES`
  (`Flat`, `IVF{n},Flat`, `IVF{n},PQ{m}`, `PQ{m}`, `HNSW{M}`, `SQ8`) into an untrained
  `faiss.Index`; an unknown spec raises `ValueError` listing the valid forms.
* `faiss_read_flags(spec, dim)` gives the `faiss.read_index` flags that memory-map a saved
  index of that family (FAISS supports different flags per family, and rejects a mix);
* `exact_search(queries, vectors, k)` is brute-force top-k over the vectors in chunks of rows
  (each widened to float32 by torch, searched by `faiss.knn`, merged by a running top-k), so
  memory stays bounded whatever N is and a float16 memory-mapped flat index needs no float32
  copy. Measured (bench/index_exact_search.py, 1M x 384, 1000 queries, k=100): 0.92x
  `faiss.IndexFlatIP` on float32 vectors, 0.80x on float16 (the widening), 1.7x torch
  matmul + topk; with current FAISS its blocked GEMM + heap beats matmul + topk here.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import faiss
import numpy as np
import torch

Metric = Literal["ip", "l2"]
_FAISS_METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}


@dataclass(frozen=True)
class IndexType:
    """One family of index specs: the spec's pattern and what it costs.

    `needs_training` says whether `index.train(sample)` must run before `add`;
    `search_param` names the knob set at search time (`nprobe`, `efSearch`) or is None.
    `mmap` says how FAISS memory-maps a saved index of the family: "inverted_lists" (IVF:
    `IO_FLAG_MMAP` turns the lists into a read-only `OnDiskInvertedLists` over the file) or
    "codes" (flat-code indexes and HNSW: `IO_FLAG_MMAP_IFC` maps the code array / storage).
    `shard` says how a sharded index (retriever/sharded.py) splits it over ranks: "rows"
    (each rank keeps a contiguous range of positions; exact) or "replicate" (HNSW: a graph
    restricted to some ids is searched differently, so each rank searches the whole of it).
    """

    pattern: str
    example: str
    needs_training: bool
    search_param: str | None
    check: Callable[[re.Match, int], None]
    mmap: Literal["inverted_lists", "codes"] = "codes"
    shard: Literal["rows", "replicate"] = "rows"


def _no_check(match: re.Match, dim: int) -> None:
    return None


def _check_pq(match: re.Match, dim: int) -> None:
    m = int(match.group("m"))
    if m <= 0 or dim % m != 0:
        raise ValueError(
            f"index spec {match.string!r}: PQ{m} needs m > 0 dividing the dimension {dim}"
        )


def _check_positive(group: str) -> Callable[[re.Match, int], None]:
    def check(match: re.Match, dim: int) -> None:
        if int(match.group(group)) <= 0:
            raise ValueError(f"index spec {match.string!r}: {group} must be positive")

    return check


def _check_ivf_pq(match: re.Match, dim: int) -> None:
    _check_positive("n")(match, dim)
    _check_pq(match, dim)


# The registry of index families. Keys are family names; values say how a spec is recognised.
INDEX_TYPES: dict[str, IndexType] = {
    "flat": IndexType(r"Flat", "Flat", False, None, _no_check),
    "ivf_flat": IndexType(
        r"IVF(?P<n>\d+),Flat", "IVF1024,Flat", True, "nprobe", _check_positive("n"),
        mmap="inverted_lists",
    ),
    "ivf_pq": IndexType(
        r"IVF(?P<n>\d+),PQ(?P<m>\d+)", "IVF1024,PQ64", True, "nprobe", _check_ivf_pq,
        mmap="inverted_lists",
    ),
    "pq": IndexType(r"PQ(?P<m>\d+)", "PQ64", True, None, _check_pq),
    "hnsw": IndexType(
        r"HNSW(?P<M>\d+)", "HNSW32", False, "efSearch", _check_positive("M"), shard="replicate"
    ),
    "sq8": IndexType(r"SQ8", "SQ8", True, None, _no_check),
}


def parse_spec(spec: str, dim: int) -> tuple[str, re.Match]:
    """Return `(family, match)` for an index spec, or raise `ValueError` listing valid forms."""
    spec = spec.strip()
    for family, index_type in INDEX_TYPES.items():
        match = re.fullmatch(index_type.pattern, spec)
        if match:
            index_type.check(match, dim)
            return family, match
    valid = ", ".join(t.example for t in INDEX_TYPES.values())
    raise ValueError(f"unknown index spec {spec!r}; valid forms (n, m, M integers): {valid}")


def index_type(spec: str, dim: int) -> IndexType:
    """The registry entry that `spec` belongs to (validated against `dim`)."""
    return INDEX_TYPES[parse_spec(spec, dim)[0]]


def faiss_read_flags(spec: str, dim: int, *, mmap: bool = True) -> int:
    """The `faiss.read_index` flags for a saved index of `spec`: memory-mapped and read-only
    when `mmap`, else 0 (read into memory, writable).

    FAISS 1.15 maps IVF inverted lists with `IO_FLAG_MMAP` and flat codes / HNSW storage with
    `IO_FLAG_MMAP_IFC`; it rejects both at once on an IVF file, so the family decides.
    """
    if not mmap:
        return 0
    kind = index_type(spec, dim).mmap
    flag = faiss.IO_FLAG_MMAP if kind == "inverted_lists" else faiss.IO_FLAG_MMAP_IFC
    return flag | faiss.IO_FLAG_READ_ONLY


def check_metric(metric: str) -> None:
    """Raise `ValueError` naming the valid metrics when `metric` is not one of them."""
    if metric not in _FAISS_METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(_FAISS_METRICS)}")


def build_faiss_index(spec: str, dim: int, metric: Metric = "ip") -> faiss.Index:
    """An empty (untrained) FAISS index of the given spec over `dim`-dimensional vectors.

    `metric="ip"` ranks by inner product (higher first), `"l2"` by squared distance (lower
    first). PQ codes use 8 bits per sub-quantizer, so `PQ{m}` stores m bytes per vector.
    """
    check_metric(metric)
    parse_spec(spec, dim)
    index = faiss.index_factory(dim, spec.strip(), _FAISS_METRICS[metric])
    # The factory turns on polysemous training for PQ codes: a simulated-annealing pass that
    # only serves Hamming-filtered search (unused here) and dominates training time (~100x).
    inner = faiss.downcast_index(faiss.try_extract_index_ivf(index) or index)
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = False
    return index


def set_search_params(
    index: faiss.Index, *, nprobe: int | None = None, ef_search: int | None = None
) -> None:
    """Set the search-time knob of an IVF (`nprobe`) or HNSW (`efSearch`) index in place.

    Other index types have no such knob and are left unchanged.
    """
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and nprobe is not None:
        ivf.nprobe = int(nprobe)
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None and ef_search is not None:
        hnsw.efSearch = int(ef_search)


def _as_float32_tensor(array: np.ndarray) -> torch.Tensor:
    """(N, d) array (a read-only memmap slice too) → float32 tensor; never written to."""
    array = np.ascontiguousarray(array)
    with warnings.catch_warnings():  # torch warns on read-only arrays; nothing writes to this one
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    # torch widens float16 with SIMD; numpy's astype is ~5x slower on this CPU
    return tensor.float()


def exact_search(
    queries: np.ndarray | torch.Tensor,
    vectors: np.ndarray,
    k: int,
    metric: Metric = "ip",
    *,
    chunk_rows: int = 65536,
    exclude: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k of every query over all rows of `vectors`, in bounded memory.

    queries: (Q, d) float; vectors: (N, d) float16/float32 array or memmap, read `chunk_rows`
    rows at a time (peak extra memory ≈ one float32 chunk, plus Q × chunk_rows × 4 bytes for a
    chunk that holds excluded rows).
    exclude: optional (N,) bool mask of rows never to return (e.g. removed passages).
    Returns `(scores, ids)`, both (Q, k'): k' = min(k, number of eligible rows); ids are
    row numbers (int64). For "ip" scores are inner products, best (largest) first; for "l2"
    they are squared Euclidean distances, best (smallest) first, as FAISS reports them.
    """
    check_metric(metric)
    q = (
        queries.detach().float().cpu()
        if isinstance(queries, torch.Tensor)
        else _as_float32_tensor(queries)
    )
    if q.ndim != 2 or vectors.ndim != 2 or q.shape[1] != vectors.shape[1]:
        raise ValueError(
            f"queries {tuple(q.shape)} and vectors {tuple(vectors.shape)} must be (Q, d) and (N, d)"
        )
    n_rows = vectors.shape[0]
    n_eligible = n_rows if exclude is None else int(n_rows - np.count_nonzero(exclude))
    k = min(int(k), n_eligible)
    best_scores = torch.full((q.shape[0], k), -torch.inf)
    best_ids = torch.full((q.shape[0], k), -1, dtype=torch.int64)
    q_sq = (q * q).sum(dim=1, keepdim=True) if metric == "l2" else None
    q_np = q.contiguous().numpy()
    faiss_metric = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    for start in range(0, n_rows, chunk_rows):
        if k == 0:
            break
        block = _as_float32_tensor(vectors[start : start + chunk_rows])  # (C, d)
        chunk_k = min(k, block.shape[0])
        excluded = None
        if exclude is not None:
            excluded = torch.from_numpy(np.asarray(exclude[start : start + chunk_rows], dtype=bool))
        if excluded is None or not bool(excluded.any()):
            # FAISS's blocked GEMM + heap selection beats matmul + topk here (bench/index_exact_search.py:
            # ~1.7x at 1M x 384, 1000 queries) and needs no (Q, C) score matrix
            distances, top_idx_np = faiss.knn(q_np, block.numpy(), chunk_k, metric=faiss_metric)
            top_scores = torch.from_numpy(distances if metric == "ip" else -distances)
            top_idx = torch.from_numpy(top_idx_np)
        else:
            scores = q @ block.T  # (Q, C)
            if metric == "l2":
                # -||q - v||² = 2 q·v - ||v||² - ||q||²: rank by the negated distance so that
                # one "largest first" top-k serves both metrics.
                scores = 2 * scores - (block * block).sum(dim=1) - q_sq
            scores.masked_fill_(excluded, -torch.inf)
            # unsorted: ordering inside a chunk is wasted work; the small merge below sorts
            top_scores, top_idx = scores.topk(chunk_k, dim=1, sorted=False)
        merged_scores = torch.cat([best_scores, top_scores], dim=1)
        merged_ids = torch.cat([best_ids, top_idx + start], dim=1)
        best_scores, order = merged_scores.topk(k, dim=1)
        best_ids = merged_ids.gather(1, order)
    scores_np = best_scores.numpy()
    if metric == "l2":
        scores_np = np.maximum(-scores_np, 0.0)  # rounding can make a distance slightly negative
    return scores_np.astype(np.float32), best_ids.numpy()
