"""`pipeoffload plan`: search schedules, offload, recompute and PP×TP×DP splits under a memory budget.

    pipeoffload plan --model NAME|FILE --hardware NAME|FILE --gpus N [--memory-budget GIB]
                     [--seq S] [--global-batch B] [--microbatch-size b] [--json] [--png FILE] [--emit-config FILE.toml]

Prints a ranked table of the configurations that fit and, for every schedule family that does not,
why. Exit status 2 with one error line when nothing fits (the reasons are printed first).
"""

from __future__ import annotations

import argparse
import sys

from ..costmodel.hardware import GiB, HARDWARE
from ..errors import ParameterError
from ..recompute import RECOMPUTE_LEVELS, Recompute
from .common import check_output, int_list, name_list, print_json, write_output


#: --recompute choices → PlanOptions.recompute.
_RECOMPUTE = {"all": RECOMPUTE_LEVELS, "both": (Recompute.NONE, Recompute.ELEMENTWISE), "off": (Recompute.NONE,),
              "on": (Recompute.ELEMENTWISE,), "selective": (Recompute.SELECTIVE,), "full": (Recompute.FULL,)}


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "plan",
        help="search schedule x offload x recompute x PP/TP/DP splits under a per-device memory budget",
        description="Search pipeline schedules (and their chunks v and group size g), activation offload "
        "(chunks offloaded), recompute of cheap elementwise ops and the PP x TP x DP splits of N GPUs; "
        "print the configurations that fit the memory budget, ranked by predicted iteration time, with "
        "their per-device memory breakdown, MFU and bubble rate, and why every other schedule family failed. "
        "docs/planner.md explains the model.",
    )
    parser.add_argument("--model", required=True, metavar="NAME|FILE", help="model preset or .toml/.json model file")
    parser.add_argument("--hardware", default="a100-80g", metavar="NAME|FILE",
                        help=f"hardware profile ({', '.join(HARDWARE)}) or a .toml/.json file (default a100-80g)")
    parser.add_argument("--gpus", type=int, required=True, metavar="N", help="number of GPUs (nodes of 8)")
    parser.add_argument("--memory-budget", type=float, default=None, metavar="GIB",
                        help="device memory budget in GiB (2^30 bytes; default: the hardware's HBM minus its "
                             "reserve for CUDA context, NCCL buffers and fragmentation, 2 GiB + 5%%)")
    parser.add_argument("--seq", type=int, default=None, metavar="S", help="sequence length (default: the model's)")
    parser.add_argument("--global-batch", type=int, default=None, metavar="B",
                        help="sequences per iteration (default 4 x GPUs x microbatch size)")
    parser.add_argument("--microbatch-size", type=int, default=None, metavar="b",
                        help="sequences per microbatch (default: the model's)")
    parser.add_argument("--schedules", default=None, metavar="A,B,..",
                        help="schedules to search (default: all; zb-auto runs with 1x and 2x 1F1B's memory)")
    parser.add_argument("--chunks", default="2,3,4", metavar="V,..",
                        help="chunk counts v for interleaved schedules (default 2,3,4; p·v may be layers + 2: "
                             "edge chunks then hold the embedding or the head alone)")
    parser.add_argument("--recompute", choices=list(_RECOMPUTE), default="all",
                        help="recompute to search: all (none, elementwise ops, selective = those and the core "
                             "attention, full layer; default), both (none and elementwise), or one of "
                             "off, on (elementwise), selective, full")
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--no-distributed-optimizer", action="store_true",
                       help="every DP replica keeps all optimizer state (18 B/param; default: Megatron's "
                            "distributed optimizer, ZeRO-1, 6 + 12/DP B/param)")
    state.add_argument("--fsdp", action="store_true",
                       help="shard parameters, gradients and optimizer state over DP (ZeRO-3/FSDP, 18/DP B/param)")
    parser.add_argument("--sequence-parallel", choices=["on", "off", "both"], default="on",
                        help="TP with Megatron's sequence parallelism (on, default), without it (off: the "
                             "norms' tensors stay whole on every TP rank, as in this runtime's TP), or both")
    parser.add_argument("--host-link-gbs", type=float, default=None, metavar="GB/S",
                        help="host link of one GPU alone, one direction (default: the hardware profile's)")
    parser.add_argument("--no-offload", action="store_true", help="do not consider activation offload")
    parser.add_argument("--po-runtime", action="store_true",
                        help="PipeOffload's runtime setting for the model: flash attention, no dropout")
    parser.add_argument("--top", type=int, default=10, metavar="K", help="configurations to show (default 10)")
    parser.add_argument("--tp-link-gbs", type=float, default=None, metavar="GB/S",
                        help="all-reduce bus bandwidth of TP collectives inside a node (default: the hardware "
                             "profile's, A100 230)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="processes for the search: 1 alone, N with N-1 helper processes that time "
                             "candidates ahead (Linux); the same result for every N (default: 2 where two "
                             "CPUs are free, else 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--png", metavar="FILE", help="write the best plan's timeline with memory curves as PNG")
    parser.add_argument("--emit-config", metavar="FILE.toml",
                        help="write the best configuration as a `pipeoffload train --config` file, with the "
                             "planner's prediction in its [plan] section")
    parser.set_defaults(func=run)
    return parser


