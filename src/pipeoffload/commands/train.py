"""`pipeoffload train`: train the reference transformer with a pipeline schedule.

The main job (``pipeoffload`` with no verb runs it with the defaults): spawns the
ranks itself (or runs under ``torchrun``), shows a progress bar, and ends with a
per-rank table of step time, measured/predicted bubble and peak activation memory,
plus timeline.html, a PNG timeline, trace JSON and summary.json. torch is imported only when run.

``--dp D --tp T`` run the pipeline inside a ``("dp", "pp", "tp")`` device mesh of
``P·D·T`` ranks (the report adds a row per rank with its coordinates and the DP/TP
communication time); ``--config FILE`` reads a TOML file such as the one
``pipeoffload plan --emit-config`` writes (:func:`emit_config`), whose ``[plan]``
prediction the report puts beside the measured figures.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..errors import ParameterError
from ..recompute import Recompute
from ..training.config import TrainConfig, config_from_plan
from .common import add_ranks_arg, offload_warning, output_dir, write_output

#: Each flag (by its argparse dest) and the configuration key it overrides.
_CONFIG_KEYS = {
    "schedule": "schedule.name", "p": "schedule.ranks", "m": "schedule.microbatches", "v": "schedule.v",
    "g": "schedule.g", "mem_limit": "schedule.mem_limit",
    "dp": "parallel.dp", "tp": "parallel.tp", "fsdp": "parallel.fsdp", "sequence_parallel": "parallel.sequence_parallel",
    "steps": "training.steps", "microbatch_size": "training.microbatch_size", "lr": "training.lr",
    "corpus": "training.corpus", "seed": "training.seed", "eval_every": "training.eval_every",
    "holdout": "training.holdout",
    "layers": "model.layers", "hidden": "model.hidden", "heads": "model.heads", "kv_heads": "model.kv_heads",
    "seq_len": "model.seq_len",
    "output": "runtime.output", "timeout": "runtime.timeout_s", "backend": "runtime.backend",
    "threads": "runtime.threads",
    "offload": "offload.offload_chunks", "offload_time": "offload.offload_time", "recompute": "offload.recompute",
    "offload_infeasible": "offload.on_infeasible", "offload_stash": "offload.stash",
    "fault_injection": "runtime.fault_injection", "on_nonfinite": "training.on_nonfinite",
    "checkpoint_dir": "checkpoint.dir", "checkpoint_every": "checkpoint.every", "checkpoint_keep": "checkpoint.keep",
    "resume": "checkpoint.resume",
}


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "train",
        help="train the reference transformer on the bundled corpus with a pipeline schedule (the main job)",
        description="Spawn P x D x T local ranks (--ranks, --dp, --tp; gloo on CPU; or run under torchrun, NCCL "
        "with CUDA), train the reference "
        "decoder-only transformer on a byte-level corpus (the stdlib documentation topics, or --corpus FILE) with "
        "the chosen schedule, and report per-rank step time, measured vs predicted bubble and peak activation "
        "memory. Writes summary.json, timeline.png, trace.json to --output (default runs/<timestamp>). "
        "Flags override the --config TOML file, which overrides the defaults.",
    )
    for add_group in (_schedule_args, _parallel_args, _offload_args, _training_args, _model_args, _runtime_args, _reliability_args):
        add_group(parser)
    parser.set_defaults(func=run)
    return parser


def _schedule_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("schedule")
    g.add_argument("--schedule", "-s", default=None, help="schedule name (default group-interleaved)")
    add_ranks_arg(g, default=None)
    g.add_argument("-m", "--microbatches", dest="m", type=int, default=None, help="microbatches per step (default 8)")
    g.add_argument("-v", "--chunks", dest="v", type=int, default=None, help="chunks per rank (schedule default)")
    g.add_argument("-g", "--group", dest="g", type=int, default=None, help="group size for group-interleaved")
    g.add_argument("--mem-limit", type=float, default=None, help="memory limit for zb-auto (units)")


def _parallel_args(parser: argparse.ArgumentParser) -> None:
    par = parser.add_argument_group("data and tensor parallelism (a device mesh of --ranks x --dp x --tp ranks)")
    par.add_argument("--dp", type=int, default=None, metavar="D",
                     help="data-parallel replicas of every pipeline rank (default 1): gradients all-reduced, "
                          "bucketed and overlapped with the rest of the pipeline")
    par.add_argument("--tp", type=int, default=None, metavar="T",
                     help="tensor-parallel ranks inside every stage (default 1; DTensor colwise/rowwise); must "
                          "divide the heads, kv heads and SwiGLU width")
    par.add_argument("--fsdp", action="store_const", const=True, default=None,
                     help="shard the stages over the --dp group (FSDP2 fully_shard per layer group) instead of "
                          "replicating them")
    par.add_argument("--sequence-parallel", action="store_const", const=True, default=None,
                     help="tensor parallelism with sequence parallelism (needs --tp > 1)")


def _offload_args(parser: argparse.ArgumentParser) -> None:
    o = parser.add_argument_group("activation offload (PipeOffload)")
    o.add_argument("--offload", type=_offload_arg, default=None, metavar="auto|none|C",
                   help="offload activations to host memory: 'auto' (default: the offload pass picks the number of "
                        "chunks with the lowest peak), 'none', or C (chunks c < C of every rank)")
    o.add_argument("--offload-chunks", dest="offload", type=_offload_chunks_arg, default=None, metavar="C",
                   help="same as --offload C")
    o.add_argument("--offload-time", type=float, default=None, metavar="X",
                   help="planned one-way transfer time of a chunk's activations, as a multiple of its F+B+W time "
                        "(default 0: transfers assumed free; on CPU they are memcpy)")
    o.add_argument("--offload-infeasible", choices=["skip", "delay", "error"], default=None,
                   help="a reload that cannot finish before its backward: drop that offload (default), delay the "
                        "backward, or fail")
    o.add_argument("--recompute", action="store_const", const=True, default=None,
                   help="recompute norm and SwiGLU elementwise outputs in backward instead of offloading them")
    o.add_argument("--offload-stash", action="store_const", const=True, default=None,
                   help="also offload, between each B and its W, what only W needs (the weight-gradient stash: "
                        "linear inputs and output gradients); helps the zero-bubble and V schedules")


def _training_args(parser: argparse.ArgumentParser) -> None:
    t = parser.add_argument_group("training")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default 60)")
    t.add_argument("--microbatch-size", type=int, default=None, help="sequences per microbatch (default 4)")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 3e-3)")
    t.add_argument("--corpus", default=None, metavar="FILE", help="train on this text file instead of the bundled one")
    t.add_argument("--seed", type=int, default=None, help="seed of the data order and of dropout's random streams")
    t.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="validation loss on held-out text every N steps and after the last (default 20; 0 = off)")
    t.add_argument("--holdout", type=float, default=None, metavar="F",
                   help="fraction of the corpus (its end) held out for validation, never trained on (default 0.05)")


def _model_args(parser: argparse.ArgumentParser) -> None:
    mdl = parser.add_argument_group("model")
    mdl.add_argument("--layers", type=int, default=None, help="transformer layers (default 8; >= p*v)")
    mdl.add_argument("--hidden", type=int, default=None, help="hidden size (default 128)")
    mdl.add_argument("--heads", type=int, default=None, help="attention heads (default 4)")
    mdl.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default 2)")
    mdl.add_argument("--seq-len", type=int, default=None, help="sequence length (default 128)")


def _runtime_args(parser: argparse.ArgumentParser) -> None:
    r = parser.add_argument_group("runtime")
    r.add_argument("--output", "-o", default=None, metavar="DIR", help="output folder (default runs/<timestamp>)")
    r.add_argument("--config", default=None, metavar="FILE",
                   help="TOML file with [model] [schedule] [parallel] [offload] [training] [runtime] [checkpoint] "
                        "[plan] (e.g. written by `pipeoffload plan --emit-config`)")
    r.add_argument("--timeout", type=float, default=None, help="seconds any blocking wait may take (default 120)")
    r.add_argument("--backend", default=None, choices=["auto", "gloo", "nccl"], help="process-group backend")
    r.add_argument("--threads", type=int, default=None, help="torch threads per CPU rank (default cores/ranks)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")


def _reliability_args(parser: argparse.ArgumentParser) -> None:
    c = parser.add_argument_group("reliability")
    c.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="save checkpoints (one step-NNNNNNNN/ folder per save: a file per rank, manifest last)")
    c.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="save every N steps and after the last (default 0: only after the last)")
    c.add_argument("--checkpoint-keep", type=int, default=None, metavar="K", help="checkpoints kept (default 3)")
    c.add_argument("--resume", action="store_const", const=True, default=None,
                   help="continue from the newest usable checkpoint in --checkpoint-dir (corrupt ones are skipped)")
    c.add_argument("--on-nonfinite", choices=["stop", "skip"], default=None,
                   help="non-finite loss or gradients (checked on every rank before the optimizer step): stop the "
                        "run (default) or skip the step")
    c.add_argument("--fault-injection", default=None, metavar="SPEC",
                   help="testing aid: op=kill|raise|hang|nan_loss|nan_grad,rank=R,step=N[,at=B] "
                        "(also $PIPEOFFLOAD_FAULT)")


def _offload_arg(text: str) -> int | str:
    t = text.strip().lower()
    if t in ("auto", "none", "off"):
        return t
    return _offload_chunks_arg(t)


def _offload_chunks_arg(text: str) -> int:
    """The number of chunks to offload, C >= 0."""
    try:
        c = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, none or a number of chunks, got {text!r}") from None
    if c < 0:
        raise argparse.ArgumentTypeError(f"number of chunks must be >= 0, got {c}")
    return c


#: Sections whose change makes a ``[plan]`` prediction (``plan --emit-config``) another configuration's.
_PLANNED = ("model", "schedule", "parallel", "offload")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults ← ``--config`` file ← flags. A file's ``[plan]`` prediction is dropped (with
    a warning) when flags change what was planned: it would be compared with another run."""
    over = {key: getattr(args, dest, None) for dest, key in _CONFIG_KEYS.items()}
    if getattr(args, "no_progress", False):
        over["runtime.progress"] = False
    path = getattr(args, "config", None)
    cfg = TrainConfig.load(path, over)
    if cfg.plan.step_time_s is not None:
        planned = TrainConfig.load(path)
        changed = [sec for sec in _PLANNED if getattr(cfg, sec) != getattr(planned, sec)]
        if cfg.training.microbatch_size != planned.training.microbatch_size:
            changed.append("training.microbatch_size")
        if changed:
            print(f"pipeoffload train: warning: the [plan] prediction is for {path} as written; flags change "
                  f"{', '.join(changed)}, so the report does not compare with it", file=sys.stderr)
            cfg.plan = type(cfg.plan)()
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    sched = cfg.check()  # parameter errors before torch is imported or any process starts
    if cfg.checkpoint.resume:
        from ..training.checkpoint import fingerprint, precheck

        precheck(cfg.checkpoint.dir, sched.num_ranks, fingerprint(cfg, sched), param="checkpoint.dir")
    first_rank = os.environ.get("RANK", "0") == "0"  # the one process that reports (and writes)
    if first_rank and cfg.runtime.output:
        output_dir("--output", cfg.runtime.output)
    try:
        from ..runtime.launcher import LaunchError, check_external_world
        from ..training.job import run_training
    except ModuleNotFoundError as e:
        if e.name == "torch":
            print("pipeoffload train: error: the runtime needs torch (pip install 'pipeoffload[runtime]')",
                  file=sys.stderr)
            return 2
        raise
    # under torchrun: WORLD_SIZE is pipeline ranks × dp × tp, checked before any rendezvous
    check_external_world(cfg.world_size, param="world_size" if cfg.world_size == sched.num_ranks
                         else "parallel.world_size")
    if first_rank:
        _warn_if_nothing_offloaded(cfg, sched)
    try:
        run_training(cfg)
    except LaunchError as e:
        print(f"pipeoffload train: error: {e}", file=sys.stderr)
        return 1
    return 0


