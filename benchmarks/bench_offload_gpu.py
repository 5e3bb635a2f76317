"""Activation offload on one GPU: replay the busiest rank of a PipeOffload schedule.

Takes a schedule (default group-interleaved p=8, v=2, g=4, m=16), plans offload with
the offload pass, picks the rank with the highest no-offload activation peak, and
replays *that rank's* op sequence on one device — its F/B/W on real transformer
layers (default h=4096, s=4096, bf16, one layer per layer group), its offload/reload
ops on :class:`~pipeoffload.runtime.offload_store.OffloadStore` (pinned host
buffers, one d2h and one h2d stream, events) — without the other ranks: a received
activation or gradient is a fresh copy of a fixed random tensor. Reports, with and
without offload: step time, allocator activation memory (peak minus step-start
allocated, the paper's metric), bytes moved, the achieved host-link GB/s per
direction (copy time from CUDA events), and whether the gradients are bitwise equal.

    python benchmarks/bench_offload_gpu.py                      # H100/H200-sized run
    python benchmarks/bench_offload_gpu.py --device cpu --tiny  # smoke test, seconds
    python benchmarks/bench_offload_gpu.py --offload-chunks 2 --recompute --json out.json

On CPU the same code runs with the streams as no-ops (copies are synchronous
memcpy), memory by the saved-tensor meter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks

from pipeoffload.ir import OpKind
from pipeoffload.models.config import ModelConfig
from pipeoffload.models.transformer import Block, rotary_tables
from pipeoffload.offload import plan_offload
from pipeoffload.runtime.meter import make_meter
from pipeoffload.runtime.offload_store import OffloadStore
from pipeoffload.runtime.weight_grad import WeightGradStore, convert_linears
from pipeoffload.schedules import ScheduleSpec, build

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Chunk(nn.Module):
    """``layers`` reference transformer layers (hidden states in and out)."""

    def __init__(self, cfg: ModelConfig, layers: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(layers))
        for b in self.blocks:
            for name, p in b.named_parameters():
                with torch.no_grad():
                    if name.endswith("norm.weight"):
                        p.fill_(1.0)
                    else:
                        p.normal_(0.0, cfg.init_std)
        cos, sin = rotary_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        return x


class Replay:
    """Runs one rank's op list on one device (compute + offload ops; no communication)."""

    def __init__(self, ops: list, modules: dict[int, nn.Module], shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, store: OffloadStore | None) -> None:
        self.ops, self.modules, self.device = ops, modules, device
        self.meter = make_meter(device, "auto")
        params = [t for m in modules.values() for t in list(m.parameters()) + list(m.buffers())]
        if hasattr(self.meter, "exclude"):
            self.meter.exclude(params)
        self.store = store
        self.wg = WeightGradStore(hold=self.meter.hold)
        if store is not None:
            store.bind(device=device, meter=self.meter, exclude=params,
                       offloaded=[(o.stage, o.microbatch) for o in ops if o.kind is OpKind.OFFLOAD_START])
        g = torch.Generator(device="cpu").manual_seed(1)
        self.x0 = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        self.g0 = (torch.randn(shape, generator=g) * 1e-3).to(device=device, dtype=dtype)
        self.split = {(o.stage, o.microbatch) for o in ops if o.kind is OpKind.B}

    def step(self) -> float:
        keep: dict[tuple[int, int], Any] = {}
        store, meter = self.store, self.meter
        calls = {} if store is None else {
            OpKind.OFFLOAD_START: store.offload_start, OpKind.OFFLOAD_END: store.offload_end,
            OpKind.RELOAD_START: store.reload_start, OpKind.RELOAD_END: store.reload_end}
        _sync(self.device)
        meter.start_step()
        t0 = time.perf_counter()
        for op in self.ops:
            s, j = op.stage, op.microbatch
            if op.kind is OpKind.F:
                x = self.x0.clone().requires_grad_()  # a "received" activation
                holder = meter.hold(x)

                def pack(t: torch.Tensor, s=s, j=j) -> Any:
                    return meter.wrap(store.pack(s, j, t) if store else t.detach(), t)

                def unpack(o: Any, s=s, j=j) -> torch.Tensor:
                    v = meter.unwrap(o)
                    return store.unpack(s, j, v) if store else v

                cap = store.capture(s, j, (x,)) if store else _null()
                fwd = self.wg.forward(s, j) if (s, j) in self.split else _null()
                with saved_tensors_hooks(pack, unpack), fwd, cap:
                    y = self.modules[s](x)
                keep[(s, j)] = (x, holder, get_gradient_edge(y))
                del y
            elif op.kind in (OpKind.B, OpKind.BW):
                x, holder, edge = keep.pop((s, j))
                grad = self.g0.clone()  # a "received" gradient
                with self.wg.deferring():
                    torch.autograd.backward(edge, grad_tensors=grad)
                del grad, edge, x, holder
                if store:
                    store.release(s, j)
                if op.kind is OpKind.BW:
                    self.wg.flush(s, j)
            elif op.kind is OpKind.W:
                self.wg.flush(s, j)
            elif op.kind in calls:
                calls[op.kind](s, j)
        if store:
            store.end_step()
        _sync(self.device)
        return time.perf_counter() - t0


