"""FiD reader: equivalence with plain T5, order invariance, generation, persistence."""

from __future__ import annotations

import pytest
import torch
from transformers import T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from reader.fid import READER_PRESETS, FiDReader, build_reader, length_groups
from tests.reader.conftest import random_batch, tiny_t5


@pytest.mark.parametrize("v1_1", [False, True])
def test_k1_matches_plain_t5(v1_1):
    reader = FiDReader(tiny_t5(v1_1=v1_1))
    input_ids, mask, labels = random_batch(n_passages=1)
    fid = reader(input_ids, mask, labels=labels)
    plain = reader.seq2seq(input_ids=input_ids[:, 0], attention_mask=mask[:, 0], labels=labels)
    torch.testing.assert_close(fid.logits, plain.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(fid.loss, plain.loss, atol=0, rtol=1e-6)  # float32: the passes' products differ


def test_k_passages_match_manual_concatenation(reader):
    input_ids, mask, labels = random_batch(n_passages=3)
    states = [
        reader.seq2seq.encoder(input_ids=input_ids[:, k], attention_mask=mask[:, k]).last_hidden_state for k in range(3)
    ]
    manual = reader.seq2seq(
        encoder_outputs=BaseModelOutput(last_hidden_state=torch.cat(states, 1)),
        attention_mask=mask.reshape(2, -1),
        labels=labels,
    )
    fid = reader(input_ids, mask, labels=labels)
    torch.testing.assert_close(fid.logits, manual.logits, atol=1e-6, rtol=0)
    assert fid.encoder_last_hidden_state.shape == (2, 3 * 5, 32)


def test_passage_order_leaves_loss_unchanged(reader):
    input_ids, mask, labels = random_batch(n_passages=4)
    order = torch.tensor([2, 0, 3, 1])
    loss = reader(input_ids, mask, labels=labels).loss
    permuted = reader(input_ids[:, order], mask[:, order], labels=labels).loss
    torch.testing.assert_close(loss, permuted, atol=1e-6, rtol=0)


def test_encoder_states_reuse(reader):
    input_ids, mask, labels = random_batch()
    states = reader.encode(input_ids, mask)
    assert states.shape == (2, 3, 5, 32)
    reused = reader(attention_mask=mask, encoder_states=states, labels=labels)
    torch.testing.assert_close(reused.logits, reader(input_ids, mask, labels=labels).logits)


def test_greedy_generation_equals_manual_argmax(reader):
    input_ids, mask, _ = random_batch()
    generated = reader.generate(input_ids, mask, max_length=6)
    decoded = torch.zeros(2, 1, dtype=torch.long)  # decoder start = pad = 0
    finished = torch.zeros(2, dtype=torch.bool)
    for _ in range(6):
        logits = reader(input_ids, mask, decoder_input_ids=decoded).logits[:, -1]
        next_token = logits.argmax(-1).masked_fill(finished, 0)  # pad after eos
        decoded = torch.cat([decoded, next_token[:, None]], 1)
        finished |= next_token == 1
        if finished.all():
            break
    assert torch.equal(generated, decoded)


def test_beam_search_finds_at_least_the_greedy_likelihood(reader):
    input_ids, mask, _ = random_batch()

    def sequence_logprob(sequences):
        logits = reader(input_ids, mask, decoder_input_ids=sequences[:, :-1]).logits
        return logits.log_softmax(-1).gather(-1, sequences[:, 1:, None])[..., 0].sum(-1)

    greedy = reader.generate(input_ids, mask, max_length=4)
    beam = reader.generate(input_ids, mask, max_length=4, num_beams=4)
    assert beam.shape[0] == 2 and torch.all(beam[:, 0] == 0)
    # Compare only when both hit the length limit without eos (equal-length hypotheses).
    if greedy.shape == beam.shape and not (greedy == 1).any() and not (beam == 1).any():
        assert torch.all(sequence_logprob(beam) >= sequence_logprob(greedy) - 1e-5)


def test_score_options_are_logits_at_first_answer_position(reader):
    input_ids, mask, _ = random_batch()
    options = torch.tensor([5, 9, 11, 20])
    prefix = torch.full((2, 1), 40)  # e.g. <extra_id_0>
    scores = reader.score_options(input_ids, mask, options, prefix_ids=prefix)
    decoder_input_ids = torch.tensor([[0, 40], [0, 40]])
    logits = reader(input_ids, mask, decoder_input_ids=decoder_input_ids).logits[:, 1]
    torch.testing.assert_close(scores, logits[:, options])


def test_save_and_load_round_trip(reader, tmp_path):
    input_ids, mask, labels = random_batch()
    reader.save_pretrained(tmp_path / "reader")
    assert (tmp_path / "reader" / "model.safetensors").is_file()
    plain = T5ForConditionalGeneration.from_pretrained(str(tmp_path / "reader")).eval()
    loaded = FiDReader.from_pretrained(tmp_path / "reader").eval()
    expected = reader(input_ids, mask, labels=labels).logits
    torch.testing.assert_close(loaded(input_ids, mask, labels=labels).logits, expected, atol=0, rtol=0)
    torch.testing.assert_close(FiDReader(plain)(input_ids, mask, labels=labels).logits, expected)
    with pytest.raises(FileExistsError):
        reader.save_pretrained(tmp_path / "reader")


def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, mask, labels = random_batch()
    grads = []
    for checkpointing in (False, True):
        reader = FiDReader(tiny_t5()).train()
        if checkpointing:
            reader.gradient_checkpointing_enable()
            assert reader.seq2seq.is_activation_checkpointing
        reader(input_ids, mask, labels=labels).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in reader.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_build_reader_presets_and_errors(tmp_path):
    reader = build_reader("t5-tiny", vocab_size=100, seed=0)
    assert reader.config.d_model == READER_PRESETS["t5-tiny"]["d_model"]
    assert reader.config.vocab_size == 100 and reader.config.decoder_start_token_id == 0
    reader.save_pretrained(tmp_path / "r")
    again = build_reader(str(tmp_path / "r"), vocab_size=0)
    assert torch.equal(again.seq2seq.shared.weight, reader.seq2seq.shared.weight)
    with pytest.raises(ValueError, match="neither a preset"):
        build_reader("t5-huge", vocab_size=100)
    with pytest.raises(ValueError, match="no config.json"):
        FiDReader.from_pretrained(tmp_path)


def test_the_v1_1_preset_has_its_own_output_layer_and_keeps_it(tmp_path):
    reader = build_reader("t5-v1_1-small", vocab_size=100, seed=0)
    t5 = reader.seq2seq
    assert t5.lm_head.weight is not t5.shared.weight and t5.encoder.embed_tokens.weight is t5.shared.weight
    assert not t5.config.scale_decoder_outputs  # v1.1 does not rescale the decoder output before lm_head
    reader.save_pretrained(tmp_path / "r")
    again = FiDReader.from_pretrained(tmp_path / "r").seq2seq
    assert again.lm_head.weight is not again.shared.weight
    assert torch.equal(again.lm_head.weight, t5.lm_head.weight) and torch.equal(again.shared.weight, t5.shared.weight)


@pytest.mark.parametrize("rows", [2, 3, 7])
def test_grouped_encoding_equals_each_passage_encoded_alone(reader, monkeypatch, rows):
    """Rows of many lengths in groups of `rows` give each passage the states it has unpadded,
    the logits and the gradient of one padded pass."""
    monkeypatch.setattr("reader.fid.ENCODE_GROUP_ROWS", rows)
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(2, 48, (3, 4, 9), generator=gen)
    lengths = torch.tensor([[9, 2, 5, 7], [1, 9, 3, 4], [6, 8, 9, 2]])
    mask = (torch.arange(9) < lengths[..., None]).long()
    mask[2, 3] = 0  # a fully masked (padding) passage
    input_ids = input_ids.masked_fill(mask == 0, 0)
    states = reader.encode(input_ids, mask)
    assert states.shape == (3, 4, 9, 32)
    for b in range(3):
        for k in range(4):
            n = int(mask[b, k].sum())
            if n == 0:
                continue
            alone = reader.seq2seq.encoder(
                input_ids=input_ids[b, k, None, :n], attention_mask=mask[b, k, None, :n]
            ).last_hidden_state[0]
            torch.testing.assert_close(states[b, k, :n], alone, atol=1e-5, rtol=0)
    labels = torch.randint(2, 48, (3, 4), generator=gen)
    grouped_logits = reader(input_ids, mask, labels=labels).logits
    monkeypatch.setattr("reader.fid.ENCODE_GROUP_ROWS", 100)
    monkeypatch.setattr("reader.fid.ENCODE_GROUP_PADDING", float("inf"))  # one group: one padded pass
    torch.testing.assert_close(grouped_logits, reader(input_ids, mask, labels=labels).logits, atol=1e-5, rtol=0)
    # the gradient through grouped encoding equals the one through a single padded pass
    weight = reader.seq2seq.encoder.block[0].layer[0].SelfAttention.q.weight
    (reader.encode(input_ids, mask) * mask[..., None]).sum().backward()
    grouped = weight.grad.clone()
    weight.grad = None
    padded = reader.seq2seq.encoder(input_ids=input_ids.view(12, 9), attention_mask=mask.view(12, 9)).last_hidden_state
    (padded * mask.view(12, 9, 1)).sum().backward()
    torch.testing.assert_close(grouped, weight.grad, atol=1e-4, rtol=1e-4)


def test_length_groups_cut_where_padding_would_pass_an_eighth_of_the_real_tokens(monkeypatch):
    monkeypatch.setattr("reader.fid.ENCODE_GROUP_ROWS", 4)
    # 100, 95, 90: padded 300 <= 1.125 * 285; with 60, padded 400 > 1.125 * 345: a new group at 60
    # 60, 58, 57, 56: four rows, the most a group holds; 55 starts the next; 10 alone (110 > 1.125 · 65)
    lengths = [100, 95, 90, 60, 58, 57, 56, 55, 10]
    assert length_groups(lengths) == [3, 4, 1, 1]
    assert length_groups([]) == []
    assert length_groups([7]) == [1]
    assert sum(length_groups(list(range(300, 0, -1)))) == 300


def test_the_wrapped_model_is_seq2seq():
    reader = build_reader("t5-tiny", vocab_size=100, seed=0)
    assert all(name.startswith("seq2seq.") for name in reader.state_dict())
