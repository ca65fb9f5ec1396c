"""bench/real_size.py: the GPU projection's arithmetic, and (slow tier) the bench at reduced size end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_real_size", REPO / "bench" / "real_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zero_stages_partition_the_readers_state_and_never_the_retrievers(bench):
    reader, trained, frozen, activations = 1_000_000_000, 100_000_000, 50_000_000, 2 * GIB
    projection = bench.project_gpu_gib(reader, trained, frozen, activations, gpus=8)
    retriever = 16 * trained + 4 * frozen  # own AdamW outside DeepSpeed, on every rank
    by_stage = [
        4 * reader + 4 * reader + 8 * reader,  # fp32 weights, gradients, AdamW's two moments
        4 * reader + 4 * reader + 8 * reader / 8,  # ZeRO-1: the moments partitioned
        4 * reader + 4 * reader / 8 + 8 * reader / 8,  # ZeRO-2: and the gradients
        16 * reader / 8,  # ZeRO-3: and the weights
    ]
    expected = {f"zero{stage}": round((b + retriever + activations) / GIB, 2) for stage, b in enumerate(by_stage)}
    assert projection == expected
    assert bench.project_gpu_gib(reader, trained, frozen, activations, gpus=1)["zero3"] == expected["zero0"]


def test_the_paper_recipes_are_every_recipe_of_configs_that_names_a_hub_reader(bench):
    from atlas.config import load_config

    hub = [
        p.name
        for p in (REPO / "configs").glob("*.yaml")
        if load_config(p, check_data=False).reader.model[:7] == "google/"
    ]
    assert sorted(bench.PAPER_RECIPES) == sorted(hub) and len(hub) == 16


@pytest.mark.slow
def test_the_bench_at_reduced_size_measures_and_projects(bench, shared_data, tmp_path):
    out = tmp_path / "real-size.json"
    args = ["--recipes", "nq-64shot.yaml", "--head-dim", "2", "--layers", "1", "--pieces", "500", "--length", "48"]
    assert bench.main([*args, "--memory-gib", "1.0", "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"command", "date", "machine", "wall_s", "settings", "recipes"} <= set(report)
    record = report["recipes"]["nq-64shot.yaml"]
    assert record["parameters"]["reader"] > 32128 * 24 * 2  # the untied 32,128-row vocabulary at d_model 24
    assert record["retriever_length"] == 200 and record["reader_length"] == 48 and record["precision"] == "bf16"
    assert (record["recipe_batch_size"], record["recipe_passages"]) == (8, 40)
    assert len(record["fit"]["probes"]) == 2 and 1 <= record["passages"] <= 40
    assert record["peak_rss_gib"] <= 1.2 or record["passages"] == 1  # what it chose fits the budget (with slack)
    assert set(record["gpu_gib_8_ranks"]) == {"zero0", "zero1", "zero2", "zero3"}
    assert len(record["seconds_per_step"]) == 2
