"""`pipeoffload best`: the lowest-bubble schedule that fits a memory budget, over every family,
v, g and offload setting, with the runners-up (:mod:`pipeoffload.studies.best`)."""

from __future__ import annotations

import argparse

from ..studies.best import BestResult, search
from ..studies.defaults import BEST_OFFLOAD
from .common import (add_costs_args, add_ranks_arg, cli_text, costs_from_args, memory_from_args, memory_unit, name_list,
                     print_json)


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "best",
        help="the lowest-bubble schedule that fits a memory budget (every family, v, g, offload)",
        description="Try every registered schedule with every v (up to --max-v) and group size g it accepts, "
        "zb-auto and zb-v at the budget and at their usual limits; a schedule whose peak exceeds --mem-limit is "
        "offloaded (chunks 0..C-1, then also the stash window, B->W) when that makes it fit without lengthening the "
        "iteration. Prints the best fitting schedule and the runners-up.",
    )
    add_ranks_arg(parser)
    parser.add_argument("-m", "--microbatches", dest="m", type=int, default=8, help="microbatches (default 8)")
    add_costs_args(parser)
    parser.add_argument("--mem-limit", type=float, default=None,
                        help="peak activation memory per rank allowed, in the units of --memory (default p)")
    parser.add_argument("--offload-time", type=float, default=BEST_OFFLOAD.offload_time, metavar="X",
                        help="one one-way transfer as a multiple of the chunk's F+B+W (k/2; default 0 = free)")
    parser.add_argument("--link-group", type=int, default=BEST_OFFLOAD.link_group, metavar="N",
                        help="ranks sharing one host link (default 2)")
    parser.add_argument("--no-offload", action="store_true", help="never offload: schedules as generated")
    parser.add_argument("--max-v", type=int, default=4, help="largest v tried for the loop placement (default 4)")
    parser.add_argument("--schedules", default=None, metavar="A,B,..",
                        help="schedules to search (default: all; the same settings `pipeoffload plan` searches)")
    parser.add_argument("--top", type=int, default=10, help="runners-up to list (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    unit = memory_unit(args)
    res = search(args.p, args.m, costs=costs_from_args(args), memory=memory_from_args(args),
                 mem_limit=args.mem_limit, offload_time=args.offload_time, link_group=args.link_group,
                 offload=not args.no_offload, max_v=args.max_v,
                 schedules=name_list(args.schedules) if args.schedules else None)
    for e in res.entries:
        if e.error:
            e.error = cli_text(e.error)
    if args.json:
        print_json({**res.to_json(top=args.top), "memory_unit": unit})
    else:
        print(report_text(res, unit, args.top))
    return 0


def report_text(res: BestResult, unit: str, top: int) -> str:
    """The best setting, then a table of the runners-up."""
    best = res.best
    lines = [f"best: p={res.p} m={res.m} memory limit {res.mem_limit:g} ({unit}); "
             f"{sum(e.fits for e in res.entries)} of {len(res.entries)} settings fit"]
    if best is None:
        lines.append("  nothing fits: raise --mem-limit, or allow offload (--offload-time, without --no-offload)")
    else:
        lines.append(f"  {best.label}: bubble {best.bubble_rate:.4f}, peak {best.peak:g}")
    shown = [e for e in res.entries if e.error is None][:top]
    width = max([len(e.label) for e in shown] + [8])
    head = f"  {'setting':<{width}}  {'bubble':>7}  {'peak':>9}  {'no offload':>10}  fits"
    lines += [head, "  " + "-" * (len(head) - 2)]
    for e in shown:
        lines.append(f"  {e.label:<{width}}  {e.bubble_rate:>7.4f}  {e.peak:>9.4g}  {e.peak_no_offload:>10.4g}  "
                     f"{'yes' if e.fits else 'no'}")
    return "\n".join(lines)
