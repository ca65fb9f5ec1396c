"""Few-shot effectiveness on real Wikipedia questions (nq824) and the corpus-swap test (issue 6).

Corpus: ../shared/data/nq824/documents.jsonl + ../shared/data/wikitext2-articles.jsonl, chunked to
100 words, MiniLM Flat index. Reader: the shipped atlas-reader, fine-tuned on nq824/train-64.jsonl
(64-shot) and evaluated on nq824/dev.jsonl, in these variants (each a fresh fine-tune):

    closed_book   same reader, no passages (the baseline the ratios are taken against)
    frozen        retrieval-augmented, retriever frozen (loss none)
    pdist adist emdr loop   retrieval-augmented, query encoder trained by that retriever loss

plus answer recall@5/@20 of the retriever before training (frozen MiniLM) and after each variant.
Corpus swap: for dev questions the `frozen` model answers right with the gold passage among those
it reads, the answer in that passage is replaced by another dev answer of the same kind (number or
text), the index is updated (remove + add, no retraining), and the share of answers that follow
the edited corpus is reported.

    .venv/bin/python bench/nq824.py --out runs/bench-nq824                     # full (an hour on 2 cores)
    .venv/bin/python bench/nq824.py --variants closed_book,frozen,pdist --steps 60 --max-dev 100
Prints a JSON object, then a table. Never runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from atlas.quickstart import SHIPPED_READER, format_table, replace_fact

VARIANTS = ("closed_book", "frozen", "pdist", "adist", "emdr", "loop")
GOALS = {"em_retrieval_augmented": 35.0, "em_ratio_to_closed_book": 3.0, "recall@5_lift": 3.0, "swap_follow": 80.0}


def base_overrides(args, out: Path, variant: str) -> list[str]:
    """The recipe of one variant, as dotted overrides of the defaults."""
    loss = "none" if variant in ("closed_book", "frozen") else variant
    # a trained retriever's loss covers more candidates than the reader reads, so that it can
    # lift a passage from below the reader's cut into it (Atlas: retriever_n_context)
    scored = args.passages if loss == "none" else args.retrieve
    return [
        "retriever.model=minilm", f"retriever.loss={loss}", f"retriever.n_context={scored}",
        "retriever.temperature_gold=0.1", "retriever.temperature_score=0.1",
        f"index.path={out / 'index'}", f"reader.model={args.reader}", f"reader.n_context={args.passages}",
        "reader.text_maxlength=192", "reader.answer_maxlength=16", "reader.generation_max_length=16",
        "reader.dropout=0.0", "task.name=qa", f"task.train_data=[{args.data / 'nq824' / 'train-64.jsonl'}]",
        f"task.eval_data=[{args.data / 'nq824' / 'dev.jsonl'}]", f"task.closed_book={variant == 'closed_book'}",
        f"training.output_dir={out / variant}", f"training.steps={args.steps}", "training.batch_size=4",
        f"training.lr={args.lr}", f"training.lr_retriever={args.lr_retriever}", "training.warmup_steps=5", "training.log_every=5",
        "training.keep_last=1", "evaluation.batch_size=16", "evaluation.retrieval_k=[5,20]",
        f"evaluation.max_examples={args.max_dev}", *args.set,
    ]


def prepare(args, out: Path) -> None:
    """The chunked corpus and its MiniLM index (kept across runs of the bench in `out`)."""
    from atlas.config import RetrieverConfig
    from retriever.corpus import prepare_corpus
    from retriever.encoder import build_retriever
    from retriever.index_build import build_index

    # the order of configs/pretrain-mini.yaml's corpus, so its prepared corpus and index can be reused
    documents = [args.data / "wikitext2-articles.jsonl", args.data / "nq824" / "documents.jsonl"]
    if not (out / "corpus").exists():
        prepare_corpus(documents, out / "corpus", chunk_words=100, progress=False)
    if not (out / "index").exists():
        retriever = build_retriever(RetrieverConfig(model="minilm"))
        build_index(out / "corpus", retriever, out / "index", progress=True, encoder_source="minilm")


def frozen_recall(args, out: Path) -> dict:
    """Answer recall@5/@20 of the untrained MiniLM retriever on the dev questions used."""
    from atlas.build import build_atlas
    from atlas.config import load_config
    from atlas.evaluate import retrieval_metrics
    from tasks.base import get_task

    config = load_config(None, base_overrides(args, out, "frozen"))
    model = build_atlas(config)
    examples = get_task("qa").load(args.data / "nq824" / "dev.jsonl")[: args.max_dev]
    passages = [ps for start in range(0, len(examples), 64) for ps in model.retrieve(examples[start:start + 64], 20)]
    return {k: 100 * v for k, v in retrieval_metrics(examples, passages, [5, 20]).items()}  # percent


def run_variant(args, out: Path, variant: str) -> dict:
    """Fine-tune and evaluate one variant; → its metrics, steps and wall time."""
    from atlas.config import load_config
    from atlas.train import train

    started = time.perf_counter()
    summary = train(load_config(None, base_overrides(args, out, variant)), progress=False)
    return {**summary["eval"], "final_train_loss": summary["losses"][-1], "checkpoint": summary["checkpoint"],
            "wall_s": round(time.perf_counter() - started, 1)}


def _kind(answer: str) -> str:
    return "number" if re.search(r"\d", answer) else "text"


def _question_word(question: str) -> str:
    """'who', 'when', 'how many', …: the kind of thing asked for (so a replacement fits the sentence)."""
    words = question.lower().split()[:2]
    return " ".join(words) if words and words[0] == "how" else (words[0] if words else "")


def corpus_swap(args, out: Path, checkpoint: str) -> dict:
    """Edit the gold passages of rightly answered dev questions and measure who follows the edit."""
    from atlas.build import build_atlas
    from atlas.checkpoint import checkpoint_config
    from retriever.index import PassageIndex
    from retriever.index_update import add_passages, remove_passages
    from tasks.base import get_task
    from tasks.io import read_jsonl, write_jsonl
    from tasks.metrics import normalize_answer

    started = time.perf_counter()
    swapped = out / "index-swapped"
    shutil.rmtree(swapped, ignore_errors=True)
    shutil.copytree(out / "index", swapped)
    config = checkpoint_config(checkpoint, [f"index.path={swapped}"])
    model = build_atlas(config, checkpoint=checkpoint)
    model.eval()
    records = [r for _, r in read_jsonl(args.data / "nq824" / "dev.jsonl")][: args.max_dev]
    examples = get_task("qa").load(args.data / "nq824" / "dev.jsonl")[: args.max_dev]
    answers, passages = [], []
    for start in range(0, len(examples), 16):
        batch_answers, batch_passages = model.predict(examples[start:start + 16])
        answers += batch_answers
        passages += batch_passages
    # replacements: other dev answers to the same kind of question (who → a person, when → a date),
    # short like a real answer; each edit draws its own, so no single odd string stands for all
    pool = [(_question_word(e.metadata["question"]), e.answers[0]) for e in examples]
    edits, used_passages = [], set()
    for example, record, answer, read in zip(examples, records, answers, passages):
        if normalize_answer(answer) not in {normalize_answer(a) for a in example.answers}:
            continue
        gold = next((p for p in read if p.get("doc_id") == record["gold_doc"] and p["id"] not in used_passages
                     and answer.lower() in p["text"].lower()), None)
        if gold is None:
            continue
        asked = _question_word(example.metadata["question"])
        candidates = sorted({a for word, a in pool if word == asked and _kind(a) == _kind(answer)
                             and len(a.split()) <= max(3, len(answer.split()) + 1)
                             and normalize_answer(a) != normalize_answer(answer) and a.lower() not in gold["text"].lower()})
        if not candidates:
            continue
        replacement = random.Random(f"swap-{example.id}").choice(candidates)
        try:
            text = replace_fact(gold["text"], answer, replacement)
        except ValueError:  # the answer is in the passage only inside a longer word
            continue
        used_passages.add(gold["id"])
        edits.append({"example": example, "passage": {"id": gold["id"], "title": gold.get("title", ""), "text": text},
                      "old": answer, "new": replacement})
    if not edits:
        return {"edited": 0, "follow_share": None, "wall_s": round(time.perf_counter() - started, 1)}
    write_jsonl(out / "swap-edits.jsonl", [e["passage"] for e in edits])
    remove_passages(swapped, [e["passage"]["id"] for e in edits])
    add_passages(swapped, [out / "swap-edits.jsonl"], model.retriever, chunk_words=0, progress=False)
    model.index = PassageIndex.load(swapped, retriever=model.retriever)
    new_answers = []
    for start in range(0, len(edits), 16):
        new_answers += model.predict([e["example"] for e in edits[start:start + 16]])[0]
    follows = [normalize_answer(a) == normalize_answer(e["new"]) for a, e in zip(new_answers, edits)]
    stays = [normalize_answer(a) == normalize_answer(e["old"]) for a, e in zip(new_answers, edits)]
    return {"edited": len(edits), "follow_share": 100.0 * sum(follows) / len(edits),
            "old_answer_share": 100.0 * sum(stays) / len(edits),
            "samples": [{"question": e["example"].metadata["question"], "old": e["old"], "new": e["new"], "answer": a}
                        for e, a in list(zip(edits, new_answers))[:5]],
            "wall_s": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the variants, the recall baseline and the corpus swap; print JSON and a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "bench-nq824")
    parser.add_argument("--reader", default=str(SHIPPED_READER))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--passages", type=int, default=5, help="passages the reader reads")
    parser.add_argument("--retrieve", type=int, default=20, help="passages a retriever loss covers")
    parser.add_argument("--lr-retriever", type=float, default=4e-5)
    parser.add_argument("--max-dev", type=int, default=578)
    parser.add_argument("--no-swap", action="store_true")
    parser.add_argument("--swap-only", metavar="CHECKPOINT",
                        help="only the corpus swap, with this trained checkpoint (e.g. OUT/frozen/checkpoints/step-000200)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted config override for every variant (repeatable), e.g. "
                             "reader.trainable_encoder_layers=3")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; valid: {list(VARIANTS)}")
    if not (args.data / "nq824").is_dir():
        raise FileNotFoundError(f"{args.data / 'nq824'}: the shared nq824 data is not there")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    prepare(args, args.out)
    if args.swap_only:
        swap = corpus_swap(args, args.out, args.swap_only)
        (args.out / "swap.json").write_text(json.dumps(swap, indent=2, default=str) + "\n")
        print(json.dumps(swap, default=str))
        print(f"corpus swap: {swap['edited']} edited passages, {swap['follow_share']}% of answers follow the edit "
              f"(goal ≥ {GOALS['swap_follow']:.0f}%)")
        return 0
    results = {"settings": {k: str(v) for k, v in vars(args).items()}, "recall_before": frozen_recall(args, args.out),
               "variants": {}}
    for variant in variants:
        results["variants"][variant] = run_variant(args, args.out, variant)
        print(json.dumps({variant: results["variants"][variant]}), flush=True)
    closed = results["variants"].get("closed_book", {}).get("exact_match")
    if "frozen" in results["variants"] and not args.no_swap:
        results["corpus_swap"] = corpus_swap(args, args.out, results["variants"]["frozen"]["checkpoint"])
    results["wall_s"] = round(time.perf_counter() - started, 1)
    rows = [{"variant": "retriever before training", "EM": float("nan"), "F1": float("nan"),
             "EM / closed-book": float("nan"), "recall@5": results["recall_before"]["answer_recall@5"],
             "recall@20": results["recall_before"]["answer_recall@20"], "wall_s": float("nan")}]
    for name, m in results["variants"].items():
        rows.append({"variant": name, "EM": 100 * m["exact_match"], "F1": 100 * m["f1"],
                     "EM / closed-book": m["exact_match"] / closed if closed else float("nan"),
                     "recall@5": 100 * m.get("answer_recall@5", float("nan")),
                     "recall@20": 100 * m.get("answer_recall@20", float("nan")), "wall_s": m["wall_s"]})
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, default=str))
    print(format_table(rows))
    swap = results.get("corpus_swap")
    if swap:
        print(f"corpus swap: {swap['edited']} edited passages, {swap['follow_share']}% of answers follow the edit "
              f"(goal ≥ {GOALS['swap_follow']:.0f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
