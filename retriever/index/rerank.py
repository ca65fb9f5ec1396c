"""Exact re-ranking of a compressed index's candidates from memory-mapped float16 vectors.

A compressed index (PQ, OPQ + PQ, IVF-PQ) keeps only its codes in RAM and ranks by
approximate scores. With `exact_rerank = k'` the index proposes k' candidates per query and their
exact inner products are recomputed from the float16 vectors files (`vectors.gN.npy`, one per
part: `StoredVectors`), which stay memory-mapped on disk: only the candidates' rows, and short gaps between near ones,
are read (`pread`, a batch of queries at a time, into one buffer; see `gather_rows`), and
pages mapped by other reads are dropped from this process after each batch
(`madvise(MADV_DONTNEED)`; they stay in the page cache, shared and reclaimable), so resident
memory stays ≈ the codes plus one batch whatever the number of queries. The top k by exact
score are returned: when the k true neighbours are among the k' candidates the result is
the exact search's (bench/index_compressed.py measures how often on real embeddings).
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import torch

from retriever.index.exact_search import best_first, widen_into

# Candidate vectors widened at a time (float32 bytes): bounds the re-rank's extra memory
# (plus the file pages of those rows, released after each batch).
RERANK_BATCH_BYTES = 16 << 20
# Candidate rows at most this far apart in the vectors file are read in one system call with
# the rows between them (a `pread` costs about what copying 16 KB from the page cache does);
# one read is at most MAX_READ_BYTES (the scratch buffer's size).
COALESCE_GAP_BYTES = 16 << 10
MAX_READ_BYTES = 1 << 20


class StoredVectors:
    """An index's float16 vectors, (N, d), kept in consecutive files read as one array.

    The rows as built (or as last compacted) are one file, and each segment an edit appended since has
    its own (`retriever.index.update`): an edit writes its new rows only, never a copy of the others.
    `windows` are (whole-file memmap, first row, end row) per part, in position order. Offers what the
    searches read: `len`, `shape`, `dtype`, a slice (another `StoredVectors` over the same files: nothing
    is read), rows by position (`gather` for sorted unique rows, read with `pread` as `gather_rows` reads;
    `store[rows]` for any), and `np.asarray(store)` (a view of the mapping where the rows are in one file,
    else a copy of them)."""

    ndim = 2

    def __init__(self, windows: list[tuple[np.ndarray, int, int]], dim: int):
        self.windows = [(f, int(lo), int(hi)) for f, lo, hi in windows if hi > lo]
        self.dtype = self.windows[0][0].dtype if self.windows else np.dtype(np.float16)
        self.starts = np.cumsum([0] + [hi - lo for _, lo, hi in self.windows]).astype(np.int64)  # (parts + 1,)
        self.shape = (int(self.starts[-1]), int(dim))

    @classmethod
    def of(cls, files: list[np.ndarray], dim: int) -> StoredVectors:
        """The rows of each (n_i, d) memory-mapped file in turn."""
        return cls([(f, 0, len(f)) for f in files], dim)

    @property
    def files(self) -> list[np.ndarray]:
        """The memory-mapped files the rows are in (each once)."""
        return list({id(f): f for f, _, _ in self.windows}.values())

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("stored vectors are sliced with step 1")
            windows = []
            for (f, lo, hi), first in zip(self.windows, self.starts.tolist()):
                a, b = max(start - first, 0), min(stop - first, hi - lo)
                if a < b:
                    windows.append((f, lo + a, lo + b))
            return StoredVectors(windows, self.shape[1])
        if np.asarray(key).dtype == bool:  # a mask would be read as rows 0 and 1
            raise IndexError("stored vectors are read by row positions, not a boolean mask")
        rows = np.asarray(key, dtype=np.int64)
        if rows.ndim != 1:
            raise IndexError("stored vectors are read by a slice or a 1-d array of row positions")
        unique, inverse = np.unique(rows, return_inverse=True)
        return self.gather(unique)[inverse]

    def gather(self, rows: np.ndarray, **read_options) -> np.ndarray:
        """The rows at sorted unique positions `rows`, (len(rows), d), each file read with `gather_rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows[0] < 0 or rows[-1] >= len(self)):
            raise IndexError(f"row positions must be in [0, {len(self)}), got {rows[0]}..{rows[-1]}")
        out = np.empty((len(rows), self.shape[1]), dtype=self.dtype)
        bounds = np.searchsorted(rows, self.starts).tolist()  # where each part's rows begin in `rows`
        for (f, lo, _), first, a, b in zip(self.windows, self.starts.tolist(), bounds[:-1], bounds[1:]):
            if a < b:
                out[a:b] = gather_rows(f, rows[a:b] - first + lo, **read_options)
        return out

    def __array__(self, dtype=None, copy=None):
        parts = [f[lo:hi] for f, lo, hi in self.windows]
        if len(parts) == 1:  # the rows of one file: a view of its mapping, nothing read here
            out = parts[0].view(np.ndarray)
        else:
            out = np.concatenate(parts) if parts else np.empty(self.shape, dtype=self.dtype)
        return out if dtype is None else out.astype(dtype)


def _mappings(vectors) -> list:
    """The `mmap.mmap` objects behind a memory-mapped array or `StoredVectors` (np.memmap keeps its own in `_mmap`)."""
    arrays = vectors.files if isinstance(vectors, StoredVectors) else [vectors]
    return [m for m in (getattr(a, "_mmap", None) for a in arrays) if isinstance(m, mmap.mmap)]


def advise_random(vectors) -> None:
    """Tell the kernel that memory-mapped (N, d) vectors (an array or `StoredVectors`) are read at random rows
    (re-rank), so that a page fault maps one page and reads no more ahead (less I/O and resident memory).
    Does nothing for an in-memory array."""
    for mapping in _mappings(vectors):
        mapping.madvise(mmap.MADV_RANDOM)


def release_pages(vectors) -> None:
    """Drop the pages of memory-mapped vectors from this process's resident set (they stay in
    the page cache, so a later read is a cheap minor fault). Does nothing for an in-memory
    array. Safe for the read-only file mappings `PassageIndex.load` opens: no page is dirty."""
    for mapping in _mappings(vectors):
        mapping.madvise(mmap.MADV_DONTNEED)


def read_runs(
    rows: np.ndarray, row_bytes: int, *, gap_bytes: int = COALESCE_GAP_BYTES, max_read_bytes: int = MAX_READ_BYTES
) -> np.ndarray:
    """Where to split sorted unique row positions into reads: (R + 1,) int64 offsets into `rows`,
    run r being rows[offsets[r]:offsets[r + 1]]. Rows at most `gap_bytes` apart share one read
    (the rows between them are read and dropped), and no read spans more than `max_read_bytes`
    (or one row, when a row is larger)."""
    gap_rows = gap_bytes // row_bytes
    span_rows = max(1, max_read_bytes // row_bytes)
    starts = np.zeros(len(rows), dtype=bool)
    if len(rows):
        starts[0] = True
        starts[1:] = np.diff(rows) > gap_rows + 1
        # split runs longer than span_rows: a new read where the row's distance from its run's
        # first row crosses a multiple of span_rows
        first = rows[np.maximum.accumulate(np.where(starts, np.arange(len(rows)), 0))]
        piece = (rows - first) // span_rows
        starts[1:] |= piece[1:] != piece[:-1]
    return np.append(np.flatnonzero(starts), len(rows)).astype(np.int64)


def gather_rows(
    vectors: np.ndarray, rows: np.ndarray, *, gap_bytes: int = COALESCE_GAP_BYTES, max_read_bytes: int = MAX_READ_BYTES
) -> np.ndarray:
    """vectors[rows] as an in-memory (len(rows), d) array; rows: sorted unique int64 positions.

    For a memory-mapped .npy file (the whole file), the rows are read with `pread` rather than
    through the mapping: a fault on a mapped page maps its whole page-cache folio (up to 2 MB
    with large folios), so random rows would bring most of the file into this process's
    resident set, even with MADV_RANDOM, while `pread` copies just the rows. Rows close
    together in the file are read in one call (`read_runs`: a system call costs about what
    copying 16 KB does, and fewer, larger reads matter more when the file is read from disk;
    both measured: docs/results/indexes.md). The file stays mapped (and in the page cache) for
    everything else. `StoredVectors` are read file by file so."""
    if isinstance(vectors, StoredVectors):
        return vectors.gather(rows, gap_bytes=gap_bytes, max_read_bytes=max_read_bytes)
    path, offset = getattr(vectors, "filename", None), getattr(vectors, "offset", None)
    row_bytes = vectors.shape[1] * vectors.dtype.itemsize
    whole_file = (
        isinstance(vectors, np.memmap)
        and path is not None
        and offset is not None
        and os.path.getsize(path) == offset + vectors.shape[0] * row_bytes
    )
    if not whole_file:  # an in-memory array, or a slice of a mapping: index it
        return np.asarray(vectors[rows])
    out = np.empty((len(rows), vectors.shape[1]), dtype=vectors.dtype)
    view = memoryview(out).cast("B")
    bounds = read_runs(rows, row_bytes, gap_bytes=gap_bytes, max_read_bytes=max_read_bytes)
    scratch = None
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        positions = rows.tolist()
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            first, last = positions[a], positions[b - 1]
            span = last - first + 1
            if span == b - a:  # consecutive rows: straight into place
                target, size = view[a * row_bytes : b * row_bytes], span * row_bytes
            else:  # rows with gaps: the whole span into scratch, then the wanted rows out
                if scratch is None or len(scratch) < span:
                    scratch = np.empty((max(span, max_read_bytes // row_bytes), vectors.shape[1]), vectors.dtype)
                target, size = memoryview(scratch[:span]).cast("B"), span * row_bytes
            got = os.preadv(fd, [target], offset + first * row_bytes)
            if got != size:
                raise ValueError(f"{path}: short read at row {first} (truncated file?)")
            if span != b - a:
                out[a:b] = scratch[rows[a:b] - first]
    return out


def rerank_candidates(
    query_vectors: np.ndarray,
    vectors: np.ndarray,
    candidates: np.ndarray,
    k: int,
    *,
    batch_bytes: int = RERANK_BATCH_BYTES,
    gap_bytes: int = COALESCE_GAP_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product scores of each query's candidates, best k first.

    query_vectors: (Q, d) float32; vectors: (N, d) float16 (a memmap: only candidate rows are
    read); candidates: (Q, C) int64 positions, -1 where missing. Returns (scores, rows), each
    (Q, min(k, C)) float32 / int64, in the canonical order (`retriever.index.exact_search.best_first`:
    highest score first, ties to the lower position, missing rows -1 with score -inf last).
    gap_bytes: rows at most this far apart are read in one call (`read_runs`; 0: a call per
    row unless consecutive).
    """

    query_vectors = np.ascontiguousarray(query_vectors, dtype=np.float32)
    candidates = np.asarray(candidates, dtype=np.int64)
    n_queries, width = candidates.shape
    if len(query_vectors) != n_queries:
        raise ValueError(f"{len(query_vectors)} queries but candidates for {n_queries}")
    dim = vectors.shape[1]
    scores = np.full((n_queries, width), -np.inf, dtype=np.float32)
    per_query = max(1, batch_bytes // max(1, width * dim * 4))
    buffer = torch.empty((min(per_query, n_queries) * width, dim))
    for start in range(0, n_queries, per_query):
        rows = candidates[start : start + per_query]  # (b, C)
        valid = rows >= 0
        # sorted unique rows: each is read once, in file order
        unique, inverse = np.unique(rows[valid], return_inverse=True)
        if unique.size == 0:
            continue
        block = widen_into(buffer, gather_rows(vectors, unique, gap_bytes=gap_bytes))  # (U, d) float32
        release_pages(vectors)  # pages mapped by other readers of this array (e.g. `embeddings`)
        queries = query_vectors[start : start + len(rows)]
        table = block @ queries.T  # (U, b): every unique row against the batch's queries
        query_of = np.nonzero(valid)[0]
        batch_scores = np.full(rows.shape, -np.inf, dtype=np.float32)
        batch_scores[valid] = table[inverse.ravel(), query_of]
        scores[start : start + len(rows)] = batch_scores
    return best_first(scores, candidates, k)
