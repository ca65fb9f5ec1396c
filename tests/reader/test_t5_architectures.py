"""The published T5 v1.1 / lm-adapt architectures built with random weights (`reader.t5_architectures`), and a T5
SentencePiece tokenizer trained here (`train_t5_tokenizer`): the published numbers, and FiD at reduced width on the
code paths of the real size (32,128-row untied vocabulary, relative position buckets, gated-GELU, sentinels)."""

from __future__ import annotations

import json

import pytest
import torch

from reader.fid import FiDReader
from reader.inputs import encode_reader_inputs, encode_targets
from reader.reader_config import ReaderConfig
from reader.t5_architectures import random_t5, t5_architecture, write_random_t5
from reader.t5_untied import UntiedT5ForConditionalGeneration
from reader.tokenizer import build_reader_tokenizer, reader_tokenizer, train_t5_tokenizer

BASE = "google/t5-base-lm-adapt"
# The google/t5-v1_1-{small,base,large,xl,xxl} model cards' config.json (the lm-adapt ones are the same): d_model,
# d_ff, d_kv, heads, layers (encoder = decoder), and the parameter count the Hub shows for each checkpoint
PUBLISHED = {
    "google/t5-small-lm-adapt": (512, 1024, 64, 6, 8, 76_961_152),
    "google/t5-base-lm-adapt": (768, 2048, 64, 12, 12, 247_577_856),
    "google/t5-large-lm-adapt": (1024, 2816, 64, 16, 24, 783_150_080),
    "google/t5-xl-lm-adapt": (2048, 5120, 64, 32, 24, 2_849_757_184),
    "google/t5-xxl-lm-adapt": (4096, 10240, 64, 64, 24, 11_135_332_352),
}
HEAD_DIM = 4  # base's 12 heads of 4, d_model 48: every layer, bucket and vocabulary row of the real size, cheaply
WIDTH = 48
PIECES = 1000  # the tests' tokenizer; the model keeps its 32,128 rows


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_architectures_are_the_published_ones(name):
    d_model, d_ff, d_kv, heads, layers, parameters = PUBLISHED[name]
    with torch.device("meta"):  # counted, never allocated (xxl has 11B parameters)
        t5 = random_t5(name)
    config = t5.config
    assert (config.d_model, config.d_ff, config.d_kv, config.num_heads) == (d_model, d_ff, d_kv, heads)
    assert (config.num_layers, config.num_decoder_layers) == (layers, layers)
    assert config.vocab_size == 32128 and t5.shared.weight.shape == t5.lm_head.weight.shape == (32128, d_model)
    assert (config.relative_attention_num_buckets, config.relative_attention_max_distance) == (32, 128)
    assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (0, 1, 0)
    assert config.is_gated_act and config.dense_act_fn == "gelu_new" and config.dropout_rate == 0.1
    assert t5.lm_head.weight is not t5.shared.weight and not config.scale_decoder_outputs  # untied, v1.1
    assert sum(p.numel() for p in t5.parameters()) == parameters
    # relative position buckets: one (32, heads) table in the first self-attention of each stack, none in
    # cross-attention
    for stack in (t5.encoder, t5.decoder):
        biased = [i for i, block in enumerate(stack.block) if block.layer[0].SelfAttention.has_relative_attention_bias]
        assert biased == [0]
        assert stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.shape == (32, heads)
    assert not any(block.layer[1].EncDecAttention.has_relative_attention_bias for block in t5.decoder.block)
    assert t5_architecture(name.replace("google/t5-", "google/t5-v1_1-").removesuffix("-lm-adapt")) == t5_architecture(
        name
    )


def test_a_narrower_shallower_copy_keeps_heads_buckets_and_vocabulary():
    narrow = t5_architecture(BASE, head_dim=HEAD_DIM)
    published = t5_architecture(BASE)
    assert (narrow["d_model"], narrow["d_kv"], narrow["d_ff"]) == (48, 4, 128)  # 2048 · 48 / 768
    assert {k: v for k, v in narrow.items() if k not in ("d_model", "d_kv", "d_ff")} == {
        k: v for k, v in published.items() if k not in ("d_model", "d_kv", "d_ff")
    }
    shallow = t5_architecture(BASE, layers=2)
    assert (shallow["num_layers"], shallow["num_decoder_layers"], shallow["d_model"]) == (2, 2, 768)
    small = t5_architecture("google/t5-small-lm-adapt", head_dim=8)  # 6 heads of 64 in a d_model of 512
    assert (small["d_model"], small["d_kv"], small["num_heads"], small["d_ff"]) == (64, 8, 6, 128)
    with pytest.raises(ValueError, match="head_dim must be positive, not 0"):
        t5_architecture(BASE, head_dim=0)
    with pytest.raises(ValueError, match="no published T5 architecture named 't5-tiny'; known: google/t5-small"):
        t5_architecture("t5-tiny")
    a, b = random_t5(BASE, head_dim=HEAD_DIM, layers=1, seed=3), random_t5(BASE, head_dim=HEAD_DIM, layers=1, seed=3)
    assert torch.equal(a.lm_head.weight, b.lm_head.weight)  # seeded, and the global random state is untouched


