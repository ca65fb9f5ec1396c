"""`atlas evaluate` under torchrun on CPU (gloo, 2 processes) with a sharded index: the ranks
split the examples (the last share padded so both search in lockstep), rank 0 gathers, writes
and scores — and the outputs are those of one process evaluating everything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from atlas.cli import main
from atlas.config import load_config

QUESTIONS = [  # 5 examples over 2 ranks: shares of 2 and 3, the first padded to 3
    ("what is the capital of zorbland", ["Quimper"]),
    ("what is the capital of tarsia", ["Belmont"]),
    ("who first climbed mount olo", ["Anna Brook"]),
    ("what is the currency of tarsia", ["florin"]),
    ("where is the fenwick river", ["Tarsia"]),
]


@pytest.mark.slow
def test_two_ranks_write_what_one_process_writes(tiny_world, tmp_path):
    from atlas.loading import load_model, recipe_spec
    from atlas.training.checkpoint import save_checkpoint

    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answers": a}) + "\n" for q, a in QUESTIONS))
    config = load_config(
        None,
        [
            f"retriever.model={tiny_world['encoder']}",
            f"index.path={tiny_world['index']}",
            "reader.model=t5-tiny",
            "reader.n_context=2",
            "reader.text_maxlength=48",
            "inference.generation_max_length=5",
            "task.name=qa",
            f"training.output_dir={tmp_path / 'run'}",
            "evaluation.retrieval_k=[1,3]",
            "evaluation.batch_size=2",
        ],
    )
    checkpoint = save_checkpoint(
        tmp_path / "run", 0, model=load_model(recipe_spec(config)), config=config, training_state={}
    )

    assert main(["evaluate", str(checkpoint), "--data", str(data), "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "atlas",
        "evaluate",
        str(checkpoint),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "two"),
        "index.sharded=true",
    ]
    result = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("predictions and metrics written to") == 1  # rank 0 alone reports

    def rows(folder):
        return [json.loads(line) for line in (tmp_path / folder / "predictions.jsonl").read_text().splitlines()]

    one, two = rows("one"), rows("two")
    assert len(two) == 5 and [r["id"] for r in two] == [str(n) for n in range(5)]  # no padding row, input order
    assert [r["prediction"] for r in two] == [r["prediction"] for r in one]
    # the same passages from the sharded search (scores: float32 products, batched differently)
    for a, b in zip(one, two):
        assert [p["id"] for p in a["passages"]] == [p["id"] for p in b["passages"]]
        assert [p["score"] for p in b["passages"]] == pytest.approx([p["score"] for p in a["passages"]], rel=1e-5)
    metrics_one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    metrics_two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert metrics_two == metrics_one and "answer_recall@3" in metrics_two  # texts re-read by row on rank 0
    assert load_config(tmp_path / "two" / "config.yaml").index.sharded is True
