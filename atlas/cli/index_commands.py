"""`atlas index build|add|update|remove|compact|get|search|info` and `atlas evaluate-retrieval`."""

# Lazy imports: the handlers (and _reports_errors' wrapper) import torch, faiss and the retriever's index modules
# when they run, so that `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import errno
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common.modeling import DEFAULT_ENCODER


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with "(default: X)" after each option that has a default to show.

    Left out where there is nothing to show (None, a flag's False) and where the help text
    already says what the default is (it mentions "default")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


IDS_HELP = "passage ids; @FILE reads ids from FILE, one per line (e.g. {example})"


def _reports_errors(
    handler: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """Turn the index's own errors (mismatch, corrupt file, unknown id, bad spec, bad input,
    another writer holding the index, a full disk) into a one-line message and exit code 2
    instead of a traceback."""

    @functools.wraps(handler)
    def wrapper(args: argparse.Namespace) -> int:
        from common.progress import close_progress_bars  # likewise
        from retriever.index.files import IndexLockedError  # in the wrapper: decorating runs at `atlas --help`

        try:
            return handler(args)
        except (ValueError, KeyError, OSError, IndexLockedError) as e:
            close_progress_bars()  # the error is the last line, not a bar the failed loop left open
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                message = (
                    f"{e.filename or 'a file it wrote'}: the disk is full; nothing was committed (an index is left as "
                    "it was before the command): free some space and run the same command again"
                )
            command = " ".join(filter(None, (args.command, getattr(args, "index_command", None))))
            print(f"atlas {command}: error: {message}", file=sys.stderr)
            return 2

    return wrapper


def read_ids(values: list[str]) -> list[str]:
    """Expand `--ids` values: a value `@FILE` is the ids in FILE (one per line), any other
    value is an id. `@` is the only marker, so an id is never mistaken for a file name."""
    from retriever.index.update import read_id_file

    ids: list[str] = []
    for value in values:
        ids.extend(read_id_file(value[1:]) if value.startswith("@") else [value])
    return ids


def _unknown_id_hint(error: KeyError, values: list[str]) -> KeyError:
    """The error, with a hint where an 'unknown id' is the name of an existing file."""
    files = [v for v in values if not v.startswith("@") and Path(v).is_file()]
    if not files:
        return error
    return KeyError(f"{error.args[0]} ({files[0]} is a file: write @{files[0]} to read ids from it)")


def _add_index_argument(parser: argparse.ArgumentParser) -> None:
    """`--index DIR` (required)."""
    parser.add_argument("--index", metavar="DIR", required=True, help="the index folder (made by `atlas index build`)")


def _add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--encoder",
        help="retriever folder, encoder folder (HF / sentence-transformers), 'minilm' or 'contriever'; default: the "
        "one the index was built with",
    )
    parser.add_argument(
        "--allow-encoder-mismatch",
        action="store_true",
        help="search even if the encoder's fingerprint differs from the index's (experts)",
    )


def _add_precision_argument(parser: argparse.ArgumentParser) -> None:
    from retriever.embedding_precision import DEFAULT_EMBEDDING_PRECISION, EMBEDDING_PRECISIONS  # light

    parser.add_argument(
        "--precision",
        choices=EMBEDDING_PRECISIONS,
        default=DEFAULT_EMBEDDING_PRECISION,
        help="the precision passages are embedded at, recorded in the index: bf16 (bfloat16 autocast), fp32, or "
        "auto: bf16 where the hardware multiplies it natively (a CPU with AVX512-BF16 or AMX measured faster in it, "
        "a CUDA GPU with bf16), else fp32",
    )


def add_index_settings(parser: argparse.ArgumentParser, *names: str, at_search: bool = False) -> None:
    """`--spec`, `--chunk-size`, … for the `retriever.index.settings.IndexSettings` fields `names`, with their
    defaults and help from there (`IndexSettings.of(args)` reads them back). `at_search`: overrides of the
    index's own search settings, None by default."""
    import dataclasses
    import typing

    from retriever.index.settings import DEFAULTS, IndexSettings  # light

    hints = typing.get_type_hints(IndexSettings)
    for setting in dataclasses.fields(IndexSettings):
        if setting.name not in names:
            continue
        flag, text = "--" + setting.name.replace("_", "-"), setting.metadata["help"]
        kinds = typing.get_args(hints[setting.name]) or (hints[setting.name],)  # `int | None`: (int, NoneType)
        if bool in kinds:
            parser.add_argument(flag, action="store_true", help=text)
            continue
        parser.add_argument(
            flag,
            type=int if int in kinds else str,
            default=None if at_search else getattr(DEFAULTS, setting.name),
            metavar="K'" if setting.name == "exact_rerank" else None,
            help=text + ("; default: the index's own" if at_search else ""),
        )


def _add_passage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--passage-maxlength",
        type=int,
        help="tokens of each passage the encoder reads (a recipe's retriever.passage_maxlength); default: "
        "the encoder's own",
    )
    parser.add_argument(
        "--passage-format",
        help="how a passage is written for the encoder (a recipe's retriever.passage_format); default: the "
        "encoder's own, '{title} {text}'",
    )


