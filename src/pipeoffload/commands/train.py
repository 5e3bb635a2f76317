"""`pipeoffload train`: train the reference transformer with a pipeline schedule.

The main job (``pipeoffload`` with no verb runs it with the defaults): spawns the
ranks itself (or runs under ``torchrun``), shows a progress bar, and ends with a
per-rank table of step time, measured/predicted bubble and peak activation memory,
plus a PNG timeline, trace JSON and summary.json. torch is imported only when run.
"""

from __future__ import annotations

import argparse
import sys

from ..runtime.config import TrainConfig

#: flag dest -> config key
_FLAGS = {
    "schedule": "schedule.name", "p": "schedule.stages", "m": "schedule.microbatches", "v": "schedule.v",
    "g": "schedule.g", "mem_limit": "schedule.mem_limit",
    "steps": "training.steps", "microbatch_size": "training.microbatch_size", "lr": "training.lr",
    "corpus": "training.corpus", "seed": "training.seed",
    "layers": "model.layers", "hidden": "model.hidden", "heads": "model.heads", "kv_heads": "model.kv_heads",
    "seq_len": "model.seq_len",
    "output": "runtime.output", "timeout": "runtime.timeout_s", "backend": "runtime.backend",
    "threads": "runtime.threads",
}


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="train the reference transformer on the bundled corpus with a pipeline schedule (the main job)",
        description="Spawn P local ranks (gloo on CPU; or run under torchrun, NCCL with CUDA), train the reference "
        "decoder-only transformer on a byte-level corpus (the stdlib documentation topics, or --corpus FILE) with "
        "the chosen schedule, and report per-rank step time, measured vs predicted bubble and peak activation "
        "memory. Writes summary.json, timeline.png, trace.json to --output (default runs/<timestamp>). "
        "Flags override the --config TOML file, which overrides the defaults.",
    )
    g = p.add_argument_group("schedule")
    g.add_argument("--schedule", "-s", default=None, help="schedule name (default group-interleaved)")
    g.add_argument("-p", "--stages", dest="p", type=int, default=None, help="pipeline ranks (default 4)")
    g.add_argument("-m", "--microbatches", dest="m", type=int, default=None, help="microbatches per step (default 8)")
    g.add_argument("-v", "--chunks", dest="v", type=int, default=None, help="chunks per rank (schedule default)")
    g.add_argument("-g", "--group", dest="g", type=int, default=None, help="group size for group-interleaved")
    g.add_argument("--mem-limit", type=float, default=None, help="memory limit for zb-auto (units)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps (default 60)")
    t.add_argument("--microbatch-size", type=int, default=None, help="sequences per microbatch (default 4)")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 3e-3)")
    t.add_argument("--corpus", default=None, metavar="FILE", help="train on this text file instead of the bundled one")
    t.add_argument("--seed", type=int, default=None, help="data order seed")
    mdl = p.add_argument_group("model")
    mdl.add_argument("--layers", type=int, default=None, help="transformer layers (default 8; >= p*v)")
    mdl.add_argument("--hidden", type=int, default=None, help="hidden size (default 128)")
    mdl.add_argument("--heads", type=int, default=None, help="attention heads (default 4)")
    mdl.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default 2)")
    mdl.add_argument("--seq-len", type=int, default=None, help="sequence length (default 128)")
    r = p.add_argument_group("runtime")
    r.add_argument("--output", "-o", default=None, metavar="DIR", help="output folder (default runs/<timestamp>)")
    r.add_argument("--config", default=None, metavar="FILE", help="TOML file with [model] [schedule] [training] [runtime]")
    r.add_argument("--timeout", type=float, default=None, help="seconds any blocking wait may take (default 120)")
    r.add_argument("--backend", default=None, choices=["auto", "gloo", "nccl"], help="process-group backend")
    r.add_argument("--threads", type=int, default=None, help="torch threads per CPU rank (default cores/ranks)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    over = {key: getattr(args, dest, None) for dest, key in _FLAGS.items()}
    if getattr(args, "no_progress", False):
        over["runtime.progress"] = False
    return TrainConfig.load(getattr(args, "config", None), over)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    cfg.check()  # parameter errors before torch is imported or any process starts
    try:
        from ..runtime.train import run_training
        from ..runtime.launcher import LaunchError
    except ModuleNotFoundError as e:
        if e.name == "torch":
            print("pipeoffload train: error: the runtime needs torch (pip install 'pipeoffload[runtime]')",
                  file=sys.stderr)
            return 2
        raise
    try:
        run_training(cfg)
    except LaunchError as e:
        print(f"pipeoffload train: error: {e}", file=sys.stderr)
        return 1
    return 0