def _warn_if_nothing_offloaded(cfg: TrainConfig, sched) -> None:
    off = cfg.plan_offload(sched)
    warning = offload_warning(off, tolerance_flag=None) if off is not None else None
    if warning:
        print(f"pipeoffload train: warning: {warning}", file=sys.stderr)


def runtime_can_run(config: Any) -> bool:
    """Whether the runtime can run a planned configuration as planned: recompute none or
    elementwise (the runtime's ``offload.recompute``), and TP without sequence parallelism."""
    return config.recompute in (Recompute.NONE, Recompute.ELEMENTWISE) and (config.split.tp == 1 or not config.split.sp)


def emit_config(result, path: str, *, quiet: bool = False) -> TrainConfig:
    """``pipeoffload plan --emit-config``: the plan's best configuration that the runtime
    can run (:func:`runtime_can_run`; a note says so when that is not the best) in this command's
    ``--config`` format (:func:`~pipeoffload.training.config.config_from_plan`), written to
    ``path`` (errors name ``--emit-config``); prints where and how to run it unless
    ``quiet``. Returns the configuration written."""
    chosen = next((c for c in result.configs if runtime_can_run(c)), None)
    if chosen is None:
        raise ParameterError("emit_config", "none of the planned configurations runs on this runtime (it has no "
                             "selective/full recompute and no sequence parallelism yet); plan with "
                             "`--sequence-parallel off --recompute both`, or show more with `--top K`")
    if chosen is not result.best:
        print(f"note: the best plan ({result.best.describe()}) needs what the runtime lacks (selective/full "
              f"recompute or sequence parallelism); writing the best one it runs: {chosen.describe()}")
    cfg = config_from_plan(result, chosen)
    header = (f"pipeoffload plan's best runnable configuration: {cfg.plan.configuration}\n"
              f"run it with: pipeoffload train --config {path}")
    write_output("--emit-config", path, lambda p: cfg.dump(p, header=header))
    if not quiet:
        print(f"wrote {path}: `pipeoffload train --config {path}` runs it ({cfg.world_size} processes)")
    return cfg
