"""`pipeoffload simulate`: generate a schedule, time it, report, draw and export."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..errors import ParameterError
from ..ir import Schedule
from ..passes.issue_policy import paused_gc
from ..passes.lower import validate_and_time
from ..passes.timing import simulate
from ..schedules import ScheduleSpec, build
from ..timeline import Timeline
from .common import (
    add_costs_args,
    add_html_arg,
    add_offload_args,
    add_schedule_args,
    check_output,
    costs_from_args,
    memory_from_args,
    memory_unit,
    offload_options,
    offload_requested,
    offload_warning,
    print_json,
    write_output,
)

#: The files simulate can write: flag, argparse dest.
OUTPUT_FLAGS = (("--png", "png"), ("--trace", "trace"), ("--csv", "csv"), ("--html", "html"))


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "simulate",
        help="generate and time a schedule; report bubble and per-rank peak memory",
        description="Generate SCHEDULE, time it with the given costs, and report makespan, bubble rate "
        "and per-rank peak activation memory. Optional PNG timeline, Chrome trace, PyTorch CSV, text grid.",
    )
    add_schedule_args(parser)
    for a in parser._actions:  # the name is optional when --from-csv gives the schedule
        if a.dest == "schedule":
            a.nargs, a.default, a.help = "?", None, a.help + "; or give --from-csv FILE"
    parser.add_argument("--from-csv", metavar="FILE",
                        help="simulate a torch.distributed.pipelining schedule CSV (one row of actions per rank) "
                             "instead of generating one; p, m, v and the placement come from the file")
    add_costs_args(parser)
    add_model_args(parser)
    add_offload_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--ops", action="store_true",
                        help="with --json: include every op's start/end and memory curves")
    parser.add_argument("--png", metavar="FILE", help="write a PNG timeline with memory curves")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    parser.add_argument("--csv", metavar="FILE", help="write the schedule as torch.distributed.pipelining CSV")
    add_html_arg(parser, "the timeline")
    parser.add_argument("--text", action="store_true", help="print a compact text grid of the timeline")
    g = parser.add_argument_group("the exact scheduler (SCHEDULE = optimal; needs pipeoffload[solver])")
    g.add_argument("--placement", choices=["loop", "v"], default=None,
                   help="layer-group placement for `optimal` (default loop; v: the V placement, v = 2)")
    g.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="seconds the solver may search (default 60); it reports the gap when not proven")
    parser.set_defaults(func=run)
    return parser


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("costs from the cost model (instead of --costs/--memory)")
    g.add_argument("--model", metavar="NAME|FILE",
                   help="model preset (see `pipeoffload models`) or TOML/JSON file: per-layer-group F/B/W "
                        "times (ms), activation bytes, comm latency and offload transfer times")
    g.add_argument("--hardware", metavar="NAME|FILE", default=None,
                   help="hardware profile for --model (a100-80g, h100-80g, h200 or a file; default a100-80g)")
    g.add_argument("--trim-edges", action="store_true",
                   help="with --model: one layer fewer on the first and last layer groups (embedding/head)")


def model_costs(args: argparse.Namespace, name: str):
    """``(Costs, MemoryDeltas, transfer_times)`` from --model/--hardware, or None without --model."""
    if not getattr(args, "model", None):
        if getattr(args, "hardware", None) or getattr(args, "trim_edges", False):
            raise ParameterError("--hardware", "needs --model NAME|FILE")
        return None
    from ..costmodel.model import pipeline_costs
    from ..costmodel.hardware import get_hardware
    from ..costmodel.presets import get_model
    from ..schedules import info

    model = get_model(args.model)
    hw = get_hardware(args.hardware or "a100-80g")
    v = args.v if args.v is not None else info(name).default_v
    pc = pipeline_costs(model, hw, args.p, v, trim_edges=args.trim_edges)
    return pc.costs, pc.memory, [g.offload_ms for g in pc.groups]


def spec_from_args(args: argparse.Namespace, name: str | None = None) -> ScheduleSpec:
    name = name or args.schedule
    derived = model_costs(args, name)
    if derived is not None:
        costs, memory, _ = derived
    else:
        costs, memory = costs_from_args(args), memory_from_args(args)
    return ScheduleSpec(name, args.p, args.m, v=args.v, g=args.g,
                        mem_limit=args.mem_limit, costs=costs, memory=memory)


def timeline_json(tl: Timeline, include_ops: bool) -> dict:
    out = tl.summary()
    if include_ops:
        out["ops"] = [  # by (rank, start), ties in event order; no TimedOp made (Timeline.event_rows)
            {"rank": op.rank, "kind": op.kind.value, "stage": op.stage, "chunk": op.chunk,
             "microbatch": op.microbatch, "stream": stream, "start": start, "end": end, "mem": mem}
            for op, start, end, stream, mem in tl.event_rows(sort=True)
        ]
        out["memory_curves"] = tl.memory_curves()
    return out


def schedule_from_args(args: argparse.Namespace) -> tuple[ScheduleSpec, Schedule]:
    """The spec (costs, memory) and the schedule: generated from its name, or read with
    ``--from-csv`` (a malformed file is a ParameterError naming it, the row and column)."""
    csv_path = getattr(args, "from_csv", None)
    if csv_path is None:
        if args.schedule is None:
            raise ParameterError("schedule", "missing; give a schedule name (see `pipeoffload schedules`) "
                                 "or --from-csv FILE")
        spec = spec_from_args(args)
        return spec, build(spec, check=False)  # run() validates it with the timing (validate_and_time)
    if args.schedule is not None:
        raise ParameterError("--from-csv", f"give a schedule name ({args.schedule!r}) or --from-csv FILE, not both")
    from ..interop.torch_csv import read_csv

    try:
        sched = read_csv(csv_path, name=Path(csv_path).stem)
    except ParameterError as e:  # about the file, whatever the reader calls it
        raise ParameterError("--from-csv", e.message) from None
    # The file fixes p, m and v (what --model's per-group costs are computed for).
    args.p, args.m, args.v, args.g = sched.num_ranks, sched.num_microbatches, sched.chunks, None
    return spec_from_args(args, sched.name), sched


def run(args: argparse.Namespace) -> int:
    """`pipeoffload simulate`, with the cyclic collector paused
    (:func:`~pipeoffload.passes.issue_policy.paused_gc`): a generator and the passes at
    p = 128, m = 4096 allocate millions of tuples, ints and floats that hold no cycle, and
    the collector's repeated passes over them cost as much as the work itself (ZB-V: 2.7 of
    5.2 s of generation, docs/algorithms.md §9.3)."""
    with paused_gc():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    for flag, dest in OUTPUT_FLAGS:
        check_output(flag, getattr(args, dest))
    if args.schedule == "optimal":
        return run_optimal(args)
    if args.placement is not None:
        raise ParameterError("--placement", "applies to `optimal` only; other schedules fix their placement")
    spec, sched = schedule_from_args(args)
    derived = model_costs(args, spec.name)
    unit = "bytes" if derived is not None else memory_unit(args)
    opts = offload_options(args)
    if derived is not None and not getattr(args, "offload_time", None):
        # One-way transfer of each layer group's activations over the host link.
        opts = dataclasses.replace(opts, transfer_times=tuple(derived[2]))
    if getattr(args, "from_csv", None):  # read_csv validated it
        tl = simulate(sched, spec.costs, spec.memory, memory_unit=unit)
    else:  # generated unchecked: validated here, the deadlock proof and the timing one run
        tl = validate_and_time(sched, spec.costs, spec.memory, memory_unit=unit)
    off = None
    if offload_requested(args):
        from ..passes.offload import plan_offload

        off = plan_offload(sched, tl, comm=spec.costs.comm, options=opts)
        sched, tl = off.schedule, off.timeline
    outputs(args, sched, tl)
    if args.json:
        print_json(report_json(args, sched, tl, unit, off))
    else:
        print(report_text(sched.name, tl))
        if off is not None:
            print(offload_text(off))
        if args.text:
            from ..viz.text import render_grid

            print(render_grid(tl))
    warning = offload_warning(off) if off is not None else None
    if warning:
        print(f"pipeoffload simulate: warning: {warning}", file=sys.stderr)
    return 0


def run_optimal(args: argparse.Namespace) -> int:
    """`simulate optimal`: the exact scheduler (:func:`pipeoffload.solver.solve`)."""
    from ..solver import SolverOffload, solve

    if getattr(args, "from_csv", None) or getattr(args, "model", None):
        raise ParameterError("schedule", "`optimal` takes --costs/--memory, not --from-csv or --model")
    auto = getattr(args, "offload", None) == "auto"
    if auto and args.offload_chunks is not None:
        raise ParameterError("--offload", "`optimal --offload auto` may offload any chunk; give auto or "
                             "--offload-chunks C, not both")
    offload_options(args)  # checks the offload flags
    offload = None
    if auto or args.offload_chunks is not None:
        # auto: every chunk may go (the solver picks which activations, when each copy starts and returns)
        chunks = 2 if args.placement == "v" else (args.v or 1)
        offload = SolverOffload(chunks if auto else args.offload_chunks, args.offload_time, args.link_group)
    costs, memory = costs_from_args(args), memory_from_args(args)
    res = solve(args.p, args.m, v=args.v, placement=args.placement or "loop", costs=costs, memory=memory,
                mem_limit=args.mem_limit, time_limit=args.time_limit, offload=offload)
    sched, tl = res.schedule, res.timeline
    outputs(args, sched, tl)
    unit = memory_unit(args)
    if args.json:
        obj = report_json(args, sched, tl, unit, res.offload)
        obj["solver"] = res.summary()
        print_json(obj)
    else:
        print(report_text(sched.name, tl))
        print(solver_text(res))
        if res.offload is not None:
            print(offload_text(res.offload))
        if args.text:
            from ..viz.text import render_grid

            print(render_grid(tl))
    return 0


def solver_text(res) -> str:
    """One line: proven optimal, or the gap to the solver's bound."""
    if res.optimal:
        return f"  solver      optimal (proven) in {res.wall_s:.1f} s; memory limit {res.params['mem_limit']:g}"
    return (f"  solver      best found in {res.wall_s:.1f} s, not proven: span within {res.gap:.2%} of the bound "
            f"(no schedule has a bubble rate below {res.bubble_bound:.4f}); memory limit {res.params['mem_limit']:g}")


