"""REALM's null document (`retriever.null_document`) on tiny models: the reader reads it as an empty passage,
each retriever loss covers it with its score E_q(q) · E_p(∅) in the same softmax (float64 by hand), it is read
when answering only where the setting says so and never shown as evidence, and a checkpoint keeps the setting
for a resumed run."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import atlas
from atlas.config import ConfigError, load_config
from atlas.loading import load_model, recipe_spec
from atlas.training.loop import train
from retriever.null_document import NULL_DOCUMENT_ID, is_null_document, with_null_document
from tasks.base import Example
from tasks.passage import Passage
from tests.atlas.test_train import logged_losses, tiny_config
from tests.conftest import TINY_DOCS

QUERIES = ["question: capital of zorbland? answer: <extra_id_0>", "question: tarsia currency? answer: <extra_id_0>"]
TARGETS = ["<extra_id_0> Quimper", "<extra_id_0> florin"]


def given_examples() -> list[Example]:
    """Two questions with given passages (3 and 2: uneven lists)."""
    docs = [Passage.from_record(d) for d in TINY_DOCS]
    return [
        Example(id="a", query=QUERIES[0], target=None, answers=[], passages=docs[:3]),
        Example(id="b", query=QUERIES[1], target=None, answers=[], passages=[docs[2], docs[4]]),
    ]


def capture_reader_inputs(model) -> tuple[list[torch.Tensor], torch.utils.hooks.RemovableHandle]:
    """The (B, K, L) input ids of each call of the reader's encoder, as it is called."""
    seen: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        seen.append((kwargs["input_ids"] if "input_ids" in kwargs else args[0]).clone())

    return seen, model.reader.register_forward_pre_hook(hook, with_kwargs=True)


def test_the_setting_is_checked():
    with pytest.raises(ConfigError, match="null_document"):
        load_config(None, ["retriever.null_document=sometimes"])
    assert load_config(None, []).retriever.null_document == "never"


def test_the_reader_reads_the_null_document_first_as_an_empty_passage(tiny_world, tmp_path):
    model = load_model(recipe_spec(tiny_config(tiny_world, tmp_path, "retriever.null_document=train"))).train()
    seen, handle = capture_reader_inputs(model)
    model.losses(given_examples(), TARGETS)
    handle.remove()
    input_ids = seen[0]  # the training pass (B, 1 + 3, L)
    assert input_ids.shape[:2] == (2, 4)
    tokenizer = model.reader_tokenizer
    for b, query in enumerate(QUERIES):
        # the reference implementation's empty passage: the passage format with empty title and text
        expected = tokenizer(f"{query} title:  context: ")["input_ids"]
        row = [t for t in input_ids[b, 0].tolist() if t != tokenizer.pad_token_id]
        assert row == expected
    second = [t for t in input_ids[0, 1].tolist() if t != tokenizer.pad_token_id]
    assert second == tokenizer(f"{QUERIES[0]} title: Zorbland context: {TINY_DOCS[0]['text']}")["input_ids"]


def hand_loss(name: str, scores: list[float], gold: list[float], dim: int, tau_gold: float, tau_score: float) -> float:
    """One example's retriever loss in float64 over its candidates (the null document among them)."""
    logits = [s / math.sqrt(dim) / tau_score for s in scores]
    top = max(logits)
    log_z = top + math.log(sum(math.exp(v - top) for v in logits))
    log_p_retr = [v - log_z for v in logits]
    if name == "emdr":
        terms = [lp + g / tau_gold for lp, g in zip(log_p_retr, gold)]
        top = max(terms)
        return -(top + math.log(sum(math.exp(t - top) for t in terms)))
    gold_logits = [g / tau_gold for g in gold]
    top = max(gold_logits)
    log_z = top + math.log(sum(math.exp(v - top) for v in gold_logits))
    return sum(math.exp(g - log_z) * (g - log_z - lr) for g, lr in zip(gold_logits, log_p_retr))


@pytest.mark.parametrize("name", ["adist", "pdist", "loop", "emdr"])
def test_each_retriever_loss_covers_the_null_document_in_the_same_softmax(name, tiny_world, tmp_path):
    """The training pass's retriever loss with and without the null document against a float64 hand computation:
    scores from the encoders (s(q, ∅) = E_q(q) · E_p(empty passage)), gold scores from the reader's tokenisation of
    each candidate list, the null document's included."""
    tau = ("retriever.temperature_gold=0.5", "retriever.temperature_score=0.2", "retriever.gold_precision=fp32")
    results = {}
    for setting in ("never", "train"):
        config = tiny_config(
            tiny_world, tmp_path / setting, f"retriever.loss={name}", f"retriever.null_document={setting}", *tau
        )
        torch.manual_seed(0)
        model = load_model(recipe_spec(config)).train()
        examples = given_examples()
        got = model.losses(examples, TARGETS)["retriever"].item()
        hand = []
        with torch.no_grad():
            query_vectors = model.retriever.encode_queries(QUERIES).double()  # (B, d)
            null_vector = model.retriever.encode_passages([{"title": "", "text": ""}])[0].double()  # E_p(∅)
            for b, example in enumerate(examples):
                passage_vectors = model.retriever.encode_passages([p.fields() for p in example.passages]).double()
                scores = (passage_vectors @ query_vectors[b]).tolist()
                candidates = [example.passages]
                if setting == "train":
                    scores = [float(null_vector @ query_vectors[b]), *scores]
                    candidates = with_null_document(candidates)
                ids, mask = model.reader_inputs([example.query], candidates)
                gold = model.retriever_loss.gold_scores(model.reader, ids, mask, model.target_labels([TARGETS[b]]))
                hand.append(hand_loss(name, scores, gold[0].double().tolist(), model.retriever.dim, 0.5, 0.2))
        assert got == pytest.approx(sum(hand) / len(hand), abs=2e-5)
        results[setting] = got
    assert abs(results["train"] - results["never"]) > 1e-4