def options_from_args(args: argparse.Namespace):
    from ..planner import DEFAULT_SCHEDULES, PlanOptions

    rc = _RECOMPUTE[args.recompute]
    if args.host_link_gbs is not None and not args.host_link_gbs > 0:
        raise ParameterError("--host-link-gbs", f"must be a positive number of GB/s, got {args.host_link_gbs!r}")
    return PlanOptions(
        dp_sharding="none" if args.no_distributed_optimizer else "full" if args.fsdp else "optimizer",
        host_bw=args.host_link_gbs * 1e9 if args.host_link_gbs is not None else None,
        sequence_parallel={"on": (True,), "off": (False,), "both": (True, False)}[args.sequence_parallel],
        schedules=name_list(args.schedules) if args.schedules else DEFAULT_SCHEDULES,
        chunks=int_list(args.chunks, "--chunks"),
        recompute=rc,
        offload=not args.no_offload,
        top=args.top,
        po_runtime=args.po_runtime,
        tp_bw=args.tp_link_gbs * 1e9 if args.tp_link_gbs is not None else None,
    )


def _workers(n: int | None) -> int | None:
    """``--workers`` checked here, so that its error names the flag."""
    from ..planner.workers import resolve_workers

    try:
        return resolve_workers(n)
    except ParameterError as e:
        raise ParameterError("--workers", e.message) from None


def run(args: argparse.Namespace) -> int:
    from ..planner import plan

    check_output("--png", args.png)
    check_output("--emit-config", args.emit_config)
    if args.memory_budget is not None and not args.memory_budget > 0:
        raise ParameterError("--memory-budget", f"must be a positive number of GiB, got {args.memory_budget!r}")
    res = plan(
        args.model, args.hardware, args.gpus,
        memory_budget=args.memory_budget * GiB if args.memory_budget is not None else None,
        global_batch=args.global_batch, microbatch=args.microbatch_size, seq=args.seq,
        options=options_from_args(args), workers=_workers(args.workers),
    )
    if args.json:
        print_json(res.to_dict())
    else:
        print(res.table())
    if not res.configs:
        where = "in the JSON's 'rejected' lists" if args.json else "listed above"
        print(f"pipeoffload plan: error: --memory-budget: no configuration fits {res.budget / GiB:.3g} GiB "
              f"per device (reasons {where})", file=sys.stderr)
        return 2
    if args.emit_config:
        from .train import emit_config

        emit_config(res, args.emit_config, quiet=args.json)
    if args.png:
        from ..viz.png import draw_timeline

        best = res.best
        tl = res.timeline(best)
        title = (f"best plan: {best.describe()}" + (f" (drawn at m={tl.num_microbatches})"
                                                    if tl.num_microbatches != best.m else ""))
        write_output("--png", args.png, lambda path: draw_timeline(tl, path, title=title))
        if not args.json:
            print(f"wrote {args.png}")
    return 0
