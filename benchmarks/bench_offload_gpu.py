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

Pipeline waits (``--pipeline-waits``, on by default; ``--no-pipeline-waits`` keeps only
the old mode): a rank inside a pipeline idles while it waits for its neighbours'
messages, and the copies can use that time; the bubble-free replay above has no such
idle time, so its overhead is the worst case. After the no-offload replay the measured
F, B, W (or BW) medians of one layer group are fed to the simulator
(:func:`pipeoffload.passes.timing.simulate`) for the full p-rank schedule, with
``--wait-comm`` seconds per cross-rank message (default 0). Each op of the replayed
rank whose input comes from another rank (an F after a layer group held elsewhere, a
B/BW before one) is then held on the host until its message's simulated arrival time
(the producer's simulated end + comm), counted from the step start: a plain sleep and
spin on the host clock, no CUDA events, so on a GPU the op cannot start before that
time and starts later if the GPU is still busy, as behind a real receive. Both
replays (no offload, offload) run again with these waits, and the overhead is
reported with and without them. The other ranks are open-loop: their messages arrive
as simulated whatever the replayed rank does (its own delays do not propagate).

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
from pathlib import Path
from typing import Any

# Run from a checkout on a GPU machine without installing the project (make gpu-check's way).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks  # noqa: E402

from pipeoffload.ir import OpKind  # noqa: E402
from pipeoffload.models.config import ModelConfig  # noqa: E402
from pipeoffload.models.transformer import Block, rotary_tables  # noqa: E402
from pipeoffload.costs import Costs  # noqa: E402
from pipeoffload.passes.offload import plan_offload  # noqa: E402
from pipeoffload.passes.timing import completion_key, dependencies, simulate  # noqa: E402
from pipeoffload.runtime.meter import make_meter  # noqa: E402
from pipeoffload.runtime.offload_store import RELOAD_ALLOC, OffloadStore  # noqa: E402
from pipeoffload.runtime.weight_grad import WeightGradStore, convert_linears  # noqa: E402
from pipeoffload.schedules import ScheduleSpec, build  # noqa: E402

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
        self.op_events: list[tuple[str, Any, Any]] = []  #: (kind, start, end) CUDA events of the last step
        self.unit_bytes = 0.0  #: memory kept by one F (one layer group, one microbatch), last step
        #: Pipeline waits: (kind, stage, microbatch) -> seconds after the step start before
        #: which the op may not be issued (:func:`pipeline_releases`); None: no waits.
        self.release: dict[tuple[OpKind, int, int], float] | None = None
        self.held_s = 0.0  #: host seconds spent holding ops in the last step
        self.holds = 0  #: ops that were actually held (issued later than the host reached them)

    def _mark(self) -> Any:
        if self.device.type != "cuda":
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def op_seconds(self) -> dict[str, float]:
        """Median device seconds of F, B, W, BW in the last step (events; no extra synchronisation)."""
        _sync(self.device)
        by: dict[str, list[float]] = {}
        for kind, a, b in self.op_events:
            dt = a.elapsed_time(b) / 1000 if self.device.type == "cuda" else b - a
            by.setdefault(kind, []).append(dt)
        return {k: statistics.median(v) for k, v in by.items()}

    def busy_seconds(self) -> float:
        """Seconds the compute ops of the last step ran (sum of their event spans)."""
        _sync(self.device)
        return sum(a.elapsed_time(b) / 1000 if self.device.type == "cuda" else b - a for _, a, b in self.op_events)

    def step(self) -> float:
        keep: dict[tuple[int, int], Any] = {}
        store, meter = self.store, self.meter
        calls = {} if store is None else {
            OpKind.OFFLOAD_START: store.offload_start, OpKind.OFFLOAD_END: store.offload_end,
            OpKind.RELOAD_START: store.reload_start, OpKind.RELOAD_END: store.reload_end}
        release = self.release or {}
        _sync(self.device)
        meter.start_step()
        self.op_events = []
        self.held_s, self.holds = 0.0, 0
        first_f = True
        t0 = time.perf_counter()
        for op in self.ops:
            s, j = op.stage, op.microbatch
            compute = op.kind in (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)
            if compute:
                due = release.get((op.kind, s, j))
                if due is not None:  # the pipeline's wait: its message arrives at t0 + due
                    held = wait_until(t0 + due)
                    if held > 0:
                        self.held_s += held
                        self.holds += 1
                e0, lvl0 = self._mark(), meter.level()
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
            if compute:
                self.op_events.append((op.kind.name, e0, self._mark()))
                if op.kind is OpKind.F and first_f:
                    self.unit_bytes, first_f = meter.level() - lvl0, False
        if store:
            store.end_step()
        _sync(self.device)
        return time.perf_counter() - t0


def wait_until(deadline: float) -> float:
    """Hold the host until ``time.perf_counter()`` reaches ``deadline``; return the
    seconds held (0 when it already passed). Sleeps, then spins the last millisecond
    (a sleep alone overshoots by up to ~0.1 ms). No CUDA events or synchronisation:
    work already queued on the GPU keeps running."""
    now = time.perf_counter()
    if now >= deadline:
        return 0.0
    if deadline - now > 2e-3:
        time.sleep(deadline - now - 1e-3)
    while time.perf_counter() < deadline:
        pass
    return time.perf_counter() - now


def group_costs(op_s: dict[str, float]) -> tuple[float, float, float]:
    """``(F, B, W)`` seconds of one layer group from measured op medians (``Replay.op_seconds``);
    a schedule without split backwards measured BW only: B = W = BW / 2."""
    f = op_s["F"]
    b, w = (op_s["B"], op_s.get("W", 0.0)) if "B" in op_s else (op_s["BW"] / 2, op_s["BW"] / 2)
    return max(f, 1e-9), max(b, 1e-9), max(w, 1e-9)  # the simulator takes positive costs


def pipeline_releases(schedule: Any, rank: int, costs: tuple[float, float, float],
                      comm: float = 0.0) -> tuple[dict[tuple[OpKind, int, int], float], dict[str, Any]]:
    """When each of ``rank``'s compute ops may start, as far as the other ranks are concerned.

    The whole p-rank ``schedule`` (its compute ops; transfer ops are ignored) is timed by
    the simulator with every layer group taking ``costs`` = (F, B, W) seconds and
    ``comm`` seconds per cross-rank message. For each compute op of ``rank`` with an
    input produced on another rank, the result maps ``(kind, stage, microbatch)`` to
    that message's arrival: the producer's simulated end + ``comm`` (the latest, if
    several). Ops with only local inputs are absent. Also returns the simulated
    figures the replay is compared with."""
    S = schedule.num_stages
    pl = schedule.placement
    tl = simulate(schedule, Costs(comm=comm, group_costs=tuple(tuple(costs) for _ in range(S))))
    end = {completion_key(e.op): e.end for e in tl.events}
    release: dict[tuple[OpKind, int, int], float] = {}
    for op in schedule.ranks[rank]:
        if not op.kind.is_compute:
            continue
        remote = [end[k] + comm for k in dependencies(op, S) if pl.rank_of(k[1]) != rank]
        if remote:
            release[(op.kind, op.stage, op.microbatch)] = max(remote)
    mine = tl.rank_events(rank)
    info = {"F_s": costs[0], "B_s": costs[1], "W_s": costs[2], "comm_s": comm, "makespan_s": tl.makespan,
            "rank_end_s": max(e.end for e in mine), "rank_busy_s": sum(e.end - e.start for e in mine),
            "remote_input_ops": len(release), "last_release_s": max(release.values(), default=0.0)}
    return release, info


class _null:
    def __enter__(self) -> None: ...

    def __exit__(self, *a: Any) -> None: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small sizes (h=64, s=64, fp32): a smoke test")
    ap.add_argument("--schedule", default="group-interleaved")
    ap.add_argument("-p", type=int, default=None)
    ap.add_argument("-m", type=int, default=None)
    ap.add_argument("-v", type=int, default=None, help="chunks per rank (schedule default; 2 for group-interleaved)")
    ap.add_argument("-g", type=int, default=None, help="group size for group-interleaved (default p/2)")
    ap.add_argument("--offload-chunks", default="1", help="C, or auto (default 1: the earliest chunk)")
    ap.add_argument("--offload-time", default="measured",
                    help="planned one-way transfer time as a multiple of F+B+W, or 'measured' (default): "
                         "from this device's measured op times and pinned host-link bandwidth")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--reload-alloc", choices=list(RELOAD_ALLOC), default="compute",
                    help="CUDA stream whose pool the reloaded activations come from (OffloadStore.reload_alloc)")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--layers-per-chunk", type=int, default=1)
    ap.add_argument("--microbatch-size", type=int, default=1)
    ap.add_argument("--dtype", choices=list(_DTYPES), default=None)
    ap.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up step)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="CUDA: one more offload step under torch.profiler, Chrome trace written to FILE")
    ap.add_argument("--pipeline-waits", action=argparse.BooleanOptionalAction, default=True,
                    help="also replay both runs with the pipeline's waits (each op with an input from another "
                         "rank held until the simulator, fed the measured op times, says its message arrives); "
                         "--no-pipeline-waits: only the bubble-free replay (the worst case)")
    ap.add_argument("--wait-comm", type=float, default=0.0, metavar="SECONDS",
                    help="latency of one cross-rank message in the simulated pipeline (default 0)")
    ap.add_argument("--json", default=None, metavar="FILE")
    return ap


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run both replays (without and with offload), print and return the results."""
    a = _parser().parse_args(argv)
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
    chunks = None if auto else int(a.offload_chunks)
    measured = a.offload_time == "measured"
    plan = plan_offload(sched, offload_chunks=chunks, auto=auto, offload_time=0.0 if measured else float(a.offload_time),
                        on_infeasible="skip")
    rank = max(range(p), key=lambda r: (plan.peak_no_offload[r], -r))  # the busiest rank
    cfg = ModelConfig(layers=a.layers_per_chunk, hidden=h, heads=heads, kv_heads=kv, seq_len=s)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:  # initialise on the device, in the run's dtype (host init of large layers is slow)
            modules = {st: Chunk(cfg, a.layers_per_chunk, seed=st).to(dtype)  # (rotary tables are made in fp32)
                       for st in sched.placement.stages_of(rank)}
    finally:
        torch.set_default_dtype(default_dtype)
    for mod in modules.values():
        convert_linears(mod)
    shape = (a.microbatch_size, s, h)
    chunks_here = sched.placement.chunks_on(rank)
    results: dict[str, Any] = {
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "schedule": sched.name, "p": p, "m": m, "v": sched.chunks, "g": g, "rank": rank,
        "offload_chunks": plan.offloaded_chunks, "hidden": h, "seq_len": s, "heads": heads, "kv_heads": kv,
        "layers_per_chunk": a.layers_per_chunk, "microbatch_size": a.microbatch_size, "dtype": str(dtype),
        "reload_alloc": a.reload_alloc,
        "transfers": sum(1 for o in plan.schedule.ranks[rank] if o.kind is OpKind.OFFLOAD_START),
        "predicted_peak_units": {"no_offload": plan.peak_no_offload[rank], "offload": plan.peak[rank]},
        "runs": {},
    }
    grads = {}
    labels = ["no offload", "offload"] + (["no offload, waits", "offload, waits"] if a.pipeline_waits else [])
    for label in labels:
        store = None
        offloaded = label.startswith("offload")
        if label == "offload":
            if measured:  # re-plan with this device's op times and host link (one rank per link)
                plan, results["plan"] = _measured_plan(sched, results["runs"]["no offload"], device, chunks, auto)
                results["predicted_peak_units"]["offload"] = plan.peak[rank]
                results["offload_chunks"] = plan.offloaded_chunks
            results["transfers"] = sum(1 for o in plan.schedule.ranks[rank] if o.kind is OpKind.OFFLOAD_START)
        if offloaded:
            store = OffloadStore(recompute=a.recompute, timing=device.type == "cuda", reload_alloc=a.reload_alloc)
        program = plan.schedule if offloaded else sched
        release = None
        if label.endswith("waits"):  # the pipeline's waits, from the measured op times of the no-offload replay
            release, info = pipeline_releases(program, rank, group_costs(results["runs"]["no offload"]["op_s"]),
                                              a.wait_comm)
            results.setdefault("waits", {})["offload" if offloaded else "no offload"] = info
        ops = program.ranks[rank]
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            reserved0 = torch.cuda.memory_reserved(device)
        rep = Replay(ops, modules, shape, dtype, device, store)
        rep.release = release
        times, peaks, held, busy = [], [], [], []
        for k in range(a.steps + 1):
            for mod in modules.values():  # in place: the gradients are not activation memory
                mod.zero_grad(set_to_none=False)
            t = rep.step()
            if k > 0:
                times.append(t)
                peaks.append(rep.meter.peak())
                held.append(rep.held_s)
                busy.append(rep.busy_seconds())
        grads[label] = {f"{st}.{n}": prm.grad.detach().clone() for st, mod in modules.items()
                        for n, prm in mod.named_parameters() if prm.grad is not None}
        row: dict[str, Any] = {"step_s": statistics.median(times), "step_s_all": times,
                               "activation_peak_bytes": max(peaks), "meter": rep.meter.name,
                               "unit_bytes": rep.unit_bytes, "op_s": rep.op_seconds(),
                               "compute_busy_s": statistics.median(busy)}
        if release is not None:
            row.update({"held_ops": rep.holds, "held_host_s": statistics.median(held)})
        if device.type == "cuda":
            row["reserved_growth_bytes"] = torch.cuda.max_memory_reserved(device) - reserved0
        st = store.stats() if store else None
        if st:
            row.update({k: st[k] for k in ("moved_bytes", "kept_bytes", "recomputed_bytes", "host_peak_bytes",
                                           "host_reserved_bytes", "groups")})
            dev_d2h, dev_h2d = st.get("d2h_device_s"), st.get("h2d_device_s")
            d2h_s = dev_d2h if dev_d2h else st["d2h_host_s"]
            h2d_s = dev_h2d if dev_h2d else st["h2d_host_s"]
            row["d2h_s"], row["h2d_s"] = d2h_s, h2d_s
            row["d2h_GBps"] = st["moved_bytes"] / d2h_s / 1e9 if d2h_s else None
            row["h2d_GBps"] = st["moved_bytes"] / h2d_s / 1e9 if h2d_s else None
            row["copy_time_from"] = "cuda events" if dev_d2h else "host clock"
            if a.profile and device.type == "cuda" and label == "offload":
                row["profile"] = _profile_step(rep, modules, a.profile)
        results["runs"][label] = row
        del rep
    a0, b0 = grads["no offload"], grads["offload"]
    results["bitwise_equal_grads"] = _bitwise(a0, b0)
    # GPU attention backward kernels accumulate with atomics (not bitwise reproducible run to
    # run), so the relative difference is reported too; gpu_check.py proves bitwise equality
    # under deterministic kernels.
    results["max_rel_grad_diff"] = _max_rel(b0, a0)
    if a.pipeline_waits:  # holding ops changes no numbers: each waits run against no offload, no waits
        results["bitwise_equal_grads_waits"] = all(_bitwise(a0, grads[k]) for k in labels[2:])
        results["max_rel_grad_diff_waits"] = max(_max_rel(grads[k], a0) for k in labels[2:])
    _derive(results, cfg, a.microbatch_size, chunks_here)
    _print(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def _bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _max_rel(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    if got.keys() != ref.keys():
        return float("inf")
    return max(float((got[k].double() - ref[k].double()).norm() / ref[k].double().norm().clamp_min(1e-30))
               for k in ref)


def host_link_seconds(nbytes: int, device: torch.device, repeats: int = 3) -> tuple[float, float]:
    """Seconds to copy ``nbytes`` device→pinned host and back (median of ``repeats``, CUDA events).
    Elsewhere: host clock around a memcpy."""
    nbytes = max(int(nbytes), 1 << 20)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    out = []
    for src, dst in ((dev, host), (host, dev)):
        ts = []
        for _ in range(repeats + 1):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dst.copy_(src, non_blocking=True)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) / 1000)
            else:
                t0 = time.perf_counter()
                dst.copy_(src)
                ts.append(time.perf_counter() - t0)
        out.append(statistics.median(ts[1:]))
    return out[0], out[1]


def _measured_plan(sched: Any, base: dict[str, Any], device: torch.device, chunks: int | None,
                   auto: bool) -> tuple[Any, dict[str, Any]]:
    """The offload plan with measured costs: F, B, W from the no-offload replay, one
    transfer = the F's kept bytes over the measured pinned bandwidth (the slower way),
    one rank per host link whose two directions do not slow each other."""
    from pipeoffload.costs import Costs

    ops = base["op_s"]
    f = ops["F"]
    b, w = (ops["B"], ops["W"]) if "B" in ops else (ops["BW"] / 2, ops["BW"] / 2)
    d2h, h2d = host_link_seconds(int(base["unit_bytes"]), device)
    x = max(d2h, h2d) / (f + b + w)
    plan = plan_offload(sched, costs=Costs(F=f, B=b, W=w), offload_chunks=chunks, auto=auto, offload_time=x,
                        link_group=1, solo_factor=1.0, on_infeasible="skip")
    return plan, {"F_s": f, "B_s": b, "W_s": w, "transfer_d2h_s": d2h, "transfer_h2d_s": h2d, "offload_time": x,
                  "link_group": 1, "solo_factor": 1.0}


def _profile_step(rep: Replay, modules: dict[int, nn.Module], path: str) -> dict[str, float]:
    """One more step under torch.profiler; the Chrome trace goes to ``path``. Returns the
    copy time on the GPU and the part of it that overlaps a compute kernel."""
    from torch.profiler import ProfilerActivity, profile

    for mod in modules.values():
        mod.zero_grad(set_to_none=False)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        rep.step()
    prof.export_chrome_trace(path)
    return copy_overlap(path)


def copy_overlap(trace_path: str) -> dict[str, float]:
    """From a Chrome trace: seconds of device↔host copies (``gpu_memcpy`` DtoH/HtoD) and the
    seconds of them during which some compute kernel ran."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    kernels, copies = [], []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if cat == "kernel":
            kernels.append(span)
        elif cat == "gpu_memcpy" and ("DtoH" in name or "HtoD" in name):
            copies.append(span)
    busy = _union(kernels)
    total = sum(b - a for a, b in copies)
    hidden = sum(_overlap(c, busy) for c in copies)
    return {"copy_s": total / 1e6, "copy_overlapped_s": hidden / 1e6,
            "hidden_share": hidden / total if total else None, "copies": len(copies), "kernels": len(kernels)}


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(span: tuple[float, float], union: list[tuple[float, float]]) -> float:
    import bisect

    a, b = span
    i = max(0, bisect.bisect_right(union, (a, float("inf"))) - 1)
    got = 0.0
    while i < len(union) and union[i][0] < b:
        got += max(0.0, min(b, union[i][1]) - max(a, union[i][0]))
        i += 1
    return got


