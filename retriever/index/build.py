"""Build a passage index, resumably: embed the corpus chunk by chunk, then index the vectors.

Embeddings go into a float16 `.npy` memmap in a work folder beside the output
(`OUT.building/`), one chunk of `chunk_size` passages at a time, in blocks of passages of
nearly one length (`BLOCK_ORDER`); after each block the memmap is flushed and `progress.json`
is atomically rewritten. Kill the build at any moment and the same call continues after the
last recorded block. Each chunk's vectors depend only on its passages and the batch size, and
the creation time is kept from the first attempt, so a resumed build writes the same bytes as
an uninterrupted one.

A finished build can be published to a cache beside its corpus (`publish_to_cache`) and
linked into another folder later (`cached_index`, `link_index`): `atlas.run_index.prepare_index`
does so for training runs given `index.corpus`, so that the same index is not built twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
from numpy.lib.format import open_memmap

from common.io import atomic_directory, atomic_write_json
from common.progress import progress_bar as tqdm
from retriever.corpus import Corpus
from retriever.fingerprint import hash_json
from retriever.index.embedding import embed_passages, embedding_precision
from retriever.index.files import writer_lock
from retriever.index.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    BuildSettings,
    EncoderSettings,
    FileRecord,
    Manifest,
    Segment,
)
from retriever.index.rerank import gather_rows
from retriever.index.settings import DEFAULTS, IndexSettings
from retriever.index.types import build_faiss_index, index_type
from retriever.index.vectors import EncoderRecord, copy_checked, read_encoder_record, record_path, write_encoder_record

PROGRESS = "progress.json"
# Passages embedded between two progress records inside a chunk: seconds of MiniLM on a laptop CPU, so a
# killed build loses at most that much whatever `chunk_size` is, and the progress bar moves as often. A
# block's vectors depend only on its passages and the batch size (a block is a fixed slice of its chunk's
# `chunk_order`, computed again on resume), so a build resumed mid-chunk writes the same bytes as an
# uninterrupted one.
BLOCK_ROWS = 512
# The order in which a chunk's passages are cut into blocks. "length": longest first by the tokens each passage is
# embedded with (the retriever's `passage_lengths`, the key its own batches are sorted by: the characters of the text
# order 100-word passages too loosely to help), ties in row order, so that a block holds passages of nearly one length
# and the encoder's batches pad to little more than their own (docs/results/indexes.md, "Index builds"). "corpus": row
# order, as builds did before; kept as the baseline of bench/index_build_order.py. Recorded in the work folder: a
# build resumes only in the order it was started in.
BLOCK_ORDERS = ("length", "corpus")
BLOCK_ORDER = "length"


def work_dir_for(out: str | os.PathLike) -> Path:
    """The folder holding a build's partial embeddings and progress (removed on success)."""
    out = Path(out)
    return out.with_name(out.name + ".building")


