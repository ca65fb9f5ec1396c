"""A passage index split over the ranks of a process group: each rank searches 1/N of it.

Every rank calls `search_vectors` together (a collective): the ranks' queries are all-gathered,
each rank searches its contiguous slice of index positions, the top-k candidates (scores and
positions only) are all-gathered and merged, and each rank keeps the results of its own
queries. Passage text is then read from the memory-mapped corpus by position — nothing but
vectors, scores and integers crosses between ranks.

The index on disk is the ordinary one, so it loads at any world size (and in one process).
What rank r of W holds, for N passages of dimension d (positions [N·r/W, N·(r+1)/W)):

* `Flat`: the float16 vectors stay memory-mapped and rank r only ever reads its rows:
  2·d·N/W bytes of file pages (page cache, shared by the processes of one machine).
* `IVF{n},Flat`, `IVF{n},PQ{m}`: when wrapped, each rank reads the entries of its positions
  (live passages only) from the index file into in-memory inverted lists of its own: it holds
  (code bytes + 8)·N/W bytes plus the coarse quantizer (n·d·4 bytes). The lists are read
  with `pread` at the offsets of FAISS's on-disk lists, one list at a time, so the other
  ranks' entries pass through the page cache (shared, reclaimable) and never through this
  process's memory.
* `PQ{m}`, `SQ8`: each rank reads the codes of its rows from the file straight into an index
  of the same kind and codebooks: code bytes·N/W (+ 8 bytes per live row when passages have been
  removed, to map its rows back to positions).
* With re-ranking (`exact_rerank` = k'), each rank's shard proposes k' candidates among its own
  positions and the rank re-scores them exactly from the memory-mapped float16 vectors, reading
  only those rows (the rank that owns the rows re-ranks them); then the top k are exchanged.
* `OPQ{m},PQ{m}`: not split (its codes sit behind the rotation); searched as `HNSW` below.
* `HNSW{M}`: not split. A graph searched with only some ids allowed is traversed differently,
  so merging per-rank results would not equal a one-process search; every rank searches the
  whole graph (storage memory-mapped, links in memory) for its own queries only, with no
  communication. Results are identical to a one-process search; memory is not divided.
Search results over any world size equal a one-process search of the same index (ties in
score go to the lower position).
"""

from __future__ import annotations

import copy
import os

import faiss
import numpy as np
import torch
import torch.distributed as dist

from retriever.index.exact_search import best_first, best_k, exact_search
from retriever.index.files import read_faiss
from retriever.index.passage_index import PassageIndex
from retriever.index.rerank import rerank_candidates
from retriever.index.types import index_type, set_search_params

SHARD_READ_BYTES = 64 << 20  # codes read at a time into a flat-code shard


