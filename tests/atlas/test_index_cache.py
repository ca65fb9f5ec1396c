"""A run given `index.corpus` reuses an index already built from the same corpus with the same
passage encoder and index settings (atlas.run_index.prepare_index, the cache beside the corpus), and
builds anew when any of them differs; `index.path` wins over `index.corpus`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atlas import run_index
from atlas.config import load_config
from atlas.run_index import open_index, prepare_index
from retriever.index import build as index_build
from retriever.index.build import CACHE_DIR
from retriever.index.manifest import Manifest
from retriever.retriever import Retriever

QUERIES = ["what is the capital of zorbland", "who first climbed mount olo"]


def run_config(world, corpus: Path, out: Path, *overrides: str):
    return load_config(
        None,
        [f"retriever.model={world['encoder']}", f"index.corpus={corpus}", f"training.output_dir={out}", *overrides],
    )


def open_run_index(world, corpus: Path, out: Path, *overrides: str):
    config = run_config(world, corpus, out, *overrides)
    retriever = Retriever.from_config(config.retriever)
    return open_index(prepare_index(config, retriever=retriever), retriever, config.index)


@pytest.fixture
def corpus(tiny_world, tmp_path) -> Path:
    """A private copy of the tiny corpus (its cache folder is written beside it)."""
    return Path(shutil.copytree(tiny_world["corpus"], tmp_path / "corpus"))


@pytest.fixture
def builds(monkeypatch) -> list[Path]:
    """The folders a run asks `retriever.index.build.build_index` to build, in order."""
    calls: list[Path] = []
    real = index_build.build_index

    def recording(corpus_path, retriever, out, *settings, **kwargs):
        calls.append(Path(out))
        return real(corpus_path, retriever, out, *settings, **kwargs)

    monkeypatch.setattr(run_index, "build_index", recording)
    return calls


def entries(corpus: Path) -> list[Path]:
    return sorted((corpus / CACHE_DIR).iterdir())


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_second_run_reuses_the_index_built_by_the_first(tiny_world, corpus, tmp_path, builds, caplog):
    caplog.set_level(logging.INFO, logger="atlas.run_index")
    first = open_run_index(tiny_world, corpus, tmp_path / "run1")
    assert builds == [tmp_path / "run1" / "index"]
    (cached,) = entries(corpus)  # one finished entry, no temporary folder left
    assert sorted(p.name for p in cached.iterdir()) == [
        "build-settings.json",
        "manifest.json",
        "removed.g1.npy",
        "vectors.g1.npy",
    ]
    stamp, contents = cached.stat().st_mtime_ns, files_of(cached)
    caplog.clear()

    second = open_run_index(tiny_world, corpus, tmp_path / "run2")
    assert builds == [tmp_path / "run1" / "index"]  # not built again
    fingerprint = json.loads((cached / "build-settings.json").read_text())["encoder_fingerprint"]
    assert [r.getMessage() for r in caplog.records if "reusing" in r.getMessage()] == [
        (
            f"reusing the index of {corpus} built with {tiny_world['encoder']} (passage encoder {fingerprint[:12]}) "
            f"at {cached}"
        )
    ]
    assert cached.stat().st_mtime_ns == stamp and files_of(cached) == contents
    vectors = tmp_path / "run2" / "index" / "vectors.g1.npy"
    assert vectors.stat().st_ino == (cached / "vectors.g1.npy").stat().st_ino  # linked, not copied
    assert second.folder == tmp_path / "run2" / "index" and len(second) == 5
    assert [[(h.id, h.score) for h in hits] for hits in second.search(QUERIES, 3)] == [
        [(h.id, h.score) for h in hits] for hits in first.search(QUERIES, 3)
    ]


def test_a_different_spec_or_encoder_builds_anew(tiny_world, corpus, tmp_path, builds):
    open_run_index(tiny_world, corpus, tmp_path / "flat")
    open_run_index(tiny_world, corpus, tmp_path / "sq8", "index.spec=SQ8")
    # another passage max length changes what a passage's embedding is: another passage encoder
    open_run_index(tiny_world, corpus, tmp_path / "short", "retriever.passage_maxlength=16")
    assert builds == [tmp_path / name / "index" for name in ("flat", "sq8", "short")]
    assert len(entries(corpus)) == 3
    reused = open_run_index(tiny_world, corpus, tmp_path / "short-again", "retriever.passage_maxlength=16")
    assert len(builds) == 3 and reused.manifest.encoder.passage_maxlength == 16


def test_updating_a_run_index_leaves_the_cache_as_it_was(tiny_world, corpus, tmp_path, builds):
    from retriever.index.update import add_passages, read_passage_files, remove_passages, update_passages
    from retriever.retriever import Retriever

    open_run_index(tiny_world, corpus, tmp_path / "run1")
    (cached,) = entries(corpus)
    contents = files_of(cached)
    retriever = Retriever.from_pretrained(tiny_world["encoder"])
    edits = tmp_path / "edits.jsonl"
    edits.write_text(json.dumps({"id": "p1", "text": "The capital of Zorbland is Brest."}) + "\n")
    update_passages(tmp_path / "run1" / "index", read_passage_files([edits])[0], retriever, progress=False)
    remove_passages(tmp_path / "run1" / "index", ["p2"])
    edits.write_text(json.dumps({"id": "p9", "text": "A new passage."}) + "\n")
    add_passages(tmp_path / "run1" / "index", read_passage_files([edits])[0], retriever, progress=False)
    assert files_of(cached) == contents
    fresh = open_run_index(tiny_world, corpus, tmp_path / "run2")
    assert len(builds) == 1 and len(fresh) == 5
    assert fresh.get(["p1"])[0]["text"] == "The capital of Zorbland is Quimper. Zorbland is an island."


def test_a_publish_killed_halfway_is_never_reused(tiny_world, corpus, tmp_path, builds, monkeypatch):
    """What a kill -9 while publishing leaves (a temporary folder, never renamed into place) is
    not taken for a cached index: the next run builds and publishes again."""
    real = Manifest.save

    def killed_in_the_cache(manifest, folder):
        if CACHE_DIR in str(folder):
            raise KeyboardInterrupt("killed")
        real(manifest, folder)

    with monkeypatch.context() as patch:
        patch.setattr(Manifest, "save", killed_in_the_cache)
        with pytest.raises(KeyboardInterrupt):
            open_run_index(tiny_world, corpus, tmp_path / "run1")
    (left,) = entries(corpus)
    assert left.name.startswith(".") and ".tmp-" in left.name  # half a publish: data files, no manifest
    open_run_index(tiny_world, corpus, tmp_path / "run2")
    open_run_index(tiny_world, corpus, tmp_path / "run3")
    assert builds == [tmp_path / "run1" / "index", tmp_path / "run2" / "index"]
    assert [p.name.startswith(".") for p in entries(corpus)] == [True, False]


def test_index_path_wins_over_index_corpus(tiny_world, corpus, tmp_path, builds, caplog):
    index = open_run_index(tiny_world, corpus, tmp_path / "run", f"index.path={tiny_world['index']}")
    assert index.folder == Path(tiny_world["index"]) and builds == []
    assert not (corpus / CACHE_DIR).exists() and not (tmp_path / "run" / "index").exists()

    from retriever.corpus import prepare_corpus

    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "text": "something else entirely"}) + "\n")
    prepare_corpus([other], tmp_path / "other", progress=False)
    caplog.set_level(logging.WARNING, logger="atlas.run_index")
    index = open_run_index(tiny_world, tmp_path / "other", tmp_path / "run", f"index.path={tiny_world['index']}")
    assert len(index) == 5 and builds == []
    assert [r.getMessage() for r in caplog.records] == [
        (
            f"index.path {tiny_world['index']} was built on another corpus than index.corpus {tmp_path / 'other'}; "
            "index.path is used (it wins over index.corpus)"
        )
    ]


BUILD_SCRIPT = r"""
import json, sys
from pathlib import Path
from atlas.run_index import open_index, prepare_index
from atlas.config import AtlasConfig, IndexConfig, RetrieverConfig, TrainingConfig
from atlas.distributed import init_distributed, shutdown
from retriever.retriever import Retriever