def embed_corpus(
    corpus: Corpus,
    retriever,
    work_dir: Path,
    *,
    batch_size: int = DEFAULTS.batch_size,
    chunk_size: int = DEFAULTS.chunk_size,
    progress: bool = True,
    restart: bool = False,
    on_chunk: Callable[[int], None] | None = None,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    precision: str = "fp32",
    block_order: str = BLOCK_ORDER,
) -> tuple[Path, dict]:
    """Embed every passage of `corpus` into `work_dir/vectors.npy` ((N, d) float16) at `precision` ("fp32" or
    "bf16": `embedding.embedding_precision`), resumably, each chunk in blocks of BLOCK_ROWS passages taken in
    `block_order` (`BLOCK_ORDERS`; "length" asks `retriever.passage_lengths`: `chunk_order`) and written at their
    rows.

    With `world_size` > 1 (under torchrun, `work_dir` on a file system all ranks share), rank r
    embeds chunks r, r + N, r + 2N, … into the same file and records its own progress, so the
    result is the single-process file byte for byte; `barrier` synchronises the ranks.

    Returns the file and the progress record. A work folder left by an earlier attempt is
    resumed when it was started with the same encoder, corpus, chunk and batch size and block order;
    otherwise `ValueError` says what differs (`restart=True` discards it). `on_chunk(i)` is
    called after chunk i is durably recorded (progress reporting; tests stop builds there).
    """
    if block_order not in BLOCK_ORDERS:
        raise ValueError(f"block_order {block_order!r}: valid: {', '.join(BLOCK_ORDERS)}")
    settings = {
        "encoder_fingerprint": retriever.passage_fingerprint(),
        "corpus_fingerprint": corpus.fingerprint,
        "count": len(corpus),
        "dim": retriever.dim,
        "chunk_size": chunk_size,
        "batch_size": batch_size,
        "block_rows": BLOCK_ROWS,
        "block_order": block_order,
        "embedding_precision": precision,
    }
    vectors_path = work_dir / "vectors.npy"
    if restart and work_dir.exists() and rank == 0:
        shutil.rmtree(work_dir)
    if rank != 0:  # rank 0 creates (or checks) the shared file first
        barrier()
    vectors, state = _open_work_dir(work_dir, settings, (len(corpus), retriever.dim))
    if rank == 0:
        barrier()
    todo, done = _chunks_to_do(work_dir, state, len(corpus), chunk_size, rank=rank, world_size=world_size)
    resumed_rows = state.get("rows_in_chunk", 0) if world_size == 1 else 0  # of the first chunk to do
    done_rows = len(corpus) - sum(min(chunk_size, len(corpus) - c * chunk_size) for c in todo) + resumed_rows
    bar = tqdm(
        total=len(corpus), initial=done_rows, unit="passage", desc="embedding", disable=not progress, dynamic_ncols=True
    )
    for n, chunk in enumerate(todo):
        order = chunk_order(corpus, chunk * chunk_size, chunk_size, retriever, block_order)
        for first in range(resumed_rows if n == 0 else 0, len(order), BLOCK_ROWS):
            rows = order[first : first + BLOCK_ROWS]  # (≤ BLOCK_ROWS,) rows of the corpus, not in row order
            embedded = embed_passages(retriever, corpus.rows(rows), batch_size=batch_size, precision=precision)
            vectors[rows] = embedded.astype(np.float16)
            vectors.flush()  # the data must be on disk before progress says so
            if world_size == 1 and first + len(rows) < len(order):
                state["rows_in_chunk"] = first + len(rows)  # positions of `order` done, not rows
                atomic_write_json(work_dir / PROGRESS, state)
            bar.update(len(rows))
        if world_size == 1:
            state["completed_chunks"], state["rows_in_chunk"] = chunk + 1, 0
            atomic_write_json(work_dir / PROGRESS, state)
        else:
            done.add(chunk)
            atomic_write_json(_rank_progress_file(work_dir, rank, world_size), {"done": sorted(done)})
        if on_chunk is not None:
            on_chunk(chunk)
    bar.close()
    del vectors
    return vectors_path, state


def chunk_order(corpus: Corpus, start: int, chunk_size: int, retriever, block_order: str) -> np.ndarray:
    """The rows of the chunk of `corpus` that begins at row `start` in the order its blocks take them
    (`BLOCK_ORDERS`): (n,) int64, n = min(chunk_size, len(corpus) - start). For "length", longest first by
    `retriever.passage_lengths`, ties in row order (a stable sort: the same order at every attempt). The passages
    are read BLOCK_ROWS at a time, so that a large chunk is never held whole."""
    rows = np.arange(start, min(start + chunk_size, len(corpus)), dtype=np.int64)
    if block_order == "corpus":
        return rows
    lengths = np.concatenate(
        [retriever.passage_lengths(corpus.rows(rows[f : f + BLOCK_ROWS])) for f in range(0, len(rows), BLOCK_ROWS)]
    )
    return rows[np.argsort(-lengths, kind="stable")]