def shard_bounds(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """The half-open range of index positions that `rank` of `world_size` searches."""
    return total * rank // world_size, total * (rank + 1) // world_size


def ivf_shard(path, source: faiss.Index, start: int, end: int, removed: np.ndarray) -> faiss.Index:
    """An in-memory IVF index holding the live entries of `source` with ids in [start, end).

    path: the saved index file `source` was read from. It is re-read memory-mapped for its
    trained quantizer, whose mapped lists are then replaced by in-memory ones (closing that
    mapping) and filled. With `source` memory-mapped (`OnDiskInvertedLists`) each list is read
    with `pread` at its file offset, so only this rank's entries enter its memory; otherwise
    (`source` in memory) FAISS's `copy_subset_to` copies them. removed: (ntotal,) bool. Ids
    stay the global positions.
    """
    shard = read_faiss(path, io_flags=faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    ivf = faiss.extract_index_ivf(shard)
    lists = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    lists.this.disown()  # the index owns (and frees) them from here on
    ivf.replace_invlists(lists, True)
    ivf.ntotal = shard.ntotal = 0
    source_lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(source).invlists)
    if not isinstance(source_lists, faiss.OnDiskInvertedLists):
        faiss.extract_index_ivf(source).copy_subset_to(ivf, faiss.InvertedLists.SUBSET_TYPE_ID_RANGE, start, end)
        dead = np.flatnonzero(removed[start:end]).astype(np.int64) + start
        if dead.size:
            shard.remove_ids(faiss.IDSelectorBatch(dead))
        return shard
    code_size, kept = ivf.code_size, 0
    with open(path, "rb") as f:
        fd = f.fileno()
        for list_no in range(ivf.nlist):
            entry = source_lists.lists.at(list_no)  # on disk: codes (capacity × code_size), then ids
            if entry.size == 0:
                continue
            ids = np.frombuffer(os.pread(fd, entry.size * 8, entry.offset + entry.capacity * code_size), np.int64)
            keep = (ids >= start) & (ids < end)
            keep[keep] = ~removed[ids[keep]]
            if not keep.any():
                continue
            codes = np.frombuffer(os.pread(fd, entry.size * code_size, entry.offset), np.uint8)
            codes = np.ascontiguousarray(codes.reshape(entry.size, code_size)[keep])
            own_ids = np.ascontiguousarray(ids[keep])
            lists.add_entries(list_no, len(own_ids), faiss.swig_ptr(own_ids), faiss.swig_ptr(codes))
            kept += len(own_ids)
    ivf.ntotal = shard.ntotal = kept
    return shard


def _empty_flat_codes_like(source: faiss.Index) -> faiss.Index:
    """An empty, trained index with the same kind and codebooks as a flat-code index."""
    source = faiss.downcast_index(source)
    if isinstance(source, faiss.IndexPQ):
        empty = faiss.IndexPQ(source.d, source.pq.M, source.pq.nbits, source.metric_type)
        empty.pq = source.pq  # SWIG copies the struct (codebooks)
        empty.search_type = source.search_type
        empty.polysemous_ht = source.polysemous_ht
    elif isinstance(source, faiss.IndexScalarQuantizer):
        empty = faiss.IndexScalarQuantizer(source.d, source.sq.qtype, source.metric_type)
        empty.sq = source.sq
    else:  # ValueError, not TypeError: the CLI reports ValueErrors as one-line messages
        raise ValueError(  # noqa: TRY004
            f"cannot split a {type(source).__name__} by rows; set index.sharded: false"
        )
    empty.is_trained = True
    return empty


def flat_codes_offset(path, source: faiss.Index) -> int:
    """Where a flat-code index's code array (ntotal × code_size bytes) starts in its file.

    FAISS writes the codes as a length-prefixed vector near the end (a few fields may
    follow); the offset is found from the end and checked against the first and last rows of
    `source`'s own codes. ValueError if the file is not laid out so.
    """
    source = faiss.downcast_index(source)
    total = source.ntotal * source.code_size
    size = os.path.getsize(path)
    codes = faiss.rev_swig_ptr(source.codes.data(), total)
    with open(path, "rb") as f:
        for trailing in range(64):
            offset = size - trailing - total
            if offset < 8:
                break
            if int.from_bytes(os.pread(f.fileno(), 8, offset - 8), "little") != total:
                continue
            first = os.pread(f.fileno(), source.code_size, offset)
            last = os.pread(f.fileno(), source.code_size, offset + total - source.code_size)
            if first == codes[: source.code_size].tobytes() and last == codes[total - source.code_size :].tobytes():
                return offset
    raise ValueError(f"{path}: no code array of {total} bytes found where FAISS writes it")


def flat_codes_shard(
    path, source: faiss.Index, start: int, end: int, removed: np.ndarray
) -> tuple[faiss.Index, np.ndarray | None]:
    """The live rows [start, end) of a flat-code index (PQ, SQ8) as an index of their own.

    Reads only those rows' codes from the file at `path`, straight into the shard's code
    array (no intermediate copy: peak memory ≈ the shard). Returns the shard and, when some
    rows were removed, the (n_live,) int64 global position of each of its rows (None: row i
    is position start + i).
    """
    source = faiss.downcast_index(source)
    shard = _empty_flat_codes_like(source)
    code_size, offset = source.code_size, flat_codes_offset(path, source)
    live = ~removed[start:end]
    positions = None if live.all() else (np.flatnonzero(live) + start).astype(np.int64)
    n_live = end - start if positions is None else len(positions)
    shard.codes.resize(n_live * code_size)
    target = faiss.rev_swig_ptr(shard.codes.data(), n_live * code_size).reshape(n_live, code_size)
    block_rows = max(1, SHARD_READ_BYTES // code_size)
    filled = 0
    with open(path, "rb", buffering=0) as f:
        for first in range(start, end, block_rows):
            last = min(first + block_rows, end)
            f.seek(offset + first * code_size)
            wanted = (last - first) * code_size
            if positions is None:  # read into the shard's own memory
                got = f.readinto(memoryview(target[first - start : last - start]).cast("B"))
            else:
                data = f.read(wanted)
                got = len(data)
            if got != wanted:
                raise ValueError(f"{path}: short read of the codes of rows {first}..{last} (truncated file?)")
            if positions is None:
                continue
            block = np.frombuffer(data, np.uint8).reshape(last - first, code_size)
            block = block[live[first - start : last - start]]
            target[filled : filled + len(block)] = block
            filled += len(block)
    shard.ntotal = n_live
    return shard, positions


class ShardedPassageIndex(PassageIndex):
    """`PassageIndex` whose search is shared by the ranks of the default process group.

    Build it with `from_index`; see the module docstring for what each rank holds.
    """

    rank: int
    world_size: int
    start: int
    end: int
    mode: str  # "rows" (each rank its positions) or "replicate" (each rank the whole index)
    shard_index: faiss.Index | None  # this rank's own FAISS index (rows mode, FAISS specs)
    shard_positions: np.ndarray | None  # (n,) global position of each shard_index row, or None

    @classmethod
    def from_index(cls, index: PassageIndex, rank: int, world_size: int) -> ShardedPassageIndex:
        """Wrap a loaded index; `rank` searches positions `shard_bounds(total, rank, world_size)`.

        For FAISS specs split by rows this reads the rank's part of the index file into memory;
        drop `index` afterwards to release its mapping of the whole file.
        """
        sharded = copy.copy(index)
        sharded.__class__ = cls
        sharded.rank, sharded.world_size = rank, world_size
        sharded.start, sharded.end = shard_bounds(index.manifest.total, rank, world_size)
        sharded.shard_index, sharded.shard_positions = None, None
        spec, dim = index.manifest.spec, index.dim
        if index.faiss_index is None:
            sharded.mode = "rows"  # memory-mapped float16 vectors, sliced at search
        elif world_size == 1 or index_type(spec, dim).shard == "replicate" or len(index.faiss_parts) > 1:
            sharded.mode = "replicate"  # (an index that took edits has FAISS parts: `atlas index compact` merges them)
        else:
            sharded.mode = "rows"
            path = index.manifest.path_of(index.folder, index.manifest.files["faiss"])
            if faiss.try_extract_index_ivf(index.faiss_index) is not None:
                sharded.shard_index = ivf_shard(path, index.faiss_index, sharded.start, sharded.end, index.removed)
            else:
                sharded.shard_index, sharded.shard_positions = flat_codes_shard(
                    path, index.faiss_index, sharded.start, sharded.end, index.removed
                )
            set_search_params(sharded.shard_index, nprobe=sharded.nprobe, ef_search=sharded.ef_search)
            sharded.faiss_index, sharded.faiss_parts = None, []  # this rank holds only its shard
        return sharded

    def holdings(self) -> dict:
        """What this rank keeps for search: mode, positions, and the in-memory bytes of its own
        FAISS shard (codes + ids; memory-mapped data and codebooks are not counted)."""
        info = {
            "rank": self.rank,
            "world_size": self.world_size,
            "mode": self.mode,
            "positions": [self.start, self.end] if self.mode == "rows" else [0, self.manifest.total],
        }
        if self.shard_index is not None:
            ivf = faiss.try_extract_index_ivf(self.shard_index)
            code_size = ivf.code_size if ivf is not None else faiss.downcast_index(self.shard_index).code_size
            per_row = code_size + (8 if ivf is not None or self.shard_positions is not None else 0)
            info.update(shard_vectors=int(self.shard_index.ntotal), shard_bytes=int(self.shard_index.ntotal * per_row))
        elif self.faiss_index is None:
            info.update(shard_vectors=self.end - self.start, mapped_bytes=(self.end - self.start) * self.dim * 2)
        return info

    def _search_shard(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k over this rank's positions: (Q, d) → scores, global positions (Q, k)."""
        query_vectors = np.ascontiguousarray(query_vectors, dtype=np.float32)
        if self.shard_index is None:  # float16 vectors: read only this rank's rows
            live = ~self.removed[self.start : self.end]
            scores, rows = exact_search(
                query_vectors, self.vectors[self.start : self.end], k, "ip", exclude=None if live.all() else ~live
            )
            rows = np.where(rows >= 0, rows + self.start, -1)
        else:
            scores, rows = self.shard_index.search(query_vectors, max(k, self.exact_rerank))
            if faiss.try_extract_index_ivf(self.shard_index) is None:  # row numbers of the shard
                local = np.maximum(rows, 0)
                mapped = self.shard_positions[local] if self.shard_positions is not None else local + self.start
                rows = np.where(rows >= 0, mapped, -1)
            if self.exact_rerank:  # exact scores of this rank's k' candidates, from its own rows
                scores, rows = rerank_candidates(query_vectors, self.vectors, rows, k)
        return best_k(scores, rows, k)  # the order one process gives

    def search_vectors(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Collective top-k: every rank passes its own (Q_r, d) queries → its (Q_r, k) results.

        In "replicate" mode (HNSW, or one rank) nothing is exchanged: each rank searches the
        whole index for its own queries."""
        if self.mode == "replicate":
            return PassageIndex.search_vectors(self, query_vectors, k)
        if self.world_size == 1 or not dist.is_initialized():
            return self._search_shard(np.asarray(query_vectors, dtype=np.float32), k)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        queries = torch.as_tensor(np.asarray(query_vectors, dtype=np.float32), device=device)
        counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(self.world_size)]
        dist.all_gather(counts, torch.tensor([len(queries)], device=device))
        most = int(max(c.item() for c in counts))
        padded = torch.zeros(most, self.dim, device=device)
        padded[: len(queries)] = queries
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded)
        everyone = torch.cat(gathered).cpu().numpy()  # (W·most, d)
        scores, rows = self._search_shard(everyone, k)  # (W·most, k)
        all_scores = [torch.empty(scores.shape, device=device) for _ in range(self.world_size)]
        all_rows = [torch.empty(rows.shape, dtype=torch.long, device=device) for _ in range(self.world_size)]
        dist.all_gather(all_scores, torch.as_tensor(scores, device=device))
        dist.all_gather(all_rows, torch.as_tensor(rows, device=device))
        mine = slice(self.rank * most, self.rank * most + len(queries))
        candidate_scores = np.concatenate([s.cpu().numpy()[mine] for s in all_scores], axis=1)
        candidate_rows = np.concatenate([r.cpu().numpy()[mine] for r in all_rows], axis=1)
        return best_first(candidate_scores, candidate_rows, k)  # the order one process gives
