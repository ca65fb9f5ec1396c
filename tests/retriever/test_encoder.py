"""ContrieverEncoder / Retriever: parity with sentence-transformers, pooling, save/load, fingerprints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.modeling import encoder_source
from retriever.encoder import ContrieverEncoder
from retriever.retriever import Retriever

TEXTS = [
    "The Eiffel Tower is in Paris.",
    "who wrote the declaration of independence",
    (
        "A much longer passage about the history of the printing press, movable type, Gutenberg, and the "
        "spread of literacy across Europe during the fifteenth and sixteenth centuries."
    ),
    "short",
    "Photosynthesis converts light energy into chemical energy in plants.",
]


@pytest.fixture(scope="module")
def minilm() -> ContrieverEncoder:
    return ContrieverEncoder.from_pretrained(encoder_source("minilm"))


def test_reads_sentence_transformers_settings(minilm):
    assert minilm.pooling == "mean" and minilm.normalize and minilm.max_length == 256 and minilm.dim == 384


def test_matches_sentence_transformers_encode(minilm):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(encoder_source("minilm"), device="cpu").encode(
        TEXTS, batch_size=2, convert_to_numpy=True
    )
    ours = minilm.embed_texts(TEXTS, batch_size=2, precision="fp32")  # bf16 is checked by its own tests
    assert ours.dtype == np.float32 and ours.shape == (5, 384)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_mean_pooling_ignores_padding(minilm):
    # the same text alone (no padding) and beside a long text (heavy padding) → same vector
    alone = minilm.embed_texts([TEXTS[3]], batch_size=1, precision="fp32")  # as above: bf16 rounds by shape
    padded = minilm.embed_texts([TEXTS[2], TEXTS[3]], batch_size=2, precision="fp32")[1]
    np.testing.assert_allclose(alone[0], padded, atol=1e-5)


def test_mean_pooling_formula_in_float64(minilm):
    batch = minilm.tokenize(TEXTS[:3])
    with torch.no_grad():
        hidden = minilm.model(**batch).last_hidden_state.double()
        pooled = minilm(**batch).double()
    for i in range(3):
        n = int(batch["attention_mask"][i].sum())
        mean = hidden[i, :n].mean(dim=0)
        expected = mean / mean.norm()
        torch.testing.assert_close(pooled[i], expected, atol=1e-5, rtol=0)


def test_sorted_and_unsorted_batches_give_input_order(minilm):
    # float32: under bf16 (`auto` on a CPU with native bfloat16) a vector rounds differently by batch shape
    sorted_ = minilm.embed_texts(TEXTS, batch_size=2, sort_by_length=True, precision="fp32")
    naive = minilm.embed_texts(TEXTS, batch_size=2, sort_by_length=False, precision="fp32")
    one_by_one = np.stack([minilm.embed_texts([t], precision="fp32")[0] for t in TEXTS])
    np.testing.assert_allclose(sorted_, one_by_one, atol=1e-5)
    np.testing.assert_allclose(naive, one_by_one, atol=1e-5)


def test_cls_pooling_takes_first_token(minilm):
    cls_encoder = ContrieverEncoder(minilm.model, minilm.tokenizer, pooling="cls", normalize=False)
    batch = minilm.tokenize(TEXTS[:2])
    with torch.no_grad():
        expected = minilm.model(**batch).last_hidden_state[:, 0]
        torch.testing.assert_close(cls_encoder(**batch), expected)
    with pytest.raises(ValueError, match="valid: mean, cls"):
        ContrieverEncoder(minilm.model, minilm.tokenizer, pooling="max")


def test_retriever_gradients_and_round_trip(tmp_path, minilm):
    retriever = Retriever.from_pretrained(encoder_source("minilm"), tied=False)
    assert not retriever.tied
    q = retriever.encode_queries(["who wrote hamlet"])
    assert q.shape == (1, 384) and q.requires_grad
    q.sum().backward()
    assert retriever.query_encoder.model.embeddings.word_embeddings.weight.grad is not None
    passage = {"title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."}
    assert retriever.format_passage(passage) == "Hamlet Hamlet is a tragedy by William Shakespeare."
    assert retriever.format_passage({"title": "", "text": "x"}) == "x"
    fingerprint = retriever.passage_fingerprint()
    retriever.save_pretrained(tmp_path / "r")
    loaded = Retriever.from_pretrained(tmp_path / "r")
    assert not loaded.tied and loaded.passage_fingerprint() == fingerprint
    np.testing.assert_allclose(loaded.embed_passages([passage]), retriever.embed_passages([passage]), atol=1e-6)
    # any change to what fixes a passage embedding changes the fingerprint
    with torch.no_grad():
        loaded.passage_encoder.model.embeddings.word_embeddings.weight[0, 0] += 1e-3
    assert loaded.passage_fingerprint() != fingerprint
    other_format = Retriever(query_encoder=minilm, passage_format="{text}")
    assert other_format.passage_fingerprint() != Retriever(query_encoder=minilm).passage_fingerprint()
    with pytest.raises(ValueError, match="unknown field"):
        Retriever(query_encoder=minilm, passage_format="{body}")


@pytest.mark.parametrize("tied", [True, False])
def test_build_retriever_honours_config_pooling(tmp_path, tied, caplog):
    """`retriever.pooling` reaches both encoders: cls pooling gives the first token's state,
    a different vector from mean pooling, and a different passage fingerprint (so an index
    built with one refuses the other)."""
    from atlas.config import RetrieverConfig
    from retriever.retriever import Retriever

    mean = Retriever.from_config(RetrieverConfig(model="minilm", tied=tied))
    cls = Retriever.from_config(RetrieverConfig(model="minilm", tied=tied, pooling="cls"))
    assert {mean.query_encoder.pooling, mean.passage_encoder.pooling} == {"mean"}
    assert {cls.query_encoder.pooling, cls.passage_encoder.pooling} == {"cls"}
    assert "saved with mean pooling; using cls pooling as asked" in caplog.text  # MiniLM's own is mean
    passage = {"title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."}
    cls_vector = cls.embed_passages([passage], precision="fp32")[0]
    mean_vector = mean.embed_passages([passage], precision="fp32")[0]
    assert np.abs(cls_vector - mean_vector).max() > 1e-2
    encoder = cls.passage_encoder
    batch = encoder.tokenize([cls.format_passage(passage)], cls.passage_maxlength)
    with torch.no_grad():
        first = encoder.model(**batch).last_hidden_state[:, 0]
    np.testing.assert_allclose(cls_vector, torch.nn.functional.normalize(first, dim=-1)[0].numpy(), atol=1e-5)
    assert cls.passage_fingerprint() != mean.passage_fingerprint()
    # a saved retriever keeps its pooling (also through a config that leaves it unset), and a
    # config that sets it overrides it on the way back in
    cls.save_pretrained(tmp_path / "r")
    assert Retriever.from_pretrained(tmp_path / "r").query_encoder.pooling == "cls"
    kept = Retriever.from_config(RetrieverConfig(model=str(tmp_path / "r"), tied=tied))
    assert {kept.query_encoder.pooling, kept.passage_encoder.pooling} == {"cls"}
    reloaded = Retriever.from_config(RetrieverConfig(model=str(tmp_path / "r"), tied=tied, pooling="mean"))
    assert {reloaded.query_encoder.pooling, reloaded.passage_encoder.pooling} == {"mean"}
