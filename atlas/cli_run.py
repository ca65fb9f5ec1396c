"""`atlas train|evaluate|ask|score|quickstart`: the jobs that run the whole model."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the model-running commands to the `atlas` parser."""
    train = subparsers.add_parser("train", help="train reader + retriever from a YAML recipe")
    train.add_argument("config", nargs="?", help="a YAML recipe from configs/")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.lr=4e-5")
    train.add_argument("--resume", metavar="DIR", help="continue a run from its output folder")
    train.set_defaults(func=_not_built("train"))

    evaluate = subparsers.add_parser("evaluate", help="generate and score on a data file")
    evaluate.add_argument("checkpoint")
    evaluate.set_defaults(func=_not_built("evaluate"))

    ask = subparsers.add_parser("ask", help="answer one question and show the evidence")
    ask.add_argument("checkpoint")
    ask.add_argument("question")
    ask.set_defaults(func=_not_built("ask"))

    quickstart = subparsers.add_parser("quickstart", help="the end-to-end demo on shipped data")
    quickstart.set_defaults(func=_not_built("quickstart"))


def _not_built(name: str):
    def handler(args: argparse.Namespace) -> int:
        print(f"atlas {name}: not built yet in this version", file=sys.stderr)
        return 2

    return handler