def _derive(r: dict[str, Any], cfg: ModelConfig, mb: int, chunks_here: int) -> None:
    """Overhead, hidden copy share, predicted peak in bytes, measured and modelled k."""
    base, off = r["runs"]["no offload"], r["runs"]["offload"]
    unit = base["unit_bytes"]
    pu = r["predicted_peak_units"]
    # plan peaks are in units of a whole rank's F (one chunk = 1/v of it)
    r["predicted_peak_bytes"] = {"no_offload": pu["no_offload"] * chunks_here * unit,
                                 "offload": pu["offload"] * chunks_here * unit}
    r["overhead"] = off["step_s"] / base["step_s"] - 1
    copy = (off.get("d2h_s") or 0) + (off.get("h2d_s") or 0)
    exposed = max(0.0, off["step_s"] - base["step_s"])
    r["copy_s_per_step"] = copy
    r["hidden_share_from_step_time"] = 1 - min(1.0, exposed / copy) if copy else None
    if "offload, waits" in r["runs"]:
        wb, wo = r["runs"]["no offload, waits"], r["runs"]["offload, waits"]
        r["overhead_with_waits"] = wo["step_s"] / wb["step_s"] - 1
        exposed = max(0.0, wo["step_s"] - wb["step_s"])
        r["hidden_share_with_waits"] = 1 - min(1.0, exposed / copy) if copy else None
        # how well the simulator's rank reproduces the replay with waits (no offload)
        r["waits"]["replay_vs_simulated_rank_end"] = wb["step_s"] / r["waits"]["no offload"]["rank_end_s"]
    ops = base["op_s"]
    fbw = ops.get("F", 0) + ops.get("B", 0) + ops.get("W", 0) + ops.get("BW", 0)  # one layer group, one microbatch
    groups = off.get("groups") or 0
    if groups and off.get("d2h_GBps") and fbw:
        per_group = off["moved_bytes"] / groups
        bw_d2h, bw_h2d = off["d2h_GBps"] * 1e9, off["h2d_GBps"] * 1e9
        r["k_measured"] = (per_group / bw_d2h + per_group / bw_h2d) / fbw
        from pipeoffload.costmodel.model import k_from_model
        from pipeoffload.costmodel.hardware import Hardware, get_hardware

        # one layer of the reference model, as the cost model describes it (ModelConfig.spec)
        spec = cfg.spec(microbatch=mb, dtype="bf16" if "bfloat16" in r["dtype"] else
                        ("fp16" if "float16" in r["dtype"] else "fp32")).replace(layers=1)
        lay = spec.layer()
        layers = r["layers_per_chunk"]
        rate = lay.flops * layers / fbw
        measured_hw = Hardware("measured", rate, 80 * 2**30, (bw_d2h + bw_h2d) / 2, 1e11)
        r["k_model"] = {"h100-80g profile": k_from_model(spec, get_hardware("h100-80g")),
                        "measured rates": k_from_model(spec, measured_hw)}
        r["achieved_TFLOPs"] = rate / 1e12
        r["bytes_per_layer"] = {"measured moved": per_group / layers,
                                "measured kept by F": unit / layers,
                                "cost model saved": lay.saved_bytes}


