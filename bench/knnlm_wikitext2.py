"""kNN-LM on WikiText-2: train a small GPT-2-style word-level LM, build datastores, compare keys.

Stages (each reuses what the previous ones saved under --run-dir, so a rerun is cheap):
  train   word-level vocabulary + GPT-2-style LM trained on the first 90% of valid.txt
  build   datastores over the training text (all key types in one pass) and query stores over
          the held-out 10% (tuning) and test.txt (evaluation), with per-token LM log-probs
  eval    dispersion per key, λ/τ grid search on the held-out part, test perplexity for
          every key (exact search) and for the paper's key with IVF-PQ search; τ = 1 vs tuned τ

The baseline is the LM alone on the same test tokens, measured in the same run; the result
is printed as a JSON object and a short table (ratios are kNN-LM / LM perplexity).

    .venv/bin/python bench/knnlm_wikitext2.py --stage all
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

DATA = REPO_ROOT.parent / "shared" / "data" / "wikitext-2"
HOLDOUT_FRACTION = 0.1


def read_words(path: Path) -> list[str]:
    """WikiText convention: every line (blank ones too) is its words followed by <eos>."""
    words: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            words.extend(line.split())
            words.append("<eos>")
    return words


def split_train_holdout(words: list[str]) -> tuple[list[str], list[str]]:
    """The last HOLDOUT_FRACTION of the training file is kept aside for tuning λ and τ."""
    cut = int(len(words) * (1 - HOLDOUT_FRACTION))
    return words[:cut], words[cut:]


def build_word_tokenizer(train_words: list[str], folder: Path):
    """A word-level fast tokenizer (whitespace split, <unk> for unseen words) saved in HF format."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    counts: dict[str, int] = {}
    for word in train_words:
        counts[word] = counts.get(word, 0) + 1
    # Frequency order (ties by word) keeps ids deterministic across runs.
    ordered = sorted(counts, key=lambda w: (-counts[w], w))
    specials = ["<unk>", "<eos>"]
    vocab = {w: i for i, w in enumerate(specials + [w for w in ordered if w not in specials])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    tokenizer.save_pretrained(folder)
    return tokenizer


def encode_words(tokenizer, words: list[str]) -> np.ndarray:
    """Word list → int64 ids (the vocabulary maps each word directly)."""
    vocab = tokenizer.get_vocab()
    unk = vocab["<unk>"]
    return np.asarray([vocab.get(w, unk) for w in words], dtype=np.int64)


def stage_train(args, run_dir: Path) -> dict:
    """Train the LM; saves model + tokenizer to run_dir/lm (safetensors)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    lm_dir = run_dir / "lm"
    if (lm_dir / "model.safetensors").exists():
        print(f"[train] reuse {lm_dir}", flush=True)
        return json.loads((run_dir / "train_log.json").read_text())
    train_words, _ = split_train_holdout(read_words(DATA / "valid.txt"))
    lm_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_word_tokenizer(train_words, lm_dir)
    ids = torch.from_numpy(encode_words(tokenizer, train_words))
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=args.context,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    n_seq = (len(ids) - 1) // args.context
    steps_per_epoch = n_seq // args.batch
    total_steps = steps_per_epoch * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    warmup = max(1, total_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps))),
    )
    generator = torch.Generator().manual_seed(0)
    start = time.time()
    step = 0
    losses = []
    model.train()
    for epoch in range(args.epochs):
        # A random offset per epoch so that sequence boundaries move between epochs.
        offset = int(torch.randint(0, args.context, (1,), generator=generator))
        usable = (len(ids) - 1 - offset) // args.context * args.context
        inputs = ids[offset : offset + usable].view(-1, args.context)
        order = torch.randperm(len(inputs), generator=generator)
        for first in range(0, len(order) - args.batch + 1, args.batch):
            batch = inputs[order[first : first + args.batch]]
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            losses.append(loss.item())
            if step % 50 == 0:
                print(
                    f"[train] epoch {epoch} step {step}/{total_steps} loss {np.mean(losses[-50:]):.3f} "
                    f"{time.time() - start:.0f}s",
                    flush=True,
                )
    model.save_pretrained(lm_dir)
    log = {
        "steps": step,
        "epochs": args.epochs,
        "train_tokens": len(ids),
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "final_train_loss": float(np.mean(losses[-50:])),
        "train_wall_s": time.time() - start,
    }
    (run_dir / "train_log.json").write_text(json.dumps(log, indent=1))
    print(f"[train] done {log}", flush=True)
    return log


PAPER_KEY = "ffn_input:-1"


def key_specs(n_layers: int) -> list[str]:
    """The paper's key, the "why" paper's two sublayer keys, and every block's output."""
    return [PAPER_KEY, "attn_output:-1", "ffn_output:-1"] + [f"layer_output:{i}" for i in range(n_layers)]


def load_trained(run_dir: Path):
    """The trained LM and its word tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from atlas.knnlm.lm import load_lm

    return load_lm(run_dir / "lm"), PreTrainedTokenizerFast.from_pretrained(run_dir / "lm")


def stage_build(args, run_dir: Path) -> dict:
    """Datastore over the training text; query stores over the held-out part and the test text."""
    from atlas.knnlm.lm import build_datastore

    model, tokenizer = load_trained(run_dir)
    train_words, holdout_words = split_train_holdout(read_words(DATA / "valid.txt"))
    test_ids = encode_words(tokenizer, read_words(DATA / "test.txt"))
    holdout_ids = encode_words(tokenizer, holdout_words)
    # Query stores cover only the tokens that will be scored (forward passes are the cost here).
    if args.test_tokens:
        test_ids = test_ids[: args.test_tokens + 1]
    if args.holdout_tokens:
        holdout_ids = holdout_ids[: args.holdout_tokens + 1]
    texts = {
        "train": encode_words(tokenizer, train_words),
        "holdout": holdout_ids,
        "test": test_ids,
    }
    walls = {}
    specs = key_specs(model.config.n_layer)
    for name, ids in texts.items():
        start = time.time()
        build_datastore(
            run_dir / f"store_{name}",
            model,
            ids,
            specs,
            context=args.context,
            stride=args.datastore_stride or args.context if name == "train" else args.stride,
            batch_size=16,
            progress=True,
            meta={"text": name},
            tokenizer=tokenizer,
        )
        walls[f"{name}_wall_s"] = round(time.time() - start, 1)
        walls[f"{name}_rows"] = int(len(ids) - 1)
        print(f"[build] {name}: {len(ids) - 1} rows in {walls[f'{name}_wall_s']} s", flush=True)
    return walls


LAMBDAS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
TEMPERATURES = [1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0]


def evaluate_key(
    train, holdout, test, key: str, k: int, limit: int | None, holdout_limit: int | None, **search
) -> dict:
    """Tune λ, τ on the held-out store; test perplexity with the tuned pair and with τ = 1.

    limit: score only the first `limit` test tokens; the row's LM baseline uses the same tokens.
    holdout_limit: tune on the first `holdout_limit` held-out tokens.
    """
    from atlas.knnlm.search import grid_search, knn_lm_logprobs, perplexity

    start = time.time()
    tuned = grid_search(
        holdout,
        train,
        key,
        k=k,
        lambdas=LAMBDAS,
        temperatures=TEMPERATURES,
        limit=holdout_limit,
        **search,
    )
    tau_one = min((row for row in tuned["grid"] if row[1] == 1.0), key=lambda row: row[2])
    tune_wall = time.time() - start
    start = time.time()
    settings = [(tuned["lambda"], tuned["temperature"]), (tau_one[0], 1.0)]
    logprobs = knn_lm_logprobs(test, train, key, k=k, settings=settings, limit=limit, **search)
    n = len(logprobs[settings[0]])
    row = {
        "key": key,
        "tokens": n,
        "lm_ppl": perplexity(test.lm_logprobs[:n]),
        "lambda": tuned["lambda"],
        "tau": tuned["temperature"],
        "holdout_ppl": tuned["perplexity"],
        "test_ppl": perplexity(logprobs[settings[0]]),
        "lambda_tau1": tau_one[0],
        "test_ppl_tau1": perplexity(logprobs[settings[1]]),
        "tune_wall_s": round(tune_wall, 1),
        "test_wall_s": round(time.time() - start, 1),
    }
    print(f"[eval] {row}", flush=True)
    return row


def stage_eval(args, run_dir: Path) -> dict:
    """Dispersion per key; kNN-LM perplexity: paper's key exact and IVF-PQ, then the other keys."""
    from atlas.knnlm.datastore import Datastore
    from atlas.knnlm.dispersion import layer_dispersion, recommend_key
    from atlas.knnlm.search import build_knn_index, perplexity
    from common.io import atomic_write_json

    model, tokenizer = load_trained(run_dir)
    stores = {name: Datastore(run_dir / f"store_{name}") for name in ("train", "holdout", "test")}
    train, holdout, test = stores["train"], stores["holdout"], stores["test"]
    _, holdout_words = split_train_holdout(read_words(DATA / "valid.txt"))
    specs = key_specs(model.config.n_layer)
    start = time.time()
    dispersion = layer_dispersion(model, encode_words(tokenizer, holdout_words), key_specs=specs, context=args.context)
    # Rows of the whole test text; the test store may hold fewer (built with --test-tokens).
    test_text_tokens = len(read_words(DATA / "test.txt")) - 1
    if len(test) < test_text_tokens or (args.test_tokens and args.test_tokens < len(test)):
        print(
            f"[eval] test set truncated (--test-tokens): scoring the first "
            f"{min(args.test_tokens or len(test), len(test))} of {test_text_tokens} test tokens "
            f"per key (the test store holds {len(test)})",
            flush=True,
        )
    out = {
        "dispersion": dispersion,
        "recommended_key": recommend_key(dispersion),
        "dispersion_wall_s": round(time.time() - start, 1),
        "test_tokens": len(test),  # rows in the test store
        "test_text_tokens": test_text_tokens,  # rows of the whole test.txt
        "lm_test_ppl": perplexity(test.lm_logprobs),
        "lm_holdout_ppl": perplexity(holdout.lm_logprobs),
        "k": args.k,
        "holdout_tokens_for_tuning": min(len(holdout), args.holdout_tokens or len(holdout)),
        "rows": [],
    }
    print(f"[eval] dispersion {dispersion}", flush=True)
    limit = args.test_tokens or None
    tune_on = args.holdout_tokens or None

    def record(row: dict, search: str) -> None:
        row["search"] = search
        out["rows"].append(row)
        atomic_write_json(run_dir / "eval_partial.json", out)  # keep what is done if stopped

    record(evaluate_key(train, holdout, test, PAPER_KEY, args.k, limit, tune_on), "exact")
    start = time.time()
    index = build_knn_index(train, PAPER_KEY, args.ivf_spec, metric="l2")
    out["ivf_build_wall_s"] = round(time.time() - start, 1)
    ivf = {"index": index, "nprobe": args.nprobe}
    ivf_name = f"{args.ivf_spec} nprobe {args.nprobe}"
    record(evaluate_key(train, holdout, test, PAPER_KEY, args.k, limit, tune_on, **ivf), ivf_name)
    record(
        evaluate_key(train, holdout, test, PAPER_KEY, args.k, limit, tune_on, recompute=True, **ivf),
        ivf_name + " + exact d",
    )
    if limit is not None and limit < len(test):
        record(
            evaluate_key(train, holdout, test, PAPER_KEY, args.k, None, tune_on, **ivf),
            ivf_name + " FULL",
        )
    if not args.paper_key_only:
        for key in specs[1:]:
            record(evaluate_key(train, holdout, test, key, args.k, limit, tune_on), "exact")
    out["summary"] = summarise(out)
    return out


GOAL_RELATIVE_CUT = 0.10  # issue 8: kNN-LM cuts test perplexity by ≥ 10% relative


def relative_cut(knn_ppl: float, lm_ppl: float) -> float:
    """Relative perplexity reduction of the kNN-LM vs the LM alone on the same tokens: 1 − knn/lm."""
    return 1.0 - knn_ppl / lm_ppl


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman rank correlation (no ties expected); None with fewer than 3 points."""
    if len(xs) < 3:
        return None

    def rank(values: list[float]) -> dict[int, int]:
        return {i: r for r, i in enumerate(sorted(range(len(values)), key=values.__getitem__))}

    rx, ry = rank(xs), rank(ys)
    n = len(xs)
    return 1.0 - 6.0 * sum((rx[i] - ry[i]) ** 2 for i in range(n)) / (n * (n * n - 1))


def summarise(ev: dict) -> dict:
    """Relative cuts per row, the issue-8 goal verdict, and dispersion vs kNN-LM perplexity.

    Adds to every row `relative_cut` and `relative_cut_tau1` (1 − kNN-LM/LM perplexity on the
    row's own tokens) and `full_test` (the row scored every test token); returns the summary
    that `stage_eval` stores under `eval["summary"]`.
    """
    for row in ev["rows"]:
        row["relative_cut"] = relative_cut(row["test_ppl"], row["lm_ppl"])
        row["relative_cut_tau1"] = relative_cut(row["test_ppl_tau1"], row["lm_ppl"])
        row["full_test"] = row["tokens"] == ev["test_text_tokens"]
    scored = sorted({row["tokens"] for row in ev["rows"]})
    summary: dict = {
        "test_text_tokens": ev["test_text_tokens"],
        "test_tokens_scored": scored,
        "truncated": any(n < ev["test_text_tokens"] for n in scored),
        "goal_relative_cut": GOAL_RELATIVE_CUT,
    }
    paper = next((r for r in ev["rows"] if r["key"] == PAPER_KEY and r["search"] == "exact"), None)
    if paper is not None:
        summary["paper_key_exact"] = {
            "relative_cut": paper["relative_cut"],
            "tokens": paper["tokens"],
            "met": paper["relative_cut"] >= GOAL_RELATIVE_CUT,
        }
    best = max(ev["rows"], key=lambda r: r["relative_cut"])
    summary["best_row"] = {
        "key": best["key"],
        "search": best["search"],
        "relative_cut": best["relative_cut"],
        "tokens": best["tokens"],
        "met": best["relative_cut"] >= GOAL_RELATIVE_CUT,
    }
    full = [r for r in ev["rows"] if r["full_test"]]
    if full:
        best_full = max(full, key=lambda r: r["relative_cut"])
        summary["goal_met_on_full_test"] = best_full["relative_cut"] >= GOAL_RELATIVE_CUT
        summary["best_full_test_row"] = {
            "key": best_full["key"],
            "search": best_full["search"],
            "relative_cut": best_full["relative_cut"],
        }
    else:
        summary["goal_met_on_full_test"] = None  # no row scored the whole test text
    # Keys are compared on the same tokens with the same (exact) search.
    exact = [r for r in ev["rows"] if r["search"] == "exact"]
    best_key = min(exact, key=lambda r: r["test_ppl"]) if exact else None
    summary["best_knnlm_key"] = best_key["key"] if best_key else None
    summary["best_knnlm_key_ppl"] = best_key["test_ppl"] if best_key else None
    summary["recommended_key"] = ev["recommended_key"]
    summary["keys_compared"] = [r["key"] for r in exact]
    if len(exact) < 2:
        summary["most_dispersed_gives_best"] = None
        summary["why_not_answered"] = "fewer than two keys evaluated (--paper-key-only?)"
    elif ev["recommended_key"] not in summary["keys_compared"]:
        summary["most_dispersed_gives_best"] = None
        summary["why_not_answered"] = "the most dispersed key has no exact-search row"
    else:
        summary["most_dispersed_gives_best"] = best_key["key"] == ev["recommended_key"]
    points = [(ev["dispersion"][r["key"]], r["test_ppl"]) for r in exact if r["key"] in ev["dispersion"]]
    # More dispersed → lower kNN-LM perplexity would give a negative correlation.
    summary["spearman_dispersion_vs_knnlm_ppl"] = spearman(*map(list, zip(*points))) if points else None
    return summary


def print_table(result: dict) -> None:
    """Short human-readable table: relative cuts and ratios are vs the LM on the same tokens."""
    ev = result["eval"]
    summary = ev["summary"]
    print(
        f"\nLM alone: test ppl {ev['lm_test_ppl']:.2f} over the {ev['test_tokens']} tokens of the "
        f"test store ({ev['test_text_tokens']} in test.txt), holdout ppl "
        f"{ev['lm_holdout_ppl']:.2f}; k = {ev['k']}"
    )
    if summary["truncated"]:
        print(
            f"NOTE: --test-tokens truncates the test set: rows marked '*' score only the first "
            f"{min(summary['test_tokens_scored'])} of the {ev['test_text_tokens']} test tokens "
            f"(each row's 'LM ppl' is the LM on its own tokens)"
        )
    print(
        f"{'key':15} {'search':30} {'disp':>6} {'tokens':>8} {'LM ppl':>7} {'λ':>5} {'τ':>5} "
        f"{'kNN-LM':>7} {'ratio':>6} {'cut':>6} {'τ=1':>7} {'cut':>6}"
    )
    for row in ev["rows"]:
        disp = ev["dispersion"].get(row["key"], float("nan"))
        mark = " " if row["full_test"] else "*"
        print(
            f"{row['key']:15} {row['search']:30} {disp:6.3f} {row['tokens']:7d}{mark} "
            f"{row['lm_ppl']:7.2f} {row['lambda']:5.2f} {row['tau']:5g} {row['test_ppl']:7.2f} "
            f"{row['test_ppl'] / row['lm_ppl']:6.3f} {100 * row['relative_cut']:5.1f}% "
            f"{row['test_ppl_tau1']:7.2f} {100 * row['relative_cut_tau1']:5.1f}%"
        )
    goal = f"≥{100 * GOAL_RELATIVE_CUT:.0f}% relative cut of test perplexity"
    verdict = {True: "MET", False: "NOT met", None: "not measured"}
    if "paper_key_exact" in summary:
        paper = summary["paper_key_exact"]
        print(
            f"issue-8 goal ({goal}), paper key {PAPER_KEY} exact: {100 * paper['relative_cut']:.1f}% "
            f"→ {verdict[paper['met']]}"
            + (
                ""
                if paper["tokens"] == ev["test_text_tokens"]
                else f" on the first {paper['tokens']} of {ev['test_text_tokens']} tokens only"
            )
        )
    if summary["goal_met_on_full_test"] is None:
        best = summary["best_row"]
        print(
            f"issue-8 goal on the full test text: not measured (every row is truncated); best "
            f"truncated row {best['key']} {best['search']}: {100 * best['relative_cut']:.1f}%"
        )
    else:
        best = summary["best_full_test_row"]
        print(
            f"issue-8 goal on the full test text: {verdict[summary['goal_met_on_full_test']]} "
            f"(best full-test row {best['key']} {best['search']}: {100 * best['relative_cut']:.1f}%)"
        )
    if summary["best_knnlm_key"] is None:
        print(f"recommended key by dispersion: {ev['recommended_key']} (no exact-search row to compare)")
    else:
        answer = {True: "yes", False: "no", None: f"not answered: {summary.get('why_not_answered')}"}
        rho = summary["spearman_dispersion_vs_knnlm_ppl"]
        print(
            f"best kNN-LM key (exact search, {len(summary['keys_compared'])} keys): "
            f"{summary['best_knnlm_key']} (ppl {summary['best_knnlm_key_ppl']:.2f}); "
            f"most dispersed key: {ev['recommended_key']}; does the most dispersed layer give the "
            f"best kNN-LM? {answer[summary['most_dispersed_gives_best']]}"
            + (f"; Spearman(dispersion, kNN-LM ppl) = {rho:+.2f}" if rho is not None else "")
        )


def main(argv: list[str] | None = None) -> int:
    """Run the requested stages and print the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["train", "build", "eval", "all"], default="all")
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "knnlm_wikitext2")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--stride", type=int, default=64)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--test-tokens", type=int, default=0, help="test tokens scored per key (0 = all)")
    parser.add_argument("--datastore-stride", type=int, default=0, help="stride of the datastore pass (0 = context)")
    parser.add_argument("--holdout-tokens", type=int, default=0, help="tuning tokens (0 = all)")
    parser.add_argument("--ivf-spec", default="IVF1024,PQ32")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--paper-key-only", action="store_true", help="skip the other keys (faster)")
    args = parser.parse_args(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    if args.stage in ("train", "all"):
        result["train"] = stage_train(args, args.run_dir)
    if args.stage in ("build", "all"):
        result["build"] = stage_build(args, args.run_dir)
    if args.stage in ("eval", "all"):
        result["eval"] = stage_eval(args, args.run_dir)
    print(json.dumps(result, indent=1))
    if "eval" in result:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