def wikitext_paragraphs(shared_data, limit: int = 600) -> list[str]:
    lines = (shared_data / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines()
    paragraphs = [line.strip() for line in lines if line.strip() and not line.strip().startswith("=")]
    return paragraphs[:limit]


@pytest.fixture(scope="module")
def reader_folder(shared_data, tmp_path_factory):
    """A T5 tokenizer of PIECES pieces trained on WikiText-2, and a reader folder of t5-base-lm-adapt at WIDTH."""
    root = tmp_path_factory.mktemp("real-size-reader")
    tokenizer = train_t5_tokenizer(wikitext_paragraphs(shared_data), root / "tokenizer", pieces=PIECES)
    return write_random_t5(BASE, root / "reader", tokenizer, head_dim=HEAD_DIM)


def test_the_trained_tokenizer_has_t5s_layout(reader_folder):
    tokenizer = build_reader_tokenizer(reader_folder)
    assert len(tokenizer) == PIECES + 100
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    # T5's sentinels follow the pieces in reverse: <extra_id_0> is the last id (32,099 at the full size)
    ids = tokenizer.convert_tokens_to_ids([f"<extra_id_{i}>" for i in (0, 1, 99)])
    assert ids == [PIECES + 99, PIECES + 98, PIECES]
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("question: who wrote Hamlet? answer: <extra_id_0>")["input_ids"])
    assert tokens[-2:] == ["<extra_id_0>", "</s>"] and tokens[0].startswith("▁")
    assert "?" in tokens and "<unk>" not in tokens  # every printable ASCII character is a piece
    assert (reader_folder.parent / "tokenizer" / "spiece.model").is_file()


def test_a_text_too_small_for_the_pieces_is_refused(tmp_path):
    with pytest.raises(ValueError, match="a 5000-piece SentencePiece model cannot be trained on this text: .*<= "):
        train_t5_tokenizer(["the cat sat on the mat"] * 20, tmp_path / "tokenizer", pieces=5000)
    assert not (tmp_path / "tokenizer").exists()


def test_the_reader_folder_loads_as_the_architecture(reader_folder):
    config = ReaderConfig(model=str(reader_folder))
    reader = FiDReader.from_config(config, reader_tokenizer(config))
    t5 = reader.seq2seq
    assert isinstance(t5, UntiedT5ForConditionalGeneration) and t5.lm_head.weight is not t5.shared.weight
    assert json.loads((reader_folder / "config.json").read_text())["tie_word_embeddings"] is False
    assert (t5.config.d_model, t5.config.num_layers, t5.config.num_decoder_layers) == (WIDTH, 12, 12)
    assert t5.config.vocab_size == 32128 and t5.config.is_gated_act


def test_a_training_step_reads_k_passages_through_the_sentencepiece_tokenizer(reader_folder, shared_data):
    config = ReaderConfig(model=str(reader_folder), dropout=0.0)
    tokenizer = reader_tokenizer(config)
    reader = FiDReader.from_config(config, tokenizer).train()
    text = wikitext_paragraphs(shared_data, limit=40)
    passages = [[{"title": "", "text": text[i + k][:300]} for k in range(4)] for i in (5, 20)]
    queries = ["question: what is it? answer: <extra_id_0>", "question: where is it? answer: <extra_id_0>"]
    input_ids, mask = encode_reader_inputs(tokenizer, queries, passages, 64)
    assert input_ids.shape == (2, 4, 64)
    sentinel = tokenizer.convert_tokens_to_ids("<extra_id_0>")
    assert all(sentinel in row for row in input_ids[:, :, :20].reshape(8, -1).tolist())  # the query is kept
    labels = encode_targets(tokenizer, ["<extra_id_0> a lobster", "<extra_id_0> the sea"], 8)
    optimizer = torch.optim.AdamW(reader.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        loss = reader(input_ids, mask, labels=labels).loss
        loss.backward()
        bias = reader.seq2seq.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        assert bias.grad is not None and reader.seq2seq.lm_head.weight.grad is not None
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    generated = reader.eval().generate(input_ids, mask, max_length=3)
    assert generated.shape[0] == 2 and generated[:, 0].tolist() == [0, 0]  # the decoder starts at <pad>


def test_relative_positions_are_counted_within_each_passage():
    """FiD encodes each passage on its own: the position bias never spans two passages, so K=1 is plain T5 and
    passage 2's states are those it has alone, whatever passage 1 is."""
    t5 = random_t5(BASE, head_dim=HEAD_DIM, layers=2).eval()
    reader = FiDReader(t5)
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randint(3, 1000, (1, 30), generator=gen), torch.randint(3, 1000, (1, 11), generator=gen)
    labels = torch.randint(3, 1000, (1, 4), generator=gen)
    ones = torch.ones_like(first)
    fid = reader(first[:, None], ones[:, None], labels=labels)
    plain = t5(input_ids=first, attention_mask=ones, labels=labels)
    torch.testing.assert_close(fid.logits, plain.logits, atol=1e-5, rtol=0)

    pair = torch.zeros(1, 2, 30, dtype=torch.long)
    pair[0, 0], pair[0, 1, :11] = first[0], second[0]
    mask = (pair != 0).long()
    states = reader.encode(pair, mask)
    alone = t5.encoder(input_ids=second, attention_mask=torch.ones_like(second)).last_hidden_state
    torch.testing.assert_close(states[0, 1, :11], alone[0], atol=1e-5, rtol=0)
    # the test can tell: in one sequence with passage 1, passage 2 reads it and sits at other distances
    joined = torch.cat([first, second], 1)
    spanning = t5.encoder(input_ids=joined, attention_mask=torch.ones_like(joined)).last_hidden_state[0, 30:]
    assert not torch.allclose(spanning, alone[0], atol=1e-3)
