"""A saved passage index: load (checked), search, and update in place (add / remove passages).

An index folder holds
    manifest.json      what it is: encoder and corpus fingerprints, spec, counts, dim, dtype,
                       faiss version, created, the corpus segments, and every file's size
                       and SHA-256 (so a truncated or corrupted file is named, not crashed on)
    vectors.gN.npy     float16 (N, d) embeddings: the index itself for `Flat` (searched in
                       chunks by `exact_search`), else present only with `keep_embeddings`
                       (implied by `exact_rerank`: the exact scores of a compressed index's
                       candidates are read from it, memory-mapped; retriever/index/rerank.py)
    index.gN.faiss     the FAISS index for every other spec, saved and loaded compressed only
    removed.gN.npy     (N,) bool: positions of removed passages, never returned by search
Files carry a generation number N; an update writes new files, then atomically replaces
`manifest.json`, so a crash at any moment leaves the previous index intact.

Loading checks every file's size and sampled blocks against the manifest (a truncated, zero-filled or
replaced file is named at once; `retriever.index.manifest`); the SHA-256 of every byte is checked only when
asked (`PassageIndex.load(verify=True)`, `atlas index info --verify`): hashing a 49 GB flat index takes
minutes, and every rank of a job loads the index. A damaged byte between the sampled blocks is otherwise
caught where FAISS or numpy cannot parse the file, or not at all inside the vector data: run `--verify`
after copying an index.

Loading memory-maps what it can: float16 vectors always; FAISS indexes with the flags FAISS
supports for their family (`types.faiss_read_flags`): IVF inverted lists become a
read-only `OnDiskInvertedLists` over the file, flat codes (PQ, SQ8) and HNSW storage are
mapped in place. Mapped pages are shared by every process on the machine that opens the file.

Two-stage search (`exact_rerank` = k' > 0 in the manifest, or given at load): a compressed index
proposes k' candidates per query and `retriever.index.rerank.rerank_candidates` returns the top k by
exact inner product from the memory-mapped float16 vectors. `Flat` is exact already and
ignores it.

Positions (`Passage.row`) number the passages across segments: the build's corpus first, then
each `add`ed corpus in turn. A compaction (`retriever.index.compact`) merges segments and drops
removed rows, so positions change at each one; passage ids never do. Build an index with
`retriever.index.build.build_index`. A load that meets a writer's commit (the files it was about
to open deleted under it) opens the new generation instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from retriever.corpus import Corpus
from retriever.index.exact_search import best_k, exact_search
from retriever.index.files import (
    InvalidIndexError,
    check_encoder,
    check_file,
    check_rerank,
    load_npy,
    open_corpus,
    read_faiss,
)
from retriever.index.manifest import Manifest
from retriever.index.rerank import StoredVectors, advise_random, rerank_candidates
from retriever.index.settings import DEFAULTS
from retriever.index.types import faiss_read_flags, search_parameters_target, set_search_params
from tasks.passage import Passage

_LOAD_ATTEMPTS = 3  # generations a load may see committed under it before it gives up


class PassageIndex:
    """A loaded index: vectors (or a FAISS index) + the corpora their positions point into.

    Use `PassageIndex.load`; then `search(queries, k)` with strings (needs the retriever it
    was loaded with) or with query vectors (Q, d).
    """

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        corpora: list[Corpus],
        vectors: StoredVectors | None,
        faiss_index: list[tuple[int, faiss.Index]] | None,
        removed: np.ndarray,
        retriever=None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        exact_rerank: int | None = None,
    ):
        self.folder = folder
        self.manifest = manifest
        self.corpora = corpora
        self.vectors = vectors  # (N, d) float16, memory-mapped files, or None
        # the FAISS index in parts: (first position, index of the rows from there, numbered from 0); one part as
        # built or compacted, then one per segment an edit appended (`Manifest.file_parts`)
        self.faiss_parts: list[tuple[int, faiss.Index]] = faiss_index or []
        self.faiss_index = self.faiss_parts[0][1] if self.faiss_parts else None  # the part as built or compacted
        self.removed = removed  # (N,) bool
        self.retriever = retriever
        self._offsets = np.array([s.offset for s in manifest.segments], dtype=np.int64)  # each segment's first row
        self.nprobe = nprobe if nprobe is not None else manifest.nprobe
        self.ef_search = ef_search if ef_search is not None else manifest.ef_search
        for _, part in self.faiss_parts:
            set_search_params(part, nprobe=self.nprobe, ef_search=self.ef_search)
        self.exact_rerank = check_rerank(manifest, folder, exact_rerank, has_vectors=vectors is not None)
        if self.faiss_parts and vectors is not None:
            advise_random(vectors)  # read only at candidate rows (re-rank, `embeddings`)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        retriever=None,
        corpus: str | os.PathLike | None = None,
        allow_encoder_mismatch: bool = False,
        verify: bool = False,
        mmap: bool = True,
        read_faiss_index: bool = True,
        nprobe: int | None = None,
        ef_search: int | None = None,
        exact_rerank: int | None = None,
    ) -> PassageIndex:
        """Open an index folder on CPU, checking files, encoder and corpus.

        retriever: a `Retriever` whose passage fingerprint must equal the manifest's (unless
        `allow_encoder_mismatch`); needed to search with strings. corpus: the base corpus's
        folder when it moved (its fingerprint must match). verify: also check every file's
        SHA-256 against the manifest (reads every byte; sizes are always checked). mmap:
        memory-map the FAISS index with the flags of its family (float16 vectors are always
        memory-mapped); an index opened so is read-only (`mmap=False` to `add` to it). read_faiss_index: False
        leaves the FAISS index unread (an update that appends a part of its own needs only the corpora and the
        removed mask; at 10M rows the codes take seconds to read); such an index cannot search.
        exact_rerank: k' candidates to re-score exactly from the float16 vectors (0: off; None: the
        manifest's `exact_rerank`); needs the vectors file (`InvalidIndexError` naming it otherwise).
        """
        folder = Path(path)
        for attempt in range(_LOAD_ATTEMPTS):
            manifest = Manifest.load(folder)
            try:
                return cls._open(
                    folder,
                    manifest,
                    retriever=retriever,
                    corpus=corpus,
                    allow_encoder_mismatch=allow_encoder_mismatch,
                    verify=verify,
                    mmap=mmap,
                    read_faiss_index=read_faiss_index,
                    nprobe=nprobe,
                    ef_search=ef_search,
                    exact_rerank=exact_rerank,
                )
            except (InvalidIndexError, FileNotFoundError):
                # a writer committed a generation between our reading the manifest and opening the
                # files it named, and deleted those: open the new one (an error of this one is raised)
                if attempt == _LOAD_ATTEMPTS - 1 or Manifest.load(folder).generation == manifest.generation:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _open(
        cls,
        folder: Path,
        manifest: Manifest,
        *,
        retriever,
        corpus,
        allow_encoder_mismatch: bool,
        verify: bool,
        mmap: bool,
        read_faiss_index: bool,
        nprobe: int | None,
        ef_search: int | None,
        exact_rerank: int | None,
    ) -> PassageIndex:
        """`load` of the generation `manifest` describes."""
        if retriever is not None:
            check_encoder(
                manifest,
                retriever.passage_fingerprint(),
                str(folder),
                allow_mismatch=allow_encoder_mismatch,
                settings={"passage_format": retriever.passage_format, "passage_maxlength": retriever.passage_maxlength},
            )
        for record in manifest.file_records():
            check_file(folder, manifest, record, verify_hash=verify)
        corpora = [
            open_corpus(folder, manifest, segment, corpus if i == 0 else None, verify=verify)
            for i, segment in enumerate(manifest.segments)
        ]
        vectors = _stored_vectors(folder, manifest)
        faiss_parts = _faiss_parts(folder, manifest, mmap=mmap) if read_faiss_index else None
        removed = load_npy(manifest.path_of(folder, manifest.files["removed"]))
        return cls(
            folder,
            manifest,
            corpora=corpora,
            vectors=vectors,
            faiss_index=faiss_parts,
            removed=removed.astype(bool),
            retriever=retriever,
            nprobe=nprobe,
            ef_search=ef_search,
            exact_rerank=exact_rerank,
        )

    def __len__(self) -> int:
        """The number of live (not removed) passages."""
        return self.manifest.count

    @property
    def dim(self) -> int:
        """The embedding dimension d."""
        return self.manifest.dim

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map index positions to (segment number, row in that segment's corpus)."""
        rows = np.asarray(rows, dtype=np.int64)
        segment = np.searchsorted(self._offsets, rows, side="right") - 1
        return segment, rows - self._offsets[segment]

    def passages(self, rows) -> list[dict]:
        """The passage dicts at index positions `rows`, in that order."""
        segments, local = self.locate(np.asarray(list(rows), dtype=np.int64))
        return [self.corpora[int(s)][int(r)] for s, r in zip(segments, local)]

    def position_of(self, passage_id: str) -> int | None:
        """The index position of the live passage with this id, or None where there is none.

        Later segments are looked at first: an edited passage (removed, then added again under
        the same id) lives in the newest segment that holds it."""
        for segment in range(len(self.corpora) - 1, -1, -1):
            try:
                row = int(self.corpora[segment].rows_for_ids([passage_id])[0])
            except KeyError:
                continue
            position = int(self._offsets[segment]) + row
            if not self.removed[position]:
                return position
        return None

    def holds(self, passage_id: str) -> bool:
        """Whether any segment has a passage with this id, live or removed."""
        return any(passage_id in corpus for corpus in self.corpora)

    def get(self, passage_ids: Sequence[str]) -> list[dict]:
        """The live passages with these ids, in that order (`position_of` + `passages`, as
        `atlas serve` reads one). An id with no live passage raises `KeyError` naming it, and
        saying when it was removed, before anything is returned."""
        positions = [self.position_of(i) for i in passage_ids]
        missing = [i for i, p in zip(passage_ids, positions) if p is None]
        if missing:
            shown = ", ".join(repr(i) + (" (removed)" if self.holds(i) else "") for i in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise KeyError(f"{len(missing)} id(s) have no live passage in the index {self.folder}: {shown}{more}")
        return self.passages(positions)

    def embeddings(self, rows) -> np.ndarray:
        """The stored float16 embeddings at positions `rows` as (len(rows), d) float32.

        Available for `Flat` indexes and for others built with `keep_embeddings`."""
        if self.vectors is None:
            raise InvalidIndexError(
                f"{self.folder}: embeddings were not kept (spec {self.manifest.spec}); rebuild with --keep-embeddings"
            )
        return np.asarray(self.vectors[np.asarray(rows, dtype=np.int64)], dtype=np.float32)

    def search_vectors(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k positions of live passages: (Q, d) float32 → (scores, rows), each (Q, k).

        Best first, ties in score to the lower position (`best_first`); rows are -1 (score
        -inf) where fewer than k passages are live."""
        query_vectors = np.ascontiguousarray(query_vectors, dtype=np.float32)
        if query_vectors.ndim != 2 or query_vectors.shape[1] != self.dim:
            raise ValueError(f"query vectors must be (Q, {self.dim}), got {query_vectors.shape}")
        if self.manifest.spec != "Flat" and not self.faiss_parts:
            raise RuntimeError(f"{self.folder} was opened without its FAISS index (read_faiss_index=False)")
        any_removed = bool(self.removed.any())
        if self.faiss_index is None:
            scores, rows = exact_search(
                query_vectors, self.vectors, k, "ip", exclude=self.removed if any_removed else None
            )
        else:
            wide = max(k, self.exact_rerank)  # the compressed index proposes k' candidates
            scores, rows = self._search_parts(query_vectors, wide, any_removed)
            if self.exact_rerank:  # exact scores of the candidates, from the memory-mapped vectors
                scores, rows = rerank_candidates(query_vectors, self.vectors, rows, k)
        # one order for every path (FAISS and top-k leave ties in heap order); padded where exact search returns
        # fewer (at most the number of live passages)
        return best_k(scores, rows, k)

    def search(
        self, queries: list[str] | np.ndarray, k: int, *, batch_size: int = DEFAULTS.batch_size
    ) -> list[list[Passage]]:
        """Retrieve the top-k passages for each query: Q lists of `Passage`s (with `score` and `row`),
        best first.

        queries: strings (embedded with the retriever's query encoder) or (Q, d) vectors as a
        numpy array or torch tensor."""
        if len(queries) == 0:
            return []
        if isinstance(queries[0], str):
            if self.retriever is None:
                raise ValueError("searching with strings needs the index loaded with a retriever")
            query_vectors = self.retriever.embed_queries(list(queries), batch_size=batch_size)
        else:
            if hasattr(queries, "detach"):  # a torch tensor, possibly with grad or on GPU
                queries = queries.detach().float().cpu().numpy()
            query_vectors = np.asarray(queries, dtype=np.float32)
        scores, rows = self.search_vectors(query_vectors, k)
        hits: list[list[Passage]] = []
        for q_scores, q_rows in zip(scores, rows):
            keep = q_rows >= 0
            records = zip(self.passages(q_rows[keep]), q_scores[keep], q_rows[keep])
            hits.append([Passage.from_record(p | {"score": s, "row": r}) for p, s, r in records])
        return hits

    def _search_parts(self, query_vectors: np.ndarray, k: int, any_removed: bool) -> tuple[np.ndarray, np.ndarray]:
        """Top-k live positions by the FAISS index's scores, over all its parts: (Q, d) → (scores, rows), (Q, k).
        Each part is searched for its own top k and the results merged (the parts share the trained quantiser,
        so their scores are of one scale)."""
        results = []
        for offset, part in self.faiss_parts:
            removed = self.removed[offset : offset + part.ntotal] if any_removed else None
            scores, rows = search_live(
                part,
                query_vectors,
                k,
                removed=removed if removed is not None and removed.any() else None,
                nprobe=self.nprobe,
                ef_search=self.ef_search,
            )
            results.append((scores, np.where(rows >= 0, rows + offset, -1)))
        if len(results) == 1:
            return results[0]
        scores, rows = zip(*results)
        return best_k(np.concatenate(scores, axis=1), np.concatenate(rows, axis=1), k)


def _faiss_parts(folder: Path, manifest: Manifest, *, mmap: bool) -> list[tuple[int, faiss.Index]]:
    """The index's FAISS files (`Manifest.file_parts`), read with the flags of its family and checked against
    the rows and dimension the manifest gives each: [(first position, index)]; empty for `Flat`."""
    parts, offset = [], 0
    flags = faiss_read_flags(manifest.spec, manifest.dim, mmap=mmap)
    for record, rows in manifest.file_parts("faiss"):
        path = manifest.path_of(folder, record)
        index = read_faiss(path, io_flags=flags)
        if index.ntotal != rows or index.d != manifest.dim:
            raise InvalidIndexError(
                f"{path}: {index.ntotal} vectors of dim {index.d}, manifest says {rows} of dim {manifest.dim}"
            )
        parts.append((offset, index))
        offset += rows
    return parts


def _stored_vectors(folder: Path, manifest: Manifest) -> StoredVectors | None:
    """The index's float16 vectors files (`Manifest.file_parts`), memory-mapped and checked against the
    rows and dimension the manifest gives each; None where it keeps none."""
    parts = manifest.file_parts("vectors")
    if not parts:
        return None
    files = []
    for record, rows in parts:
        path = manifest.path_of(folder, record)
        array = load_npy(path, mmap_mode="r")
        if array.shape != (rows, manifest.dim) or array.dtype != np.float16:
            raise InvalidIndexError(
                f"{path}: shape {array.shape} {array.dtype}, manifest says ({rows}, {manifest.dim}) float16"
            )
        files.append(array)
    return StoredVectors.of(files, manifest.dim)


def search_live(
    index: faiss.Index,
    query_vectors: np.ndarray,
    k: int,
    *,
    removed: np.ndarray | None = None,
    nprobe: int = DEFAULTS.nprobe,
    ef_search: int = DEFAULTS.ef_search,
) -> tuple[np.ndarray, np.ndarray]:
    """FAISS top-k that never returns a removed id: (Q, d) float32 → scores, ids (Q, k).

    removed: (ntotal,) bool over the index's ids, or None. Most index types take an id
    selector in their search parameters; `IndexPQ` and `IndexPQFastScan` take no parameters at
    all, so they are searched wider and the removed ids dropped: a query whose top k' holds k
    live ids has its answer (every other live id ranks lower); the others are searched again
    with k' doubled, up to k + (number removed), where at most that many can be removed
    (exact, and memory stays ~Q × k' even when many passages are removed). Missing results:
    id -1, score -inf.
    """
    query_vectors = np.ascontiguousarray(query_vectors, dtype=np.float32)
    n_removed = 0 if removed is None else int(np.count_nonzero(removed))
    if n_removed == 0:
        return index.search(query_vectors, k)
    if not isinstance(search_parameters_target(index), (faiss.IndexPQ, faiss.IndexPQFastScan)):
        bitmap = np.packbits(~removed, bitorder="little")  # live ids
        selector = faiss.IDSelectorBitmap(len(removed), faiss.swig_ptr(bitmap))
        params = _search_parameters(index, selector, nprobe, ef_search)
        return index.search(query_vectors, k, params=params)
    out_scores = np.full((len(query_vectors), k), -np.inf, dtype=np.float32)
    out_ids = np.full((len(query_vectors), k), -1, dtype=np.int64)
    todo = np.arange(len(query_vectors))
    widest = min(k + n_removed, index.ntotal)
    wide = min(widest, 2 * k + 64)
    while todo.size:
        scores, ids = index.search(query_vectors[todo], wide)
        live = (ids >= 0) & ~removed[np.maximum(ids, 0)]
        done = (live.sum(axis=1) >= k) | (wide >= widest)
        order = np.argsort(~live, axis=1, kind="stable")[:, :k]  # live first, rank order kept
        ids = np.take_along_axis(np.where(live, ids, -1), order, 1)
        scores = np.take_along_axis(np.where(live, scores, -np.inf).astype(np.float32), order, 1)
        out_ids[todo[done], : ids.shape[1]] = ids[done]
        out_scores[todo[done], : ids.shape[1]] = scores[done]
        todo, wide = todo[~done], min(widest, 2 * wide)
    return out_scores, out_ids


def _search_parameters(index: faiss.Index, selector, nprobe: int, ef_search: int):
    """Search parameters carrying an id selector (and the index family's own knob)."""
    if faiss.try_extract_index_ivf(index) is not None:
        return faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)
    if getattr(faiss.downcast_index(index), "hnsw", None) is not None:
        return faiss.SearchParametersHNSW(sel=selector, efSearch=ef_search)
    return faiss.SearchParameters(sel=selector)
