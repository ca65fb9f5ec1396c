"""How far the query encoder should move: recall along the line from frozen to trained (issue 13).

A 64-shot retriever loss lifts recall on its own 64 questions (90.6 → 95–97 answer recall@5 on
nq824) while recall on unseen questions falls. This asks whether the direction of the update is
wrong or only its size: the query encoder's weights are set to θ₀ + α·(θ − θ₀), frozen θ₀ and
trained θ, for several α (α = 0: the frozen retriever, the baseline of the same run; α = 1: the
trained one; weight-space interpolation as in WiSE-FT, Wortsman et al. 2022), and answer recall
on the training and dev questions is measured at each. If recall on dev peaks at a small α, the
loss points the right way and the step is too long (a smaller retriever learning rate or fewer
steps); if it falls from α = 0, the direction itself does not generalise.

    .venv/bin/python bench/retriever_interpolation.py runs/bench-nq824/pdist runs/bench-nq824/adist \\
        --frozen runs/bench-nq824/frozen
Runs are bench/nq824.py variant folders (or checkpoints); their index is used as recorded.
Retrieval only (no reader pass): about a minute a run on 2 cores. Prints JSON, then a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from atlas.demo.quickstart import format_table

KS = (1, 5, 20)


def query_encoder_state(run: str) -> tuple[dict[str, torch.Tensor], object]:
    """The query encoder's weights of a run's checkpoint, and the built model."""
    from atlas.loading import load_model, model_spec

    model = load_model(model_spec(run))
    return {k: v.detach().clone() for k, v in model.retriever.query_encoder.state_dict().items()}, model


def interpolate(base: dict[str, torch.Tensor], trained: dict[str, torch.Tensor], alpha: float) -> dict:
    """θ₀ + α·(θ − θ₀) for floating-point tensors (computed in float32); others as trained."""
    if base.keys() != trained.keys():
        raise ValueError("the frozen and trained query encoders have different parameters")
    return {
        k: (base[k].float() + alpha * (v.float() - base[k].float())).to(v.dtype) if v.is_floating_point() else v
        for k, v in trained.items()
    }


def recall(model, examples) -> dict[str, float]:
    """Answer recall@k (percent) and MRR of the model's retriever over `examples`."""
    from atlas.evaluate import retrieval_metrics

    passages = [p for s in range(0, len(examples), 64) for p in model.retrieve(examples[s : s + 64], max(KS))]
    return retrieval_metrics(examples, passages, list(KS))  # percent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="trained runs or checkpoints (bench/nq824.py variant folders)")
    parser.add_argument("--frozen", required=True, help="a run whose retriever was not trained (the baseline)")
    parser.add_argument(
        "--alphas", default="0,0.1,0.25,0.5,1", help="comma-separated α, fraction of the update (0 is always measured)"
    )
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    args = parser.parse_args(argv)
    from tasks.base import get_task

    if not (args.data / "nq824").is_dir():
        raise FileNotFoundError(f"{args.data / 'nq824'}: the shared nq824 data is not there")
    alphas = sorted({0.0, *(float(a) for a in args.alphas.split(","))})  # α = 0: the frozen baseline, always
    task = get_task("qa")
    questions = {
        "train": task.load(args.data / "nq824" / "train-64.jsonl"),
        "dev": task.load(args.data / "nq824" / "dev.jsonl"),
    }
    base, _ = query_encoder_state(args.frozen)
    results, rows = {}, []
    for run in args.runs:
        started = time.perf_counter()
        trained, model = query_encoder_state(run)
        points = []
        for alpha in alphas:
            model.retriever.query_encoder.load_state_dict(interpolate(base, trained, alpha))
            point = {"alpha": alpha, **{split: recall(model, ex) for split, ex in questions.items()}}
            points.append(point)
            print(json.dumps({"run": run, **point}), flush=True)
        results[run] = {"points": points, "wall_s": round(time.perf_counter() - started, 1)}
        frozen_dev = points[0]["dev"]
        for p in points:
            rows.append(
                {
                    "run": Path(run).name,
                    "α": f"{p['alpha']:g}",
                    "train R@5": p["train"]["answer_recall@5"],
                    "dev R@1": p["dev"]["answer_recall@1"],
                    "dev R@5": p["dev"]["answer_recall@5"],
                    "dev R@20": p["dev"]["answer_recall@20"],
                    "dev MRR": p["dev"]["answer_mrr"],
                    "dev R@5 − frozen": p["dev"]["answer_recall@5"] - frozen_dev["answer_recall@5"],
                }
            )
    print(json.dumps(results))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
