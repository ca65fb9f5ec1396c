"""Passage index: search vs brute force, fingerprints, resumable build, add/remove, corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer, BertConfig, BertModel

from retriever.corpus import prepare_corpus
from retriever.encoder import ContrieverEncoder, Retriever, default_encoder_path
from retriever.index import (
    CorpusMismatchError,
    EncoderMismatchError,
    InvalidIndexError,
    PassageIndex,
)
from retriever.index_build import build_index, train_and_fill, work_dir_for
from retriever.index_types import exact_search, set_search_params
from retriever.index_update import add_passages, remove_passages

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
    tokenizer = AutoTokenizer.from_pretrained(default_encoder_path("minilm"))
    return Retriever(
        query_encoder=ContrieverEncoder(model, tokenizer, pooling="mean"), passage_maxlength=64
    )


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
    out = build_index(corpus, retriever, tmp_path / "flat", progress=False, chunk_size=16)
    index = PassageIndex.load(out, retriever=retriever)
    vectors = np.load(out / "vectors.g1.npy").astype(np.float64)
    queries = ["river king", "planet science film", "football election war"]
    query_vectors = retriever.embed_queries(queries).astype(np.float64)
    scores = query_vectors @ vectors.T
    expected_rows = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    hits = index.search(queries, 5)
    for q, q_hits in enumerate(hits):
        assert [h.row for h in q_hits] == list(expected_rows[q])
        np.testing.assert_allclose(
            [h.score for h in q_hits], scores[q, expected_rows[q]], rtol=1e-5
        )
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
    with pytest.raises(
        EncoderMismatchError, match="built with passage encoder .* would not be comparable"
    ):
        PassageIndex.load(out, retriever=other)
    assert len(PassageIndex.load(out, retriever=other, allow_encoder_mismatch=True)) == 40
    # a different passage format is a different encoder fingerprint too
    reformatted = Retriever(
        query_encoder=retriever.query_encoder, passage_format="{text}", passage_maxlength=64
    )
    with pytest.raises(EncoderMismatchError):
        PassageIndex.load(out, retriever=reformatted)
    other_corpus = tmp_path / "other"
    prepare_corpus(
        [write_docs(tmp_path / "o.jsonl", ["x1", "x2"], 5)], other_corpus, progress=False
    )
    with pytest.raises(CorpusMismatchError, match="is not the corpus the index"):
        PassageIndex.load(out, corpus=other_corpus)


class Killed(RuntimeError):
    pass


@pytest.mark.parametrize("spec,keep", [("Flat", False), ("IVF4,Flat", True)])
def test_resumed_build_is_byte_identical(tmp_path, retriever, corpus, spec, keep):
    options = {
        "spec": spec,
        "keep_embeddings": keep,
        "chunk_size": 8,
        "progress": False,
        "train_sample": 64,
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

    def counting(passages, **kwargs):
        embedded.extend(p["id"] for p in passages)
        return retriever_calls(passages, **kwargs)

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
        assert (target / name["name"]).read_bytes() == (reference / name["name"]).read_bytes(), (
            name["name"]
        )


def test_restart_and_mismatched_unfinished_build(tmp_path, retriever, corpus):
    def stop(chunk: int) -> None:
        raise Killed

    with pytest.raises(Killed):
        build_index(corpus, retriever, tmp_path / "ix", chunk_size=8, progress=False, on_chunk=stop)
    with pytest.raises(
        ValueError, match="unfinished build with different chunk_size is there; pass --restart"
    ):
        build_index(corpus, retriever, tmp_path / "ix", chunk_size=16, progress=False)
    build_index(corpus, retriever, tmp_path / "ix", chunk_size=16, progress=False, restart=True)
    with pytest.raises(FileExistsError, match="already exists"):
        build_index(corpus, retriever, tmp_path / "ix", progress=False)


@pytest.mark.parametrize("spec", ["Flat", "IVF2,Flat"])
def test_add_and_remove(tmp_path, retriever, corpus, spec):
    out = build_index(
        corpus, retriever, tmp_path / "ix", spec=spec, keep_embeddings=True, progress=False
    )
    old_vectors = np.load(out / "vectors.g1.npy")
    new_docs = write_docs(tmp_path / "new.jsonl", ["n1", "n2", "n3"], 7)
    stats = add_passages(out, [new_docs], retriever, progress=False)
    assert stats.added == 3 and stats.count == 43
    index = PassageIndex.load(out, retriever=retriever)
    np.testing.assert_array_equal(index.vectors[:40], old_vectors)  # nothing re-embedded
    new_text = index.corpora[1].get("n2-0")["text"]
    hits = {h.row: h for h in index.search([new_text], 100)[0]}
    assert sorted(hits) == list(range(43))  # the new passages are searchable beside the old ones
    assert hits[41].id == "n2-0" and hits[41].text == new_text
    with pytest.raises(ValueError, match="already in the index"):
        add_passages(out, [new_docs], retriever, progress=False)
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
    # a removed id can be added back (replacement)
    add_passages(out, [write_docs(tmp_path / "again.jsonl", ["n2"], 9)], retriever, progress=False)
    index = PassageIndex.load(out, retriever=retriever)
    assert len(index) == 42 and sorted(
        p.name for p in out.iterdir() if p.suffix in {".npy", ".faiss"}
    ) == sorted(r["name"] for r in index.manifest["files"].values())  # superseded files are gone


def test_corrupted_files_give_clear_errors(tmp_path, retriever, corpus):
    out = build_index(
        corpus, retriever, tmp_path / "ix", spec="SQ8", keep_embeddings=True, progress=False
    )
    faiss_file, vectors_file = out / "index.g1.faiss", out / "vectors.g1.npy"
    original = faiss_file.read_bytes()
    faiss_file.write_bytes(original[: len(original) // 2])
    with pytest.raises(
        InvalidIndexError, match=r"index.g1.faiss: truncated or altered \(\d+ bytes, manifest says"
    ):
        PassageIndex.load(out)
    corrupted = bytearray(original)
    corrupted[len(corrupted) // 2] ^= 0xFF
    faiss_file.write_bytes(bytes(corrupted))
    with pytest.raises(InvalidIndexError, match="corrupted"):
        PassageIndex.load(out)
    faiss_file.write_bytes(b"\x00" * len(original))
    with pytest.raises(InvalidIndexError, match="unreadable FAISS index"):
        PassageIndex.load(out, verify=False)
    faiss_file.write_bytes(original)
    vectors_file.unlink()
    with pytest.raises(InvalidIndexError, match="vectors.g1.npy: missing index file"):
        PassageIndex.load(out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(InvalidIndexError, match="corrupted manifest"):
        PassageIndex.load(out)
