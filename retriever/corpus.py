"""The passage corpus: prepared once into a memory-mapped Arrow file, read by row or by id.

`prepare_corpus` streams documents from JSON lines, DPR TSV or a saved `datasets` dataset,
splits long documents into ~100-word passages, and writes them batch by batch to one Arrow
stream file, so memory stays bounded whatever the corpus size (30M passages never live as
Python dicts). `Corpus` opens the result as a `datasets.Dataset` backed by that file
(memory-mapped) plus a sorted hash table of passage ids for lookup by id.

A prepared corpus folder holds:
    passages.arrow     columns id, doc_id, title, section, text, wikipedia_id (all strings)
    id_hashes.npy      sorted 64-bit hashes of the passage ids   (N,) uint64
    id_rows.npy        the row of each hash                      (N,) int64
    corpus.json        counts, chunking settings, sources and the content fingerprint (`CorpusManifest`)
"""

from __future__ import annotations

import csv
import functools
import hashlib
import logging
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from common.io import InputError, atomic_directory, read_jsonl, require_str
from common.progress import progress_bar as tqdm
from retriever.corpus_manifest import CorpusManifest, InvalidCorpusError
from retriever.fingerprint import hash_file

COLUMNS = ("id", "doc_id", "title", "section", "text", "wikipedia_id")
SCHEMA = pa.schema([(name, pa.string()) for name in COLUMNS])
_WRITE_BATCH = 8192

logger = logging.getLogger(__name__)


@dataclass
class PrepareStats:
    """What `prepare_corpus` read and wrote."""

    documents: int = 0
    passages: int = 0
    words: int = 0
    skipped: int = 0
    skipped_reasons: list[str] = field(default_factory=list)  # the first few, for the user
    skipped_files: list[str] = field(default_factory=list)  # empty inputs (with skip_invalid)

    def skip(self, error: InputError) -> None:
        """Count a skipped record (with `skip_invalid`), keeping the first few reasons."""
        self.skipped += 1
        if len(self.skipped_reasons) < 5:
            self.skipped_reasons.append(str(error))


def id_hash(passage_id: str) -> int:
    """A stable 64-bit hash of a passage id (blake2b), identical across runs and platforms."""
    return int.from_bytes(hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest(), "little")


def check_chunking(chunk_words: int, stride: int | None) -> int | None:
    """Validate chunking settings; return the effective stride (None when not chunking).

    `chunk_words <= 0` turns chunking off (one passage per document), and then a stride
    makes no sense. Otherwise the stride must be in 1..chunk_words: `None` means
    `chunk_words` (no overlap), a smaller stride overlaps windows by chunk_words − stride
    words; 0 is rejected (it is not "no overlap": that is the default) and so is a stride
    above chunk_words (it would skip the words between windows).
    """
    if chunk_words <= 0:
        if stride is not None:
            raise ValueError(
                f"stride {stride} given without chunking (chunk_words {chunk_words}); "
                "set chunk_words > 0 or leave the stride out"
            )
        return None
    if stride is None:
        return chunk_words
    if not 0 < stride <= chunk_words:
        raise ValueError(
            f"stride must be in 1..chunk_words ({chunk_words}), got {stride} "
            "(leave it out for no overlap; a stride above chunk_words would skip words)"
        )
    return stride


def chunk_text(text: str, chunk_words: int, stride: int | None = None) -> list[str]:
    """Split `text` into windows of `chunk_words` whitespace-separated words.

    Windows start every `stride` words (None: `chunk_words`, i.e. no overlap; see
    `check_chunking` for the valid values); the last window ends at the last word, so every
    word is in at least one passage. A text that fits in one window, or `chunk_words <= 0`,
    is returned unchanged as a single passage.
    """
    stride = check_chunking(chunk_words, stride)
    words = text.split()
    if chunk_words <= 0 or len(words) <= chunk_words:
        return [text]
    passages = []
    start = 0
    while True:
        passages.append(" ".join(words[start : start + chunk_words]))
        if start + chunk_words >= len(words):
            return passages
        start += stride


OnError = Callable[[InputError], None] | None


def _document(record: dict, path: Path, line: int) -> dict[str, str]:
    return {
        "id": require_str(record, "id", path, line),
        "text": require_str(record, "text", path, line),
        "title": require_str(record, "title", path, line, optional=True),
        "section": require_str(record, "section", path, line, optional=True),
        "wikipedia_id": require_str(record, "wikipedia_id", path, line, optional=True),
    }


