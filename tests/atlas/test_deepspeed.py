"""DeepSpeed ZeRO stages 1–3 for the reader, on CPU (gloo): the same losses as plain training,
checkpoints that plain Hugging Face loaders read, exact optimizer-state consolidation, and
resuming — in one process and between 1 and 2 ranks (torchrun).

Skipped where DeepSpeed is not installed. Its first start compiles a small communication op
into ~/.cache/torch_extensions (about 45–100 s on 2 CPU cores, once per machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from atlas.config import ConfigError, TrainingConfig, load_config
from atlas.training.checkpoint import load_training_state
from atlas.training.loop import train

ZERO_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "deepspeed"

# Tolerances (fp32, dropout 0). ZeRO runs the same torch AdamW on flat partitions of the same
# gradients, so what differs from plain training is only the order of floating-point sums (the
# clipping norm over flat buffers, the gradient all-reduce across ranks), i.e. a few ulps.
# Measured over 4 steps, ZeRO-1/2/3 in one process and ZeRO-2/3 on 2 ranks: reader losses within
# 1e-6 (loss ≈ 10, ulp ≈ 1e-6), total losses (with the retriever's KL at τ = 0.1, which
# amplifies the reader's differences tenfold) within 1e-7 relative, weights within 5e-7 except
# ≤ 6 of 2.1M elements (up to 1.1e-5): where a gradient is ~0, Adam divides it by √v ≈ 0 and
# summation noise can move a weight by up to lr (3e-3). Each bound below has a 10× margin.
READER_ATOL, TOTAL_RTOL, WEIGHT_ATOL, WEIGHT_BULK = 1e-5, 1e-6, 1e-6, 0.99999


@pytest.fixture(scope="module")
def ds():
    return pytest.importorskip("deepspeed")


# single-token answers: every rank's slice has as many target tokens as any other, so the mean
# of the ranks' mean token losses equals one process's mean over the whole batch
COLOURS = [
    ("what colour is the zorbland flag", "red"),
    ("what colour is the tarsia flag", "blue"),
    ("what colour is mount olo", "green"),
    ("what colour is the fenwick river", "black"),
]


def recipe(world, out, *overrides):
    """A tiny run: t5-tiny reader, 2-layer retriever trained by pdist, 4 examples, 4 steps."""
    data = Path(world["root"]) / "colours.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a in COLOURS))
    return load_config(
        None,
        [
            f"retriever.model={world['encoder']}",
            "retriever.loss=pdist",
            "retriever.n_context=2",
            "retriever.temperature_gold=0.1",
            "retriever.temperature_score=0.1",
            f"index.path={world['index']}",
            "reader.model=t5-tiny",
            "reader.n_context=2",
            "reader.text_maxlength=48",
            "reader.dropout=0.0",
            "task.name=qa",
            f"task.train_data=[{data}]",
            f"training.output_dir={out}",
            "training.steps=4",
            "training.batch_size=2",
            "training.lr=3e-3",
            "training.lr_retriever=1e-3",
            "training.warmup_steps=2",
            *overrides,
        ],
    )


def zero_config(tmp_path, stage: int) -> Path:
    """The shipped configs/deepspeed/zero{stage}.json; for stage 3 with every parameter
    partitioned (the shipped threshold keeps small tensors whole, i.e. all but t5-tiny's
    embedding), so that the test exercises gathering everywhere."""
    shipped = ZERO_CONFIGS / f"zero{stage}.json"
    if stage != 3:
        return shipped
    config = json.loads(shipped.read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "zero3-all-partitioned.json"
    path.write_text(json.dumps(config))
    return path


def logged(out, key: str = "total") -> list[float]:
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [r[f"loss/{key}"] for r in rows if f"loss/{key}" in r]


def assert_same_losses(out, reference):
    assert len(logged(out)) == len(logged(reference)) == 4
    assert logged(out, "reader") == pytest.approx(logged(reference, "reader"), abs=READER_ATOL)
    assert logged(out) == pytest.approx(logged(reference), rel=TOTAL_RTOL)


def checkpoint(out, step):
    return out / "checkpoints" / f"step-{step:06d}"


@pytest.fixture(scope="module")
def plain(tiny_world, tmp_path_factory):
    """The reference: 4 steps without DeepSpeed."""
    out = tmp_path_factory.mktemp("plain") / "run"
    train(recipe(tiny_world, out), progress=False)
    return out


def assert_same_state(ds_out, plain_out, step):
    """Weights (plain safetensors) and the consolidated reader Adam state match plain training."""
    from transformers import T5ForConditionalGeneration

    reader = T5ForConditionalGeneration.from_pretrained(checkpoint(ds_out, step) / "reader")  # plain HF loader
    ours = reader.state_dict()
    reference = load_file(checkpoint(plain_out, step) / "reader" / "model.safetensors")
    diff = torch.cat([(ours[name] - tensor).abs().flatten() for name, tensor in reference.items()])
    # the bulk tightly, every weight within one Adam step (lr), see the tolerances above
    assert (diff <= WEIGHT_ATOL).double().mean() > WEIGHT_BULK and diff.max() < 3e-3
    a = load_training_state(checkpoint(ds_out, step))["reader_optimizer"]
    b = load_training_state(checkpoint(plain_out, step))["reader_optimizer"]
    assert a["param_groups"][0]["lr"] == pytest.approx(b["param_groups"][0]["lr"])
    assert sorted(a["state"]) == sorted(b["state"])
    for index, entry in b["state"].items():
        assert float(a["state"][index]["step"]) == float(entry["step"]) == step
        torch.testing.assert_close(a["state"][index]["exp_avg"], entry["exp_avg"], rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(a["state"][index]["exp_avg_sq"], entry["exp_avg_sq"], rtol=1e-3, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_matches_plain_training_and_resumes(ds, stage, tiny_world, plain, tmp_path):
    """2 steps under ZeRO-`stage`, a checkpoint, then 2 more after resuming in a fresh engine:
    bit for bit the losses of 4 straight steps under ZeRO-`stage` (the gathered Adam state is
    scattered back exactly), and within summation-order noise plain training's losses, final
    weights and Adam state."""
    deepspeed = f"training.deepspeed={zero_config(tmp_path, stage)}"
    train(recipe(tiny_world, tmp_path / "straight", deepspeed), progress=False)
    out = tmp_path / f"zero{stage}"
    train(recipe(tiny_world, out, deepspeed), progress=False, stop_at=2)
    train(None, resume=out, progress=False)
    assert logged(out) == logged(tmp_path / "straight")  # bit-identical
    assert_same_losses(out, plain)
    assert_same_state(out, plain, 4)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoints_move_between_one_and_two_ranks(ds, stage, tiny_world, plain, tmp_path):
    """Step 1 on 1 rank × batch 2; steps 2–3 resumed under torchrun on 2 ranks × batch 1 (the
    saved moments scattered into real partitions, evaluation at step 2 — under ZeRO-3 both
    ranks generate in lockstep —, the retriever's gradients averaged outside DeepSpeed, the
    partitions gathered again at the step-3 checkpoint); step 4 resumed on 1 rank × batch 2.
    The global batch, the data order, the losses and the final state equal plain training's."""
    out = tmp_path / f"zero{stage}"
    data = Path(tiny_world["root"]) / "colours.jsonl"
    config = recipe(
        tiny_world,
        out,
        f"training.deepspeed={zero_config(tmp_path, stage)}",
        "training.keep_last=3",
        f"task.eval_data=[{data}]",
        "task.allow_overlap=true",
        "training.eval_every=2",
        "evaluation.retrieval_k=[1]",
        "inference.generation_max_length=4",
    )
    train(config, progress=False, stop_at=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "atlas",
        "train",
        "--resume",
        str(out),
        "--stop-at",
        "3",
    ]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    states = {s: load_training_state(checkpoint(out, s)) for s in (1, 3)}
    assert [(states[s]["world_size"], states[s]["global_batch"]) for s in (1, 3)] == [(1, 2), (2, 2)]
    assert "batch_size: 1\n" in (checkpoint(out, 3) / "config.yaml").read_text()
    assert set(json.loads((out / "eval-step-000002" / "metrics.json").read_text())) >= {"exact_match", "f1"}
    train(None, resume=out, progress=False)  # one process again: per-rank batch 2
    assert "batch_size: 2\n" in (checkpoint(out, 4) / "config.yaml").read_text()
    assert_same_losses(out, plain)
    assert_same_state(out, plain, 4)


