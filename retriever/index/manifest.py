"""The manifest of an index folder (`manifest.json`): a typed, versioned record, and the only code that knows the
file's keys. Everything else holds a `Manifest` and reads its attributes.

Format versions: 2 (written): a segment added by an edit may have files of its own (`Segment.vectors`,
`Segment.faiss`), and a FAISS index keeps its trained, empty form (`files.trained`). 1 (read): every file whole;
its segments have none, and its re-rank width may be named `rerank`. A version-1 index that takes an edit is
written as version 2. Fields a file does not have read as their defaults (`embedding_precision`: "fp32",
`sampled_sha256`: none, so not checked).

Every file a manifest names is a plain file name inside the index folder: an absolute path, a `..` or a symlink
that leads outside is refused where the manifest is read (`Manifest.path_of`). A segment's corpus may be an
absolute path (the corpus an index was built on stays where it was prepared); a relative one stays inside.

Cheap integrity: each file record holds, besides its size and SHA-256, the SHA-256 of `SAMPLE_BLOCKS` blocks of
`SAMPLE_BYTES` at fixed offsets spread over the file (`sampled_sha256`): checked at every load (a few reads, a
millisecond), it catches a file zero-filled past its header or replaced by another of the same size, which the
size alone does not. The full SHA-256 stays the check of every byte (`--verify`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.io import atomic_write_json
from common.json_fields import JsonFields, read_json
from retriever.fingerprint import hash_file
from retriever.index.settings import DEFAULTS

if TYPE_CHECKING:
    from retriever.corpus import Corpus

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FILE_ROLES = ("vectors", "faiss", "trained", "removed")  # `files`: the float16 vectors, the FAISS index, its
# trained empty form, the removed mask
SEGMENT_FILE_ROLES = ("vectors", "faiss")  # the files a segment appended by an edit may have of its own
PRECISIONS = ("fp32", "bf16")  # what vectors can have been embedded at
SAMPLE_BLOCKS = 16
SAMPLE_BYTES = 4096


class InvalidIndexError(ValueError):
    """An index folder that cannot be used as it is; the message says which file and why."""


def sampled_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of `SAMPLE_BLOCKS` blocks of `SAMPLE_BYTES` of the file at `path`, at offsets spread evenly from its
    start to its end (the whole file when it is smaller than the blocks together), and of its size."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.sha256(str(size).encode())
        if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
            digest.update(f.read())
        else:
            last = size - SAMPLE_BYTES
            for block in range(SAMPLE_BLOCKS):
                digest.update(os.pread(f.fileno(), SAMPLE_BYTES, last * block // (SAMPLE_BLOCKS - 1)))
    return digest.hexdigest()


def _fields(data: Any, where: Path, prefix: str = "") -> JsonFields:
    """The fields of one JSON object of a manifest; errors are `InvalidIndexError`s naming the file and the field."""
    return JsonFields(data, where, prefix, error=InvalidIndexError)


@dataclass
class FileRecord:
    """One file of the index: its name in the folder, size, SHA-256, and sampled SHA-256 (`sampled_sha256`)."""

    name: str
    bytes: int
    sha256: str
    sampled_sha256: str | None = None  # None in manifests written before it: not checked

    @classmethod
    def of(cls, path: Path) -> FileRecord:
        """The record of a file just written."""
        return cls(path.name, path.stat().st_size, hash_file(path), sampled_sha256(path))

    def to_json(self) -> dict:
        data = {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}
        return data | ({"sampled_sha256": self.sampled_sha256} if self.sampled_sha256 is not None else {})

    @classmethod
    def from_json(cls, fields: JsonFields) -> FileRecord:
        name = fields.get("name", str)
        if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
            raise fields.fail("name", f"is {name!r}, not a file name inside the index folder")
        return cls(name, fields.count("bytes"), fields.get("sha256", str), fields.get("sampled_sha256", str, None))


@dataclass
class Segment:
    """A corpus the index's rows [offset, offset + count) point into, in order: the corpus it was built on first,
    then one per edit (until a compaction merges them). `vectors` / `faiss`: the segment's own files (an edit
    writes its rows' vectors and FAISS codes beside the others'); None where its rows are in `files`."""

    corpus: str  # the corpus folder: absolute, or relative to the index folder (then inside it)
    fingerprint: str
    count: int
    offset: int
    bytes: int | None = None  # of the corpus's passages.arrow (None in version-1 manifests: not checked)
    sampled_sha256: str | None = None  # of the corpus's passages.arrow (see the module)
    vectors: FileRecord | None = None
    faiss: FileRecord | None = None
    embedding_precision: str = "fp32"  # what its passages were embedded at

    @classmethod
    def of(cls, corpus: Corpus, name: str, offset: int, precision: str, **own: FileRecord | None) -> Segment:
        """The segment of the prepared `corpus` recorded as `name` (see `corpus`), its rows from `offset` on,
        embedded at `precision`; `own`: its own files (`vectors`, `faiss`)."""
        return cls(
            corpus=name,
            fingerprint=corpus.fingerprint,
            count=len(corpus),
            offset=offset,
            bytes=corpus.arrow_bytes,
            sampled_sha256=sampled_sha256(corpus.path / "passages.arrow"),
            embedding_precision=precision,
            **own,
        )

    def own_file(self, role: str) -> FileRecord | None:
        """The segment's own file of `role` ("vectors" or "faiss"), or None."""
        return {"vectors": self.vectors, "faiss": self.faiss}[role]

    def to_json(self) -> dict:
        data: dict[str, Any] = {
            "corpus": self.corpus,
            "fingerprint": self.fingerprint,
            "count": self.count,
            "offset": self.offset,
            "embedding_precision": self.embedding_precision,
        }
        optional = {"bytes": self.bytes, "sampled_sha256": self.sampled_sha256}
        data.update({k: v for k, v in optional.items() if v is not None})
        for role in SEGMENT_FILE_ROLES:
            if self.own_file(role) is not None:
                data[role] = self.own_file(role).to_json()
        return data

    @classmethod
    def from_json(cls, fields: JsonFields, precision: str) -> Segment:
        corpus = fields.get("corpus", str)
        if not Path(corpus).is_absolute() and (not corpus or ".." in Path(corpus).parts):
            raise fields.fail("corpus", f"is {corpus!r}: a relative corpus path must stay inside the index folder")
        own = {role: fields.object(role) for role in SEGMENT_FILE_ROLES}
        return cls(
            corpus=corpus,
            fingerprint=fields.get("fingerprint", str),
            count=fields.count("count"),
            offset=fields.count("offset"),
            bytes=fields.get("bytes", int, None, optional=True),
            sampled_sha256=fields.get("sampled_sha256", str, None),
            vectors=FileRecord.from_json(own["vectors"]) if own["vectors"] else None,
            faiss=FileRecord.from_json(own["faiss"]) if own["faiss"] else None,
            embedding_precision=fields.choice("embedding_precision", PRECISIONS, precision),
        )


