"""What each retriever loss would teach: the reader's gold scores over retrieved passages (issue 13).

A retriever loss moves p_retr(d | q) toward the distribution the reader's gold scores define. Before
spending training runs on a loss, this measures, on real questions and a real index, whether that
target is worth learning:

    recall@5 by gold     answer recall@5 after re-ranking the top-N retrieved passages by the gold score
                         (the loss's ceiling within those N) vs the retriever's own recall@5
    answer mass          Σ_k p(d_k) · has_answer(d_k), mean over questions, for p_gold = softmax(gold / τ)
                         at several τ and for p_retr = softmax(s / sqrt(d) / τ_score): a loss helps when
                         its target puts more mass on answer passages than the retriever already does
    length ρ             Spearman correlation of the gold score with the passage's token count (a gold
                         score that follows length teaches the retriever length, not relevance)
    top-1 = full, KL     with `--gold-precision fp32,bf16`: how the gold scores from a bfloat16 encoder pass
                         (`retriever.gold_precision`) agree with full precision: same top passage (%),
                         mean KL(p_full ‖ p_bf16) at τ = 0.1

Gold scores come from `RetrieverLoss.gold_scores` itself (eval mode, no grad), so this measures the
code that trains. Questions: nq824's 64 training shots (what the 64-shot recipe's loss sees) and
the first dev questions.

    .venv/bin/python bench/gold_signal.py                                   # shipped reader
    .venv/bin/python bench/gold_signal.py --checkpoint runs/bench-nq824/frozen/checkpoints/step-000100
    .venv/bin/python bench/gold_signal.py --gold-precision fp32,bf16   # + the bf16 gold pass's agreement
Needs the corpus and index of bench/nq824.py (runs/bench-nq824). Prints JSON, then a table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from atlas.demo.quickstart import SHIPPED_READER, format_table

# name → the registered loss and its settings (every gold is "higher = the passage is worth more")
GOLDS = {
    "adist": ("adist", {"attention": "cross"}),
    "adist/token": ("adist", {"attention": "cross"}),  # cross-attention mass per passage token
    "adist/copy": ("adist", {"attention": "copy"}),  # the copy head's pointer mass (copy readers)
    "pdist": ("pdist", {}),  # mean token log-likelihood; emdr's sequence log-likelihood ranks the same
    "loop": ("loop", {}),
}
TAUS = (0.01, 0.1, 1.0)
AGREEMENT_TAU = 0.1  # the nq824 recipe's τ_gold


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ of two 1-d arrays (ties by average rank); nan when either is constant."""

    def ranks(v):
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # average the ranks of ties
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


def build_model(args):
    """The Atlas model of bench/nq824.py's recipe over its index (reader: shipped or a checkpoint)."""
    from atlas.config import load_config
    from atlas.loading import checkpoint_config, load_model, recipe_spec

    overrides = [
        f"index.path={args.index}",
        f"retriever.n_context={args.passages}",
        "reader.dropout=0.0",
        f"reader.text_maxlength={args.length}",
        "reader.answer_maxlength=16",
    ]
    if args.checkpoint:
        config = checkpoint_config(args.checkpoint, overrides)
        return load_model(recipe_spec(config, checkpoint=args.checkpoint))
    config = load_config(None, ["retriever.model=minilm", f"reader.model={args.reader}", *overrides])
    return load_model(recipe_spec(config))


def gold_scores(model, examples, args) -> list[dict]:
    """Per question: `has` (1 where a top-N passage holds an answer), `retr` (retriever scores), `tokens`
    (reader tokens per passage) and one array of N gold scores per loss (and per `--gold-precision`)."""
    from retriever.losses import build_retriever_loss
    from tasks.metrics import has_answer

    losses = {
        name: build_retriever_loss(loss, **settings)
        for name, (loss, settings) in GOLDS.items()
        if name != "adist/copy" or model.reader.copies_from_source
    }
    per_question: list[dict] = []
    model.eval()
    for start in range(0, len(examples), args.batch):
        batch = examples[start : start + args.batch]
        passages = model.retrieve(batch, args.passages)
        input_ids, mask = model.reader_inputs([e.query for e in batch], passages)
        labels = model.target_labels([e.answers[0] for e in batch])
        golds = {}
        with torch.no_grad():
            for precision in args.gold_precision:
                states = model.reader.encode(input_ids, mask, precision=precision)
                for name, loss in losses.items():
                    gold = loss.gold_scores(model.reader, input_ids, mask, labels, encoder_states=states)
                    if name == "adist/token":
                        gold = gold / mask.sum(-1).clamp(min=1)
                    golds[name if precision == "fp32" else f"{name} {precision}"] = gold.float().numpy()
        n_tokens = mask.sum(-1).numpy()
        for b, (example, ps) in enumerate(zip(batch, passages)):
            has = np.array([has_answer(example.answers, p.title + " " + p.text) for p in ps], float)
            per_question.append(
                {
                    "has": has,
                    "retr": np.array([p.score for p in ps]),
                    "tokens": n_tokens[b],
                    **{name: g[b] for name, g in golds.items()},
                }
            )
    return per_question


