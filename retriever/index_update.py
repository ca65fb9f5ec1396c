"""Update a saved index in place, atomically: add passages, remove passages.

Neither re-embeds the passages already indexed. `add_passages` embeds only the new ones
and appends them as a new corpus segment; `remove_passages` marks positions removed (search
never returns them; their vectors stay in the files until the index is rebuilt). Every
update writes next-generation files and then atomically replaces `manifest.json`: a crash
leaves the previous index intact, and the superseded files are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from numpy.lib.format import open_memmap

from retriever.corpus import Corpus, prepare_corpus
from retriever.index import PassageIndex, file_record, write_manifest


@dataclass
class UpdateStats:
    """What an update changed."""

    added: int = 0
    removed: int = 0
    already_removed: int = 0
    count: int = 0  # live passages after the update


def _commit(folder: Path, manifest: dict, new_files: dict[str, Path]) -> None:
    """Record `new_files` (role → written file) in the manifest, replace it, drop superseded files."""
    old_names = {role: rec["name"] for role, rec in manifest["files"].items()}
    for role, path in new_files.items():
        manifest["files"][role] = file_record(path)
    write_manifest(folder, manifest)
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
) -> UpdateStats:
    """Embed the passages of `new` and append them to the index at `index_path`.

    `new` is one prepared corpus folder, or document files (JSONL / TSV) that are prepared
    into `INDEX/corpora/segment-gN/` with `chunk_words`. Passage ids already live in the
    index are refused (remove them first, to replace a passage).
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
        corpus = Corpus.load(folder / segment_path)
        clashes = _live_positions_of(index, list(corpus.dataset["id"]))
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
        path = folder / f"removed.g{generation}.npy"
        np.save(path, np.concatenate([index.removed, np.zeros(n_new, dtype=bool)]))
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
    manifest.update(total=old_total + n_new, count=manifest["count"] + n_new, generation=generation)
    _commit(folder, manifest, written)
    return UpdateStats(added=n_new, count=manifest["count"])


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
