"""The bfloat16 encoder pass behind the retriever losses' gold scores (`retriever.gold_precision`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration

from reader import encoder_precision
from reader.encoder_precision import resolve_precision
from reader.fid import FiDReader
from retriever.losses import build_retriever_loss


def _reader(dropout: float = 0.0, seed: int = 0) -> FiDReader:
    """A T5 reader wide enough (d_model 128) for rounding to be typical of real ones."""
    config = T5Config(
        vocab_size=64,
        d_model=128,
        d_ff=256,
        d_kv=32,
        num_heads=4,
        num_layers=2,
        num_decoder_layers=2,
        dropout_rate=dropout,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    return FiDReader(T5ForConditionalGeneration(config))


def _batch(batch: int = 2, n_passages: int = 4, length: int = 24, target: int = 5):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 64, (batch, n_passages, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, 1, -6:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.randint(2, 64, (batch, target), generator=gen)
    return ids, mask, labels


def test_bf16_states_are_float32_close_to_full_precision_and_not_equal():
    reader = _reader().eval()
    ids, mask = _batch()[:2]
    with torch.no_grad():
        full = reader.encode(ids, mask)
        bf16 = reader.encode(ids, mask, precision="bf16")
    assert bf16.dtype == torch.float32 and bf16.shape == full.shape
    real = mask.bool()
    error = (bf16 - full)[real].norm() / full[real].norm()
    assert 0 < error < 0.02, error  # not 0: the pass ran in bfloat16; bfloat16 keeps ~3 significant digits


def test_auto_is_full_precision_under_grad_and_for_a_float64_encoder(monkeypatch):
    monkeypatch.setattr(encoder_precision, "native_bf16", lambda device: True)  # as on AVX512-BF16 cores
    reader = _reader().eval()
    ids, mask = _batch()[:2]
    with_grad = reader.encode(ids, mask, precision="auto")
    assert with_grad.requires_grad
    torch.testing.assert_close(with_grad, reader.encode(ids, mask), rtol=0, atol=0)
    with torch.no_grad():
        assert not torch.equal(reader.encode(ids, mask, precision="auto"), reader.encode(ids, mask))
    assert resolve_precision("auto", reader.seq2seq.encoder) == "bf16"
    assert resolve_precision("auto", reader.seq2seq.encoder.double()) == "fp32"
    monkeypatch.setattr(encoder_precision, "native_bf16", lambda device: False)  # emulated bf16: slower
    assert resolve_precision("auto", reader.seq2seq.encoder.float()) == "fp32"


def test_unknown_precisions_are_refused_with_the_valid_names():
    encoder = _reader().seq2seq.encoder
    assert resolve_precision("bf16", encoder) == "bf16" and resolve_precision("fp32", encoder) == "fp32"
    with pytest.raises(ValueError, match=r"unknown precision 'full'"):  # a name written before a release
        resolve_precision("full", encoder)
    with pytest.raises(ValueError, match=r"unknown precision 'int8'; valid: \['auto', 'fp32', 'bf16'\]"):
        resolve_precision("int8", encoder)
    with pytest.raises(ValueError, match="unknown gold precision 'fp16'"):
        build_retriever_loss("pdist", gold_precision="fp16")


@pytest.mark.parametrize("loss_name", ["pdist", "adist", "loop", "emdr"])
def test_bf16_gold_scores_rank_passages_as_full_precision_does(loss_name):
    reader = _reader(dropout=0.1).train()
    ids, mask, labels = _batch(batch=3, n_passages=6)
    full = build_retriever_loss(loss_name).gold_scores(reader, ids, mask, labels)
    bf16 = build_retriever_loss(loss_name, gold_precision="bf16").gold_scores(reader, ids, mask, labels)
    assert reader.training  # the reader's mode is restored
    spread = (full.max(-1).values - full.min(-1).values).mean()
    assert 0 < (bf16 - full).abs().max() < 0.1 * spread
    for row_bf16, row_full in zip(bf16, full):  # the passages keep their order, up to near-ties
        assert torch.corrcoef(torch.stack([row_bf16, row_full]))[0, 1] > 0.95


def test_the_training_step_uses_the_recipes_gold_precision(tiny_world):
    """`retriever.gold_precision` reaches the loss that `Atlas.losses` calls: with dropout in the
    encoder, bf16 and fp32 give different but close retriever losses."""
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec
    from tasks.base import get_task

    assert load_config(None, []).retriever.gold_precision == "auto"
    losses = {}
    for precision in ("fp32", "bf16"):
        model = load_model(
            recipe_spec(
                load_config(
                    None,
                    [
                        f"retriever.model={tiny_world['encoder']}",
                        f"index.path={tiny_world['index']}",
                        "reader.model=t5-tiny",
                        "retriever.loss=pdist",
                        "retriever.n_context=3",
                        "reader.n_context=2",
                        "reader.dropout=0.1",
                        "reader.text_maxlength=48",
                        "training.seed=3",
                        f"retriever.gold_precision={precision}",
                    ],
                )
            )
        )
        assert model.retriever_loss.gold_precision == precision
        model.train()
        model.retriever.eval()  # deterministic retriever scores: the comparison is about the gold side
        examples = get_task("qa").load(tiny_world["qa"])[:2]
        torch.manual_seed(0)
        losses[precision] = model.losses(examples, [e.answers[0] for e in examples])["retriever"].item()
    assert losses["fp32"] != losses["bf16"]
    assert abs(losses["fp32"] - losses["bf16"]) < 0.1 * abs(losses["fp32"]) + 1e-3


def _dtypes_seen(reader: FiDReader) -> tuple[dict, list]:
    """Output dtypes of the encoder's first linear layer and of the decoder's output layer, as they run."""
    seen: dict = {"encoder": set(), "decoder": set()}
    encoder_linear = next(m for m in reader.seq2seq.encoder.modules() if isinstance(m, nn.Linear))
    handles = [
        encoder_linear.register_forward_hook(lambda _m, _i, out: seen["encoder"].add(out.dtype)),
        reader.seq2seq.lm_head.register_forward_hook(lambda _m, _i, out: seen["decoder"].add(out.dtype)),
    ]
    return seen, handles


def test_bf16_generation_encodes_in_bfloat16_and_decodes_at_full_precision():
    reader = _reader().eval()
    ids, mask = _batch()[:2]
    seen, handles = _dtypes_seen(reader)
    try:
        full = reader.generate(ids, mask, max_length=4, num_beams=2)
        assert seen == {"encoder": {torch.float32}, "decoder": {torch.float32}}
        seen["encoder"].clear(), seen["decoder"].clear()
        bf16 = reader.generate(ids, mask, max_length=4, num_beams=2, precision="bf16")
        assert seen == {"encoder": {torch.bfloat16}, "decoder": {torch.float32}}
    finally:
        for handle in handles:
            handle.remove()
    assert bf16.shape[0] == full.shape[0] and bf16[:, 0].eq(full[:, 0]).all()  # both start at the start token


def test_the_recipes_inference_precision_reaches_predict(tiny_world):
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec
    from tasks.base import get_task

    examples = get_task("qa").load(tiny_world["qa"])[:2]
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = load_model(
            recipe_spec(
                load_config(
                    None,
                    [
                        f"retriever.model={tiny_world['encoder']}",
                        f"index.path={tiny_world['index']}",
                        "reader.model=t5-tiny",
                        "retriever.loss=none",
                        "reader.n_context=2",
                        "inference.generation_max_length=3",
                        f"inference.precision={precision}",
                    ],
                )
            )
        ).eval()
        seen, handles = _dtypes_seen(model.reader)
        try:
            answers = model.read([e.query for e in examples], model.passages_for(examples, model.n_read)).texts
        finally:
            for handle in handles:
                handle.remove()
        assert len(answers) == 2 and seen["encoder"] == {dtype}


def test_the_speed_probe_leaves_the_global_random_state_alone():
    """The probe runs once per process, at the first `auto`: were it to draw from the global RNG, a
    run's dropout masks would depend on whether the process had probed before (a resumed run
    would not repeat a straight one)."""
    from reader import encoder_precision

    encoder_precision._cpu_bf16_speedup.cache_clear()
    before = torch.get_rng_state()
    encoder_precision._cpu_bf16_speedup()
    assert torch.equal(before, torch.get_rng_state())
