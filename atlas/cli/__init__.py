"""The `atlas` command line: the parser is built here, one module per command group adds its
subcommands (`register(subparsers)`) and handlers. A front end: may import all of `atlas` and the
lower packages; only `atlas.__main__` imports it.

A handler takes the parsed arguments and returns the exit code. Heavy libraries are imported
inside the handlers so that `atlas --help` stays quick.
"""

# Lazy imports: main() and quiet_libraries() import the config, the task errors and transformers when a
# command runs, so that building the parser (`atlas --help`, an argument error) loads none of them.

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Modules that add subcommands; each has register(subparsers).
COMMAND_MODULES = (
    "atlas.cli.corpus",
    "atlas.cli.data",
    "atlas.cli.index",
    "atlas.cli.run",
    "atlas.cli.knnlm",
    "atlas.cli.quickstart",
    "atlas.cli.serve",
    "atlas.cli.imports",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="atlas",
        description="Few-shot retrieval-augmented seq2seq: Contriever retriever + FiD T5 reader.",
        epilog="Every command takes --verbose (anywhere on the line): show the libraries' own messages "
        "(transformers' load reports, faiss's CPU probe) that are hidden otherwise.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def quiet_libraries(verbose: bool) -> None:
    """Our own progress bars and log lines say what is happening; unless `verbose`, the libraries'
    per-file progress bars, transformers' load reports (the pooler MiniLM carries and the encoders
    leave unused) and faiss's probe of CPU-specific builds ("No module named
    'faiss.swigfaiss_avx512'", then the generic build loads) are hidden."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if verbose:
        hf_logging.set_verbosity_info()
        logging.getLogger("faiss").setLevel(logging.INFO)
    else:
        hf_logging.set_verbosity_error()
        logging.getLogger("faiss").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `atlas` console script; returns the process exit code."""
    from atlas.config import ConfigError
    from tasks.io import InputError

    argv = list(sys.argv[1:] if argv is None else argv)
    # --verbose is one flag for every command, so it is taken out before the subcommand's parser sees it
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.verbose = verbose
    # dotted overrides may follow options (`atlas evaluate RUN --data F evaluation.batch_size=32`),
    # where argparse has already closed the positional list
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    quiet_libraries(verbose)
    try:
        return int(args.func(args) or 0)
    # ArithmeticError: a training loss that is not finite (atlas.training.loop.NonFiniteLoss)
    except (InputError, ConfigError, ValueError, FileNotFoundError, FileExistsError, ArithmeticError) as e:
        print(f"atlas {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"atlas {args.command}: interrupted", file=sys.stderr)
        return 130
