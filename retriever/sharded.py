"""A passage index split over the ranks of a process group: each rank searches 1/N of it.

Every rank calls `search_vectors` together (a collective): the ranks' queries are all-gathered,
each rank searches its contiguous slice of index positions, the top-k candidates (scores and
positions only) are all-gathered and merged, and each rank keeps the results of its own
queries. Passage text is then read from the memory-mapped corpus by position — nothing but
vectors, scores and integers crosses between ranks.

The index on disk is the ordinary one, so it loads at any world size (and in one process).
A `Flat` index's float16 vectors are memory-mapped and each rank only touches its slice; a
FAISS index is memory-mapped where FAISS allows and each rank restricts its search to its
positions with an id selector (the compute is split; on one machine the pages are shared).
"""

from __future__ import annotations

import copy

import faiss
import numpy as np
import torch
import torch.distributed as dist

from retriever.index import PassageIndex, _search_parameters
from retriever.index_types import exact_search


def shard_bounds(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """The half-open range of index positions that `rank` of `world_size` searches."""
    return total * rank // world_size, total * (rank + 1) // world_size


def merge_top_k(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k of candidate lists: (Q, C) scores and positions → (Q, k) each, best first.

    Ties in score go to the lower position; missing candidates (-1) come last.
    """
    order = np.lexsort((np.where(rows < 0, np.iinfo(np.int64).max, rows), -scores), axis=-1)[:, :k]
    return np.take_along_axis(scores, order, -1), np.take_along_axis(rows, order, -1)


class ShardedPassageIndex(PassageIndex):
    """`PassageIndex` whose search is shared by the ranks of the default process group."""

    @classmethod
    def from_index(cls, index: PassageIndex, rank: int, world_size: int) -> ShardedPassageIndex:
        """Wrap a loaded index; `rank` searches positions `shard_bounds(total, rank, world_size)`."""
        sharded = copy.copy(index)
        sharded.__class__ = cls
        sharded.rank, sharded.world_size = rank, world_size
        sharded.start, sharded.end = shard_bounds(int(index.manifest["total"]), rank, world_size)
        return sharded

    def _search_shard(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k over this rank's positions: (Q, d) → scores, global positions (Q, k)."""
        live = ~self.removed[self.start : self.end]
        if self.faiss_index is None:
            scores, rows = exact_search(query_vectors, self.vectors[self.start : self.end], k, "ip",
                                        exclude=None if live.all() else ~live)
            rows = np.where(rows >= 0, rows + self.start, -1)
        else:
            mask = np.zeros(len(self.removed), dtype=bool)
            mask[self.start : self.end] = live
            bitmap = np.packbits(mask, bitorder="little")
            selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bitmap))
            params = _search_parameters(self.faiss_index, selector, self.nprobe, self.ef_search)
            scores, rows = self.faiss_index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), k,
                                                   params=params)
        if rows.shape[1] < k:
            pad = ((0, 0), (0, k - rows.shape[1]))
            rows, scores = np.pad(rows, pad, constant_values=-1), np.pad(scores, pad, constant_values=-np.inf)
        return scores.astype(np.float32), rows.astype(np.int64)

    def search_vectors(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Collective top-k: every rank passes its own (Q_r, d) queries → its (Q_r, k) results."""
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
        return merge_top_k(candidate_scores, candidate_rows, k)
