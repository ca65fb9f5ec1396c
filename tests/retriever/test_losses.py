"""Retriever losses: formulas by hand in float64, gold scores, gradient isolation."""

from __future__ import annotations

import math

import pytest
import torch

from reader.fid import FiDReader
from retriever.losses import RETRIEVER_LOSSES, build_retriever_loss, kl_distillation
from tests.reader.conftest import random_batch, tiny_t5
from tests.reader.test_gold_scores import naive_token_logprobs

DIM = 16


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def random_scores_and_gold(seed: int = 0, batch: int = 3, n_passages: int = 4):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, n_passages, generator=gen, dtype=torch.float64) * 3
    gold = torch.randn(batch, n_passages, generator=gen, dtype=torch.float64)
    return scores, gold


@pytest.mark.parametrize("name", ["adist", "pdist", "loop"])
def test_kl_losses_equal_the_formula(name):
    scores, gold = random_scores_and_gold()
    tau_gold, tau_score = 0.5, 0.3
    expected = 0.0
    for b in range(3):
        p_gold = softmax([g / tau_gold for g in gold[b].tolist()])
        p_retr = softmax([s / math.sqrt(DIM) / tau_score for s in scores[b].tolist()])
        expected += sum(pg * (math.log(pg) - math.log(pr)) for pg, pr in zip(p_gold, p_retr))
    expected /= 3
    loss = build_retriever_loss(name, temperature_gold=tau_gold, temperature_score=tau_score)
    got = loss.loss(scores, gold, labels=torch.zeros(3, 1), dim=DIM)
    assert abs(got.item() - expected) < 1e-5
    assert (
        abs(
            kl_distillation(scores, gold, dim=DIM, temperature_gold=tau_gold, temperature_score=tau_score).item()
            - expected
        )
        < 1e-5
    )


def test_emdr_sequence_equals_the_formula():
    scores, _ = random_scores_and_gold(seed=1)
    sequence_logprob = -torch.rand(3, 4, dtype=torch.float64) * 3  # log p_reader(a | q, d_k)
    tau_gold, tau_score = 0.5, 0.3
    expected = 0.0
    for b in range(3):
        p_retr = softmax([s / math.sqrt(DIM) / tau_score for s in scores[b].tolist()])
        mixture = sum(pr * math.exp(lp) ** (1 / tau_gold) for pr, lp in zip(p_retr, sequence_logprob[b].tolist()))
        expected -= math.log(mixture)
    expected /= 3
    loss = build_retriever_loss("emdr", temperature_gold=tau_gold, temperature_score=tau_score)
    assert abs(loss.loss(scores, sequence_logprob, torch.zeros(3, 1), dim=DIM).item() - expected) < 1e-5


def test_emdr_token_equals_the_reference_mixture():
    scores, _ = random_scores_and_gold(seed=2)
    token_logprob = -torch.rand(3, 4, 5, dtype=torch.float64) * 3  # tempered log p(a_t | q, d_k)
    labels = torch.ones(3, 5, dtype=torch.long)
    labels[0, 3:] = -100
    labels[2, 4] = -100
    expected, count = 0.0, 0
    for b in range(3):
        p_retr = softmax([s / math.sqrt(DIM) / 0.3 for s in scores[b].tolist()])
        for t in range(5):
            if labels[b, t] == -100:
                continue
            expected -= math.log(sum(p_retr[k] * math.exp(token_logprob[b, k, t].item()) for k in range(4)))
            count += 1
    loss = build_retriever_loss("emdr", temperature_gold=0.5, temperature_score=0.3, granularity="token")
    assert abs(loss.loss(scores, token_logprob, labels, dim=DIM).item() - expected / count) < 1e-5


