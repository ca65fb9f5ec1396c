"""Compaction: merge an index's corpus segments and drop its dead rows, in one atomic commit.

Every edit appends a corpus segment (`corpora/segment-gN/`) and leaves the rows it removes or
replaces in the files, marked dead (retriever/index/update.py). Left alone, an index that takes
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
segment inside the index folder. The vectors and FAISS files of the merged segments (an edit writes
its own of each) are merged too: the FAISS parts into one index (`merged_faiss`: their codes appended,
not computed again), written without the dead rows; the vectors into one file, except that the file of
the rows as built stays where the base does and the merged segment's rows are written beside it.

Crash safety is the updates' own: new files, flushed, then the manifest replaced atomically, then
the superseded files deleted (by the next writer, when the process died first); a failure or a
full disk before the commit leaves the previous generation as it was. Compaction holds the
writer lock: it is refused, naming the holder, while another process updates the index.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from retriever.corpus import merge_corpora
from retriever.index.files import commit, generation_writes, writer_lock
from retriever.index.manifest import Compaction, FileRecord, Manifest, Segment
from retriever.index.passage_index import PassageIndex
from retriever.index.rerank import gather_rows
from retriever.index.types import build_faiss_index, search_parameters_target
from retriever.index.vectors import write_float16_rows

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


def compaction_due(manifest: Manifest) -> str | None:
    """Why the index described by `manifest` should be compacted now, or None (the policy that
    `atlas serve` and `atlas index add/update/remove` apply after each edit)."""
    segments, dead = len(manifest.segments), manifest.dead_rows
    if segments > MAX_SEGMENTS:
        return f"{segments} corpus segments (more than {MAX_SEGMENTS})"
    if dead > MAX_DEAD_FRACTION * manifest.total and dead >= MIN_DEAD_ROWS:
        return f"{dead} of {manifest.total} rows dead (more than {MAX_DEAD_FRACTION:.0%})"
    return None


def compact_if_due(index_path: str | os.PathLike) -> CompactionStats | None:
    """Compact the index (the segments after the base one, see `compact_index`) when
    `compaction_due` says so; None when it was not due."""
    if compaction_due(Manifest.load(index_path)) is None:
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
    segments, removed, total = manifest.segments, index.removed, manifest.total
    base_rows = segments[0].count
    keep_base = not full and int(removed[:base_rows].sum()) <= MAX_DEAD_FRACTION * base_rows
    first = 1 if keep_base else 0  # the segments from here on are merged into one
    stats = CompactionStats(
        compacted=False,
        full=not keep_base,
        rows_before=total,
        rows_after=total,
        dead_before=manifest.dead_rows,
        dead_after=manifest.dead_rows,
        segments_before=len(segments),
        segments_after=len(segments),
        generation=manifest.generation,
    )
    start = segments[first].offset if first < len(segments) else total
    drop = np.zeros(total, dtype=bool)
    drop[start:] = removed[start:]  # the dead rows of the merged segments
    if first >= len(segments) or (first == len(segments) - 1 and not drop.any()):
        return stats  # already one segment without dead rows (where it is merged)
    parts = [
        (corpus, np.flatnonzero(~removed[s.offset : s.offset + s.count]))
        for s, corpus in zip(segments[first:], index.corpora[first:])
    ]
    if first == 0 and manifest.count == 0:
        raise ValueError(
            f"{folder}: every passage is removed, and an index holds at least one; "
            "add passages before compacting (or build a new index)"
        )

    generation = manifest.generation + 1
    merged_path = folder / "corpora" / f"segment-g{generation}"
    keep = ~drop
    new_total = int(keep.sum())
    written: dict[str, Path] = {}
    with generation_writes(folder, generation, merged_path):
        # no merged segment when none of its rows is live (only the base is left)
        merged = merge_corpora(parts, merged_path) if sum(len(rows) for _, rows in parts) else None
        vectors_path = folder / f"vectors.g{generation}.npy"
        all_vectors, merged_vectors = _compacted_vectors(
            index, vectors_path, first, start, keep, has_merged=merged is not None
        )
        if all_vectors is not None:  # every row in one file again
            written["vectors"] = all_vectors
        faiss_index = merged_faiss(index.faiss_parts)  # one index again (None for Flat)
        if faiss_index is not None and (drop.any() or len(index.faiss_parts) > 1):
            path = folder / f"index.g{generation}.faiss"
            faiss.write_index(drop_rows(faiss_index, drop, manifest.spec), str(path))
            written["faiss"] = path
        if drop.any():  # else only the segments merge: the positions stay
            path = folder / f"removed.g{generation}.npy"
            np.save(path, removed[keep])
            written["removed"] = path
    manifest.segments = segments[:first]
    if merged is not None:
        # segments embedded at different precisions merged: "bf16" says some rows are bfloat16's
        precision = "bf16" if "bf16" in {s.embedding_precision for s in segments[first:]} else "fp32"
        vectors = FileRecord.of(merged_vectors) if merged_vectors is not None else None
        name = str(merged_path.relative_to(folder))
        manifest.segments.append(Segment.of(merged, name, start, precision, vectors=vectors))
    manifest.total, manifest.generation = new_total, generation
    manifest.compacted = Compaction(
        generation=generation,
        dropped_rows=total - new_total,
        merged_segments=len(segments) - first,
        full=not keep_base,
    )
    commit(folder, manifest, written, tuple(p for p in (merged_path if merged else None, merged_vectors) if p))
    stats.compacted = True
    stats.rows_after, stats.dead_after = new_total, manifest.dead_rows
    stats.segments_after, stats.generation = len(manifest.segments), generation
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def merged_faiss(parts: list[tuple[int, faiss.Index]]) -> faiss.Index | None:
    """The FAISS parts of an index (`PassageIndex.faiss_parts`: (first position, index), the first loaded
    writable) as one index: each later part's codes appended to the first's (`merge_from`; an IVF index numbers
    them from the part's first position). The codes are copied, not computed again: the merged index returns
    what the parts did. None when there are none (`Flat`)."""
    if not parts:
        return None
    first, end = parts[0][1], parts[0][0]
    for offset, part in parts:
        if offset != end:
            raise ValueError(f"a FAISS part starts at position {offset}, but the parts before it end at {end}")
        end += part.ntotal
    ivf = faiss.try_extract_index_ivf(first)
    if ivf is not None and isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.BlockInvertedLists):
        # fast scan: FAISS's `BlockInvertedLists.add_entries` copies past a list's buffer when it appends to a
        # list whose length is a multiple of its block's bytes (it compares entries with bytes), so each list
        # is rebuilt whole, as a compaction's dropping does
        _rebuild_lists(first, [(offset, faiss.extract_index_ivf(part)) for offset, part in parts])
        return first
    for offset, part in parts[1:]:
        first.merge_from(part, offset if ivf is not None else 0)
    return first


def _compacted_vectors(
    index: PassageIndex, path: Path, first: int, start: int, keep: np.ndarray, *, has_merged: bool
) -> tuple[Path | None, Path | None]:
    """Write the vectors a compaction keeps to `path` (where the index keeps vectors, and they change):
    → (the new `files.vectors`, the merged segment's own vectors file), each `path` or None.

    The segments from `first` on (positions `start` on) are merged. Where the file of the rows as built
    (`files.vectors`) holds exactly the segments kept before them, it stays, and the merged segment's rows are
    written as its own file. Otherwise every kept row is written into `path`, the new `files.vectors`."""
    parts = index.manifest.file_parts("vectors")
    if index.vectors is None or (len(parts) == 1 and keep.all()):
        return None, None  # no vectors, or one file whose rows all stay
    if first >= 1 and parts[0][1] == start:
        if not has_merged:
            return None, None  # the merged segments' rows all dead: the file as built holds every kept row
        return None, _write_vectors(path, index.vectors[start:], keep[start:])
    return _write_vectors(path, index.vectors, keep), None


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
        _drop_from_lists(index, ivf, drop)
        return index
    target = search_parameters_target(index)
    if getattr(target, "hnsw", None) is not None:
        return _rebuilt_hnsw(target, drop, spec)
    bitmap = np.packbits(drop, bitorder="little")
    index.remove_ids(faiss.IDSelectorBitmap(len(drop), faiss.swig_ptr(bitmap)))
    return index


def _rebuild_lists(index: faiss.Index, parts: list[tuple[int, faiss.IndexIVF]]) -> None:
    """Replace the inverted lists of `index` (its IVF is `parts[0]`'s) by each list's entries from every part
    in turn, the part's ids shifted by its first position; codes copied as they are (unpacked and packed
    again for blocked lists)."""
    ivf = parts[0][1]
    first_lists = faiss.downcast_InvertedLists(ivf.invlists)
    fresh = _empty_lists_like(ivf, first_lists)
    sources = [(offset, faiss.downcast_InvertedLists(part.invlists)) for offset, part in parts]
    for number in range(ivf.nlist):
        ids, codes = [], []
        for offset, lists in sources:
            size = lists.list_size(number)
            if size:
                ids.append(faiss.rev_swig_ptr(lists.get_ids(number), size).copy() + offset)
                codes.append(_list_codes(lists, number, size))
        if ids:
            _add_list(fresh, first_lists, number, np.concatenate(ids), np.concatenate(codes))
    total = sum(part.ntotal for _, part in parts)
    _install_lists(index, ivf, fresh, total)


def _empty_lists_like(ivf: faiss.IndexIVF, lists) -> faiss.InvertedLists:
    """Empty inverted lists of the kind and code size of `lists` (blocked lists get a packer of their own)."""
    if isinstance(lists, faiss.BlockInvertedLists):  # fast scan: codes packed 32 to a block
        packer = ivf.get_CodePacker()  # a new packer, owned by the new lists
        fresh = faiss.BlockInvertedLists(ivf.nlist, packer)
        packer.this.disown()
        return fresh
    return faiss.ArrayInvertedLists(ivf.nlist, lists.code_size)


def _list_codes(lists, number: int, size: int) -> np.ndarray:
    """The (size, code_size) codes of one inverted list, unpacked where it is blocked."""
    if isinstance(lists, faiss.BlockInvertedLists):
        return _unpacked(lists, number, size)
    return faiss.rev_swig_ptr(lists.get_codes(number), size * lists.code_size).reshape(size, -1)


def _add_list(fresh, like, number: int, ids: np.ndarray, codes: np.ndarray) -> None:
    """Fill the empty list `number` of `fresh` with `ids` and their (n, code_size) `codes` (packed as `like`
    packs them). Into an empty list, which is where FAISS's blocked `add_entries` is right."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    data = _packed(like, np.ascontiguousarray(codes)) if isinstance(like, faiss.BlockInvertedLists) else codes
    fresh.add_entries(number, len(ids), faiss.swig_ptr(ids), faiss.swig_ptr(np.ascontiguousarray(data)))


def _install_lists(index: faiss.Index, ivf: faiss.IndexIVF, fresh, total: int) -> None:
    """Make `fresh` the lists of `ivf` (the IVF of `index`), which then holds `total` vectors."""
    ivf.replace_invlists(fresh, True)
    fresh.this.disown()  # the index owns (and frees) the new lists
    ivf.ntotal = total
    outer = faiss.downcast_index(index)
    while isinstance(outer, faiss.IndexPreTransform):  # OPQ: the wrapper counts too
        outer.ntotal = total
        outer = faiss.downcast_index(outer.index)
    if ivf.direct_map.type != faiss.DirectMap.NoMap:
        ivf.make_direct_map(True)


def _drop_from_lists(index: faiss.Index, ivf: faiss.IndexIVF, drop: np.ndarray) -> None:
    """Rebuild each inverted list of `ivf` (the IVF of `index`) from its entries not in `drop`, in their order,
    with ids renumbered to the positions they will have; codes copied as they are."""
    new_id = np.cumsum(~drop) - 1
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    fresh = _empty_lists_like(ivf, lists)
    for number in range(ivf.nlist):
        size = lists.list_size(number)
        if size == 0:
            continue
        ids = faiss.rev_swig_ptr(lists.get_ids(number), size).copy()
        kept = ~drop[ids]
        if kept.any():
            _add_list(fresh, lists, number, new_id[ids[kept]], _list_codes(lists, number, size)[kept])
    _install_lists(index, ivf, fresh, int((~drop).sum()))


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
