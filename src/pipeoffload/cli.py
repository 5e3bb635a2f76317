"""The ``pipeoffload`` command line: one entry point, one module per verb.

Each verb lives in ``pipeoffload.commands.<verb>`` and exposes
``register(subparsers) -> argparse.ArgumentParser`` (setting ``func``).
Errors caused by input exit with status 2 and one line naming the flag
(library parameters are named by their flags: ``commands.common.CLI_FLAGS``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands.common import cli_message
from .errors import PipeoffloadError
from .native import c_engine

#: Verbs in the order --help lists them.
VERBS = ["train", "schedules", "simulate", "compare", "best", "models", "plan", "scale", "bench"]
#: What ``pipeoffload`` with no verb runs: the main job.
DEFAULT_VERB = "train"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _named_verb(argv: list[str]) -> str | None:
    """The verb ``argv`` starts with, or None (no verb, a misspelt one, or an option before it:
    ``-h``/``--version`` then see every verb)."""
    return argv[0] if argv and argv[0] in VERBS else None


def build_parser(verbs: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser with the sub-parsers of ``verbs`` (default: all of :data:`VERBS`).

    Each verb's module is imported only here: a command line that names its verb builds that one
    alone (:func:`main`), so ``pipeoffload plan`` does not import the runtime's, the studies' and
    the benchmarks' command modules (0.05 s of its start-up)."""
    parser = _Parser(
        prog="pipeoffload",
        description="Memory-efficient pipeline parallelism: schedules, simulator, offload planner and runtime.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"pipeoffload {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb in VERBS if verbs is None else verbs:
        importlib.import_module(f"pipeoffload.commands.{verb}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = _named_verb(argv)
    # Why: the other verbs' parsers cannot change how a named verb's arguments parse (each
    # sub-parser parses the words after its verb alone); --help and errors that list the verbs
    # get them all.
    parser = build_parser(None if verb is None else [verb])
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        args = parser.parse_args([DEFAULT_VERB])
    try:
        c_engine()  # a bad PIPEOFFLOAD_ENGINE is named here, as any bad input
        rc = args.func(args)
    except PipeoffloadError as e:
        print(f"pipeoffload {args.verb}: error: {cli_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
