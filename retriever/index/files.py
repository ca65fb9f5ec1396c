"""The files of an index folder (their manifest: `retriever.index.manifest`): the checks that name a missing,
truncated, altered or mismatched file instead of crashing on it, reading them, and how a writer commits a
generation (`commit`) under the folder's writer lock (`writer_lock`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np

from common.io import fsync_directory, fsync_file, fsync_tree
from retriever.corpus import Corpus
from retriever.fingerprint import hash_file
from retriever.index.manifest import MANIFEST, FileRecord, InvalidIndexError, Manifest, Segment, sampled_sha256

LOCK = ".writer.lock"  # exists while the one process that updates or compacts the index holds it
# files and segment folders a generation writes (`.gN.` / `segment-gN`), and the temporary names
# of atomic writes: what `remove_unreferenced` may delete when the manifest does not name it
_GENERATION_FILE = re.compile(r"(vectors|index|removed|trained)\.g\d+\.(npy|faiss)|\.manifest\.json\..+")
_SEGMENT_DIR = re.compile(r"segment-g\d+|\.segment-g\d+\.(tmp|old)-.+")


class EncoderMismatchError(InvalidIndexError):
    """The encoder offered for search is not the one the index was built with."""


class CorpusMismatchError(InvalidIndexError):
    """The corpus offered is not the one the index was built on."""


class IndexLockedError(RuntimeError):
    """Another process is updating or compacting the index (it holds the writer lock)."""


def check_file(folder: Path, manifest: Manifest, record: FileRecord, *, verify_hash: bool) -> Path:
    """The path of the index file `record`; `InvalidIndexError` naming it when it is missing, outside the folder,
    truncated, altered (its sampled blocks differ: `manifest.sampled_sha256`) or, with `verify_hash`, corrupted
    anywhere (its SHA-256 differs)."""
    path = manifest.path_of(folder, record)
    if not path.is_file():
        raise InvalidIndexError(f"{path}: missing index file")
    size = path.stat().st_size
    if size != record.bytes:
        raise InvalidIndexError(f"{path}: truncated or altered ({size} bytes, manifest says {record.bytes})")
    if verify_hash:
        if hash_file(path) != record.sha256:
            raise InvalidIndexError(f"{path}: corrupted (SHA-256 differs from the manifest)")
    elif record.sampled_sha256 is not None and sampled_sha256(path) != record.sampled_sha256:
        raise InvalidIndexError(
            f"{path}: altered (same size, but its sampled blocks differ from the manifest's: zero-filled or "
            "rewritten); restore it or rebuild the index (`atlas index info --verify` checks every byte)"
        )
    return path


def check_encoder(
    manifest: Manifest, fingerprint: str, where: str, *, allow_mismatch: bool = False, settings: dict | None = None
) -> None:
    """Refuse an encoder whose passage fingerprint differs from the one the index was built with. `settings`
    (the encoder's `passage_format` and `passage_maxlength`) lets the message say when those are what differ."""
    if fingerprint == manifest.encoder_fingerprint or allow_mismatch:
        return
    recorded = manifest.encoder.passage_settings()
    differing = [
        f"{key} {recorded[key]!r} at build, {settings[key]!r} here"
        for key in ("passage_maxlength", "passage_format")
        if settings and key in recorded and settings.get(key) != recorded[key]
    ]
    if differing:
        advice = (
            f"the passages are not embedded as the index's were ({'; '.join(differing)}): set retriever."
            f"{differing[0].split()[0]} to the index's (a recipe), or build the index as this run embeds "
            "(`atlas index build --passage-maxlength N --passage-format F`)"
        )
    else:
        advice = "its vectors would not be comparable: rebuild the index with this encoder"
    raise EncoderMismatchError(
        f"{where}: the index was built with passage encoder {manifest.encoder_fingerprint[:12]}… but the encoder "
        f"given has fingerprint {fingerprint[:12]}…; {advice} (index.allow_encoder_mismatch / "
        "--allow-encoder-mismatch searches anyway, if you know better)"
    )


def open_corpus(
    folder: Path,
    manifest: Manifest,
    segment: Segment,
    override: str | os.PathLike | None = None,
    *,
    verify: bool = False,
) -> Corpus:
    """Open a segment's corpus (relative paths are inside the index) and check it: its passages file's size and
    sampled blocks (where the manifest records them), its fingerprint, its count; with `verify`, its contents too
    (a hash of the whole file). Errors name the file."""
    path = Path(override) if override is not None else manifest.corpus_path(folder, segment)
    arrow = path / "passages.arrow"
    if override is None and arrow.is_file():  # another corpus given: its fingerprint says
        size = arrow.stat().st_size
        if segment.bytes is not None and size != segment.bytes:
            raise CorpusMismatchError(
                f"{arrow}: {size} bytes where the index {folder} recorded {segment.bytes}: truncated or "
                "altered; restore it, or prepare the corpus and build the index again"
            )
        if segment.sampled_sha256 is not None and not verify and sampled_sha256(arrow) != segment.sampled_sha256:
            raise CorpusMismatchError(
                f"{arrow}: altered (same size, but its sampled blocks differ from what the index {folder} recorded: "
                "zero-filled or rewritten); restore it, or prepare the corpus and build the index again"
            )
    try:
        corpus = Corpus.load(path)
        if verify:
            corpus.verify()
    except ValueError as e:
        raise CorpusMismatchError(str(e)) from None
    if corpus.fingerprint != segment.fingerprint:
        raise CorpusMismatchError(
            f"corpus {path} (fingerprint {corpus.fingerprint[:12]}…) is not the corpus the index {folder} was "
            f"built on (fingerprint {segment.fingerprint[:12]}…); build an index for it with `atlas index build`"
        )
    if len(corpus) != segment.count:
        raise CorpusMismatchError(f"corpus {path} has {len(corpus)} passages, the index expects {segment.count}")
    return corpus


def check_rerank(manifest: Manifest, folder: Path, exact_rerank: int | None, *, has_vectors: bool) -> int:
    """The re-rank width k' to search with: `exact_rerank` if given, else the manifest's (0: off).

    Raises `ValueError` for a negative k', and `InvalidIndexError` naming the index and the
    missing `files.vectors` entry when a compressed index is asked to re-rank without its
    float16 vectors (`Flat` is exact already: k' is ignored there)."""
    value = manifest.exact_rerank if exact_rerank is None else exact_rerank
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        source = f"{folder / MANIFEST}: field exact_rerank" if exact_rerank is None else "exact_rerank"
        raise ValueError(f"{source} must be an integer k' >= 0 (0 = off), got {value!r}")
    if manifest.spec == "Flat":
        return 0
    if value and not has_vectors:
        raise InvalidIndexError(
            f"{folder}: re-ranking {value} candidates needs the float16 vectors file, but "
            f"{MANIFEST} lists none (files.vectors; spec {manifest.spec}, built without "
            "--keep-embeddings); rebuild with `atlas index build --exact-rerank K` (which keeps them) "
            "or search without --exact-rerank"
        )
    return value


def load_npy(path: Path, mmap_mode: str | None = None) -> np.ndarray:
    """A saved array (memory-mapped with `mmap_mode`); `InvalidIndexError` naming the file when unreadable."""
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InvalidIndexError(f"{path}: unreadable array ({e})") from None


def read_faiss(path: Path, *, io_flags: int = 0) -> faiss.Index:
    """Read a FAISS index file with `io_flags` (`types.faiss_read_flags`: memory-mapped
    and read-only for the index's family, or 0: into memory, writable).

    No silent fallback: a file FAISS cannot read with these flags raises `InvalidIndexError`
    naming it (truncated, corrupted, or not of the family the manifest says).
    """
    try:
        return faiss.read_index(str(path), io_flags)
    except RuntimeError as e:
        raise InvalidIndexError(f"{path}: unreadable FAISS index ({str(e).splitlines()[0]})") from None


# ------------------------------------------------------------------------------ writing
@contextlib.contextmanager
def writer_lock(folder: str | os.PathLike, operation: str, *, wait: float = 0.0) -> Iterator[None]:
    """Hold the index's writer lock for `operation` ("add", "remove", "compact", ...), or raise
    `IndexLockedError`, naming the process that holds it, at once (or after `wait` seconds of trying).

    An exclusive `flock` on `FOLDER/.writer.lock`: the kernel releases it when its holder exits,
    however it dies, so a killed writer never leaves the index locked. One lock per open file,
    so a second writer in the same process is refused too. The holder writes its pid, operation
    and start time into the file for the refusal message (readers never take the lock), and
    deletes the file when it is done, still holding it: a writer that opened the file before
    that and locks it after finds the name gone or naming another file, and opens it again.
    Once held, what a writer that died left behind is deleted (`remove_unreferenced`)."""
    folder = Path(folder)
    Manifest.load(folder)  # "not an index" before any lock file is created
    path = folder / LOCK
    deadline = time.monotonic() + wait
    for _ in range(3):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.1)
        except BlockingIOError:
            os.close(fd)
            raise IndexLockedError(
                f"{folder} is being updated by another process ({_lock_holder(path)}); an index has one writer "
                "at a time: try again when it has finished"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # locked a file its holder had deleted: take the one the name names now
    else:
        raise IndexLockedError(f"{folder}: could not take the writer lock ({path} keeps changing)")
    try:
        record = {
            "pid": os.getpid(),
            "operation": operation,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.pwrite(fd, json.dumps(record).encode(), 0)
        remove_unreferenced(folder, Manifest.load(folder))
        yield
    finally:
        # still held: see above; only our own file (an overwrite swaps another folder in under the same name)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
        os.close(fd)  # releases the lock


def _lock_holder(path: Path) -> str:
    """ "pid 123, compact since 2026-…" from the lock file, or what is known when it is being written."""
    try:
        record = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        record = {}
    if "pid" not in record:
        return "a writer that is just starting"
    return f"pid {record['pid']}, {record.get('operation', 'an update')} since {record.get('since', '?')}"


@contextlib.contextmanager
def generation_writes(folder: Path, generation: int, segment: Path | None = None) -> Iterator[None]:
    """Write generation `generation`'s files (and the corpus segment folder `segment`): a folder left there by a
    crashed earlier attempt is deleted first (never referenced), and what the block wrote is deleted when it
    fails, leaving the index as it was."""
    if segment is not None and segment.exists():
        shutil.rmtree(segment)
    try:
        yield
    except BaseException:
        if segment is not None:
            shutil.rmtree(segment, ignore_errors=True)
            with contextlib.suppress(OSError):  # `corpora/`, when this segment was its first: as it was
                segment.parent.rmdir()
        for path in folder.glob(f"*.g{generation}.*"):  # written, never referenced
            path.unlink(missing_ok=True)
        raise


def commit(folder: Path, manifest: Manifest, new_files: dict[str, Path], also_written: tuple[Path, ...] = ()) -> None:
    """Record `new_files` (role → written file) in `manifest`, replace `manifest.json` (the
    commit point), then delete what the new manifest no longer names.

    The new files (and `also_written`: a new corpus segment's folder, a segment's own vectors file,
    recorded in `manifest` by the caller) reach the disk before the manifest that names them:
    otherwise a power cut could leave a committed manifest over empty files."""
    for role, path in new_files.items():
        manifest.files[role] = FileRecord.of(path)
    for path in [*new_files.values(), *also_written]:
        fsync_tree(path) if path.is_dir() else fsync_file(path)
    manifest.save(folder)  # a version-1 index that takes an edit is written as the current version
    fsync_directory(folder)  # the manifest's rename
    remove_unreferenced(folder, manifest)


def remove_unreferenced(folder: Path, manifest: Manifest) -> list[str]:
    """Delete the generation files and corpus segment folders of `folder` that `manifest` does
    not name (superseded by a commit, or left by a writer that died before or after its commit);
    → their names. Only under the writer lock: another writer's files would look the same."""
    named = {record.name for record in manifest.file_records()}
    segments = {(folder / s.corpus).resolve() for s in manifest.segments}
    deleted = []
    for path in folder.iterdir():
        if path.is_file() and _GENERATION_FILE.fullmatch(path.name) and path.name not in named:
            path.unlink(missing_ok=True)
            deleted.append(path.name)
    corpora = folder / "corpora"
    for path in corpora.iterdir() if corpora.is_dir() else ():
        if _SEGMENT_DIR.fullmatch(path.name) and path.resolve() not in segments:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(f"corpora/{path.name}")
    return deleted
