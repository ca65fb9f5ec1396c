"""Update a saved index in place, atomically: add, update (replace by id) and remove passages.

None re-embeds the passages already indexed. `add_passages` embeds only the new ones and
appends them as a new corpus segment; `update_passages` does the same for new versions of live
passages and marks the old versions removed in the same commit; `remove_passages` marks
positions removed (search never returns them; their rows stay in the files until a compaction,
retriever/index/compact.py, drops them). An update writes what it changes, not what it keeps: the new
segment's passages, float16 vectors and FAISS codes (files of its own, `segments[i].vectors` and
`segments[i].faiss` in the manifest: the index's trained, empty FAISS index, kept at build as
`trained.g1.faiss`, filled with the new rows) and the removed mask (one byte a row). HNSW, whose graph
cannot be merged, and indexes built before parts have their FAISS index written again whole. Search
merges the parts' results; a compaction merges the parts into one. Every update writes next-generation
files, flushes them to disk, and then atomically replaces `manifest.json`: a crash (even kill -9 or a power cut)
leaves either the previous index or the new one, never a mix, and the superseded files are
deleted afterwards (or by the next writer, when the crash came first). One process writes at a
time: each update holds the index's writer lock (`files.writer_lock`), and a second
writer is refused with `IndexLockedError` naming the first.

The edits take passages in memory (records, or a prepared corpus); files are read at the edges (the command
line, `atlas.Index.add(path)`: `read_passage_files`). Passage ids are kept as given: by default each record is
one passage under its own id.
`chunk_words` > 0 splits records (documents) into passages named `ID-0`, `ID-1`, … as
`atlas corpus prepare` names them; a record whose id already names a passage of the index is
then refused rather than added as `ID-0` (a removed and re-added `nq-486-0` would otherwise
come back as `nq-486-0-0`, and a later removal of `nq-486-0` would remove nothing). Every
check runs before anything is written, and its error names the record as the caller gave it (its position,
"passage 3 (id 'x')", or the file and line the caller read it from).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from common.io import InputError
from common.limits import MAX_PASSAGE_CHARS, passage_id_problem
from retriever.corpus import Corpus, chunk_text, iter_records, passage_id, write_corpus
from retriever.index.embedding import embed_passages, embedding_precision
from retriever.index.files import check_file, commit, generation_writes, read_faiss, writer_lock
from retriever.index.manifest import FileRecord, Manifest, Segment
from retriever.index.passage_index import PassageIndex
from retriever.index.settings import DEFAULTS
from retriever.index.vectors import write_float16_rows
from tasks.passage import Passage

logger = logging.getLogger(__name__)


@dataclass
class UpdateStats:
    """What an update changed."""

    added: int = 0  # passages under ids that had no live passage
    replaced: int = 0  # live passages replaced by a new version under the same id
    removed: int = 0  # live passages removed (no new version)
    already_removed: int = 0  # ids asked to be removed that were removed before
    count: int = 0  # live passages after the update
    ids: list[str] = field(default_factory=list)  # the ids of the passages written, in order


def _live_positions_of(index: PassageIndex, ids: list[str]) -> dict[str, list[int]]:
    """For each id, its positions in the index that are not removed (any segment)."""
    found: dict[str, list[int]] = {}
    for segment, corpus in zip(index.manifest.segments, index.corpora):
        present = [i for i in ids if i in corpus]
        if not present:
            continue
        positions = corpus.rows_for_ids(present) + segment.offset
        for pid, position in zip(present, positions):
            if not index.removed[position]:
                found.setdefault(pid, []).append(int(position))
    return found


@dataclass(frozen=True)
class _Incoming:
    """One passage an edit brings: its id, the record (document) id it came from, where (what the caller gave:
    "passage 3", "docs.jsonl:4", a prepared corpus's row), and its words."""

    id: str
    doc_id: str
    where: str
    words: int


PASSAGE_FIELDS = ("id", "text", "title", "section", "wikipedia_id")
NewPassages = Sequence[Mapping[str, Any] | Passage] | Corpus  # what an edit adds: records, or a prepared corpus


def _place(n: int, origins: Sequence[str] | None) -> str:
    """How record `n` is named in errors: its origin ("docs.jsonl:4") where the caller gave one, else
    "passage n"."""
    return origins[n] if origins is not None else f"passage {n}"


def _document(n: int, record: Mapping[str, Any] | Passage, origins: Sequence[str] | None) -> dict[str, str | None]:
    """Record `n` as the fields an edit writes ({id, text, title, section, wikipedia_id}; None: not given);
    ValueError naming it ("passage 3 (id 'x'): missing field 'text'") where a field is missing or not a string."""
    if isinstance(record, Passage):
        record = {name: getattr(record, name) for name in PASSAGE_FIELDS}
    if not isinstance(record, Mapping):
        raise TypeError(f"{_place(n, origins)}: a passage is a dict or a Passage, got {type(record).__name__}")
    rid = record.get("id")
    place = _place(n, origins) + (f" (id {rid!r})" if isinstance(rid, str) and rid and origins is None else "")
    for name in PASSAGE_FIELDS:
        value = record.get(name)
        if name in ("id", "text") and value is None:
            raise ValueError(f"{place}: missing field '{name}'")
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{place}: field '{name}' must be a string, got {type(value).__name__}")
    if not rid.strip():
        raise ValueError(f"{place}: field 'id' is empty")
    problem = passage_id_problem(rid)
    if problem is not None:
        raise ValueError(f"{place}: field 'id' {rid!r:.80}: {problem}")
    return {name: record.get(name) for name in PASSAGE_FIELDS}


def _incoming(
    new: NewPassages, origins: Sequence[str] | None, chunk_words: int
) -> tuple[list[_Incoming], list[dict[str, str | None]]]:
    """The passages `new` would add, in order, with their ids as `prepare_corpus` names them, and the documents
    (None for a prepared corpus, taken as it is).

    Checks every record first (`passage_documents`), so that a bad one is named before anything is written, and
    that no unsplit text is over the passage limit."""
    if isinstance(new, Corpus):
        ids = new.table.column("id").to_pylist()
        return [_Incoming(i, i, f"{new.path} row {row}", 0) for row, i in enumerate(ids, start=1)], []
    if origins is not None and len(origins) != len(new):
        raise ValueError(f"{len(origins)} origins for {len(new)} passages")
    documents, incoming = passage_documents(new, origins), []
    for n, doc in enumerate(documents):
        if chunk_words <= 0 and len(doc["text"]) > MAX_PASSAGE_CHARS:
            raise ValueError(
                f"{_place(n, origins)}: field 'text' has {len(doc['text']):,} characters; the limit is "
                f"{MAX_PASSAGE_CHARS:,} for one passage (its start alone would be embedded): split it (chunk_words, "
                "--chunk-words)"
            )
        incoming += [
            _Incoming(passage_id(doc["id"], i, chunk_words), doc["id"], _place(n, origins), len(piece.split()))
            for i, piece in enumerate(chunk_text(doc["text"], chunk_words))
        ]  # a document id given once gives passage ids given once (`passage_documents` checks them)
    return incoming, documents


def passage_documents(
    records: Sequence[Mapping[str, Any] | Passage], origins: Sequence[str] | None = None
) -> list[dict[str, str | None]]:
    """Records given in memory (dicts or `Passage`s) as documents {id, text, title, section, wikipedia_id}, each
    checked (`ValueError` naming it: "passage 3 (id 'x'): missing field 'text'"; an empty text; an id given
    twice): what `atlas.Index.build` prepares a corpus of."""
    if len(records) == 0:
        raise ValueError("no passages given")
    documents, seen = [], {}
    for n, record in enumerate(records):
        doc = _document(n, record, origins)
        if not doc["text"].strip():
            raise ValueError(f"{_place(n, origins)}: field 'text' is empty")
        if doc["id"] in seen:
            raise ValueError(f"{_place(n, origins)}: duplicate id {doc['id']!r} (first seen at {seen[doc['id']]})")
        seen[doc["id"]] = _place(n, origins)
        documents.append(doc)
    return documents


def read_passage_files(paths: Sequence[str | os.PathLike]) -> tuple[list[dict[str, str]], list[str]]:
    """The records of JSONL / TSV files as an edit takes them (the fields each gives), and where each is
    ("FILE:LINE"): for the command line and `atlas.Index.add(path)`, which read files at the edge. `InputError`
    naming the file, line and field of a malformed record."""
    records, origins = [], []
    for path in map(Path, paths):
        for line, record, doc in iter_records(path):
            records.append({k: doc[k] for k in PASSAGE_FIELDS if k in ("id", "text") or record.get(k) is not None})
            origins.append(f"{path}:{line}")
    return records, origins


def _naming(passages: list[_Incoming], what: str, advice: str) -> str:
    """ "WHERE: passage id 'x' WHAT; also 'y' (WHERE), …; ADVICE" for the first few."""
    first = passages[0]
    text = f"{first.where}: passage id {first.id!r} {what}"
    if len(passages) > 1:
        text += "; also " + ", ".join(f"{p.id!r} ({p.where})" for p in passages[1:5])
        text += f" and {len(passages) - 5} more" if len(passages) > 5 else ""
    return f"{text}; {advice}"


def _warn_long_passages(index: PassageIndex, incoming: list[_Incoming], chunk_words: int) -> None:
    """Warn when unsplit records are much longer than the base corpus's passages: the encoder
    embeds only their first `passage_maxlength` tokens, so the rest would not be found. "Much":
    over 1.5 times as many words (an edited passage a few words longer than its chunk is read whole,
    as the encoder's token limit leaves room beyond the chunk's words)."""
    base = index.corpora[0].chunk_words
    long = [p for p in incoming if chunk_words <= 0 < base and p.words > 1.5 * base]
    if long:
        logger.warning(
            "%d passage(s) have over 1.5 times the words of the index's base corpus passages (%d), e.g. %r (%s, "
            "%d words): only their first tokens are embedded; pass --chunk-words %d to split them",
            len(long),
            base,
            long[0].id,
            long[0].where,
            long[0].words,
            base,
        )


def add_passages(
    index_path: str | os.PathLike,
    new: NewPassages,
    retriever,
    *,
    batch_size: int = DEFAULTS.batch_size,
    chunk_words: int = 0,
    allow_encoder_mismatch: bool = False,
    progress: bool = True,
    remove: Sequence[str] = (),
    replace: bool = False,
    precision: str | None = None,
    origins: Sequence[str] | None = None,
    sources: Sequence[str] = (),
) -> UpdateStats:
    """Embed the passages `new` and append them to the index at `index_path`.

    `new`: records (dicts {"id", "text", "title", "section", "wikipedia_id"}, or `Passage`s), prepared into
    `INDEX/corpora/segment-gN/`: each one passage under its own id (`chunk_words` 0), or split into passages
    `ID-0`, `ID-1`, … of `chunk_words` words; or a prepared `Corpus`, appended as it is (by its path). Errors name
    a record as "passage N (id 'x')", or by `origins[N]` where given ("docs.jsonl:4": the command line reads files
    at the edge, `read_passage_files`); `sources`: what the new segment's corpus.json records as where they came
    from. An id that already has a live passage is refused (`ValueError` naming it), unless `replace` (or it is
    listed in `remove`): then the live version is marked removed in the same commit as the new one is added.
    With chunking, a record whose id names a passage of the index (live or removed) is refused: it would be
    added under another id. `remove`: further live ids to remove in the same commit; one that is not live raises
    `KeyError` naming it. `precision`: what the passages are embedded at ("auto", "fp32", "bf16";
    `retriever.index.embedding`), recorded in the new segment. Nothing is changed when anything is refused.
    """
    return _append(
        index_path,
        new,
        retriever,
        _EditOptions(
            mode="replace" if replace else "add",
            batch_size=batch_size,
            chunk_words=chunk_words,
            allow_encoder_mismatch=allow_encoder_mismatch,
            progress=progress,
            remove=tuple(remove),
            precision=precision,
            origins=origins,
            sources=tuple(sources),
        ),
    )


def update_passages(
    index_path: str | os.PathLike,
    new: Sequence[Mapping[str, Any] | Passage],
    retriever,
    *,
    batch_size: int = DEFAULTS.batch_size,
    allow_encoder_mismatch: bool = False,
    progress: bool = True,
    precision: str | None = None,
    origins: Sequence[str] | None = None,
    sources: Sequence[str] = (),
) -> UpdateStats:
    """Replace live passages by id with the records `new` (as `add_passages` takes them): the ids are kept, the
    old versions are marked removed in the same commit.

    Each record is one passage (never split). A record without a title (or section, wikipedia_id) keeps the
    passage's current one, as `atlas serve`'s PUT does. An id with no live passage raises `KeyError` naming it
    and the record; nothing is changed then.
    """
    return _append(
        index_path,
        new,
        retriever,
        _EditOptions(
            mode="update",
            batch_size=batch_size,
            allow_encoder_mismatch=allow_encoder_mismatch,
            progress=progress,
            precision=precision,
            origins=origins,
            sources=tuple(sources),
        ),
    )


@dataclass(frozen=True)
class _EditOptions:
    """How an edit runs (`add_passages`, `update_passages`)."""

    mode: str  # "add", "replace" (add, replacing live ids) or "update" (replace live ids only)
    batch_size: int
    allow_encoder_mismatch: bool
    progress: bool
    precision: str | None
    origins: Sequence[str] | None
    sources: tuple[str, ...]
    chunk_words: int = 0
    remove: tuple[str, ...] = ()


def _with_current_fields(index: PassageIndex, doc: dict[str, str | None]) -> dict[str, str | None]:
    """An update's document, each field it leaves out (None) taken from the live passage's."""
    current = index.get([doc["id"]])[0]
    return doc | {key: current.get(key) or "" for key in ("title", "section", "wikipedia_id") if doc[key] is None}


def _append(index_path: str | os.PathLike, new: NewPassages, retriever, options: _EditOptions) -> UpdateStats:
    """Add, add or replace, or replace (`options.mode`) the passages `new` in one commit, under the index's
    writer lock; see `add_passages` and `update_passages`."""
    folder = Path(index_path)
    if options.mode == "update" and isinstance(new, Corpus):
        raise TypeError("an update takes records (dicts or Passages), not a prepared corpus")
    incoming, documents = _incoming(new, options.origins, options.chunk_words)  # checked before the lock is taken
    with writer_lock(folder, "update" if options.mode == "update" else "add"):
        return _append_locked(folder, new, incoming, documents, retriever, options)


def _append_locked(
    folder: Path,
    new: NewPassages,
    incoming: list[_Incoming],
    documents: list[dict[str, str | None]],
    retriever,
    options: _EditOptions,
) -> UpdateStats:
    # long: one crash-safe commit: its writes in one place so that their order (files first, manifest last) reads
    # at a glance
    mode, chunk_words = options.mode, options.chunk_words
    precision = embedding_precision(retriever, options.precision)
    index = _open_for_update(folder, retriever, options.allow_encoder_mismatch)
    remove = list(dict.fromkeys(options.remove))
    live = _live_positions_of(index, list(dict.fromkeys([p.id for p in incoming] + remove)))
    _refuse_conflicts(index, folder, incoming, live, remove, mode=mode, chunk_words=chunk_words)
    _warn_long_passages(index, incoming, chunk_words)
    manifest = index.manifest
    generation = manifest.generation + 1
    created_segment = None if isinstance(new, Corpus) else folder / "corpora" / f"segment-g{generation}"
    with generation_writes(folder, generation, created_segment):
        if created_segment is None:  # a prepared corpus, appended where it is
            corpus, segment_path = new, str(Path(new.path).resolve())
        else:
            if mode == "update":
                documents = [_with_current_fields(index, doc) for doc in documents]
            sources = list(options.sources) or ["(passages given in memory)"]
            corpus = write_corpus(documents, created_segment, chunk_words=chunk_words, sources=sources)
            segment_path = str(created_segment.relative_to(folder))
        embedded = [
            embed_passages(
                retriever, batch, batch_size=options.batch_size, precision=precision, progress=options.progress
            )
            for _, batch in corpus.iter_batches(8192)
        ]
        new_vectors = np.concatenate(embedded).astype(np.float16)
        written, own = _write_generation(folder, index, generation, new_vectors, live)
    old_total, n_new = manifest.total, len(corpus)
    own_records = {role: FileRecord.of(path) for role, path in own.items()}
    manifest.segments.append(Segment.of(corpus, segment_path, old_total, precision, **own_records))
    incoming_ids = {p.id for p in incoming}
    n_replaced = sum(len(positions) for i, positions in live.items() if i in incoming_ids)
    n_removed = sum(len(positions) for i, positions in live.items() if i not in incoming_ids)
    manifest.total, manifest.generation = old_total + n_new, generation
    manifest.count += n_new - n_replaced - n_removed
    also_written = tuple(p for p in (created_segment, *own.values()) if p is not None)
    commit(folder, manifest, written, also_written)
    return UpdateStats(
        added=n_new - n_replaced,
        replaced=n_replaced,
        removed=n_removed,
        count=manifest.count,
        ids=corpus.table.column("id").to_pylist(),
    )


def _open_for_update(folder: Path, retriever, allow_encoder_mismatch: bool) -> PassageIndex:
    """The index an update reads: its corpora and removed mask, the FAISS index only where it is written again."""
    # the files an update derives new ones from are verified in full (a damaged one would be written again under
    # a fresh hash): the removed mask, and the trained index a FAISS part is filled from, or the FAISS index that
    # is written again with the new rows (HNSW, and indexes built before parts); the vectors and corpora it only
    # appends to are checked by size (`atlas index info --verify` reads them all)
    files = Manifest.load(folder).files
    rewrites = "faiss" in files and "trained" not in files
    index = PassageIndex.load(
        folder,
        retriever=retriever,
        allow_encoder_mismatch=allow_encoder_mismatch,
        mmap=not rewrites,
        read_faiss_index=rewrites,  # a part of its own is filled from the trained index: the codes are not read
    )
    for role in ("removed", "faiss" if rewrites else "trained"):
        if role in index.manifest.files:
            check_file(folder, index.manifest, index.manifest.files[role], verify_hash=True)
    return index


def _refuse_conflicts(
    index: PassageIndex,
    folder: Path,
    incoming: list[_Incoming],
    live: dict[str, list[int]],
    remove: list[str],
    *,
    mode: str,
    chunk_words: int,
) -> None:
    """Every check of an update before anything is written: ids to remove that are not live
    (`KeyError`), ids to update that have no live passage (`KeyError`), ids to add that are live
    (`ValueError`), and, with chunking, records whose own id names a passage of the index."""
    missing = [i for i in remove if i not in live]
    if missing:
        shown = ", ".join(repr(i) for i in missing[:5])
        raise KeyError(f"{len(missing)} id(s) to remove are not live in the index {folder}: {shown}")
    if mode == "update":
        unknown = [p for p in incoming if p.id not in live]
        if unknown:
            raise KeyError(
                _naming(
                    unknown, f"has no live passage in the index {folder}", "add new passages with `atlas index add`"
                )
            )
    elif mode == "add":
        clashes = [p for p in incoming if p.id in live and p.id not in remove]
        if clashes:
            raise ValueError(
                _naming(
                    clashes,
                    f"is already in the index {folder}",
                    "replace it with `atlas index update` (or `atlas index add --replace`)",
                )
            )
    if chunk_words > 0:
        first_chunks = {p.doc_id: p for p in reversed(incoming)}  # each record's first passage
        renamed = [p for p in first_chunks.values() if index.holds(p.doc_id)][::-1]
        if renamed:
            raise ValueError(
                _naming(
                    [dataclasses.replace(p, id=p.doc_id) for p in renamed],  # named by the record's own id
                    f"names a passage of the index {folder}, but with chunk_words {chunk_words} this record "
                    f"would be added as {renamed[0].id!r}",
                    "pass --chunk-words 0 to add records as passages under their own ids "
                    "(`atlas index update` replaces a live one)",
                )
            )


def _write_generation(
    folder: Path, index: PassageIndex, generation: int, new_vectors: np.ndarray, live: dict[str, list[int]]
) -> tuple[dict[str, Path], dict[str, Path]]:
    """Generation `generation`'s files. The new segment's own: its float16 vectors `new_vectors` (n, d) (where
    the index keeps vectors: the rows already stored are not copied) and its FAISS part, the trained index kept at
    build filled with them (where it has one; HNSW, and indexes built before parts, have the whole FAISS index
    written again with the new rows instead). The removed mask, with every `live` position replaced or removed.
    Returns ({file kind: path} for `commit`, {file kind: path} of the segment's own files)."""
    manifest = index.manifest
    n_new = len(new_vectors)
    written: dict[str, Path] = {}
    own: dict[str, Path] = {}
    if index.vectors is not None:
        path = folder / f"vectors.g{generation}.npy"
        own["vectors"] = write_float16_rows(path, (n_new, manifest.dim), [new_vectors])
    if "faiss" in manifest.files:
        path = folder / f"index.g{generation}.faiss"
        if "trained" in manifest.files:
            part = read_faiss(manifest.path_of(folder, manifest.files["trained"]))
            part.add(new_vectors.astype(np.float32))
            faiss.write_index(part, str(path))
            own["faiss"] = path
        else:
            faiss_index = index.faiss_index  # loaded writable (mmap=False) above
            faiss_index.add(new_vectors.astype(np.float32))
            faiss.write_index(faiss_index, str(path))
            written["faiss"] = path
    removed = np.concatenate([index.removed, np.zeros(n_new, dtype=bool)])
    for positions in live.values():  # every live id among the new ones and `remove`
        removed[positions] = True
    path = folder / f"removed.g{generation}.npy"
    np.save(path, removed)
    written["removed"] = path
    return written, own


def read_id_file(path: str | os.PathLike) -> list[str]:
    """Passage ids, one per line (blank lines ignored); `InputError` naming a missing file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, None, "file not found (a file of passage ids, one per line)")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


def remove_passages(index_path: str | os.PathLike, ids: list[str]) -> UpdateStats:
    """Mark the passages with these ids removed from the index at `index_path`.

    An id that is in none of the index's corpora raises `KeyError` naming it (nothing is
    changed); an id already removed is counted in `already_removed` (until a compaction drops
    its row: then the index no longer holds it, and it is unknown).
    """
    folder = Path(index_path)
    with writer_lock(folder, "remove"):
        index = PassageIndex.load(folder, mmap=True, verify=False, read_faiss_index=False)  # a mask to write
        unique_ids = list(dict.fromkeys(ids))
        live = _live_positions_of(index, unique_ids)
        unknown = [i for i in unique_ids if i not in live and not any(i in c for c in index.corpora)]
        if unknown:
            shown = ", ".join(repr(i) for i in unknown[:5])
            raise KeyError(f"{len(unknown)} id(s) are not in the index {folder}: {shown}")
        removed = index.removed.copy()
        for positions in live.values():
            removed[positions] = True
        manifest = index.manifest
        generation = manifest.generation + 1
        path = folder / f"removed.g{generation}.npy"
        np.save(path, removed)
        n_removed = int(removed.sum() - index.removed.sum())
        manifest.count, manifest.generation = manifest.count - n_removed, generation
        commit(folder, manifest, {"removed": path})
    return UpdateStats(removed=n_removed, already_removed=len(unique_ids) - len(live), count=manifest.count)