def passage_id(doc_id: str, chunk: int, chunk_words: int) -> str:
    """The id of chunk `chunk` of document `doc_id`: `"{doc_id}-{chunk}"` when chunking
    (`chunk_words > 0`), else the document id itself (the record is one passage)."""
    return doc_id if chunk_words <= 0 else f"{doc_id}-{chunk}"


def _checked(records: Iterator[tuple[int, dict]], path: Path, on_error: OnError):
    """Validate each raw record into a document; a bad one goes to `on_error` (or raises).
    Yields `(line, raw record, document)`."""
    for line_no, record in records:
        try:
            yield line_no, record, _document(record, path, line_no)
        except InputError as e:
            if on_error is None:
                raise
            on_error(e)


def _tsv_records(path: Path, on_error: OnError) -> Iterator[tuple[int, dict]]:
    """DPR's `id \\t text \\t title` (an optional header row `id text title` is skipped)."""
    seen_any = False
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:  # a UTF-8 byte-order mark at the start is the encoding's mark, not text
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                error = InputError(path, line_no, None, f"invalid UTF-8 ({e.reason} at byte {e.start})")
            else:
                if not line.strip():
                    continue
                seen_any = True
                row = next(csv.reader([line], delimiter="\t"))
                if line_no == 1 and [c.strip().lower() for c in row] == ["id", "text", "title"]:
                    continue
                if len(row) == 3 and row[0].strip():
                    yield line_no, {"id": row[0], "text": row[1], "title": row[2]}
                    continue
                error = (
                    InputError(path, line_no, "id", "empty id")
                    if len(row) == 3
                    else InputError(
                        path,
                        line_no,
                        None,
                        f"expected 3 tab-separated columns (id, text, title), got {len(row)}",
                    )
                )
            if on_error is None:
                raise error
            on_error(error)
    if not seen_any:
        raise InputError(path, None, None, "file is empty")


def _dataset_records(path: Path) -> Iterator[tuple[int, dict]]:
    """A dataset saved with `datasets.Dataset.save_to_disk`; the 'line' is the 1-based row."""
    import datasets  # heavy: imported only when a dataset is read

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        raise InputError(path, None, None, f"holds splits {list(ds)}: pass one split's folder")
    if len(ds) == 0:
        raise InputError(path, None, None, "dataset is empty")
    yield from enumerate(ds, start=1)


def iter_records(path: str | Path, on_error: OnError = None) -> Iterator[tuple[int, dict, dict]]:
    """Yield `(line, record, document)` from one input, choosing the reader by its form.

    `.tsv` → DPR TSV; a folder → a saved `datasets` dataset; anything else → JSON lines.
    Each document is `{id, title, text, section, wikipedia_id}` (strings). A malformed record
    raises `InputError` (file, line, field), or is passed to `on_error` when one is given.
    The raw record tells a field that was left out from one given empty (an update keeps a
    passage's title when the record has none)."""
    path = Path(path)
    if path.is_dir():
        records = _dataset_records(path)
    elif not path.exists():
        raise InputError(path, None, None, "file not found")
    elif path.suffix.lower() == ".tsv":
        records = _tsv_records(path, on_error)
    else:
        records = read_jsonl(path, on_error)
    return _checked(records, path, on_error)


def is_empty_input(path: str | Path) -> bool:
    """Whether a JSONL / TSV file holds nothing but white space (reads until the first other
    byte), or a dataset folder holds no rows. A missing path is not "empty" (it is an error)."""
    path = Path(path)
    if path.is_dir():
        import datasets  # heavy: imported only when a dataset is read

        ds = datasets.load_from_disk(str(path))
        return not isinstance(ds, datasets.DatasetDict) and len(ds) == 0
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        while block := f.read(1 << 16):
            if block.strip():
                return False
    return True


