"""`pipeoffload schedules`: list the available schedules."""

from __future__ import annotations

import argparse

from ..schedules import SCHEDULES
from .common import print_json


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser("schedules", help="list the available schedules")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.json:
        print_json([
            {"name": i.name, "summary": i.summary, "placement": i.placement, "default_v": i.default_v,
             "split_backward": i.split_backward}
            for i in SCHEDULES.values()
        ])
        return 0
    width = max(map(len, SCHEDULES))
    for i in SCHEDULES.values():
        print(f"{i.name:<{width}}  {i.summary}")
    return 0