def _open_work_dir(work_dir: Path, settings: dict, shape: tuple[int, int]) -> tuple[np.memmap, dict]:
    """The work folder's vectors memmap (N, d) float16 and progress record: an unfinished build's
    (`ValueError` when it was started with other `settings`), else new ones."""
    vectors_path, progress_path = work_dir / "vectors.npy", work_dir / PROGRESS
    if progress_path.is_file():
        state = json.loads(progress_path.read_text())
        differing = [k for k in settings if state.get(k) != settings[k]]
        if differing:
            raise ValueError(
                f"{work_dir}: an unfinished build with different {', '.join(differing)} is there; "
                "pass --restart to discard it"
            )
        return open_memmap(vectors_path, mode="r+"), state
    work_dir.mkdir(parents=True, exist_ok=True)
    state = {
        **settings,
        "completed_chunks": 0,
        "rows_in_chunk": 0,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    vectors = open_memmap(vectors_path, mode="w+", dtype=np.float16, shape=shape)
    atomic_write_json(progress_path, state)
    return vectors, state


def embed_vectors(
    corpus_path: str | os.PathLike,
    retriever,
    out: str | os.PathLike,
    *,
    batch_size: int = DEFAULTS.batch_size,
    chunk_size: int = DEFAULTS.chunk_size,
    progress: bool = True,
    restart: bool = False,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    encoder_source: str | None = None,
    precision: str | None = None,
) -> Path:
    """Embed the prepared corpus at `corpus_path` into `out` (one (N, d) float16 `.npy`) with its encoder record
    beside it (`retriever.index.vectors`), for `build_index(vectors=out)` on another machine. Resumable and shared by
    ranks as `embed_corpus` is (the work folder is OUT.building/); `out` appears only when complete. `precision`:
    "auto", "fp32", "bf16" or None: the retriever's own setting (`retriever.index.embedding`)."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists")
    precision = embedding_precision(retriever, precision)
    work_dir = work_dir_for(out)
    vectors_path, _ = embed_corpus(
        Corpus.load(corpus_path),
        retriever,
        work_dir,
        batch_size=batch_size,
        chunk_size=chunk_size,
        progress=progress,
        restart=restart,
        rank=rank,
        world_size=world_size,
        barrier=barrier,
        precision=precision,
    )
    barrier()  # every chunk is embedded
    if rank == 0:
        write_encoder_record(out, EncoderRecord.of(retriever, encoder_source, precision))
        os.replace(vectors_path, out)  # the commit: the record is there before the vectors appear
        shutil.rmtree(work_dir)
    barrier()
    return out


def _rank_progress_file(work_dir: Path, rank: int, world_size: int) -> Path:
    return work_dir / f"progress.rank{rank}-of-{world_size}.json"


def _chunks_to_do(
    work_dir: Path, state: dict, count: int, chunk_size: int, *, rank: int, world_size: int
) -> tuple[list[int], set[int]]:
    """(the chunks this rank still has to embed, the chunks it has done): one process resumes after
    the last completed chunk; rank r of N takes chunks r, r + N, … not in its own progress file."""
    n_chunks = -(-count // chunk_size)
    if world_size == 1:
        return list(range(state["completed_chunks"], n_chunks)), set()
    rank_progress = _rank_progress_file(work_dir, rank, world_size)
    done = set(json.loads(rank_progress.read_text())["done"]) if rank_progress.is_file() else set()
    return [c for c in range(rank, n_chunks, world_size) if c not in done], done


def train_and_fill(
    spec: str,
    vectors: np.ndarray,
    *,
    train_sample: int = DEFAULTS.train_sample,
    seed: int = DEFAULTS.seed,
    add_chunk: int = 65536,
    on_added: Callable[[int], None] | None = None,
    on_trained: Callable[[faiss.Index], None] | None = None,
) -> faiss.Index:
    """A FAISS index of `spec` (inner product) trained on a seeded sample of `vectors` and
    filled with all of them, chunk by chunk. `on_trained(index)` is called with the trained, still
    empty index before any vector is added (the build keeps it: an edit fills a copy of it).

    vectors: (N, d) float16/32 — an array, a memmap, or any object with `.shape` that returns
    float rows for `vectors[start:stop]` and for a sorted int64 array of rows (the scale
    benchmark passes generated vectors). `on_added(n)` is called after each chunk with the
    number of vectors added so far (progress)."""
    n, dim = vectors.shape
    index = build_faiss_index(spec, dim, "ip")
    if index_type(spec, dim).needs_training:
        rng = np.random.default_rng(seed)
        sample = np.sort(rng.choice(n, size=min(train_sample, n), replace=False))
        index.train(np.asarray(_rows(vectors, sample), dtype=np.float32))
    if on_trained is not None:
        on_trained(index)
    for start in range(0, n, add_chunk):
        index.add(np.asarray(_rows(vectors, np.arange(start, min(start + add_chunk, n))), dtype=np.float32))
        if on_added is not None:
            on_added(min(start + add_chunk, n))
    return index


def _rows(vectors, rows: np.ndarray) -> np.ndarray:
    """vectors[rows] (sorted rows); from a memory-mapped file by `pread` (`rerank.gather_rows`), so that reading
    every row once to build an index does not leave the whole file in this process's resident memory."""
    return gather_rows(vectors, rows) if isinstance(vectors, np.memmap) else np.asarray(vectors[rows])


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link `source` at `target` (no copy on one file system), else copy it."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def build_index(
    corpus_path: str | os.PathLike,
    retriever,
    out: str | os.PathLike,
    settings: IndexSettings = DEFAULTS,
    *,
    progress: bool = True,
    overwrite: bool = False,
    restart: bool = False,
    on_chunk: Callable[[int], None] | None = None,
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    encoder_source: str | None = None,
    vectors: str | os.PathLike | None = None,
    encoder_record: EncoderRecord | None = None,
    precision: str | None = None,
) -> Path:
    """Embed the prepared corpus at `corpus_path` with `retriever`'s passage encoder and save
    an index at `out` as `settings` say (written atomically). Resumable: see `embed_corpus`.

    `vectors`: the corpus's passage vectors computed elsewhere (`retriever.index.vectors`: a `.npy` or a folder of
    shards, in corpus order), checked (count, dimension, finite rows) and indexed instead of embedding; the
    encoder that made them is `encoder_record`, else the record beside them, else `retriever`'s (which may
    then be None); a record and a retriever that disagree are refused.

    A `Flat` index is the float16 embeddings themselves (searched in chunks by `exact_search`); any
    other spec saves only its FAISS index unless `settings.keep_embeddings`, or `exact_rerank` = k' > 0: then the
    float16 vectors are kept too and search re-scores the index's k' candidates exactly from them
    (memory-mapped; recorded in the manifest, overridable at load). `encoder_source` (the
    path or name the retriever was loaded from) is recorded so search can default to it. `precision`: what the
    passages are embedded at, "auto", "fp32", "bf16" or None: the retriever's own setting (`retriever.index.embedding`;
    recorded in the manifest).
    """
    # long: one resumable build, its steps in order (check, embed, train, add, write, publish) so that what a restart
    # skips reads at a glance
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    if rank == 0:
        with _replacing(out, overwrite):  # an index being edited is refused now, not after the embedding
            pass
    record = _encoder_of(retriever, vectors, encoder_record, encoder_source, embedding_precision(retriever, precision))
    spec = settings.spec.strip()
    index_type(spec, record.dim)  # reject a bad spec before minutes of embedding
    corpus = Corpus.load(corpus_path)
    work_dir = work_dir_for(out)
    if vectors is not None:
        if world_size > 1:
            raise ValueError("an index of given vectors is built by one process (there is nothing to embed)")
        vectors_path, state = _import_vectors(vectors, corpus, record, work_dir, progress=progress)
    else:
        vectors_path, state = embed_corpus(
            corpus,
            retriever,
            work_dir,
            batch_size=settings.batch_size,
            chunk_size=settings.chunk_size,
            progress=progress,
            restart=restart,
            on_chunk=on_chunk,
            rank=rank,
            world_size=world_size,
            barrier=barrier,
            precision=record.embedding_precision,
        )
    barrier()  # every chunk is embedded
    if rank != 0:  # rank 0 alone trains the FAISS index and writes the folder
        barrier()
        return out
    with _replacing(out, overwrite), atomic_directory(out, overwrite=overwrite) as tmp:
        files = _write_index_files(tmp, spec, vectors_path, settings)
        Manifest(
            spec=spec,
            dim=record.dim,
            count=len(corpus),
            total=len(corpus),
            encoder_fingerprint=record.fingerprint,
            encoder=EncoderSettings(record.source, record.passage_format, record.passage_maxlength),
            embedding_precision=record.embedding_precision,
            segments=[_base_segment(corpus_path, corpus, record.embedding_precision)],
            files=files,
            keep_embeddings="vectors" in files,
            exact_rerank=settings.rerank_width,
            nprobe=settings.nprobe,
            ef_search=settings.ef_search,
            train_sample=settings.train_sample,
            seed=settings.seed,
            faiss_version=faiss.__version__,
            created=state["created"],
            build=BuildSettings(batch_size=settings.batch_size, chunk_size=settings.chunk_size)
            if vectors is None
            else BuildSettings(vectors=str(Path(vectors).resolve())),
        ).save(tmp)
    shutil.rmtree(work_dir)
    barrier()  # the folder is complete: release the other ranks
    return out