def _index_building_retriever(args: argparse.Namespace, device=None):
    """The encoder `build`/`embed` embed with: --encoder (default MiniLM), cut and formatted as asked."""
    from atlas.index_api import index_retriever

    retriever = index_retriever(None, args.encoder or DEFAULT_ENCODER, device=device)
    if args.passage_maxlength is not None:
        retriever.passage_maxlength = args.passage_maxlength
    if args.passage_format is not None:
        retriever.passage_format = args.passage_format
    return retriever


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `index` command group and `evaluate-retrieval` to the `atlas` parser.

    Every subcommand names its index with `--index DIR` (`build` writes a new one: `--out DIR`,
    or `--index DIR`)."""
    group = subparsers.add_parser(
        "index", help="build, update, search and inspect passage indexes", formatter_class=DefaultsFormatter
    )
    commands = group.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)

    def command(name: str, help: str, description: str | None = None, *, index: bool = True) -> argparse.ArgumentParser:
        parser = commands.add_parser(
            name, help=help, description=description or help, formatter_class=DefaultsFormatter
        )
        if index:  # an existing index, named first (build and embed write one)
            _add_index_argument(parser)
        return parser

    _register_building(command)
    _register_edits(command)
    _register_reading(command)
    _register_evaluate_retrieval(subparsers)


def _register_building(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`atlas index build` and `atlas index embed`."""
    build = command("build", "embed a prepared corpus and save an index (resumable)", index=False)
    build.add_argument("--corpus", required=True, help="a folder made by `atlas corpus prepare`")
    build.add_argument("--out", "--index", dest="out", metavar="DIR", required=True, help="the index folder to write")
    build.add_argument(
        "--encoder",
        default=None,
        help=f"retriever/encoder folder, 'minilm' or 'contriever'; default: {DEFAULT_ENCODER}, or with --vectors "
        "the encoder their record names",
    )
    build.add_argument(
        "--vectors",
        metavar="V",
        help="index these passage vectors instead of embedding: a .npy (N, d) or a folder of .npy shards in "
        "corpus order, float16/float32, with their encoder record beside them (`atlas index embed` writes both)",
    )
    _add_passage_arguments(build)
    add_index_settings(
        build,
        *("spec", "keep_embeddings", "exact_rerank", "batch_size", "chunk_size", "train_sample", "nprobe", "ef_search"),
        "seed",
    )
    _add_precision_argument(build)
    build.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    build.add_argument("--restart", action="store_true", help="discard an unfinished build instead of resuming")
    build.set_defaults(func=_build)

    embed = command(
        "embed",
        "embed a prepared corpus into a vectors file, to build its index elsewhere (resumable; torchrun shares it)",
        "Embed a prepared corpus into OUT (an (N, d) float16 .npy) and its encoder record (OUT.encoder.json), "
        "for `atlas index build --vectors OUT` on another machine: embed on GPUs, build and serve on a CPU one. "
        "Resumable (the work folder is OUT.building/); under torchrun the ranks share the chunks.",
        index=False,
    )
    embed.add_argument("--corpus", required=True, help="a folder made by `atlas corpus prepare`")
    embed.add_argument("--out", required=True, metavar="V", help="the .npy file to write")
    embed.add_argument("--encoder", default=None, help=f"retriever/encoder folder or name; default: {DEFAULT_ENCODER}")
    _add_passage_arguments(embed)
    add_index_settings(embed, "batch_size", "chunk_size")
    _add_precision_argument(embed)
    embed.add_argument("--restart", action="store_true", help="discard an unfinished run instead of resuming")
    embed.set_defaults(func=_embed)


