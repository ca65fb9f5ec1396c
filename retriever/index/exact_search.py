"""Exact (brute-force) top-k search over vectors in cache-sized chunks of rows, so memory stays bounded whatever
N is and a float16 memory-mapped flat index needs no float32 copy.

Two paths, chosen at run time (`precision="auto"`, or forced): "fp32" widens each chunk to float32 by torch into
one reused buffer, searches it by `faiss.knn` and merges in FAISS heaps; "bf16" (the default only on CPUs that
multiply bfloat16 natively, AVX512-BF16 or AMX, and measured faster there) scores each chunk in bfloat16, keeps a
few more candidates than k, re-scores them exactly in float32 and proves, from a bound on the bfloat16 rounding,
that no other row can beat them (a query whose proof fails is searched again on the fp32 path), so both paths
return the same top-k. Figures: bench/index_exact_search.py, docs/results/indexes.md.
"""

from __future__ import annotations

import functools
import time
import warnings

import faiss
import numpy as np
import torch

from retriever.index.types import FAISS_METRICS, Metric, check_metric

# Rows widened to float32 at a time by `exact_search`: 48M floats (192 MB), 131,072 rows at d = 384. Each
# `faiss.knn` call starts its top-k heaps empty, so every chunk pays a burst of heap insertions before its threshold
# climbs: fewer, larger chunks pay less of it (bench/index_exact_search.py; docs/results/indexes.md). The buffer is the
# search's only extra memory.
EXACT_CHUNK_FLOATS = 48 << 20


def widen_into(buffer: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """Widen (C, d) float16/float32 rows into the first C rows of a reused (≥ C, d) float32
    buffer; returns that (C, d) float32 view as numpy. Reusing one buffer avoids a fresh
    allocation (page faults, zeroing) per chunk, which cost as much as the widening itself."""
    out = buffer[: len(rows)]
    out.copy_(_tensor(rows))  # torch widens float16 in parallel SIMD; numpy's astype is serial
    return out.numpy()


EXACT_PRECISIONS = ("auto", "fp32", "bf16")

# The bfloat16 path's candidates per query: k + max(2k, this), re-scored exactly in float32. More
# candidates lower the threshold τ below the k-th best score, so that the proof (below) holds for
# nearly every query; the re-scoring of 3k rows costs little beside the scan.
BF16_EXTRA_CANDIDATES = 64
_BF16_U = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits, round to nearest)


def bf16_score_ceiling(
    bf16_score: np.ndarray, query_error: np.ndarray, query_norm: np.ndarray, row_norm_max: float, dim: int
) -> np.ndarray:
    """The largest exact inner product q·v of a row v whose bfloat16 score is at most `bf16_score`.

    bf16_score, query_error, query_norm: (Q,) float64 — per query, the bfloat16 score bound τ,
    ‖q − q̂‖ and ‖q̂‖ (q̂: q rounded to bfloat16); row_norm_max ≥ max ‖v‖ over the rows scored.
    The score is q̂·v̂ (v̂: v rounded to bfloat16, |v_i − v̂_i| ≤ u|v_i|, u = 2⁻⁸) summed in float32
    and rounded once to bfloat16, so
        q·v − q̂·v̂ = (q − q̂)·v + q̂·(v − v̂)    ≤ ‖q − q̂‖‖v‖ + u‖q̂‖‖v‖      (Cauchy–Schwarz)
        float32 sum of the exact products     ≤ γ_d ‖q̂‖‖v̂‖ away,  γ_d = d·2⁻²⁴/(1 − d·2⁻²⁴)
        that sum s̃, rounded to bfloat16 ŝ ≤ τ  ⇒  s̃ ≤ τ + u|τ|/(1 − u)
    The factor 1.05 on the error covers the float32 norms' own rounding. It assumes what the
    kernels do (oneDNN, AVX512-BF16 `vdpbf16ps`, AMX): products accumulated in float32 and the sum
    rounded once; `tests/retriever/test_exact_search.py` checks it against float64 on this CPU's
    own kernels, and a query whose proof fails is searched again exactly, so a looser kernel costs
    speed, not results."""
    u = _BF16_U
    gamma = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    tau = np.asarray(bf16_score, dtype=np.float64)
    rounding = u * np.abs(tau) / (1 - u)
    inputs = row_norm_max * (
        np.asarray(query_error) + u * np.asarray(query_norm) + gamma * (1 + u) * np.asarray(query_norm)
    )
    return tau + 1.05 * (rounding + inputs)


