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


def measured(batch: int, passages: int, peak: float, **more) -> dict:
    return {"batch_size": batch, "passages": passages, "peak_rss_gib": peak, **more}


def test_memory_per_passage_is_the_peaks_slope_from_the_narrowest_to_the_widest_run(bench):
    record = measured(8, 13, 17.5, fit={"probes": [measured(8, 1, 7.5), measured(8, 2, 8.5)]})
    assert bench.memory_per_passage_gib(record) == pytest.approx((17.5 - 7.5) / (8 * 13 - 8))
    forced = measured(2, 3, 4.0, step_memory_per_passage_mib=512.0)  # no probes: the step's own share
    assert bench.memory_per_passage_gib(forced) == 0.5


def test_the_gpu_plan_takes_the_first_way_that_fits_each_size(bench):
    counts = {"reader": 250_000_000, "retriever_trained": 110_000_000, "retriever_frozen": 110_000_000}
    record = measured(8, 13, 17.5, run="training step", parameters=counts, recipe_batch_size=8, recipe_passages=40)
    record["fit"] = {"probes": [measured(8, 1, 7.5), measured(8, 2, 8.5)]}
    per_passage = (17.5 - 7.5) / (8 * 13 - 8)
    states = (16 * 250e6 + 16 * 110e6 + 4 * 110e6) / GIB
    plan = bench.gpu_plan(record, gpus=8)
    assert plan["one_gpu_gib"] == pytest.approx(states + 8 * 40 * per_passage, abs=0.01)
    room = {size: size * 1e9 / GIB * 0.9 for size in (24, 40, 80)}
    assert 8 * 40 * per_passage + states > room[24]  # the 24 GB GPU needs smaller steps
    fitting_b = next(b for b in (4, 2, 1) if states + b * 40 * per_passage <= room[24])
    assert plan["24GB"] == f"training.batch_size={fitting_b} training.accumulation_steps={8 // fitting_b}"
    assert plan["80GB"] == "as written"


def test_the_paper_recipes_are_every_recipe_of_configs_that_names_a_hub_reader(bench):
    from atlas.config import load_config

    hub = [
        p.name
        for p in (REPO / "configs").glob("*.yaml")
        if load_config(p, check_data=False).reader.model[:7] == "google/"
    ]
    assert sorted(bench.PAPER_RECIPES) == sorted(hub) and len(hub) == 16


def test_recipes_that_differ_only_in_their_data_share_one_measurement(bench):
    from atlas.config import load_config

    groups: dict[str, list[str]] = {}
    for name in bench.PAPER_RECIPES:
        shape = bench.shape_of(load_config(REPO / "configs" / name, check_data=False))
        groups.setdefault(json.dumps(shape, sort_keys=True), []).append(name)
    named = sorted(sorted(group) for group in groups.values())
    short_answers = ["fever-64shot.yaml", "nq-64shot.yaml", "triviaqa-64shot.yaml"]
    short_answers += [f"kilt-{t}.yaml" for t in ("aida", "fever", "hotpotqa", "nq", "trex", "triviaqa", "zsre")]
    assert named == sorted(
        [
            sorted(short_answers),
            ["kilt-eli5.yaml"],  # 256-token answers
            ["kilt-wow.yaml"],  # 64
            ["mmlu-5shot-multitask.yaml", "mmlu-5shot.yaml"],  # K = 30, 8-token answers
            ["mmlu-zeroshot.yaml"],  # no training: an evaluation batch
            ["pretrain-mlm.yaml"],  # tied retriever, K = 20, 384 tokens, the passage encoder trained
        ]
    )


def test_a_steps_target_fills_the_recipes_answer_length(bench):
    paragraphs = ["one two three four five six seven eight nine ten"] * 3
    examples, targets = bench.synthetic_examples(paragraphs, batch=2, passages=3, words=7, answer_words=20)
    assert len(examples) == 2 and all(len(e.passages) == 3 for e in examples)
    assert all(len(p.text.split()) >= 7 for e in examples for p in e.passages)
    assert [len(t.split()) for t in targets] == [21, 21]  # the sentinel and 20 words
    assert targets[0] == "<extra_id_0> " + examples[0].answers[0]


@pytest.mark.slow
def test_the_bench_at_reduced_size_measures_and_projects(bench, shared_data, tmp_path):
    out = tmp_path / "real-size.json"
    args = ["--recipes", "nq-64shot.yaml", "kilt-nq.yaml", "--head-dim", "2", "--layers", "1", "--pieces", "500"]
    page = tmp_path / "page.md"
    page.write_text(f"# Results\n\n{bench.PAGE_START}\nold table\n{bench.PAGE_END}\n\nWhat it shows.\n")
    args += ["--length", "48", "--memory-gib", "1.0", "--work", str(tmp_path / "work"), "--out", str(out)]
    assert bench.main([*args, "--page", str(page)]) == 0
    report = json.loads(out.read_text())
    table = page.read_text().split(bench.PAGE_START)[1].split(bench.PAGE_END)[0]
    assert "old table" not in table and "| `nq-64shot.yaml`, `kilt-nq.yaml` |" in table
    assert page.read_text().endswith("What it shows.\n")  # the prose around the table is kept
    assert {"command", "date", "machine", "wall_s", "settings", "recipes"} <= set(report)
    record = report["recipes"]["nq-64shot.yaml"]
    assert record["parameters"]["reader"] > 32128 * 24 * 2  # the untied 32,128-row vocabulary at d_model 24
    assert record["retriever_length"] == 200 and record["reader_length"] == 48 and record["precision"] == "bf16"
    assert (record["recipe_batch_size"], record["recipe_passages"]) == (8, 40)
    assert len(record["fit"]["probes"]) == 2 and 1 <= record["passages"] <= 40
    assert record["peak_rss_gib"] <= 1.2 or record["passages"] == 1  # what it chose fits the budget (with slack)
    assert {"per_passage_gib", "one_gpu_gib", "zero2_8_gpus_gib", "24GB", "40GB", "80GB"} <= set(record["gpu_plan"])
    assert len(record["seconds_per_step"]) == 2
    assert report["recipes"]["kilt-nq.yaml"]["same_shape_as"] == "nq-64shot.yaml"  # measured once
    assert bench.main(args) == 0  # again: the measured recipes are kept, not run again
    assert json.loads(out.read_text())["recipes"] == report["recipes"]


def test_the_checkpoint_bench_resumes_a_recipe_bit_identically_at_reduced_width(shared_data, tmp_path):
    spec = importlib.util.spec_from_file_location("checkpoint_bench", REPO / "bench" / "real_size_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "checkpoint.json"
    narrow = ["--head-dim", "4", "--layers", "1", "--pieces", "1000"]
    assert module.main(["--work", str(tmp_path / "work"), *narrow, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["resumed_equals_straight"] is True
    assert set(report["checkpoint_gib"]) == {"config.yaml", "reader", "retriever", "training_state.pt"}
    assert report["parameters_saved"] > 32128 * 48  # the reader's untied 32,128-row head at d_model 48, and more
    assert set(report["run_seconds"]) == {"straight", "halted", "resumed"}
