"""Whole training iterations on one GPU against the planner's prediction of them (issue 26).

The hardware profiles of the H100 and the H200 were fitted to single op times (F, B, W of one
layer group, ``fit_gpu_profile.py``). This checks what they were not fitted to: a whole iteration
on the GPU at shapes the fit never saw — every forward and backward of ``m`` microbatches, then a
mixed-precision AdamW step — and the memory it took, beside what ``pipeoffload plan`` would say of
the same configuration (one GPU, so PP = TP = DP = 1 and no pipeline bubble; what is checked is the
op model at new shapes, the optimizer step's model and the activation and reserve model).

Measured, per configuration (median of ``steps`` after one warm-up):

- ``pipeline_s``: the runtime's step (``PipelineRunner.step``, synchronised), the planner's makespan;
- ``optimizer_s``: the mixed-precision step as Megatron runs it — bf16 gradients into fp32 main
  gradients, a fused AdamW on fp32 master weights, the result cast back into the bf16 weights —
  against the planner's step after the pipeline (HBM traffic per parameter, ``planner/step.py``);
- ``activation_GiB``: the runtime's peak above the step-start level (weights, gradients and
  optimizer state already allocated), against the planner's activation peak of the rank (the
  reference transformer is described with ``kernels="eager"``, ``ModelConfig.spec``);
- ``state_B_per_param``: what was allocated at the step start per parameter (the planner counts
  18 B: 2 weight + 4 fp32 main gradient + 12 master and moments; this runtime also keeps the bf16
  ``.grad``, 2 B more);
- ``reserved_over_allocated``: the allocator's reserved peak over its allocated peak, against the
  profile's reserve (``Hardware.reserved``).

    python benchmarks/gpu_iteration.py --hardware h200 --out iteration.json     # on the GPU
    GPU_CHECK_DEVICE=cpu python benchmarks/gpu_iteration.py --tiny              # code path only
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

#: (label, ModelConfig fields, microbatch size, m, schedule). Shapes the profile fit never saw
#: (it saw h = 4096..16384 at s = 4096, b = 1, two layers per group).
CONFIGS: tuple[tuple[str, dict[str, int], int, int, str], ...] = (
    ("h2048 s2048 b4 L16 1f1b", dict(layers=16, hidden=2048, heads=16, kv_heads=16, seq_len=2048), 4, 8, "1f1b"),
    ("h4096 s4096 b1 L8 1f1b", dict(layers=8, hidden=4096, heads=32, kv_heads=8, seq_len=4096), 1, 8, "1f1b"),
    ("h4096 s4096 b1 L8 gpipe", dict(layers=8, hidden=4096, heads=32, kv_heads=8, seq_len=4096), 1, 4, "gpipe"),
    ("h8192 s2048 b2 L4 1f1b", dict(layers=4, hidden=8192, heads=64, kv_heads=8, seq_len=2048), 2, 4, "1f1b"),
)
TINY: tuple[tuple[str, dict[str, int], int, int, str], ...] = (
    ("tiny 1f1b", dict(layers=2, hidden=32, heads=4, kv_heads=2, seq_len=16), 2, 4, "1f1b"),
    ("tiny gpipe", dict(layers=2, hidden=32, heads=4, kv_heads=2, seq_len=16), 2, 4, "gpipe"),
)
GiB = 2**30


def predicted(model: Any, hardware: str, m: int, schedule: str) -> dict[str, float]:
    """The planner's figures for ``model`` (a ModelSpec) trained on one GPU of ``hardware`` with
    ``m`` microbatches in ``schedule``, no recompute, no offload, unsharded optimizer: pipeline
    makespan, step after it, activation peak, state bytes, and the reserve the profile adds."""
    from pipeoffload.costmodel.hardware import get_hardware
    from pipeoffload.costmodel.measured import simulate_exactly
    from pipeoffload.planner.config import assemble
    from pipeoffload.planner.sharding import node_profile
    from pipeoffload.planner.space import Family, PlanOptions, Problem, Split

    hw = get_hardware(hardware)
    problem = Problem(model, hw, node_profile(hw), hw.default_budget, m * model.microbatch, 1,
                      PlanOptions(dp_sharding="none", trim_edges=False))
    cfg = assemble(problem, simulate_exactly(problem, Split(1, 1, 1), Family(schedule), m))
    mem = cfg.memory
    return {"pipeline_s": cfg.makespan_ms / 1e3, "optimizer_s": cfg.step.optimizer_ms / 1e3,
            "activation_GiB": mem.activations / GiB, "state_GiB": (mem.params + mem.grads_optimizer) / GiB,
            "allocated_GiB": mem.device / GiB, "reserved_GiB": hw.reserved(mem.device) / GiB,
            "params": model.params(), "mfu": cfg.mfu}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class MixedPrecisionAdam:
    """Megatron's mixed-precision step on one device: the bf16 ``.grad`` of each weight copied into
    a persistent fp32 main gradient, a fused AdamW over fp32 master weights, the masters cast back
    into the bf16 weights."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.master = [p.detach().float().clone().requires_grad_(True) for p in params]
        for w in self.master:
            w.grad = torch.zeros_like(w)
        fused = {"fused": True} if params[0].device.type == "cuda" else {}
        self.opt = torch.optim.AdamW(self.master, lr=1e-5, **fused)

    @torch.no_grad()
    def step(self) -> None:
        for p, w in zip(self.params, self.master):
            w.grad.copy_(p.grad)
        self.opt.step()
        for p, w in zip(self.params, self.master):
            p.copy_(w)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def measure(fields: dict[str, int], b: int, m: int, schedule: str, dev: torch.device, steps: int) -> dict[str, Any]:
    """One configuration trained for ``steps`` + 1 iterations on ``dev`` (bf16 on a GPU, fp32 on
    the CPU); medians of the timed ones and the peaks of the last."""
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.schedules import generate

    cfg = ModelConfig(**fields, seed=0)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gc.collect()  # the previous configuration's cycles (runner <-> modules) go before the baseline
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    model = build_stage(cfg, 0, 1).to(device=dev, dtype=dtype)
    params = [q for q in model.parameters() if q.requires_grad]
    for q in params:  # persistent gradients, as Megatron's buffers: the step starts with them allocated
        q.grad = torch.zeros_like(q)
    opt = MixedPrecisionAdam(params)
    runner = PipelineRunner({0: model}, lm_loss, generate(schedule, p=1, m=m), device=dev)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, cfg.vocab_size, (b, cfg.seq_len), generator=g) for _ in range(m)]
    ys = [torch.randint(0, cfg.vocab_size, (b, cfg.seq_len), generator=g) for _ in range(m)]
    pipe, step, n = [], [], sum(q.numel() for q in params)
    for k in range(steps + 1):
        for q in params:
            q.grad.zero_()
        _sync(dev)
        if dev.type == "cuda":
            start = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        res = runner.step(xs, ys)
        _sync(dev)
        t1 = time.perf_counter()
        kept = torch.cuda.memory_allocated(dev) - start if dev.type == "cuda" else 0
        opt.step()
        _sync(dev)
        t2 = time.perf_counter()
        if k:
            pipe.append(t1 - t0)
            step.append(t2 - t1)
    out: dict[str, Any] = {"pipeline_s": _median(pipe), "optimizer_s": _median(step), "params": n,
                           "activation_GiB": res.peak_memory / GiB, "loss": res.loss}
    if dev.type == "cuda":
        out["state_B_per_param"] = (start - base) / n
        out["kept_after_step_GiB"] = kept / GiB  # allocated after the step above its start: should be 0
        out["allocated_peak_GiB"] = torch.cuda.max_memory_allocated(dev) / GiB
        out["reserved_peak_GiB"] = torch.cuda.max_memory_reserved(dev) / GiB
        out["reserved_over_allocated"] = out["reserved_peak_GiB"] / out["allocated_peak_GiB"]
    del runner, opt, model, params, res
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def compare(meas: dict[str, Any], pred: dict[str, float]) -> dict[str, float]:
    """Relative errors of the prediction (prediction / measurement - 1)."""
    err = {k: pred[k] / meas[k] - 1 for k in ("pipeline_s", "optimizer_s", "activation_GiB") if meas[k] > 0}
    if "reserved_over_allocated" in meas:
        err["reserve"] = pred["reserved_GiB"] / pred["allocated_GiB"] / meas["reserved_over_allocated"] - 1
    return err


