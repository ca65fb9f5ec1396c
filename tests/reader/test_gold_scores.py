"""Gold-score primitives of the reader against naive references."""

from __future__ import annotations

import torch

from reader.fid import FiDReader
from reader.passage_scores import target_token_logprobs
from tests.reader.conftest import random_batch, tiny_t5


def naive_token_logprobs(t5, input_ids, mask, labels):
    """Plain T5 run on each (q, d_k) separately: (B, K, T) log p(a_t), 0 where ignored."""
    out = torch.zeros(labels.shape[0], input_ids.shape[1], labels.shape[1])
    for b in range(labels.shape[0]):
        for k in range(input_ids.shape[1]):
            logits = t5(
                input_ids=input_ids[b, k][None],
                attention_mask=mask[b, k][None],
                labels=labels[b][None],
            ).logits[0]
            for t, token in enumerate(labels[b].tolist()):
                if token != -100:
                    out[b, k, t] = logits[t].log_softmax(-1)[token]
    return out


def test_per_passage_logprobs_match_plain_t5_per_passage(reader):
    input_ids, mask, labels = random_batch(n_passages=3)
    with torch.no_grad():
        fast = reader.per_passage_token_logprobs(reader.encode(input_ids, mask), mask, labels)
        naive = naive_token_logprobs(reader.seq2seq, input_ids, mask, labels)
    torch.testing.assert_close(fast, naive, atol=1e-5, rtol=0)


def test_tempered_logprobs_use_logits_over_temperature():
    logits = torch.randn(2, 3, 7, dtype=torch.float64)
    labels = torch.tensor([[1, 2, -100], [0, 6, 3]])
    got = target_token_logprobs(logits, labels, temperature=0.5)
    for n in range(2):
        for t in range(3):
            if labels[n, t] == -100:
                assert got[n, t] == 0
            else:
                z = logits[n, t] / 0.5
                expected = z[labels[n, t]] - torch.log(torch.exp(z).sum())
                assert abs(got[n, t].item() - expected.item()) < 1e-5


def test_leave_one_out_equals_reading_without_the_passage(reader):
    input_ids, mask, labels = random_batch(n_passages=3)
    with torch.no_grad():
        fast = reader.leave_one_out_nll(reader.encode(input_ids, mask), mask, labels)
        for k in range(3):
            keep = [j for j in range(3) if j != k]
            logits = reader(input_ids[:, keep], mask[:, keep], labels=labels).logits
            for b in range(2):
                valid = labels[b] != -100
                nll = torch.nn.functional.cross_entropy(logits[b][valid], labels[b][valid])
                assert abs(fast[b, k].item() - nll.item()) < 1e-5


def test_cross_attention_scores_match_eager_output_attentions():
    eager = tiny_t5(attn_implementation="eager")
    reader = FiDReader(tiny_t5())  # same weights, default (sdpa) attention
    input_ids, mask, labels = random_batch(n_passages=3)
    with torch.no_grad():
        states = reader.encode(input_ids, mask)
        fast = reader.cross_attention_scores(states, mask, labels)
        batch, n_passages, length, hidden = states.shape
        fused = states.reshape(batch, -1, hidden)
        out = eager(
            encoder_outputs=(fused,),
            attention_mask=mask.reshape(batch, -1),
            labels=labels,
            output_attentions=True,
            use_cache=False,
        )
        assert len(out.cross_attentions) == 2
        expected = torch.zeros(batch, n_passages, dtype=torch.float64)
        for layer, alpha in enumerate(out.cross_attentions):  # alpha: (B, heads, T, K·L)
            attention = eager.decoder.block[layer].layer[1].EncDecAttention
            values = attention.v(fused).view(batch, -1, attention.n_heads, attention.key_value_proj_dim)
            value_norms = values.double().norm(dim=-1)  # (B, K·L, heads)
            for b in range(batch):
                for t in range(labels.shape[1]):
                    if labels[b, t] == -100:
                        continue
                    for j in range(n_passages * length):
                        contribution = (alpha[b, :, t, j].double() * value_norms[b, j]).mean()
                        expected[b, j // length] += contribution
        n_valid = (labels != -100).sum(-1).double()
        expected /= (2 * n_valid)[:, None]
    torch.testing.assert_close(fast.double(), expected, atol=1e-5, rtol=1e-5)


def test_reordering_passages_reorders_gold_scores(reader):
    input_ids, mask, labels = random_batch(n_passages=4)
    order = torch.tensor([3, 1, 0, 2])
    with torch.no_grad():
        for method in (reader.cross_attention_scores, reader.leave_one_out_nll):
            scores = method(reader.encode(input_ids, mask), mask, labels)
            permuted = method(reader.encode(input_ids[:, order], mask[:, order]), mask[:, order], labels)
            torch.testing.assert_close(permuted, scores[:, order], atol=1e-5, rtol=1e-5)
        logprobs = reader.per_passage_token_logprobs(reader.encode(input_ids, mask), mask, labels)
        permuted = reader.per_passage_token_logprobs(
            reader.encode(input_ids[:, order], mask[:, order]), mask[:, order], labels
        )
        torch.testing.assert_close(permuted, logprobs[:, order], atol=1e-5, rtol=1e-5)
