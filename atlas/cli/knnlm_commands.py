"""`atlas knnlm {build,tune,eval}` and `atlas dispersion`: nearest-neighbour LMs on the CLI.

    atlas knnlm build MODEL TEXT DATASTORE --keys ffn_input:-1 attn_output:-1
    atlas knnlm tune  MODEL DATASTORE VALID_TEXT --key ffn_input:-1 --out tuning.json
    atlas knnlm eval  MODEL DATASTORE TEST_TEXT --key ffn_input:-1 --tuning tuning.json --out res/
    atlas dispersion  MODEL TEXT

MODEL is a local folder (weights + tokenizer) of a causal LM or a T5 model. The text of TUNE
and EVAL is turned into a "query store" (keys, next tokens and LM log-probs over the same
sliding windows as the datastore), kept beside the datastore so that reruns are cheap.

Every store records the fingerprint of the model (configuration + weights) and of the
tokenizer that built it, and a hash of its token stream: TUNE and EVAL refuse a MODEL other
than the datastore's, and a cached query store (or a half-built datastore) is reused or
resumed only by the same model, tokenizer and text.
"""

# Lazy imports: the handlers import transformers and atlas.knnlm (torch, faiss) when they run, so that
# `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import json
from pathlib import Path

SEARCH_CHOICES = ("exact", "faiss")


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", default="ffn_input:-1", help="key spec stored in the datastore")
    parser.add_argument("--k", type=int, default=1024, help="neighbours per token (paper: 1024)")
    parser.add_argument("--metric", choices=("l2", "ip"), default="l2")
    parser.add_argument("--search", choices=SEARCH_CHOICES, default="exact")
    parser.add_argument("--index-spec", default="IVF1024,PQ32", help="FAISS spec when --search faiss")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--recompute", action="store_true", help="exact distances from stored keys for FAISS hits")
    parser.add_argument("--batch-size", type=int, default=8)


def register(subparsers) -> None:
    """Add the `knnlm` group and the `dispersion` command to the `atlas` parser."""
    knnlm = subparsers.add_parser("knnlm", help="kNN-LM: token datastores, λ/τ tuning, perplexity")
    knnlm_sub = knnlm.add_subparsers(dest="knnlm_command", metavar="STEP", required=True)

    build = knnlm_sub.add_parser("build", help="build (or resume) a token-level datastore over a text")
    build.add_argument("model", type=Path)
    build.add_argument("text", type=Path)
    build.add_argument("datastore", type=Path)
    build.add_argument(
        "--keys",
        nargs="+",
        default=["ffn_input:-1"],
        help="key specs, e.g. ffn_input:-1 layer_output:3",
    )
    build.add_argument("--context", type=int, default=512)
    build.add_argument("--stride", type=int, default=256)
    build.add_argument("--batch-size", type=int, default=8)
    build.set_defaults(func=run_build)

    tune = knnlm_sub.add_parser("tune", help="grid-search λ and τ on a validation text")
    for name in ("model", "datastore", "text"):
        tune.add_argument(name, type=Path)
    _add_search_arguments(tune)
    tune.add_argument("--lambdas", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6])
    tune.add_argument("--temperatures", type=float, nargs="+", default=[1, 3, 10, 30, 100, 300, 1000])
    tune.add_argument("--out", type=Path, required=True, help="JSON file for the tuning result")
    tune.set_defaults(func=run_tune)

    evaluate = knnlm_sub.add_parser("eval", help="sliding-window perplexity of the LM and of the kNN-LM")
    for name in ("model", "datastore", "text"):
        evaluate.add_argument(name, type=Path)
    _add_search_arguments(evaluate)
    evaluate.add_argument("--tuning", type=Path, help="JSON written by `knnlm tune` (λ and τ)")
    evaluate.add_argument("--lambda", dest="lam", type=float, help="overrides the tuned λ")
    evaluate.add_argument("--temperature", type=float, help="overrides the tuned τ")
    evaluate.add_argument("--out", type=Path, required=True, help="folder for summary.json and per-token log-probs")
    evaluate.set_defaults(func=run_eval)

    dispersion = subparsers.add_parser(
        "dispersion", help="per-layer representation dispersion; recommends a kNN-LM key"
    )
    dispersion.add_argument("model", type=Path)
    dispersion.add_argument("text", type=Path)
    dispersion.add_argument("--keys", nargs="+", help="key specs (default: every block output + last-block sublayers)")
    dispersion.add_argument("--context", type=int, default=512)
    dispersion.add_argument("--batch-size", type=int, default=8)
    dispersion.add_argument("--max-tokens", type=int, default=100_000)
    dispersion.add_argument("--sample-fraction", type=float, default=1.0)
    dispersion.add_argument("--out", type=Path, help="optional JSON file for the curve")
    dispersion.set_defaults(func=run_dispersion)


def _model_and_tokens(model_dir: Path, text: Path):
    """(model, tokenizer, token ids (N,)) for a model folder and a text file."""
    from transformers import AutoTokenizer

    from atlas.knnlm.lm import load_lm, tokenize_text_file

    if not text.is_file():
        raise FileNotFoundError(f"{text}: text file not found")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return load_lm(model_dir), tokenizer, tokenize_text_file(text, tokenizer)