def whole_iterations(hardware: str, configs: tuple = CONFIGS, device: str | None = None,
                     steps: int = 3) -> dict[str, Any]:
    """Every configuration of ``configs`` measured on ``device`` and predicted on ``hardware``'s
    profile; ``summary`` holds the largest error of each figure."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out: dict[str, Any] = {"hardware": hardware, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                           else "cpu", "runs": {}}
    from pipeoffload.models import ModelConfig

    for label, fields, b, m, schedule in configs:
        spec = ModelConfig(**fields, seed=0).spec(microbatch=b, dtype="bf16" if dev.type == "cuda" else "fp32")
        meas = measure(fields, b, m, schedule, dev, steps)
        pred = predicted(spec, hardware, m, schedule)
        run = {"measured": meas, "predicted": pred, "error": compare(meas, pred), "m": m, "microbatch": b}
        out["runs"][label] = run
        e = run["error"]
        print(f"  {label:<26} pipeline {1e3 * meas['pipeline_s']:8.1f} ms (pred {1e3 * pred['pipeline_s']:8.1f}, "
              f"{100 * e.get('pipeline_s', 0):+5.1f}%)  optimizer {1e3 * meas['optimizer_s']:6.1f} ms "
              f"({100 * e.get('optimizer_s', 0):+5.1f}%)  act {meas['activation_GiB']:6.2f} GiB "
              f"({100 * e.get('activation_GiB', 0):+5.1f}%)", flush=True)
    keys = sorted({k for r in out["runs"].values() for k in r["error"]})
    out["summary"] = {k: max((r["error"][k] for r in out["runs"].values() if k in r["error"]), key=abs)
                      for k in keys}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", default=None, help="profile to predict with (default: h100-80g or h200 "
                    "from the GPU's name; cpu without a GPU)")
    ap.add_argument("--tiny", action="store_true", help="tiny models: the code path only")
    ap.add_argument("--steps", type=int, default=3, help="timed iterations per configuration (after one warm-up)")
    ap.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    device = os.environ.get("GPU_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    hw = args.hardware or default_profile(device)
    res = whole_iterations(hw, TINY if args.tiny else CONFIGS, device, args.steps)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


def default_profile(device: str) -> str:
    """The built-in profile of this machine's GPU (``h200`` for an H200, else ``h100-80g``; ``cpu``
    without one)."""
    if not device.startswith("cuda"):
        return "cpu"
    return "h200" if "H200" in torch.cuda.get_device_name(torch.device(device)) else "h100-80g"


if __name__ == "__main__":
    raise SystemExit(main())
