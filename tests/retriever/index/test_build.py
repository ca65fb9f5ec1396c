"""The index build's embedding step (`retriever.index.build.embed_corpus`): a chunk is embedded in blocks of passages
taken longest first and written at their own rows, resumably, by one process or by ranks, with the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from common.modeling import encoder_source
from retriever.corpus import Corpus, prepare_corpus
from retriever.index import build as index_build
from retriever.index.build import build_index, chunk_order, embed_corpus, work_dir_for
from retriever.index.settings import IndexSettings
from retriever.retriever import Retriever

WORDS = ["river", "mountain", "city", "music", "king", "war", "bridge", "island", "science", "novel", "film", "ocean"]
COUNT = 40


class Killed(RuntimeError):
    pass


@pytest.fixture(scope="module")
def retriever() -> Retriever:
    return Retriever.from_pretrained(encoder_source("minilm"), precision="fp32")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """COUNT passages of 1 to 150 words in no order of length (a passage each, not chunked): a block of the
    longest has nothing in common with a block in row order."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    lengths = rng.permutation(np.linspace(1, 150, COUNT).astype(int))
    with open(folder / "docs.jsonl", "w") as f:
        for i, n in enumerate(lengths):
            text = " ".join(rng.choice(WORDS, size=int(n)))
            f.write(json.dumps({"id": f"p{i}", "title": f"Title {i}", "text": text}) + "\n")
    prepare_corpus([folder / "docs.jsonl"], folder / "prepared", chunk_words=0, progress=False)
    return folder / "prepared"


def recording(retriever: Retriever, calls: list, *, kill_at: int | None = None):
    """`retriever.embed_passages` that records the ids of each block it embeds (and raises Killed at call
    `kill_at`, counted from 1)."""

    def embed_passages(passages, *, precision=None, **kwargs):  # takes `precision` as the retriever's own does
        if len(calls) + 1 == kill_at:
            raise Killed
        calls.append([p["id"] for p in passages])
        return Retriever.embed_passages(retriever, passages, precision=precision, **kwargs)

    return embed_passages


def test_the_chunk_order_is_longest_first_in_tokens_with_ties_in_row_order(corpus, retriever):
    chunk = Corpus.load(corpus)
    passages = chunk.rows(range(8, 24))
    lengths = retriever.passage_lengths(passages)  # the tokens the encoder reads, [CLS] and [SEP] included
    encoder = retriever.passage_encoder
    masks = [
        encoder.tokenize([retriever.format_passage(p)], retriever.passage_maxlength)["attention_mask"] for p in passages
    ]
    assert lengths.tolist() == [int(m.sum()) for m in masks]
    order = chunk_order(chunk, 8, 16, retriever, "length")
    assert sorted(order.tolist()) == list(range(8, 24))
    assert (np.diff(lengths[order - 8]) <= 0).all() and (np.diff(lengths) > 0).any()
    assert chunk_order(chunk, 32, 16, retriever, "corpus").tolist() == list(range(32, COUNT))
    # ties: every passage written as "" is as long as every other, so the order is the rows'
    sections = Retriever(query_encoder=retriever.query_encoder, passage_format="{section}")
    assert chunk_order(chunk, 0, 16, sections, "length").tolist() == list(range(16))


def test_blocks_are_slices_of_the_length_order_and_each_vector_lands_at_its_row(
    tmp_path, corpus, retriever, monkeypatch
):
    """With passages of 1 to 150 words, a block's vectors written at the block's positions instead of its rows
    would put a long passage's vector at a short one's row: each row is checked against its passage embedded alone."""
    monkeypatch.setattr(index_build, "BLOCK_ROWS", 4)
    calls = []
    monkeypatch.setattr(retriever, "embed_passages", recording(retriever, calls))
    out = build_index(corpus, retriever, tmp_path / "ix", IndexSettings(chunk_size=16), progress=False)
    monkeypatch.undo()
    passages = Corpus.load(corpus).rows(range(COUNT))
    length = dict(zip([p["id"] for p in passages], retriever.passage_lengths(passages).tolist()))
    assert [len(c) for c in calls] == [4] * 10
    for chunk in (calls[:4], calls[4:8], calls[8:]):  # chunks of 16, 16 and 8 passages
        lengths = [length[i] for block in chunk for i in block]
        assert lengths == sorted(lengths, reverse=True)

    vectors = np.load(out / "vectors.g1.npy").astype(np.float32)
    alone = np.concatenate([retriever.embed_passages([p], batch_size=1) for p in passages])
    cosines = (vectors * alone).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(alone, axis=1)
    assert cosines.min() > 0.999, cosines.min()
    others = alone @ alone.T - 2 * np.eye(COUNT)  # normalised vectors: cosines, each passage's own left out
    assert others.max() < 0.99  # passages this different: a vector at another's row fails the check above


