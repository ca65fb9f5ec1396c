"""The SDPA backends of the reader's passes that take gradients: cuDNN's left out (reader.attention_backend).

The backend flags are process-wide and can be read on any build, so each test records, at every call of
`scaled_dot_product_attention`, which backends PyTorch was allowed to pick from at that moment — what
a CUDA machine would dispatch on — and asserts the choice there.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.nn.attention import SDPBackend

from reader.attention_backend import (
    TRAINING_SDPA_BACKENDS_ENV,
    training_attention,
    training_sdpa_backends,
)
from reader.fid import FiDReader
from reader.inputs import encode_reader_inputs, encode_targets
from reader.tokenizer import build_reader_tokenizer
from reader.warm_start import build_warm_started


@dataclass(frozen=True)
class AttentionCall:
    """The backends allowed at one call of scaled_dot_product_attention, and whether it took gradients."""

    grad: bool
    cudnn: bool
    flash: bool
    efficient: bool
    math: bool


@pytest.fixture
def attention_calls(monkeypatch) -> list[AttentionCall]:
    """Every call of torch's scaled_dot_product_attention from here on, recorded, then computed as usual."""
    calls: list[AttentionCall] = []
    original = torch.nn.functional.scaled_dot_product_attention
    cuda = torch.backends.cuda

    def recorded(*args, **kwargs):
        calls.append(
            AttentionCall(
                torch.is_grad_enabled(),
                cuda.cudnn_sdp_enabled(),
                cuda.flash_sdp_enabled(),
                cuda.mem_efficient_sdp_enabled(),
                cuda.math_sdp_enabled(),
            )
        )
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    monkeypatch.delenv(TRAINING_SDPA_BACKENDS_ENV, raising=False)
    return calls


TRAINING = AttentionCall(grad=True, cudnn=False, flash=True, efficient=True, math=True)
ALL_ALLOWED = AttentionCall(grad=False, cudnn=True, flash=True, efficient=True, math=True)


@pytest.fixture(scope="module")
def tokenizer():
    return build_reader_tokenizer(None)


@pytest.fixture(scope="module")
def batch(tokenizer):
    """Two questions, the second with one passage (a padding row), answers of different lengths."""
    passages = [
        [
            {"title": "Zorbland", "text": "The capital of Zorbland is Quimper."},
            {"title": "Tarsia", "text": "The currency of Tarsia is the florin."},
        ],
        [{"title": "Olo", "text": "Anna Brook first climbed Mount Olo."}],
    ]
    ids, mask = encode_reader_inputs(
        tokenizer,
        ["question: capital? answer: <extra_id_0>", "question: who climbed? answer: <extra_id_0>"],
        passages,
        48,
    )
    labels = encode_targets(tokenizer, ["<extra_id_0> quimper", "<extra_id_0> anna brook"], 8)
    return ids, mask, labels


def warm_started_reader(tokenizer, encoder_path) -> FiDReader:
    """The shipped reader's kind (a BERT-family encoder under a T5 decoder with a copy head), tiny, in train mode."""
    decoder = {"num_decoder_layers": 2, "num_heads": 2, "d_kv": 16, "d_ff": 64, "copy": True}
    model = build_warm_started(decoder, tokenizer, encoder=str(encoder_path), dropout=0.0, seed=0)
    return FiDReader(model).train()


