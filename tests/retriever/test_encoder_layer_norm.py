"""The encoder's `layer_norm` option: "reference" is facebookresearch/atlas's BertLayerNorm,
y = w ⊙ (x − mean x) / sqrt(mean x² + eps) + b, checked against that formula in float64; it is saved
with the encoder and changes the fingerprint (so an index knows), "standard" changes nothing."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer, BertModel

from retriever.encoder import ContrieverEncoder, ReferenceLayerNorm, use_layer_norm
from retriever.retriever import Retriever


def second_moment_norm(x, weight, bias, eps):
    x, weight, bias = x.double(), weight.double(), bias.double()
    return weight * (x - x.mean(-1, keepdim=True)) / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) + bias


def test_reference_layer_norm_is_the_formula():
    torch.manual_seed(0)
    norm = ReferenceLayerNorm(64, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(64))
        norm.bias.copy_(0.2 * torch.randn(64))
    x = 0.8 + 1.5 * torch.randn(3, 7, 64)  # a mean of its own: where the two norms differ
    norm.requires_grad_(False)
    want = second_moment_norm(x, norm.weight, norm.bias, 1e-12)
    got = norm(x)
    assert got.dtype == torch.float32
    assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-6
    stock = nn.functional.layer_norm(x, (64,), norm.weight, norm.bias, 1e-12)
    assert float((stock.double() - want).abs().max() / want.abs().max()) > 1e-2
    # computed in float32 whatever the input, returned in the input's dtype (as the reference)
    half = norm(x.bfloat16())
    assert half.dtype == torch.bfloat16
    assert float((half.double() - want).abs().max() / want.abs().max()) < 1e-2
    # eps as given: large eps damps small inputs exactly as the formula says
    tiny = 1e-3 * torch.randn(2, 64)
    damped = ReferenceLayerNorm(64, eps=1e-6).requires_grad_(False)
    assert torch.allclose(
        damped(tiny).double(), second_moment_norm(tiny, damped.weight, damped.bias, 1e-6), rtol=1e-6, atol=1e-7
    )


def test_swapping_keeps_the_parameters_and_is_reversible(tiny_encoder_path):
    model = BertModel.from_pretrained(str(tiny_encoder_path), add_pooling_layer=False).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[101, 2054, 2003, 102], [101, 7592, 102, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        stock = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weight = model.embeddings.LayerNorm.weight
    use_layer_norm(model, "reference")
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 1 + 2 * model.config.num_hidden_layers  # embeddings, attention output, layer output
    assert all(type(m) is ReferenceLayerNorm for m in norms)
    assert model.embeddings.LayerNorm.weight is weight  # the same parameter objects: optimizers keep them
    assert {k: torch.equal(v, before[k]) for k, v in model.state_dict().items()} == dict.fromkeys(before, True)
    with torch.no_grad():
        changed = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.allclose(changed, stock)
    use_layer_norm(model, "standard")
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).last_hidden_state, stock)
    with pytest.raises(ValueError, match="valid: standard, reference"):
        use_layer_norm(model, "rms")


def test_the_setting_is_saved_and_fingerprinted(tiny_encoder_path, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_encoder_path))
    standard = ContrieverEncoder.from_pretrained(tiny_encoder_path)
    assert standard.layer_norm == "standard"
    assert set(standard.fingerprint()) == {"weights", "tokenizer", "pooling", "normalize"}  # as before the option

    model = BertModel.from_pretrained(str(tiny_encoder_path), add_pooling_layer=False).eval()
    reference = ContrieverEncoder(model, tokenizer, layer_norm="reference")
    assert reference.fingerprint()["layer_norm"] == "reference"
    assert reference.fingerprint()["weights"] == standard.fingerprint()["weights"]
    reference.save_pretrained(tmp_path / "encoder")
    assert json.loads((tmp_path / "encoder" / "contriever_config.json").read_text())["layer_norm"] == "reference"
    loaded = ContrieverEncoder.from_pretrained(tmp_path / "encoder")
    assert loaded.layer_norm == "reference"
    texts = ["the capital of zorbland", "a river"]
    with torch.no_grad():
        assert torch.equal(loaded.encode(texts), reference.encode(texts))
        assert not torch.allclose(loaded.encode(texts), standard.encode(texts))

    # an untied pair copied from one reference encoder keeps the norm on both sides
    Retriever(query_encoder=reference).save_pretrained(tmp_path / "retriever")
    pair = Retriever.from_pretrained(tmp_path / "retriever", tied=False)
    assert pair.query_encoder.layer_norm == pair.passage_encoder.layer_norm == "reference"
    assert isinstance(pair.passage_encoder.model.embeddings.LayerNorm, ReferenceLayerNorm)
    with pytest.raises(ValueError, match="unknown layer_norm 'rms'"):
        ContrieverEncoder(model, tokenizer, layer_norm="rms")