# How long an overwrite waits for an edit of the index it replaces to finish (edits take seconds)
REPLACE_WAIT_SECONDS = 60.0


def _replacing(out: Path, overwrite: bool):
    """The writer lock of the index an overwrite replaces, held while the new folder is swapped in: an edit in
    progress finishes first (or the build is refused naming it), and no edit starts writing into a folder that is
    being swapped away. Nothing to hold for a new folder."""
    if overwrite and (out / MANIFEST).is_file():
        return writer_lock(out, "build --overwrite", wait=REPLACE_WAIT_SECONDS)
    return contextlib.nullcontext()


def _base_segment(corpus_path: str | os.PathLike, corpus: Corpus, precision: str) -> Segment:
    """The segment of the corpus an index is built on (where it was prepared: outside the index folder)."""
    return Segment.of(corpus, str(Path(corpus_path).resolve()), 0, precision)


def _encoder_of(
    retriever, vectors: str | os.PathLike | None, given: EncoderRecord | None, source: str | None, precision: str
) -> EncoderRecord:
    """The passage encoder an index is built with, and the precision its vectors are embedded at: `given`, else
    the record beside `vectors`, else the retriever's at `precision`; ValueError where a record and the retriever
    name different encoders, or there is neither."""
    record = given or (read_encoder_record(vectors) if vectors is not None else None)
    if retriever is None:
        if record is None:
            where = record_path(vectors) if vectors is not None else "the arguments"
            raise ValueError(f"no encoder for these vectors: {where} does not exist; give the encoder (--encoder)")
        return record
    own = EncoderRecord.of(retriever, source, precision)
    if record is not None and record.fingerprint != own.fingerprint:
        raise ValueError(
            f"{record_path(vectors) if vectors is not None else 'the encoder record'}: the vectors were made by "
            f"passage encoder {record.fingerprint[:12]}, not by the given encoder ({own.fingerprint[:12]})"
        )
    return record if record is not None else own


