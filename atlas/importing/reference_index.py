"""A facebookresearch/atlas saved index → an Arrow corpus and an index of this project.

The reference saves an index as shards in one folder: `embeddings.{i}.pt`, a float16 tensor
of shape (d, n_i) (its index keeps embeddings column-wise), and `passages.{i}.pt`, a plain
pickle of the n_i passage dicts ({"id", "title", "text", "section"?, …}) in the same order.

`import_atlas_index` streams them shard by shard: each shard's vectors are transposed into
rows of a float16 (N, d) memmap and its passages appended to a JSON-lines file, both in the
work folder `INDEX.building/` that `atlas index build` uses; after each shard the progress
is recorded atomically, so a killed import continues after the last completed shard. Only
one shard is in memory at a time (embedding shards are memory-mapped). The passages then
become a corpus (`retriever.corpus.prepare_corpus`, one passage per record, ids kept) and
the vectors an index of any spec (`retriever.index.build.build_index`, which finds every
chunk already embedded): its manifest carries the fingerprint of the imported passage
encoder, so the index is searched only with the encoder the vectors came from. That the
vectors did come from it is checked on the first passages (`_encoder_agreement`, a warning
and a number in the manifest: an index saved before later training legitimately differs).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from numpy.lib.format import open_memmap

from atlas.importing.safe_pickle import load_plain_pickle, load_torch_file
from atlas.loading import resolve_checkpoint
from common.io import InputError, atomic_write_json
from retriever.corpus import prepare_corpus
from retriever.corpus_manifest import CORPUS_MANIFEST, CorpusManifest
from retriever.index.build import BLOCK_ORDER, BLOCK_ROWS, PROGRESS, build_index, work_dir_for
from retriever.index.manifest import Manifest
from retriever.index.settings import DEFAULTS, IndexSettings
from retriever.index.types import index_type
from retriever.retriever import Retriever

STATE_FILE = "import-progress.json"
PASSAGE_FIELDS = ("title", "text", "section", "wikipedia_id")
_COPY_ROWS = 65536  # vectors transposed per copy: bounds the temporary to 64k × d × 2 bytes
# the least cosine, over the first passages, between the imported vectors and the same passages
# embedded again by --encoder, below which a warning says the encoder may not be the index's
# (the reference embedded in fp16 on GPU: its own encoder agrees to ~0.999)
AGREEMENT_SAMPLE, MIN_AGREEMENT = 8, 0.98

logger = logging.getLogger(__name__)


def find_shards(src: str | Path) -> list[tuple[Path, Path]]:
    """The (embeddings, passages) file pairs of a reference index folder, shard 0 first.

    Raises `InputError` naming the missing file when shard numbers have a gap or a shard
    lacks one of its two files.
    """
    src = Path(src)
    if not src.is_dir():
        raise InputError(src, None, None, "not a folder (expected the reference's saved index folder)")
    numbers: dict[str, set[int]] = {"embeddings": set(), "passages": set()}
    for path in src.iterdir():
        match = re.fullmatch(r"(embeddings|passages)\.(\d+)\.pt", path.name)
        if match:
            numbers[match.group(1)].add(int(match.group(2)))
    found = numbers["embeddings"] | numbers["passages"]
    if not found:
        raise InputError(src, None, None, "no embeddings.{i}.pt / passages.{i}.pt shards here")
    for shard in range(max(found) + 1):
        for kind in ("embeddings", "passages"):
            if shard not in numbers[kind]:
                raise InputError(
                    src / f"{kind}.{shard}.pt",
                    None,
                    None,
                    f"missing shard file (shards found: {', '.join(map(str, sorted(found)))})",
                )
    return [(src / f"embeddings.{i}.pt", src / f"passages.{i}.pt") for i in range(max(found) + 1)]


def _embedding_shard(path: Path, dim: int) -> torch.Tensor:
    """A shard's vectors as (n, d): the reference's (d, n) layout transposed (a view, not a copy)."""
    tensor = load_torch_file(path)
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2 or not tensor.is_floating_point():
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise InputError(path, None, None, f"expected a 2-D float tensor (d, n), got {shape}")
    if tensor.shape[0] == dim:
        return tensor.t()
    if tensor.shape[1] == dim:  # forks that store (n, d)
        return tensor
    raise InputError(
        path,
        None,
        None,
        f"shape {tuple(tensor.shape)}: neither dimension is the encoder's embedding size {dim} (expected (d, n))",
    )


def _passage_record(passage, path: Path, entry: int) -> dict[str, str]:
    """One reference passage dict as a corpus document; InputError names file, entry and field."""
    if not isinstance(passage, dict):
        raise InputError(path, entry, None, f"expected a passage dict, got {type(passage).__name__}")
    record = {}
    for field in ("id", *PASSAGE_FIELDS):
        value = passage.get(field)
        if value is None:
            if field in ("id", "text"):
                raise InputError(path, entry, field, "missing required field")
            value = ""
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise InputError(path, entry, field, f"expected a string, got {type(value).__name__}")
        record[field] = str(value)
    for field in ("id", "text"):
        if not record[field].strip():
            raise InputError(path, entry, field, f"empty {field}")
    return record


def _resolve_retriever(encoder: str | Path):
    """The retriever whose passage encoder made the vectors: a run or checkpoint folder
    (its retriever/), a retriever folder (retriever.json), or a plain encoder folder."""
    path = Path(encoder)
    if not path.exists():
        raise FileNotFoundError(f"{path}: encoder folder not found")
    with contextlib.suppress(FileNotFoundError):  # not a run or checkpoint folder
        path = resolve_checkpoint(path) / "retriever"
    return Retriever.from_pretrained(path)


def import_atlas_index(
    src: str | Path,
    *,
    corpus_out: str | Path,
    index_out: str | Path,
    encoder: str | Path,
    settings: IndexSettings = DEFAULTS,
    overwrite: bool = False,
    restart: bool = False,
    progress: bool = True,
    on_shard: Callable[[int], None] | None = None,
) -> tuple[Path, Path]:
    """Import the reference index at `src` as a corpus at `corpus_out` and an index at `index_out` built as
    `settings` say, fingerprinted to the passage encoder of `encoder` (see `_resolve_retriever`).

    Resumable: a call after an interruption continues after the last completed shard
    (`restart=True` starts over). Bad input (a missing shard, an unreadable or unsafe file,
    a shape or count that does not fit, a malformed passage) raises `InputError` naming the
    file, and leaves no output and no work folder. `on_shard(i)` runs after shard i is recorded.
    Returns (corpus folder, index folder).
    """
    # long: the import's steps in the order they run (read, check, convert, write, record), each a few lines; split,
    # they would hand a dozen values from one to the next
    src, corpus_out, index_out = Path(src), Path(corpus_out), Path(index_out)
    shards = find_shards(src)
    own_corpus = _resumable_corpus(corpus_out, index_out)  # written by the interrupted import (before `restart`)
    for path in (corpus_out, index_out):
        if path.exists() and not overwrite and not (path == corpus_out and own_corpus):
            raise FileExistsError(f"{path} already exists (pass --overwrite to replace it)")
    retriever = _resolve_retriever(encoder)
    dim = retriever.dim
    index_type(settings.spec, dim)  # a bad spec fails before any shard is read
    # headers only (memory-mapped): sizes are known before writing
    counts = [int(_embedding_shard(emb_path, dim).shape[0]) for emb_path, _ in shards]
    total = sum(counts)
    source = {
        "source": str(src.resolve()),
        "shards": counts,
        "dim": dim,
        "encoder_fingerprint": retriever.passage_fingerprint(),
    }

    work = work_dir_for(index_out)
    state, vectors, created = _open_work(work, source, total, restart=restart)
    starts = [0, *np.cumsum(counts).tolist()]  # first row of each shard
    try:
        _copy_shards(shards, starts, dim, state, vectors, work, on_shard=on_shard)
    except InputError:
        del vectors
        _discard(work, created)  # bad input: nothing to resume
        raise
    del vectors
    agreement = _encoder_agreement(retriever, work)
    if agreement < MIN_AGREEMENT:
        logger.warning(
            "%s: the first vectors agree with %s's passage encoder only to cosine %.3f: is it the "
            "encoder that built this index (an index saved before later retriever training, or "
            "another retriever.passage_format, also lower it)?",
            shards[0][0],
            encoder,
            agreement,
        )
    if not _resumable_corpus(corpus_out, index_out, state.get("corpus_fingerprint")):
        _write_corpus(
            work,
            corpus_out,
            shards,
            starts,
            state,
            created=created,
            progress=progress,
            overwrite=overwrite or own_corpus,
        )  # a restarted import replaces its own

    # every chunk is already "embedded": build_index only trains/writes the index of `spec`
    atomic_write_json(
        work / PROGRESS,
        {
            "encoder_fingerprint": source["encoder_fingerprint"],
            "corpus_fingerprint": state["corpus_fingerprint"],
            "count": total,
            "dim": dim,
            "chunk_size": settings.chunk_size,
            "batch_size": settings.batch_size,
            "block_rows": BLOCK_ROWS,
            "block_order": BLOCK_ORDER,
            "embedding_precision": "fp32",  # the reference embedded in float32 (and saved float16)
            "completed_chunks": -(-total // settings.chunk_size),
            "created": state["created"],
        },
    )
    build_index(
        corpus_out,
        retriever,
        index_out,
        settings,
        progress=progress,
        overwrite=overwrite,
        encoder_source=str(Path(encoder).resolve()),
        precision="fp32",
    )
    manifest = Manifest.load(index_out)
    manifest.imported = {
        "source": source["source"],
        "shards": len(shards),
        "encoder_agreement": agreement,
        "format": "facebookresearch/atlas embeddings.{i}.pt + passages.{i}.pt",
    }
    manifest.save(index_out)
    return corpus_out, index_out


def _write_corpus(
    work: Path,
    corpus_out: Path,
    shards: list[tuple[Path, Path]],
    starts: list[int],
    state: dict,
    *,
    created: list[Path],
    progress: bool,
    overwrite: bool,
) -> None:
    """The corpus of the work folder's passages.jsonl at `corpus_out` (one passage per record, ids
    kept, the shards recorded as its sources); its fingerprint goes into the progress record. A
    duplicate id raises `InputError` naming the shard and entry it came from (the work folder removed)."""
    sources = [str(p.resolve()) for _, p in shards]
    try:
        prepare_corpus(
            [work / "passages.jsonl"],
            corpus_out,
            chunk_words=0,
            sources=sources,
            progress=progress,
            overwrite=overwrite,
        )
    except InputError as e:  # name the shard a duplicate id came from, not the work file
        shard = bisect.bisect_right(starts, (e.line or 1) - 1) - 1
        _discard(work, created)
        raise InputError(
            shards[shard][1], (e.line or 1) - 1 - starts[shard], e.field, e.message.split(" (first seen")[0]
        ) from None
    state["corpus_fingerprint"] = CorpusManifest.load(corpus_out).fingerprint
    atomic_write_json(work / STATE_FILE, state)


def _open_work(work: Path, settings: dict, total: int, *, restart: bool) -> tuple[dict, np.memmap, list[Path]]:
    """The import's work folder: its progress record, its (N, d) float16 vectors memmap, and the
    folders this call created (to remove on bad input). An unfinished import with the same
    `settings` is resumed; one with other settings raises `ValueError` (`restart` discards it)."""
    state_path, vectors_path = work / STATE_FILE, work / "vectors.npy"
    if restart and work.exists():
        shutil.rmtree(work)
    if work.exists():
        if not state_path.is_file():
            raise FileExistsError(
                f"{work}: an unfinished `atlas index build` is there; remove it or pick another --index-out"
            )
        state = json.loads(state_path.read_text())
        differing = [k for k in settings if state.get(k) != settings[k]]
        if differing:
            raise ValueError(
                f"{work}: an unfinished import with different {', '.join(differing)} is there; "
                "pass --restart to discard it"
            )
        return state, open_memmap(vectors_path, mode="r+"), []
    created = [p for p in (work, *work.parents) if not p.exists()]
    work.mkdir(parents=True)
    state = {
        **settings,
        "completed_shards": 0,
        "jsonl_bytes": 0,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    vectors = open_memmap(vectors_path, mode="w+", dtype=np.float16, shape=(total, settings["dim"]))
    (work / "passages.jsonl").touch()
    atomic_write_json(state_path, state)
    return state, vectors, created


def _copy_shards(
    shards: list[tuple[Path, Path]],
    starts: list[int],
    dim: int,
    state: dict,
    vectors: np.memmap,
    work: Path,
    *,
    on_shard: Callable[[int], None] | None,
) -> None:
    """Copy shards `state["completed_shards"]`… into the work folder, one at a time: shard i's
    (d, n_i) vectors into rows starts[i]:starts[i+1] of `vectors` ((N, d) float16), its passages
    as lines of passages.jsonl; then the progress record, so a killed import resumes there."""
    with open(work / "passages.jsonl", "r+b") as jsonl:
        jsonl.truncate(state["jsonl_bytes"])  # drop lines of a shard that was not completed
        jsonl.seek(state["jsonl_bytes"])
        for shard in range(state["completed_shards"], len(shards)):
            emb_path, passages_path = shards[shard]
            count = starts[shard + 1] - starts[shard]
            passages = load_plain_pickle(passages_path)
            if not isinstance(passages, list):
                raise InputError(
                    passages_path, None, None, f"expected a list of passages, got {type(passages).__name__}"
                )
            if len(passages) != count:
                raise InputError(
                    passages_path, None, None, f"{len(passages)} passages, but {emb_path.name} holds {count} vectors"
                )
            lines = [
                json.dumps(_passage_record(p, passages_path, entry), ensure_ascii=False) + "\n"
                for entry, p in enumerate(passages)
            ]
            rows = _embedding_shard(emb_path, dim)  # (n_i, d) view of the memory-mapped shard
            for first in range(0, count, _COPY_ROWS):
                block = rows[first : first + _COPY_ROWS].to(torch.float16).numpy()
                vectors[starts[shard] + first : starts[shard] + first + len(block)] = block
            vectors.flush()
            jsonl.write("".join(lines).encode("utf-8"))
            jsonl.flush()
            os.fsync(jsonl.fileno())
            del passages, lines, rows
            state.update(completed_shards=shard + 1, jsonl_bytes=jsonl.tell())
            atomic_write_json(work / STATE_FILE, state)  # after the data: progress never runs ahead of it
            if on_shard is not None:
                on_shard(shard)


def _encoder_agreement(retriever, work: Path) -> float:
    """The least cosine between the first `AGREEMENT_SAMPLE` imported vectors ((k, d) of the work
    folder's vectors.npy) and the same passages embedded by `retriever`'s passage encoder: ~1 when
    the vectors came from that encoder (fp16 rounding aside), lower when they did not."""
    stored = np.load(work / "vectors.npy", mmap_mode="r")[:AGREEMENT_SAMPLE].astype(np.float32)  # (k, d)
    with open(work / "passages.jsonl", encoding="utf-8") as f:
        docs = [json.loads(line) for line, _ in zip(f, range(len(stored)))]
    fresh = retriever.embed_passages(docs)  # (k, d) float32
    cosine = (stored * fresh).sum(1) / np.maximum(np.linalg.norm(stored, axis=1) * np.linalg.norm(fresh, axis=1), 1e-12)
    return round(float(cosine.min()), 4)


def _discard(work: Path, created: list[Path]) -> None:
    """Remove the work folder, and the empty parents this import created for it."""
    shutil.rmtree(work, ignore_errors=True)
    for parent in created[1:]:
        try:
            parent.rmdir()
        except OSError:  # not empty: something else lives there now
            break


def _resumable_corpus(path: Path, index_out: Path, fingerprint: str | None = None) -> bool:
    """Whether `path` is the corpus an interrupted import of `index_out` already wrote (a
    resumed import reuses it instead of refusing an existing output)."""
    state_path = work_dir_for(index_out) / STATE_FILE
    if path == index_out or not (path / CORPUS_MANIFEST).is_file() or not state_path.is_file():
        return False
    expected = fingerprint or json.loads(state_path.read_text()).get("corpus_fingerprint")
    return expected is not None and CorpusManifest.load(path).fingerprint == expected
