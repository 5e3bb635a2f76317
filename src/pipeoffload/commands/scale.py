"""`pipeoffload scale`: per-device activation memory against the number of pipeline stages.

    pipeoffload scale --model NAME --hardware NAME [--ranks 4,8,16,32] [-m M] [--json] [--png FILE]

Compares 1F1B, interleaved 1F1B, V-Half, V-Min, group-interleaved and PipeOffload with half and full
offload (PipeOffload's scalability claim: with offload, activation memory per device stays flat or
falls as stages are added). The global batch is fixed, so m is the same at every p.
"""

from __future__ import annotations

import argparse

from ..costmodel.hardware import HARDWARE
from ..errors import ParameterError
from .common import add_ranks_arg, check_output, cli_text, int_list, name_list, print_json, write_output


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "scale",
        help="per-device activation memory vs number of stages, with and without offload",
        description="For each stage count, split the model's layers over p devices (TP=1), run 1F1B, interleaved "
        "1F1B, V-Half, V-Min, group-interleaved and PipeOffload with half (chunk 0 of GIS v=2) and full offload "
        "with m microbatches, and report the highest per-device activation peak. Costs, bytes and transfer "
        "times come from the cost model in PipeOffload's runtime setting (flash attention, no dropout, "
        "elementwise recompute) unless --as-defined.",
    )
    parser.add_argument("--model", required=True, metavar="NAME|FILE", help="model preset or .toml/.json model file")
    parser.add_argument("--hardware", default="a100-80g", metavar="NAME|FILE",
                        help=f"hardware profile ({', '.join(HARDWARE)}) or a file (default a100-80g)")
    add_ranks_arg(parser, dest="stages", default="4,8,16,32", type=str, metavar="P,..",
                  help="pipeline ranks p, one point each (default 4,8,16,32)")
    parser.add_argument("-m", "--microbatches", dest="m", type=int, default=None,
                        help="microbatches per iteration at every p (default 2 x the largest stage count)")
    parser.add_argument("--layers", type=int, default=None, metavar="L",
                        help="override the model's layer count (e.g. 64 so that every stage count divides it)")
    parser.add_argument("--series", default=None, metavar="K,..",
                        help="which lines (default all): 1f1b, interleaved, v-half, v-min, gis, po-half, po-full")
    parser.add_argument("--as-defined", action="store_true",
                        help="use the model as defined instead of PipeOffload's runtime setting")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--png", metavar="FILE", help="write a line plot (GiB per device vs stages)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..costmodel.presets import get_model
    from ..studies.scale import scale

    check_output("--png", args.png)
    stages = int_list(args.stages, "--ranks")
    if args.layers is not None and args.layers < 1:
        raise ParameterError("--layers", f"must be a positive integer, got {args.layers}")
    model = get_model(args.model, **({"layers": args.layers} if args.layers is not None else {}))
    series = list(name_list(args.series)) if args.series else None
    res = scale(model, args.hardware, stages, args.m, series, po_runtime=not args.as_defined)
    for point in (pt for pts in res.points.values() for pt in pts if pt.error):
        point.error = cli_text(point.error)  # why a point is missing, with parameters named by their flags
    if args.json:
        print_json(res.to_dict())
    else:
        print(res.table())
    if args.png:
        from ..viz.plan_png import draw_scale

        write_output("--png", args.png, lambda path: draw_scale(res, path))
        if not args.json:
            print(f"wrote {args.png}")
    return 0
