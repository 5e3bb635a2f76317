"""`pipeoffload bench`: our runtime side by side with ``torch.distributed.pipelining``.

Same reference model, data, microbatches and schedule through both runtimes,
alternating them step by step in one launch per pipeline size; prints and writes
(``bench.json``, ``bench.md``) the median step-time ratio ours/torch with min–max,
peak activation memory per rank of both, and the loss/gradient agreement.
torch is imported only when run.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..models.config import ModelConfig
from ..bench.side_by_side import PAIRS, BenchConfig
from .common import add_ranks_arg, int_list, name_list, output_dir, print_json


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "bench",
        help="benchmark our runtime against torch.distributed.pipelining (step time, activation memory, losses)",
        description="For each pipeline size and each schedule both runtimes offer (GPipe, 1F1B, interleaved 1F1B, "
        "ZB-1p interleaved = torch's ScheduleInterleavedZeroBubble vs our group-interleaved g=p, ZB-V), spawn p "
        "local gloo ranks that build our PipelineRunner and torch's schedule over identical copies of the reference "
        "transformer's layer groups and alternate them step by step on the same microbatches. Reports the median "
        "step-time ratio ours/torch over the pairs (min-max), peak activation memory per rank of both (the same "
        "saved-tensor meter), and the loss and gradient differences. Where torch's generated order differs from "
        "ours, torch's order is also run on our runtime. Writes bench.json and bench.md to --output.",
    )
    add_ranks_arg(parser, dest="stages", default="2,4", type=str, metavar="P[,P...]",
                  help="pipeline ranks p, one launch each (default 2,4)")
    parser.add_argument("--schedules", default=",".join(PAIRS), metavar="NAME[,NAME...]",
                        help=f"which shared schedules (default all: {', '.join(PAIRS)})")
    parser.add_argument("--pairs", type=int, default=5, help="timed (ours, torch) pairs per schedule (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each runtime first (default 1)")
    parser.add_argument("-m", "--microbatches", dest="m", type=int, default=8, help="microbatches per step (default 8)")
    parser.add_argument("--microbatch-size", type=int, default=2, help="sequences per microbatch (default 2)")
    mdl = parser.add_argument_group("model")
    mdl.add_argument("--layers", type=int, default=8, help="transformer layers (default 8; >= p*v)")
    mdl.add_argument("--hidden", type=int, default=128, help="hidden size (default 128)")
    mdl.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    mdl.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    mdl.add_argument("--seq-len", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--no-same-order", action="store_true",
                        help="skip running torch's generated order on our runtime")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per rank (default cores/p)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds any blocking wait may take (default 120)")
    parser.add_argument("--output", "-o", default=None, metavar="DIR",
                        help="output folder (default runs/bench-<timestamp>)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.set_defaults(func=run)
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    model = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                        seq_len=args.seq_len)
    cfg = BenchConfig(
        stages=list(int_list(args.stages, "--ranks", required=True)),
        schedules=list(name_list(args.schedules)),
        pairs=args.pairs, warmup=args.warmup, microbatches=args.m, microbatch_size=args.microbatch_size,
        model=model, same_order=not args.no_same_order, threads=args.threads, timeout_s=args.timeout,
        output=args.output or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    cfg.check()
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # parameter errors before torch is imported or any process starts
    output_dir("--output", cfg.output)
    try:
        from ..bench.side_by_side import run_bench, text_report
        from ..runtime.launcher import LaunchError
    except ModuleNotFoundError as e:  # pragma: no cover - torch missing
        if e.name == "torch":
            print("pipeoffload bench: error: needs torch (pip install 'pipeoffload[runtime]')", file=sys.stderr)
            return 2
        raise
    try:
        results = run_bench(cfg, progress=not args.json)
    except LaunchError as e:
        print(f"pipeoffload bench: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print_json(results)
    else:
        print(text_report(results))
        print(f"\nwrote {', '.join(results.get('files', []))}")
    return 0
