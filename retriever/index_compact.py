"""Compaction: merge an index's corpus segments and drop its dead rows, in one atomic commit.

Every edit appends a corpus segment (`corpora/segment-gN/`) and leaves the rows it removes or
replaces in the files, marked dead (retriever/index_update.py). Left alone, an index that takes
edits grows without bound: each segment costs a corpus opened at every load (and four files),
each dead row its share of the disk, of the pages a search reads and of the rows a flat search
scans. Compaction rewrites the segments as one and the vector files without the dead rows.

Search results are unchanged, scores to the bit: the live rows keep their order (so ties still
fall to the same passage), the float16 vectors are copied, and a FAISS index keeps its codes:
removed entries are dropped from the codes (`IndexFlatCodes.remove_ids` shifts the others down
in order) or from each inverted list, whose survivors are renumbered in place. No quantiser is
re-trained: a re-trained IVF or PQ index would return other neighbours, and a compressed index
keeps no float vectors to train on unless built with `--keep-embeddings`; when the live passages
have drifted far from the ones it was trained on, rebuild it (`atlas index build`). HNSW is the
exception: a graph cannot lose nodes, so its graph is built again from its own stored float32
vectors (live rows, in order): searches then return what a fresh HNSW index of the live passages
returns, which on an approximate index may differ from before in the last ranks.

When (`compaction_due`): more than `MAX_SEGMENTS` segments, or more than `MAX_DEAD_FRACTION` of
the rows dead (and at least `MIN_DEAD_ROWS`). Why these numbers: a fresh build is one segment and
no dead rows, and the target is to stay within 1.1x of it. The files, the scan of a flat index
and the pages of a mapped one grow as 1 / (1 - dead fraction): at 5% that is at most 1.053x,
leaving the other half of the margin to the segments, whose cost is fixed per segment (one
corpus opened per load, and four files) and small against a load that also checks the encoder;
8 segments bound the files of an index at 4 + 4 x 8. On an index under 2,000 passages the dead
rows wait until there are 100: fewer cost nothing measurable, and a compaction has a fixed cost.
bench/index_edits.py measures all of it against a fresh build (docs/guides/corpus.md).

What is rewritten (`compact_index(full=False)`, what `atlas serve` and `atlas index add/update/
remove` run when due): the segments after the base one (the corpus the index was built on),
merged into one without their dead rows; the base segment stays where it is (it can be most of
a Wikipedia-sized index, and outside the index folder) unless its own dead rows pass
`MAX_DEAD_FRACTION` of it. `full=True` (`atlas index compact`) rewrites everything into one
segment inside the index folder. The vector files are rewritten when rows are dropped (as every
edit rewrites them); a merge of segments without dead rows writes the merged corpus only.

Crash safety is the updates' own: new files, flushed, then the manifest replaced atomically, then
the superseded files deleted (by the next writer, when the process died first); a failure or a
full disk before the commit leaves the previous generation as it was. Compaction holds the
writer lock: it is refused, naming the holder, while another process updates the index.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from retriever.corpus import merge_corpora
from retriever.index import PassageIndex
from retriever.index_files import commit, read_manifest, remove_unreferenced, writer_lock
from retriever.index_types import build_faiss_index, search_parameters_target
from retriever.rerank import gather_rows
from retriever.vectors import write_float16_rows

MAX_SEGMENTS = 8
MAX_DEAD_FRACTION = 0.05
MIN_DEAD_ROWS = 100  # see the module's docstring
_COPY_ROWS = 65536  # rows of float16 vectors copied at a time (bounded memory)


@dataclass
class CompactionStats:
    """What a compaction did (`compacted` False: nothing to do, nothing written)."""

    compacted: bool
    full: bool  # the base segment was rewritten too
    rows_before: int
    rows_after: int
    dead_before: int
    dead_after: int
    segments_before: int
    segments_after: int
    generation: int
    seconds: float = 0.0


def compaction_due(manifest: dict) -> str | None:
    """Why the index described by `manifest` should be compacted now, or None (the policy that
    `atlas serve` and `atlas index add/update/remove` apply after each edit)."""
    segments, dead = len(manifest["segments"]), manifest["total"] - manifest["count"]
    if segments > MAX_SEGMENTS:
        return f"{segments} corpus segments (more than {MAX_SEGMENTS})"
    if dead > MAX_DEAD_FRACTION * manifest["total"] and dead >= MIN_DEAD_ROWS:
        return f"{dead} of {manifest['total']} rows dead (more than {MAX_DEAD_FRACTION:.0%})"
    return None


def compact_if_due(index_path: str | os.PathLike) -> CompactionStats | None:
    """Compact the index (the segments after the base one, see `compact_index`) when
    `compaction_due` says so; None when it was not due."""
    if compaction_due(read_manifest(index_path)) is None:
        return None
    return compact_index(index_path, full=False)


def compact_index(index_path: str | os.PathLike, *, full: bool = True) -> CompactionStats:
    """Merge the corpus segments of the index at `index_path` and drop its dead rows, as one
    commit under the writer lock (`IndexLockedError` while another process writes).

    full: rewrite every segment into one (inside the index folder). Otherwise keep the base
    segment (and its dead rows) unless more than `MAX_DEAD_FRACTION` of it is dead, and merge
    the others. Live passages, their order, vectors and FAISS codes are kept: searches return the
    same ids with the same scores (HNSW: see the module's docstring)."""
    folder = Path(index_path)
    with writer_lock(folder, "compact"):
        return _compact_locked(folder, full=full)


def _compact_locked(folder: Path, *, full: bool) -> CompactionStats:
    # long: a crash-safe commit: its writes are kept in one place so that their order (files first, manifest last) can
    # be read and checked
    started = time.perf_counter()
    # verified in full: the new files are derived from these bytes (read writable: FAISS drops in memory)
    index = PassageIndex.load(folder, mmap=False, verify=True)
    manifest = index.manifest
    remove_unreferenced(folder, manifest)  # what a writer that died left behind
    segments, removed, total = manifest["segments"], index.removed, manifest["total"]
    base_rows = segments[0]["count"]
    keep_base = not full and int(removed[:base_rows].sum()) <= MAX_DEAD_FRACTION * base_rows
    first = 1 if keep_base else 0  # the segments from here on are merged into one
    stats = CompactionStats(
        compacted=False,
        full=not keep_base,
        rows_before=total,
        rows_after=total,
        dead_before=total - manifest["count"],
        dead_after=total - manifest["count"],
        segments_before=len(segments),
        segments_after=len(segments),
        generation=manifest["generation"],
    )
    start = segments[first]["offset"] if first < len(segments) else total
    drop = np.zeros(total, dtype=bool)
    drop[start:] = removed[start:]  # the dead rows of the merged segments
    if first >= len(segments) or (first == len(segments) - 1 and not drop.any()):
        return stats  # already one segment without dead rows (where it is merged)
    parts = [
        (corpus, np.flatnonzero(~removed[s["offset"] : s["offset"] + s["count"]]))
        for s, corpus in zip(segments[first:], index.corpora[first:])
    ]
    if first == 0 and manifest["count"] == 0:
        raise ValueError(
            f"{folder}: every passage is removed, and an index holds at least one; "
            "add passages before compacting (or build a new index)"
        )

    generation = manifest["generation"] + 1
    merged_path = folder / "corpora" / f"segment-g{generation}"
    keep = ~drop
    new_total = int(keep.sum())
    written: dict[str, Path] = {}
    try:
        if merged_path.exists():  # left by a crashed earlier attempt: never referenced
            shutil.rmtree(merged_path)
        # no merged segment when none of its rows is live (only the base is left)
        merged = merge_corpora(parts, merged_path) if sum(len(rows) for _, rows in parts) else None
        if drop.any():  # else only the segments merge: the positions, so the vector files, stay
            if index.vectors is not None:
                written["vectors"] = _write_vectors(folder / f"vectors.g{generation}.npy", index.vectors, keep)
            if index.faiss_index is not None:
                path = folder / f"index.g{generation}.faiss"
                faiss.write_index(drop_rows(index.faiss_index, drop, manifest["spec"]), str(path))
                written["faiss"] = path
            path = folder / f"removed.g{generation}.npy"
            np.save(path, removed[keep])
            written["removed"] = path
    except BaseException:
        shutil.rmtree(merged_path, ignore_errors=True)
        for path in folder.glob(f"*.g{generation}.*"):  # written, never referenced
            path.unlink(missing_ok=True)
        raise
    manifest["segments"] = segments[:first] + (
        [
            {
                "corpus": str(merged_path.relative_to(folder)),
                "fingerprint": merged.fingerprint,
                "bytes": merged.arrow_bytes,
                "count": len(merged),
                "offset": start,
            }
        ]
        if merged is not None
        else []
    )
    manifest.update(total=new_total, generation=generation)
    manifest["compacted"] = {
        "generation": generation,
        "dropped_rows": total - new_total,
        "merged_segments": len(segments) - first,
        "full": not keep_base,
    }
    commit(folder, manifest, written, (merged_path,) if merged is not None else ())
    stats.compacted = True
    stats.rows_after, stats.dead_after = new_total, new_total - manifest["count"]
    stats.segments_after, stats.generation = len(manifest["segments"]), generation
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def _write_vectors(path: Path, vectors: np.ndarray, keep: np.ndarray) -> Path:
    """The (N, d) float16 `vectors` without the rows not in `keep`, written to `path` in chunks."""
    blocks = (
        gather_rows(vectors, np.arange(begin, min(begin + _COPY_ROWS, len(vectors))))[keep[begin : begin + _COPY_ROWS]]
        for begin in range(0, len(vectors), _COPY_ROWS)
    )  # read with pread and written with plain writes: neither fills this process's resident memory
    return write_float16_rows(path, (int(keep.sum()), vectors.shape[1]), blocks)


def drop_rows(index: faiss.Index, drop: np.ndarray, spec: str) -> faiss.Index:
    """The FAISS `index` (loaded writable) without the ids flagged in `drop` (ntotal,) bool, the
    others renumbered 0, 1, … in their order; codes unchanged (HNSW: rebuilt, see the module).

    Flat-code indexes (PQ, SQ8, their OPQ and fast-scan forms) drop them in place, in order. IVF
    indexes store explicit ids, and `remove_ids` would neither renumber nor keep each list's
    order (it moves the last entry into the hole): each list is rebuilt from its kept entries."""
    if not drop.any():
        return index
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        _drop_from_lists(ivf, drop)
        n_live = int((~drop).sum())
        outer = faiss.downcast_index(index)
        while isinstance(outer, faiss.IndexPreTransform):  # OPQ: the wrapper counts too
            outer.ntotal = n_live
            outer = faiss.downcast_index(outer.index)
        return index
    target = search_parameters_target(index)
    if getattr(target, "hnsw", None) is not None:
        return _rebuilt_hnsw(target, drop, spec)
    bitmap = np.packbits(drop, bitorder="little")
    index.remove_ids(faiss.IDSelectorBitmap(len(drop), faiss.swig_ptr(bitmap)))
    return index


def _drop_from_lists(ivf: faiss.IndexIVF, drop: np.ndarray) -> None:
    """Rebuild each inverted list of `ivf` from its entries not in `drop`, in their order, with
    ids renumbered to the positions they will have; codes copied as they are."""
    new_id = np.cumsum(~drop) - 1
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    blocked = isinstance(lists, faiss.BlockInvertedLists)  # fast scan: codes packed 32 to a block
    if blocked:
        packer = ivf.get_CodePacker()  # a new packer, owned by the new lists
        fresh = faiss.BlockInvertedLists(ivf.nlist, packer)
        packer.this.disown()
    else:
        fresh = faiss.ArrayInvertedLists(ivf.nlist, lists.code_size)
    for number in range(ivf.nlist):
        size = lists.list_size(number)
        if size == 0:
            continue
        ids = faiss.rev_swig_ptr(lists.get_ids(number), size).copy()
        kept = ~drop[ids]
        if not kept.any():
            continue
        codes = (
            _unpacked(lists, number, size)
            if blocked
            else faiss.rev_swig_ptr(lists.get_codes(number), size * lists.code_size).reshape(size, -1)
        )
        codes = np.ascontiguousarray(codes[kept])
        new_ids = np.ascontiguousarray(new_id[ids[kept]], dtype=np.int64)
        data = _packed(lists, codes) if blocked else codes
        fresh.add_entries(number, len(new_ids), faiss.swig_ptr(new_ids), faiss.swig_ptr(data))
    ivf.replace_invlists(fresh, True)
    fresh.this.disown()  # the index owns (and frees) the new lists
    ivf.ntotal = int((~drop).sum())
    if ivf.direct_map.type != faiss.DirectMap.NoMap:
        ivf.make_direct_map(True)


def _unpacked(lists: faiss.BlockInvertedLists, number: int, size: int) -> np.ndarray:
    """The (size, code_size) codes of one blocked list, unpacked block by block."""
    packer = lists.packer
    blocks = -(-size // packer.nvec)
    packed = faiss.rev_swig_ptr(lists.get_codes(number), blocks * packer.block_size)
    flat = np.zeros((blocks * packer.nvec, packer.code_size), dtype=np.uint8)
    for block in range(blocks):
        packer.unpack_all(
            faiss.swig_ptr(packed[block * packer.block_size :]), faiss.swig_ptr(flat[block * packer.nvec :])
        )
    return flat[:size]


def _packed(lists: faiss.BlockInvertedLists, codes: np.ndarray) -> np.ndarray:
    """(n, code_size) codes packed into blocks as a blocked list stores them."""
    packer = lists.packer
    blocks = -(-len(codes) // packer.nvec)
    flat = np.zeros((blocks * packer.nvec, packer.code_size), dtype=np.uint8)
    flat[: len(codes)] = codes
    out = np.zeros(blocks * packer.block_size, dtype=np.uint8)
    for block in range(blocks):
        packer.pack_all(faiss.swig_ptr(flat[block * packer.nvec :]), faiss.swig_ptr(out[block * packer.block_size :]))
    return out


def _rebuilt_hnsw(index: faiss.Index, drop: np.ndarray, spec: str) -> faiss.Index:
    """A new HNSW index of `spec` over the stored vectors of the rows not in `drop`, added in
    order, with the old one's construction and search breadths."""
    storage = faiss.downcast_index(index.storage)
    fresh = build_faiss_index(spec, index.d, "ip" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2")
    fresh.hnsw.efConstruction = index.hnsw.efConstruction
    fresh.hnsw.efSearch = index.hnsw.efSearch
    kept = np.flatnonzero(~drop)
    for begin in range(0, len(kept), _COPY_ROWS):
        rows = kept[begin : begin + _COPY_ROWS]
        first, last = int(rows[0]), int(rows[-1]) + 1
        vectors = storage.reconstruct_n(first, last - first)[rows - first]
        fresh.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return fresh
