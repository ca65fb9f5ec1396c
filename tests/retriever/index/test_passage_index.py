"""Passage index: search vs brute force, fingerprints, resumable build, add/remove, corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer, BertConfig, BertModel

from common.modeling import encoder_source
from retriever.corpus import prepare_corpus
from retriever.encoder import ContrieverEncoder
from retriever.index import (
    CorpusMismatchError,
    EncoderMismatchError,
    InvalidIndexError,
    PassageIndex,
)
from retriever.index.build import build_index, train_and_fill, work_dir_for
from retriever.index.exact_search import exact_search
from retriever.index.settings import IndexSettings
from retriever.index.types import set_search_params
from retriever.index.update import add_passages, read_passage_files, remove_passages, update_passages
from retriever.retriever import Retriever

WORDS = [
    "river",
    "mountain",
    "city",
    "music",
    "king",
    "war",
    "bridge",
    "island",
    "science",
    "novel",
    "film",
    "ocean",
    "forest",
    "empire",
    "church",
    "railway",
    "language",
    "planet",
    "football",
    "election",
]


def write_docs(path: Path, ids: list[str], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for doc_id in ids:
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(5, 40))))
            f.write(json.dumps({"id": doc_id, "title": f"Title {doc_id}", "text": text}) + "\n")
    return path


def tiny_retriever(seed: int = 0) -> Retriever:
    """A 2-layer, 32-d random BERT with MiniLM's tokenizer: fast, and a distinct fingerprint per seed."""
    import torch

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    tokenizer = AutoTokenizer.from_pretrained(encoder_source("minilm"))
    return Retriever(query_encoder=ContrieverEncoder(model, tokenizer, pooling="mean"), passage_maxlength=64)


