"""`atlas corpus prepare|info`: turn documents into a prepared, memory-mapped passage corpus."""

# Lazy imports: the handlers import retriever.corpus (pyarrow, datasets) when they run, so that `atlas --help`
# and argument errors answer at once.

from __future__ import annotations

import argparse
import json

from atlas.cli.index_commands import DefaultsFormatter


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `corpus` command group to the `atlas` parser."""
    corpus = subparsers.add_parser(
        "corpus", help="prepare a passage corpus from documents", formatter_class=DefaultsFormatter
    )
    commands = corpus.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)

    prepare = commands.add_parser(
        "prepare",
        help="read JSONL / DPR TSV / datasets folders, chunk, write a memory-mapped corpus",
        description="Read JSONL / DPR TSV / datasets folders, chunk each document into passages "
        "named DOCID-0, DOCID-1, ... (DOCID itself with --chunk-words 0), and write a "
        "memory-mapped corpus folder.",
        formatter_class=DefaultsFormatter,
    )
    prepare.add_argument("inputs", nargs="+", metavar="INPUT", help="JSONL, .tsv or dataset folder")
    prepare.add_argument("--out", required=True, help="output folder (written atomically)")
    prepare.add_argument(
        "--chunk-words", type=int, default=100, help="words per passage (0: no chunking: one passage per document)"
    )
    prepare.add_argument(
        "--stride",
        type=int,
        default=None,
        help="words between passage starts, 1..chunk-words (default: chunk-words, no overlap; "
        "e.g. 50 with --chunk-words 100 overlaps passages by 50 words)",
    )
    prepare.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip and count bad records (and empty input files, with a warning) instead of failing",
    )
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    prepare.set_defaults(func=_prepare)

    info = commands.add_parser("info", help="print a prepared corpus's manifest", formatter_class=DefaultsFormatter)
    info.add_argument("corpus", help="a folder made by `atlas corpus prepare`")
    info.set_defaults(func=_info)


def _prepare(args: argparse.Namespace) -> int:
    from retriever.corpus import prepare_corpus

    stats = prepare_corpus(
        args.inputs,
        args.out,
        chunk_words=args.chunk_words,
        stride=args.stride,
        skip_invalid=args.skip_invalid,
        overwrite=args.overwrite,
    )
    print(
        f"documents {stats.documents}  passages {stats.passages}  words {stats.words}  "
        f"skipped {stats.skipped}  → {args.out}"
    )
    for reason in stats.skipped_reasons:
        print(f"  skipped: {reason}")
    for path in stats.skipped_files:
        print(f"  skipped empty input: {path}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from retriever.corpus import Corpus

    corpus = Corpus.load(args.corpus)
    print(json.dumps(corpus.manifest.to_json(), indent=2))
    return 0