context = init_distributed()
corpus, out_dir, encoder = sys.argv[1:4]
config = AtlasConfig(retriever=RetrieverConfig(model=encoder), index=IndexConfig(corpus=corpus, chunk_size=2),
                     training=TrainingConfig(output_dir=out_dir))
retriever = Retriever.from_config(config.retriever)
embedded = []
original = retriever.embed_passages
def counting(passages, **kwargs):
    embedded.extend(p["id"] for p in passages)
    return original(passages, **kwargs)
retriever.embed_passages = counting
index = open_index(prepare_index(config, retriever=retriever), retriever, config.index)
hits = [[h.id for h in q] for q in index.search(["capital of zorbland"], 3)]
Path(out_dir, f"report-{context.rank}.json").write_text(json.dumps({"embedded": embedded, "count": len(index),
                                                                    "hits": hits}))
shutdown(context)
"""


@pytest.mark.slow
def test_two_ranks_build_once_then_reuse(tiny_world, corpus, tmp_path):
    """Under torchrun the ranks share the first build (rank 0 publishes it); a second run's ranks
    embed nothing and search the same index."""
    script = tmp_path / "build.py"
    script.write_text(BUILD_SCRIPT)
    reports = {}
    for run in ("run1", "run2"):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(script),
            str(corpus),
            str(tmp_path / run),
            str(tiny_world["encoder"]),
        ]
        result = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        reports[run] = [json.loads((tmp_path / run / f"report-{r}.json").read_text()) for r in (0, 1)]
    first, second = reports["run1"], reports["run2"]
    assert sorted(first[0]["embedded"] + first[1]["embedded"]) == ["p1", "p2", "p3", "p4", "p5"]
    assert second[0]["embedded"] == second[1]["embedded"] == []
    assert {r["count"] for r in first + second} == {5}
    assert len({json.dumps(r["hits"]) for r in first + second}) == 1
    assert len(entries(corpus)) == 1