def report_json(args: argparse.Namespace, sched: Schedule, tl: Timeline, unit: str, off) -> dict:
    """The ``--json`` report; ``off`` is the offload pass's result or None."""
    obj = {
        "schedule": sched.name,
        "stages": sched.num_ranks,
        "microbatches": sched.num_microbatches,
        "chunks": sched.chunks,
        "group": sched.params.get("g"),
        "memory_unit": unit,
        **timeline_json(tl, args.ops),
    }
    obj["peak_memory_max"] = max(obj["peak_memory"])
    if off is not None:
        obj["peak_memory_no_offload"] = off.peak_no_offload
        obj["host_memory"] = off.host_memory
        obj["offloaded_chunks"] = off.offloaded_chunks
        obj["offload"] = off.summary()
    return obj


def outputs(args: argparse.Namespace, sched: Schedule, tl: Timeline) -> None:
    """Write the PNG / trace / CSV files requested on the command line (a path that
    cannot be written is a ParameterError naming its flag and the path)."""
    if args.png:
        from ..viz.png import draw_timeline

        write_output("--png", args.png, lambda path: draw_timeline(tl, path))
    if args.trace:
        from ..viz.trace import write_trace

        write_output("--trace", args.trace, lambda path: write_trace(tl, path))
    if args.csv:
        from ..interop.torch_csv import write_csv

        write_output("--csv", args.csv, lambda path: write_csv(sched, path, param="--csv"))
    if args.html:
        from ..viz.html import write_timeline_html

        write_output("--html", args.html, lambda path: write_timeline_html(tl, path))