def test_the_backends_of_training_passes_leave_cudnn_out(monkeypatch):
    monkeypatch.delenv(TRAINING_SDPA_BACKENDS_ENV, raising=False)
    assert training_sdpa_backends() == [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def test_a_training_pass_of_the_warm_started_reader_runs_every_attention_without_cudnn(
    tokenizer, tiny_encoder_path, batch, attention_calls
):
    ids, mask, labels = batch
    reader = warm_started_reader(tokenizer, tiny_encoder_path)
    reader(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    # the encoder's 2 layers (once per group of passages) and the decoder's 2 self- and 2 cross-attentions
    assert len(attention_calls) >= 6
    assert set(attention_calls) == {TRAINING}
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after the pass


def test_a_pass_without_gradients_keeps_pytorchs_own_choice(tokenizer, tiny_encoder_path, batch, attention_calls):
    ids, mask, labels = batch
    reader = warm_started_reader(tokenizer, tiny_encoder_path).eval()
    with torch.no_grad():
        reader(input_ids=ids, attention_mask=mask, labels=labels)
        reader.generate(ids, mask, max_length=4)
    assert len(attention_calls) >= 6
    assert set(attention_calls) == {ALL_ALLOWED}


def test_the_recomputation_of_checkpointed_blocks_in_the_backward_runs_without_cudnn(
    tokenizer, tiny_encoder_path, batch, attention_calls
):
    ids, mask, labels = batch
    reader = warm_started_reader(tokenizer, tiny_encoder_path)
    reader.gradient_checkpointing_enable()
    loss = reader(input_ids=ids, attention_mask=mask, labels=labels).loss
    in_forward = len(attention_calls)
    loss.backward()  # outside the reader's forward: the blocks run again here
    assert len(attention_calls) > in_forward
    assert set(attention_calls[in_forward:]) == {TRAINING}


def test_the_plain_t5_reader_trains_without_cudnn_too(attention_calls):
    from tests.reader.conftest import random_batch, tiny_t5

    ids, mask, labels = random_batch()
    reader = FiDReader(tiny_t5()).train()
    reader(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    assert len(attention_calls) >= 6 and set(attention_calls) == {TRAINING}


def test_the_training_step_runs_the_readers_attention_without_cudnn(tiny_world, tmp_path, attention_calls):
    """The loop's own step (tiny FiD reader, under bf16 autocast as the failing recipe): every attention of
    the reader's passes that take gradients ran with cuDNN's kernel excluded."""
    from atlas.training.loop import TrainingRecipe
    from tests.atlas.test_train import tiny_config

    config = tiny_config(tiny_world, tmp_path / "run", "training.precision=bf16")
    recipe = TrainingRecipe(config, progress=False, overwrite=True)
    recipe.setup()
    reader_spans: list[tuple[int, int]] = []  # [first, last) indices of the calls made inside the reader
    recipe.model.reader.register_forward_pre_hook(lambda *_: reader_spans.append((len(attention_calls), -1)))
    recipe.model.reader.register_forward_hook(
        lambda *_: reader_spans.append((reader_spans.pop()[0], len(attention_calls)))
    )
    attention_calls.clear()
    losses = recipe.train_step()
    assert all(torch.isfinite(torch.tensor(value)) for value in losses.values())
    in_reader = [call for first, last in reader_spans for call in attention_calls[first:last]]
    trained = [call for call in in_reader if call.grad]
    assert len(trained) >= 4  # t5-tiny: at least its 2 decoder layers, self- and cross-attention
    assert set(trained) == {TRAINING}
    # the retriever loss's gold pass (eval mode, no gradients) keeps PyTorch's choice
    assert set(in_reader) - set(trained) <= {ALL_ALLOWED}


def test_an_environment_setting_replaces_the_backends_and_a_wrong_name_is_refused(monkeypatch):
    monkeypatch.setenv(TRAINING_SDPA_BACKENDS_ENV, "MATH")
    assert training_sdpa_backends() == [SDPBackend.MATH]
    with training_attention():
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setenv(TRAINING_SDPA_BACKENDS_ENV, "CUDNN_ATTENTION, MATH")
    assert training_sdpa_backends() == [SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    monkeypatch.setenv(TRAINING_SDPA_BACKENDS_ENV, "MATH,CUDNN")
    with pytest.raises(ValueError, match=r"ATLAS_TRAINING_SDPA_BACKENDS='MATH,CUDNN': unknown backend 'CUDNN'; valid"):
        training_sdpa_backends()
    monkeypatch.setenv(TRAINING_SDPA_BACKENDS_ENV, " , ")
    with pytest.raises(ValueError, match="no backend named"):
        training_sdpa_backends()
