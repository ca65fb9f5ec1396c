"""The `atlas` command line: the parser is built here, one module per command group adds its
subcommands (`register(subparsers)`) and handlers. A front end: may import all of `atlas` and the
lower packages; only `atlas.__main__` imports it.

A handler takes the parsed arguments and returns the exit code. Heavy libraries are imported
inside the handlers so that `atlas --help` stays quick.
"""

# Lazy imports: main() imports the config, the task errors and (quietening them) transformers when a
# command runs, so that building the parser (`atlas --help`, an argument error) loads none of them.

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

# Modules that add subcommands; each has register(subparsers).
COMMAND_MODULES = (
    "atlas.cli.corpus_commands",
    "atlas.cli.data_commands",
    "atlas.cli.index_commands",
    "atlas.cli.run_commands",
    "atlas.cli.knnlm_commands",
    "atlas.cli.quickstart_command",
    "atlas.cli.serve_command",
    "atlas.cli.import_commands",
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


def add_precision_override(parser: argparse.ArgumentParser) -> None:
    """`--precision`, the override `retriever.precision=…` of a command that loads a recipe (quickstart, serve)."""
    from retriever.embedding_precision import EMBEDDING_PRECISIONS  # light: the choices only

    parser.add_argument(
        "--precision",
        choices=EMBEDDING_PRECISIONS,
        default=None,
        help="the precision passages and questions are embedded at (the same as the override "
        "retriever.precision=…): bf16, fp32, or auto: bf16 where the hardware multiplies it natively; default: the "
        "recipe's (auto)",
    )


def _first_undecodable(argv: list[str]) -> str | None:
    """Where an argument is not UTF-8 (Python hands such bytes over as lone surrogates): "argument N is not
    UTF-8: byte 0xFF at byte position P", for the first one; None when all are text."""
    for number, arg in enumerate(argv, start=1):
        for position, char in enumerate(arg):
            if "\udc80" <= char <= "\udcff":
                offset = len(arg[:position].encode("utf-8", "surrogateescape"))
                return f"argument {number} is not UTF-8: byte 0x{ord(char) - 0xDC00:02X} at byte position {offset}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `atlas` console script; returns the process exit code."""
    from atlas.config import ConfigError
    from atlas.quiet import quiet_libraries
    from common.io import InputError
    from common.progress import close_progress_bars

    argv = list(sys.argv[1:] if argv is None else argv)
    undecodable = _first_undecodable(argv)
    if undecodable:
        print(f"atlas: error: {undecodable}", file=sys.stderr)
        return 2
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
    previous = _terminate_as_interrupt()
    try:
        with quiet_libraries(verbose):  # the libraries' own noise; our bars and log lines say what happens
            return int(args.func(args) or 0)
    # ArithmeticError: a training loss that is not finite (atlas.training.loop.NonFiniteLoss)
    except (InputError, ConfigError, ValueError, FileNotFoundError, FileExistsError, ArithmeticError) as e:
        close_progress_bars()  # the error is the last line, not a bar an interrupted loop left open
        print(f"atlas {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        close_progress_bars()
        print(
            f"atlas {args.command}: interrupted; what it finished is kept (an index build or embed continues where "
            "it stopped when run again, a training run with --resume)",
            file=sys.stderr,
        )
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate_as_interrupt():
    """SIGTERM (a job scheduler's stop, `kill`) ends a command as Ctrl-C does: its `finally` blocks run and it
    says so in one line, instead of dying mid-write. → the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)
