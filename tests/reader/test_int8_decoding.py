"""int8 decoding (`inference.precision: int8`): the decoder and LM head swapped for int8 copies while `generate`
runs, the encoder and the copy head left in float32."""

from __future__ import annotations

import pytest
import torch

from reader.int8_decoding import (
    ANSWERING_PRECISIONS,
    Int8Decoding,
    answering_plan,
    int8_supported,
    quantized_copy,
)
from tests.reader.conftest import random_batch


def test_int8_greedy_decoding_is_the_argmax_of_the_int8_decoder(reader):
    """Greedy int8 decoding picks, step by step, the argmax of the int8 copies' logits over the float32 states."""
    input_ids, mask, _ = random_batch()
    generated = reader.generate(input_ids, mask, max_length=5, precision="int8")
    states = reader.encode(input_ids, mask)  # float32: int8 is the decoder's alone
    decoded = torch.zeros(2, 1, dtype=torch.long)
    finished = torch.zeros(2, dtype=torch.bool)
    with reader.int8_decoding.applied(reader.seq2seq):
        assert isinstance(reader.seq2seq.lm_head, torch.ao.nn.quantized.dynamic.Linear)
        for _ in range(5):
            logits = reader(attention_mask=mask, encoder_states=states, decoder_input_ids=decoded).logits[:, -1]
            step = logits.argmax(-1).masked_fill(finished, 0)
            decoded = torch.cat([decoded, step[:, None]], 1)
            finished |= step == 1
            if finished.all():
                break
    assert torch.equal(generated, decoded)


def test_int8_copies_stay_close_to_float32_and_leave_the_model_as_it_was(reader):
    input_ids, mask, labels = random_batch()
    decoder, lm_head = reader.seq2seq.decoder, reader.seq2seq.lm_head
    with torch.no_grad():
        exact = reader(input_ids, mask, labels=labels).logits
        with reader.int8_decoding.applied(reader.seq2seq):
            int8 = reader(input_ids, mask, labels=labels).logits
    assert reader.seq2seq.decoder is decoder and reader.seq2seq.lm_head is lm_head
    assert not torch.equal(int8, exact)  # the int8 layers did run
    cosine = torch.nn.functional.cosine_similarity(int8.flatten(1), exact.flatten(1))
    assert cosine.min() > 0.99
    with pytest.raises(RuntimeError, match="inside"), reader.int8_decoding.applied(reader.seq2seq):
        raise RuntimeError("inside")
    assert reader.seq2seq.decoder is decoder and reader.seq2seq.lm_head is lm_head  # restored after an error


def test_int8_copies_are_made_again_when_the_weights_change(reader):
    decoding = Int8Decoding()
    with decoding.applied(reader.seq2seq):
        first = reader.seq2seq.lm_head
    with decoding.applied(reader.seq2seq):
        assert reader.seq2seq.lm_head is first  # unchanged weights: the same copies
    with torch.no_grad():
        reader.seq2seq.lm_head.weight.mul_(2.0)  # as an optimizer step changes them, in place
    with decoding.applied(reader.seq2seq):
        again = reader.seq2seq.lm_head
    assert again is not first
    scale = again.weight().q_per_channel_scales() / first.weight().q_per_channel_scales()
    torch.testing.assert_close(scale, torch.full_like(scale, 2.0), rtol=1e-5, atol=0)


def test_int8_decoding_refuses_training_mode_and_non_cpu_devices(reader):
    reader.train()
    with pytest.raises(ValueError, match="for answering: call eval"), reader.int8_decoding.applied(reader.seq2seq):
        pass
    assert not int8_supported(torch.device("cuda"))
    assert int8_supported(torch.device("cpu")) == bool(torch.backends.quantized.supported_engines)


def test_quantized_copy_is_per_channel_and_leaves_the_original():
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    copy = quantized_copy(linear)
    assert copy.weight().qscheme() == torch.per_channel_affine
    assert isinstance(linear, torch.nn.Linear) and linear.weight.dtype == torch.float32
    x = torch.randn(3, 8)
    torch.testing.assert_close(copy(x), linear(x), atol=0.05, rtol=0.05)


def test_auto_is_int8_on_a_cpu_with_a_float32_encoder(reader):
    """On a CPU `auto` decodes as `int8` does, its encoder in float32 even where bf16 is native (a bf16 encoder
    moved answers); `bf16-int8` is both."""
    input_ids, mask, _ = random_batch()
    auto = reader.generate(input_ids, mask, max_length=5, num_beams=2, precision="auto")
    assert reader.int8_decoding._key is not None  # the int8 copies were made and used
    states = reader.encode(input_ids, mask, precision="fp32")
    int8 = reader.generate(input_ids, mask, max_length=5, num_beams=2, precision="int8", encoder_states=states)
    assert torch.equal(auto, int8)
    bf16_states = reader.encode(input_ids, mask, precision="bf16")
    both = reader.generate(input_ids, mask, max_length=5, num_beams=2, precision="bf16-int8")
    assert torch.equal(
        both, reader.generate(input_ids, mask, max_length=5, num_beams=2, precision="int8", encoder_states=bf16_states)
    )


@pytest.mark.parametrize(
    ("precision", "device", "plan"),
    [
        ("auto", "cpu", ("fp32", True)),
        ("auto", "cuda", ("auto", False)),  # bf16 where the GPU multiplies it natively
        ("fp32", "cpu", ("fp32", False)),
        ("bf16", "cpu", ("bf16", False)),
        ("int8", "cpu", ("fp32", True)),
        ("bf16-int8", "cpu", ("bf16", True)),
    ],
)
def test_each_inference_precision_says_the_encoders_precision_and_whether_to_decode_in_int8(precision, device, plan):
    if device == "cpu" and not int8_supported(torch.device("cpu")):
        pytest.skip("this PyTorch has no quantised engine for this CPU")
    assert answering_plan(precision, torch.device(device)) == plan


def test_an_unknown_inference_precision_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown inference precision 'fp16'; valid: \['auto', 'fp32'"):
        answering_plan("fp16", torch.device("cpu"))


def test_the_config_accepts_exactly_the_precisions_the_reader_answers_at():
    import typing

    from atlas.config import InferenceConfig

    assert typing.get_args(typing.get_type_hints(InferenceConfig)["precision"]) == ANSWERING_PRECISIONS


def test_weights_partitioned_by_zero3_decode_in_float32_at_auto_and_refuse_int8(reader):
    """Under DeepSpeed ZeRO-3 each rank's parameters are empty outside a forward (DeepSpeed marks them with
    `ds_id`): `auto` answers in float32 there, and an explicit int8 says why it cannot."""
    input_ids, mask, _ = random_batch()
    fp32 = reader.generate(input_ids, mask, max_length=5, num_beams=2, precision="fp32")
    for param in reader.seq2seq.parameters():
        param.ds_id = 0  # DeepSpeed's own marker of a partitioned parameter
    try:
        auto = reader.generate(input_ids, mask, max_length=5, num_beams=2, precision="auto")
        assert torch.equal(auto, fp32) and reader.int8_decoding._key is None  # no int8 copies made
        with pytest.raises(ValueError, match="DeepSpeed ZeRO-3 partitions: answer at fp32 or auto"):
            reader.generate(input_ids, mask, max_length=5, precision="int8")
    finally:
        for param in reader.seq2seq.parameters():
            del param.ds_id
