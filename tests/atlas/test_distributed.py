"""Data-parallel training under torchrun on CPU (gloo, 2 processes): the same numbers as one
process with the whole batch, and checkpoints that resume at another world size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from atlas.config import load_config, save_config
from atlas.training.checkpoint import load_training_state
from atlas.training.loop import train

# single-token answers: every rank's slice has as many target tokens as any other
COLOURS = [
    ("what colour is the zorbland flag", "red"),
    ("what colour is the tarsia flag", "blue"),
    ("what colour is mount olo", "green"),
    ("what colour is the fenwick river", "black"),
]


def recipe(world, out, tmp_path, *overrides):
    data = tmp_path / "colours.jsonl"
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
            "training.steps=3",
            "training.lr=3e-3",
            "training.lr_retriever=1e-3",
            "training.warmup_steps=0",
            *overrides,
        ],
    )


def torchrun(config_or_resume: list[str], tmp_path, nproc: int = 2) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "atlas",
        "train",
        *config_or_resume,
    ]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


def logged(out):
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [r["loss/total"] for r in rows if "loss/total" in r]


def reader_weights(out, step):
    return load_file(out / "checkpoints" / f"step-{step:06d}" / "reader" / "model.safetensors")


@pytest.mark.slow
def test_two_ranks_match_one_process_with_the_whole_batch(tiny_world, tmp_path):
    single = recipe(tiny_world, tmp_path / "single", tmp_path, "training.batch_size=2")
    train(single, progress=False)
    double = recipe(tiny_world, tmp_path / "double", tmp_path, "training.batch_size=1")
    save_config(double, tmp_path / "double.yaml")
    torchrun([str(tmp_path / "double.yaml")], tmp_path)
    assert logged(tmp_path / "double") == pytest.approx(logged(tmp_path / "single"), abs=1e-5)
    a, b = reader_weights(tmp_path / "single", 3), reader_weights(tmp_path / "double", 3)
    # Adam divides by sqrt(v): where a gradient is ~0, summation-order noise moves a weight by up
    # to lr, so compare the bulk of the weights tightly and every weight within one step size
    diff = torch.cat([(a[name] - b[name]).abs().flatten() for name in a])
    assert (diff < 1e-5).float().mean() > 0.999 and diff.max() < 3e-3


@pytest.mark.slow
def test_accumulation_under_ddp_and_resume_on_one_rank(tiny_world, tmp_path):
    """2 ranks × batch 1 × 2 micro-batches, stopped at step 2, resumed on 1 rank: the stored
    global batch (4) makes it 1 rank × batch 2 × 2, with the same data order and losses."""
    straight = recipe(
        tiny_world,
        tmp_path / "straight",
        tmp_path,
        "training.batch_size=2",
        "training.accumulation_steps=2",
        "training.steps=4",
    )
    train(straight, progress=False)
    two = recipe(
        tiny_world,
        tmp_path / "two",
        tmp_path,
        "training.batch_size=1",
        "training.accumulation_steps=2",
        "training.steps=4",
    )
    save_config(two, tmp_path / "two.yaml")
    torchrun([str(tmp_path / "two.yaml"), "--stop-at", "2"], tmp_path)
    state = load_training_state(tmp_path / "two" / "checkpoints" / "step-000002")
    assert (state["world_size"], state["global_batch"]) == (2, 4)
    train(None, resume=tmp_path / "two", progress=False)
    assert "batch_size: 2\n" in (tmp_path / "two" / "checkpoints" / "step-000004" / "config.yaml").read_text()
    assert logged(tmp_path / "two") == pytest.approx(logged(tmp_path / "straight"), abs=1e-5)


@pytest.mark.slow
def test_one_rank_checkpoint_resumes_on_two_ranks(tiny_world, tmp_path):
    """1 rank × batch 2 × 2 micro-batches, stopped at step 2, resumed under torchrun on 2 ranks:
    batch 1 per rank keeps the global batch of 4, the data order and the losses."""
    straight = recipe(
        tiny_world,
        tmp_path / "straight",
        tmp_path,
        "training.batch_size=2",
        "training.accumulation_steps=2",
        "training.steps=4",
    )
    train(straight, progress=False)
    one = recipe(
        tiny_world,
        tmp_path / "one",
        tmp_path,
        "training.batch_size=2",
        "training.accumulation_steps=2",
        "training.steps=4",
    )
    train(one, progress=False, stop_at=2)
    torchrun(["--resume", str(tmp_path / "one")], tmp_path)
    state = load_training_state(tmp_path / "one" / "checkpoints" / "step-000004")
    assert (state["world_size"], state["global_batch"], state["step"]) == (2, 4, 4)
    assert "batch_size: 1\n" in (tmp_path / "one" / "checkpoints" / "step-000004" / "config.yaml").read_text()
    assert logged(tmp_path / "one") == pytest.approx(logged(tmp_path / "straight"), abs=1e-5)


def test_resuming_keeps_the_global_batch_or_says_why_it_cannot():
    from atlas.training.checkpoint import config_for_world_size, per_rank_batch_size

    assert [per_rank_batch_size(8, 2, world) for world in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(
        ValueError,
        match="global batch of 6 examples on 4 rank\\(s\\) × 1 accumulation step"
        "\\(s\\): 6 is not divisible by 4; resume on a number of ranks that divides 6",
    ):
        per_rank_batch_size(6, 1, 4)
    config = load_config(None, ["training.batch_size=3", "training.accumulation_steps=2"])
    assert config_for_world_size(config, {"global_batch": 12, "world_size": 2}, 1).training.batch_size == 6
    assert config_for_world_size(config, {"global_batch": 12, "world_size": 2}, 2) is config
    assert config_for_world_size(config, {}, 4) is config  # older checkpoints: per-rank batch kept