def test_gold_scores_equal_naive_references():
    reader = FiDReader(tiny_t5())
    input_ids, mask, labels = random_batch(n_passages=3)
    naive = naive_token_logprobs(reader.seq2seq, input_ids, mask, labels).detach()  # (B, K, T)
    n_valid = (labels != -100).sum(-1, keepdim=True)
    pdist = build_retriever_loss("pdist").gold_scores(reader, input_ids, mask, labels)
    torch.testing.assert_close(pdist, naive.sum(-1) / n_valid, atol=1e-5, rtol=0)
    emdr = build_retriever_loss("emdr").gold_scores(reader, input_ids, mask, labels)
    torch.testing.assert_close(emdr, naive.sum(-1), atol=1e-5, rtol=0)
    with torch.no_grad():
        states = reader.encode(input_ids, mask)
        loop_expected = reader.leave_one_out_nll(states, mask, labels)
        adist_expected = reader.cross_attention_scores(states, mask, labels)
    torch.testing.assert_close(build_retriever_loss("loop").gold_scores(reader, input_ids, mask, labels), loop_expected)
    torch.testing.assert_close(
        build_retriever_loss("adist").gold_scores(reader, input_ids, mask, labels), adist_expected
    )
    # Reusing precomputed (eval-mode) encoder states gives the same gold scores.
    torch.testing.assert_close(
        build_retriever_loss("pdist").gold_scores(reader, None, mask, labels, encoder_states=states),
        pdist,
    )


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_gold_is_computed_in_eval_mode_and_mode_is_restored(name):
    t5 = tiny_t5()
    t5.config.dropout_rate = 0.5
    noisy = FiDReader(type(t5)(t5.config))
    noisy.load_state_dict(FiDReader(t5).state_dict())
    input_ids, mask, labels = random_batch()
    loss = build_retriever_loss(name)
    eval_gold = loss.gold_scores(noisy.eval(), input_ids, mask, labels)
    noisy.train()
    with torch.no_grad():  # the premise: in train mode dropout changes the reader's outputs
        train_mode = noisy.per_passage_token_logprobs(noisy.encode(input_ids, mask), mask, labels)
        eval_mode = noisy.eval().per_passage_token_logprobs(noisy.encode(input_ids, mask), mask, labels)
    assert not torch.allclose(train_mode, eval_mode)
    noisy.train()
    for _ in range(2):  # dropout would make these differ from each other and from eval_gold
        torch.testing.assert_close(loss.gold_scores(noisy, input_ids, mask, labels), eval_gold)
    assert noisy.training


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_gradient_reaches_the_query_encoder_and_never_the_reader(name):
    reader = FiDReader(tiny_t5()).train()
    input_ids, mask, labels = random_batch(n_passages=3)
    torch.manual_seed(0)
    query_encoder = torch.nn.Linear(8, DIM)
    passage_embeddings = torch.randn(2, 3, DIM)
    query_embeddings = query_encoder(torch.randn(2, 8))  # (B, dim)
    scores = torch.einsum("bd,bkd->bk", query_embeddings, passage_embeddings)
    scores.retain_grad()
    loss = build_retriever_loss(name, temperature_gold=1.0, temperature_score=1.0)
    value = loss(reader, scores, input_ids, mask, labels, dim=DIM)
    value.backward()
    for parameter in reader.parameters():
        assert parameter.grad is None or torch.count_nonzero(parameter.grad) == 0
    assert torch.count_nonzero(query_encoder.weight.grad) > 0
    assert torch.count_nonzero(scores.grad) > 0


def test_reordering_passages_reorders_gold_and_keeps_the_loss():
    reader = FiDReader(tiny_t5())
    input_ids, mask, labels = random_batch(n_passages=4)
    order = torch.tensor([2, 3, 1, 0])
    scores = torch.randn(2, 4)
    for name in ("adist", "pdist", "loop", "emdr"):
        loss = build_retriever_loss(name, temperature_gold=1.0, temperature_score=1.0)
        gold = loss.gold_scores(reader, input_ids, mask, labels)
        permuted = loss.gold_scores(reader, input_ids[:, order], mask[:, order], labels)
        torch.testing.assert_close(permuted, gold[:, order], atol=1e-5, rtol=1e-5)
        value = loss(reader, scores, input_ids, mask, labels, dim=DIM)
        permuted_value = loss(reader, scores[:, order], input_ids[:, order], mask[:, order], labels, dim=DIM)
        torch.testing.assert_close(value, permuted_value, atol=1e-5, rtol=1e-5)


