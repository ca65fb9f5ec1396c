"""The warm-started FiD reader: a pre-trained encoder under a T5 decoder with a copy head."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from reader.copy_head import CONTINUATION_SCALE, CopyHead
from reader.fid import FiDReader, build_reader
from reader.inputs import encode_reader_inputs, encode_targets
from reader.tokenizer import build_reader_tokenizer
from reader.warm_start import (
    build_warm_started,
    is_warm_started_folder,
    remap_token_embeddings,
)

SMALL_DECODER = {"num_decoder_layers": 2, "num_heads": 2, "d_kv": 16, "d_ff": 64, "copy": True}


@pytest.fixture(scope="module")
def tokenizer():
    return build_reader_tokenizer(None)


@pytest.fixture(scope="module")
def batch(tokenizer):
    passages = [
        [
            {"title": "Zorbland", "text": "The capital of Zorbland is Quimper."},
            {"title": "Tarsia", "text": "The currency of Tarsia is the florin."},
        ],
        [{"title": "Olo", "text": "Anna Brook first climbed Mount Olo."}],
    ]  # one passage: a padded row
    ids, mask = encode_reader_inputs(
        tokenizer,
        ["question: capital? answer: <extra_id_0>", "question: who climbed? answer: <extra_id_0>"],
        passages,
        48,
    )
    labels = encode_targets(tokenizer, ["<extra_id_0> quimper", "<extra_id_0> anna brook"], 8)
    return ids, mask, labels


def _reader(tokenizer, encoder, seed=0, **decoder):
    torch.manual_seed(seed)
    model = build_warm_started({**SMALL_DECODER, **decoder}, tokenizer, encoder=str(encoder), dropout=0.0, seed=seed)
    return FiDReader(model).eval()


def test_copy_head_equals_the_pointer_generator_formula_in_float64():
    torch.manual_seed(0)
    head = CopyHead(8).double()
    h, e = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    z = torch.randn(2, 3, 11, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    ids = torch.tensor([[4, 7, 4, 9, 9], [5, 1, 2, 3, 10]])  # id 0 is padding in a reader's input
    with torch.no_grad():
        got = head(h, z, e, mask, ids).exp()
    for b in range(2):
        for t in range(3):
            scores = [float(head.query(h[b, t]).detach() @ head.key(e[b, j]).detach()) / 8**0.5 for j in range(5)]
            weights = torch.tensor(
                [s if mask[b, j] else float("-inf") for j, s in enumerate(scores)], dtype=torch.float64
            ).softmax(0)
            context = sum(weights[j] * e[b, j] for j in range(5))
            g = torch.sigmoid(head.gate(torch.cat([h[b, t], context]))).item()  # float64 throughout
            vocab = z[b, t].softmax(0)
            for w in range(11):
                copy = sum(weights[j].item() for j in range(5) if ids[b, j] == w and mask[b, j])
                assert got[b, t, w].item() == pytest.approx(g * vocab[w].item() + (1 - g) * copy, abs=1e-9)
    assert torch.allclose(got.sum(-1), torch.ones(2, 3, dtype=got.dtype))
    assert got[0, :, 9].max() < got[0, :, 4].min()  # 9 sits only under the mask: no copy mass

    # span continuation: +β on the score of input positions whose predecessor is the last output token
    with torch.no_grad():
        head.continuation.fill_(3.0 / CONTINUATION_SCALE)
        previous_output = torch.tensor([[0, 4, 7], [0, 1, 3]])  # y_{t-1}
        biased = head(h, z, e, mask, ids, decoder_input_ids=previous_output).exp()
        plain = head(h, z, e, mask, ids).exp()
    b, t = 0, 1  # y_0 = 4 sits at positions 0 and 2, so positions 1 (id 7) and 3 (masked) follow it
    scores = torch.stack([head.query(h[b, t]) @ head.key(e[b, j]) for j in range(5)]).detach() / 8**0.5
    scores = scores + 3.0 * torch.tensor([0, 1, 0, 1, 0], dtype=torch.float64)
    weights = scores.masked_fill(mask[b] == 0, float("-inf")).softmax(0)
    context = (weights.unsqueeze(-1) * e[b]).sum(0)
    g = torch.sigmoid(head.gate(torch.cat([h[b, t], context]))).item()
    assert biased[b, t, 7].item() == pytest.approx(
        g * z[b, t].softmax(0)[7].item() + (1 - g) * weights[1].item(), abs=1e-9
    )
    assert biased[b, t, 7] > plain[b, t, 7]
    assert torch.equal(biased[:, 0], plain[:, 0])  # y_{-1} is the start token: no input follows it


def test_specials_take_the_rows_of_the_encoder_tokens_with_the_same_role(tokenizer):
    source_vocab = {"[PAD]": 0, "[unused0]": 1, "[UNK]": 2, "[SEP]": 3, "[MASK]": 4, "paris": 5}
    source = torch.arange(6, dtype=torch.float32).unsqueeze(1).repeat(1, 2)
    rows, copied = remap_token_embeddings(source, source_vocab, tokenizer.get_vocab())
    vocab = tokenizer.get_vocab()
    assert rows[vocab["<pad>"]].tolist() == [0, 0] and rows[vocab["</s>"]].tolist() == [3, 3]
    assert rows[vocab["<extra_id_0>"]].tolist() == [4, 4] and rows[vocab["<extra_id_1>"]].tolist() == [1, 1]
    assert rows[vocab["paris"]].tolist() == [5, 5]
    assert rows[vocab["london"]].tolist() == [2.5, 2.5]  # not in the source: the mean row
    assert copied == 7  # pad, </s>, <unk>, 2 sentinels, paris, and [unused0] itself


def test_fid_with_one_passage_gives_the_logits_of_the_model_on_that_input(tokenizer, tiny_encoder_path, batch):
    reader = _reader(tokenizer, tiny_encoder_path)
    ids, mask, labels = batch
    one_ids, one_mask = ids[:, :1], mask[:, :1]
    fid = reader(input_ids=one_ids, attention_mask=one_mask, labels=labels)
    plain = reader.seq2seq(input_ids=one_ids[:, 0], attention_mask=one_mask[:, 0], labels=labels)
    # equal up to float32 summation order (the plain T5 path is exact; here the BERT kernels are
    # chosen per input layout)
    assert torch.allclose(fid.logits, plain.logits, atol=1e-5, rtol=0)
    assert fid.loss.item() == pytest.approx(plain.loss.item(), abs=1e-6)
    assert torch.allclose(fid.logits.exp().sum(-1), torch.ones(2, labels.shape[1]), atol=1e-5)


def test_a_padding_passage_changes_nothing_and_makes_no_nan(tokenizer, tiny_encoder_path, batch):
    reader = _reader(tokenizer, tiny_encoder_path)
    ids, mask, labels = batch
    both = reader(input_ids=ids, attention_mask=mask, labels=labels).logits
    assert torch.isfinite(both.exp()).all()
    alone = reader(input_ids=ids[1:, :1], attention_mask=mask[1:, :1], labels=labels[1:]).logits
    assert torch.allclose(both[1], alone[0], atol=1e-5)


def test_greedy_generation_with_its_cache_equals_a_loop_of_full_forward_passes(tokenizer, tiny_encoder_path, batch):
    reader = _reader(tokenizer, tiny_encoder_path, seed=3)
    ids, mask, _ = batch
    generated = reader.generate(ids, mask, max_length=5)
    sequence = torch.zeros(2, 1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(5):
            logits = reader(input_ids=ids, attention_mask=mask, decoder_input_ids=sequence).logits[:, -1]
            sequence = torch.cat([sequence, logits.argmax(-1, keepdim=True)], dim=1)
    for b in range(2):
        expected = sequence[b].tolist()
        if tokenizer.eos_token_id in expected[1:]:
            expected = expected[: expected.index(tokenizer.eos_token_id, 1) + 1]
        assert generated[b, : len(expected)].tolist() == expected
    beams = reader.generate(ids, mask, max_length=5, num_beams=3)
    assert beams.shape[0] == 2 and beams[:, 0].eq(0).all()


def test_gold_scores_read_each_passage_as_the_reader_would(tokenizer, tiny_encoder_path, batch):
    reader = _reader(tokenizer, tiny_encoder_path, seed=1)
    ids, mask, labels = batch
    with torch.no_grad():
        states = reader.encode(ids, mask)
        per_passage = reader.per_passage_token_logprobs(states, mask, labels, input_ids=ids)
        loo = reader.leave_one_out_nll(states, mask, labels, input_ids=ids)
        attention = reader.cross_attention_scores(states, mask, labels, input_ids=ids)
        alone = reader(input_ids=ids[:1, :1], attention_mask=mask[:1, :1], labels=labels[:1]).logits
        without_first = reader(input_ids=ids[:1, 1:], attention_mask=mask[:1, 1:], labels=labels[:1]).loss
    picked = alone.log_softmax(-1)[0].gather(-1, labels[0].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    picked = picked.masked_fill(labels[0] == -100, 0.0)
    assert torch.allclose(per_passage[0, 0], picked, atol=1e-5)
    assert loo[0, 0].item() == pytest.approx(without_first.item(), abs=1e-5)
    assert attention.shape == (2, 2) and attention[1, 1].item() == 0.0
    with pytest.raises(ValueError, match="copy head"):
        reader.per_passage_token_logprobs(states, mask, labels)


def test_the_folder_holds_only_what_differs_from_the_base_and_loads_back(tokenizer, tiny_encoder_path, batch, tmp_path):
    reader = _reader(tokenizer, tiny_encoder_path, seed=2)
    reader.seq2seq.set_trainable_encoder_layers(1)
    trainable = {n for n, p in reader.named_parameters() if p.requires_grad}
    top, bottom = "encoder.model.encoder.layer.1.", "encoder.model.encoder.layer.0."
    assert any(top in n for n in trainable) and not any(bottom in n for n in trainable)
    assert not any("embeddings" in n or n.endswith("shared.weight") for n in trainable)
    with torch.no_grad():
        for name, param in reader.named_parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))
    reader.save_pretrained(tmp_path / "reader")
    assert is_warm_started_folder(tmp_path / "reader")
    stored = load_file(str(tmp_path / "reader" / "model.safetensors"))
    assert any(top in n for n in stored) and not any(bottom in n or "embeddings" in n for n in stored)
    assert any(n.startswith("decoder.") for n in stored) and any(n.startswith("copy_head.") for n in stored)
    assert "shared.weight" not in stored and "lm_head.weight" not in stored
    loaded = FiDReader.from_pretrained(tmp_path / "reader").eval()
    ids, mask, labels = batch
    assert torch.equal(
        loaded(input_ids=ids, attention_mask=mask, labels=labels).logits,
        reader(input_ids=ids, attention_mask=mask, labels=labels).logits,
    )
    assert loaded.seq2seq.lm_head.weight.data_ptr() == loaded.seq2seq.encoder.get_input_embeddings().weight.data_ptr()

    config = json.loads((tmp_path / "reader" / "config.json").read_text())
    config["atlas_reader"]["base_sha256"] = "0" * 64
    (tmp_path / "reader" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="differs from the one this reader was trained on"):
        FiDReader.from_pretrained(tmp_path / "reader")


def test_a_reader_whose_whole_encoder_trained_saves_its_embedding_once_and_loads_back(
    tokenizer, tiny_encoder_path, batch, tmp_path
):
    reader = _reader(tokenizer, tiny_encoder_path, seed=5)
    reader.seq2seq.set_trainable_encoder_layers(None)  # the token embedding (shared with the decoder) trains too
    with torch.no_grad():
        reader.seq2seq.encoder.get_input_embeddings().weight.add_(0.01)
    reader.save_pretrained(tmp_path / "reader")  # safetensors refuses one tensor under two names
    stored = load_file(str(tmp_path / "reader" / "model.safetensors"))
    assert "encoder.model.embeddings.word_embeddings.weight" in stored and "shared.weight" not in stored
    loaded = FiDReader.from_pretrained(tmp_path / "reader").eval()
    ids, mask, labels = batch
    assert torch.equal(
        loaded(input_ids=ids, attention_mask=mask, labels=labels).logits,
        reader(input_ids=ids, attention_mask=mask, labels=labels).logits,
    )
    assert loaded.seq2seq.shared.weight.data_ptr() == loaded.seq2seq.encoder.get_input_embeddings().weight.data_ptr()


def test_fp16_folder_reads_the_same(tokenizer, tiny_encoder_path, batch, tmp_path):
    reader = _reader(tokenizer, tiny_encoder_path, seed=4)
    reader.seq2seq.save_pretrained(tmp_path / "half", dtype=torch.float16)
    loaded = FiDReader.from_pretrained(tmp_path / "half").eval()
    assert next(loaded.parameters()).dtype == torch.float32
    ids, mask, labels = batch
    assert torch.allclose(
        loaded(input_ids=ids, attention_mask=mask, labels=labels).logits,
        reader(input_ids=ids, attention_mask=mask, labels=labels).logits,
        atol=2e-2,
    )


def test_presets_are_named_and_plain_t5_rejects_warm_start_options(tokenizer):
    with pytest.raises(ValueError, match="needs the reader tokenizer"):
        build_reader("minilm-fid", vocab_size=len(tokenizer))
    with pytest.raises(ValueError, match="reader.encoder applies to the warm-start presets"):
        build_reader("t5-tiny", vocab_size=len(tokenizer), encoder="minilm")
    with pytest.raises(ValueError, match="unknown warm-start preset"):
        build_warm_started("nope", tokenizer)


def test_gradient_checkpointing_gives_the_same_gradients(tokenizer, tiny_encoder_path, batch):
    ids, mask, labels = batch
    grads = []
    for checkpointing in (False, True):
        reader = _reader(tokenizer, tiny_encoder_path, seed=5).train()
        if checkpointing:
            reader.gradient_checkpointing_enable()
            assert reader.seq2seq.encoder.layers[0].gradient_checkpointing  # the BERT blocks too
        reader(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in reader.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_option_scores_are_the_first_answer_position_log_probabilities(tokenizer, tiny_encoder_path, batch):
    reader = _reader(tokenizer, tiny_encoder_path, seed=6)
    ids, mask, _ = batch
    letters = torch.tensor([tokenizer.convert_tokens_to_ids(c) for c in ("a", "b", "c", "d")])
    prefix = torch.full((2, 1), tokenizer.convert_tokens_to_ids("<extra_id_0>"))
    scores = reader.score_options(ids, mask, letters, prefix_ids=prefix)
    start = torch.zeros(2, 1, dtype=torch.long)
    full = reader(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.cat([start, prefix], 1)).logits
    assert torch.allclose(scores, full[:, -1, letters], atol=1e-5) and (scores <= 0).all()  # log-probabilities


def test_copy_attention_gold_is_the_copy_probability_per_passage_in_float64(tokenizer, tiny_encoder_path, batch):
    """adist with `attention: copy`: gold_k = Σ_t σ(−g_t) Σ_{j ∈ passage k} α_{t,j} / T_valid, computed here
    position by position from the decoder's final states (span-continuation bias on)."""
    from retriever.losses import build_retriever_loss

    reader = _reader(tokenizer, tiny_encoder_path, seed=2).double()
    head = reader.seq2seq.copy_head
    with torch.no_grad():
        head.continuation.fill_(2.0 / CONTINUATION_SCALE)
    ids, mask, labels = batch
    batch_size, n_passages, length = ids.shape
    with torch.no_grad():
        states = reader.encode(ids, mask)
        got = build_retriever_loss("adist", attention="copy").gold_scores(reader, ids, mask, labels)
        fused, fused_mask = states.reshape(batch_size, -1, states.shape[-1]), mask.reshape(batch_size, -1)
        decoder_in = reader.shift_right(labels)
        h = reader.seq2seq.decoder(
            input_ids=decoder_in, encoder_hidden_states=fused, encoder_attention_mask=fused_mask
        ).last_hidden_state
    flat_ids = ids.reshape(batch_size, -1)
    for b in range(batch_size):
        valid = [t for t in range(labels.shape[1]) if labels[b, t] != -100]
        expected = torch.zeros(n_passages, dtype=torch.float64)
        for t in valid:
            scores = []
            for j in range(n_passages * length):
                follows = j % length != 0 and fused_mask[b, j - 1] == 1 and flat_ids[b, j - 1] == decoder_in[b, t]
                score = float((head.query(h[b, t]) @ head.key(fused[b, j])).detach()) / h.shape[-1] ** 0.5 + 2.0 * bool(
                    follows
                )
                scores.append(score if fused_mask[b, j] else float("-inf"))
            alpha = torch.tensor(scores, dtype=torch.float64).softmax(0)
            context = (alpha.unsqueeze(-1) * fused[b]).sum(0)
            copying = 1 - torch.sigmoid(head.gate(torch.cat([h[b, t], context]))).detach().item()
            expected += copying * alpha.view(n_passages, length).sum(-1)
        assert torch.allclose(got[b], expected / len(valid), atol=1e-9), (got[b], expected / len(valid))
    assert (got.sum(-1) < 1).all() and (got >= 0).all()
    cross = build_retriever_loss("adist", attention="cross").gold_scores(reader, ids, mask, labels)
    assert torch.equal(build_retriever_loss("adist").gold_scores(reader, ids, mask, labels), got)  # auto → copy
    assert not torch.allclose(cross.double(), got)
    plain = FiDReader(build_reader("t5-tiny", vocab_size=len(tokenizer)).seq2seq)
    with pytest.raises(ValueError, match="copy head"):
        build_retriever_loss("adist", attention="copy").gold_scores(plain, ids, mask, labels)
    with pytest.raises(ValueError, match="unknown adist attention 'mean'"):
        build_retriever_loss("adist", attention="mean")