@dataclass(frozen=True)
class EncoderSettings:
    """The passage encoder an index was built with, as search loads it again: its source (a name, folder or hub
    id) and how it formats and cuts passages. Each None where not recorded."""

    source: str | None = None
    passage_format: str | None = None
    passage_maxlength: int | None = None

    def passage_settings(self) -> dict:
        """{passage_format, passage_maxlength} as recorded (those not recorded left out): a retriever's settings."""
        settings = {"passage_format": self.passage_format, "passage_maxlength": self.passage_maxlength}
        return {k: v for k, v in settings.items() if v is not None}


@dataclass(frozen=True)
class BuildSettings:
    """How the vectors were made: embedded here in chunks of `chunk_size` passages, batches of `batch_size`; or
    read from `vectors` (a file or folder computed elsewhere)."""

    batch_size: int | None = None
    chunk_size: int | None = None
    vectors: str | None = None


@dataclass(frozen=True)
class Compaction:
    """The last compaction: its generation, the dead rows it dropped, the segments it merged, whether the base
    corpus was rewritten too."""

    generation: int
    dropped_rows: int
    merged_segments: int
    full: bool


@dataclass
class Manifest:
    """What an index folder holds: its spec, counts, encoder, corpus segments and files (see the module).

    `count`: live rows (searchable); `total`: rows in the files (live and dead: removed or replaced, dropped by a
    compaction). `generation`: the commit's number, in the names of the files it wrote (`vectors.gN.npy`)."""

    spec: str
    dim: int
    count: int
    total: int
    encoder_fingerprint: str
    segments: list[Segment]
    files: dict[str, FileRecord]  # role ("vectors", "faiss", "trained", "removed") → the file of the rows as built
    generation: int = 1
    metric: str = "ip"
    dtype: str = "float16"
    encoder: EncoderSettings = field(default_factory=EncoderSettings)
    embedding_precision: str = "fp32"  # of the rows as built (each later segment records its own)
    keep_embeddings: bool = False
    exact_rerank: int = 0  # the k' the index was built with (0 = off): `IndexSettings.rerank_width`
    nprobe: int = DEFAULTS.nprobe
    ef_search: int = DEFAULTS.ef_search
    train_sample: int | None = None
    seed: int | None = None
    faiss_version: str | None = None
    created: str | None = None
    build: BuildSettings = field(default_factory=BuildSettings)
    compacted: Compaction | None = None
    imported: dict | None = None  # `atlas import index`: where a reference index came from, kept as written
    format_version: int = FORMAT_VERSION

    # ------------------------------------------------------------------ reading and writing
    @classmethod
    def load(cls, folder: str | os.PathLike) -> Manifest:
        """The manifest of the index folder `folder`: FileNotFoundError where there is none, `InvalidIndexError`
        naming the file and the field where it is corrupt, of a version this atlas does not read, or names a
        file outside the folder."""
        path = Path(folder) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"{folder} is not an index (no {MANIFEST}); build one with `atlas index build`")
        return cls.from_json(read_json(path, InvalidIndexError), path)

    def save(self, folder: str | os.PathLike) -> None:
        """Atomically replace the folder's `manifest.json` (the commit point of every build and edit)."""
        atomic_write_json(Path(folder) / MANIFEST, self.to_json())

    @classmethod
    def from_json(cls, data: Any, where: Path) -> Manifest:
        """A manifest from its parsed JSON `data`, read from the file `where` (named in errors)."""
        fields = _fields(data, where)
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise InvalidIndexError(
                f"{where}: format_version {version!r}, this atlas reads "
                f"{' and '.join(map(str, READABLE_VERSIONS))} (an index written by a newer atlas?)"
            )
        precision = fields.choice("embedding_precision", PRECISIONS, "fp32")
        segments = fields.get("segments", list)
        if not segments:
            raise InvalidIndexError(f"{where}: field segments is empty (an index has at least its build's corpus)")
        files = fields.get("files", dict)
        unknown = sorted(set(files) - set(FILE_ROLES))
        if unknown:
            raise InvalidIndexError(f"{where}: field files has unknown roles {unknown} (known: {FILE_ROLES})")
        if "removed" not in files:
            raise InvalidIndexError(f"{where}: field files.removed is missing")
        compacted = fields.object("compacted")
        manifest = cls(
            spec=fields.get("spec", str),
            dim=fields.count("dim"),
            count=fields.count("count"),
            total=fields.count("total"),
            encoder_fingerprint=fields.get("encoder_fingerprint", str),
            segments=[
                Segment.from_json(_fields(s, where, f"segments[{i}]"), precision) for i, s in enumerate(segments)
            ],
            files={role: FileRecord.from_json(_fields(r, where, f"files.{role}")) for role, r in files.items()},
            generation=fields.count("generation", 1),
            metric=fields.get("metric", str, "ip"),
            dtype=fields.get("dtype", str, "float16"),
            encoder=fields.settings("encoder", EncoderSettings, source=str, passage_format=str, passage_maxlength=int),
            embedding_precision=precision,
            keep_embeddings=fields.get("keep_embeddings", bool, "vectors" in files),
            # "rerank": the field's name in version-1 manifests written before it took the config's name
            exact_rerank=fields.count("exact_rerank", fields.count("rerank", 0)),
            nprobe=fields.count("nprobe", DEFAULTS.nprobe),
            ef_search=fields.count("ef_search", DEFAULTS.ef_search),
            train_sample=fields.get("train_sample", int, None, optional=True),
            seed=fields.get("seed", int, None, optional=True),
            faiss_version=fields.get("faiss_version", str, None, optional=True),
            created=fields.get("created", str, None, optional=True),
            build=fields.settings("build", BuildSettings, batch_size=int, chunk_size=int, vectors=str),
            compacted=Compaction(
                generation=compacted.count("generation"),
                dropped_rows=compacted.count("dropped_rows"),
                merged_segments=compacted.count("merged_segments"),
                full=compacted.get("full", bool),
            )
            if compacted
            else None,
            imported=fields.get("imported", dict, None, optional=True),
            format_version=version,
        )
        manifest._check_rows(where)
        return manifest

    def _check_rows(self, where: Path) -> None:
        """The segments tile the rows [0, total) in order, and no more rows are live than there are."""
        offset = 0
        for i, segment in enumerate(self.segments):
            if segment.offset != offset:
                raise InvalidIndexError(
                    f"{where}: field segments[{i}].offset is {segment.offset}, the segments before it end at {offset}"
                )
            offset += segment.count
        if offset != self.total or self.count > self.total:
            raise InvalidIndexError(
                f"{where}: field total is {self.total} and count {self.count}, but the segments hold {offset} rows"
            )

    def to_json(self) -> dict:
        """The manifest as `manifest.json` holds it (always written as the current format version)."""
        data: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "spec": self.spec,
            "metric": self.metric,
            "dim": self.dim,
            "dtype": self.dtype,
            "count": self.count,
            "total": self.total,
            "generation": self.generation,
            "encoder_fingerprint": self.encoder_fingerprint,
            "encoder": dict(vars(self.encoder)),
            "embedding_precision": self.embedding_precision,
            "segments": [s.to_json() for s in self.segments],
            "keep_embeddings": self.keep_embeddings,
            "exact_rerank": self.exact_rerank,
            "nprobe": self.nprobe,
            "ef_search": self.ef_search,
            "train_sample": self.train_sample,
            "seed": self.seed,
            "faiss_version": self.faiss_version,
            "created": self.created,
            "build": {k: v for k, v in vars(self.build).items() if v is not None},
            "files": {role: r.to_json() for role, r in self.files.items()},
        }
        if self.compacted is not None:
            data["compacted"] = dict(vars(self.compacted))
        if self.imported is not None:
            data["imported"] = self.imported
        return data

    # ------------------------------------------------------------------ what it says
    @property
    def dead_rows(self) -> int:
        """Rows still in the files but never searched (removed or replaced), until a compaction drops them."""
        return self.total - self.count

    def file_parts(self, role: str) -> list[tuple[FileRecord, int]]:
        """The files of one role ("vectors": float16 vectors; "faiss": the FAISS index) in position order, with
        the rows each must hold: (record, rows).

        `files[role]` holds the rows as built or last compacted: those of every segment before the first that has
        its own file of the role; each segment an edit appended since has one (its `count` rows). Version-1
        manifests have `files[role]` alone, over every row. Empty where the index has no file of the role (no
        vectors kept; `Flat`, which has no FAISS index)."""
        own = next((i for i, s in enumerate(self.segments) if s.own_file(role)), len(self.segments))
        parts = []
        if role in self.files:
            rows = self.segments[own].offset if own < len(self.segments) else self.total
            parts.append((self.files[role], rows))
        parts.extend((s.own_file(role), s.count) for s in self.segments[own:])
        return parts

    def file_records(self) -> list[FileRecord]:
        """Every file the manifest names: its `files` and its segments' own."""
        own = [s.own_file(role) for s in self.segments for role in SEGMENT_FILE_ROLES if s.own_file(role)]
        return [*self.files.values(), *own]

    def path_of(self, folder: str | os.PathLike, record: FileRecord) -> Path:
        """Where the file `record` is: inside `folder`. `InvalidIndexError` where a symlink leads it outside."""
        folder = Path(folder)
        path = folder / record.name
        if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
            raise InvalidIndexError(f"{path}: a link to {path.resolve()}, outside the index folder; refused")
        return path

    def corpus_path(self, folder: str | os.PathLike, segment: Segment) -> Path:
        """The corpus folder of `segment`: its absolute path, or a path inside `folder` (`InvalidIndexError` where
        a symlink leads a relative one outside)."""
        folder = Path(folder)
        if Path(segment.corpus).is_absolute():
            return Path(segment.corpus)
        path = folder / segment.corpus
        if not path.resolve().is_relative_to(folder.resolve()):
            raise InvalidIndexError(f"{path}: leads to {path.resolve()}, outside the index folder; refused")
        return path

    def summary(self) -> dict:
        """The manifest without file hashes, plus the rows (live, dead), the corpus segments, total bytes of the
        index files and bytes per live passage (`atlas index info --json`)."""
        size = sum(r.bytes for r in self.file_records())
        data = self.to_json()
        return {
            **{k: v for k, v in data.items() if k not in ("files", "segments")},
            "segments": [
                {k: v if k not in SEGMENT_FILE_ROLES else v["name"] for k, v in s.items()} for s in data["segments"]
            ],
            "live_rows": self.count,
            "dead_rows": self.dead_rows,
            "segment_count": len(self.segments),
            "bytes_on_disk": size,
            "bytes_per_passage": round(size / max(self.count, 1), 2),
            "files": {role: r.name for role, r in self.files.items()},
            "vectors_files": [record.name for record, _ in self.file_parts("vectors")],
            "faiss_files": [record.name for record, _ in self.file_parts("faiss")],
        }