def test_registry_and_none():
    assert sorted(RETRIEVER_LOSSES) == ["adist", "emdr", "loop", "none", "pdist"]
    with pytest.raises(
        ValueError,
        match=r"unknown retriever loss 'kl'; valid: \['adist', 'emdr', 'loop', 'none', 'pdist'\]",
    ):
        build_retriever_loss("kl")
    with pytest.raises(ValueError, match="granularity"):
        build_retriever_loss("emdr", granularity="word")
    none = build_retriever_loss("none")
    assert not none.trains_retriever
    input_ids, mask, labels = random_batch()
    assert none(FiDReader(tiny_t5()), torch.randn(2, 3), input_ids, mask, labels, dim=DIM) is None


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_padding_passages_are_left_out(name):
    reader = FiDReader(tiny_t5())
    input_ids, mask, labels = random_batch(batch=1, n_passages=3)
    padded_ids = torch.cat([input_ids, torch.zeros_like(input_ids[:, :1])], dim=1)
    padded_mask = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)
    scores = torch.randn(1, 4, requires_grad=True)
    loss = build_retriever_loss(name, temperature_gold=0.5, temperature_score=0.5)
    padded = loss(reader, scores, padded_ids, padded_mask, labels, dim=DIM)
    padded.backward()
    real = loss(reader, scores[:, :3], input_ids, mask, labels, dim=DIM)
    torch.testing.assert_close(padded, real, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(scores.grad).all() and scores.grad[0, 3] == 0


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_an_example_without_passages_is_left_out_of_the_batch_mean(name):
    """present all False for one example: the loss is the mean over the other examples, and
    no nan reaches the scores' gradient."""
    scores, gold = random_scores_and_gold(seed=4, batch=3, n_passages=4)
    scores.requires_grad_(True)
    present = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    loss = build_retriever_loss(name, temperature_gold=0.5, temperature_score=0.3)
    labels = torch.zeros(3, 1)
    value = loss.loss(scores, gold, labels, dim=DIM, present=present)
    value.backward()
    expected = (
        sum(
            loss.loss(
                scores[b : b + 1, : int(present[b].sum())].detach(),
                gold[b : b + 1, : int(present[b].sum())],
                labels[:1],
                dim=DIM,
            )
            for b in (0, 2)
        )
        / 2
    )
    assert value.item() == pytest.approx(expected.item(), abs=1e-6)
    assert torch.isfinite(scores.grad).all()
    assert not scores.grad[1].any() and not scores.grad[0, 3]
    nothing = loss.loss(scores, gold, labels, dim=DIM, present=torch.zeros(3, 4, dtype=torch.bool))
    assert nothing.item() == 0.0


def hand_retriever_loss(
    name: str, scores: list[float], gold: list[float], dim: int, tau_gold: float, tau_score: float
) -> float:
    """One example's retriever loss in float64 from its own K_b scores and gold scores."""
    p_retr = softmax([s / math.sqrt(dim) / tau_score for s in scores])
    if name == "emdr":
        return -math.log(sum(pr * math.exp(g / tau_gold) for pr, g in zip(p_retr, gold)))
    p_gold = softmax([g / tau_gold for g in gold])
    return sum(pg * (math.log(pg) - math.log(pr)) for pg, pr in zip(p_gold, p_retr) if pg > 0)


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_atlas_retriever_loss_with_uneven_passage_lists(name, tiny_world, tmp_path):
    """Examples with 3, 1 and 2 given passages in one batch: the batch's retriever loss is the
    mean of the per-example losses (each example run alone, and a float64 hand computation
    from each example's own gold and retriever scores)."""
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec
    from tasks.base import Example
    from tests.conftest import TINY_DOCS

    tau_gold, tau_score = 0.5, 0.2
    config = load_config(
        None,
        [
            f"retriever.model={tiny_world['encoder']}",
            f"retriever.loss={name}",
            "retriever.n_context=3",
            f"retriever.temperature_gold={tau_gold}",
            f"retriever.temperature_score={tau_score}",
            f"index.path={tiny_world['index']}",
            "reader.model=t5-tiny",
            "reader.n_context=3",
            "reader.text_maxlength=48",
            "reader.dropout=0.0",
            "reader.answer_maxlength=8",
            f"training.output_dir={tmp_path}",
            "retriever.gold_precision=fp32",  # the hand computation's gold pass runs at the reader's precision
        ],
    )
    torch.manual_seed(0)
    model = load_model(recipe_spec(config)).train()
    docs = [dict(d) for d in TINY_DOCS]
    examples = [
        Example(
            id="a",
            query="question: capital of zorbland? answer: <extra_id_0>",
            target=None,
            answers=[],
            passages=docs[:3],
        ),
        Example(
            id="b", query="question: who climbed olo? answer: <extra_id_0>", target=None, answers=[], passages=docs[3:4]
        ),
        Example(
            id="c",
            query="question: tarsia currency? answer: <extra_id_0>",
            target=None,
            answers=[],
            passages=[docs[4], docs[1]],
        ),
    ]
    targets = ["<extra_id_0> Quimper", "<extra_id_0> Anna Brook climbed it", "<extra_id_0> florin"]

    batch = model.losses(examples, targets)["retriever"]
    alone = [model.losses([e], [t])["retriever"].item() for e, t in zip(examples, targets)]
    assert batch.item() == pytest.approx(sum(alone) / 3, abs=2e-5)

    hand = []
    with torch.no_grad():
        for example, target in zip(examples, targets):
            scores = model.retriever_scores([example.query], [example.passages])[0]  # (K_b,)
            ids, mask = model.reader_inputs([example.query], [example.passages])
            gold = model.retriever_loss.gold_scores(model.reader, ids, mask, model.target_labels([target]))
            hand.append(
                hand_retriever_loss(
                    name, scores.double().tolist(), gold[0].double().tolist(), model.retriever.dim, tau_gold, tau_score
                )
            )
    assert hand[1] == 0.0 or name == "emdr"  # one passage: both distributions are [1]
    assert batch.item() == pytest.approx(sum(hand) / 3, abs=2e-5)

    # The padded (B, K) scores: zeros where an example has no k-th passage.
    with torch.no_grad():
        padded = model.retriever_scores([e.query for e in examples], [e.passages for e in examples])
    assert padded.shape == (3, 3) and padded[1, 1:].eq(0).all() and padded[2, 2] == 0
    assert model.passage_presence([e.passages for e in examples]).tolist() == [
        [True, True, True],
        [True, False, False],
        [True, True, False],
    ]


def test_each_loss_declares_its_own_options_and_refuses_others():
    """The registry holds each loss's options with their defaults: `build_retriever_loss` fills the defaults
    and refuses an option the loss does not have, naming the valid ones."""
    assert RETRIEVER_LOSSES["emdr"].default_options == {"granularity": "sequence"}
    assert RETRIEVER_LOSSES["adist"].default_options == {"attention": "auto"}
    assert all(not RETRIEVER_LOSSES[name].default_options for name in ("pdist", "loop", "none"))
    for cls in RETRIEVER_LOSSES.values():  # every default is one of its choices
        assert all(cls.default_options[o] in choices for o, choices in cls.option_choices.items())
    assert build_retriever_loss("emdr").granularity == "sequence"
    assert build_retriever_loss("emdr", granularity="token").granularity == "token"
    assert build_retriever_loss("adist", attention="copy").attention == "copy"
    with pytest.raises(
        ValueError,
        match=r"unknown option 'granularity' of retriever loss 'adist'; "
        r"valid: \['attention'\]",
    ):
        build_retriever_loss("adist", granularity="token")
    with pytest.raises(ValueError, match=r"unknown option 'attention' of retriever loss 'pdist'; valid: \(none\)"):
        build_retriever_loss("pdist", attention="copy")


def test_gold_precision_names_are_refused_outside_the_vocabulary():
    assert build_retriever_loss("pdist").gold_precision == "fp32"
    with pytest.raises(ValueError, match=r"unknown gold precision 'full'"):
        build_retriever_loss("pdist", gold_precision="full")
    with pytest.raises(ValueError, match=r"valid: \['auto', 'fp32', 'bf16'\]"):
        build_retriever_loss("pdist", gold_precision="fp16")


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_the_null_document_is_one_more_candidate_in_the_same_softmax(name):
    """REALM's null document: a column of scores s(q, ∅) and gold scores (the reader's on the empty passage)
    beside the K passages'; each loss equals its float64 formula over the K + 1 candidates, and differs from
    the one over the K passages alone (which it equals without the column)."""
    scores, gold = random_scores_and_gold(seed=5, batch=2, n_passages=3)
    gold = -gold.abs() * 4  # log-likelihoods for EMDR² (any real numbers for the KL losses)
    null_scores = torch.tensor([[2.5], [-1.0]], dtype=torch.float64)  # s(q, ∅)
    null_gold = torch.tensor([[-0.2], [-9.0]], dtype=torch.float64)  # the reader's gold on ∅
    tau_gold, tau_score = 0.5, 0.3
    loss = build_retriever_loss(name, temperature_gold=tau_gold, temperature_score=tau_score)
    labels = torch.zeros(2, 1)

    def by_hand(s: torch.Tensor, g: torch.Tensor) -> float:
        return (
            sum(hand_retriever_loss(name, s[b].tolist(), g[b].tolist(), DIM, tau_gold, tau_score) for b in (0, 1)) / 2
        )

    without = loss.loss(scores, gold, labels, dim=DIM).item()
    with_null = loss.loss(torch.cat([null_scores, scores], 1), torch.cat([null_gold, gold], 1), labels, dim=DIM)
    # the losses compute in float32 (as the other formula tests here): against float64 to float32's precision
    assert without == pytest.approx(by_hand(scores, gold), abs=1e-5)
    assert with_null.item() == pytest.approx(
        by_hand(torch.cat([null_scores, scores], 1), torch.cat([null_gold, gold], 1)), abs=1e-5
    )
    assert abs(with_null.item() - without) > 1e-3


def test_emdr_with_the_null_document_moves_each_score_by_realms_r():
    """The seed's REALM gradient, ∇ log p(a | q) = Σ_z r(z) ∇f(q, z), r(z) = [p(a | q, z) / p(a | q) − 1] · p(z | q),
    over the passages and ∅ (τ_gold = 1: EMDR²'s mixture is REALM's marginal likelihood); f = s / sqrt(dim) /
    τ_score here, and the loss is the batch mean of −log p(a | q). Where the reader gets the answer better reading
    nothing than reading the first-ranked passage, ∅ is lifted and that passage lowered; without ∅ it is lifted."""
    tau_score = 0.5
    likelihood = torch.tensor([[0.5, 0.2, 0.01, 0.02]], dtype=torch.float64)  # p(a | q, z), z = ∅, d_1..d_3
    raw = torch.tensor([[2.0, 3.0, 0.0, -2.0]], dtype=torch.float64)  # d_1 ranks first
    loss = build_retriever_loss("emdr", temperature_gold=1.0, temperature_score=tau_score)

    def grad_and_r(columns: slice) -> tuple[list[float], list[float]]:
        scores = raw[:, columns].clone().requires_grad_(True)
        loss.loss(scores, likelihood[:, columns].log(), torch.zeros(1, 1), dim=DIM).backward()
        p_z = softmax([s / math.sqrt(DIM) / tau_score for s in raw[0, columns].tolist()])
        p_a = sum(pz * pl for pz, pl in zip(p_z, likelihood[0, columns].tolist()))
        r = [(pl / p_a - 1) * pz for pz, pl in zip(p_z, likelihood[0, columns].tolist())]
        return scores.grad[0].tolist(), r

    for columns in (slice(0, 4), slice(1, 4)):  # with and without ∅
        grad, r = grad_and_r(columns)
        assert grad == pytest.approx([-rz / math.sqrt(DIM) / tau_score for rz in r], abs=1e-6)
    with_null, _ = grad_and_r(slice(0, 4))
    without, _ = grad_and_r(slice(1, 4))
    assert with_null[0] < 0 < with_null[1]  # gradient descent lifts ∅ and lowers d_1
    assert without[0] < 0  # without ∅, d_1 is lifted
