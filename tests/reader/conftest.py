"""Tiny T5 readers built from scratch for the reader tests."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from reader.fid import FiDReader

VOCAB = 48


def tiny_t5(seed: int = 0, attn_implementation: str | None = None, v1_1: bool = False) -> T5ForConditionalGeneration:
    """A 2+2-layer T5 (d_model 32, no dropout) with random weights seeded by `seed`.

    `v1_1`: the T5 v1.1 / lm-adapt layout (gated-GELU feed-forward, untied output layer).
    """
    layout = {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False} if v1_1 else {}
    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=4,
        num_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        **layout,
    )
    torch.manual_seed(seed)
    if attn_implementation is None:
        return T5ForConditionalGeneration(config).eval()
    return T5ForConditionalGeneration._from_config(config, attn_implementation=attn_implementation).eval()


def random_batch(batch: int = 2, n_passages: int = 3, length: int = 5, target: int = 4, seed: int = 1):
    """Random reader inputs (B, K, L) with some padding, and labels (B, T) with -100 tails."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, VOCAB, (batch, n_passages, length), generator=gen)
    attention_mask = torch.ones(batch, n_passages, length, dtype=torch.long)
    attention_mask[0, min(1, n_passages - 1), -2:] = 0  # a shorter passage
    attention_mask[-1, -1, -1:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = torch.randint(2, VOCAB, (batch, target), generator=gen)
    labels[0, -1] = -100  # an ignored position
    return input_ids, attention_mask, labels


@pytest.fixture
def reader() -> FiDReader:
    """A tiny FiD reader in eval mode."""
    return FiDReader(tiny_t5())


SPAN_PASSAGES = [
    [
        {"title": "Zorbland", "text": "The capital of Zorbland is Quimper, on the river Aulne."},
        {"title": "Tarsia", "text": "The currency of Tarsia is the florin."},
    ],
    [{"title": "Olo", "text": "Anna Brook first climbed Mount Olo in 1911."}],
]


def copy_head_reader_batch(tokenizer, encoder_path, seed: int = 0):
    """An untrained warm-started reader with a copy head (2-layer decoder over the tiny encoder at
    `encoder_path`, eval mode) and two questions over SPAN_PASSAGES → (reader, ids (2, 2, 48), mask)."""
    from reader.inputs import encode_reader_inputs
    from reader.warm_start import build_warm_started

    torch.manual_seed(0)
    model = build_warm_started(
        {"num_decoder_layers": 2, "num_heads": 2, "d_kv": 16, "d_ff": 64, "copy": True},
        tokenizer,
        encoder=str(encoder_path),
        dropout=0.0,
        seed=seed,
    )
    ids, mask = encode_reader_inputs(
        tokenizer,
        ["question: capital? answer: <extra_id_0>", "question: who climbed? answer: <extra_id_0>"],
        SPAN_PASSAGES,
        48,
    )
    return FiDReader(model).eval(), ids, mask