def score_row(per_question: list[dict], key: str, scale: float = 1.0) -> dict:
    """What ranking the passages by q[key] gives: answer recall@5, the answer mass of softmax(q[key] / scale / τ) at
    each of TAUS, and the Spearman ρ of q[key] with the passages' token counts."""
    recall5 = np.mean([q["has"][np.argsort(-q[key], kind="stable")[:5]].max() for q in per_question])
    return {
        "recall@5": 100 * float(recall5),
        **{
            f"mass τ={t}": 100 * float(np.mean([(softmax(q[key] / scale / t) * q["has"]).sum() for q in per_question]))
            for t in TAUS
        },
        "length ρ": float(np.nanmean([spearman(q[key], q["tokens"]) for q in per_question])),
    }


def agreement(per_question: list[dict], name: str) -> dict:
    """How a lower-precision gold agrees with the full one (its row's name without the suffix): share of questions
    with the same top passage, and mean KL(p_full ‖ p) at τ = AGREEMENT_TAU."""
    full = name.split(" ")[0]
    same_top = np.mean([np.argmax(q[name]) == np.argmax(q[full]) for q in per_question])
    kl = []
    for q in per_question:
        p_full = softmax(q[full] / AGREEMENT_TAU)
        kl.append(float((p_full * (np.log(p_full + 1e-30) - np.log(softmax(q[name] / AGREEMENT_TAU) + 1e-30))).sum()))
    return {"top-1 = full": 100 * float(same_top), f"KL to full τ={AGREEMENT_TAU}": float(np.mean(kl))}


def measure(model, examples, args) -> dict:
    """Gold scores of every loss for each example's top-N passages → the summary figures: per loss (and the
    retriever's own scores) recall@5, answer mass, length ρ and agreement with the fp32 gold."""
    per_question = gold_scores(model, examples, args)
    rows = {"retriever": score_row(per_question, "retr", scale=math.sqrt(model.retriever.dim))}
    rows["retriever"] |= {"top-1 = full": "-", f"KL to full τ={AGREEMENT_TAU}": "-"}
    names = [n for n in GOLDS if n in per_question[0]]
    # loop's gold is an NLL (higher = the passage matters more): already "higher is better"
    for name in names + [n for n in per_question[0] if n.split(" ")[0] in names and " " in n]:
        rows[name] = score_row(per_question, name) | agreement(per_question, name)
    oracle = 100 * float(np.mean([q["has"].max() for q in per_question]))
    return {"questions": len(per_question), f"answer_recall@{args.passages}": oracle, "losses": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--index", type=Path, default=REPO_ROOT / "runs" / "bench-nq824" / "index")
    parser.add_argument("--reader", default=str(SHIPPED_READER))
    parser.add_argument("--checkpoint", help="a trained run's checkpoint (its reader and retriever)")
    parser.add_argument("--passages", type=int, default=20, help="N: passages the loss covers")
    parser.add_argument("--length", type=int, default=192, help="reader tokens per passage")
    parser.add_argument("--max-dev", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument(
        "--gold-precision",
        default="fp32",
        help="encoder precisions of the gold pass, comma-separated (fp32, bf16; 'full' = fp32): "
        "each other than fp32 adds rows '<loss> <precision>' with their agreement with fp32",
    )
    args = parser.parse_args(argv)
    args.gold_precision = ["fp32"] + [p for p in args.gold_precision.split(",") if p not in ("fp32", "full")]
    if not (args.data / "nq824").is_dir() or not args.index.is_dir():
        print(f"skipped: needs {args.data / 'nq824'} and the index of bench/nq824.py ({args.index})")
        return 0
    from tasks.base import get_task

    started = time.perf_counter()
    torch.manual_seed(0)
    model = build_model(args)
    task = get_task("qa")
    sets = {
        "train-64": task.load(args.data / "nq824" / "train-64.jsonl"),
        "dev": task.load(args.data / "nq824" / "dev.jsonl")[: args.max_dev],
    }
    results = {
        "reader": args.checkpoint or args.reader,
        "passages": args.passages,
        "sets": {name: measure(model, examples, args) for name, examples in sets.items()},
    }
    results["wall_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps(results))
    for name, result in results["sets"].items():
        print(
            f"\n{name}: {result['questions']} questions, answer in top {args.passages}: "
            f"{result[f'answer_recall@{args.passages}']:.1f}%"
        )
        print(format_table([{"scores": k, **v} for k, v in result["losses"].items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