def test_the_null_document_is_read_when_answering_only_where_the_setting_says(tiny_world, tmp_path):
    """ "train": answering reads the passages alone; "always": the null document too, first. Either way it is
    no evidence: not among an answer's passages (attention given for those alone), nor in the predictions' passages
    or the retrieval metrics."""
    run = tmp_path / "run"
    train(tiny_config(tiny_world, run, "retriever.null_document=train", "training.steps=2"), progress=False)
    checkpoint = run / "checkpoints" / "step-000002"
    question = "what is the capital of zorbland"
    read_counts, answers, metrics = {}, {}, {}
    for setting in ("train", "always"):
        model = atlas.Atlas.from_pretrained(
            checkpoint, overrides=[f"retriever.null_document={setting}", "inference.n_context=2"]
        )
        seen, handle = capture_reader_inputs(model.model)
        answers[setting] = model.answer(question, with_attention=True)
        handle.remove()
        read_counts[setting] = seen[0].shape[1]
        metrics[setting] = model.evaluate(tiny_world["qa"], out_dir=tmp_path / setting, progress=False)
        rows = [json.loads(line) for line in (tmp_path / setting / "predictions.jsonl").read_text().splitlines()]
        assert all(NULL_DOCUMENT_ID not in {p["id"] for p in r["passages"]} for r in rows)
    assert read_counts == {"train": 2, "always": 3}
    for answer in answers.values():
        assert len(answer.passages) == 2 and not any(is_null_document(p) for p in answer.passages)
        assert len(answer.attention) == 2
    assert [p.id for p in answers["train"].passages] == [p.id for p in answers["always"].passages]
    assert sum(answers["train"].attention) == pytest.approx(1, abs=1e-5)
    assert sum(answers["always"].attention) < 1  # the null document's share is left out
    recall = {k: {m: v for m, v in metrics[k].items() if "recall" in m} for k in metrics}
    assert recall["train"] and recall["train"] == recall["always"]


def test_a_checkpoint_records_the_setting_and_a_resumed_run_keeps_it(tiny_world, tmp_path):
    """3 steps, a kill, a resume from the checkpoint alone: the same losses as 6 steps straight with the null
    document, which differ from a run without it from the first step."""
    with_null = ("retriever.null_document=train", "training.steps=6")
    train(tiny_config(tiny_world, tmp_path / "straight", *with_null, "training.save_every=3"), progress=False)
    train(tiny_config(tiny_world, tmp_path / "halted", *with_null), progress=False, stop_at=3)
    saved = load_config(tmp_path / "halted" / "checkpoints" / "step-000003" / "config.yaml", [])
    assert saved.retriever.null_document == "train"
    train(None, resume=tmp_path / "halted", progress=False)
    a, b = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "halted")
    assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]
    train(tiny_config(tiny_world, tmp_path / "without", "training.steps=1"), progress=False)
    assert logged_losses(tmp_path / "without")[1] != a[1]


def test_answering_with_always_reads_what_never_reads_with_the_null_document_given(tiny_world, tmp_path):
    """`always` answers (generation and multiple-choice scoring) exactly as the same model with `never` answers
    from the passages with the null document put first by hand; `train` answers from the passages alone."""
    model = load_model(recipe_spec(tiny_config(tiny_world, tmp_path, "retriever.null_document=always"))).eval()
    examples = given_examples()
    passages = [list(e.passages) for e in examples]
    always = model.read(QUERIES, passages)
    always_options = model.option_logits(examples, ["A", "B"], passages)
    model.retriever_config = dataclasses.replace(model.retriever_config, null_document="never")
    assert model.read(QUERIES, with_null_document(passages)).texts == always.texts
    torch.testing.assert_close(model.option_logits(examples, ["A", "B"], with_null_document(passages)), always_options)
    plain = model.option_logits(examples, ["A", "B"], passages)
    assert not torch.allclose(plain, always_options)
    model.retriever_config = dataclasses.replace(model.retriever_config, null_document="train")
    torch.testing.assert_close(model.option_logits(examples, ["A", "B"], passages), plain)
