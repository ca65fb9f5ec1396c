"""`atlas quickstart`: the whole system end to end on the shipped demo or your own documents."""

# Lazy imports: the handler imports atlas.demo.quickstart (torch, transformers, faiss) when it runs, so that
# `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import logging
import time

from atlas.cli import add_precision_override


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `quickstart` command to the `atlas` parser."""
    quickstart = subparsers.add_parser(
        "quickstart",
        help="index the demo (or --docs), few-shot fine-tune the shipped reader, evaluate, answer, edit facts",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Offline, on CPU: prepare a corpus, build the MiniLM index, evaluate the shipped "
        "atlas-reader on dev questions, fine-tune it on training questions, evaluate again, show "
        "answers with their evidence, then change facts in the corpus, update the index (as "
        "`atlas index update` does) and report how many answers follow the new text. The demo takes "
        "about 2 min on 2 idle CPU cores. Everything lands in --out: report.md to read, report.json with "
        "every number. A quickstart that stopped resumes when run again with the same arguments.",
    )
    quickstart.add_argument(
        "--docs",
        metavar="FILE",
        help="your documents (JSONL {id, title, text} or DPR TSV) instead of the demo encyclopedia",
    )
    quickstart.add_argument("--train", metavar="FILE", help="QA JSONL {question, answers} about --docs to fine-tune on")
    quickstart.add_argument(
        "--dev",
        metavar="FILE",
        help="QA JSONL {question, answers} about --docs to evaluate on "
        "(and whose facts are edited); must share no question with --train",
    )
    quickstart.add_argument(
        "--questions",
        metavar="FILE",
        help="one QA JSONL to split in two instead of --train/--dev "
        "(seeded: up to 64, at most half, to fine-tune on; the rest dev; the split is printed "
        "and written to the report)",
    )
    quickstart.add_argument(
        "--shots",
        type=int,
        metavar="N",
        help="training questions to fine-tune on (default: all of them, up to 256; 16 with --tiny)",
    )
    quickstart.add_argument(
        "--out",
        metavar="DIR",
        help="output folder (default: runs/quickstart-YYYYmmdd-HHMMSS); one a stopped quickstart left is resumed",
    )
    quickstart.add_argument(
        "--overwrite", action="store_true", help="delete --out first (a finished quickstart, or another one's)"
    )
    quickstart.add_argument(
        "--tiny",
        action="store_true",
        help="a small run (what CI runs): 16 shots, 6 steps, 8 dev questions, 4 edits",
    )
    quickstart.add_argument(
        "--reader", metavar="DIR", help="a reader folder or preset instead of the shipped atlas-reader"
    )
    quickstart.add_argument(
        "--edits",
        type=int,
        default=None,
        metavar="N",
        help="edit at most N facts at the last step (default: every eligible fact, so that the rate of answers "
        "that follow the new text is over all of them; 4 with --tiny)",
    )
    quickstart.add_argument(
        "overrides", nargs="*", help="dotted overrides of atlas/demo/quickstart.yaml, e.g. training.steps=100"
    )
    add_precision_override(quickstart)
    quickstart.set_defaults(func=_quickstart)


def _quickstart(args: argparse.Namespace) -> int:
    from atlas.demo.quickstart import run_quickstart

    if (args.questions or args.train or args.dev) and not args.docs:
        raise SystemExit("atlas quickstart: --train/--dev/--questions need --docs (the documents they are about)")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    out = args.out or time.strftime("runs/quickstart-%Y%m%d-%H%M%S")
    print(f"atlas quickstart → {out}")
    run_quickstart(
        out,
        docs=args.docs,
        questions=args.questions,
        train=args.train,
        dev=args.dev,
        shots=args.shots,
        tiny=args.tiny,
        reader=args.reader,
        overrides=[*args.overrides, *([f"retriever.precision={args.precision}"] if args.precision else [])],
        n_edits=args.edits,
        overwrite=args.overwrite,
    )
    return 0
