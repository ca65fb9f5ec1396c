"""Update a saved index in place, atomically: add passages, remove passages.

Neither re-embeds the passages already indexed. `add_passages` embeds only the new ones
and appends them as a new corpus segment; `remove_passages` marks positions removed (search
never returns them; their vectors stay in the files until the index is rebuilt). Replacing a
passage is one `add_passages(..., remove=[its id])`: the old version is removed and the new
one added in the same commit. Every update writes next-generation files, flushes them to disk,
and then atomically replaces `manifest.json`: a crash (even kill -9 or a power cut) leaves
either the previous index or the new one, never a mix, and the superseded files are deleted
afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from numpy.lib.format import open_memmap

from retriever.corpus import Corpus, prepare_corpus
from retriever.index import PassageIndex
from retriever.index_files import file_record, write_manifest


@dataclass
class UpdateStats:
    """What an update changed."""

    added: int = 0
    removed: int = 0
    already_removed: int = 0
    count: int = 0  # live passages after the update


def _fsync(path: Path) -> None:
    """Flush a written file, or every file of a written folder and the folder itself, to disk."""
    paths = [*sorted(p for p in path.rglob("*") if p.is_file()), path] if path.is_dir() else [path]
    for item in paths:
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(folder: Path, manifest: dict, new_files: dict[str, Path], new_dirs: tuple[Path, ...] = ()) -> None:
    """Record `new_files` (role → written file) in the manifest, replace it, drop superseded files.

    The new files (and `new_dirs`, e.g. a new corpus segment) reach the disk before the manifest
    that names them: otherwise a power cut could leave a committed manifest over empty files."""
    old_names = {role: rec["name"] for role, rec in manifest["files"].items()}
    for role, path in new_files.items():
        manifest["files"][role] = file_record(path)
    for path in [*new_files.values(), *new_dirs]:
        _fsync(path)
    write_manifest(folder, manifest)
    _fsync(folder)  # the manifest's rename
    for role, name in old_names.items():
        if manifest["files"][role]["name"] != name:
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()


def _live_positions_of(index: PassageIndex, ids: list[str]) -> dict[str, list[int]]:
    """For each id, its positions in the index that are not removed (any segment)."""
    found: dict[str, list[int]] = {}
    for segment, corpus in zip(index.manifest["segments"], index.corpora):
        present = [i for i in ids if i in corpus]
        if not present:
            continue
        positions = corpus.rows_for_ids(present) + segment["offset"]
        for passage_id, position in zip(present, positions):
            if not index.removed[position]:
                found.setdefault(passage_id, []).append(int(position))
    return found


def add_passages(
    index_path: str | os.PathLike,
    new: list[str | os.PathLike],
    retriever,
    *,
    batch_size: int = 64,
    chunk_words: int = 100,
    allow_encoder_mismatch: bool = False,
    progress: bool = True,
    remove: Sequence[str] = (),
) -> UpdateStats:
    """Embed the passages of `new` and append them to the index at `index_path`.

    `new` is one prepared corpus folder, or document files (JSONL / TSV) that are prepared
    into `INDEX/corpora/segment-gN/` with `chunk_words`. Passage ids already live in the
    index are refused, unless listed in `remove`: those live passages are marked removed in
    the same commit, so that replacing a passage (remove + add under the same id) is atomic.
    An id of `remove` that is not live raises `KeyError` naming it (nothing is changed).
    """
    folder = Path(index_path)
    # verified in full: the new files are derived from these bytes, and an update reads and
    # rewrites all of them anyway
    index = PassageIndex.load(
        folder,
        retriever=retriever,
        allow_encoder_mismatch=allow_encoder_mismatch,
        mmap=False,
        verify=True,
    )
    manifest = index.manifest
    generation = manifest["generation"] + 1
    created_segment: Path | None = None
    if len(new) == 1 and (Path(new[0]) / "corpus.json").is_file():
        segment_path = str(Path(new[0]).resolve())
    else:
        created_segment = folder / "corpora" / f"segment-g{generation}"
        if created_segment.exists():  # left by a crashed earlier attempt: never referenced
            shutil.rmtree(created_segment)
        prepare_corpus(
            [str(p) for p in new], created_segment, chunk_words=chunk_words, progress=progress
        )
        segment_path = str(created_segment.relative_to(folder))
    try:
        replaced = _live_positions_of(index, list(dict.fromkeys(remove)))
        missing = [i for i in dict.fromkeys(remove) if i not in replaced]
        if missing:
            shown = ", ".join(repr(i) for i in missing[:5])
            raise KeyError(f"{len(missing)} id(s) to replace are not live in the index {folder}: {shown}")
        corpus = Corpus.load(folder / segment_path)
        clashes = {i: p for i, p in _live_positions_of(index, list(corpus.dataset["id"])).items()
                   if i not in replaced}
        if clashes:
            shown = ", ".join(repr(i) for i in list(clashes)[:5])
            raise ValueError(
                f"{len(clashes)} passage id(s) are already in the index {folder} (e.g. {shown}); "
                "remove them first (`atlas index remove`) to replace them"
            )
        new_vectors = np.concatenate(
            [
                retriever.embed_passages(batch, batch_size=batch_size, progress=progress)
                for _, batch in corpus.iter_batches(8192)
            ]
        ).astype(np.float16)
        old_total, n_new = manifest["total"], len(corpus)
        written: dict[str, Path] = {}
        if "vectors" in manifest["files"]:
            path = folder / f"vectors.g{generation}.npy"
            merged = open_memmap(
                path, mode="w+", dtype=np.float16, shape=(old_total + n_new, manifest["dim"])
            )
            for start in range(0, old_total, 65536):
                stop = min(start + 65536, old_total)
                merged[start:stop] = index.vectors[start:stop]
            merged[old_total:] = new_vectors
            merged.flush()
            del merged
            written["vectors"] = path
        if "faiss" in manifest["files"]:
            faiss_index = index.faiss_index  # loaded writable (mmap=False) above
            faiss_index.add(new_vectors.astype(np.float32))
            path = folder / f"index.g{generation}.faiss"
            faiss.write_index(faiss_index, str(path))
            written["faiss"] = path
        removed = np.concatenate([index.removed, np.zeros(n_new, dtype=bool)])
        for positions in replaced.values():
            removed[positions] = True
        path = folder / f"removed.g{generation}.npy"
        np.save(path, removed)
        written["removed"] = path
    except BaseException:
        if created_segment is not None:
            shutil.rmtree(created_segment, ignore_errors=True)
        raise
    manifest["segments"].append(
        {
            "corpus": segment_path,
            "fingerprint": corpus.fingerprint,
            "count": n_new,
            "offset": old_total,
        }
    )
    n_replaced = sum(len(positions) for positions in replaced.values())
    manifest.update(total=old_total + n_new, count=manifest["count"] + n_new - n_replaced, generation=generation)
    _commit(folder, manifest, written, (created_segment,) if created_segment is not None else ())
    return UpdateStats(added=n_new, removed=n_replaced, count=manifest["count"])


def read_id_file(path: str | os.PathLike) -> list[str]:
    """Passage ids, one per line (blank lines ignored)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


def remove_passages(index_path: str | os.PathLike, ids: list[str]) -> UpdateStats:
    """Mark the passages with these ids removed from the index at `index_path`.

    An id that is in none of the index's corpora raises `KeyError` naming it (nothing is
    changed); an id already removed is counted in `already_removed`.
    """
    folder = Path(index_path)
    index = PassageIndex.load(folder, mmap=True, verify=False)
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
    generation = manifest["generation"] + 1
    path = folder / f"removed.g{generation}.npy"
    np.save(path, removed)
    n_removed = int(removed.sum() - index.removed.sum())
    manifest.update(count=manifest["count"] - n_removed, generation=generation)
    _commit(folder, manifest, {"removed": path})
    return UpdateStats(
        removed=n_removed, already_removed=len(unique_ids) - len(live), count=manifest["count"]
    )
