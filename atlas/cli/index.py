"""`atlas index build|add|remove|search|info` and `atlas evaluate-retrieval`."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable

DEFAULT_ENCODER = "minilm"


def _reports_errors(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Turn the index's own errors (mismatch, corrupt file, unknown id, bad spec) into a one-line
    message and exit code 2 instead of a traceback."""

    @functools.wraps(handler)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ValueError, KeyError) as e:
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            print(f"atlas {args.command}: error: {message}", file=sys.stderr)
            return 2

    return wrapper


def _add_encoder_arguments(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    parser.add_argument(
        "--encoder",
        default=default,
        help="retriever folder, encoder folder (HF / sentence-transformers), 'minilm' or 'contriever'"
        + ("" if default else "; default: the one the index was built with"),
    )
    parser.add_argument(
        "--allow-encoder-mismatch",
        action="store_true",
        help="search even if the encoder's fingerprint differs from the index's (experts)",
    )


def _add_rerank_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rerank", type=int, default=None, metavar="K'",
        help="re-score the compressed index's top K' candidates exactly from its float16 vectors "
        "(needs an index built with --rerank or --keep-embeddings); 0 = off; default: the index's own",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `index` command group and `evaluate-retrieval` to the `atlas` parser."""
    index = subparsers.add_parser("index", help="build, update, search and inspect passage indexes")
    commands = index.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)

    build = commands.add_parser(
        "build", help="embed a prepared corpus and save an index (resumable)"
    )
    build.add_argument("--corpus", required=True, help="a folder made by `atlas corpus prepare`")
    build.add_argument("--out", required=True, help="the index folder to write")
    build.add_argument(
        "--encoder",
        default=DEFAULT_ENCODER,
        help="retriever/encoder folder, 'minilm' or 'contriever'",
    )
    build.add_argument(
        "--spec", default="Flat",
        help="Flat, IVF{n},Flat, IVF{n},PQ{m}, PQ{m}, OPQ{m},PQ{m}, OPQ{m},IVF{n},PQ{m}, HNSW{M}, SQ8"
    )
    build.add_argument(
        "--keep-embeddings", action="store_true", help="also keep the float16 embeddings"
    )
    build.add_argument(
        "--rerank", type=int, default=0, metavar="K'",
        help="compressed specs: search re-scores the top K' candidates exactly from the float16 "
        "vectors (kept, memory-mapped on disk; e.g. 10x k); recorded in the manifest; 0 = off",
    )
    build.add_argument("--batch-size", type=int, default=64)
    build.add_argument("--chunk-size", type=int, default=8192, help="passages per resumable chunk")
    build.add_argument(
        "--train-sample", type=int, default=262144, help="vectors sampled to train the index"
    )
    build.add_argument("--nprobe", type=int, default=32, help="IVF lists probed at search time")
    build.add_argument("--ef-search", type=int, default=128, help="HNSW search breadth")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    build.add_argument(
        "--restart", action="store_true", help="discard an unfinished build instead of resuming"
    )
    build.set_defaults(func=_build)

    add = commands.add_parser("add", help="embed new passages and add them to an index in place")
    add.add_argument("--index", required=True)
    add.add_argument(
        "--corpus", required=True, nargs="+", help="a prepared corpus folder, or document files"
    )
    add.add_argument(
        "--chunk-words", type=int, default=100, help="words per passage when preparing files"
    )
    add.add_argument("--batch-size", type=int, default=64)
    _add_encoder_arguments(add, default=None)
    add.set_defaults(func=_add)

    remove = commands.add_parser("remove", help="remove passages (by id) from an index in place")
    remove.add_argument("--index", required=True)
    remove.add_argument("--ids", required=True, help="a file with one passage id per line")
    remove.set_defaults(func=_remove)

    search = commands.add_parser("search", help="print the top-k passages for queries")
    search.add_argument("index", help="an index folder")
    search.add_argument("queries", nargs="+", metavar="QUERY")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--corpus", help="the base corpus's folder if it moved since the build")
    search.add_argument("--nprobe", type=int, default=None)
    search.add_argument("--ef-search", type=int, default=None)
    _add_rerank_argument(search)
    search.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    search.add_argument("--sharded", action="store_true",
                        help="under torchrun: each rank searches 1/N of the index; rank 0 prints")
    _add_encoder_arguments(search, default=None)
    search.set_defaults(func=_search)

    info = commands.add_parser("info", help="print an index's manifest and size")
    info.add_argument("index")
    info.add_argument("--verify", action="store_true", help="also check every file's SHA-256")
    info.set_defaults(func=_info)

    evaluate = subparsers.add_parser(
        "evaluate-retrieval", help="answer / gold recall@k and MRR of an index"
    )
    evaluate.add_argument("--index", required=True)
    evaluate.add_argument(
        "--data", required=True, help="JSONL with question and answers (or answer)"
    )
    evaluate.add_argument(
        "-k", type=int, nargs="+", default=[1, 5, 20], help="cut-offs (default 1 5 20)"
    )
    evaluate.add_argument("--out", help="write per-question results to this JSONL file")
    evaluate.add_argument("--max-examples", type=int, default=None)
    evaluate.add_argument("--corpus", help="the base corpus's folder if it moved since the build")
    evaluate.add_argument("--nprobe", type=int, default=None)
    evaluate.add_argument("--ef-search", type=int, default=None)
    _add_rerank_argument(evaluate)
    evaluate.add_argument("--batch-size", type=int, default=64)
    _add_encoder_arguments(evaluate, default=None)
    evaluate.set_defaults(func=_evaluate)


def compute_device(context=None):
    """Where the encoder runs: the rank's device under torchrun (`context`, an
    `atlas.distributed.DistributedContext`), else the first GPU if there is one, else the CPU."""
    import torch

    if context is not None:
        return context.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _load_retriever(encoder: str | None, index_folder: str | None = None, *, device=None):
    """The retriever named by `encoder` (default: the one the index records), on `device`
    (default: `compute_device()`), in eval mode. With an index, passages are formatted and cut as
    the index's manifest records (`passage_format`, `passage_maxlength`), so that the encoder's
    fingerprint matches the one the index was built with."""
    from retriever.encoder import Retriever, default_encoder_path
    from retriever.index_files import read_manifest

    record = read_manifest(index_folder).get("encoder", {}) if index_folder is not None else {}
    if encoder is None:
        encoder = record.get("source") or DEFAULT_ENCODER
    settings = {key: record[key] for key in ("passage_format", "passage_maxlength") if record.get(key) is not None}
    retriever = Retriever.from_pretrained(default_encoder_path(encoder), **settings)
    return retriever.to(device if device is not None else compute_device()).eval()


def _load_index(args: argparse.Namespace, *, device=None):
    from retriever.index import PassageIndex

    return PassageIndex.load(
        args.index,
        retriever=_load_retriever(args.encoder, args.index, device=device),
        corpus=args.corpus,
        allow_encoder_mismatch=args.allow_encoder_mismatch,
        nprobe=args.nprobe,
        ef_search=args.ef_search,
        rerank=args.rerank,
    )


@_reports_errors
def _build(args: argparse.Namespace) -> int:
    import time

    from atlas.distributed import init_distributed, shutdown
    from retriever.index_build import build_index

    context = init_distributed()  # under torchrun the ranks share the embedding work
    started = time.perf_counter()
    out = build_index(
        args.corpus,
        _load_retriever(args.encoder, device=compute_device(context)),
        args.out,
        spec=args.spec,
        batch_size=args.batch_size,
        chunk_size=args.chunk_size,
        train_sample=args.train_sample,
        keep_embeddings=args.keep_embeddings,
        rerank=args.rerank,
        nprobe=args.nprobe,
        ef_search=args.ef_search,
        seed=args.seed,
        overwrite=args.overwrite,
        restart=args.restart,
        encoder_source=args.encoder,
        progress=context.is_main,
        rank=context.rank,
        world_size=context.world_size,
        barrier=context.barrier,
    )
    shutdown(context)
    if not context.is_main:
        return 0
    print(f"index built in {time.perf_counter() - started:.1f} s → {out}")
    return 0


@_reports_errors
def _add(args: argparse.Namespace) -> int:
    from retriever.index_update import add_passages

    stats = add_passages(
        args.index,
        args.corpus,
        _load_retriever(args.encoder, args.index),
        batch_size=args.batch_size,
        chunk_words=args.chunk_words,
        allow_encoder_mismatch=args.allow_encoder_mismatch,
    )
    print(f"added {stats.added} passages; {stats.count} live passages in {args.index}")
    return 0


@_reports_errors
def _remove(args: argparse.Namespace) -> int:
    from retriever.index_update import read_id_file, remove_passages

    stats = remove_passages(args.index, read_id_file(args.ids))
    print(
        f"removed {stats.removed} passages ({stats.already_removed} already removed); "
        f"{stats.count} live passages in {args.index}"
    )
    return 0


@_reports_errors
def _search(args: argparse.Namespace) -> int:
    if args.sharded:
        from atlas.distributed import init_distributed, shutdown
        from retriever.sharded import ShardedPassageIndex

        context = init_distributed()
        loaded = _load_index(args, device=compute_device(context))
        index = ShardedPassageIndex.from_index(loaded, context.rank, context.world_size)
        del loaded  # this rank keeps only its shard (see retriever/sharded.py)
        results = index.search(args.queries, args.k)
        shutdown(context)
        if not context.is_main:
            return 0
    else:
        results = _load_index(args).search(args.queries, args.k)
    for query, hits in zip(args.queries, results):
        if args.json:
            print(json.dumps({"query": query, "hits": [vars(h) for h in hits]}, ensure_ascii=False))
            continue
        print(f"query: {query}")
        for rank, hit in enumerate(hits, start=1):
            text = hit.text if len(hit.text) <= 200 else hit.text[:197] + "..."
            print(f"{rank:3d}. [{hit.score:.4f}] {hit.id}  {hit.title}\n     {text}")
    return 0


@_reports_errors
def _info(args: argparse.Namespace) -> int:
    from pathlib import Path

    from retriever.index_files import check_file, index_summary, read_manifest

    manifest = read_manifest(args.index)
    for record in manifest["files"].values():  # sizes always; contents with --verify
        check_file(Path(args.index), record, verify_hash=args.verify)
    print(json.dumps({**index_summary(manifest), "verified": bool(args.verify)}, indent=2))
    return 0


@_reports_errors
def _evaluate(args: argparse.Namespace) -> int:
    from retriever.retrieval_eval import evaluate_retrieval, read_retrieval_examples
    from tasks.io import write_jsonl

    examples = read_retrieval_examples(args.data)[: args.max_examples]
    metrics, records = evaluate_retrieval(
        _load_index(args), examples, ks=args.k, batch_size=args.batch_size
    )
    if args.out:
        write_jsonl(args.out, records)
    print(json.dumps(metrics, indent=2))
    return 0