def _import_vectors(
    vectors: str | os.PathLike, corpus: Corpus, record: EncoderRecord, work_dir: Path, *, progress: bool
) -> tuple[Path, dict]:
    """The given vectors checked and copied into `work_dir/vectors.npy` (float16): the embedding step of a
    build of vectors computed elsewhere. A copy killed half-way is done again (it is quick next to embedding)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = copy_checked(vectors, work_dir / "vectors.npy", count=len(corpus), dim=record.dim, progress=progress)
    state = {
        "encoder_fingerprint": record.fingerprint,
        "corpus_fingerprint": corpus.fingerprint,
        "count": len(corpus),
        "dim": record.dim,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(work_dir / PROGRESS, state)
    return path, state


def _write_index_files(folder: Path, spec: str, vectors_path: Path, settings: IndexSettings) -> dict[str, FileRecord]:
    """Generation 1's files in `folder`: the FAISS index (any spec but Flat) and its trained, empty form (a spec
    whose edits append parts: `IndexType.appends`), the float16 vectors (Flat, or kept), no row removed. Returns
    their records for the manifest's `files`."""
    vectors = np.load(vectors_path, mmap_mode="r")
    files: dict[str, FileRecord] = {}
    if spec != "Flat":
        keeps_trained = index_type(spec, vectors.shape[1]).appends == "part"

        def keep_trained(index: faiss.Index) -> None:  # what an edit fills with its new rows (`update`)
            faiss.write_index(index, str(folder / "trained.g1.faiss"))

        index = train_and_fill(
            spec,
            vectors,
            train_sample=settings.train_sample,
            seed=settings.seed,
            on_trained=keep_trained if keeps_trained else None,
        )
        faiss.write_index(index, str(folder / "index.g1.faiss"))
        files["faiss"] = FileRecord.of(folder / "index.g1.faiss")
        if keeps_trained:
            files["trained"] = FileRecord.of(folder / "trained.g1.faiss")
    if spec == "Flat" or settings.keeps_vectors:
        link_or_copy(vectors_path, folder / "vectors.g1.npy")
        files["vectors"] = FileRecord.of(folder / "vectors.g1.npy")
    np.save(folder / "removed.g1.npy", np.zeros(len(vectors), dtype=bool))
    files["removed"] = FileRecord.of(folder / "removed.g1.npy")
    return files