def test_grouped_encoding_of_a_pretrained_encoder_equals_each_passage_alone(tokenizer, tiny_encoder_path, monkeypatch):
    """A BERT encoder (absolute positions) read in length groups: each passage's states are its
    unpadded ones, so a many-question batch answers as each question does alone."""
    monkeypatch.setattr("reader.fid.ENCODE_GROUP_ROWS", 2)
    reader = _reader(tokenizer, tiny_encoder_path)
    texts = [
        "Quimper.",
        "The capital of Zorbland is the old harbour town of Quimper.",
        "Tarsia pays in florins.",
        "Anna Brook first climbed Mount Olo in the spring of 1901.",
    ]
    passages = [[{"title": "", "text": t}] for t in texts]
    ids, mask = encode_reader_inputs(tokenizer, ["question: what? answer: <extra_id_0>"] * 4, passages, 48)
    states = reader.encode(ids, mask)  # (4, 1, L, H)
    for row in range(4):
        n = int(mask[row, 0].sum())
        alone = reader.encode(ids[row : row + 1, :, :n], mask[row : row + 1, :, :n])
        torch.testing.assert_close(states[row, 0, :n], alone[0, 0], atol=1e-5, rtol=0)
    batched = reader.generate(ids, mask, max_length=5)
    for row in range(4):
        n = int(mask[row, 0].sum())
        alone = reader.generate(ids[row : row + 1, :, :n], mask[row : row + 1, :, :n], max_length=5)
        assert batched[row, : alone.shape[1]].tolist() == alone[0].tolist()


