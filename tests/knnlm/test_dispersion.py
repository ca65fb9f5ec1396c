"""Representation dispersion against brute-force pairwise cosine distances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from atlas.knnlm.dispersion import (
    DispersionAccumulator,
    default_dispersion_keys,
    layer_dispersion,
    recommend_key,
)
from reader.dispersion_loss import mean_pairwise_cosine_distance


def brute_force_dispersion(vectors: np.ndarray) -> float:
    """Mean of 1 − cos over all unordered pairs, one pair at a time in float64."""
    vectors = np.asarray(vectors, dtype=np.float64)
    distances = [1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in itertools.combinations(vectors, 2)]
    return float(np.mean(distances))


def test_closed_form_equals_brute_force_with_and_without_mask():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(3, 5, 4)) + 0.5
    mask = rng.random((3, 5)) < 0.6
    value = mean_pairwise_cosine_distance(torch.from_numpy(hidden))
    assert value.item() == pytest.approx(brute_force_dispersion(hidden.reshape(-1, 4)), abs=1e-12)
    masked = mean_pairwise_cosine_distance(torch.from_numpy(hidden), torch.from_numpy(mask))
    assert masked.item() == pytest.approx(brute_force_dispersion(hidden[mask]), abs=1e-12)
    with pytest.raises(ValueError, match="at least 2 vectors"):
        mean_pairwise_cosine_distance(torch.ones(1, 4))


def test_accumulator_over_chunks_equals_all_pairs():
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(23, 6))
    accumulator = DispersionAccumulator()
    for chunk in np.array_split(vectors, 4):
        accumulator.add("x", torch.from_numpy(chunk))
    assert accumulator.dispersion()["x"] == pytest.approx(brute_force_dispersion(vectors), abs=1e-12)


def test_layer_dispersion_matches_brute_force_on_hidden_states():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=30,
            n_positions=16,
            n_embd=8,
            n_layer=2,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
    ).eval()
    ids = np.random.default_rng(2).integers(0, 30, size=27)  # 3 windows of 8, 3 tokens left over
    specs = default_dispersion_keys(model)
    assert specs == [
        "layer_output:0",
        "layer_output:1",
        "ffn_input:-1",
        "attn_output:-1",
        "ffn_output:-1",
    ]
    values = layer_dispersion(model, ids, key_specs=specs, context=8, batch_size=2)
    with torch.no_grad():
        hidden = model(input_ids=torch.from_numpy(ids[:24].reshape(3, 8)), output_hidden_states=True).hidden_states
    assert values["layer_output:0"] == pytest.approx(brute_force_dispersion(hidden[1].reshape(-1, 8).numpy()), abs=1e-6)
    assert recommend_key(values) == max(values, key=values.get)
    sampled = layer_dispersion(model, ids, key_specs=["layer_output:0"], context=8, sample_fraction=0.5, seed=3)
    assert sampled == layer_dispersion(model, ids, key_specs=["layer_output:0"], context=8, sample_fraction=0.5, seed=3)
    assert sampled["layer_output:0"] != values["layer_output:0"]


def test_auxiliary_loss_is_ce_minus_mu_dispersion_and_has_gradients():
    # atlas/model.py's reader loss with `reader.dispersion_weight` μ: CE − μ · dispersion(final hidden
    # states of the non-padding tokens), against the brute-force oracle (tests/atlas/test_train.py runs the model)
    rng = np.random.default_rng(4)
    hidden = torch.tensor(rng.normal(size=(2, 4, 3)), requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    ce = torch.tensor(2.5, dtype=torch.float64)
    loss = ce - 0.3 * mean_pairwise_cosine_distance(hidden, mask)
    expected = 2.5 - 0.3 * brute_force_dispersion(hidden.detach().numpy()[mask.bool().numpy()])
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    loss.backward()
    assert hidden.grad[0, 0].abs().sum() > 0 and hidden.grad[0, 3].abs().sum() == 0  # padding gets none
