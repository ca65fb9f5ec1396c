"""Index types: a registry of FAISS `index_factory` specs, and chunked exact search in torch.

Two things live here because every vector store in atlas needs them (the passage index,
the kNN-LM datastore):

* `build_faiss_index(spec, dim, metric)` turns a spec from the registry `INDEX_TYPES`
  (`Flat`, `IVF{n},Flat`, `IVF{n},PQ{m}`, `PQ{m}`, their OPQ and 4-bit fast-scan forms,
  `HNSW{M}`, `SQ8`) into an untrained `faiss.Index`; an unknown spec raises `ValueError`
  listing the valid forms.
* `faiss_read_flags(spec, dim)` gives the `faiss.read_index` flags that memory-map a saved
  index of that family (FAISS supports different flags per family, and rejects a mix);
* `exact_search(queries, vectors, k)` is brute-force top-k over the vectors in cache-sized
  chunks of rows (each widened to float32 by torch into one reused buffer, searched by
  `faiss.knn`, merged in FAISS heaps), so memory stays bounded whatever N is and a float16
  memory-mapped flat index needs no float32 copy. Figures: bench/index_exact_search.py.
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
    "codes" (flat-code indexes and HNSW: `IO_FLAG_MMAP_IFC` maps the code array / storage) or
    "none" (fast-scan: FAISS reads its blocked codes into memory whatever the flags).
    `shard` says how a sharded index (retriever/sharded.py) splits it over ranks: "rows"
    (each rank keeps a contiguous range of positions; exact) or "replicate" (HNSW: a graph
    restricted to some ids is searched differently, so each rank searches the whole of it).
    """

    pattern: str
    example: str
    needs_training: bool
    search_param: str | None
    check: Callable[[re.Match, int], None]
    mmap: Literal["inverted_lists", "codes", "none"] = "codes"
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


def _check_opq(match: re.Match, dim: int) -> None:
    """OPQ{o} rotates the vectors for PQ{m}: FAISS needs o = m (one rotation block per code byte)."""
    if "n" in match.re.groupindex:  # the IVF form
        _check_positive("n")(match, dim)
    _check_pq(match, dim)
    if int(match.group("o")) != int(match.group("m")):
        raise ValueError(
            f"index spec {match.string!r}: OPQ{match.group('o')} must match PQ{match.group('m')} "
            "(e.g. OPQ64,PQ64)"
        )


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
    # OPQ: a learned rotation before PQ (lower quantisation error on real embeddings). The
    # flat-code form is not split by rows (its codes sit behind the rotation); each rank
    # searches all of it. The IVF form splits like IVF-PQ.
    "opq_pq": IndexType(r"OPQ(?P<o>\d+),PQ(?P<m>\d+)", "OPQ64,PQ64", True, None, _check_opq,
                        shard="replicate"),
    "opq_ivf_pq": IndexType(
        r"OPQ(?P<o>\d+),IVF(?P<n>\d+),PQ(?P<m>\d+)", "OPQ64,IVF1024,PQ64", True, "nprobe", _check_opq,
        mmap="inverted_lists",
    ),
    # 4-bit PQ codes scanned with SIMD look-up tables held in registers ("fast scan"): m/2 bytes
    # a vector and several times the speed of 8-bit PQ, at a coarser approximation that an
    # exact re-rank (`rerank`) corrects. FAISS packs the codes in blocks of 32 vectors, so a
    # rank cannot take its rows out of the file: sharded ranks each search the whole index.
    # The codes are read into RAM (that is what a compressed index is for).
    "pq_fastscan": IndexType(r"PQ(?P<m>\d+)x4fs", "PQ96x4fs", True, None, _check_pq, mmap="none",
                             shard="replicate"),
    "ivf_pq_fastscan": IndexType(
        r"IVF(?P<n>\d+),PQ(?P<m>\d+)x4fs", "IVF1024,PQ96x4fs", True, "nprobe", _check_ivf_pq,
        mmap="none", shard="replicate",
    ),
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
    kind = index_type(spec, dim).mmap
    if not mmap or kind == "none":
        return 0
    flag = faiss.IO_FLAG_MMAP if kind == "inverted_lists" else faiss.IO_FLAG_MMAP_IFC
    return flag | faiss.IO_FLAG_READ_ONLY


def check_metric(metric: str) -> None:
    """Raise `ValueError` naming the valid metrics when `metric` is not one of them."""
    if metric not in _FAISS_METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(_FAISS_METRICS)}")


def build_faiss_index(spec: str, dim: int, metric: Metric = "ip") -> faiss.Index:
    """An empty (untrained) FAISS index of the given spec over `dim`-dimensional vectors.

    `metric="ip"` ranks by inner product (higher first), `"l2"` by squared distance (lower
    first). PQ codes use 8 bits per sub-quantizer, so `PQ{m}` stores m bytes per vector;
    `PQ{m}x4fs` 4 bits (m/2 bytes, fast-scan).
    """
    check_metric(metric)
    parse_spec(spec, dim)
    index = faiss.index_factory(dim, spec.strip(), _FAISS_METRICS[metric])
    # The factory turns on polysemous training for PQ codes: a simulated-annealing pass that
    # only serves Hamming-filtered search (unused here) and dominates training time (~100x).
    # (downcast: `try_extract_index_ivf` returns the IndexIVF base class, which has no such flag)
    inner = faiss.downcast_index(faiss.try_extract_index_ivf(index) or search_parameters_target(index))
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = False
    return index


