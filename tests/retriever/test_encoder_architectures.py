"""Contriever's published architecture (BERT-base uncased) built with random weights
(`retriever.encoder_architectures`): the published numbers, the real vocabulary, a 768-d encoder folder that loads
tied and untied, and an index built and re-embedded with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retriever.encoder_architectures import encoder_architecture, random_contriever, write_random_contriever
from retriever.index import PassageIndex
from retriever.index.build import build_index
from retriever.retriever import Retriever
from retriever.retriever_config import RetrieverConfig

# bert-base-uncased's config.json and model card (Devlin et al., 2019): 110M parameters, 109,482,240 with the
# pooler (768·768 + 768) that Contriever never reads
BERT_BASE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
}
BERT_BASE_PARAMETERS = 109_482_240 - (768 * 768 + 768)


@pytest.mark.parametrize("name", ["contriever", "facebook/contriever", "facebook/contriever-msmarco"])
def test_contriever_is_bert_base(name):
    with torch.device("meta"):
        encoder = random_contriever(name)
    config = encoder.model.config
    assert {key: getattr(config, key) for key in BERT_BASE} == BERT_BASE
    assert sum(p.numel() for p in encoder.model.parameters()) == BERT_BASE_PARAMETERS
    assert (encoder.pooling, encoder.normalize, encoder.dim) == ("mean", False, 768)


def test_the_tokenizer_is_bert_base_uncased():
    tokenizer = random_contriever("contriever", layers=1, head_dim=1).tokenizer
    assert len(tokenizer) == 30522 and tokenizer.model_max_length == 512
    ids = tokenizer.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"])
    assert ids == [0, 100, 101, 102, 103, 1996]  # bert-base-uncased's ids
    assert tokenizer.tokenize("The Capital") == ["the", "capital"]


def test_a_narrower_shallower_copy_keeps_heads_and_vocabulary():
    narrow = encoder_architecture("contriever", head_dim=4, layers=2)
    assert (narrow["hidden_size"], narrow["intermediate_size"], narrow["num_hidden_layers"]) == (48, 192, 2)
    assert narrow["num_attention_heads"] == 12 and narrow["vocab_size"] == 30522
    with pytest.raises(ValueError, match="head_dim must be positive, not -1"):
        encoder_architecture("contriever", head_dim=-1)
    with pytest.raises(ValueError, match="no published encoder architecture named 'minilm'"):
        encoder_architecture("minilm")


@pytest.fixture(scope="module")
def contriever_768(tmp_path_factory):
    """A Contriever folder at the full width (768-d embeddings), one layer deep."""
    return write_random_contriever("contriever", tmp_path_factory.mktemp("contriever") / "encoder", layers=1)


def test_the_folder_loads_tied_and_untied(contriever_768):
    untied = Retriever.from_config(RetrieverConfig(model=str(contriever_768), tied=False))
    tied = Retriever.from_config(RetrieverConfig(model=str(contriever_768), tied=True))
    assert tied.tied and not untied.tied and untied.dim == tied.dim == 768
    assert not any(p.requires_grad for p in untied.passage_encoder.parameters())  # the index stays valid
    assert all(p.requires_grad for p in untied.query_encoder.parameters())
    queries = untied.embed_queries(["who first climbed mount olo"])
    assert queries.shape == (1, 768)
    np.testing.assert_allclose(queries, tied.embed_queries(["who first climbed mount olo"]), atol=1e-5)
    assert untied.passage_fingerprint() == tied.passage_fingerprint()


def test_an_index_is_built_and_re_embedded_with_the_768_d_encoder(contriever_768, tiny_world, tmp_path):
    retriever = Retriever.from_config(RetrieverConfig(model=str(contriever_768), tied=True, precision="fp32"))
    build_index(tiny_world["corpus"], retriever, tmp_path / "index", progress=False)
    before = PassageIndex.load(tmp_path / "index")
    assert before.dim == 768 and len(before) == 5
    with torch.no_grad():  # what training the tied encoder does to the passage side
        for p in retriever.passage_encoder.model.encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    build_index(tiny_world["corpus"], retriever, tmp_path / "index", progress=False, overwrite=True)
    after = PassageIndex.load(tmp_path / "index")
    assert after.manifest.encoder_fingerprint != before.manifest.encoder_fingerprint
    assert not np.array_equal(np.asarray(after.vectors), np.asarray(before.vectors))
    query = retriever.embed_queries(["what is the capital of zorbland"])
    scores, _ = after.search_vectors(query, 3)
    np.testing.assert_allclose(
        scores[0], np.sort(np.asarray(after.vectors, dtype=np.float32) @ query[0])[::-1][:3], rtol=1e-2
    )
