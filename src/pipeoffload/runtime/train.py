"""The training job behind ``pipeoffload train``: the reference transformer on the
byte-level corpus, run by :class:`~pipeoffload.runtime.executor.PipelineRunner` on
every rank, with a progress bar, and a measured-vs-predicted report at the end.

:func:`run_training` (parent process) checks the configuration, then launches
:func:`train_worker` on every rank. Rank 0 writes, in the output folder:

- ``summary.json``: configuration, losses per step, per-rank step time, measured and
  predicted bubble, measured and predicted peak activation memory, per-group costs;
- ``timeline.png`` (measured last step, with memory curves), ``trace.json``
  (Chrome/Perfetto), ``predicted.png`` and ``predicted_trace.json`` (the simulator fed
  the measured per-op costs), ``timeline.json`` (every measured op).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..passes.comm import comm_volume, insert_comm
from ..schedules import ScheduleSpec, build
from ..timeline import Timeline
from .config import TrainConfig
from .executor import PipelineRunner
from .checkpoint import capture_rng, load_latest, restore_rng, save_checkpoint
from .checkpoint import fingerprint as checkpoint_fingerprint
from .faults import FaultInjector
from .faults import resolve as resolve_fault
from .launcher import DistContext, launch
from .measure import (compare, estimate_comm, gather_results, group_medians, group_peaks, measured_timeline,
                      predict, predict_offload)
from .offload_store import OffloadStore


#: Steps at the end of a run whose per-op times feed the prediction.
MEDIAN_STEPS = 10


def run_training(cfg: TrainConfig) -> None:
    """Check ``cfg`` (raising ParameterError on bad input, before any process starts),
    then run the job on ``cfg.schedule.stages`` ranks."""
    sched = cfg.check()
    launch(train_worker, sched.num_ranks, (cfg,), backend=cfg.runtime.backend,
           init_timeout_s=cfg.runtime.init_timeout_s, threads=cfg.runtime.threads)


def _lr_at(cfg: TrainConfig, step: int) -> float:
    t = cfg.training
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    # cosine to 10% over the remaining steps
    rest = max(1, t.steps - t.warmup_steps)
    frac = (step - t.warmup_steps) / rest
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_worker(ctx: DistContext, cfg: TrainConfig) -> None:
    from ..models.data import ByteCorpus, load_corpus
    from ..models.transformer import build_stage, lm_loss

    sc, tr, rt = cfg.schedule, cfg.training, cfg.runtime
    wall0 = time.perf_counter()
    out = _output_dir(rt.output) if ctx.rank == 0 else None  # named by the start time
    sched = build(ScheduleSpec(sc.name, sc.stages, sc.microbatches, v=sc.v, g=sc.g, mem_limit=sc.mem_limit))
    S = sched.num_stages
    plan = cfg.plan_offload(sched)  # PipeOffload: the offload pass's transfer ops in every rank's program
    run_sched = plan.schedule if plan is not None else sched
    store = OffloadStore(recompute=cfg.offload.recompute) if plan is not None else None
    faults = FaultInjector(resolve_fault(rt.fault_injection), ctx.rank, sched.placement.rank_of(S - 1) == ctx.rank)
    runner = PipelineRunner(lambda s: build_stage(cfg.model, s, S), faults.wrap_loss(lm_loss), run_sched,
                            rank=ctx.rank, device=ctx.device, timeout_s=rt.timeout_s, meter=rt.memory_meter,
                            recv_lookahead=rt.recv_lookahead, activation_store=store)
    if faults.active:
        runner.before_op = faults.before_op
    params = runner.parameters()
    phases = {"build_s": time.perf_counter() - wall0}
    t_loop = time.perf_counter()
    opt = torch.optim.AdamW(params, lr=tr.lr, betas=(0.9, 0.95), weight_decay=tr.weight_decay)
    corpus = ByteCorpus(load_corpus(tr.corpus), cfg.model.seq_len, tr.seed)
    ck = cfg.checkpoint
    fingerprint = checkpoint_fingerprint(cfg, sched)
    start, losses, skipped, resumed = 0, [], [], None
    if ck.resume:
        start, losses, skipped, resumed = _resume(cfg, ctx, runner, opt, fingerprint)
        if start >= tr.steps:
            if ctx.rank == 0:
                print(f"pipeoffload train: checkpoint {resumed} already has {start} of --steps {tr.steps}; "
                      "nothing to do", file=sys.stderr)
            return

    bar = None
    if ctx.rank == 0 and rt.progress:
        from tqdm import tqdm

        bar = tqdm(total=tr.steps, initial=start, unit="step", file=sys.stderr, dynamic_ncols=True,
                   desc=f"train {sched.name} p={sched.num_ranks} m={sched.num_microbatches}")
    samples = []
    step_times: list[float] = []
    last = None
    step_walls: list[float] = []
    for step in range(start, tr.steps):
        n = step + 1  # steps are numbered from 1 in messages, faults and checkpoints
        t_step = time.perf_counter()
        faults.begin_step(n)
        xs, ys = corpus.microbatches(step, sched.num_microbatches, tr.microbatch_size)
        for grp in opt.param_groups:
            grp["lr"] = _lr_at(cfg, step)
        res = runner.step(xs, ys)
        faults.after_backward(params)
        loss, bad = _agree_finite(res, params, ctx)  # every rank, before the optimizer step
        losses.append(loss)
        if bad:
            why = _nonfinite_message(n, loss, bad)
            if tr.on_nonfinite == "stop":
                if ck.dir:
                    why += f"; last checkpoint in {ck.dir} (continue with --resume)"
                raise NonFiniteError(why + "; stopped (--on-nonfinite stop; 'skip' drops such steps)")
            skipped.append(n)
            if ctx.rank == 0:
                _warn(why + "; step skipped (--on-nonfinite skip)", bar)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if ck.dir and (n == tr.steps or (ck.every and n % ck.every == 0)):
            _save(cfg, ctx, runner, opt, n, losses, skipped, fingerprint)
        step_times.append(res.step_time)
        step_walls.append(time.perf_counter() - t_step)
        # Per-op medians from the last few steps (the first step of a run includes setup
        # and warm-up): the predicted timeline then reflects the conditions of the step drawn.
        if step >= max(start + 1, tr.steps - MEDIAN_STEPS) or step == tr.steps - 1:
            samples.extend(res.samples)
        last = res
        if bar is not None:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", step_ms=f"{1000 * res.step_time:.0f}")
            bar.update(1)
    if bar is not None:
        bar.close()

    phases["train_s"] = time.perf_counter() - t_loop
    t_rep = time.perf_counter()
    gathered = gather_results({"result": last, "samples": samples, "step_times": step_times,
                               "params": sum(p.numel() for p in params)})
    if ctx.rank != 0:
        return
    results = [g["result"] for g in gathered]
    all_samples = [s for g in gathered for s in g["samples"]]
    measured = measured_timeline(results, run_sched)
    costs, deltas = group_medians(all_samples, S)
    comm = estimate_comm(measured)
    peaks = group_peaks(all_samples, S)  # in-op peaks (e.g. inside a B), measured like the deltas
    predicted = predict(sched, costs, deltas, comm, peaks)
    offload = None
    if plan is not None:
        predicted, offload = _predict_offload(cfg, plan, sched, costs, deltas, comm, results, predicted, peaks)
    cmp = compare(measured, predicted)
    mean_steps = [sum(g["step_times"][1:]) / max(1, len(g["step_times"]) - 1) if len(g["step_times"]) > 1
                  else g["step_times"][0] for g in gathered]
    files = _write_outputs(out, measured, predicted)
    phases["report_s"] = time.perf_counter() - t_rep
    summary = {
        "config": cfg.to_dict(),
        "schedule": {"name": sched.name, "p": sched.num_ranks, "m": sched.num_microbatches, "v": sched.chunks,
                     "params": sched.params, "layer_groups": S,
                     "messages": comm_volume(insert_comm(sched))},
        "device": str(ctx.device), "backend": ctx.backend, "world_size": ctx.world_size,
        "cpu_count": os.cpu_count(),
        "model_parameters": sum(g["params"] for g in gathered),
        "losses": losses,
        "mean_step_time_s": mean_steps,
        "wall_time_s": time.perf_counter() - wall0,
        "phases_s": phases,
        "step_wall_s_rank0": step_walls,
        "comm_latency_s": comm,
        "group_costs_s": costs,
        "group_memory_deltas_bytes": deltas,
        "group_in_op_peaks_bytes": peaks,
        "memory_meter": results[0].meta.get("meter"),
        "skipped_steps": skipped,
        "resumed_from": str(resumed) if resumed else None,
        "checkpoint_dir": ck.dir,
        "offload": offload,
        **cmp,
        "files": files,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(report(summary, out))


def _predict_offload(cfg: TrainConfig, plan: Any, sched: Any, costs: Any, deltas: Any, comm: float,
                     results: list, plain: Timeline, peaks: Any) -> tuple[Timeline, dict[str, Any]]:
    """The run's transfers on the simulator fed the measured per-op costs and bytes
    (each transfer's measured size), and the report's offload block."""
    from ..models.config import layer_ranges

    o = cfg.offload
    stats = [r.meta.get("offload") or {} for r in results]
    moved = {int(st): b for s in stats for st, b in s.get("moved_by_stage", {}).items()}
    # The transfers as this run issued them (the plan made before the start), on the
    # simulator's timeline with the measured costs and bytes.
    predicted, _ = predict_offload(sched, costs, deltas, comm, moved=moved, program=plan.schedule, peaks=peaks)
    layers = [len(r) for r in layer_ranges(cfg.model.layers, sched.num_stages)]
    rec = {int(st): b for s in stats for st, b in s.get("recomputed_by_stage", {}).items()}
    per_layer = {st: b / layers[st] for st, b in moved.items()}
    block = {
        "chunks": plan.chunks, "auto": o.chunks == "auto", "offload_time": o.time, "recompute": o.recompute,
        "transfers_per_step": [s.get("groups", 0) for s in stats],
        "skipped": plan.skipped,
        "moved_bytes": [s.get("moved_bytes", 0) for s in stats],
        "kept_bytes": [s.get("kept_bytes", 0) for s in stats],
        "recomputed_bytes": [s.get("recomputed_bytes", 0) for s in stats],
        "host_peak_bytes": [s.get("host_peak_bytes", 0) for s in stats],
        "host_reserved_bytes": [s.get("host_reserved_bytes", 0) for s in stats],
        "copy_s": [s.get("d2h_host_s", 0.0) + s.get("h2d_host_s", 0.0) for s in stats],
        "moved_per_layer_per_microbatch": per_layer,
        "without_recompute_per_layer_per_microbatch": {st: (b + rec.get(st, 0.0)) / layers[st]
                                                       for st, b in moved.items()},
        "peak_predicted_no_offload": plain.meta.get("peak_memory_in_op") or plain.peak_memory(),
        "peak_predicted_host": [max(x for _, x in _host_curve(predicted, r)) for r in range(predicted.num_ranks)],
    }
    return predicted, block


def _host_curve(tl: Timeline, rank: int) -> list[tuple[float, float]]:
    from ..passes.offload import host_memory_curve

    return host_memory_curve(tl, rank)


class NonFiniteError(RuntimeError):
    """A step's loss or gradients were not finite (``--on-nonfinite stop``). Every rank
    raises it at the same step (the check is agreed by an all-reduce)."""

    all_ranks = True  # the launcher reports the message, not "rank r failed"


def _agree_finite(res: Any, params: list, ctx: DistContext) -> tuple[float, list[int]]:
    """One all-reduce over the pipeline group: the step's loss (from the rank holding
    the last layer group) and the ranks whose loss or gradients are not finite."""
    bad = res.loss is not None and not math.isfinite(res.loss)
    grads = [p.grad for p in params if p.grad is not None]
    if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
        bad = True
    buf = torch.zeros(ctx.world_size + 1, dtype=torch.float64, device=ctx.device)
    buf[ctx.rank] = 1.0 if bad else 0.0
    if res.loss is not None:
        buf[-1] = res.loss
    dist.all_reduce(buf)
    vals = buf.tolist()
    return float(vals[-1]), [r for r in range(ctx.world_size) if vals[r] != 0.0]


def _nonfinite_message(n: int, loss: float, ranks: list[int]) -> str:
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    return f"step {n}: non-finite loss or gradients (loss {loss:g}; on {who})"


def _warn(msg: str, bar: Any = None) -> None:
    text = f"pipeoffload train: warning: {msg}"
    if bar is not None:
        bar.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


def _save(cfg: TrainConfig, ctx: DistContext, runner: PipelineRunner, opt: Any, n: int, losses: list[float],
          skipped: list[int], fingerprint: dict) -> None:
    tr = cfg.training
    payload = {
        "step": n, "rank": ctx.rank,
        "stages": {s: runner.modules[s].state_dict() for s in runner.my_stages},
        "optimizer": opt.state_dict(),
        "rng": capture_rng(ctx.device),
        "data": {"next_step": n + 1, "seed": tr.seed, "microbatch_size": tr.microbatch_size},
        "losses": list(losses), "skipped": list(skipped),
    }
    meta = {"fingerprint": fingerprint, "config": cfg.to_dict(), "losses": list(losses), "skipped": list(skipped)}
    save_checkpoint(cfg.checkpoint.dir, n, payload, rank=ctx.rank, world_size=ctx.world_size, meta=meta,
                    keep=cfg.checkpoint.keep)


def _resume(cfg: TrainConfig, ctx: DistContext, runner: PipelineRunner, opt: Any,
            fingerprint: dict) -> tuple[int, list[float], list[int], Path | None]:
    """Load the newest usable checkpoint (falling back past corrupt ones); returns the
    steps done, their losses, the skipped steps and the checkpoint used."""
    ck = load_latest(cfg.checkpoint.dir, rank=ctx.rank, world_size=ctx.world_size, expect=fingerprint, warn=_warn)
    if ck is None:
        if ctx.rank == 0:
            _warn(f"--resume: no checkpoint in {cfg.checkpoint.dir}; starting from step 1")
        return 0, [], [], None
    st = ck.state
    for s in runner.my_stages:
        runner.modules[s].load_state_dict(st["stages"][s])
    opt.load_state_dict(st["optimizer"])
    restore_rng(st["rng"], ctx.device)
    if ctx.rank == 0:
        print(f"pipeoffload train: resuming from {ck.path} (step {ck.step})", file=sys.stderr, flush=True)
    return ck.step, list(st["losses"]), list(st["skipped"]), ck.path


def _output_dir(path: str | None) -> Path:
    p = Path(path) if path else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _write_outputs(out: Path, measured: Timeline, predicted: Timeline) -> dict[str, str]:
    files: dict[str, str] = {}
    try:
        from ..viz.png import draw_timeline

        draw_timeline(measured, out / "timeline.png")
        files["timeline_png"] = str(out / "timeline.png")
        draw_timeline(predicted, out / "predicted.png")
        files["predicted_png"] = str(out / "predicted.png")
    except ImportError as e:  # drawing module not available
        files["timeline_png"] = f"not written ({e})"
    try:
        from ..viz.trace import write_trace

        write_trace(measured, out / "trace.json")
        files["trace"] = str(out / "trace.json")
        write_trace(predicted, out / "predicted_trace.json")
        files["predicted_trace"] = str(out / "predicted_trace.json")
    except ImportError as e:
        files["trace"] = f"not written ({e})"
    ops = [{"rank": e.rank, "kind": e.op.kind.value, "stage": e.op.stage, "chunk": e.op.chunk,
            "microbatch": e.op.microbatch, "peer": e.op.peer, "stream": e.stream, "start": e.start,
            "end": e.end, "mem": e.mem} for e in sorted(measured.events, key=lambda e: (e.rank, e.start))]
    (out / "timeline.json").write_text(json.dumps({"time_unit": "s", "memory_unit": "bytes", "ops": ops}))
    files["timeline_json"] = str(out / "timeline.json")
    return files


def _mib(x: float) -> str:
    return f"{x / 2**20:.2f}"


def _offload_lines(off: dict[str, Any]) -> list[str]:
    per = off["moved_per_layer_per_microbatch"]
    without = off["without_recompute_per_layer_per_microbatch"]
    kib = lambda d: ", ".join(f"{int(st)}: {b / 1024:.0f}" for st, b in sorted(d.items(), key=lambda x: int(x[0])))  # noqa: E731
    how = "auto" if off["auto"] else "--offload-chunks"
    line = (f"offload: C={off['chunks']} ({how}; planned offload_time {off['offload_time']:g}), "
            f"{sum(off['transfers_per_step'])} transfers/step, recompute {'on' if off['recompute'] else 'off'}; "
            f"KiB moved per layer and microbatch by layer group {{{kib(per)}}}")
    if off["recompute"]:
        line += f" ({{{kib(without)}}} without recompute)"
    return [line]


def report(summary: dict[str, Any], out: Path) -> str:
    """The end-of-run text: loss, step time, the per-rank table, files."""
    L = summary["losses"]
    s = summary["schedule"]
    lines = [
        "",
        f"pipeoffload train: {s['name']} p={s['p']} m={s['m']} v={s['v']} ({s['layer_groups']} layer groups), "
        f"{summary['model_parameters'] / 1e6:.2f}M parameters, {summary['backend']} on {summary['device']}",
        f"loss {L[0]:.3f} -> {L[-1]:.3f} over {len(L)} steps; wall {summary['wall_time_s']:.1f} s",
        f"bubble measured {summary['bubble_measured']:.3f}, predicted {summary['bubble_predicted']:.3f} "
        f"(simulator fed the measured per-op medians; comm latency {1000 * summary['comm_latency_s']:.2f} ms); "
        f"last step makespan {1000 * summary['makespan_measured_s']:.0f} ms measured, "
        f"{1000 * summary['makespan_predicted_s']:.0f} ms predicted",
    ]
    off = summary.get("offload")
    if off:
        lines += _offload_lines(off)
    lines += [
        "",
        f"{'rank':>4} {'step ms':>8} {'busy ms':>8} {'bubble':>7} {'pred':>6} "
        f"{'peak act MiB':>12} {'pred MiB':>9} {'err':>6}"
        + (f" {'host MiB':>9} {'moved MiB':>10} {'no-offload MiB':>15}" if off else ""),
    ]
    for r, row in enumerate(summary["ranks"]):
        lines.append(
            f"{row['rank']:>4} {1000 * summary['mean_step_time_s'][r]:>8.0f} {1000 * row['busy_s']:>8.0f} "
            f"{row['bubble_measured']:>7.3f} {row['bubble_predicted']:>6.3f} "
            f"{_mib(row['peak_memory_measured']):>12} {_mib(row['peak_memory_predicted']):>9} "
            f"{100 * row['peak_memory_error']:>5.1f}%"
            + (f" {_mib(off['host_peak_bytes'][r]):>9} {_mib(off['moved_bytes'][r]):>10} "
               f"{_mib(off['peak_predicted_no_offload'][r]):>15}" if off else "")
        )
    lines += [
        "",
        f"(step ms: mean over steps 2..; busy, bubble: last step; activation memory by the "
        f"{summary['memory_meter']} meter"
        + ("; peak act = device-resident, host = peak host memory in use, moved = device->host bytes per step, "
           "no-offload = predicted peak without offload)" if off else ")"),
        f"outputs in {out}/: " + ", ".join(Path(v).name for v in summary["files"].values() if not v.startswith("not ")),
    ]
    if summary.get("skipped_steps"):
        lines.append(f"skipped steps (non-finite loss or gradients): {', '.join(map(str, summary['skipped_steps']))}")
    if summary.get("checkpoint_dir"):
        resumed = f"; resumed from {summary['resumed_from']}" if summary.get("resumed_from") else ""
        lines.append(f"checkpoints in {summary['checkpoint_dir']}/{resumed}")
    return "\n".join(lines)