# ---------------------------------------------------------------- the build cache beside a corpus
# A training run given `index.corpus` needs an index of it made with its passage encoder. The
# same corpus, encoder and settings give the same index, so a finished build is published to
# CORPUS/.atlas-index-cache/KEY/ (KEY: the hash of `build_settings`) and later runs link its
# files into their own folder instead of embedding the corpus again (atlas/run_index.py).
CACHE_DIR = ".atlas-index-cache"
BUILD_SETTINGS = "build-settings.json"


def build_settings(corpus: Corpus, retriever, settings: IndexSettings = DEFAULTS, precision: str | None = None) -> dict:
    """Everything that fixes what `build_index` writes, as the arguments it takes: the
    corpus's and the passage encoder's fingerprints, the spec, what is kept, and the batching
    (a chunk's vectors depend on its batches). The training sample and seed count only for
    specs that are trained. Search-time settings (nprobe, ef_search) are not in it: they are
    given at load."""
    trained = index_type(settings.spec, retriever.dim).needs_training
    return {
        "format_version": FORMAT_VERSION,
        "faiss_version": faiss.__version__,
        "corpus_fingerprint": corpus.fingerprint,
        "encoder_fingerprint": retriever.passage_fingerprint(),
        "dim": retriever.dim,
        "spec": settings.spec.strip(),
        "keep_embeddings": settings.keeps_vectors,
        "exact_rerank": settings.rerank_width,
        "batch_size": settings.batch_size,
        "chunk_size": settings.chunk_size,
        "train_sample": settings.train_sample if trained else None,
        "seed": settings.seed if trained else None,
        "embedding_precision": embedding_precision(retriever, precision),
    }


