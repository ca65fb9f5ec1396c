"""Every small-model recipe runs: one training step and a short evaluation on its real data,
with the reader and retriever swapped for tiny ones (the recipe's task, data, loss and
schedule are what is exercised)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from atlas.config import load_config
from atlas.training.loop import train

SMALL = sorted((Path(__file__).resolve().parents[1] / "configs" / "small").glob("*.yaml"))


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_small_recipe_runs_a_step(path, tiny_world, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # recipes name ../shared/data relative to the repo
    config = load_config(path)
    overrides = [
        f"retriever.model={tiny_world['encoder']}", f"index.path={tiny_world['index']}", "index.corpus=null",
        "index.refresh=never", "reader.model=t5-tiny", "reader.trainable_encoder_layers=null", "reader.text_maxlength=64",
        "retriever.n_context=2", "reader.n_context=2", f"training.output_dir={tmp_path / 'run'}",
        f"training.steps={min(config.training.steps, 1)}", "training.batch_size=1", "training.save_every=0",
        "evaluation.max_examples=2", "evaluation.batch_size=2", "reader.generation_max_length=4",
        "retriever.tied=false", "retriever.train_passage_encoder=false", "retriever.passage_maxlength=256",
    ]
    if config.reader.retrieval_prior:  # the prior weighs a copy head's pointer: a tiny reader that has one
        overrides += ["reader.model=minilm-fid-tiny", f"reader.encoder={tiny_world['encoder']}"]
    if config.task.shots:
        overrides.append("task.shots=2")
    if config.task.name in ("mlm", "lm", "section"):
        overrides.append(f"task.train_data=[{tiny_world['corpus']}]")
    if config.task.name == "fever":  # no FEVER data ships here: four hand-written claims
        claims = tmp_path / "claims.jsonl"
        claims.write_text('{"claim": "Quimper is the capital of Zorbland.", "label": "SUPPORTS"}\n'
                          '{"claim": "Belmont is in Zorbland.", "label": "REFUTES"}\n'
                          '{"claim": "Olo is a mountain.", "label": "SUPPORTS"}\n'
                          '{"claim": "Fenwick is a city.", "label": "NOT ENOUGH INFO"}\n')
        overrides += [f"task.train_data=[{claims}]", f"task.eval_data=[{claims}]"]
    resolved = load_config(path, overrides)
    missing = [p for p in resolved.task.train_data + resolved.task.eval_data if not Path(p).exists()]
    if missing:
        pytest.skip(f"{path.name}: data {missing} is not on this machine")
    summary = train(resolved, progress=False)
    assert summary["step"] == min(config.training.steps, 1)
    assert all(math.isfinite(loss) and loss > 0 for loss in summary["losses"])
    if resolved.task.eval_data:
        assert summary["eval"], "an evaluation ran and produced metrics"