def prepare_corpus(
    inputs: list[str | Path],
    out: str | Path,
    *,
    chunk_words: int = 100,
    stride: int | None = None,
    skip_invalid: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    sources: list[str] | None = None,
) -> PrepareStats:
    """Read documents from `inputs`, chunk them and write a prepared corpus folder at `out`.

    Passage ids are `"{doc_id}-{i}"` (i = chunk number) when chunking is on, the document id
    when `chunk_words <= 0`; they are stable across runs. `stride`: words between passage
    starts, 1..chunk_words (None: no overlap); anything else raises `ValueError` before any
    input is read. Malformed records raise `InputError` (file, line, field) unless
    `skip_invalid`, which skips and counts them, and also skips an empty input file with a
    warning (listed in `stats.skipped_files`). A missing input is always an error. The
    folder is written under a temporary name and renamed at the end. `sources`: what
    `corpus.json` records as the inputs (default: their resolved paths), for callers whose
    inputs are an intermediate file (an index update's normalised records).
    """
    if not inputs:
        raise ValueError("no input files given")
    check_chunking(chunk_words, stride)
    stats = PrepareStats()
    with atomic_directory(out, overwrite=overwrite) as tmp:
        arrow_path = tmp / "passages.arrow"
        hashes, origins = _write_passages(
            inputs,
            arrow_path,
            stats,
            chunk_words=chunk_words,
            stride=stride,
            skip_invalid=skip_invalid,
            progress=progress,
        )
        if stats.passages == 0:
            where = inputs[0] if len(inputs) == 1 else f"{inputs[0]} (and {len(inputs) - 1} more)"
            raise InputError(where, None, None, "no valid documents in the input")
        sorted_hashes, order = _drop_duplicate_ids(
            inputs, arrow_path, hashes, origins, stats, skip_invalid=skip_invalid
        )
        _write_lookup_and_record(
            tmp,
            sorted_hashes,
            order,
            count=stats.passages,
            chunk_words=chunk_words,
            stride=check_chunking(chunk_words, stride),
            sources=sources if sources is not None else [str(Path(p).resolve()) for p in inputs],
            stats=asdict(stats),
        )
    return stats


def _write_lookup_and_record(folder: Path, sorted_hashes: np.ndarray, order: np.ndarray, **record: Any) -> None:
    """The id lookup table (sorted id hashes, the row of each) and `corpus.json` (`record`: the `CorpusManifest`
    fields count, chunk_words, stride, sources, stats, …) of the corpus whose `passages.arrow` is written in
    `folder`."""
    np.save(folder / "id_hashes.npy", sorted_hashes)
    np.save(folder / "id_rows.npy", order.astype(np.int64))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    CorpusManifest(fingerprint=hash_file(folder / "passages.arrow"), created=created, **record).save(folder)