def cache_folder(corpus_path: str | os.PathLike, settings: dict) -> Path:
    """Where an index of the corpus at `corpus_path` built with `settings` is cached."""
    return Path(corpus_path) / CACHE_DIR / hash_json(settings)[:16]


def cached_index(corpus_path: str | os.PathLike, settings: dict) -> Path | None:
    """The cache folder when it holds a finished index built with exactly `settings`, else None.

    A folder only ever appears complete (`publish_to_cache` renames it into place), so a
    killed build or publish leaves nothing that is found here."""
    folder = cache_folder(corpus_path, settings)
    try:
        recorded = json.loads((folder / BUILD_SETTINGS).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return folder if recorded == settings and (folder / MANIFEST).is_file() else None


def publish_to_cache(index_folder: str | os.PathLike, corpus_path: str | os.PathLike, settings: dict) -> Path | None:
    """Put a just-built, never-updated index into the cache beside its corpus; its folder.

    The data files are hard-linked (no copy, no extra disk) into a temporary folder beside the
    cache entry, which is then renamed into place: the first publisher wins and a concurrent
    one keeps its own copy only. Returns None, publishing nothing, where the files cannot be
    linked (the corpus folder is read-only, or on another file system than the index)."""
    folder = cache_folder(corpus_path, settings)
    if cached_index(corpus_path, settings) is not None:
        return folder
    source = Path(index_folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    except OSError:
        return None
    try:
        manifest = Manifest.load(source)
        for record in manifest.file_records():
            os.link(manifest.path_of(source, record), tmp / record.name)
        manifest.save(tmp)  # a copy: the run's own manifest is replaced by updates
        atomic_write_json(tmp / BUILD_SETTINGS, settings)
        os.rename(tmp, folder)
    except OSError:  # cross-device link, or another publisher got there first
        shutil.rmtree(tmp, ignore_errors=True)
        return folder if cached_index(corpus_path, settings) is not None else None
    return folder


def link_index(
    source: str | os.PathLike,
    target: str | os.PathLike,
    *,
    corpus_path: str | os.PathLike,
    nprobe: int | None = None,
    ef_search: int | None = None,
) -> Path:
    """A copy of the index at `source` written at `target` (atomically): data files hard-linked
    (copied across file systems), the manifest written anew with its base corpus at
    `corpus_path` (and `nprobe` / `ef_search` when given).

    Updating the copy (`atlas index add/update/remove`, `atlas serve` edits) never changes
    `source`: an update writes new files and replaces the manifest; it never writes into a file."""
    source, target = Path(source), Path(target)
    manifest = Manifest.load(source)
    with atomic_directory(target) as tmp:
        for record in manifest.file_records():  # the segments' own files too: an index that took edits
            link_or_copy(manifest.path_of(source, record), tmp / record.name)
        for segment in manifest.segments[1:]:  # segments added by edits, inside the index: linked likewise
            if not Path(segment.corpus).is_absolute():
                corpus = manifest.corpus_path(source, segment)
                shutil.copytree(corpus, tmp / segment.corpus, copy_function=link_or_copy)
        base = manifest.segments[0]
        manifest.segments[0] = _base_segment(corpus_path, Corpus.load(corpus_path), base.embedding_precision)
        if manifest.segments[0].count != base.count or manifest.segments[0].fingerprint != base.fingerprint:
            raise ValueError(f"{corpus_path} is not the corpus the index {source} was built on")
        manifest.segments[0] = dataclasses.replace(manifest.segments[0], vectors=base.vectors, faiss=base.faiss)
        manifest.nprobe = nprobe if nprobe is not None else manifest.nprobe
        manifest.ef_search = ef_search if ef_search is not None else manifest.ef_search
        manifest.save(tmp)
    return target
