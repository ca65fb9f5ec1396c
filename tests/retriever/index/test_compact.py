"""Compaction: the same search results (ids and scores) on every index type, one segment and no dead
rows after it, the policy, crash safety (an exception or kill -9 at any point, a full disk), and
one writer at a time."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from retriever.index import PassageIndex
from retriever.index.build import build_index
from retriever.index.compact import (
    MAX_DEAD_FRACTION,
    MAX_SEGMENTS,
    MIN_DEAD_ROWS,
    compact_if_due,
    compact_index,
    compaction_due,
)
from retriever.index.files import LOCK, IndexLockedError
from retriever.index.manifest import Manifest, Segment
from retriever.index.settings import IndexSettings
from retriever.index.update import add_passages, read_passage_files, remove_passages

REPO = Path(__file__).resolve().parents[3]
N = 2000
# every FAISS family that keeps codes (HNSW rebuilds its graph: tested on its own below)
SPECS = ["Flat", "IVF8,Flat", "IVF8,PQ8", "PQ8", "SQ8", "OPQ8,IVF8,PQ8", "PQ8x4fs", "IVF8,PQ8x4fs"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, make_synthetic_corpus) -> Path:
    return make_synthetic_corpus(tmp_path_factory.mktemp("compact"), N)


def write_passages(path: Path, first: int, count: int) -> Path:
    """Passages s{first}..: the clustered source embeds each by its number."""
    path.write_text(
        "".join(
            json.dumps({"id": f"s{i}", "title": f"T{i}", "text": f"passage {i}"}) + "\n"
            for i in range(first, first + count)
        )
    )
    return path


def edit(folder: Path, source, tmp_path: Path, rounds: int = 3) -> None:
    """`rounds` edits that each add 10 passages (a segment) and remove 67 (some base, some added)."""
    for r in range(rounds):
        add_passages(
            folder,
            read_passage_files([write_passages(tmp_path / "new.jsonl", N + 10 * r, 10)])[0],
            source,
            progress=False,
        )
        remove_passages(folder, [f"s{i}" for i in range(r * 300, r * 300 + 198, 3)] + [f"s{N + 10 * r}"])


def searched(folder: Path, queries: np.ndarray, k: int = 20) -> tuple[np.ndarray, list[list[str]]]:
    index = PassageIndex.load(folder, verify=True)
    scores, rows = index.search_vectors(queries, k)
    return scores, [[p["id"] for p in index.passages(row)] for row in rows]


def live_texts(folder: Path) -> dict[str, str]:
    index = PassageIndex.load(folder)
    return {p["id"]: p["text"] for p in index.passages(np.flatnonzero(~index.removed))}


def files_of(folder: Path) -> list[str]:
    """Every file and folder of an index, relative (what a compaction must leave: the manifest's)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name != LOCK)


@pytest.mark.parametrize("spec", SPECS)
def test_compaction_changes_no_search_result(tmp_path, corpus, clustered_source, spec):
    source = clustered_source()
    folder = build_index(
        corpus,
        source,
        tmp_path / "ix",
        progress=False,
        settings=IndexSettings(spec=spec, keep_embeddings=spec != "Flat", nprobe=8),
    )
    edit(folder, source, tmp_path)
    queries = source.embed_passages([{"id": f"s{i}"} for i in range(0, N + 30, 61)])
    before = Manifest.load(folder)
    scores, ids = searched(folder, queries)
    texts = live_texts(folder)

    stats = compact_index(folder)
    after = Manifest.load(folder)
    assert stats.compacted and stats.full and (stats.segments_before, stats.segments_after) == (4, 1)
    assert (stats.dead_before, stats.dead_after) == (before.total - before.count, 0)
    assert after.total == after.count == before.count == stats.rows_after
    assert (
        after.generation == before.generation + 1 and after.segments[0].corpus == f"corpora/segment-g{after.generation}"
    )
    if spec != "Flat":  # each edit's rows were a FAISS part of their own; merged into one (`merged_faiss`)
        assert [rows for _, rows in before.file_parts("faiss")] == [N, 10, 10, 10]
        assert [rows for _, rows in after.file_parts("faiss")] == [after.total]
    new_scores, new_ids = searched(folder, queries)
    np.testing.assert_array_equal(new_scores, scores)  # to the bit
    if "x4fs" in spec:
        # fast scan's integer look-up tables tie many scores, and which of the ids tied at the k-th
        # score a search keeps depends on its width (a search with removed rows is a wider one)
        above = scores > scores[:, -1:]
        assert [list(np.array(a)[m]) for a, m in zip(new_ids, above)] == [
            list(np.array(a)[m]) for a, m in zip(ids, above)
        ]
    else:
        assert new_ids == ids
    assert live_texts(folder) == texts
    names = {r.name for r in after.files.values()}
    assert files_of(folder) == sorted(
        {
            "manifest.json",
            "corpora",
            f"corpora/segment-g{after.generation}",
            *(
                f"corpora/segment-g{after.generation}/{f}"
                for f in ("corpus.json", "id_hashes.npy", "id_rows.npy", "passages.arrow")
            ),
            *names,
        }
    )
    assert not compact_index(folder).compacted  # nothing left to do


def test_hnsw_is_rebuilt_as_a_fresh_build_of_the_live_passages(tmp_path, corpus, clustered_source):
    """A graph cannot lose nodes: compaction builds it again from its own stored vectors, which gives
    what a fresh HNSW index of the live passages gives (one thread: FAISS inserts in parallel)."""
    import faiss

    from retriever.corpus import prepare_corpus

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        source = clustered_source()
        folder = build_index(corpus, source, tmp_path / "ix", progress=False, settings=IndexSettings(spec="HNSW8"))
        edit(folder, source, tmp_path)
        compact_index(folder)
        live = live_texts(folder)
        order = PassageIndex.load(folder).passages(range(len(live)))  # the compacted order
        (tmp_path / "live.jsonl").write_text(
            "".join(json.dumps({"id": p["id"], "text": p["text"]}) + "\n" for p in order)
        )
        prepare_corpus([tmp_path / "live.jsonl"], tmp_path / "live", chunk_words=0, progress=False)
        fresh = build_index(
            tmp_path / "live", source, tmp_path / "fresh", progress=False, settings=IndexSettings(spec="HNSW8")
        )
        queries = source.embed_passages([{"id": f"s{i}"} for i in range(0, N + 30, 61)])
        assert searched(folder, queries)[1] == searched(fresh, queries)[1]
        np.testing.assert_array_equal(searched(folder, queries)[0], searched(fresh, queries)[0])
    finally:
        faiss.omp_set_num_threads(threads)


def test_the_automatic_compaction_merges_the_added_segments_and_keeps_the_base(tmp_path, corpus, clustered_source):
    source = clustered_source()
    folder = build_index(corpus, source, tmp_path / "ix", progress=False)
    base, built_vectors = Manifest.load(folder).segments[0], Manifest.load(folder).files["vectors"]
    for r in range(MAX_SEGMENTS):  # 1 + MAX_SEGMENTS segments: one too many
        add_passages(
            folder,
            read_passage_files([write_passages(tmp_path / "new.jsonl", N + 10 * r, 10)])[0],
            source,
            progress=False,
        )
    remove_passages(folder, ["s5", f"s{N + 3}"])  # a dead row in the base, one in an added segment
    manifest = Manifest.load(folder)
    assert compaction_due(manifest) == f"{MAX_SEGMENTS + 1} corpus segments (more than {MAX_SEGMENTS})"
    queries = source.embed_passages([{"id": f"s{i}"} for i in range(0, N + 80, 37)])
    scores, ids = searched(folder, queries)

    stats = compact_if_due(folder)
    manifest = Manifest.load(folder)
    assert stats.compacted and not stats.full and manifest.segments[0] == base  # the base stays where it is
    assert len(manifest.segments) == 2 and manifest.total == N + 10 * MAX_SEGMENTS - 1
    assert manifest.total - manifest.count == 1  # the base's dead row: under MAX_DEAD_FRACTION of it
    assert compaction_due(manifest) is None and compact_if_due(folder) is None
    # the base's vectors are the file as built (not copied); the merged segment's rows are a file of their own
    assert manifest.files["vectors"] == built_vectors and (folder / built_vectors.name).is_file()
    assert [(r.name, rows) for r, rows in manifest.file_parts("vectors")] == [
        (built_vectors.name, N),
        (f"vectors.g{manifest.generation}.npy", 10 * MAX_SEGMENTS - 1),
    ]
    new_scores, new_ids = searched(folder, queries)
    assert new_ids == ids
    np.testing.assert_array_equal(new_scores, scores)

    # more dead rows than MAX_DEAD_FRACTION, all in the base: the base is rewritten too
    remove_passages(folder, [f"s{i}" for i in range(10, 10 + int(MAX_DEAD_FRACTION * manifest.total) + 1)])
    assert compaction_due(Manifest.load(folder)).endswith(f"dead (more than {MAX_DEAD_FRACTION:.0%})")
    stats = compact_if_due(folder)
    manifest = Manifest.load(folder)
    assert stats.full and len(manifest.segments) == 1 and manifest.total == manifest.count
    assert [(r.name, rows) for r, rows in manifest.file_parts("vectors")] == [
        (f"vectors.g{manifest.generation}.npy", manifest.total)
    ]  # every row in one file again
    assert not Path(manifest.segments[0].corpus).is_absolute()  # inside the index now


def test_the_policy_counts_segments_and_dead_rows():
    def manifest(segments: int, total: int, count: int) -> Manifest:
        rows = [total // segments] * (segments - 1) + [total - total // segments * (segments - 1)]
        return Manifest(
            spec="Flat",
            dim=4,
            count=count,
            total=total,
            encoder_fingerprint="e",
            segments=[Segment(f"c{i}", "f", n, sum(rows[:i])) for i, n in enumerate(rows)],
            files={},
        )

    assert compaction_due(manifest(MAX_SEGMENTS, 1000, 1000)) is None
    assert (
        compaction_due(manifest(MAX_SEGMENTS + 1, 1000, 1000))
        == f"{MAX_SEGMENTS + 1} corpus segments (more than {MAX_SEGMENTS})"
    )
    total = int(4 * MIN_DEAD_ROWS / MAX_DEAD_FRACTION)
    dead = int(MAX_DEAD_FRACTION * total)
    assert compaction_due(manifest(1, total, total - dead)) is None
    assert (
        compaction_due(manifest(1, total, total - dead - 1))
        == f"{dead + 1} of {total} rows dead (more than {MAX_DEAD_FRACTION:.0%})"
    )
    # a small index: its few dead rows wait until there are MIN_DEAD_ROWS
    assert compaction_due(manifest(1, 200, 200 - MIN_DEAD_ROWS + 1)) is None
    assert compaction_due(manifest(1, 200, 200 - MIN_DEAD_ROWS)) is not None


class Crash(BaseException):
    """Stands for the process dying at that point (nothing after it runs; no handler catches it)."""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_compaction_that_dies_around_its_commit_leaves_the_old_or_the_new_index(
    tmp_path, corpus, clustered_source, monkeypatch, when
):
    """Dies with every new file written and flushed but the manifest not replaced ("before"), or
    with the manifest replaced but the superseded files not yet deleted ("after"); the next writer
    deletes what the dead one left."""

    source = clustered_source()
    folder = build_index(
        corpus, source, tmp_path / "ix", progress=False, settings=IndexSettings(spec="IVF8,PQ8", nprobe=8)
    )
    edit(folder, source, tmp_path)
    queries = source.embed_passages([{"id": f"s{i}"} for i in range(0, N, 97)])
    old, texts, results = Manifest.load(folder), live_texts(folder), searched(folder, queries)
    real = Manifest.save

    def dies(manifest, folder_):
        if when == "after":
            real(manifest, folder_)
        raise Crash

    monkeypatch.setattr(Manifest, "save", dies)
    with pytest.raises(Crash):
        compact_index(folder)
    monkeypatch.setattr(Manifest, "save", real)
    manifest = Manifest.load(folder)
    assert manifest.generation == old.generation + (when == "after")
    assert live_texts(folder) == texts and searched(folder, queries)[1] == results[1]  # either way
    PassageIndex.load(folder, verify=True)
    leftovers = len(files_of(folder))
    stats = compact_index(folder)  # the next writer: a compaction (nothing left to do "after")
    assert stats.compacted == (when == "before")
    assert len(files_of(folder)) < leftovers and live_texts(folder) == texts
    manifest = Manifest.load(folder)
    assert {p.name for p in folder.glob("*.g*.*")} == {r.name for r in manifest.files.values()}
    assert [p.name for p in (folder / "corpora").iterdir()] == [f"segment-g{manifest.generation}"]


def test_a_full_disk_mid_compaction_leaves_the_previous_generation(tmp_path, corpus, clustered_source, monkeypatch):
    from retriever.index import compact as index_compact

    source = clustered_source()
    folder = build_index(corpus, source, tmp_path / "ix", progress=False)
    edit(folder, source, tmp_path)
    manifest, files = (folder / "manifest.json").read_bytes(), files_of(folder)

    def disk_full(path, vectors, keep):
        path.write_bytes(b"\0" * 4096)  # a part written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(index_compact, "_write_vectors", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        compact_index(folder)
    assert (folder / "manifest.json").read_bytes() == manifest and files_of(folder) == files  # nothing left behind
    PassageIndex.load(folder, verify=True)


KILLED_COMPACTION = r"""
import sys
from retriever.index.compact import compact_index
print("start", flush=True)
compact_index(sys.argv[1])
print("done", flush=True)
"""


@pytest.mark.slow  # a few subprocesses, each importing faiss and datasets
def test_kill_9_at_any_moment_of_a_compaction(tmp_path, make_synthetic_corpus, clustered_source):
    """SIGKILL at several moments of a real compaction (20,000 passages of 256 dimensions, so that
    it takes a while): every time, the index loads and verifies, and holds the same live passages."""
    source = clustered_source(256)
    corpus = make_synthetic_corpus(tmp_path, 20000)
    folder = build_index(corpus, source, tmp_path / "ix", progress=False, settings=IndexSettings(chunk_size=20000))
    remove_passages(folder, [f"s{i}" for i in range(0, 20000, 7)])
    texts = live_texts(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outcomes = []
    for delay in (0.0, 0.25, 0.5):
        process = subprocess.Popen(
            [sys.executable, "-c", KILLED_COMPACTION, str(folder)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
        )
        assert process.stdout.readline().strip() == "start"  # imports done: the compaction begins
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        manifest = Manifest.load(folder)
        outcomes.append(manifest.total == manifest.count)
        PassageIndex.load(folder, verify=True)
        assert live_texts(folder) == texts, f"killed after {delay} s"
        if outcomes[-1]:  # it finished before the kill: start again from a fragmented index
            remove_passages(folder, [next(iter(texts))])
            texts = live_texts(folder)
    assert not all(outcomes), "every compaction finished before its kill: nothing was tested"
    compact_index(folder)  # and the next one goes through
    assert live_texts(folder) == texts


HOLDER = r"""
import sys, time
from retriever.index.files import writer_lock
with writer_lock(sys.argv[1], "add"):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_second_writer_is_refused_and_told_who_writes(tmp_path, corpus, clustered_source):
    source = clustered_source()
    folder = build_index(corpus, source, tmp_path / "ix", progress=False)
    edit(folder, source, tmp_path, rounds=1)
    manifest = (folder / "manifest.json").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        message = (
            re.escape(f"{folder} is being updated by another process (pid {holder.pid}, add since ")
            + r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
            + re.escape("); an index has one writer at a time: try again when it has finished")
        )
        with pytest.raises(IndexLockedError, match=message):
            compact_index(folder)
        with pytest.raises(IndexLockedError, match=f"pid {holder.pid}, add"):
            remove_passages(folder, ["s1"])
        with pytest.raises(IndexLockedError):
            add_passages(
                folder, read_passage_files([write_passages(tmp_path / "new.jsonl", 5000, 1)])[0], source, progress=False
            )
        assert (folder / "manifest.json").read_bytes() == manifest
    finally:
        holder.kill()
        holder.wait()
    assert compact_index(folder).compacted  # the lock went with its holder, killed


# the 8-bit PQ specs train their codebooks for seconds: the slow tier runs them; the fast tier the 4-bit forms
@pytest.mark.parametrize(
    "spec",
    [
        "IVF1,PQ8x4fs",
        pytest.param("IVF2,PQ8", marks=pytest.mark.slow),
        "PQ8x4fs",
        pytest.param("OPQ8,IVF1,PQ8", marks=pytest.mark.slow),
    ],
)
def test_faiss_parts_merge_into_the_index_one_build_of_all_rows_gives(spec):
    """`merged_faiss`: an index as built plus the parts edits filled from its trained copy equals one index
    filled with every row. The first part's list holds 128 entries: a multiple of a fast-scan block's bytes
    (32 codes of 4 bytes), where FAISS's own blocked append copies past the list (so lists are rebuilt)."""
    import faiss

    from retriever.index.compact import merged_faiss

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((170, 32)).astype(np.float32)
    trained = faiss.index_factory(32, spec, faiss.METRIC_INNER_PRODUCT)
    trained.train(np.tile(rows, (20, 1)) + rng.standard_normal((3400, 32)).astype(np.float32) * 0.01)
    whole = faiss.clone_index(trained)
    whole.add(rows)
    parts = []
    for start, stop in ((0, 128), (128, 138), (138, 170)):
        part = faiss.clone_index(trained)
        part.add(rows[start:stop])
        parts.append((start, part))
    merged = merged_faiss(parts)
    assert merged.ntotal == 170
    for index in (merged, whole):
        if faiss.try_extract_index_ivf(index) is not None:
            faiss.extract_index_ivf(index).nprobe = 2
    queries = rows[::7] + 0.05
    got, expected = merged.search(queries, 20), whole.search(queries, 20)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])
    with pytest.raises(ValueError, match="starts at position 5"):
        merged_faiss([(0, faiss.clone_index(trained)), (5, parts[1][1])])