def _register_edits(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`atlas index add|update|remove`, each compacting the index after its edit when it is due."""
    add = command(
        "add",
        "embed new passages and add them to an index in place",
        "Embed new passages and add them to an index in place. Each record is one passage under "
        "its own id unless --chunk-words splits it; an id that is already live is refused "
        "(replace it with `atlas index update`, or pass --replace).",
    )
    _add_passages_argument(add)
    add.add_argument(
        "--chunk-words",
        type=int,
        default=0,
        help="split each record into passages of this many words named ID-0, ID-1, ... (as "
        "`atlas corpus prepare` names them, even a record that fits in one); 0: each record is "
        "one passage under its own id",
    )
    add.add_argument(
        "--replace",
        action="store_true",
        help="replace passages whose id is already live instead of refusing them",
    )
    add_index_settings(add, "batch_size")
    _add_precision_argument(add)
    _add_encoder_arguments(add)
    add.set_defaults(func=_add)

    update = command(
        "update",
        "replace passages by id (ids kept) with new versions, in place",
        "Replace live passages by id with the records of INPUT (each one passage, never split): "
        "the ids are kept and the old versions removed in the same commit. A record without a "
        "title keeps the passage's title. An id with no live passage is refused (nothing is "
        "written); add new ones with `atlas index add`.",
    )
    _add_passages_argument(update)
    add_index_settings(update, "batch_size")
    _add_precision_argument(update)
    _add_encoder_arguments(update)
    update.set_defaults(func=_update)

    remove = command("remove", "remove passages (by id) from an index in place")
    remove.add_argument(
        "--ids",
        required=True,
        nargs="+",
        metavar="ID",
        help=IDS_HELP.format(example="--ids a-0 b-0, or --ids @ids.txt"),
    )
    remove.set_defaults(func=_remove)
    for edit in (add, update, remove):
        edit.add_argument(
            "--no-compact",
            dest="compact",
            action="store_false",
            help="do not compact the index after the edit (default: compact it when it has more than 8 corpus "
            "segments or 5%% dead rows; see `atlas index compact`)",
        )


def _add_passages_argument(parser: argparse.ArgumentParser) -> None:
    """`--corpus INPUT...`: the passages `add` and `update` read."""
    parser.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        metavar="INPUT",
        help="JSONL / TSV files of passages {id, title, text}, or a prepared corpus folder",
    )


def _register_reading(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`atlas index compact|get|search|info`."""
    compact = command(
        "compact",
        "merge the index's corpus segments and drop its removed rows, in place",
        "Merge the corpus segments of an index into one and drop the rows of removed and replaced "
        "passages from its files, as one atomic commit; search results stay the same. `add`, `update` "
        "and `remove` (and `atlas serve`) do this by themselves when an index has more than "
        "8 segments or 5% dead rows (merging the segments added since the build); this command "
        "rewrites everything, the base corpus included. Refused while another process updates the index.",
    )
    compact.set_defaults(func=_compact)

    get = command("get", "print passages by id: id, title, text")
    get.add_argument("ids", nargs="+", metavar="ID", help=IDS_HELP.format(example="get --index DIR a-0 @more-ids.txt"))
    get.add_argument("--json", action="store_true", help="print JSON lines {id, title, text}")
    get.set_defaults(func=_get)

    search = command("search", "print the top-k passages for queries")
    search.add_argument("queries", nargs="+", metavar="QUERY", help="queries")
    search.add_argument("-k", type=int, default=5, help="passages per query")
    search.add_argument("--corpus", help="the base corpus's folder if it moved since the build")
    add_index_settings(search, "nprobe", "ef_search", "exact_rerank", at_search=True)
    search.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    search.add_argument(
        "--sharded", action="store_true", help="under torchrun: each rank searches 1/N of the index; rank 0 prints"
    )
    _add_encoder_arguments(search)
    search.set_defaults(func=_search)

    info = command("info", "summarise an index (its whole manifest with --json) and check its files")
    info.add_argument("--json", action="store_true", help="print the whole manifest and sizes as JSON")
    info.add_argument(
        "--verify", action="store_true", help="also check every file's SHA-256, its corpora' passages files included"
    )
    info.set_defaults(func=_info)


def _register_evaluate_retrieval(subparsers: argparse._SubParsersAction) -> None:
    """`atlas evaluate-retrieval`: answer / gold recall@k and MRR of an index."""
    evaluate = subparsers.add_parser(
        "evaluate-retrieval",
        help="answer / gold recall@k and MRR of an index",
        formatter_class=DefaultsFormatter,
    )
    _add_index_argument(evaluate)
    evaluate.add_argument("--data", required=True, help="JSONL with question and answers (or answer)")
    evaluate.add_argument("-k", type=int, nargs="+", default=[1, 5, 20], help="cut-offs (default: 1 5 20)")
    evaluate.add_argument("--out", help="write per-question results to this JSONL file")
    evaluate.add_argument("--max-examples", type=int, default=None, help="default: all")
    evaluate.add_argument("--corpus", help="the base corpus's folder if it moved since the build")
    add_index_settings(evaluate, "nprobe", "ef_search", "exact_rerank", at_search=True)
    evaluate.add_argument("--batch-size", type=int, default=64, help="queries per encoder batch")
    _add_encoder_arguments(evaluate)
    evaluate.set_defaults(func=_evaluate)


def _load_index(args: argparse.Namespace, *, device=None):
    from atlas.index_api import index_retriever
    from retriever.index import PassageIndex

    return PassageIndex.load(
        args.index,
        retriever=index_retriever(args.index, args.encoder, device=device),
        corpus=args.corpus,
        allow_encoder_mismatch=args.allow_encoder_mismatch,
        nprobe=args.nprobe,
        ef_search=args.ef_search,
        exact_rerank=args.exact_rerank,
    )


@_reports_errors
def _build(args: argparse.Namespace) -> int:
    from atlas.distributed import init_distributed, shutdown
    from atlas.index_api import compute_device
    from retriever.index.build import build_index
    from retriever.index.settings import IndexSettings
    from retriever.index.vectors import read_encoder_record

    context = init_distributed()  # under torchrun the ranks share the embedding work
    started = time.perf_counter()
    retriever = None  # given vectors with their record need no encoder (unless one is named, to check them)
    needs_encoder = not args.vectors or args.encoder or read_encoder_record(args.vectors) is None
    if needs_encoder:
        retriever = _index_building_retriever(args, device=compute_device(context))
    out = build_index(
        args.corpus,
        retriever,
        args.out,
        IndexSettings.of(args),
        overwrite=args.overwrite,
        restart=args.restart,
        encoder_source=args.encoder or DEFAULT_ENCODER,
        vectors=args.vectors,
        precision=args.precision,
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
def _embed(args: argparse.Namespace) -> int:
    from atlas.distributed import init_distributed, shutdown
    from atlas.index_api import compute_device
    from retriever.index.build import embed_vectors

    context = init_distributed()
    started = time.perf_counter()
    out = embed_vectors(
        args.corpus,
        _index_building_retriever(args, device=compute_device(context)),
        args.out,
        batch_size=args.batch_size,
        chunk_size=args.chunk_size,
        restart=args.restart,
        encoder_source=args.encoder or DEFAULT_ENCODER,
        precision=args.precision,
        progress=context.is_main,
        rank=context.rank,
        world_size=context.world_size,
        barrier=context.barrier,
    )
    shutdown(context)
    if context.is_main:
        print(f"embedded in {time.perf_counter() - started:.1f} s → {out} (with {out.name}.encoder.json)")
    return 0


def _shown(ids: list[str]) -> str:
    """The first few ids, for a summary line."""
    return ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")


def _passages_in(paths: list[str], *, as_records: bool = False) -> tuple[object, dict]:
    """What `atlas index add/update` were given, read here at the edge: a prepared corpus folder (added as it is;
    its rows as records where `as_records`), or JSONL / TSV files as records, with the file and line of each
    (named in errors) → (passages, the edit's `origins` and `sources`)."""
    from retriever.corpus import Corpus
    from retriever.corpus_manifest import CORPUS_MANIFEST
    from retriever.index.update import PASSAGE_FIELDS, read_passage_files

    if len(paths) == 1 and (Path(paths[0]) / CORPUS_MANIFEST).is_file():
        corpus = Corpus.load(paths[0])
        if not as_records:
            return corpus, {}
        records = [{k: row[k] for k in PASSAGE_FIELDS} for row in corpus.rows(range(len(corpus)))]
        return records, {"origins": [f"{paths[0]} row {n}" for n in range(1, len(corpus) + 1)], "sources": paths}
    records, origins = read_passage_files(paths)
    return records, {"origins": origins, "sources": [str(Path(p).resolve()) for p in paths]}


@_reports_errors
def _add(args: argparse.Namespace) -> int:
    from atlas.index_api import index_retriever
    from retriever.index.update import add_passages

    passages, where = _passages_in(args.corpus)
    stats = add_passages(
        args.index,
        passages,
        index_retriever(args.index, args.encoder),
        batch_size=args.batch_size,
        chunk_words=args.chunk_words,
        allow_encoder_mismatch=args.allow_encoder_mismatch,
        replace=args.replace,
        precision=args.precision,
        **where,
    )
    print(
        f"added {stats.added} and replaced {stats.replaced} passages ({_shown(stats.ids)}); "
        f"{stats.count} live passages in {args.index}"
    )
    _compact_if_due(args)
    return 0


@_reports_errors
def _update(args: argparse.Namespace) -> int:
    from atlas.index_api import index_retriever
    from retriever.index.update import update_passages

    passages, where = _passages_in(args.corpus, as_records=True)
    stats = update_passages(
        args.index,
        passages,
        index_retriever(args.index, args.encoder),
        batch_size=args.batch_size,
        allow_encoder_mismatch=args.allow_encoder_mismatch,
        precision=args.precision,
        **where,
    )
    print(f"updated {stats.replaced} passages ({_shown(stats.ids)}); {stats.count} live passages in {args.index}")
    _compact_if_due(args)
    return 0


@_reports_errors
def _remove(args: argparse.Namespace) -> int:
    from retriever.index.update import remove_passages

    try:
        stats = remove_passages(args.index, read_ids(args.ids))
    except KeyError as e:
        raise _unknown_id_hint(e, args.ids) from None
    print(
        f"removed {stats.removed} passages ({stats.already_removed} already removed); "
        f"{stats.count} live passages in {args.index}"
    )
    _compact_if_due(args)
    return 0


def _compacted(stats) -> str:
    """One line on what a compaction did."""
    return (
        f"compacted {'all' if stats.full else 'the added'} segments: {stats.segments_before} → "
        f"{stats.segments_after} segments, {stats.rows_before} → {stats.rows_after} rows "
        f"({stats.dead_before - stats.dead_after} dead rows dropped), generation {stats.generation}, "
        f"{stats.seconds:.2f} s"
    )


def _compact_if_due(args: argparse.Namespace) -> None:
    """After an edit: compact the index when `retriever.index.compact.compaction_due` says so."""
    from retriever.index.compact import compact_index, compaction_due
    from retriever.index.manifest import Manifest

    reason = compaction_due(Manifest.load(args.index)) if args.compact else None
    if reason is not None:
        print(f"{_compacted(compact_index(args.index, full=False))} ({reason})")


@_reports_errors
def _compact(args: argparse.Namespace) -> int:
    from retriever.index.compact import compact_index

    stats = compact_index(args.index, full=True)
    print(
        _compacted(stats)
        if stats.compacted
        else f"nothing to compact: {args.index} is one segment with no dead rows (generation {stats.generation})"
    )
    return 0


@_reports_errors
def _get(args: argparse.Namespace) -> int:
    from retriever.index import PassageIndex

    index = PassageIndex.load(args.index)  # reading passages needs no encoder
    try:
        passages = index.get(read_ids(args.ids))
    except KeyError as e:
        raise _unknown_id_hint(e, args.ids) from None
    for passage in passages:
        record = {"id": passage["id"], "title": passage.get("title") or "", "text": passage["text"]}
        if args.json:
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(f"id: {record['id']}\ntitle: {record['title']}\ntext: {record['text']}\n")
    return 0


@_reports_errors
def _search(args: argparse.Namespace) -> int:
    if args.sharded:
        from atlas.distributed import init_distributed, shutdown
        from atlas.index_api import compute_device
        from retriever.index.sharded import ShardedPassageIndex

        context = init_distributed()
        loaded = _load_index(args, device=compute_device(context))
        index = ShardedPassageIndex.from_index(loaded, context.rank, context.world_size)
        del loaded  # this rank keeps only its shard (see retriever/index/sharded.py)
        results = index.search(args.queries, args.k)
        shutdown(context)
        if not context.is_main:
            return 0
    else:
        results = _load_index(args).search(args.queries, args.k)
    for query, hits in zip(args.queries, results):
        if args.json:
            print(json.dumps({"query": query, "hits": [h.search_record() for h in hits]}, ensure_ascii=False))
            continue
        print(f"query: {query}")
        for rank, hit in enumerate(hits, start=1):
            text = hit.text if len(hit.text) <= 200 else hit.text[:197] + "..."
            print(f"{rank:3d}. [{hit.score:.4f}] {hit.id}  {hit.title}\n     {text}")
    return 0


@_reports_errors
def _info(args: argparse.Namespace) -> int:
    from common.limits import ID_RULE, passage_id_problem
    from retriever.index.compact import compaction_due
    from retriever.index.files import check_file, open_corpus
    from retriever.index.manifest import Manifest

    folder = args.index
    manifest = Manifest.load(folder)
    for record in manifest.file_records():  # sizes and sampled blocks always; contents with --verify
        check_file(Path(folder), manifest, record, verify_hash=args.verify)
    corpora = [open_corpus(Path(folder), manifest, s, verify=args.verify) for s in manifest.segments]  # likewise
    due = compaction_due(manifest)
    summary = {**manifest.summary(), "compaction_due": due, "verified": bool(args.verify)}
    lines = None if args.json else _summary_lines(folder, manifest, due, args.verify)
    if args.verify:  # ids an older index may hold that the grammar refuses: readable, not reachable over HTTP
        outside = [i for corpus in corpora for i in corpus.table.column("id").to_pylist() if passage_id_problem(i)]
        summary["ids_outside_grammar"] = outside
        if lines is not None and outside:
            lines += (
                f"\n{len(outside):,} passage id(s) outside the id grammar ({ID_RULE}), readable here but not over "
                f"HTTP: {', '.join(map(repr, outside[:10]))}{', ...' if len(outside) > 10 else ''}; "
                "add them again under valid ids and remove these"
            )
    print(json.dumps(summary, indent=2) if args.json else lines)
    return 0


def _summary_lines(folder: str, manifest, compaction_due: str | None, verified: bool) -> str:
    """`atlas index info`'s few lines (for a `retriever.index.manifest.Manifest`): what the index is, what it
    holds, and what was checked."""
    encoder, summary = manifest.encoder, manifest.summary()
    size = f"{summary['bytes_on_disk'] / 1e6:,.1f} MB of index files ({summary['bytes_per_passage']:,.0f} B a passage)"
    holds = f"{manifest.count:,} passages ({manifest.dead_rows:,} removed rows), d = {manifest.dim}"
    written = f"written {encoder.passage_format!r}, cut at {encoder.passage_maxlength} tokens"
    precisions = sorted({manifest.embedding_precision, *(s.embedding_precision for s in manifest.segments)})
    checked = " and SHA-256, the corpora's passages included" if verified else " (--verify: their contents too)"
    rerank = manifest.exact_rerank or "off"
    lines = [
        f"{folder}: {manifest.spec} index of {holds}, {len(manifest.segments)} corpus segment(s), {size}",
        f"encoder: {encoder.source or 'not recorded'} ({manifest.encoder_fingerprint[:12]}), passages {written}, "
        + f"embedded in {' and '.join(precisions)}",
        f"generation {manifest.generation}; exact re-rank: {rerank}; compaction: {compaction_due or 'no'}",
        "checked: every file's size and sampled blocks" + checked,
    ]
    return "\n".join(lines)


@_reports_errors
def _evaluate(args: argparse.Namespace) -> int:
    from common.io import write_jsonl
    from retriever.retrieval_eval import evaluate_retrieval, read_retrieval_examples

    examples = read_retrieval_examples(args.data)[: args.max_examples]
    metrics, records = evaluate_retrieval(_load_index(args), examples, ks=args.k, batch_size=args.batch_size)
    if args.out:
        write_jsonl(args.out, records)
    print(json.dumps(metrics, indent=2))
    return 0