@functools.lru_cache(maxsize=1)
def native_bf16_speedup() -> float:
    """float32 time / bfloat16 time of a (1000 × 384) · (384 × 4096) product, a quarter of the
    bfloat16 path's chunk, on this CPU (measured once per process); 0.0 where the CPU has
    neither AVX512-BF16 nor AMX (bfloat16 is emulated there, slower than float32: docs/results/speed.md)."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if not any(check() for check in checks if check is not None):
        return 0.0

    def best_time(dtype: torch.dtype) -> float:
        generator = torch.Generator().manual_seed(0)  # never the global RNG: runs would depend on this probe
        a = torch.randn(1000, 384, generator=generator).to(dtype)
        b = torch.randn(4096, 384, generator=generator).to(dtype)
        a @ b.T  # warm-up: kernel selection, packing
        times = []
        for _ in range(3):
            started = time.perf_counter()
            a @ b.T
            times.append(time.perf_counter() - started)
        return min(times)

    with torch.no_grad():
        return best_time(torch.float32) / best_time(torch.bfloat16)


# Below these sizes `auto` keeps the fp32 path even where bfloat16 is native: the bf16 path's fixed
# costs (its first chunk's top-k, the candidates' re-scoring, the proof) outweigh a short scan, and
# FAISS scans a few queries without BLAS (bench/index_exact_search.py times both paths).
BF16_MIN_ROWS = 1 << 17
BF16_MIN_QUERIES = 32


def resolve_exact_precision(
    precision: str, metric: str, *, n_rows: int | None = None, n_queries: int | None = None
) -> str:
    """The path `exact_search` takes: "bf16" or "fp32". "auto" is "bf16" for an inner-product search
    of at least `BF16_MIN_QUERIES` queries over at least `BF16_MIN_ROWS` rows (sizes not given count
    as large) where the CPU multiplies bfloat16 natively and that product is measured ≥ 1.5×
    float32's (`native_bf16_speedup`), else "fp32". A forced "bf16" runs anywhere (slowly where
    bfloat16 is emulated) and returns the same results; L2 search is always fp32."""
    if precision not in EXACT_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(EXACT_PRECISIONS)}")
    if metric != "ip":
        return "fp32"
    if precision == "auto":
        small = (n_rows is not None and n_rows < BF16_MIN_ROWS) or (
            n_queries is not None and n_queries < BF16_MIN_QUERIES
        )
        return "bf16" if not small and native_bf16_speedup() >= 1.5 else "fp32"
    return precision


def exact_search(
    queries: np.ndarray | torch.Tensor,
    vectors: np.ndarray,
    k: int,
    metric: Metric = "ip",
    *,
    chunk_rows: int | None = None,
    exclude: np.ndarray | None = None,
    precision: str = "auto",
    stats: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k of every query over all rows of `vectors`, in bounded memory.

    queries: (Q, d) float; vectors: (N, d) float16/float32 array or memmap, read `chunk_rows`
    rows at a time (default: `EXACT_CHUNK_FLOATS` / d, or `BF16_CHUNK_ROWS` on the bf16 path).
    exclude: optional (N,) bool mask of rows never to return (e.g. removed passages): a chunk
    where they are a quarter or less is searched whole with them masked, one with more is
    compacted to its live rows first.
    precision: "auto" (default), "fp32" or "bf16" (`resolve_exact_precision`; the module
    docstring describes both paths). On the fp32 path each chunk is widened into one reused
    float32 buffer (peak extra memory ≈ that buffer; no float32 copy of the store is ever made),
    searched by `faiss.knn` (blocked GEMM + heaps) and merged into FAISS heaps
    (`faiss.ResultHeap`). The bf16 path (inner product only) returns the same top-k, with
    float32 scores, in `best_first` order.
    stats: a dict to fill with what the search did: "path" ("fp32"/"bf16"), and on the bf16
    path "redone" (queries whose proof failed and were searched again on the fp32 path).
    Returns `(scores, ids)`, both (Q, k'): k' = min(k, number of eligible rows); ids are row
    numbers (int64). For "ip" scores are inner products, best (largest) first; for "l2" they
    are squared Euclidean distances, best (smallest) first, as FAISS reports them.
    """
    check_metric(metric)
    if isinstance(queries, torch.Tensor):
        queries = queries.detach().float().cpu().numpy()
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if q.ndim != 2 or vectors.ndim != 2 or q.shape[1] != vectors.shape[1]:
        raise ValueError(f"queries {tuple(q.shape)} and vectors {tuple(vectors.shape)} must be (Q, d) and (N, d)")
    path = resolve_exact_precision(precision, metric, n_rows=len(vectors), n_queries=len(q))
    stats = {} if stats is None else stats
    stats.update(path=path, redone=0)
    n_rows = len(vectors)
    n_eligible = n_rows if exclude is None else int(n_rows - np.count_nonzero(exclude))
    k = min(int(k), n_eligible)
    if k == 0 or len(q) == 0:
        return np.zeros((len(q), k), np.float32), np.zeros((len(q), k), np.int64)
    if path == "bf16":  # queries in blocks: the score matrix of a chunk is (block, C)
        parts = [
            _exact_search_bf16(
                q[i : i + _BF16_QUERIES], vectors, k, chunk_rows=chunk_rows, exclude=exclude, stats=stats
            )
            for i in range(0, len(q), _BF16_QUERIES)
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return _exact_search_fp32(q, vectors, k, metric, chunk_rows=chunk_rows, exclude=exclude)


def _live_chunks(
    vectors: np.ndarray, chunk_rows: int, exclude: np.ndarray | None, *, mask_up_to: float = 0.0, mask_at_most: int = -1
):
    """(start, live, rows, dead) for each chunk of `chunk_rows` rows holding a live row.

    A chunk with excluded rows is compacted to its live ones (`rows`, with `live` their chunk-relative
    numbers); but where they are at most `mask_up_to` of it (and at most `mask_at_most` rows unless
    that is -1), it comes whole (`live` None) with `dead` its (C,) bool mask of them, for the caller
    to mask their scores: copying a chunk to drop a few rows costs more than scoring them, when the
    queries are few. `live` and `dead` are None when the whole chunk is live."""
    for start in range(0, len(vectors), chunk_rows):
        block = vectors[start : start + chunk_rows]  # (C, d)
        if not isinstance(block, np.ndarray):  # `rerank.StoredVectors`: a view of one file, or rows of two read
            block = np.asarray(block)
        live = dead = None
        if exclude is not None:
            excluded = np.asarray(exclude[start : start + len(block)], dtype=bool)
            n_dead = int(np.count_nonzero(excluded))
            if 0 < n_dead <= mask_up_to * len(block) and (mask_at_most < 0 or n_dead <= mask_at_most):
                dead = excluded
            elif n_dead:
                live = np.flatnonzero(~excluded)  # chunk row of each live row
                block = block[live]
        if len(block):
            yield start, live, block, dead


def _exact_search_fp32(
    q: np.ndarray, vectors: np.ndarray, k: int, metric: str, *, chunk_rows: int | None, exclude: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The fp32 path of `exact_search` (k ≥ 1, at most the eligible rows)."""
    n_rows, dim = vectors.shape
    chunk_rows = int(chunk_rows or max(1024, EXACT_CHUNK_FLOATS // dim))
    buffer = None if vectors.dtype == np.float32 else torch.empty((min(chunk_rows, n_rows), dim))
    heap = faiss.ResultHeap(len(q), k, keep_max=metric == "ip")
    worst = -np.inf if metric == "ip" else np.inf
    # A chunk with a few removed rows is searched whole (gathering its live rows would copy it). In
    # the widened float16 chunk they are set to NaN: a NaN score never enters FAISS's heaps or
    # reservoirs (every comparison with it is false; tests/retriever/test_exact_search.py checks this
    # FAISS behaviour), so they cost one dot product each. A float32 store is searched in place, for
    # that many more results, the removed ones dropped. FAISS scores each (query, row) pair the same
    # way whatever the chunk and its NaN rows (fewer than 20 queries: one dot product per pair; more:
    # a GEMM whose columns are independent), so scores do not depend on how the rows are split
    # (shards, segments, a compaction).
    mask_at_most = -1 if buffer is not None else max(k, 256)
    chunks = _live_chunks(vectors, chunk_rows, exclude, mask_up_to=0.25, mask_at_most=mask_at_most)
    for start, live, block, dead in chunks:
        dead_rows = None  # the rows to drop from FAISS's results (a float32 store only)
        if buffer is not None:
            block = widen_into(buffer, block)
            if dead is not None:
                block[dead] = np.nan
        else:
            block = np.ascontiguousarray(block)
            dead_rows = None if dead is None else np.flatnonzero(dead)
        extra = 0 if dead_rows is None else len(dead_rows)
        distances, ids = faiss.knn(q, block, min(k + extra, len(block)), metric=FAISS_METRICS[metric])
        if dead_rows is not None:  # never enter the heap ahead of a live row: each chunk gives ≥ k live ones
            distances[np.isin(ids, dead_rows)] = worst
        missing = ids < 0  # a chunk with fewer than k live rows (the rest NaN)
        ids = (live[ids] if live is not None else ids) + start
        if missing.any():
            ids[missing], distances[missing] = -1, worst
        heap.add_result(distances, ids)
    heap.finalize()  # sorted, best first
    scores = heap.D if metric == "ip" else np.maximum(heap.D, 0.0)  # rounding: slightly negative
    return scores.astype(np.float32), heap.I


# Rows scored at a time on the bf16 path: its (Q, C) bfloat16 score matrix is what the chunk
# costs in memory (1000 queries × 16,384 rows: 32 MB). Scores are screened in blocks of
# `_BF16_BLOCK` columns: a block whose maximum does not beat a query's threshold is let go whole.
BF16_CHUNK_ROWS = 16384
_BF16_BLOCK = 64
_BF16_QUERIES = 2048  # queries per scan: a chunk's scores stay ≤ 64 MB


def _exact_search_bf16(
    q: np.ndarray, vectors: np.ndarray, k: int, *, chunk_rows: int | None, exclude: np.ndarray | None, stats: dict
) -> tuple[np.ndarray, np.ndarray]:
    """The bf16 path of `exact_search` (inner product; k ≥ 1, at most the eligible rows).

    1. Every live row is scored against every query in bfloat16, chunk by chunk; each query keeps
       its best k' = k + max(2k, `BF16_EXTRA_CANDIDATES`) rows by that score. Once it holds k',
       its threshold τ is the lowest of their scores (it only rises), and a chunk's row is looked
       at only where its score beats τ (blocks of columns whose maximum does not are skipped):
       every row let go scores ≤ the final τ in bfloat16.
    2. The k' candidates are re-scored exactly in float32 from the stored rows.
    3. A row let go has exact score ≤ `bf16_score_ceiling(τ)`. Where that is below
       the k-th best re-scored score, no row let go can enter the top k (nor tie with it): the
       answer is the candidates' best k. The other queries (near-ties beyond k' rows, copies of
       a row) are searched again on the fp32 path.
    """
    n_rows, dim = vectors.shape
    n_q = len(q)
    chunk_rows = int(chunk_rows or BF16_CHUNK_ROWS)
    n_eligible = n_rows if exclude is None else int(n_rows - np.count_nonzero(exclude))
    wide = min(n_eligible, k + max(2 * k, BF16_EXTRA_CANDIDATES))
    q_t = torch.from_numpy(q)
    q_b = q_t.to(torch.bfloat16)
    candidates = _Candidates(n_q, wide)
    padded = -(-min(chunk_rows, n_rows) // _BF16_BLOCK) * _BF16_BLOCK
    rows_b = torch.zeros((padded, dim), dtype=torch.bfloat16)  # reused; rows past the chunk stay 0
    scores = torch.empty((n_q, padded), dtype=torch.bfloat16)
    max_norm = 0.0
    # copying a chunk to drop its removed rows costs more than scoring them, unless many queries share the
    # copy (for few queries each score row is masked instead)
    mask_up_to = 0.25 if n_q < 256 else 0.0
    for start, live, block, dead in _live_chunks(vectors, chunk_rows, exclude, mask_up_to=mask_up_to):
        n_block = len(block)
        chunk_scores, norm_max = _score_chunk(q_b, block, dead, rows_b, scores)
        max_norm = max(max_norm, norm_max)
        width = chunk_scores.shape[1]
        # the stored row of each column: start + column, or through the chunk's live rows
        row_of = (
            torch.arange(start, start + width)
            if live is None
            else torch.cat([torch.from_numpy(live + start), torch.full((width - n_block,), -1)])
        )
        if candidates.threshold is None:  # still filling: the chunk's best
            top, at = chunk_scores[:, :n_block].topk(min(wide, n_block), dim=1)
            candidates.add(top, row_of[at])
            continue
        # only rows above τ (from the last merge; a lower, older τ only lets more rows in) can enter
        above = _rows_above(chunk_scores, candidates.threshold, row_of)
        if above is not None:
            candidates.add(*above)
    candidates.merge()
    cand_scores, cand_rows = candidates.scores, candidates.rows
    # every row let go scores ≤ τ in bfloat16 (none is when all eligible rows are candidates)
    ceiling = cand_scores[:, -1].double().numpy() if n_eligible > wide else np.full(n_q, -np.inf)
    rows_np = cand_rows.numpy()
    exact = _rescore(q_t, vectors, rows_np)
    scores, rows = best_first(exact, rows_np, k)
    # the proof: nothing let go can reach the k-th best exact score
    bound = np.full(n_q, -np.inf)
    if n_eligible > wide:
        q_rounded = q_b.double().numpy()
        bound = bf16_score_ceiling(
            ceiling,
            np.linalg.norm(q.astype(np.float64) - q_rounded, axis=1),
            np.linalg.norm(q_rounded, axis=1),
            max_norm,
            dim,
        )
    proven = bound < scores[:, k - 1]
    if not proven.all():
        redo = np.flatnonzero(~proven)
        stats["redone"] += len(redo)
        scores[redo], rows[redo] = _exact_search_fp32(q[redo], vectors, k, "ip", chunk_rows=None, exclude=exclude)
        scores[redo], rows[redo] = best_first(scores[redo], rows[redo], k)
    return scores.astype(np.float32), rows


def _score_chunk(
    q_b: torch.Tensor, block: np.ndarray, dead: np.ndarray | None, rows_b: torch.Tensor, scores: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Score one chunk of rows in bfloat16: → ((Q, width) scores, a bound ≥ the largest ‖v‖ of its rows).

    q_b: (Q, d) bfloat16 queries; block: (C, d) stored rows; dead: (C,) bool, the rows to mask (or
    None); rows_b (≥ width, d) and scores (Q, ≥ width): reused buffers. width is C rounded up to
    `_BF16_BLOCK`; the padding columns and the dead rows score -inf, so they never win."""
    n_block = len(block)
    width = -(-n_block // _BF16_BLOCK) * _BF16_BLOCK
    rows_b[:n_block].copy_(_tensor(block))
    # ‖v‖ ≤ ‖v̂‖/(1 − u): read from the bfloat16 copy, summed in float32 (no float32 copy of the chunk)
    norms = torch.linalg.vector_norm(rows_b[:n_block], dim=1, dtype=torch.float32)
    chunk_scores = scores[:, :width]
    torch.mm(q_b, rows_b[:width].T, out=chunk_scores)  # (Q, width) bfloat16
    if n_block < width:
        rows_b[n_block:width].zero_()
        chunk_scores[:, n_block:] = -float("inf")
    if dead is not None:
        chunk_scores[:, :n_block].masked_fill_(torch.from_numpy(dead), -float("inf"))
    return chunk_scores, float(norms.max()) / (1 - _BF16_U)


def _rows_above(
    chunk_scores: torch.Tensor, threshold: torch.Tensor, row_of: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows of a chunk that score above each query's threshold τ.

    chunk_scores: (Q, C) bfloat16, C a multiple of `_BF16_BLOCK`; threshold: (Q,) bfloat16; row_of:
    (C,) the stored row of each column. Only blocks of columns whose maximum beats τ are looked at.
    → (scores, rows), both (Q, m) with m the most rows any query has above τ (-inf / -1 pad the
    others), or None when no row is above."""
    n_q = len(chunk_scores)
    grouped = chunk_scores.view(n_q, -1, _BF16_BLOCK)
    if bool((threshold >= 0).all()):
        # non-negative bfloat16 values order as their bits do, and torch's int16 maximum is much faster than
        # its bfloat16 one; a negative score (sign bit set) is a negative int16, below τ
        beats = grouped.view(torch.int16).amax(dim=2) > threshold.view(torch.int16)[:, None]
    else:
        beats = grouped.amax(dim=2) > threshold[:, None]
    hit_q, hit_b = beats.nonzero(as_tuple=True)
    if len(hit_q) == 0:
        return None
    values = grouped[hit_q, hit_b]  # (H, block)
    at_hit, at_lane = (values > threshold[hit_q, None]).nonzero(as_tuple=True)  # the rows themselves
    query = hit_q[at_hit]
    counts = torch.bincount(query, minlength=n_q)
    slot = torch.arange(len(query)) - (torch.cumsum(counts, 0) - counts)[query]
    scores = torch.full((n_q, int(counts.max())), -float("inf"), dtype=torch.bfloat16)
    rows = torch.full((n_q, int(counts.max())), -1, dtype=torch.int64)
    scores[query, slot] = values[at_hit, at_lane]
    rows[query, slot] = row_of[hit_b[at_hit] * _BF16_BLOCK + at_lane]
    return scores, rows


def _rescore(q: torch.Tensor, vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Exact float32 inner products of each query (Q, d) with its candidate rows (Q, k') of the
    store, read 64 queries at a time (each batch's rows once, in order: a memmap reads forward).
    → (Q, k') float32."""
    exact = torch.empty(rows.shape, dtype=torch.float32)
    for i in range(0, len(rows), 64):
        unique, at = np.unique(rows[i : i + 64], return_inverse=True)
        stored = _tensor(vectors[unique]).float()[torch.from_numpy(at.reshape(-1))]
        stored = stored.view(*at.reshape(len(rows[i : i + 64]), -1).shape, vectors.shape[1])  # (b, k', d)
        exact[i : i + 64] = torch.bmm(stored, q[i : i + 64, :, None])[..., 0]
    return exact.numpy()


class _Candidates:
    """Each query's best `wide` rows by bfloat16 score, best first (`scores`, `rows`: (Q, ≤ wide)).

    New rows wait in `pending` and are merged (one top-k) once they add up to `wide` columns: a
    merge per chunk cost more than the scan's screening. `threshold` (τ, (Q,)) is the
    `wide`-th best score at the last merge, None until each query holds `wide` rows."""

    def __init__(self, n_queries: int, wide: int):
        self.wide = wide
        self.scores = torch.zeros((n_queries, 0), dtype=torch.bfloat16)
        self.rows = torch.zeros((n_queries, 0), dtype=torch.int64)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.pending_columns = 0
        self.threshold: torch.Tensor | None = None

    def add(self, scores: torch.Tensor, rows: torch.Tensor) -> None:
        """scores: (Q, m) bfloat16 with rows: (Q, m) their row numbers (-1 with score -inf: none)."""
        self.pending.append((scores, rows))
        self.pending_columns += scores.shape[1]
        if self.threshold is None or self.pending_columns >= self.wide:
            self.merge()

    def merge(self) -> None:
        if not self.pending:
            return
        scores = torch.cat([self.scores, *(s for s, _ in self.pending)], dim=1)
        rows = torch.cat([self.rows, *(r for _, r in self.pending)], dim=1)
        self.scores, at = scores.topk(min(self.wide, scores.shape[1]), dim=1)  # sorted: τ is the last
        self.rows = rows.gather(1, at)
        self.pending, self.pending_columns = [], 0
        if self.scores.shape[1] >= self.wide:
            self.threshold = self.scores[:, -1]


def _tensor(rows: np.ndarray) -> torch.Tensor:
    """(C, d) rows (a read-only memmap slice too) as a tensor sharing memory where it can; never written to."""
    rows = np.ascontiguousarray(rows)
    with warnings.catch_warnings():  # read-only memmap rows: torch warns, nothing writes to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(rows)


def best_first(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best k of candidate lists, in one canonical order: (Q, C) scores and positions →
    (Q, min(k, C)) each, highest score first, ties to the lower position, missing (-1) last.

    The one order every search path uses, so that a sharded search, whose candidates come
    from several ranks, returns exactly what one process returns."""
    missing = rows < 0
    order = np.lexsort((np.where(missing, np.iinfo(np.int64).max, rows), np.where(missing, np.inf, -scores)), axis=-1)[
        :, :k
    ]
    return np.take_along_axis(scores, order, -1), np.take_along_axis(rows, order, -1)


def best_k(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """`best_first` of search results: (Q, C) scores and positions (-1: missing) → (Q, k) float32 scores and
    int64 positions, a missing one scored -inf, padded with -1 / -inf where C < k."""
    scores, rows = best_first(np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows.astype(np.int64), k)
    if rows.shape[1] < k:
        pad = ((0, 0), (0, k - rows.shape[1]))
        rows, scores = np.pad(rows, pad, constant_values=-1), np.pad(scores, pad, constant_values=-np.inf)
    return scores, rows
