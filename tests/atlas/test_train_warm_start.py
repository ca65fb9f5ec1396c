"""The warm-started reader in the training recipe: every retriever loss, the reading stage, frozen
encoder blocks that stay frozen, two learning rates, and an exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from atlas.config import load_config
from atlas.loading import checkpoint_config, load_model, recipe_spec
from atlas.training.loop import train


def warm_config(world, out, *overrides):
    return load_config(
        None,
        [
            f"retriever.model={world['encoder']}",
            "retriever.loss=pdist",
            "retriever.n_context=3",
            "retriever.temperature_gold=0.1",
            "retriever.temperature_score=0.1",
            f"index.path={world['index']}",
            "reader.model=minilm-fid-tiny",
            f"reader.encoder={world['encoder']}",
            "reader.trainable_encoder_layers=1",
            "reader.n_context=3",
            "reader.text_maxlength=48",
            "reader.dropout=0.0",
            "reader.answer_maxlength=8",
            "inference.generation_max_length=6",
            "task.name=qa",
            f"task.train_data=[{world['qa']}]",
            f"task.eval_data=[{world['qa']}]",
            f"training.output_dir={out}",
            "training.steps=4",
            "training.batch_size=2",
            "training.lr=3e-3",
            "training.lr_encoder=1e-3",
            "training.lr_retriever=1e-3",
            "training.warmup_steps=1",
            "training.log_every=1",
            "evaluation.retrieval_k=[1,3]",
            "task.allow_overlap=true",  # a 4-question world: trained on, then asked (does training reach the answers?)
            *overrides,
        ],
    )


@pytest.mark.parametrize("loss", ["adist", "pdist", "emdr", "loop"])
def test_every_retriever_loss_trains_the_query_encoder_through_the_warm_started_reader(tiny_world, tmp_path, loss):
    config = warm_config(tiny_world, tmp_path / "run", f"retriever.loss={loss}", "training.steps=2")
    model = load_model(recipe_spec(config))
    before = [p.detach().clone() for p in model.retriever.query_encoder.parameters()]
    summary = train(config, progress=False)
    assert all(torch.isfinite(torch.tensor(summary["losses"])))
    trained = load_model(recipe_spec(checkpoint_config(summary["checkpoint"]), checkpoint=summary["checkpoint"]))
    moved = [not torch.equal(a, b) for a, b in zip(before, trained.retriever.query_encoder.parameters())]
    assert any(moved)


def test_frozen_blocks_stay_the_base_and_the_checkpoint_holds_only_the_rest(tiny_world, tmp_path):
    summary = train(warm_config(tiny_world, tmp_path / "run", "retriever.loss=none"), progress=False)
    stored = load_file(str(tmp_path / "run" / "checkpoints" / "step-000004" / "reader" / "model.safetensors"))
    assert any("encoder.layer.1." in name for name in stored)
    assert not any("encoder.layer.0." in name or "embeddings" in name for name in stored)
    trained = load_model(recipe_spec(checkpoint_config(summary["checkpoint"]), checkpoint=summary["checkpoint"]))
    base = load_model(recipe_spec(warm_config(tiny_world, tmp_path / "fresh", "retriever.loss=none")))
    frozen = "encoder.model.encoder.layer.0.attention.self.query.weight"
    top = "encoder.model.encoder.layer.1.attention.self.query.weight"
    t_state, b_state = trained.reader.seq2seq.state_dict(), base.reader.seq2seq.state_dict()
    assert torch.equal(t_state[frozen], b_state[frozen]) and not torch.equal(t_state[top], b_state[top])


def test_the_reader_encoder_gets_its_own_learning_rate(tiny_world, tmp_path):
    from atlas.training.loop import make_optimizers

    config = warm_config(tiny_world, tmp_path / "run")
    model = load_model(recipe_spec(config))
    reader_opt = make_optimizers(model, config).reader
    encoder = {id(p) for p in model.reader.seq2seq.encoder.parameters()}
    rates = {(g["lr"], all(id(p) in encoder for p in g["params"])) for g in reader_opt.param_groups}
    assert rates == {(3e-3, False), (1e-3, True)}
    assert all(p.requires_grad for g in reader_opt.param_groups for p in g["params"])


def test_reading_stage_resumes_bit_identically(tiny_world, tmp_path):
    squad = tmp_path / "squad.jsonl"
    squad.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {
                    "id": "a",
                    "question": "What is the capital of Zorbland?",
                    "title": "Zorbland",
                    "context": "The capital of Zorbland is Quimper. Zorbland is an island.",
                    "answers": ["Quimper"],
                },
                {
                    "id": "b",
                    "question": "Who first climbed Mount Olo?",
                    "title": "Olo",
                    "context": "Mount Olo is 3000 metres high; Anna Brook first climbed it.",
                    "answers": ["Anna Brook"],
                },
                {
                    "id": "c",
                    "question": "What is the currency of Tarsia?",
                    "title": "Tarsia",
                    "context": "The currency of Tarsia is the florin. Its capital is Belmont.",
                    "answers": ["florin"],
                },
            ]
        )
    )
    reading = [
        "retriever.loss=none",
        "task.name=reading",
        f"task.train_data=[{squad}]",
        f"task.eval_data=[{squad}]",
        "reader.n_context=1",
        "task.options={max_words: 8}",
        "training.steps=4",
    ]
    train(warm_config(tiny_world, tmp_path / "straight", *reading, "training.save_every=2"), progress=False)
    train(warm_config(tiny_world, tmp_path / "halted", *reading), progress=False, stop_at=2)
    summary = train(None, resume=tmp_path / "halted", progress=False)

    def losses(run):
        rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        return [r["loss/total"] for r in rows if "loss/total" in r]

    assert losses(tmp_path / "straight")[-2:] == losses(tmp_path / "halted")[-2:]
    assert set(summary["eval"]) >= {"exact_match", "f1"}


def test_answers_weigh_the_retrievers_ranking_with_a_retrieval_prior(tiny_world, tmp_path):
    from atlas.model import passage_log_prior
    from tasks.base import get_task

    examples = get_task("qa").load(tiny_world["qa"])[:3]
    for weight in (0.0, 2.0):
        config = warm_config(
            tiny_world, tmp_path / "run", f"inference.retrieval_prior={weight}", "inference.prior_temperature=0.1"
        )
        model = load_model(recipe_spec(config)).eval()
        seen = []
        hook = model.reader.seq2seq.copy_head.register_forward_hook(
            lambda _m, _args, kwargs, _out, seen=seen: seen.append(kwargs["log_prior"]), with_kwargs=True
        )
        passages = model.passages_for(examples, model.n_read)
        model.read([e.query for e in examples], passages)
        hook.remove()
        if not weight:
            assert seen and all(prior is None for prior in seen)
            continue
        expected = passage_log_prior(passages, 3, temperature=0.1, weight=weight)  # inference.prior_temperature
        assert expected is not None and expected[0, 0] > expected[0, -1]  # the first retrieved weighs most
        ids, mask = model.reader_inputs([e.query for e in examples], passages)
        _, packed_mask, positions = model.reader.fuse_packed(torch.zeros(*ids.shape, 1), mask)
        want = expected.gather(1, positions // ids.shape[2]).masked_fill(packed_mask.eq(0), 0)
        assert all(torch.allclose(prior, want) for prior in seen)
