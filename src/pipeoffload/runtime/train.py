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
from .launcher import DistContext, launch
from .measure import compare, estimate_comm, gather_results, group_medians, measured_timeline, predict


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
    runner = PipelineRunner(lambda s: build_stage(cfg.model, s, S), lm_loss, sched, rank=ctx.rank,
                            device=ctx.device, timeout_s=rt.timeout_s, meter=rt.memory_meter,
                            recv_lookahead=rt.recv_lookahead)
    params = runner.parameters()
    phases = {"build_s": time.perf_counter() - wall0}
    t_loop = time.perf_counter()
    opt = torch.optim.AdamW(params, lr=tr.lr, betas=(0.9, 0.95), weight_decay=tr.weight_decay)
    corpus = ByteCorpus(load_corpus(tr.corpus), cfg.model.seq_len, tr.seed)
    loss_rank = sched.placement.rank_of(S - 1)

    bar = None
    if ctx.rank == 0 and rt.progress:
        from tqdm import tqdm

        bar = tqdm(total=tr.steps, desc=f"train {sched.name} p={sched.num_ranks} m={sched.num_microbatches}",
                   unit="step", file=sys.stderr, dynamic_ncols=True)
    losses: list[float] = []
    samples = []
    step_times: list[float] = []
    last = None
    step_walls: list[float] = []
    for step in range(tr.steps):
        t_step = time.perf_counter()
        xs, ys = corpus.microbatches(step, sched.num_microbatches, tr.microbatch_size)
        for grp in opt.param_groups:
            grp["lr"] = _lr_at(cfg, step)
        res = runner.step(xs, ys)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lt = torch.tensor([res.loss if res.loss is not None else 0.0], dtype=torch.float64, device=ctx.device)
        dist.broadcast(lt, src=loss_rank)
        losses.append(float(lt.item()))
        step_times.append(res.step_time)
        step_walls.append(time.perf_counter() - t_step)
        # Per-op medians from the last few steps (step 0 includes setup and warm-up):
        # the predicted timeline then reflects the conditions of the step drawn.
        if step >= max(1, tr.steps - MEDIAN_STEPS) or tr.steps == 1:
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
    measured = measured_timeline(results, sched)
    costs, deltas = group_medians(all_samples, S)
    comm = estimate_comm(measured)
    predicted = predict(sched, costs, deltas, comm)
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
        "memory_meter": results[0].meta.get("meter"),
        **cmp,
        "files": files,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(report(summary, out))


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
        "",
        f"{'rank':>4} {'step ms':>8} {'busy ms':>8} {'bubble':>7} {'pred':>6} "
        f"{'peak act MiB':>12} {'pred MiB':>9} {'err':>6}",
    ]
    for r, row in enumerate(summary["ranks"]):
        lines.append(
            f"{row['rank']:>4} {1000 * summary['mean_step_time_s'][r]:>8.0f} {1000 * row['busy_s']:>8.0f} "
            f"{row['bubble_measured']:>7.3f} {row['bubble_predicted']:>6.3f} "
            f"{_mib(row['peak_memory_measured']):>12} {_mib(row['peak_memory_predicted']):>9} "
            f"{100 * row['peak_memory_error']:>5.1f}%"
        )
    lines += [
        "",
        f"(step ms: mean over steps 2..; busy, bubble: last step; activation memory by the "
        f"{summary['memory_meter']} meter)",
        f"outputs in {out}/: " + ", ".join(Path(v).name for v in summary["files"].values() if not v.startswith("not ")),
    ]
    return "\n".join(lines)