def search_parameters_target(index: faiss.Index) -> faiss.Index:
    """The index that search parameters reach: the inner index of an `IndexPreTransform`
    (OPQ: FAISS passes the parameters through the rotation), else the index itself; downcast."""
    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        return faiss.downcast_index(index.index)
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


# Rows widened to float32 at a time by `exact_search`: 48M floats (192 MB) — 131,072 rows at
# d = 384, 65,536 at d = 768. Each `faiss.knn` call starts its top-k heaps empty, so every chunk
# pays a burst of heap insertions before its threshold climbs: fewer chunks, less of that.
# Measured on 2 idle cores (1M × 384 / 768, 1000 queries, k = 100; time vs `IndexFlatIP` on
# float32): chunks of 12M floats 1.15× / 1.16×, 24M 1.08× / 1.09×, 48M 1.03× / 1.04×, 96M
# 1.01× / 1.03×; widening is 2-3% of it. The buffer is the search's only extra memory.
EXACT_CHUNK_FLOATS = 48 << 20


def _as_float32_tensor(array: np.ndarray) -> torch.Tensor:
    """(N, d) array (a read-only memmap slice too) → float32 tensor; never written to."""
    array = np.ascontiguousarray(array)
    with warnings.catch_warnings():  # torch warns on read-only arrays; nothing writes to this one
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
    # torch widens float16 with SIMD; numpy's astype is ~5x slower on this CPU
    return tensor.float()


def widen_into(buffer: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """Widen (C, d) float16/float32 rows into the first C rows of a reused (≥ C, d) float32
    buffer; returns that (C, d) float32 view as numpy. Reusing one buffer avoids a fresh
    allocation (page faults, zeroing) per chunk, which cost as much as the widening itself."""
    rows = np.ascontiguousarray(rows)
    with warnings.catch_warnings():  # read-only memmap rows: torch warns, nothing writes to them
        warnings.simplefilter("ignore", UserWarning)
        source = torch.from_numpy(rows)
    out = buffer[: len(rows)]
    out.copy_(source)  # torch widens float16 with SIMD, in parallel; numpy's astype is ~5x slower
    return out.numpy()


def exact_search(
    queries: np.ndarray | torch.Tensor,
    vectors: np.ndarray,
    k: int,
    metric: Metric = "ip",
    *,
    chunk_rows: int | None = None,
    exclude: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k of every query over all rows of `vectors`, in bounded memory.

    queries: (Q, d) float; vectors: (N, d) float16/float32 array or memmap, read `chunk_rows`
    rows at a time (default: `EXACT_CHUNK_FLOATS` / d) and widened into one reused float32
    buffer (peak extra memory ≈ that buffer; no float32 copy of the store is ever made). Each
    chunk is searched by `faiss.knn` (blocked GEMM + heaps) and merged into FAISS heaps
    (`faiss.ResultHeap`). exclude: optional (N,) bool mask of rows never to return (e.g.
    removed passages): a chunk holding some is compacted to its live rows before widening, so
    the masked path costs the same as the plain one.
    Returns `(scores, ids)`, both (Q, k'): k' = min(k, number of eligible rows); ids are row
    numbers (int64). For "ip" scores are inner products, best (largest) first; for "l2" they
    are squared Euclidean distances, best (smallest) first, as FAISS reports them.
    """
    check_metric(metric)
    if isinstance(queries, torch.Tensor):
        queries = queries.detach().float().cpu().numpy()
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if q.ndim != 2 or vectors.ndim != 2 or q.shape[1] != vectors.shape[1]:
        raise ValueError(
            f"queries {tuple(q.shape)} and vectors {tuple(vectors.shape)} must be (Q, d) and (N, d)"
        )
    n_rows, dim = vectors.shape
    n_eligible = n_rows if exclude is None else int(n_rows - np.count_nonzero(exclude))
    k = min(int(k), n_eligible)
    if k == 0 or len(q) == 0:
        return np.zeros((len(q), k), np.float32), np.zeros((len(q), k), np.int64)
    chunk_rows = int(chunk_rows or max(1024, EXACT_CHUNK_FLOATS // dim))
    buffer = None if vectors.dtype == np.float32 else torch.empty((min(chunk_rows, n_rows), dim))
    faiss_metric = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    heap = faiss.ResultHeap(len(q), k, keep_max=metric == "ip")
    for start in range(0, n_rows, chunk_rows):
        block = vectors[start : start + chunk_rows]  # (C, d)
        live = None
        if exclude is not None:
            keep = ~np.asarray(exclude[start : start + len(block)], dtype=bool)
            if not keep.all():
                live = np.flatnonzero(keep)  # chunk row of each live row
                block = block[live]
        if len(block) == 0:
            continue
        block = widen_into(buffer, block) if buffer is not None else np.ascontiguousarray(block)
        distances, ids = faiss.knn(q, block, min(k, len(block)), metric=faiss_metric)
        ids = (live[ids] if live is not None else ids) + start
        heap.add_result(distances, ids)
    heap.finalize()  # sorted, best first
    scores = heap.D if metric == "ip" else np.maximum(heap.D, 0.0)  # rounding: slightly negative
    return scores.astype(np.float32), heap.I


def best_first(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k of candidate lists, in one canonical order: (Q, C) scores and positions →
    (Q, min(k, C)) each, highest score first, ties to the lower position, missing (-1) last.

    The one order every search path uses, so that a sharded search, whose candidates come
    from several ranks, returns exactly what one process returns."""
    missing = rows < 0
    order = np.lexsort((np.where(missing, np.iinfo(np.int64).max, rows),
                        np.where(missing, np.inf, -scores)), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, -1), np.take_along_axis(rows, order, -1)