def report_text(name: str, tl: Timeline) -> str:
    peaks = tl.peak_memory()
    lines = [
        f"schedule {name}: p={tl.num_ranks} m={tl.num_microbatches} v={tl.chunks}",
        f"  makespan    {tl.makespan:.6g}",
        f"  bubble rate {tl.bubble_rate:.4f}",
        f"  peak memory ({tl.memory_unit}) per rank: " + ", ".join(f"{x:.6g}" for x in peaks),
    ]
    return "\n".join(lines)


def offload_text(off) -> str:
    """Report lines for an offload plan (:class:`~pipeoffload.passes.offload.OffloadResult`)."""
    unit = off.timeline.memory_unit
    skipped = ", ".join(f"{n} {why}" for why, n in off.skipped.items()) or "none"
    inc = off.makespan / off.makespan_no_offload - 1.0 if off.makespan_no_offload > 0 else 0.0
    how = "auto" if off.settings.get("auto") else "requested"
    which = {0: "nothing", 1: "chunk 0"}.get(off.offloaded_chunks, f"chunks 0..{off.offloaded_chunks - 1}")
    lines = [
        f"  offload     {which} of every rank ({how}, C={off.offloaded_chunks}, "
        + (f"transfer = {off.settings['offload_time']:g} x F+B+W)" if off.settings.get("offload_time") is not None
           else "absolute transfer times)"),
        f"  transfers   {len(off.transfers)} offload+reload pairs; skipped: {skipped}; "
        f"delayed backwards: {off.delayed}; makespan {inc:+.2%}",
        f"  peak memory without offload ({unit}): " + ", ".join(f"{x:.6g}" for x in off.peak_no_offload),
        f"  host memory ({unit}) per rank: " + ", ".join(f"{x:.6g}" for x in off.host_memory),
    ]
    return "\n".join(lines)
