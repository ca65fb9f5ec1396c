"""The on-disk format of an index folder (see `retriever.index`): the manifest, the files it lists,
and the checks that name a missing, truncated, corrupted or mismatched file instead of crashing on it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import faiss
import numpy as np

from retriever.corpus import Corpus
from retriever.fingerprint import hash_file
from retriever.index_types import index_type
from tasks.io import atomic_write_json

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class InvalidIndexError(ValueError):
    """An index folder that cannot be used as it is; the message says which file and why."""


class EncoderMismatchError(InvalidIndexError):
    """The encoder offered for search is not the one the index was built with."""


class CorpusMismatchError(InvalidIndexError):
    """The corpus offered is not the one the index was built on."""


def read_manifest(path: str | os.PathLike) -> dict:
    """The parsed `manifest.json` of an index folder, with a clear error when absent or corrupt."""
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{path} is not an index (no {MANIFEST}); build one with `atlas index build`"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidIndexError(f"{manifest_path}: corrupted manifest ({e})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise InvalidIndexError(
            f"{manifest_path}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}"
        )
    return manifest


def file_record(path: Path) -> dict:
    """Size and SHA-256 of a file, as stored in the manifest."""
    return {"name": path.name, "bytes": path.stat().st_size, "sha256": hash_file(path)}


def check_file(folder: Path, record: dict, *, verify_hash: bool) -> Path:
    """Raise `InvalidIndexError` naming the file when it is missing, truncated or (optionally) corrupted."""
    path = folder / record["name"]
    if not path.is_file():
        raise InvalidIndexError(f"{path}: missing index file")
    size = path.stat().st_size
    if size != record["bytes"]:
        raise InvalidIndexError(
            f"{path}: truncated or altered ({size} bytes, manifest says {record['bytes']})"
        )
    if verify_hash and hash_file(path) != record["sha256"]:
        raise InvalidIndexError(f"{path}: corrupted (SHA-256 differs from the manifest)")
    return path


def check_encoder(
    manifest: dict, fingerprint: str, where: str, *, allow_mismatch: bool = False
) -> None:
    """Refuse an encoder whose passage fingerprint differs from the one the index was built with."""
    if fingerprint != manifest["encoder_fingerprint"] and not allow_mismatch:
        raise EncoderMismatchError(
            f"{where}: the index was built with passage encoder {manifest['encoder_fingerprint'][:12]}… but "
            f"the encoder given has fingerprint {fingerprint[:12]}…; its vectors would not be comparable. "
            "Rebuild the index with this encoder (or pass --allow-encoder-mismatch if you know better)"
        )


def open_corpus(folder: Path, segment: dict, override: str | os.PathLike | None = None) -> Corpus:
    """Open a segment's corpus (relative paths are inside the index) and check its fingerprint."""
    path = Path(override) if override is not None else folder / segment["corpus"]
    corpus = Corpus.load(path)
    if corpus.fingerprint != segment["fingerprint"]:
        raise CorpusMismatchError(
            f"corpus {path} (fingerprint {corpus.fingerprint[:12]}…) is not the corpus the index {folder} was "
            f"built on (fingerprint {segment['fingerprint'][:12]}…); build an index for it with `atlas index build`"
        )
    if len(corpus) != segment["count"]:
        raise CorpusMismatchError(
            f"corpus {path} has {len(corpus)} passages, the index expects {segment['count']}"
        )
    return corpus


def check_rerank(manifest: dict, folder: Path, rerank: int | None, *, has_vectors: bool) -> int:
    """The re-rank width k' to search with: `rerank` if given, else the manifest's (0: off).

    Raises `ValueError` for a negative k', and `InvalidIndexError` naming the index and the
    missing `files.vectors` entry when a compressed index is asked to re-rank without its
    float16 vectors (`Flat` is exact already: k' is ignored there)."""
    value = manifest.get("rerank", 0) if rerank is None else rerank
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        source = f"{folder / MANIFEST}: field rerank" if rerank is None else "rerank"
        raise ValueError(f"{source} must be an integer k' >= 0 (0 = off), got {value!r}")
    if manifest.get("spec") == "Flat":
        return 0
    if value and not has_vectors:
        raise InvalidIndexError(
            f"{folder}: re-ranking {value} candidates needs the float16 vectors file, but "
            f"{MANIFEST} lists none (files.vectors; spec {manifest.get('spec')}, built without "
            "--keep-embeddings); rebuild with `atlas index build --rerank K` (which keeps them) "
            "or search without --rerank"
        )
    return value


def index_summary(manifest: dict) -> dict:
    """The manifest without file hashes, plus total bytes on disk and bytes per live passage."""
    size = sum(r["bytes"] for r in manifest["files"].values())
    return {
        **{k: v for k, v in manifest.items() if k != "files"},
        "bytes_on_disk": size,
        "bytes_per_passage": round(size / max(manifest["count"], 1), 2),
        "files": {role: r["name"] for role, r in manifest["files"].items()},
    }


def load_npy(path: Path, mmap_mode: str | None = None) -> np.ndarray:
    """A saved array (memory-mapped with `mmap_mode`); `InvalidIndexError` naming the file when unreadable."""
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InvalidIndexError(f"{path}: unreadable array ({e})") from None


def read_faiss(path: Path, *, io_flags: int = 0) -> faiss.Index:
    """Read a FAISS index file with `io_flags` (`index_types.faiss_read_flags`: memory-mapped
    and read-only for the index's family, or 0: into memory, writable).

    No silent fallback: a file FAISS cannot read with these flags raises `InvalidIndexError`
    naming it (truncated, corrupted, or not of the family the manifest says).
    """
    try:
        return faiss.read_index(str(path), io_flags)
    except RuntimeError as e:
        raise InvalidIndexError(
            f"{path}: unreadable FAISS index ({str(e).splitlines()[0]})"
        ) from None


def write_manifest(folder: Path, manifest: dict) -> None:
    """Atomically replace the manifest (the commit point of every build and update)."""
    atomic_write_json(folder / MANIFEST, manifest)


def index_type_of(manifest: dict):
    """The registry entry (retriever.index_types.INDEX_TYPES) of a manifest's spec."""
    return index_type(manifest["spec"], manifest["dim"])
