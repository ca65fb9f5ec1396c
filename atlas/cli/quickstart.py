"""`atlas quickstart`: the whole system end to end on the shipped demo or your own documents."""

from __future__ import annotations

import argparse
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `quickstart` command to the `atlas` parser."""
    quickstart = subparsers.add_parser(
        "quickstart",
        help="index the demo (or --docs), few-shot fine-tune the shipped reader, evaluate, answer, edit facts",
        description="Offline, ~5-10 minutes on 2 CPU cores: prepare a corpus, build the MiniLM index, "
                    "fine-tune the shipped atlas-reader on a few questions, evaluate on held-out ones, "
                    "show answers with evidence, then change facts in the corpus, update the index "
                    "(atlas index remove/add) and report how many answers follow the new text.",
    )
    quickstart.add_argument("--docs", metavar="FILE", help="your documents (JSONL {id, title, text} or DPR TSV) "
                            "instead of the demo encyclopedia")
    quickstart.add_argument("--questions", metavar="FILE", help="QA JSONL {question, answers} about --docs: up to "
                            "64 fine-tune the reader, the rest are held out (default: the demo's questions)")
    quickstart.add_argument("--out", metavar="DIR", help="output folder, must not exist "
                            "(default: runs/quickstart-YYYYmmdd-HHMMSS)")
    quickstart.add_argument("--tiny", action="store_true", help="a ~1-minute run (CI): few shots, steps, questions")
    quickstart.add_argument("--reader", metavar="DIR", help="a reader folder or preset instead of the shipped atlas-reader")
    quickstart.add_argument("--edits", type=int, default=25, metavar="N",
                            help="facts to edit (on distinct passages) at the last step (default 25; 4 with --tiny)")
    quickstart.add_argument("overrides", nargs="*", help="dotted overrides of atlas/demo/quickstart.yaml, "
                            "e.g. training.steps=100")
    quickstart.set_defaults(func=_quickstart)


def _quickstart(args: argparse.Namespace) -> int:
    import logging

    from atlas.demo.quickstart import run_quickstart

    if args.questions and not args.docs:
        raise SystemExit("atlas quickstart: --questions needs --docs (the documents they are about)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = args.out or time.strftime("runs/quickstart-%Y%m%d-%H%M%S")
    print(f"atlas quickstart → {out}")
    run_quickstart(out, docs=args.docs, questions=args.questions, tiny=args.tiny, reader=args.reader,
                   overrides=args.overrides, n_edits=args.edits)
    return 0
