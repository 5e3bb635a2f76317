"""Argument helpers shared by verbs: schedule parameters, costs, memory."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..costs import Costs, MemoryDeltas, load_stage_costs, parse_costs, parse_memory


def add_costs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--costs", default="F=1,B=1,W=1,comm=0", metavar="F=..,B=..,W=..,comm=..",
                   help="op durations per device-stage and comm latency per hop (default: unit costs)")
    p.add_argument("--stage-costs", metavar="FILE",
                   help="JSON: a list of {F,B,W} per rank, or {'layer_groups': [...]} per layer group")
    p.add_argument("--memory", default="F=1,B=0,W=-1", metavar="F=..,B=..,W=..",
                   help="activation memory change per op kind per device-stage (units or bytes; default F=1,B=0,W=-1)")


def add_schedule_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("schedule", help="schedule name (see `pipeoffload schedules`)")
    p.add_argument("-p", "--stages", dest="p", type=int, default=4, help="pipeline ranks (default 4)")
    p.add_argument("-m", "--microbatches", dest="m", type=int, default=8, help="microbatches (default 8)")
    p.add_argument("-v", "--chunks", dest="v", type=int, default=None, help="chunks per rank (schedule default)")
    p.add_argument("-g", "--group", dest="g", type=int, default=None,
                   help="group size for group-interleaved, ceil(p/2)..p (default ceil(p/2))")
    p.add_argument("--mem-limit", type=float, default=None,
                   help="memory limit for zb-auto, in the units of --memory (default p units)")


def costs_from_args(args: argparse.Namespace) -> Costs:
    stage = load_stage_costs(args.stage_costs) if getattr(args, "stage_costs", None) else None
    return parse_costs(args.costs, stage)


def memory_from_args(args: argparse.Namespace) -> MemoryDeltas:
    return parse_memory(args.memory)


def memory_unit(args: argparse.Namespace) -> str:
    m = memory_from_args(args)
    return "units" if (m.F, m.B, m.W) == (1.0, 0.0, -1.0) else "memory"


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
