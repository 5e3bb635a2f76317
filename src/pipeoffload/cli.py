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

#: Verbs in the order --help lists them.
VERBS = ["train", "schedules", "simulate", "compare", "best", "models", "plan", "scale", "bench"]
#: What ``pipeoffload`` with no verb runs: the main job.
DEFAULT_VERB = "train"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipeoffload",
        description="Memory-efficient pipeline parallelism: schedules, simulator, offload planner and runtime.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"pipeoffload {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb in VERBS:
        importlib.import_module(f"pipeoffload.commands.{verb}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        args = parser.parse_args([DEFAULT_VERB])
    try:
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