def run_build(args) -> int:
    """Handler of `atlas knnlm build`."""
    from atlas.knnlm.lm import build_datastore

    model, tokenizer, ids = _model_and_tokens(args.model, args.text)
    store = build_datastore(
        args.datastore,
        model,
        ids,
        args.keys,
        context=args.context,
        stride=args.stride,
        batch_size=args.batch_size,
        meta={"text": str(args.text.resolve())},
        tokenizer=tokenizer,
    )
    print(f"datastore {args.datastore}: {len(store)} rows, keys {store.key_names}")
    return 0


def _query_store(args, train):
    """The text's keys/targets/LM log-probs, with the datastore's windows, cached beside it.

    The model must be the one the datastore was built with (same fingerprint and tokenizer),
    else its query keys would live in another space: refused with the two fingerprints. A
    cached query store is reused only when its model, tokenizer and text are the same too.
    """
    from atlas.knnlm.lm import (
        KeyedLM,
        build_datastore,
        check_datastore_producer,
        model_fingerprint,
        producer_meta,
    )

    if args.key not in train.key_names:
        raise ValueError(f"{train.path}: key '{args.key}' not stored; stored keys: {train.key_names}")
    model, tokenizer, ids = _model_and_tokens(args.model, args.text)
    fingerprint = model_fingerprint(model)
    keyed = KeyedLM(model, [args.key])
    try:
        expected = producer_meta(model, keyed, tokenizer=tokenizer, fingerprint=fingerprint)
    finally:
        keyed.remove()
    try:
        check_datastore_producer(train.path, expected)
    except ValueError as error:
        raise ValueError(f"{error} (model given: {args.model})") from None
    meta = train.manifest.meta
    folder = args.datastore.parent / f"{args.datastore.name}-queries-{args.text.stem}-{args.key.replace(':', '@')}"
    return build_datastore(
        folder,
        model,
        ids,
        [args.key],
        context=meta["context"],
        stride=meta["stride"],
        batch_size=args.batch_size,
        meta={"text": str(args.text.resolve())},
        tokenizer=tokenizer,
        fingerprint=fingerprint,
    )


def _search_kwargs(args, train) -> dict:
    from atlas.knnlm.search import build_knn_index

    if args.search == "exact":
        return {"metric": args.metric}
    index = build_knn_index(train, args.key, args.index_spec, metric=args.metric)
    return {
        "metric": args.metric,
        "index": index,
        "nprobe": args.nprobe,
        "recompute": args.recompute,
    }


def run_tune(args) -> int:
    """Handler of `atlas knnlm tune`."""
    from atlas.knnlm.datastore import Datastore
    from atlas.knnlm.search import grid_search
    from common.io import atomic_write_json

    train = Datastore(args.datastore)
    queries = _query_store(args, train)
    result = grid_search(
        queries,
        train,
        args.key,
        k=args.k,
        lambdas=args.lambdas,
        temperatures=args.temperatures,
        **_search_kwargs(args, train),
    )
    result.update(key=args.key, k=args.k, search=args.search, metric=args.metric)
    atomic_write_json(args.out, result)
    print(
        f"best λ={result['lambda']} τ={result['temperature']}: ppl {result['perplexity']:.3f} "
        f"(LM alone {result['lm_perplexity']:.3f}) → {args.out}"
    )
    return 0


def run_eval(args) -> int:
    """Handler of `atlas knnlm eval`."""
    from atlas.knnlm.datastore import Datastore
    from atlas.knnlm.search import knn_lm_logprobs, perplexity, save_token_logprobs
    from common.io import atomic_write_json

    tuned = json.loads(args.tuning.read_text()) if args.tuning else {}
    lam = args.lam if args.lam is not None else tuned.get("lambda")
    tau = args.temperature if args.temperature is not None else tuned.get("temperature")
    if lam is None or tau is None:
        raise ValueError("give --tuning or both --lambda and --temperature")
    train = Datastore(args.datastore)
    queries = _query_store(args, train)
    logprobs = knn_lm_logprobs(
        queries, train, args.key, k=args.k, settings=[(lam, tau)], **_search_kwargs(args, train)
    )[(lam, tau)]
    args.out.mkdir(parents=True, exist_ok=True)
    save_token_logprobs(args.out / "lm_logprobs.npy", queries.lm_logprobs)
    save_token_logprobs(args.out / "knnlm_logprobs.npy", logprobs)
    summary = {
        "tokens": len(queries),
        "lm_perplexity": perplexity(queries.lm_logprobs),
        "knnlm_perplexity": perplexity(logprobs),
        "lambda": lam,
        "temperature": tau,
        "key": args.key,
        "k": args.k,
        "search": args.search,
        "metric": args.metric,
    }
    atomic_write_json(args.out / "summary.json", summary)
    print(
        f"LM ppl {summary['lm_perplexity']:.3f}  kNN-LM ppl {summary['knnlm_perplexity']:.3f} "
        f"over {summary['tokens']} tokens → {args.out}"
    )
    return 0


def run_dispersion(args) -> int:
    """Handler of `atlas dispersion`: prints the per-key curve and the recommended key."""
    from atlas.knnlm.dispersion import layer_dispersion, recommend_key
    from common.io import atomic_write_json

    model, _, ids = _model_and_tokens(args.model, args.text)
    values = layer_dispersion(
        model,
        ids,
        key_specs=args.keys,
        context=args.context,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        sample_fraction=args.sample_fraction,
    )
    best = recommend_key(values)
    for spec, value in values.items():
        print(f"{spec:20} {value:.4f}{'  ← recommended kNN-LM key' if spec == best else ''}")
    if args.out:
        atomic_write_json(args.out, {"dispersion": values, "recommended_key": best})
    return 0