class _null:
    def __enter__(self) -> None: ...

    def __exit__(self, *a: Any) -> None: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small sizes (h=64, s=64, fp32): a smoke test")
    ap.add_argument("--schedule", default="group-interleaved")
    ap.add_argument("-p", type=int, default=None)
    ap.add_argument("-m", type=int, default=None)
    ap.add_argument("-v", type=int, default=None, help="chunks per rank (schedule default; 2 for group-interleaved)")
    ap.add_argument("-g", type=int, default=None, help="group size for group-interleaved (default p/2)")
    ap.add_argument("--offload-chunks", default="1", help="C, or auto (default 1: the earliest chunk)")
    ap.add_argument("--offload-time", type=float, default=0.0,
                    help="planned one-way transfer time as a multiple of F+B+W (default 0)")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--layers-per-chunk", type=int, default=1)
    ap.add_argument("--microbatch-size", type=int, default=1)
    ap.add_argument("--dtype", choices=list(_DTYPES), default=None)
    ap.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up step)")
    ap.add_argument("--json", default=None, metavar="FILE")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    tiny = a.tiny
    p = a.p or (4 if tiny else 8)
    m = a.m or (8 if tiny else 16)
    gis = a.schedule == "group-interleaved"
    g = (a.g or p // 2) if gis else a.g
    h = a.hidden or (64 if tiny else 4096)
    s = a.seq_len or (64 if tiny else 4096)
    heads = a.heads or (4 if tiny else 32)
    kv = a.kv_heads or (2 if tiny else 8)
    dtype = _DTYPES[a.dtype or ("fp32" if tiny or device.type == "cpu" else "bf16")]
    sched = build(ScheduleSpec(a.schedule, p, m, v=a.v or (2 if gis else None), g=g))
    auto = a.offload_chunks == "auto"
    plan = plan_offload(sched, chunks=None if auto else int(a.offload_chunks), auto=auto,
                        offload_time=a.offload_time, on_infeasible="skip")
    rank = max(range(p), key=lambda r: (plan.peak_no_offload[r], -r))  # the busiest rank
    cfg = ModelConfig(layers=a.layers_per_chunk, hidden=h, heads=heads, kv_heads=kv, seq_len=s)
    modules = {st: Chunk(cfg, a.layers_per_chunk, seed=st).to(device=device, dtype=dtype)
               for st in sched.placement.stages_of(rank)}
    for mod in modules.values():
        convert_linears(mod)
    shape = (a.microbatch_size, s, h)
    results: dict[str, Any] = {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "schedule": sched.name, "p": p, "m": m, "v": sched.chunks, "g": g, "rank": rank,
        "offload_chunks": plan.chunks, "hidden": h, "seq_len": s, "heads": heads, "kv_heads": kv,
        "layers_per_chunk": a.layers_per_chunk, "microbatch_size": a.microbatch_size, "dtype": str(dtype),
        "transfers": sum(1 for o in plan.schedule.ranks[rank] if o.kind is OpKind.OFFLOAD_START),
        "predicted_peak_units": {"no_offload": plan.peak_no_offload[rank], "offload": plan.peak[rank]},
        "runs": {},
    }
    grads = {}
    for label, ops, store in (("no offload", sched.ranks[rank], None),
                              ("offload", plan.schedule.ranks[rank],
                               OffloadStore(recompute=a.recompute, timing=device.type == "cuda"))):
        rep = Replay(ops, modules, shape, dtype, device, store)
        times, peaks = [], []
        for k in range(a.steps + 1):
            for mod in modules.values():
                mod.zero_grad(set_to_none=True)
            t = rep.step()
            if k > 0:
                times.append(t)
                peaks.append(rep.meter.peak())
        grads[label] = {f"{st}.{n}": prm.grad.detach().clone() for st, mod in modules.items()
                        for n, prm in mod.named_parameters() if prm.grad is not None}
        row: dict[str, Any] = {"step_s": statistics.median(times), "activation_peak_bytes": max(peaks),
                               "meter": rep.meter.name}
        st = store.stats() if store else None
        if st:
            row.update({k: st[k] for k in ("moved_bytes", "kept_bytes", "recomputed_bytes", "host_peak_bytes",
                                           "host_reserved_bytes", "groups")})
            dev_d2h, dev_h2d = st.get("d2h_device_s"), st.get("h2d_device_s")
            d2h_s = dev_d2h if dev_d2h else st["d2h_host_s"]
            h2d_s = dev_h2d if dev_h2d else st["h2d_host_s"]
            row["d2h_GBps"] = st["moved_bytes"] / d2h_s / 1e9 if d2h_s else None
            row["h2d_GBps"] = st["moved_bytes"] / h2d_s / 1e9 if h2d_s else None
            row["copy_time_from"] = "cuda events" if dev_d2h else "host clock"
        results["runs"][label] = row
        del rep
    a0, b0 = grads["no offload"], grads["offload"]
    results["bitwise_equal_grads"] = a0.keys() == b0.keys() and all(torch.equal(a0[k], b0[k]) for k in a0)
    _print(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def _print(r: dict[str, Any]) -> None:
    print(f"{r['schedule']} p={r['p']} m={r['m']} v={r['v']}, rank {r['rank']} replayed on {r['device_name']}: "
          f"h={r['hidden']} s={r['seq_len']} {r['dtype']}, {r['layers_per_chunk']} layer(s) per layer group, "
          f"offload C={r['offload_chunks']} ({r['transfers']} transfers/step)")
    print(f"{'run':<11} {'step ms':>9} {'act peak MiB':>13} {'moved MiB':>10} {'host MiB':>9} {'d2h GB/s':>9} "
          f"{'h2d GB/s':>9}")
    for label, row in r["runs"].items():
        f = lambda k: f"{row[k]:.2f}" if row.get(k) else "-"  # noqa: E731
        mib = lambda k: f"{row[k] / 2**20:.1f}" if k in row else "-"  # noqa: E731
        print(f"{label:<11} {1000 * row['step_s']:>9.1f} {row['activation_peak_bytes'] / 2**20:>13.1f} "
              f"{mib('moved_bytes'):>10} {mib('host_peak_bytes'):>9} {f('d2h_GBps'):>9} {f('h2d_GBps'):>9}")
    print(f"gradients bitwise equal with and without offload: {r['bitwise_equal_grads']}")


if __name__ == "__main__":
    run(sys.argv[1:])