def test_a_build_killed_mid_chunk_resumes_the_same_blocks_to_the_same_bytes(tmp_path, corpus, retriever, monkeypatch):
    """`rows_in_chunk` counts positions of the chunk's length order: the resumed build computes the order again and
    embeds exactly the blocks the uninterrupted one embedded after them."""
    monkeypatch.setattr(index_build, "BLOCK_ROWS", 4)
    options = {"settings": IndexSettings(chunk_size=16), "progress": False}
    reference_calls = []
    monkeypatch.setattr(retriever, "embed_passages", recording(retriever, reference_calls))
    reference = build_index(corpus, retriever, tmp_path / "ref", **options)
    target = tmp_path / "resumed"
    monkeypatch.setattr(retriever, "embed_passages", recording(retriever, [], kill_at=7))  # block 3 of chunk 2
    with pytest.raises(Killed):
        build_index(corpus, retriever, target, **options)
    progress = json.loads((work_dir_for(target) / "progress.json").read_text())
    assert (progress["completed_chunks"], progress["rows_in_chunk"], progress["block_order"]) == (1, 8, "length")

    resumed_calls = []
    monkeypatch.setattr(retriever, "embed_passages", recording(retriever, resumed_calls))
    build_index(corpus, retriever, target, **options)
    assert resumed_calls == reference_calls[6:]
    assert (target / "vectors.g1.npy").read_bytes() == (reference / "vectors.g1.npy").read_bytes()


def test_ranks_sharing_the_chunks_write_the_single_process_bytes(tmp_path, corpus, retriever, monkeypatch):
    """Two ranks run one after the other here (each embeds its own chunks; the barriers have nothing to wait for)."""
    monkeypatch.setattr(index_build, "BLOCK_ROWS", 4)
    chunk = Corpus.load(corpus)
    single, _ = embed_corpus(chunk, retriever, tmp_path / "one", chunk_size=16, progress=False)
    for rank in (0, 1):
        shared, _ = embed_corpus(
            chunk, retriever, tmp_path / "two", chunk_size=16, progress=False, rank=rank, world_size=2
        )
    assert shared.read_bytes() == single.read_bytes()


def test_a_work_folder_left_in_another_block_order_is_not_resumed(tmp_path, corpus, retriever):
    """Vectors embedded in another order differ in their last bits: an unfinished build in row order (as builds
    before the length order were; their work folders do not record it) is refused, not finished in a mix."""
    chunk = Corpus.load(corpus)

    def stop(chunk: int) -> None:
        raise Killed

    with pytest.raises(Killed):
        embed_corpus(
            chunk, retriever, tmp_path / "w", chunk_size=16, progress=False, on_chunk=stop, block_order="corpus"
        )
    with pytest.raises(ValueError, match="unfinished build with different block_order is there; pass --restart"):
        embed_corpus(chunk, retriever, tmp_path / "w", chunk_size=16, progress=False)
    progress = tmp_path / "w" / "progress.json"
    older = json.loads(progress.read_text())
    del older["block_order"]
    progress.write_text(json.dumps(older))
    with pytest.raises(ValueError, match="different block_order"):
        embed_corpus(chunk, retriever, tmp_path / "w", chunk_size=16, progress=False, block_order="corpus")
    with pytest.raises(ValueError, match="block_order 'short': valid: length, corpus"):
        embed_corpus(chunk, retriever, tmp_path / "x", chunk_size=16, progress=False, block_order="short")
    assert not (tmp_path / "x").exists()