def _print(r: dict[str, Any]) -> None:
    print(f"{r['schedule']} p={r['p']} m={r['m']} v={r['v']}, rank {r['rank']} replayed on {r['device_name']}: "
          f"h={r['hidden']} s={r['seq_len']} {r['dtype']}, {r['layers_per_chunk']} layer(s) per layer group, "
          f"offload C={r['offload_chunks']} ({r['transfers']} transfers/step), reload_alloc={r['reload_alloc']}")
    if "plan" in r:
        pl = r["plan"]
        print(f"plan from measurements: F {1000 * pl['F_s']:.2f} B {1000 * pl['B_s']:.2f} W {1000 * pl['W_s']:.2f} ms, "
              f"one transfer d2h {1000 * pl['transfer_d2h_s']:.2f} h2d {1000 * pl['transfer_h2d_s']:.2f} ms "
              f"= {pl['offload_time']:.2f} x (F+B+W)")
    print(f"{'run':<17} {'step ms':>9} {'act peak MiB':>13} {'pred MiB':>9} {'reserved+ MiB':>14} {'moved MiB':>10} "
          f"{'host MiB':>9} {'d2h GB/s':>9} {'h2d GB/s':>9}")
    for label, row in r["runs"].items():
        f = lambda k: f"{row[k]:.2f}" if row.get(k) else "-"  # noqa: E731
        mib = lambda k: f"{row[k] / 2**20:.1f}" if k in row else "-"  # noqa: E731
        pred = r["predicted_peak_bytes"]["offload" if label.startswith("offload") else "no_offload"] / 2**20
        print(f"{label:<17} {1000 * row['step_s']:>9.1f} {row['activation_peak_bytes'] / 2**20:>13.1f} {pred:>9.1f} "
              f"{mib('reserved_growth_bytes'):>14} {mib('moved_bytes'):>10} {mib('host_peak_bytes'):>9} "
              f"{f('d2h_GBps'):>9} {f('h2d_GBps'):>9}")
    hs = r["hidden_share_from_step_time"]
    print(f"overhead {100 * r['overhead']:+.2f}% of step time (no pipeline waits: the worst case); copies "
          f"{1000 * r['copy_s_per_step']:.1f} ms/step, hidden (from step times) {'-' if hs is None else f'{100 * hs:.1f}%'}")
    if "overhead_with_waits" in r:
        w, hw = r["waits"]["no offload"], r["hidden_share_with_waits"]
        print(f"with the pipeline's waits (simulated p={r['p']} pipeline, comm {1000 * w['comm_s']:.2f} ms, "
              f"{w['remote_input_ops']} ops wait for a message): overhead {100 * r['overhead_with_waits']:+.2f}%, hidden "
              f"{'-' if hw is None else f'{100 * hw:.1f}%'}; replayed rank {1000 * r['runs']['no offload, waits']['step_s']:.1f} ms "
              f"against simulated {1000 * w['rank_end_s']:.1f} ms (pipeline makespan {1000 * w['makespan_s']:.1f} ms)")
    prof = r["runs"]["offload"].get("profile")
    if prof and prof.get("hidden_share") is not None:
        print(f"profiler: {prof['copies']} copies, {1000 * prof['copy_s']:.1f} ms, "
              f"{100 * prof['hidden_share']:.1f}% overlapped by compute kernels")
    if "k_measured" in r:
        km = r["k_model"]
        print(f"k measured {r['k_measured']:.3f}; cost model: {km['measured rates']:.3f} at the measured rates, "
              f"{km['h100-80g profile']:.3f} with the h100-80g profile; {r['achieved_TFLOPs']:.0f} TFLOP/s achieved")
        bl = r["bytes_per_layer"]
        print(f"bytes per layer: moved {bl['measured moved'] / 2**20:.1f} MiB, kept by F "
              f"{bl['measured kept by F'] / 2**20:.1f} MiB, cost model {bl['cost model saved'] / 2**20:.1f} MiB")
    print(f"gradients with and without offload: bitwise equal {r['bitwise_equal_grads']}, "
          f"max relative difference {r['max_rel_grad_diff']:.1e}"
          + (f"; with waits: bitwise equal {r['bitwise_equal_grads_waits']}, max relative difference "
             f"{r['max_rel_grad_diff_waits']:.1e}" if "max_rel_grad_diff_waits" in r else ""))


if __name__ == "__main__":
    run(sys.argv[1:])