@pytest.fixture(scope="module")
def retriever() -> Retriever:
    return tiny_retriever(0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    prepare_corpus(
        [write_docs(folder / "docs.jsonl", [f"d{i}" for i in range(40)], 0)],
        folder / "prepared",
        progress=False,
    )
    return folder / "prepared"


def test_flat_search_equals_brute_force(tmp_path, retriever, corpus):
    out = build_index(corpus, retriever, tmp_path / "flat", progress=False, settings=IndexSettings(chunk_size=16))
    index = PassageIndex.load(out, retriever=retriever)
    vectors = np.load(out / "vectors.g1.npy").astype(np.float64)
    queries = ["river king", "planet science film", "football election war"]
    query_vectors = retriever.embed_queries(queries).astype(np.float64)
    scores = query_vectors @ vectors.T
    expected_rows = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    hits = index.search(queries, 5)
    for q, q_hits in enumerate(hits):
        assert [h.row for h in q_hits] == list(expected_rows[q])
        np.testing.assert_allclose([h.score for h in q_hits], scores[q, expected_rows[q]], rtol=1e-5)
        for h in q_hits:
            assert index.corpora[0][h.row]["id"] == h.id and h.text and h.title.startswith("Title ")
    # embeddings by row are the stored float16 vectors
    np.testing.assert_array_equal(index.embeddings([3, 1]), vectors[[3, 1]].astype(np.float32))


def test_ivf_pq_recall_on_clustered_data():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((50, 16)).astype(np.float32) * 4
    data = (centers[rng.integers(0, 50, 1500)] + rng.standard_normal((1500, 16))).astype(np.float32)
    queries = (centers[rng.integers(0, 50, 50)] + rng.standard_normal((50, 16))).astype(np.float32)
    index = train_and_fill("IVF16,PQ4", data, train_sample=1500)
    set_search_params(index, nprobe=8)
    _, approx = index.search(queries, 10)
    _, exact = exact_search(queries, data, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    assert recall >= 0.6, recall  # floor for 4-byte codes at d=16 on this data (measured 0.70)


def test_encoder_and_corpus_mismatch_are_refused(tmp_path, retriever, corpus):
    out = build_index(corpus, retriever, tmp_path / "ix", progress=False)
    other = tiny_retriever(1)
    with pytest.raises(EncoderMismatchError, match="built with passage encoder .* would not be comparable"):
        PassageIndex.load(out, retriever=other)
    assert len(PassageIndex.load(out, retriever=other, allow_encoder_mismatch=True)) == 40
    # a different passage format is a different encoder fingerprint too
    reformatted = Retriever(query_encoder=retriever.query_encoder, passage_format="{text}", passage_maxlength=64)
    with pytest.raises(EncoderMismatchError):
        PassageIndex.load(out, retriever=reformatted)
    other_corpus = tmp_path / "other"
    prepare_corpus([write_docs(tmp_path / "o.jsonl", ["x1", "x2"], 5)], other_corpus, progress=False)
    with pytest.raises(CorpusMismatchError, match="is not the corpus the index"):
        PassageIndex.load(out, corpus=other_corpus)


class Killed(RuntimeError):
    pass


@pytest.mark.parametrize("spec,keep", [("Flat", False), ("IVF4,Flat", True)])
def test_resumed_build_is_byte_identical(tmp_path, retriever, corpus, spec, keep):
    options = {
        "settings": IndexSettings(spec=spec, keep_embeddings=keep, chunk_size=8, train_sample=64),
        "progress": False,
    }
    reference = build_index(corpus, retriever, tmp_path / "ref", **options)

    def kill_after_two(chunk: int) -> None:
        if chunk == 2:
            raise Killed

    target = tmp_path / "resumed"
    with pytest.raises(Killed):
        build_index(corpus, retriever, target, on_chunk=kill_after_two, **options)
    assert not target.exists()
    progress = json.loads((work_dir_for(target) / "progress.json").read_text())
    assert progress["completed_chunks"] == 3
    embedded = []
    retriever_calls = retriever.embed_passages

    # `precision` in the signature, as the retriever's own: the build records the precision it embeds at
    def counting(passages, *, precision=None, **kwargs):
        embedded.extend(p["id"] for p in passages)
        return retriever_calls(passages, precision=precision, **kwargs)

    retriever.embed_passages = counting
    try:
        build_index(corpus, retriever, target, **options)
    finally:
        del retriever.embed_passages
    assert len(embedded) == 40 - 24  # only the chunks after the last completed one
    assert not work_dir_for(target).exists()
    ref_manifest = json.loads((reference / "manifest.json").read_text())
    new_manifest = json.loads((target / "manifest.json").read_text())
    ref_manifest.pop("created"), new_manifest.pop("created")  # two separate builds, two start times
    assert new_manifest == ref_manifest
    for name in (f for f in ref_manifest["files"].values()):
        assert (target / name["name"]).read_bytes() == (reference / name["name"]).read_bytes(), name["name"]


def test_restart_and_mismatched_unfinished_build(tmp_path, retriever, corpus):
    def stop(chunk: int) -> None:
        raise Killed

    with pytest.raises(Killed):
        build_index(
            corpus, retriever, tmp_path / "ix", progress=False, on_chunk=stop, settings=IndexSettings(chunk_size=8)
        )
    with pytest.raises(ValueError, match="unfinished build with different chunk_size is there; pass --restart"):
        build_index(corpus, retriever, tmp_path / "ix", progress=False, settings=IndexSettings(chunk_size=16))
    build_index(corpus, retriever, tmp_path / "ix", progress=False, restart=True, settings=IndexSettings(chunk_size=16))
    with pytest.raises(FileExistsError, match="already exists"):
        build_index(corpus, retriever, tmp_path / "ix", progress=False)


@pytest.mark.parametrize("spec", ["Flat", "IVF2,Flat", "IVF2,PQ8x4fs"])
def test_add_and_remove(tmp_path, retriever, corpus, spec):
    out = build_index(
        corpus, retriever, tmp_path / "ix", progress=False, settings=IndexSettings(spec=spec, keep_embeddings=True)
    )
    old_vectors = np.load(out / "vectors.g1.npy")
    new_docs = write_docs(tmp_path / "new.jsonl", ["n1", "n2", "n3"], 7)
    stats = add_passages(
        out, read_passage_files([new_docs])[0], retriever, chunk_words=100, progress=False
    )  # documents: ids n1-0, ...
    assert (stats.added, stats.replaced, stats.count) == (3, 0, 43) and stats.ids == ["n1-0", "n2-0", "n3-0"]
    index = PassageIndex.load(out, retriever=retriever)
    np.testing.assert_array_equal(index.vectors[:40], old_vectors)  # nothing re-embedded
    new_text = index.corpora[1].get("n2-0")["text"]
    hits = {h.row: h for h in index.search([new_text], 100)[0]}
    assert sorted(hits) == list(range(43))  # the new passages are searchable beside the old ones
    assert hits[41].id == "n2-0" and hits[41].text == new_text
    with pytest.raises(ValueError, match="already in the index"):
        add_passages(out, read_passage_files([new_docs])[0], retriever, chunk_words=100, progress=False)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("n2-0\nd3-0\n\n")
    stats = remove_passages(out, ["n2-0", "d3-0", "d3-0"])
    assert (stats.removed, stats.count) == (2, 41)
    index = PassageIndex.load(out, retriever=retriever)
    all_hits = index.search([new_text, "river"], 100)
    for hits in all_hits:
        assert len(hits) == 41 and not {"n2-0", "d3-0"} & {h.id for h in hits}
    assert remove_passages(out, ["n2-0"]).already_removed == 1
    with pytest.raises(KeyError, match="not in the index"):
        remove_passages(out, ["nope"])
    # a removed id can be added back, under the same id (each record one passage)
    stats = add_passages(
        out, read_passage_files([write_docs(tmp_path / "again.jsonl", ["n2-0"], 9)])[0], retriever, progress=False
    )
    index = PassageIndex.load(out, retriever=retriever)
    assert stats.ids == ["n2-0"] and index.get(["n2-0"])[0]["text"] == index.corpora[-1].get("n2-0")["text"]
    assert len(index) == 42 and sorted(p.name for p in out.iterdir() if p.suffix in {".npy", ".faiss"}) == sorted(
        r.name for r in index.manifest.file_records()
    )  # superseded files are gone
    # each edit wrote its own rows only: the vectors as built are the file they were, and each added
    # segment has its own file of its rows
    parts = [(record.name, rows) for record, rows in index.manifest.file_parts("vectors")]
    assert parts == [("vectors.g1.npy", 40), ("vectors.g2.npy", 3), ("vectors.g5.npy", 1)]
    if spec != "Flat":  # likewise the FAISS codes: the trained index kept at build, filled with each edit's rows
        parts = [(record.name, rows) for record, rows in index.manifest.file_parts("faiss")]
        assert parts == [("index.g1.faiss", 40), ("index.g2.faiss", 3), ("index.g5.faiss", 1)]
        assert index.manifest.files["trained"].name == "trained.g1.faiss"
    np.testing.assert_array_equal(np.load(out / "vectors.g1.npy"), old_vectors)
    np.testing.assert_array_equal(
        np.asarray(index.vectors[41:44]),
        np.concatenate([np.load(out / "vectors.g2.npy")[1:], np.load(out / "vectors.g5.npy")]),
    )


def test_corrupted_files_give_clear_errors(tmp_path, retriever, corpus):
    out = build_index(
        corpus, retriever, tmp_path / "ix", progress=False, settings=IndexSettings(spec="SQ8", keep_embeddings=True)
    )
    faiss_file, vectors_file = out / "index.g1.faiss", out / "vectors.g1.npy"
    original = faiss_file.read_bytes()
    faiss_file.write_bytes(original[: len(original) // 2])
    with pytest.raises(InvalidIndexError, match=r"index.g1.faiss: truncated or altered \(\d+ bytes, manifest says"):
        PassageIndex.load(out)
    corrupted = bytearray(original)
    corrupted[-10] ^= 0xFF  # inside the SQ8 codes: same size, parses fine
    faiss_file.write_bytes(bytes(corrupted))
    # a small file is sampled whole: the flipped byte is seen at every load (a large one: at --verify)
    with pytest.raises(InvalidIndexError, match=r"index.g1.faiss: altered \(same size, but its sampled blocks differ"):
        PassageIndex.load(out)
    with pytest.raises(InvalidIndexError, match=r"index.g1.faiss: corrupted \(SHA-256 differs"):
        PassageIndex.load(out, verify=True)
    faiss_file.write_bytes(b"\x00" * len(original))  # same size, header destroyed
    with pytest.raises(InvalidIndexError, match="index.g1.faiss: altered"):
        PassageIndex.load(out)
    # a manifest written before the sampled hashes: the size is all a load checks, FAISS names what it cannot read
    data = json.loads((out / "manifest.json").read_text())
    for record in data["files"].values():
        record.pop("sampled_sha256")
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(InvalidIndexError, match="index.g1.faiss: unreadable FAISS index"):
        PassageIndex.load(out)
    with pytest.raises(InvalidIndexError, match="unreadable FAISS index"):
        PassageIndex.load(out, mmap=False)
    faiss_file.write_bytes(original)
    vectors_file.unlink()
    with pytest.raises(InvalidIndexError, match="vectors.g1.npy: missing index file"):
        PassageIndex.load(out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(InvalidIndexError, match="corrupted manifest"):
        PassageIndex.load(out)


@pytest.fixture(scope="module")
def clustered_corpus(tmp_path_factory, make_synthetic_corpus) -> Path:
    return make_synthetic_corpus(tmp_path_factory.mktemp("clustered"), 3000)


FAISS_SPECS = ["IVF8,Flat", "IVF8,PQ8", "PQ8", "SQ8", "HNSW8"]  # memory-mapped at load
FAST_SCAN_SPECS = ["PQ8x4fs", "IVF8,PQ8x4fs"]  # read into memory (FAISS's blocked codes)


def mapped_files() -> str:
    return Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("spec", FAISS_SPECS)
def test_faiss_index_is_memory_mapped(tmp_path, clustered_corpus, clustered_source, spec):
    """Each family is loaded with the flags FAISS supports for it: the file is mapped into the
    process (not read into RAM), and IVF lists are the read-only on-disk kind."""
    import faiss

    out = build_index(
        clustered_corpus, clustered_source(), tmp_path / "ix", progress=False, settings=IndexSettings(spec=spec)
    )
    path = str((out / "index.g1.faiss").resolve())
    index = PassageIndex.load(out)
    assert path in mapped_files()
    ivf = faiss.try_extract_index_ivf(index.faiss_index)
    if ivf is not None:
        assert type(faiss.downcast_InvertedLists(ivf.invlists)).__name__ == "OnDiskInvertedLists"
    writable = PassageIndex.load(out, mmap=False)  # what `index add` uses
    if ivf is not None:
        lists = faiss.try_extract_index_ivf(writable.faiss_index).invlists
        assert type(faiss.downcast_InvertedLists(lists)).__name__ == "ArrayInvertedLists"
    queries = clustered_source().embed_passages([{"id": f"s{i}"} for i in range(0, 3000, 300)])
    mapped_scores, mapped_rows = index.search_vectors(queries, 10)
    scores, rows = writable.search_vectors(queries, 10)
    np.testing.assert_array_equal(mapped_rows, rows)
    np.testing.assert_array_equal(mapped_scores, scores)
    del index, writable
    import gc

    gc.collect()
    assert path not in mapped_files()  # the mapping goes with the index


RSS_PROBE = r"""
import json, sys
from pathlib import Path
import datasets, faiss, numpy  # imports are not load cost
from retriever.index import PassageIndex

def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

PassageIndex.load(sys.argv[1])  # warm-up (dropped at once): lazy imports, corpus reader caches
before = rss()
index = PassageIndex.load(sys.argv[1], mmap=sys.argv[2] == "mmap")
print(json.dumps({"growth": rss() - before}))
"""


@pytest.mark.parametrize("spec", ["IVF16,Flat", "SQ8"])
def test_mapped_load_does_not_read_the_index_into_memory(tmp_path, make_synthetic_corpus, clustered_source, spec):
    """In a fresh process, loading a few-MB index mapped grows RSS by a small fraction of the
    file; read into memory (mmap=False) by about the file size — so the probe can see it."""
    import subprocess
    import sys

    corpus = make_synthetic_corpus(tmp_path, 20000)
    out = build_index(
        corpus,
        clustered_source(192),
        tmp_path / "ix",
        progress=False,
        settings=IndexSettings(spec=spec, chunk_size=20000, train_sample=5000),
    )
    size = (out / "index.g1.faiss").stat().st_size
    assert size > 3_000_000

    def growth(mode: str) -> float:
        result = subprocess.run(
            [sys.executable, "-c", RSS_PROBE, str(out), mode],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[3],
        )
        return json.loads(result.stdout.strip().splitlines()[-1])["growth"] / size

    assert growth("mmap") < 0.2
    assert growth("read") > 0.7


@pytest.mark.parametrize("spec", FAISS_SPECS + FAST_SCAN_SPECS)
def test_removed_passages_never_come_back_on_any_faiss_type(tmp_path, clustered_corpus, clustered_source, spec):
    """IndexPQ(FastScan) takes no search parameters (no id selector): over-retrieved and filtered;
    for every type the result is what the unfiltered search gives minus the removed ids."""
    out = build_index(
        clustered_corpus,
        clustered_source(),
        tmp_path / "ix",
        progress=False,
        settings=IndexSettings(spec=spec, nprobe=8),
    )
    before = PassageIndex.load(out)
    queries = clustered_source().embed_passages([{"id": f"s{i}"} for i in range(7)])
    all_scores, all_rows = before.search_vectors(queries, 200)
    doomed = [f"s{i}" for i in sorted(set(all_rows[:, :20].ravel().tolist()))]  # many top hits
    remove_passages(out, doomed)
    index = PassageIndex.load(out)
    scores, rows = index.search_vectors(queries, 50)
    removed = {int(d[1:]) for d in doomed}
    assert rows.shape == (7, 50) and not removed & set(rows.ravel().tolist())
    assert (rows >= 0).all() and np.isfinite(scores).all()
    if spec != "HNSW8":  # a filtered graph search may explore differently; the others are exact
        for q in range(7):
            live = [i for i, r in enumerate(all_rows[q]) if r not in removed][:50]
            np.testing.assert_allclose(scores[q], all_scores[q][live], rtol=1e-6)
            # fast scan's integer look-up tables tie many scores, and which tied ids a search
            # keeps depends on its width: there the scores are what must match
            if "x4fs" not in spec:
                assert list(rows[q]) == list(all_rows[q][live])


def test_pq_search_widens_until_enough_live_results():
    """IndexPQ takes no id selector: `search_live` searches wider, doubling for the queries
    that still lack k live results, and returns exactly the unfiltered ranking minus the
    removed ids — here with the 400 best hits of each query removed."""
    from retriever.index.passage_index import search_live

    rng = np.random.default_rng(0)
    data = rng.standard_normal((4000, 16)).astype(np.float32)
    queries = rng.standard_normal((5, 16)).astype(np.float32)
    index = train_and_fill("PQ8", data, train_sample=4000)
    _, everything = index.search(queries, 4000)
    removed = np.zeros(4000, dtype=bool)
    removed[everything[:, :400].ravel()] = True
    scores, ids = search_live(index, queries, 30, removed=removed)
    for q in range(5):
        assert list(ids[q]) == [i for i in everything[q] if not removed[i]][:30]
    assert np.isfinite(scores).all() and (np.diff(scores, axis=1) <= 0).all()
    removed[:] = True
    removed[[5, 7]] = False  # two live passages left: the rest is padding
    scores, ids = search_live(index, queries, 4, removed=removed)
    assert (np.sort(ids[:, :2], axis=1) == [5, 7]).all() and (ids[:, 2:] == -1).all()
    assert np.isinf(scores[:, 2:]).all()


def test_update_replace_and_the_ids_of_added_records(tmp_path, retriever, corpus):
    """Ids are kept as given; an update needs live ids, an add new ones (or `replace`); with
    chunking, a record named like a passage of the index is refused, not renamed."""
    out = build_index(corpus, retriever, tmp_path / "ix", progress=False)
    manifest = (out / "manifest.json").read_bytes()
    edit = [{"id": "d3-0", "text": "river island"}, {"id": "gone", "title": "T", "text": "x"}]
    with pytest.raises(KeyError, match="passage 1: passage id 'gone' has no live passage in the index"):
        update_passages(out, edit, retriever, progress=False)
    with pytest.raises(ValueError, match="passage 0: passage id 'd3-0' is already in the index"):
        add_passages(out, edit, retriever, progress=False)
    edit_file = tmp_path / "edit.jsonl"  # read at the edge, as the command line reads it: errors name its lines
    edit_file.write_text("".join(json.dumps(record) + "\n" for record in edit))
    records, origins = read_passage_files([edit_file])
    with pytest.raises(KeyError, match=f"{edit_file}:2: passage id 'gone' has no live passage in the index"):
        update_passages(out, records, retriever, origins=origins, progress=False)
    with pytest.raises(ValueError, match="with chunk_words 100 this record would be added as 'd3-0-0'"):
        add_passages(out, edit, retriever, chunk_words=100, progress=False)
    assert (out / "manifest.json").read_bytes() == manifest and not (out / "corpora").exists()

    stats = add_passages(out, edit, retriever, replace=True, progress=False)
    assert (stats.added, stats.replaced, stats.removed, stats.count) == (1, 1, 0, 41)
    index = PassageIndex.load(out, retriever=retriever)
    old_title = index.corpora[0].get("d3-0")["title"]
    assert index.get(["d3-0", "gone"]) == [
        {"id": "d3-0", "doc_id": "d3-0", "title": "", "section": "", "text": "river island", "wikipedia_id": ""},
        {"id": "gone", "doc_id": "gone", "title": "T", "section": "", "text": "x", "wikipedia_id": ""},
    ]
    edit = [{"id": "d3-0", "title": old_title, "text": "ocean"}, {"id": "gone", "text": "y"}]
    stats = update_passages(out, edit, retriever, progress=False)
    assert (stats.added, stats.replaced, stats.count, stats.ids) == (0, 2, 41, ["d3-0", "gone"])
    index = PassageIndex.load(out, retriever=retriever)
    assert [(p["title"], p["text"]) for p in index.get(["d3-0", "gone"])] == [(old_title, "ocean"), ("T", "y")]
    hits = index.search(index.embeddings([index.position_of("gone")]), 41)[0]
    assert len(hits) == 41 and len({h.id for h in hits}) == 41  # one live version per id
    with pytest.raises(KeyError, match=r"1 id\(s\) have no live passage in the index .*: 'nope'"):
        index.get(["d3-0", "nope"])


@pytest.mark.parametrize(
    ("passages", "message"),
    [
        ([{"id": "a", "text": "x"}, {"id": "b"}], r"passage 1 \(id 'b'\): missing field 'text'"),
        ([{"text": "x"}], r"passage 0: missing field 'id'"),
        ([{"id": "a", "text": 5}], r"passage 0 \(id 'a'\): field 'text' must be a string, got int"),
        ([{"id": "a", "text": "   "}], r"passage 0: field 'text' is empty"),
        (
            [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}],
            r"passage 1: duplicate id 'a' \(first seen at passage 0\)",
        ),
        ([{"id": "a", "text": "word " * 40_000}], r"passage 0: field 'text' has 200,000 characters; the limit is"),
        ([], "no passages given"),
    ],
)
def test_an_edit_names_the_passage_the_caller_gave(tmp_path, retriever, corpus, passages, message):
    """Records are checked in memory before the lock is taken or anything is written; the error names the record
    by its place in what was given (and its id)."""
    out = build_index(corpus, retriever, tmp_path / "ix", progress=False)
    manifest = (out / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match=message) as error:
        add_passages(out, passages, retriever, progress=False)
    assert "\n" not in str(error.value) and (out / "manifest.json").read_bytes() == manifest
    assert not (out / "corpora").exists()


def test_a_passage_object_is_added_as_a_record(tmp_path, retriever, corpus):
    from tasks.passage import Passage

    out = build_index(corpus, retriever, tmp_path / "ix", progress=False)
    add_passages(out, [Passage(id="p", title="Zed", text="Zed is a town.")], retriever, progress=False)
    assert PassageIndex.load(out).get(["p"])[0] | {"doc_id": None} == {
        "id": "p",
        "doc_id": None,
        "title": "Zed",
        "section": "",
        "text": "Zed is a town.",
        "wikipedia_id": "",
    }


def test_only_a_record_much_longer_than_the_corpus_chunks_is_warned_about(tmp_path, retriever, corpus, caplog):
    out = build_index(corpus, retriever, tmp_path / "ix", progress=False)  # the corpus is chunked at 100 words
    records = tmp_path / "records.jsonl"
    records.write_text(
        json.dumps({"id": "edited", "text": " ".join(["river"] * 104)})
        + "\n"
        + json.dumps({"id": "long", "text": " ".join(["planet"] * 151)})
        + "\n"
    )
    with caplog.at_level("WARNING", logger="retriever.index.update"):
        add_passages(out, read_passage_files([records])[0], retriever, progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "1 passage(s) have over 1.5 times the words" in warnings[0]
    assert "'long'" in warnings[0] and "151 words" in warnings[0]


def test_a_build_killed_inside_a_chunk_resumes_from_its_last_block_byte_identical(
    tmp_path, retriever, corpus, monkeypatch
):
    """Progress is recorded every BLOCK_ROWS passages, not only per chunk: a build killed in the middle of a
    long chunk keeps the blocks it finished, and the resumed build writes the uninterrupted one's bytes."""
    from retriever.index import build as index_build

    monkeypatch.setattr(index_build, "BLOCK_ROWS", 4)
    options = {"settings": IndexSettings(chunk_size=16), "progress": False}
    reference = build_index(corpus, retriever, tmp_path / "ref", **options)
    calls = []
    embed = retriever.embed_passages

    def dying(passages, **kwargs):
        calls.append([p["id"] for p in passages])
        if len(calls) == 7:  # the 3rd block of the 2nd chunk of 16
            raise Killed
        return embed(passages, **kwargs)

    retriever.embed_passages = dying
    target = tmp_path / "resumed"
    try:
        with pytest.raises(Killed):
            build_index(corpus, retriever, target, **options)
    finally:
        del retriever.embed_passages
    progress = json.loads((work_dir_for(target) / "progress.json").read_text())
    assert (progress["completed_chunks"], progress["rows_in_chunk"]) == (1, 8)
    resumed = []

    def counting(passages, **kwargs):
        resumed.append(len(passages))
        return embed(passages, **kwargs)

    retriever.embed_passages = counting
    try:
        build_index(corpus, retriever, target, **options)
    finally:
        del retriever.embed_passages
    assert sum(resumed) == 40 - 16 - 8  # only what was not recorded
    for name in ("vectors.g1.npy",):
        assert (target / name).read_bytes() == (reference / name).read_bytes()
