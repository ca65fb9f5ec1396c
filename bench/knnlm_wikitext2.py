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
        lambda s: min(
            (s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps))
        ),
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
    return [PAPER_KEY, "attn_output:-1", "ffn_output:-1"] + [
        f"layer_output:{i}" for i in range(n_layers)
    ]


def load_trained(run_dir: Path):
    """The trained LM and its word tokenizer."""
    from transformers import PreTrainedTokenizerFast

    from atlas.knnlm import load_lm

    return load_lm(run_dir / "lm"), PreTrainedTokenizerFast.from_pretrained(run_dir / "lm")


def stage_build(args, run_dir: Path) -> dict:
    """Datastore over the training text; query stores over the held-out part and the test text."""
    from atlas.knnlm import build_datastore

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
    from atlas.knnlm_search import grid_search, knn_lm_logprobs, perplexity

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
    from atlas.dispersion import layer_dispersion, recommend_key
    from atlas.knnlm_search import build_knn_index, perplexity
    from retriever.datastore import Datastore
    from tasks.io import atomic_write_json

    model, tokenizer = load_trained(run_dir)
    stores = {name: Datastore(run_dir / f"store_{name}") for name in ("train", "holdout", "test")}
    train, holdout, test = stores["train"], stores["holdout"], stores["test"]
    _, holdout_words = split_train_holdout(read_words(DATA / "valid.txt"))
    specs = key_specs(model.config.n_layer)
    start = time.time()
    dispersion = layer_dispersion(
        model, encode_words(tokenizer, holdout_words), key_specs=specs, context=args.context
    )
    out = {
        "dispersion": dispersion,
        "recommended_key": recommend_key(dispersion),
        "dispersion_wall_s": round(time.time() - start, 1),
        "test_tokens": len(test),
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
        evaluate_key(
            train, holdout, test, PAPER_KEY, args.k, limit, tune_on, recompute=True, **ivf
        ),
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
    return out


def print_table(result: dict) -> None:
    """Short human-readable table; ratios are kNN-LM / LM perplexity on the same tokens."""
    ev = result["eval"]
    print(
        f"\nLM alone: test ppl {ev['lm_test_ppl']:.2f} over all {ev['test_tokens']} test tokens, "
        f"holdout ppl {ev['lm_holdout_ppl']:.2f}; k = {ev['k']}"
    )
    print(
        f"{'key':15} {'search':30} {'disp':>6} {'tokens':>7} {'LM ppl':>7} {'λ':>5} {'τ':>5} "
        f"{'kNN-LM':>7} {'ratio':>6} {'τ=1':>7} {'ratio':>6}"
    )
    for row in ev["rows"]:
        disp = ev["dispersion"].get(row["key"], float("nan"))
        print(
            f"{row['key']:15} {row['search']:30} {disp:6.3f} {row['tokens']:7d} {row['lm_ppl']:7.2f} "
            f"{row['lambda']:5.2f} {row['tau']:5g} {row['test_ppl']:7.2f} "
            f"{row['test_ppl'] / row['lm_ppl']:6.3f} {row['test_ppl_tau1']:7.2f} "
            f"{row['test_ppl_tau1'] / row['lm_ppl']:6.3f}"
        )
    print(f"recommended key by dispersion: {ev['recommended_key']}")


def main(argv: list[str] | None = None) -> int:
    """Run the requested stages and print the JSON result."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument(
        "--test-tokens", type=int, default=0, help="test tokens scored per key (0 = all)"
    )
    parser.add_argument(
        "--datastore-stride", type=int, default=0, help="stride of the datastore pass (0 = context)"
    )
    parser.add_argument("--holdout-tokens", type=int, default=0, help="tuning tokens (0 = all)")
    parser.add_argument("--ivf-spec", default="IVF1024,PQ32")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument(
        "--paper-key-only", action="store_true", help="skip the other keys (faster)"
    )
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
