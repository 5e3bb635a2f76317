"""`pipeoffload models`: model presets, hardware profiles, the offload ratio k, per-group costs.

    pipeoffload models [--json]                               list presets
    pipeoffload models --k [--hardware NAME|FILE] [--model NAME]  k closed form vs from the cost model
    pipeoffload models --hardware-list [--json]               list hardware profiles
    pipeoffload models --groups --model NAME -p P [-v V] [--trim-edges] [--hardware ..] [--json]
                                                               per-layer-group costs (JSON works as --rank-costs)
"""

from __future__ import annotations

import argparse

from ..costmodel.hardware import HARDWARE, get_hardware
from ..costmodel.model import k_closed_form, k_from_model, pipeline_costs
from ..costmodel.presets import PO_RUNTIME, PRESETS, get_model
from ..errors import ParameterError
from .common import add_ranks_arg, print_json

MB = 1e6


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "models",
        help="list model presets and hardware; offload ratio k; per-layer-group costs",
        description="List the model presets. --k prints PipeOffload's offload ratio k (closed form and from "
        "this cost model); --groups prints one model's per-layer-group costs (times in ms, bytes) for p·v groups.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--model", metavar="NAME",
                        help="one preset (or a .toml/.json model file); default: all presets")
    parser.add_argument("--hardware", default=None, metavar="NAME",
                        help=f"hardware profile ({', '.join(HARDWARE)}) or a .toml/.json file (default a100-80g)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--k", action="store_true", help="print the offload ratio k per model")
    mode.add_argument("--hardware-list", action="store_true", help="list the hardware profiles")
    mode.add_argument("--groups", action="store_true", help="per-layer-group costs of --model for -p/-v")
    add_ranks_arg(parser, default=None, help="with --groups: pipeline ranks p")
    parser.add_argument("-v", "--chunks", dest="v", type=int, default=1,
                        help="with --groups: chunks per rank (default 1)")
    parser.add_argument("--trim-edges", action="store_true",
                        help="with --groups: one layer fewer in the first and last group (PipeOffload's balancing)")
    parser.set_defaults(func=run)
    return parser


def _models(args: argparse.Namespace):
    return [get_model(args.model)] if args.model else list(PRESETS.values())


def run(args: argparse.Namespace) -> int:
    if args.hardware_list:
        return _hardware_list(args)
    if args.k:
        return _k(args)
    if args.groups:
        return _groups(args)
    return _list(args)


def _list(args: argparse.Namespace) -> int:
    rows = [m.summary() for m in _models(args)]
    if args.json:
        print_json(rows)
        return 0
    print(f"{'name':<10} {'layers':>6} {'hidden':>6} {'ffn':>6} {'heads':>5} {'kv':>3} {'seq':>5} {'mb':>3} "
          f"{'dtype':>5} {'act':>6} {'params(B)':>9} {'act/layer/mb(MB)':>16}")
    for r in rows:
        print(f"{r['name']:<10} {r['layers']:>6} {r['hidden']:>6} {r['ffn']:>6} {r['heads']:>5} {r['kv_groups']:>3} "
              f"{r['seq']:>5} {r['microbatch']:>3} {r['dtype']:>5} {r['activation']:>6} {r['params'] / 1e9:>9.3f} "
              f"{r['layer_saved_bytes'] / MB:>16.1f}")
    return 0


def _hardware_list(args: argparse.Namespace) -> int:
    profiles = [get_hardware(args.hardware)] if args.hardware else list(HARDWARE.values())
    if args.json:
        print_json([h.to_dict() for h in profiles])
        return 0
    for h in profiles:
        d = h.to_dict()
        print(f"{d['name']:<10} {d['compute_tflops']:>5.0f} TFLOP/s  HBM {d['hbm_gib']:>5.0f} GiB  "
              f"host {d['host_link_gbs']:>4.0f} GB/s  P2P {d['interstage_gbs']:>4.0f} GB/s "
              f"+ {d['link_latency_us']:.0f} us  {d['note']}")
    return 0


def _k(args: argparse.Namespace) -> int:
    hw = get_hardware(args.hardware or "a100-80g")
    rows = []
    for m in _models(args):
        rows.append({
            "model": m.name, "hidden": m.hidden, "seq": m.seq, "hardware": hw.name,
            "k_closed_form": k_closed_form(m.hidden, m.seq, hw.compute_rate, hw.host_bw),
            "k_model": k_from_model(m, hw),
            "k_model_po_runtime": k_from_model(m.replace(**PO_RUNTIME), hw),
        })
    if args.json:
        print_json(rows)
        return 0
    print(f"hardware {hw.name}: {hw.compute_rate / 1e12:.0f} TFLOP/s, host link {hw.host_bw / 1e9:.0f} GB/s. "
          "k = (D2H + H2D) / (F + B + W) of one layer's activations; offload is free when k <= 1.")
    print("k_model: the preset as defined; k_po: with flash attention, no dropout, recomputed elementwise ops.")
    print(f"{'model':<10} {'hidden':>6} {'seq':>5} {'k_closed':>8} {'k_model':>8} {'k_po':>8}")
    for r in rows:
        print(f"{r['model']:<10} {r['hidden']:>6} {r['seq']:>5} {r['k_closed_form']:>8.3f} {r['k_model']:>8.3f} "
              f"{r['k_model_po_runtime']:>8.3f}")
    return 0


def _groups(args: argparse.Namespace) -> int:
    if not args.model:
        raise ParameterError("--model", "--groups needs one model (--model NAME)")
    if args.p is None:
        raise ParameterError("-p", "--groups needs the number of pipeline ranks (-p P)")
    pc = pipeline_costs(get_model(args.model), get_hardware(args.hardware or "a100-80g"), args.p, args.v,
                        trim_edges=args.trim_edges)
    if args.json:
        print_json(pc.to_dict())
        return 0
    print(f"{pc.model.name} on {pc.hardware.name}, p={pc.p}, v={pc.v}: times in ms per microbatch, "
          f"comm {pc.comm_ms:.3f} ms per hop")
    print(f"{'group':>5} {'layers':>6} {'F':>8} {'B':>8} {'W':>8} {'saved(MB)':>10} {'B->W(MB)':>9} "
          f"{'offload':>8} {'ratio':>6} {'state(GB)':>9}")
    for g in pc.groups:
        tag = ("E" if g.has_embedding else "") + ("H" if g.has_head else "")
        print(f"{g.index:>4}{tag:<1} {g.layers:>6} {g.F_ms:>8.3f} {g.B_ms:>8.3f} {g.W_ms:>8.3f} "
              f"{g.saved_bytes / MB:>10.1f} {g.block.w_bytes / MB:>9.1f} {g.offload_ms:>8.3f} "
              f"{g.offload_ratio:>6.3f} {g.state_bytes / 1e9:>9.2f}")
    return 0