# ---------------------------------------------------------------------------- configuration


def test_shipped_configs_fill_in_the_training_values(tmp_path):
    from atlas.training.deepspeed_engine import load_deepspeed_config

    training = TrainingConfig(batch_size=3, accumulation_steps=2, clip_norm=0.5)
    for stage in (1, 2, 3):
        config = load_deepspeed_config(ZERO_CONFIGS / f"zero{stage}.json", training, world_size=4)
        assert config["zero_optimization"]["stage"] == stage
        assert (
            config["train_micro_batch_size_per_gpu"],
            config["gradient_accumulation_steps"],
            config["train_batch_size"],
            config["gradient_clipping"],
        ) == (3, 2, 24, 0.5)


@pytest.mark.parametrize(
    "content, message",
    [
        ({"zero_optimization": {"stage": 0}}, "'zero_optimization.stage' must be 1, 2 or 3, got 0"),
        ({}, "'zero_optimization.stage' must be 1, 2 or 3, got None"),
        ({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}}, "remove 'optimizer'"),
        ({"zero_optimization": {"stage": 2}, "scheduler": {"type": "WarmupLR"}}, "remove 'scheduler'"),
        ({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, "'bf16.enabled' is not supported"),
        (
            {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 4},
            "'gradient_accumulation_steps' is 4 but training.accumulation_steps gives 1",
        ),
        (
            {"zero_optimization": {"stage": 2}, "gradient_clipping": 2.0},
            "'gradient_clipping' is 2.0 but training.clip_norm",
        ),
    ],
)
def test_bad_deepspeed_configs_are_rejected_with_the_file_and_key(tmp_path, content, message):
    from atlas.training.deepspeed_engine import load_deepspeed_config

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as error:
        load_deepspeed_config(path, TrainingConfig(), world_size=1)
    assert str(path) in str(error.value)


def test_unreadable_deepspeed_config(tmp_path):
    from atlas.training.deepspeed_engine import load_deepspeed_config

    with pytest.raises(ConfigError, match="missing.json: file not found"):
        load_deepspeed_config(tmp_path / "missing.json", TrainingConfig(), world_size=1)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json: invalid JSON"):
        load_deepspeed_config(tmp_path / "bad.json", TrainingConfig(), world_size=1)


def test_missing_deepspeed_is_a_clear_error(monkeypatch, tiny_world, tmp_path):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # makes `import deepspeed` raise ImportError
    config = recipe(tiny_world, tmp_path / "run", f"training.deepspeed={ZERO_CONFIGS / 'zero2.json'}")
    with pytest.raises(ImportError, match=r"DeepSpeed is not installed: pip install 'atlas-rag\[deepspeed\]'"):
        train(config, progress=False)
