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
    try:
        json.dump(obj, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `| head`: not an error of ours
        sys.stdout = None  # type: ignore[assignment]


# --- activation offload (PipeOffload) -------------------------------------------------


def add_offload_args(p: argparse.ArgumentParser) -> None:
    """Flags that turn on and tune the offload pass (ALGORITHMS.md §5)."""
    g = p.add_argument_group("activation offload (PipeOffload)")
    g.add_argument("--offload-chunks", type=int, default=None, metavar="C",
                   help="offload chunks 0..C-1 of every rank (earliest, longest-lived first)")
    g.add_argument("--offload", choices=["auto", "none"], default=None,
                   help="auto: choose C for the lowest peak within --offload-tolerance of the makespan")
    g.add_argument("--offload-time", type=float, default=0.0, metavar="X",
                   help="one one-way transfer of a chunk's activations for one microbatch, as a multiple of "
                        "that chunk's F+B+W time (the reference's offload_time = k/2; default 0 = instantaneous)")
    g.add_argument("--offload-tolerance", type=float, default=0.01, metavar="FRAC",
                   help="with --offload auto: allowed makespan increase (default 0.01 = 1%%)")
    g.add_argument("--link-group", type=int, default=2, metavar="N",
                   help="ranks sharing one host link (default 2: ranks 2r and 2r+1)")
    g.add_argument("--solo-factor", type=float, default=0.7, metavar="F",
                   help="transfer time multiplier while the link's other direction is idle (default 0.7)")
    g.add_argument("--offload-infeasible", choices=["error", "skip", "delay"], default=None,
                   help="when a reload cannot finish before its backward: error (default with -C), "
                        "skip that offload (default with auto), or delay the backward")
    g.add_argument("--postpone-warmup", action="store_true",
                   help="start warm-up forwards as late as their consumers allow (shorter lifespans)")


def offload_requested(args: argparse.Namespace) -> bool:
    """True when the command line asks for the offload pass."""
    if getattr(args, "offload", None) == "auto":
        return True
    return getattr(args, "offload_chunks", None) is not None


def offload_options(args: argparse.Namespace) -> dict:
    """Keyword arguments for :func:`pipeoffload.passes.offload.plan_offload` (without comm).

    Raises ParameterError for flags that need offload turned on or contradict each other."""
    from ..errors import ParameterError

    auto = getattr(args, "offload", None) == "auto"
    if getattr(args, "offload", None) == "none" and args.offload_chunks is not None:
        raise ParameterError("--offload", "'none' contradicts --offload-chunks")
    if not offload_requested(args):
        for flag, attr, default in (("--offload-time", "offload_time", 0.0),
                                    ("--offload-infeasible", "offload_infeasible", None),
                                    ("--postpone-warmup", "postpone_warmup", False)):
            if getattr(args, attr, default) != default:
                raise ParameterError(flag, "needs --offload-chunks C or --offload auto")
    return {
        "offload_chunks": args.offload_chunks,
        "auto": auto,
        "offload_time": args.offload_time,
        "link_group": args.link_group,
        "solo_factor": args.solo_factor,
        "tolerance": args.offload_tolerance,
        "on_infeasible": args.offload_infeasible,
        "postpone_warmup": args.postpone_warmup,
    }
