"""The training job behind ``pipeoffload train``: the reference transformer on the
byte-level corpus, run by :class:`~pipeoffload.runtime.executor.PipelineRunner` on
every rank, with a progress bar, and a measured-vs-predicted report at the end.

:func:`run_training` (parent process) checks the configuration, then launches
:func:`train_worker` on every rank, which runs a :class:`Trainer`: :meth:`~Trainer.build`
(schedule, offload plan, runner, optimizer, data, resume), :meth:`~Trainer.step` per
optimizer step, :meth:`~Trainer.report` at the end. Rank 0 writes, in the output folder:

- ``summary.json``: configuration, losses per step, validation losses, per-rank step
  time, measured and predicted bubble, measured and predicted peak activation memory,
  per-group costs;
- ``timeline.html`` (the explorer: measured last step above the prediction, with
  each op's error; self-contained, works offline),
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

from ..passes.comm import comm_volume
from ..schedules import ScheduleSpec, build
from ..timeline import Timeline
from ..runtime.executor import PipelineRunner, StepResult
from ..runtime.launcher import DistContext, launch
from ..runtime.offload_store import OffloadStore
from .config import TrainConfig
from .checkpoint import capture_rng, load_latest, restore_rng, save_checkpoint
from .checkpoint import fingerprint as checkpoint_fingerprint
from .faults import FaultInjector
from .faults import resolve as resolve_fault
from .measure import (compare, estimate_comm, gather_results, group_medians, group_peaks, measured_timeline,
                      predict, predict_offload)
from .report import format_report, mesh_block, output_dir, plan_block, write_outputs


#: Steps at the end of a run whose per-op times feed the prediction.
MEDIAN_STEPS = 10


def run_training(cfg: TrainConfig) -> None:
    """Check ``cfg`` (raising ParameterError on bad input, before any process starts),
    then run the job on ``cfg.world_size`` ranks (pipeline ranks × dp × tp)."""
    cfg.check()
    launch(train_worker, cfg.world_size, (cfg,), backend=cfg.runtime.backend,
           init_timeout_s=cfg.runtime.init_timeout_s, threads=cfg.runtime.threads)


def train_worker(ctx: DistContext, cfg: TrainConfig) -> None:
    """One rank of the job (what :func:`run_training` launches): a :class:`Trainer` run."""
    Trainer(ctx, cfg).run()


def _learning_rate(cfg: TrainConfig, step: int) -> float:
    t = cfg.training
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    # cosine to 10% over the remaining steps
    rest = max(1, t.steps - t.warmup_steps)
    frac = (step - t.warmup_steps) / rest
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


class Trainer:
    """The training job on one rank: :meth:`build`, then :meth:`step` for each
    optimizer step, then :meth:`report` (a collective; rank 0 writes and prints).

    Every rank runs the same sequence of collectives (the step's finiteness
    all-reduce, checkpoint barriers, the final gather), so all ranks must call the
    same methods with the same steps. Steps are 0-based in code and numbered from 1
    in messages, faults and checkpoints.
    """

    def __init__(self, ctx: DistContext, cfg: TrainConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.wall0 = time.perf_counter()
        self.out = output_dir(cfg.runtime.output) if ctx.rank == 0 else None  # named by the start time
        self.phases: dict[str, float] = {}
        # Filled by build():
        self.start = 0  #: the first step to run (after a resume: the steps already done)
        self.losses: list[float] = []
        self.val_losses: list[tuple[int, float]] = []  #: (1-based step, validation loss)
        self.skipped: list[int] = []  #: 1-based steps dropped by --on-nonfinite skip
        self.resumed: Path | None = None
        # Filled by step():
        self.samples: list = []  #: per-op samples of the last steps (the prediction's input)
        self.step_times: list[float] = []
        self.dp_comm: list[float] = []  #: s per step in DP gradient reduction (StepResult.dp_comm_s)
        self.tp_comm: list[float] = []  #: s per step in TP collectives (StepResult.tp_comm_s)
        self.coords = {"pp": ctx.rank, "dp": 0, "tp": 0}  #: this rank's mesh coordinates (set by build())
        self.step_walls: list[float] = []
        self.last: StepResult | None = None
        self.bar: Any = None
        self.t_loop = self.wall0  #: start of the training phase (set by build())

    # ------------------------------------------------------------------ the job
    def run(self) -> None:
        """build → every remaining step (progress bar on rank 0) → report."""
        self.build()
        steps = self.cfg.training.steps
        if self.start >= steps:
            if self.ctx.rank == 0:
                print(f"pipeoffload train: checkpoint {self.resumed} already has {self.start} of --steps {steps}; "
                      "nothing to do", file=sys.stderr)
            return
        self.bar = self._progress_bar()
        for step in range(self.start, steps):
            res = self.step(step)
            if self.bar is not None:
                val = {"val": f"{self.val_losses[-1][1]:.3f}"} if self.val_losses else {}
                self.bar.set_postfix(loss=f"{self.losses[-1]:.3f}", **val, step_ms=f"{1000 * res.step_time:.0f}")
                self.bar.update(1)
        if self.bar is not None:
            self.bar.close()
        self.phases["train_s"] = time.perf_counter() - self.t_loop
        self.report()

    # ------------------------------------------------------------------ build
    def build(self) -> None:
        """The schedule, its offload plan, this rank's runner (``phases["build_s"]``),
        then the optimizer, the data and — with ``checkpoint.resume`` — the state of
        the newest usable checkpoint (the training phase's clock starts before these)."""
        self._build_runner()
        self.phases["build_s"] = time.perf_counter() - self.wall0
        self.t_loop = time.perf_counter()
        self._build_optimizer_and_data()
        self.fingerprint = checkpoint_fingerprint(self.cfg, self.sched)
        if self.cfg.checkpoint.resume:
            self.start, self.resumed = self._resume()

    def _build_runner(self) -> None:
        from ..models.transformer import build_stage, lm_loss

        cfg, ctx, sc, rt = self.cfg, self.ctx, self.cfg.schedule, self.cfg.runtime
        self.sched = build(ScheduleSpec(sc.name, sc.ranks, sc.microbatches, v=sc.v, g=sc.g, mem_limit=sc.mem_limit))
        num_stages = self.sched.num_stages
        # PipeOffload: the offload pass's transfer ops in every rank's program (None: offload off).
        self.plan = cfg.plan_offload(self.sched)
        self.run_sched = self.plan.schedule if self.plan is not None else self.sched
        store = OffloadStore(recompute=cfg.offload.recompute_level().elementwise) if self.plan is not None else None
        self.mesh, make_stage = self._mesh_and_stage_builder(lambda s: build_stage(cfg.model, s, num_stages))
        pp_rank = self.coords["pp"]
        holds_loss = self.sched.placement.rank_of(num_stages - 1) == pp_rank
        self.faults = FaultInjector(resolve_fault(rt.fault_injection), ctx.rank, holds_loss)
        mesh_kw = ({"mesh": self.mesh, "data_parallel": "fsdp" if cfg.parallel.fsdp else "auto"}
                   if self.mesh is not None else {"rank": ctx.rank})
        self.runner = PipelineRunner(make_stage, self.faults.wrap_loss(lm_loss), self.run_sched, device=ctx.device,
                                     timeout_s=rt.timeout_s, meter=rt.memory_meter, recv_lookahead=rt.recv_lookahead,
                                     activation_store=store, seed=cfg.training.seed, **mesh_kw)
        if self.faults.active:
            self.runner.before_op = self.faults.before_op
        self.params = self.runner.parameters()

    def _mesh_and_stage_builder(self, make_stage: Any) -> tuple[Any, Any]:
        """With ``parallel.dp`` or ``parallel.tp`` > 1: the ``("dp", "pp", "tp")`` device
        mesh (a collective) and a stage builder that applies tensor parallelism on
        ``mesh["tp"]``; sets ``self.coords``. A pure pipeline keeps the default group (no mesh)."""
        par, ctx = self.cfg.parallel, self.ctx
        if par.dp == 1 and par.tp == 1:
            self.coords = {"pp": ctx.rank, "dp": 0, "tp": 0}
            return None, make_stage
        from ..runtime.mesh import build_mesh, coords

        mesh = build_mesh(self.sched.num_ranks, par.dp, par.tp, device_type=ctx.device.type)
        self.coords = coords(mesh)
        if par.tp == 1:
            return mesh, make_stage
        from ..runtime.tensor_parallel import parallelize_stage

        tp_mesh, sp = mesh["tp"], par.sequence_parallel
        return mesh, lambda s: parallelize_stage(make_stage(s), tp_mesh, sequence_parallel=sp)

    def _build_optimizer_and_data(self) -> None:
        from ..models.data import ByteCorpus, load_corpus

        tr = self.cfg.training
        self.opt = torch.optim.AdamW(self.params, lr=tr.lr, betas=(0.9, 0.95), weight_decay=tr.weight_decay)
        data = load_corpus(tr.corpus)
        self.corpus = ByteCorpus(data, self.cfg.model.seq_len, tr.seed, holdout=tr.holdout)
        self.val_corpus = ByteCorpus(data, self.cfg.model.seq_len, tr.seed, holdout=tr.holdout,
                                     part="validation") if tr.eval_every else None

    def _progress_bar(self) -> Any:
        """tqdm on rank 0 (stderr), None elsewhere or with ``runtime.progress`` off."""
        if self.ctx.rank != 0 or not self.cfg.runtime.progress:
            return None
        from tqdm import tqdm

        s = self.sched
        return tqdm(total=self.cfg.training.steps, initial=self.start, unit="step", file=sys.stderr,
                    dynamic_ncols=True, desc=f"train {s.name} p={s.num_ranks} m={s.num_microbatches}")

    # ------------------------------------------------------------------ step
    def step(self, step: int) -> StepResult:
        """Optimizer step ``step`` (0-based): the pipeline's forward and backward, the
        agreed finiteness check (stop, or skip the update), the optimizer, a checkpoint
        when due, and the bookkeeping the report needs. Returns the runner's result."""
        tr, n = self.cfg.training, step + 1
        t_step = time.perf_counter()
        self.faults.begin_step(n)
        xs, ys = self._replica_microbatches(self.corpus, step)
        for grp in self.opt.param_groups:
            grp["lr"] = _learning_rate(self.cfg, step)
        res = self.runner.step(xs, ys)
        self.faults.after_backward(self.params)
        self._update_if_finite(n, res)
        if tr.eval_every and (n % tr.eval_every == 0 or n == tr.steps):
            self.validate(n)
        ck = self.cfg.checkpoint
        if ck.dir and (n == tr.steps or (ck.every and n % ck.every == 0)):
            self._save_checkpoint(n)
        self.step_times.append(res.step_time)
        self.dp_comm.append(res.dp_comm_s)
        self.tp_comm.append(res.tp_comm_s)
        self.step_walls.append(time.perf_counter() - t_step)
        # Per-op medians from the last few steps (the first step of a run includes setup
        # and warm-up): the predicted timeline then reflects the conditions of the step drawn.
        if step >= max(self.start + 1, tr.steps - MEDIAN_STEPS) or step == tr.steps - 1:
            self.samples.extend(res.samples)
        self.last = res
        return res

    def _replica_microbatches(self, corpus: Any, step: int) -> tuple[list, list]:
        """This data-parallel replica's ``m`` microbatches of step ``step``: replica ``d``
        takes microbatches ``d·m .. d·m+m-1`` of the global batch (TP ranks of a replica
        read the same ones), so the step trains on ``dp·m`` distinct microbatches."""
        m, size = self.sched.num_microbatches, self.cfg.training.microbatch_size
        first = self.coords["dp"] * m
        pairs = [corpus.batch(step, first + j, size) for j in range(m)]
        return [x for x, _ in pairs], [y for _, y in pairs]

    def _update_if_finite(self, n: int, res: StepResult) -> None:
        """The optimizer update of step ``n`` when every rank's loss and gradients are
        finite; otherwise stop (NonFiniteError on every rank) or skip the update."""
        # every rank, before the optimizer step; the loss is the mean over the dp replicas
        loss, bad = _agree_finite(res, self.params, self.ctx, self._loss_weight())
        self.losses.append(loss)
        if bad:
            why = _nonfinite_message(n, loss, bad)
            if self.cfg.training.on_nonfinite == "stop":
                if self.cfg.checkpoint.dir:
                    why += f"; last checkpoint in {self.cfg.checkpoint.dir} (continue with --resume)"
                raise NonFiniteError(why + "; stopped (--on-nonfinite stop; 'skip' drops such steps)")
            self.skipped.append(n)
            if self.ctx.rank == 0:
                _warn(why + "; step skipped (--on-nonfinite skip)", self.bar)
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def validate(self, n: int) -> float:
        """The validation loss after step ``n``: a pipelined forward (``eval_step``) of
        ``m`` fixed microbatches of held-out text; agreed by every rank (an all-reduce)."""
        tr, m = self.cfg.training, self.sched.num_microbatches
        xs, ys = self.val_corpus.microbatches(0, m, tr.microbatch_size)
        res = self.runner.eval_step(xs if self.runner.has_first_stage else None,
                                    ys if self.runner.has_last_stage else None)
        loss = res.loss * self._loss_weight() if res.loss is not None else 0.0
        buf = torch.tensor([loss], dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(buf)
        self.val_losses.append((n, float(buf.item())))
        return self.val_losses[-1][1]

    def _loss_weight(self) -> float:
        """This rank's share in a world sum of losses: 1/dp on the tp-index-0 rank of each
        replica (TP ranks hold the same loss), 0 elsewhere; so the sum is the replicas' mean."""
        return 1.0 / self.cfg.parallel.dp if self.coords["tp"] == 0 else 0.0

    # ------------------------------------------------------------------ report
    def report(self) -> None:
        """Gather every rank's last step and samples on rank 0 (a collective), which
        then predicts, compares, writes the output folder and prints the report."""
        t_report = time.perf_counter()
        gathered = gather_results({"result": self.last, "samples": self.samples, "step_times": self.step_times,
                                   "params": sum(p.numel() for p in self.params), "coords": dict(self.coords),
                                   "dp_comm_s": self.dp_comm, "tp_comm_s": self.tp_comm})
        if self.ctx.rank != 0:
            return
        # The pipeline of replica (dp 0, tp 0) is the timeline drawn and predicted (every
        # replica runs the same program); the mesh block reports every rank.
        replica = sorted((g for g in gathered if g["coords"]["dp"] == 0 and g["coords"]["tp"] == 0),
                         key=lambda g: g["coords"]["pp"])
        results = [g["result"] for g in replica]
        measured, predicted, fed, offload = self._measured_and_predicted(results, gathered)
        s = self.sched
        title = f"pipeoffload train: {s.name} p={s.num_ranks} m={s.num_microbatches} v={s.chunks}, last step"
        files = write_outputs(self.out, measured, predicted, title)
        self.phases["report_s"] = time.perf_counter() - t_report
        summary = {**self._summary(replica, results, fed, offload), "mesh": mesh_block(self.cfg, gathered),
                   **compare(measured, predicted), "files": files}
        summary["plan"] = plan_block(self.cfg, summary)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        print(format_report(summary, self.out))

    def _measured_and_predicted(self, results: list[StepResult],
                                gathered: list[dict]) -> tuple[Timeline, Timeline, dict[str, Any], dict | None]:
        """The measured last step, the simulator's prediction fed the measured per-op
        medians (with the run's offload transfers), what it was fed, and the offload block."""
        num_stages = self.sched.num_stages
        all_samples = [s for g in gathered for s in g["samples"]]
        measured = measured_timeline(results, self.run_sched)
        costs, deltas = group_medians(all_samples, num_stages)
        comm = estimate_comm(measured)
        peaks = group_peaks(all_samples, num_stages)  # in-op peaks (e.g. inside a B), measured like the deltas
        predicted = predict(self.sched, costs, deltas, comm, peaks)
        offload = None
        if self.plan is not None:
            predicted, offload = self._offload_prediction(costs, deltas, comm, results, predicted, peaks)
        fed = {"comm_latency_s": comm, "group_costs_s": costs, "group_memory_deltas_bytes": deltas,
               "group_in_op_peaks_bytes": peaks}
        return measured, predicted, fed, offload

    def _summary(self, gathered: list[dict], results: list[StepResult], fed: dict[str, Any],
                 offload: dict | None) -> dict[str, Any]:
        """``summary.json`` up to the comparison rows and the files (same keys, same order)."""
        sched, ctx = self.sched, self.ctx
        mean_steps = [sum(g["step_times"][1:]) / max(1, len(g["step_times"]) - 1) if len(g["step_times"]) > 1
                      else g["step_times"][0] for g in gathered]
        return {
            "config": self.cfg.to_dict(),
            "schedule": {"name": sched.name, "p": sched.num_ranks, "m": sched.num_microbatches, "v": sched.chunks,
                         "params": sched.params, "layer_groups": sched.num_stages,
                         # the lowered program's sends (offload ops add none)
                         "messages": comm_volume(self.runner.program)},
            "device": str(ctx.device), "backend": ctx.backend, "world_size": ctx.world_size,
            "cpu_count": os.cpu_count(),
            "model_parameters": sum(g["params"] for g in gathered),
            "losses": self.losses,
            "val_losses": [list(v) for v in self.val_losses],
            "mean_step_time_s": mean_steps,
            "wall_time_s": time.perf_counter() - self.wall0,
            "phases_s": self.phases,
            "step_wall_s_rank0": self.step_walls,
            **fed,
            "memory_meter": results[0].meta.get("meter"),
            "skipped_steps": self.skipped,
            "resumed_from": str(self.resumed) if self.resumed else None,
            "checkpoint_dir": self.cfg.checkpoint.dir,
            "offload": offload,
        }

    def _offload_prediction(self, costs: Any, deltas: Any, comm: float, results: list[StepResult],
                            plain: Timeline, peaks: Any) -> tuple[Timeline, dict[str, Any]]:
        """The run's transfers on the simulator fed the measured per-op costs and bytes
        (each transfer's measured size), and the report's offload block."""
        from ..models.config import layer_ranges

        o, plan, sched = self.cfg.offload, self.plan, self.sched
        stats = [r.meta.get("offload") or {} for r in results]
        moved = {int(st): b for s in stats for st, b in s.get("moved_by_stage", {}).items()}
        # The transfers as this run issued them (the plan made before the start), on the
        # simulator's timeline with the measured costs and bytes.
        predicted, _ = predict_offload(sched, costs, deltas, comm, moved=moved, program=plan.schedule, peaks=peaks)
        layers = [len(r) for r in layer_ranges(self.cfg.model.layers, sched.num_stages)]
        rec = {int(st): b for s in stats for st, b in s.get("recomputed_by_stage", {}).items()}
        per_layer = {st: b / layers[st] for st, b in moved.items()}
        block = {
            "chunks": plan.offloaded_chunks, "auto": o.offload_chunks == "auto", "offload_time": o.offload_time,
            "recompute": bool(o.recompute_level()),
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
            "peak_predicted_host": [max(level for _, level in _host_curve(predicted, r))
                                    for r in range(predicted.num_ranks)],
        }
        return predicted, block

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, n: int) -> None:
        """This rank's part of the checkpoint after step ``n`` (1-based), with
        ``torch.distributed.checkpoint``: the runner's state (parameters by name, AdamW
        state, step counter), the run's history and this rank's RNG states."""
        cfg, ctx = self.cfg, self.ctx
        state = {**self.runner.state_dict(self.opt), **self._history_state(), **self._rng_state()}
        meta = {"fingerprint": self.fingerprint, "config": cfg.to_dict(), "losses": list(self.losses),
                "skipped": list(self.skipped)}
        save_checkpoint(cfg.checkpoint.dir, n, state, rank=ctx.rank, world_size=ctx.world_size, meta=meta,
                        keep=cfg.checkpoint.keep)

    def _history_state(self) -> dict[str, Any]:
        """``train.*`` keys: the same on every rank (written once)."""
        tr = self.cfg.training
        return {"train.losses": list(self.losses), "train.val_losses": [list(v) for v in self.val_losses],
                "train.skipped": list(self.skipped),
                "train.data": {"seed": tr.seed, "microbatch_size": tr.microbatch_size, "holdout": tr.holdout}}

    def _rng_state(self) -> dict[str, Any]:
        """``rng.rank<r>.*`` keys: this rank's Python and torch generator states."""
        rng = capture_rng(self.ctx.device)
        return {f"rng.rank{self.ctx.rank}.{k}": v for k, v in rng.items()}

    def _resume(self) -> tuple[int, Path | None]:
        """Load the newest usable checkpoint (falling back past corrupt ones) into the
        runner, the optimizer and the history; returns the steps done and the checkpoint used."""
        from ..runtime.state import init_optimizer_state

        cfg, ctx = self.cfg, self.ctx
        init_optimizer_state(self.opt)
        state = {**self.runner.state_dict(self.opt), **self._history_state(), **self._rng_state()}
        ck = load_latest(cfg.checkpoint.dir, state, rank=ctx.rank, world_size=ctx.world_size, group=None,
                         expect=self.fingerprint, warn=_warn)
        if ck is None:
            if ctx.rank == 0:
                _warn(f"--resume: no checkpoint in {cfg.checkpoint.dir}; starting from step 1")
            self.opt.state.clear()  # as a fresh optimizer: state made at its first step
            return 0, None
        self.runner.load_state_dict(state, self.opt)
        prefix = f"rng.rank{ctx.rank}."
        restore_rng({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}, ctx.device)
        self.losses, self.skipped = list(state["train.losses"]), list(state["train.skipped"])
        self.val_losses = [(int(a), float(b)) for a, b in state["train.val_losses"]]
        if ctx.rank == 0:
            print(f"pipeoffload train: resuming from {ck.path} (step {ck.step})", file=sys.stderr, flush=True)
        return ck.step, ck.path


def _host_curve(tl: Timeline, rank: int) -> list[tuple[float, float]]:
    from ..passes.offload import host_memory_curve

    return host_memory_curve(tl, rank)


class NonFiniteError(RuntimeError):
    """A step's loss or gradients were not finite (``--on-nonfinite stop``). Every rank
    raises it at the same step (the check is agreed by an all-reduce)."""

    all_ranks = True  # the launcher reports the message, not "rank r failed"


def _agree_finite(res: Any, params: list, ctx: DistContext, weight: float = 1.0) -> tuple[float, list[int]]:
    """One all-reduce over the world: the step's loss (the ranks holding the last layer
    group, each with ``weight``) and the ranks whose loss or gradients are not finite."""
    from ..runtime.data_parallel import local

    bad = res.loss is not None and not math.isfinite(res.loss)
    grads = [local(p.grad) for p in params if p.grad is not None]  # DTensor (TP, FSDP) shards: this rank's part
    if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
        bad = True
    buf = torch.zeros(ctx.world_size + 1, dtype=torch.float64, device=ctx.device)
    buf[ctx.rank] = 1.0 if bad else 0.0
    if res.loss is not None:
        buf[-1] = res.loss * weight
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
