"""`pipeoffload compare`: every schedule side by side, with a Pareto plot of memory vs bubble
(PNG) or an interactive page of the plot and every schedule's timeline (HTML)."""

from __future__ import annotations


import argparse

from ..costs import MemoryDeltas
from ..errors import ParameterError
from ..studies.compare import Comparison, compare
from ..studies.defaults import COMPARE_OFFLOAD_TIME
from .common import (add_ranks_arg, 
    add_costs_args,
    add_html_arg,
    check_output,
    cli_text,
    costs_from_args,
    memory_from_args,
    memory_unit,
    print_json,
    write_output,
)


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compare",
        help="compare every schedule: bubble rate, peak memory, P2P volume; Pareto plot",
        description="Generate and time every registered schedule (group-interleaved with g=ceil(p/2) and g=p, "
        "interleaved 1F1B with v=2, zb-auto with limits p and 2p, and PipeOffload's PO-half, PO-full and selective "
        "offload of C chunks on group-interleaved) at the same p, m, costs and memory; report "
        "bubble rate, peak activation memory (max and per rank) and P2P volume relative to 1F1B's 2(p-1)m "
        "messages, and mark the Pareto frontier of (peak memory, bubble rate). Schedules that refuse the "
        "parameters are listed with the reason.",
    )
    add_ranks_arg(parser)
    parser.add_argument("-m", "--microbatches", dest="m", type=int, default=8, help="microbatches (default 8)")
    add_costs_args(parser)
    parser.add_argument("--offload-time", type=float, default=COMPARE_OFFLOAD_TIME, metavar="R",
                        help="offload rows (PO-half, PO-full, selective C): one-way transfer time of a chunk's "
                             "activations over its F+B+W (default 0.5, i.e. k = 1)")
    parser.add_argument("--no-offload-rows", action="store_true", help="compare the plain schedules only")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--png", metavar="FILE", help="write a PNG plot of peak memory vs bubble rate")
    add_html_arg(parser, "the comparison (Pareto plot, table, every schedule's timeline)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    check_output("--png", args.png)
    check_output("--html", args.html)
    unit = memory_unit(args)
    if not args.offload_time >= 0:
        raise ParameterError("--offload-time", f"must be a number >= 0, got {args.offload_time!r}")
    from ..studies.compare import candidates

    memory = memory_from_args(args)
    which = candidates(args.p, memory or MemoryDeltas(), offload=not args.no_offload_rows)
    cmp = compare(args.p, args.m, costs_from_args(args), memory, which=which, offload_time=args.offload_time)
    for row in cmp.rows:  # a refused schedule's reason, with parameters named by their flags
        if row.error:
            row.error = cli_text(row.error)
    if args.png:
        from ..viz.pareto import draw_pareto

        write_output("--png", args.png, lambda path: draw_pareto(cmp, path, memory_unit=unit))
    if args.html:
        from ..viz.html import write_compare_html

        write_output("--html", args.html, lambda path: write_compare_html(cmp, path, memory_unit=unit))
    if args.json:
        print_json({**cmp.to_json(), "memory_unit": unit})
    else:
        print(report_text(cmp, unit))
        for path in (args.png, args.html):
            if path:
                print(f"wrote {path}")
    return 0


def report_text(cmp: Comparison, unit: str) -> str:
    """The comparison as a fixed-width table; '*' marks the Pareto frontier."""
    c = cmp.costs
    lines = [
        f"compare: p={cmp.p} m={cmp.m}  costs F={c.F:g} B={c.B:g} W={c.W:g} comm={c.comm:g}"
        + (" (per-stage overrides)" if c.rank_costs or c.group_costs else "")
        + f"  memory unit: {unit}",
        f"P2P relative to 1F1B's 2(p-1)m = {cmp.p2p_baseline} messages; * = Pareto frontier (peak memory, bubble)",
    ]
    width = max(len(r.label) for r in cmp.rows) if cmp.rows else 8
    head = f"  {'schedule':<{width}}  {'bubble':>7}  {'peak':>7}  {'P2P':>5}  per-rank peak"
    lines += [head, "  " + "-" * (len(head) - 2)]
    for r in cmp.rows:
        if not r.ok:
            lines.append(f"  {r.label:<{width}}  {r.error}")
            continue
        p2p = f"{r.p2p_relative:.2f}" if r.p2p_relative is not None else "-"
        per = ", ".join(f"{x:.4g}" for x in r.peak_memory_per_rank or [])
        mark = "*" if r.on_frontier else " "
        lines.append(f"{mark} {r.label:<{width}}  {r.bubble_rate:>7.4f}  {r.peak_memory:>7.4g}  {p2p:>5}  {per}")
    return "\n".join(lines)