def write_corpus(
    documents: Iterable[dict[str, str]],
    out: str | Path,
    *,
    chunk_words: int = 0,
    sources: list[str],
    overwrite: bool = False,
) -> Corpus:
    """A prepared corpus at `out` (written atomically) of documents held in memory, split into passages as
    `prepare_corpus` splits them: an index edit's passages. `documents`: {id, text, title, section, wikipedia_id}
    (strings; checked by the caller, as `prepare_corpus` checks a file's records); a passage id written twice
    raises ValueError naming it. `sources`: what `corpus.json` records as where they came from; `overwrite`:
    replace a corpus at `out`."""
    stats = PrepareStats()
    columns: dict[str, list[str]] = {name: [] for name in COLUMNS}
    for doc in documents:
        stats.documents += 1
        stats.words += len(doc["text"].split())
        for i, piece in enumerate(chunk_text(doc["text"], chunk_words)):
            for name, value in (("id", passage_id(doc["id"], i, chunk_words)), ("doc_id", doc["id"]), ("text", piece)):
                columns[name].append(value)
            for name in ("title", "section", "wikipedia_id"):
                columns[name].append(doc.get(name) or "")
    stats.passages = len(columns["id"])
    if stats.passages == 0:
        raise ValueError("no passages given")
    seen: set[str] = set()
    for pid in columns["id"]:
        if pid in seen:
            raise ValueError(f"passage id {pid!r} would be written twice")
        seen.add(pid)
    hashes = np.array([id_hash(pid) for pid in columns["id"]], dtype=np.uint64)
    order = np.argsort(hashes, kind="stable")
    with atomic_directory(out, overwrite=overwrite) as tmp:
        arrow_path = tmp / "passages.arrow"
        with pa.OSFile(str(arrow_path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            writer.write_batch(pa.record_batch([columns[c] for c in COLUMNS], schema=SCHEMA))
        record = {"count": stats.passages, "chunk_words": chunk_words, "stride": None, "sources": sources}
        _write_lookup_and_record(tmp, hashes[order], order, **record, stats=asdict(stats))
    return Corpus.load(out)


def _write_passages(
    inputs: list[str | Path],
    arrow_path: Path,
    stats: PrepareStats,
    *,
    chunk_words: int,
    stride: int | None,
    skip_invalid: bool,
    progress: bool,
) -> tuple[array, array]:
    """Stream the inputs' documents, chunked, into the Arrow file at `arrow_path`, counting them in
    `stats`. Returns (the id hash of each passage row, its origin `(input index << 40) | line`)."""
    hashes = array("Q")  # 8 bytes per passage: bounded, unlike a set of Python strings
    origins = array("q")  # (input index << 40) | line, to name both places of a duplicate
    columns: dict[str, list[str]] = {name: [] for name in COLUMNS}
    bar = tqdm(desc="preparing corpus", unit=" docs", disable=not progress, mininterval=1.0)
    with pa.OSFile(str(arrow_path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for input_no, path in enumerate(map(Path, inputs)):
            if skip_invalid and is_empty_input(path):
                logger.warning("%s: skipped: the input is empty", path)
                stats.skipped_files.append(str(path))
                continue
            for line_no, _, doc in iter_records(path, stats.skip if skip_invalid else None):
                if not doc["text"].strip():
                    error = InputError(path, line_no, "text", "empty text")
                    if not skip_invalid:
                        raise error
                    stats.skip(error)
                    continue
                pieces = chunk_text(doc["text"], chunk_words, stride)
                stats.documents += 1
                stats.words += len(doc["text"].split())
                for i, piece in enumerate(pieces):
                    pid = passage_id(doc["id"], i, chunk_words)
                    for name, value in (("id", pid), ("doc_id", doc["id"]), ("text", piece)):
                        columns[name].append(value)
                    for name in ("title", "section", "wikipedia_id"):
                        columns[name].append(doc[name])
                    hashes.append(id_hash(pid))
                    origins.append((input_no << 40) | line_no)
                bar.update(1)
                if len(columns["id"]) >= _WRITE_BATCH:
                    writer.write_batch(pa.record_batch([columns[c] for c in COLUMNS], schema=SCHEMA))
                    columns = {name: [] for name in COLUMNS}
        if columns["id"]:
            writer.write_batch(pa.record_batch([columns[c] for c in COLUMNS], schema=SCHEMA))
    bar.close()
    stats.passages = len(hashes)
    return hashes, origins


def _drop_duplicate_ids(
    inputs: list[str | Path],
    arrow_path: Path,
    hashes: array,
    origins: array,
    stats: PrepareStats,
    *,
    skip_invalid: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Find passage ids written twice: an `InputError` naming both places, or, with `skip_invalid`,
    every passage of each later document dropped (the Arrow file rewritten, `stats` updated).
    Returns the id lookup table: (sorted id hashes (N,) uint64, the row of each (N,) int64)."""
    hash_array = np.frombuffer(hashes, dtype=np.uint64)
    order = np.argsort(hash_array, kind="stable")
    sorted_hashes = hash_array[order]
    duplicates = _duplicate_rows(arrow_path, sorted_hashes, order)
    if not duplicates:
        return sorted_hashes, order
    src = np.frombuffer(origins, dtype=np.int64)

    def place(row: int) -> tuple[Path, int]:
        return Path(inputs[src[row] >> 40]), int(src[row] & ((1 << 40) - 1))

    first, later = duplicates[0]
    if not skip_invalid:
        first_path, first_line = place(first)
        raise InputError(*place(later), "id", f"duplicate id (first seen at {first_path}:{first_line})")
    # drop every passage of a later document whose id was already taken
    dropped_sources = np.unique(src[[later for _, later in duplicates]])
    drop = np.isin(src, dropped_sources)
    for s in dropped_sources:
        stats.skip(InputError(Path(inputs[s >> 40]), int(s & ((1 << 40) - 1)), "id", "duplicate id"))
    _rewrite_without(arrow_path, drop)
    stats.documents -= int(dropped_sources.size)
    stats.passages = int((~drop).sum())
    hash_array = hash_array[~drop]
    order = np.argsort(hash_array, kind="stable")
    return hash_array[order], order


def _duplicate_rows(arrow_path: Path, sorted_hashes: np.ndarray, order: np.ndarray) -> list[tuple[int, int]]:
    """Pairs (first row, later row) whose passage ids are equal (hash ties are verified)."""
    tie = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    if tie.size == 0:
        return []
    import datasets  # heavy: imported only when a dataset is read

    ds = datasets.Dataset.from_file(str(arrow_path))
    pairs = []
    for i in tie:
        a, b = sorted((int(order[i]), int(order[i + 1])))
        if ds[a]["id"] == ds[b]["id"]:
            pairs.append((a, b))
    return sorted(pairs, key=lambda p: p[1])


def _rewrite_without(arrow_path: Path, drop: np.ndarray) -> None:
    """Rewrite the Arrow file without the rows flagged in `drop` (N,) bool."""
    tmp = arrow_path.with_suffix(".rewrite")
    start = 0
    with (
        pa.memory_map(str(arrow_path)) as source,
        pa.OSFile(str(tmp), "wb") as sink,
        pa.ipc.new_stream(sink, SCHEMA) as writer,
    ):
        for batch in pa.ipc.open_stream(source):
            keep = ~drop[start : start + batch.num_rows]
            start += batch.num_rows
            writer.write_batch(batch.filter(pa.array(keep)))
    tmp.replace(arrow_path)


def _taken_batches(batches: Iterable[pa.RecordBatch], rows: np.ndarray):
    """The rows `rows` (ascending positions) of a table given as its record `batches`, `_WRITE_BATCH` at a
    time, taken within each batch: a `take` across the whole of a large table concatenates its chunks
    first, and a string column past 2 GiB of text cannot be concatenated (32-bit offsets)."""
    if len(rows) and np.any(np.diff(rows) < 0):
        raise ValueError("rows to take must be ascending")
    offset = 0
    for batch in batches:
        stop = offset + batch.num_rows
        mine = rows[np.searchsorted(rows, offset) : np.searchsorted(rows, stop)] - offset
        for start in range(0, len(mine), _WRITE_BATCH):
            yield pa.Table.from_batches([batch.take(pa.array(mine[start : start + _WRITE_BATCH]))])
        offset = stop


def merge_corpora(parts: list[tuple[Corpus, np.ndarray]], out: str | Path) -> Corpus:
    """Write the rows `rows` of each `(corpus, rows)` in `parts`, in that order, as one prepared
    corpus folder at `out` (written under a temporary name, then renamed); → the new `Corpus`.

    What an index compaction writes: the live passages of the segments it merges. No text is
    re-read or re-chunked (Arrow `take`), and no id is hashed again (the id hashes are carried
    over from each part's table). `chunk_words` and `stride` are the first part's (the base
    corpus's, which `index add` compares long records against). The ids must be unique across
    the parts (an index has one live passage per id): `ValueError` naming one otherwise.
    """
    if not parts:
        raise ValueError("no corpora to merge")
    hashes = []
    with atomic_directory(out) as tmp:
        arrow_path = tmp / "passages.arrow"
        with pa.OSFile(str(arrow_path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            for corpus, rows in parts:
                rows = np.asarray(rows, dtype=np.int64)
                row_hashes = np.empty(len(corpus), dtype=np.uint64)  # the id hash of each row
                row_hashes[np.asarray(corpus._rows)] = corpus._hashes
                hashes.append(row_hashes[rows])
                # read a batch at a time into memory, not through the corpus's map: the mapped pages a read
                # touches stay in this process's resident memory until the map closes (the whole corpus, by
                # the end of a compaction: GiBs at 10M passages)
                with pa.OSFile(str(corpus.path / "passages.arrow")) as source:
                    for taken in _taken_batches(pa.ipc.open_stream(source), rows):
                        columns = [taken.column(c) for c in COLUMNS]
                        writer.write_table(pa.Table.from_arrays(columns, schema=SCHEMA))
        count = int(sum(len(rows) for _, rows in parts))
        if count == 0:
            raise ValueError(f"{out}: nothing to write (every row of the corpora to merge is left out)")
        hash_array = np.concatenate(hashes)
        order = np.argsort(hash_array, kind="stable")
        sorted_hashes = hash_array[order]
        duplicates = _duplicate_rows(arrow_path, sorted_hashes, order)
        if duplicates:
            import datasets  # heavy: imported only when a dataset is read

            first, later = duplicates[0]
            pid = datasets.Dataset.from_file(str(arrow_path))[later]["id"]
            raise ValueError(f"{out}: passage id {pid!r} would be written twice (rows {first} and {later})")
        base = parts[0][0].manifest
        _write_lookup_and_record(
            tmp,
            sorted_hashes,
            order,
            count=count,
            chunk_words=base.chunk_words,
            stride=base.stride,
            sources=[str(corpus.path) for corpus, _ in parts],
            merged=True,
            stats={"passages": count},
        )
    return Corpus.load(out)


class Corpus:
    """A prepared corpus, memory-mapped: random access by row and by passage id.

    `corpus[row]` → `{id, doc_id, title, section, text, wikipedia_id}`. `table` is the Arrow table
    over the memory-mapped file (zero copy); `dataset` the same data as a `datasets.Dataset`,
    built on first use: building one costs more than opening the table, and an index pays the
    opening for each of its segments at every load.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = CorpusManifest.load(self.path)  # `atlas corpus info` prints it
        self.fingerprint: str = self.manifest.fingerprint
        self.chunk_words: int = self.manifest.chunk_words or 0  # words a passage was cut at (0: documents whole)
        # the map stays open as long as the table's buffers point into it
        arrow = self.path / "passages.arrow"
        try:
            self.table: pa.Table = pa.ipc.open_stream(pa.memory_map(str(arrow))).read_all()
            self._hashes = np.load(self.path / "id_hashes.npy", mmap_mode="r", allow_pickle=False)
            self._rows = np.load(self.path / "id_rows.npy", mmap_mode="r", allow_pickle=False)
        except (pa.ArrowException, OSError, ValueError, EOFError) as e:
            raise InvalidCorpusError(f"{self.path}: the corpus is damaged ({e}); prepare it again") from None
        if len(self) != self.manifest.count or len(self._hashes) != len(self):
            raise InvalidCorpusError(
                f"{self.path}: corpus files disagree (manifest count {self.manifest.count}, "
                f"{len(self)} passages, {len(self._hashes)} ids): prepare it again"
            )

    @classmethod
    def load(cls, path: str | Path) -> Corpus:
        """Open the prepared corpus folder at `path` (memory-mapped, nothing read eagerly)."""
        return cls(path)

    @property
    def arrow_bytes(self) -> int:
        """The size of `passages.arrow` (what an index records, so that a truncated file is named at load)."""
        return (self.path / "passages.arrow").stat().st_size

    def verify(self) -> None:
        """Check the passages file against the corpus's fingerprint (its SHA-256): ValueError naming it when they
        differ (a file altered or damaged after it was prepared). Reads the whole file."""
        arrow = self.path / "passages.arrow"
        if hash_file(arrow) != self.fingerprint:
            raise ValueError(f"{arrow}: its contents are not the ones prepared (SHA-256 differs): prepare it again")

    @functools.cached_property
    def dataset(self):
        """The passages as a `datasets.Dataset` (memory-mapped; its fingerprint is the corpus's)."""
        import datasets  # heavy: imported only when a dataset is read
        from datasets.table import MemoryMappedTable  # heavy: datasets, as above

        return datasets.Dataset(
            MemoryMappedTable(self.table, str(self.path / "passages.arrow")), fingerprint=self.fingerprint
        )

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, row: int) -> dict[str, str]:
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} out of range for a corpus of {len(self)} passages")
        return self.table.slice(int(row) % len(self), 1).to_pylist()[0]

    def rows(self, rows) -> list[dict[str, str]]:
        """The passages at `rows` (any int sequence), in that order."""
        rows = [int(r) for r in rows]
        if not rows:
            return []
        return self.table.take(pa.array(rows, type=pa.int64())).to_pylist()

    def rows_for_ids(self, ids: list[str]) -> np.ndarray:
        """Row numbers of the passages with these ids, `(len(ids),)` int64; KeyError if absent."""
        hashes = np.fromiter((id_hash(i) for i in ids), dtype=np.uint64, count=len(ids))
        pos = np.searchsorted(self._hashes, hashes)
        out = np.empty(len(ids), dtype=np.int64)
        for n, (pid, p, h) in enumerate(zip(ids, pos, hashes)):
            # walk the (astronomically rare) run of equal hashes until the id itself matches
            while p < len(self._hashes) and self._hashes[p] == h:
                row = int(self._rows[p])
                if self.table.column("id")[row].as_py() == pid:
                    out[n] = row
                    break
                p += 1
            else:
                raise KeyError(f"passage id {pid!r} is not in the corpus {self.path}")
        return out

    def get(self, passage_id: str) -> dict[str, str]:
        """The passage with this id (KeyError if absent)."""
        return self[int(self.rows_for_ids([passage_id])[0])]

    def __contains__(self, passage_id: str) -> bool:
        try:
            self.rows_for_ids([passage_id])
        except KeyError:
            return False
        return True

    def iter_batches(self, batch_size: int, start: int = 0) -> Iterator[tuple[int, list[dict[str, str]]]]:
        """Yield `(first_row, passages)` for consecutive batches from row `start` on."""
        for first in range(start, len(self), batch_size):
            yield first, self.rows(range(first, min(first + batch_size, len(self))))