def _dense_pointer_generator(head, h, z, e, mask, ids, **kwargs):
    """The copy head's mixture as written before it was computed on the source's ids alone: the copy
    distribution spread over all V ids, mixed at every one (the bit-for-bit reference of the sparse mix)."""
    attention, gate = head.copy_attention(h, e, mask, ids, **kwargs)
    rows, steps, width = attention.shape
    attention = attention.reshape(len(ids), -1, width)
    copy = attention.new_zeros(*attention.shape[:2], z.shape[-1])
    copy.scatter_add_(2, ids.unsqueeze(1).expand(-1, attention.shape[1], -1), attention)
    copy = copy.view(rows, steps, -1)
    log_copy = copy.clamp_min(1e-30).log().masked_fill(copy == 0, float("-inf"))
    generated = torch.nn.functional.logsigmoid(gate) + torch.nn.functional.log_softmax(z, dim=-1)
    return torch.logaddexp(generated, torch.nn.functional.logsigmoid(-gate) + log_copy)


@pytest.mark.parametrize("beams", [1, 3])
def test_copy_head_mixing_on_the_source_ids_equals_the_dense_mixture_bit_for_bit(beams):
    """float32, repeated ids, padding, beams folded: the same logits to the bit, with and without grad."""
    torch.manual_seed(1)
    head = CopyHead(16)
    with torch.no_grad():
        head.continuation.fill_(2.0 / CONTINUATION_SCALE)
    batch, steps, vocab = 3, 2, 50
    h, e = torch.randn(batch * beams, steps, 16), torch.randn(batch, 7, 16)
    z = torch.randn(batch * beams, steps, vocab) * 4
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1] * 7, [1, 1, 0, 0, 0, 0, 0]])
    ids = torch.tensor([[4, 7, 4, 9, 4, 0, 0], [49, 1, 2, 3, 1, 1, 0], [5, 5, 0, 0, 0, 0, 0]])
    previous = torch.randint(0, vocab, (batch * beams, steps))
    with torch.no_grad():
        expected = _dense_pointer_generator(head, h, z, e, mask, ids, decoder_input_ids=previous, passage_length=7)
        got = head(h, z, e, mask, ids, decoder_input_ids=previous, passage_length=7)
    assert torch.equal(got, expected)
    z.requires_grad_(True)
    trained = head(h, z, e, mask, ids, decoder_input_ids=previous, passage_length=7)
    assert torch.equal(trained.detach(), expected)
    reference_z = z.detach().clone().requires_grad_(True)
    reference = _dense_pointer_generator(
        head, h, reference_z, e, mask, ids, decoder_input_ids=previous, passage_length=7
    )
    weights = torch.randn(trained.shape).masked_fill(expected.isinf(), 0)
    (trained.masked_fill(expected.isinf(), 0) * weights).sum().backward()
    (reference.masked_fill(expected.isinf(), 0) * weights).sum().backward()
    torch.testing.assert_close(z.grad, reference_z.grad, rtol=0, atol=1e-6)
