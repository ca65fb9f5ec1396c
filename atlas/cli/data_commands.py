"""`atlas data nq824-to-kilt|kilt-knowledge|split`: put data sets into the forms the recipes read
(the converters are `tasks.convert`'s)."""

# Lazy imports: the handlers import their converter (tasks.convert) when they run, so that `atlas --help`
# and argument errors load nothing they do not need.

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `data` command group to the `atlas` parser."""
    data = subparsers.add_parser("data", help="convert and split data sets for the recipes")
    commands = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    kilt = commands.add_parser(
        "nq824-to-kilt",
        help="nq824 in KILT format (gold paragraphs as provenance) + the knowledge source to index",
        description="Writes OUT/train.jsonl (64 questions), OUT/dev.jsonl (578) in KILT's native format, "
        "each answer's provenance the question's gold paragraph, and OUT/knowledge.jsonl, the "
        "documents for `atlas corpus prepare`, each carrying the wikipedia_id the provenance names.",
    )
    kilt.add_argument(
        "--nq824", default="../shared/data/nq824", help="the nq824 folder (documents.jsonl, train-64.jsonl, dev.jsonl)"
    )
    kilt.add_argument(
        "--distractors",
        nargs="*",
        default=[],
        metavar="JSONL",
        help="more documents {id, title, text} for the knowledge source, each its own page "
        "(e.g. ../shared/data/wikitext2-articles.jsonl)",
    )
    kilt.add_argument("--out", required=True, help="output folder (written atomically)")
    kilt.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    kilt.set_defaults(func=_nq824_to_kilt)

    knowledge = commands.add_parser(
        "kilt-knowledge",
        help="KILT's Wikipedia knowledge source → documents {id, title, text, wikipedia_id} to prepare",
        description="Reads kilt_knowledgesource.json (one page per line, its paragraphs as a list) and "
        "writes one document per page for `atlas corpus prepare` (which chunks it into passages "
        "that keep the page's wikipedia_id, the id KILT's provenance names).",
    )
    knowledge.add_argument("source", help="kilt_knowledgesource.json")
    knowledge.add_argument("--out", required=True, help="output JSONL file (written atomically)")
    knowledge.set_defaults(func=_kilt_knowledge)

    split = commands.add_parser(
        "split",
        help="split one JSONL file into disjoint train.jsonl / dev.jsonl",
        description="A seeded sample of --train records goes to OUT/train.jsonl, every other record to "
        "OUT/dev.jsonl (both in file order), so that a recipe never evaluates on what it trained on.",
    )
    split.add_argument("input", help="a JSON-lines file")
    split.add_argument("--train", type=int, required=True, help="records for training (e.g. 64)")
    split.add_argument("--seed", type=int, default=0, help="the sample's seed")
    split.add_argument(
        "--prefix",
        default="",
        help="file name prefix: PREFIXtrain.jsonl, PREFIXdev.jsonl (e.g. hotpotqa-: KILT reads "
        "the dataset from the name)",
    )
    split.add_argument("--out", required=True, help="output folder (written atomically)")
    split.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    split.set_defaults(func=_split)


def _nq824_to_kilt(args: argparse.Namespace) -> int:
    from tasks.convert import nq824_to_kilt

    done = nq824_to_kilt(args.nq824, args.out, distractors=args.distractors, overwrite=args.overwrite)
    print(
        f"train {done.train}  dev {done.dev}  knowledge documents {done.gold_documents} gold + "
        f"{done.distractor_documents} distractors  → {done.out}"
    )
    return 0


def _kilt_knowledge(args: argparse.Namespace) -> int:
    from tasks.convert import write_kilt_knowledge

    print(f"pages {write_kilt_knowledge(args.source, args.out)}  → {args.out}")
    return 0


def _split(args: argparse.Namespace) -> int:
    from tasks.convert import split_file

    train, dev = split_file(
        args.input, args.out, train=args.train, seed=args.seed, prefix=args.prefix, overwrite=args.overwrite
    )
    print(f"train {train}  dev {dev}  → {args.out}")
    return 0
