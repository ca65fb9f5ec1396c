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
from atlas.train import train

# single-token answers: every rank's slice has as many target tokens as any other
COLOURS = [("what colour is the zorbland flag", "red"), ("what colour is the tarsia flag", "blue"),
           ("what colour is mount olo", "green"), ("what colour is the fenwick river", "black")]


def recipe(world, out, tmp_path, *overrides):
    data = tmp_path / "colours.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a in COLOURS))
    return load_config(None, [
        f"retriever.model={world['encoder']}", "retriever.loss=pdist", "retriever.n_context=2",
        "retriever.temperature_gold=0.1", "retriever.temperature_score=0.1", f"index.path={world['index']}",
        "reader.model=t5-tiny", "reader.n_context=2", "reader.text_maxlength=48", "reader.dropout=0.0",
        "task.name=qa", f"task.train_data=[{data}]", f"training.output_dir={out}", "training.steps=3",
        "training.lr=3e-3", "training.lr_retriever=1e-3", "training.warmup_steps=0", *overrides,
    ])


def torchrun(config_or_resume: list[str], tmp_path, nproc: int = 2) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "atlas", "train", *config_or_resume]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
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
    """2 ranks × batch 1 × 2 micro-batches, stopped at step 2, resumed on 1 rank × batch 2 × 2."""
    straight = recipe(tiny_world, tmp_path / "straight", tmp_path, "training.batch_size=2",
                      "training.accumulation_steps=2", "training.steps=4")
    train(straight, progress=False)
    two = recipe(tiny_world, tmp_path / "two", tmp_path, "training.batch_size=1",
                 "training.accumulation_steps=2", "training.steps=4")
    save_config(two, tmp_path / "two.yaml")
    torchrun([str(tmp_path / "two.yaml"), "--stop-at", "2"], tmp_path)
    # continue on one process with the same global batch: 1 rank × 2 examples instead of 2 × 1
    config_path = tmp_path / "two" / "checkpoints" / "step-000002" / "config.yaml"
    text = config_path.read_text()
    assert "batch_size: 1\n" in text
    config_path.write_text(text.replace("batch_size: 1\n", "batch_size: 2\n", 1))
    train(None, resume=tmp_path / "two", progress=False)
    assert logged(tmp_path / "two") == pytest.approx(logged(tmp_path / "straight"), abs=1e-5)
