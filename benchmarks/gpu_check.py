"""`make gpu-check`: the CUDA path, run and measured on one GPU, in one command.

Runs with the PyTorch already installed on the GPU machine (never installs or
downloads anything; the project is imported from ``src/``) and writes every figure
to ``--out`` (default ``gpu-check/``): ``gpu_check.json`` (all results),
``offload_trace_*.json.gz`` (torch.profiler traces of one offloaded step: the copy
streams next to the compute stream), ``pytest.log``.

Sections, in order (each is timed and reports ok / failed; one failing does not stop
the others; the exit status is 1 if any failed):

1. ``env``: device, driver, torch and CUDA versions.
   ``profile``: the rates a hardware profile is built from, measured on this GPU
   (``gpu_profile.py``: large and narrow GEMMs with ``gemm_half_width`` fitted,
   attention, HBM copy, pinned host link each way and both at once) and an overlapped
   F&B pair on one stream against two.
2. ``correctness``: the reference transformer on the GPU, one process holding every
   layer group (p = 1, v layer groups; the runner needs no process group then), for
   a loop and a V schedule, fp32 and bf16: losses and gradients with offload equal
   those without, bit for bit (deterministic kernels); fp32 also equals plain
   single-process training within 1e-5 relative.
3. ``multiprocess``: multi-rank pipelines against single-process training. p = 2 and
   p = 4 ranks sharing the one GPU over gloo with CUDA tensors (the runtime stages them
   through host memory), every registry schedule, under both point-to-point transports
   (``torch`` and ``nccl-rules``); and, when the machine has two or more GPUs, an NCCL
   world of min(4, GPUs) ranks, one GPU each, every schedule (transport ``torch``).
   Per case: one fp32 step without and with offload (chunk 0), losses and gradients
   against one process (1e-5 relative), the step time, ok or the error. Each group runs
   in its own subprocess (bounded in time); a failing case ends that launch and the
   next launch starts after it, so one failure does not stop the others
   (``--mp-ranks``, ``--mp-schedules``, ``--mp-transports`` narrow it).
4. ``runner``: the real runtime (p = 1, interleaved v = 4) at h = 4096, s = 4096 bf16:
   step time with and without offload, timing sync on the compute stream only (the
   runtime's) against a device-wide sync (the earlier behaviour).
5. ``offload``: ``bench_offload_gpu.py`` at realistic sizes (h = 4096, 8192 and 16384,
   s = 4096, bf16, GQA), the offload planned from this GPU's measured op times and
   host-link bandwidth: step time with and without offload, d2h/h2d GB/s (pinned),
   hidden copy share (step times and profiler), allocator peak against the
   simulator, measured k against the cost model's, both reload allocation modes.
   Every run is replayed twice: bubble-free (the worst case) and with the pipeline's
   waits (each op whose input comes from another rank held until the simulator, fed
   the measured op times, says its message arrives); the offload overhead at k <= 1
   is reported both ways against the goal of 1% (``summary``; reported, not a failure).
6. ``tests``: the whole test suite with CUDA present (``pytest``; ``-n`` workers when
   pytest-xdist is installed), after building the timing engine's C loops in place (``engine``).

    python benchmarks/gpu_check.py [--out DIR] [--skip SECTION ...] [--only SECTION ...]

Smoke run without a GPU (tiny sizes; ``correctness`` and ``tests`` are the GPU run's):
``GPU_CHECK_DEVICE=cpu python benchmarks/gpu_check.py --only env multiprocess offload``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

# Deterministic cuBLAS: must be set before CUDA initialises (bitwise comparisons).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import gpu_iteration  # noqa: E402
import gpu_profile  # noqa: E402

SECTIONS = ("env", "profile", "correctness", "multiprocess", "runner", "iteration", "offload", "tests")
#: The device of the checks; "cpu" only to smoke-test this script where there is no GPU.
DEV = os.environ.get("GPU_CHECK_DEVICE", "cuda")


# ----------------------------------------------------------------------------- helpers


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _max_rel(ga: dict[str, torch.Tensor], gb: dict[str, torch.Tensor]) -> float:
    assert ga.keys() == gb.keys(), (sorted(ga)[:5], sorted(gb)[:5])
    return max(_rel(ga[k], gb[k]) for k in ga)


def _bitwise(ga: dict[str, torch.Tensor], gb: dict[str, torch.Tensor]) -> bool:
    return ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


# ----------------------------------------------------------------------------- sections


def env() -> dict[str, Any]:
    if DEV != "cuda":  # the CPU smoke run
        return {"torch": torch.__version__, "python": sys.version.split()[0], "device": f"{DEV} (smoke run)",
                "cuda_devices": torch.cuda.device_count()}
    smi = shutil.which("nvidia-smi")
    driver = None
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max",
                            "--format=csv,noheader"], capture_output=True, text=True)
        driver = q.stdout.strip()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "python": sys.version.split()[0], "device": torch.cuda.get_device_name(0),
            "capability": torch.cuda.get_device_capability(0), "nvidia_smi": driver,
            "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30}


def _train_single(cfg: Any, sched: Any, dtype: torch.dtype, store: Any, data: list, steps: int = 2) -> dict:
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime.executor import PipelineRunner

    S = sched.num_stages
    runner = PipelineRunner(lambda s: build_stage(cfg, s, S).to(dtype=dtype), lm_loss, sched, device=DEV,
                            activation_store=store)
    opt = torch.optim.SGD(runner.parameters(), lr=0.1)
    losses, grads, stats = [], None, None
    for step in range(steps):
        xs, ys = data[step]
        res = runner.step(xs, ys)
        losses.append(res.losses)
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in runner.named_parameters()}
            stats = res.meta.get("offload")
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"losses": losses, "grads": grads, "peak": res.peak_memory, "stats": stats}


def _reference(cfg: Any, dtype: torch.dtype, data: list) -> dict:
    from pipeoffload.models.transformer import build_reference, lm_loss

    model = build_reference(cfg).to(device=DEV, dtype=dtype)
    xs, ys = data[0]
    loss = sum(lm_loss(model(x.to(DEV)), y.to(DEV)) for x, y in zip(xs, ys)) / len(xs)
    loss.backward()
    return {"loss": float(loss), "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


def correctness() -> dict[str, Any]:
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.data import ByteCorpus, load_corpus
    from pipeoffload.passes.offload import plan_offload
    from pipeoffload.runtime.offload_store import OffloadStore
    from pipeoffload.schedules import generate

    torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = ModelConfig(layers=8, hidden=256, heads=8, kv_heads=2, seq_len=256, seed=5)
    m = 4
    corpus = ByteCorpus(load_corpus(), cfg.seq_len, seed=2)
    data = [corpus.microbatches(step, m, 2) for step in range(2)]
    out: dict[str, Any] = {}
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        ref = _reference(cfg, dtype, data)
        for name, kw in (("interleaved-1f1b", {"v": 4}), ("zb-v", {}), ("group-interleaved", {"v": 4})):
            sched = generate(name, p=1, m=m, **kw)
            plan = plan_offload(sched, offload_chunks=sched.chunks, on_infeasible="skip")
            plain = _train_single(cfg, sched, dtype, None, data)
            again = _train_single(cfg, sched, dtype, None, data)
            off = _train_single(cfg, plan.schedule, dtype, OffloadStore(timing=True), data)
            loss0 = sum(plain["losses"][0]) / m
            row = {
                "transfers": sum(1 for o in plan.schedule.ranks[0] if o.kind.name == "OFFLOAD_START"),
                "moved_MiB": off["stats"]["moved_bytes"] / 2**20 if off["stats"] else 0.0,
                "deterministic": plain["losses"] == again["losses"] and _bitwise(plain["grads"], again["grads"]),
                "bitwise_offload": plain["losses"] == off["losses"] and _bitwise(plain["grads"], off["grads"]),
                "max_rel_grad_offload": _max_rel(off["grads"], plain["grads"]),
                "loss_rel_vs_reference": abs(loss0 - ref["loss"]) / abs(ref["loss"]),
                "max_rel_grad_vs_reference": _max_rel(plain["grads"], ref["grads"]),
                "peak_MiB": {"no offload": plain["peak"] / 2**20, "offload": off["peak"] / 2**20},
            }
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            row["ok"] = (row["moved_MiB"] > 0 and row["bitwise_offload"] if row["deterministic"]
                         else row["max_rel_grad_offload"] <= tol) and row["max_rel_grad_vs_reference"] <= tol \
                and row["loss_rel_vs_reference"] <= tol
            ok &= row["ok"]
            out[f"{name} {str(dtype).split('.')[-1]}"] = row
            print(f"  {name:<18} {str(dtype).split('.')[-1]:<9} transfers {row['transfers']:>3} "
                  f"moved {row['moved_MiB']:7.1f} MiB  deterministic {row['deterministic']}  "
                  f"offload bitwise {row['bitwise_offload']} (max rel {row['max_rel_grad_offload']:.1e})  "
                  f"vs single-process: loss {row['loss_rel_vs_reference']:.1e} grads "
                  f"{row['max_rel_grad_vs_reference']:.1e}  peak {row['peak_MiB']['no offload']:.1f} -> "
                  f"{row['peak_MiB']['offload']:.1f} MiB  {'ok' if row['ok'] else 'FAILED'}", flush=True)
    torch.use_deterministic_algorithms(False)
    out["ok"] = ok
    return out


#: The multi-rank check's model: 8 layers, so every registry schedule at p = 4 (up to 8
#: layer groups) splits it; tiny on the CPU smoke run.
MP_MODEL = {"cuda": dict(layers=8, hidden=128, heads=4, kv_heads=2, seq_len=64, seed=1),
            "cpu": dict(layers=8, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=1)}
MP_TRANSPORTS = ("torch", "nccl-rules")  #: the point-to-point transports of the gloo worlds
MP_TOL = 1e-5  #: fp32 losses and gradients against one process, relative
MP_MICROBATCH = 2  #: samples per microbatch; m = 2p microbatches


def _mp_data(cfg: Any, m: int) -> tuple[list, list]:
    from pipeoffload.models.data import ByteCorpus, load_corpus

    return ByteCorpus(load_corpus(), cfg.seq_len, seed=3).microbatches(0, m, MP_MICROBATCH)


def _mp_worker(ctx: Any, spec: dict[str, Any]) -> None:
    """One rank of a multi-rank world: every case of ``spec["cases"]`` (``[index, schedule,
    transport]``) in order, each trained for ``spec["steps"]`` steps (the last one measured)
    without and, with ``spec["offload"]``, with activation offload (chunk 0). Rank 0 marks
    each case started (``started_<i>``) and saves its gathered result (``case_<i>.pt``).
    No exception is caught: a failing case ends the launch (the launcher stops the other
    ranks at once) and :func:`_mp_drive` starts a new one after it."""
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.passes.offload import plan_offload
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.training.measure import gather_results
    from pipeoffload.runtime.offload_store import OffloadStore
    from pipeoffload.schedules import generate

    if ctx.backend == "nccl":
        device = ctx.device  # one GPU per rank (the launcher set it)
    elif spec["device"] == "cuda":
        device = torch.device("cuda", 0)  # every rank on the one GPU; gloo stages messages through host
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    cfg = ModelConfig(**spec["model"])
    m = spec["m"]
    xs, ys = _mp_data(cfg, m)
    out = Path(spec["out"])
    for i, name, transport in spec["cases"]:
        t_case = time.time()
        if ctx.rank == 0:
            (out / f"started_{i}").touch()
        sched = generate(name, p=ctx.world_size, m=m)
        S = sched.num_stages
        row: dict[str, Any] = {}
        for variant in ("plain", "offload") if spec["offload"] else ("plain",):
            store = OffloadStore() if variant == "offload" else None
            program = plan_offload(sched, offload_chunks=1, on_infeasible="skip").schedule if store else sched
            runner = PipelineRunner(lambda st: build_stage(cfg, st, S), lm_loss, program, device=device,
                                    activation_store=store, timeout_s=spec["timeout_s"], transport=transport)
            for _ in range(spec["steps"]):  # the same weights every step (no optimizer): warm-up, then measured
                for prm in runner.parameters():
                    prm.grad = None
                res = runner.step(xs, ys)
            off = res.meta.get("offload") or {}
            got = gather_results({"loss": res.loss, "step_s": res.step_time, "moved": off.get("moved_bytes", 0),
                                  "transport": runner.p2p.transport.name,
                                  "grads": {n: prm.grad.detach().cpu() for n, prm in runner.named_parameters()}})
            if ctx.rank == 0:
                row[variant] = {"loss": next(g["loss"] for g in got if g["loss"] is not None),
                                "step_s": max(g["step_s"] for g in got), "moved": sum(g["moved"] for g in got),
                                "transport": sorted({g["transport"] for g in got}),
                                "grads": {k: v for g in got for k, v in g["grads"].items()}}
            del runner
        if ctx.rank == 0:
            row["seconds"] = time.time() - t_case
            torch.save(row, out / f"case_{i}.pt")


def _mp_drive(spec: dict[str, Any]) -> None:
    """The multi-rank world of one group (``python gpu_check.py --mp-run SPEC``, a
    subprocess of :func:`multiprocess`): launch the ranks on the cases left; when a
    launch fails, the first case without a result gets its error (``errors.json``) and
    the next launch starts after it, so one failing case does not stop the others. A
    launch that fails before any case started (process group, device) fails every case
    left with that error."""
    from pipeoffload.runtime.launcher import launch

    out = Path(spec["out"])
    errors: dict[str, str] = {}
    pending = [list(c) for c in spec["cases"]]
    launches = 0
    while pending:
        for f in out.glob("started_*"):
            f.unlink()
        err = None
        launches += 1
        try:
            launch(_mp_worker, spec["p"], ({**spec, "cases": pending},), backend=spec["backend"],
                   init_timeout_s=spec["timeout_s"])
        except Exception as e:  # noqa: BLE001 - recorded against the case that was running
            err = f"{type(e).__name__}: {str(e).strip()}"[:2000]
        started = {int(f.name.split("_")[1]) for f in out.glob("started_*")}
        left = []
        for k, (i, name, transport) in enumerate(pending):
            if (out / f"case_{i}.pt").exists():
                continue
            if not started:  # nothing ran: the world itself failed
                for j, _, _ in pending[k:]:
                    errors[str(j)] = f"the world failed before this case started: {err or 'no error reported'}"
            else:
                errors[str(i)] = err or "the ranks exited without saving this case's result"
                left = pending[k + 1:]
            break
        (out / "errors.json").write_text(json.dumps({"errors": errors, "launches": launches}))
        pending = left


def _mp_reference(cfg: Any, m: int) -> dict[str, Any]:
    """Plain single-process fp32 training on the CPU: loss and gradients of one step."""
    from pipeoffload.models.transformer import build_reference, lm_loss

    model = build_reference(cfg)
    xs, ys = _mp_data(cfg, m)
    loss = sum(lm_loss(model(x), y) for x, y in zip(xs, ys)) / len(xs)
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


def _mp_judge(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """One case's figures against one process; ``ok`` when every variant is within MP_TOL."""
    row: dict[str, Any] = {"seconds": got["seconds"]}
    ok = True
    for variant, r in got.items():
        if variant == "seconds":
            continue
        sfx = "" if variant == "plain" else "_offload"
        loss_rel = abs(r["loss"] - ref["loss"]) / abs(ref["loss"])
        if r["grads"].keys() == ref["grads"].keys():
            grad_rel = _max_rel(r["grads"], ref["grads"])
        else:  # a parameter missing or extra: reported, never within tolerance
            grad_rel = float("inf")
            row[f"grad_names{sfx}"] = {"missing": sorted(ref["grads"].keys() - r["grads"].keys())[:10],
                                       "extra": sorted(r["grads"].keys() - ref["grads"].keys())[:10]}
        row.update({f"loss_rel{sfx}": loss_rel, f"max_rel_grad{sfx}": grad_rel, f"step_s{sfx}": r["step_s"],
                    f"transport{sfx}": r["transport"]})
        if variant == "offload":
            row["moved_MiB"] = r["moved"] / 2**20
        ok &= loss_rel <= MP_TOL and grad_rel <= MP_TOL
    row["ok"] = ok
    return row


def multiprocess(out_dir: Path, *, device: str | None = None, ps: tuple[int, ...] = (2, 4),
                 schedules: list[str] | None = None, transports: tuple[str, ...] = MP_TRANSPORTS,
                 nccl: bool = True, offload: bool = True, steps: int = 2, timeout_s: float = 60.0,
                 group_timeout_s: float = 900.0) -> dict[str, Any]:
    """Multi-rank pipelines against one process, one world per group, every case robust.

    Groups: ``p`` ranks sharing one device over gloo (on the GPU: CUDA tensors, which the
    runtime stages through host memory) for each ``p`` in ``ps``, every schedule under
    every transport; and, on CUDA with two or more GPUs (and ``nccl``), an NCCL world of
    ``min(4, GPUs)`` ranks, one GPU each, every schedule under torch's transport. Each
    case: one fp32 step (after ``steps - 1`` warm-up steps) without and with offload,
    loss and gradients against single-process training (MP_TOL relative), the step time
    (slowest rank's, barrier to last send). A group runs in a subprocess bounded by
    ``group_timeout_s``; cases it did not reach are reported as not run."""
    from pipeoffload.models import ModelConfig
    from pipeoffload.schedules import SCHEDULES

    device = device or DEV
    names = list(SCHEDULES) if schedules is None else list(schedules)
    model = MP_MODEL["cuda" if device == "cuda" else "cpu"]
    cfg = ModelConfig(**model)
    groups = [(f"gloo p={p}", p, "gloo", [(n, t) for t in transports for n in names]) for p in ps]
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    res: dict[str, Any] = {"model": model, "microbatch": MP_MICROBATCH, "tolerance": MP_TOL, "device": device,
                           "offload": "chunk 0, instantaneous-transfer plan" if offload else "off", "groups": {}}
    if nccl and gpus >= 2:
        q = min(4, gpus)
        groups.append((f"nccl p={q}", q, "nccl", [(n, "torch") for n in names]))
    else:
        res["nccl"] = f"not run: {gpus} GPU(s) visible (an NCCL pipeline needs one GPU per rank)"
    print(f"  {res.get('nccl', 'NCCL world included')}", flush=True)
    ok = True
    for label, p, backend, cases in groups:
        gdir = out_dir / f"mp_{backend}_p{p}"
        shutil.rmtree(gdir, ignore_errors=True)
        gdir.mkdir(parents=True)
        m = 2 * p
        spec = {"p": p, "m": m, "backend": backend, "device": device, "model": model, "out": str(gdir),
                "offload": offload, "steps": steps, "timeout_s": timeout_s,
                "cases": [[i, n, t] for i, (n, t) in enumerate(cases)]}
        (gdir / "spec.json").write_text(json.dumps(spec))
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--mp-run", str(gdir / "spec.json")],
                               capture_output=True, text=True, timeout=group_timeout_s)
            tail = (r.stdout + r.stderr)[-3000:]
            note = None if r.returncode == 0 else f"driver exited with status {r.returncode}"
        except subprocess.TimeoutExpired as e:
            tail = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                           for x in (e.stdout, e.stderr))[-3000:]
            note = f"not run: the group exceeded {group_timeout_s:.0f} s"
        (gdir / "driver.log").write_text(tail)
        errs = json.loads((gdir / "errors.json").read_text()) if (gdir / "errors.json").exists() else {}
        ref = _mp_reference(cfg, m)
        rows: dict[str, Any] = {}
        for i, (n, t) in enumerate(cases):
            f = gdir / f"case_{i}.pt"
            if f.exists():
                row = _mp_judge(torch.load(f, weights_only=False), ref)
            else:
                row = {"ok": False, "error": errs.get("errors", {}).get(str(i)) or note or "no result"}
            rows[f"{n} / {t}"] = row
            what = (f"loss {row['loss_rel']:.1e} grads {row['max_rel_grad']:.1e}"
                    + (f", offload: grads {row['max_rel_grad_offload']:.1e} moved {row['moved_MiB']:.2f} MiB"
                       if "moved_MiB" in row else "")
                    + f"  step {1000 * row['step_s']:.1f} ms" if "loss_rel" in row else row["error"][:300])
            print(f"  {label:<10} {n:<18} {t:<11} {'ok' if row['ok'] else 'FAILED'}  {what}", flush=True)
        g = {"backend": backend, "p": p, "m": m, "seconds": time.time() - t0, "launches": errs.get("launches"),
             "cases": rows, "ok": all(r["ok"] for r in rows.values())}
        if any(not r["ok"] for r in rows.values()):
            g["driver_tail"] = tail
        for f in [*gdir.glob("*.pt"), *gdir.glob("started_*")]:
            f.unlink()
        res["groups"][label] = g
        ok &= g["ok"]
    res["ok"] = ok
    return res


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def runner_timing(hidden: int = 4096, seq: int = 4096, heads: int = 32, kv_heads: int = 8) -> dict[str, Any]:
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.offload_store import OffloadStore
    from pipeoffload.schedules import generate

    from bench_offload_gpu import host_link_seconds
    from pipeoffload.training.measure import group_medians, predict_offload

    cfg = ModelConfig(layers=8, hidden=hidden, heads=heads, kv_heads=kv_heads, seq_len=seq, seed=0)
    m = 4
    sched = generate("interleaved-1f1b", p=1, m=m, v=4)
    S = sched.num_stages
    stages = {s: build_stage(cfg, s, S).to(device=DEV, dtype=torch.bfloat16) for s in range(S)}
    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, 256, (1, cfg.seq_len), generator=g) for _ in range(m)]
    ys = [torch.randint(0, 256, (1, cfg.seq_len), generator=g) for _ in range(m)]
    # The plan from this GPU's measurements: per-group op times and memory from one
    # no-offload step, transfers at the measured pinned bandwidth, one rank per link.
    probe = PipelineRunner(stages, lm_loss, sched, device=DEV).step(xs, ys)
    probe = PipelineRunner(stages, lm_loss, sched, device=DEV).step(xs, ys)  # warm
    for mod in stages.values():
        mod.zero_grad(set_to_none=True)
    costs, deltas = group_medians(probe.samples, S)
    d2h, h2d = host_link_seconds(int(max(d[0] for d in deltas)), torch.device(DEV))
    bw = max(d[0] for d in deltas) / max(d2h, h2d)
    _, plan = predict_offload(sched, costs, deltas, offload_chunks=3, transfer_times=[d[0] / bw for d in deltas],
                              link_group=1, solo_factor=1.0)
    def device_sync(self: Any) -> None:  # the executor's earlier _sync: waits for the copy streams too
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    out: dict[str, Any] = {"model": f"reference transformer, 8 layers, h={hidden}, s={seq}, GQA {heads}/{kv_heads}, bf16, mb=1",
                           "schedule": f"interleaved-1f1b p=1 v=4 m=4, offload C=3 planned with measured "
                                       f"costs and {bw / 1e9:.1f} GB/s: {len(plan.transfers)} transfers",
                           "group_costs_ms": [[round(1000 * x, 2) for x in c] for c in costs],
                           "group_F_MiB": [d[0] / 2**20 for d in deltas]}
    print(f"  {out['schedule']}", flush=True)
    for label, sync in (("compute-stream sync", None), ("device-wide sync", device_sync)):
        for off in (False, True):
            store = OffloadStore(timing=False) if off else None
            runner = PipelineRunner(stages, lm_loss, plan.schedule if off else sched, device=DEV,
                                    activation_store=store)
            if sync is not None:
                runner._sync = sync.__get__(runner)
            times, peak = [], 0.0
            for k in range(4):
                for mod in stages.values():
                    mod.zero_grad(set_to_none=True)
                _sync()
                t0 = time.perf_counter()
                res = runner.step(xs, ys)
                _sync()
                if k:
                    times.append(time.perf_counter() - t0)
                    peak = max(peak, res.peak_memory)
            key = f"{label}, {'offload' if off else 'no offload'}"
            out[key] = {"step_s": sorted(times)[len(times) // 2], "peak_GiB": peak / 2**30}
            print(f"  {key:<36} step {1000 * out[key]['step_s']:8.1f} ms  peak {peak / 2**30:6.2f} GiB", flush=True)
            del runner
    for label in ("compute-stream sync", "device-wide sync"):
        out[f"overhead, {label}"] = out[f"{label}, offload"]["step_s"] / out[f"{label}, no offload"]["step_s"] - 1
    out["ok"] = True
    return out


OFFLOAD_RUNS = {
    "h4096 C=1": ["--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--layers-per-chunk", "2",
                  "--offload-chunks", "1"],
    "h4096 C=1 reload-alloc copy": ["--hidden", "4096", "--heads", "32", "--kv-heads", "8",
                                    "--layers-per-chunk", "2", "--offload-chunks", "1", "--reload-alloc", "copy"],
    "h16384 C=1 (p=4)": ["--hidden", "16384", "--heads", "128", "--kv-heads", "8", "--layers-per-chunk", "1",
                         "--offload-chunks", "1", "-p", "4", "-m", "8"],
    "h4096 C=2": ["--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--layers-per-chunk", "2",
                  "--offload-chunks", "2"],
    "h8192 C=1": ["--hidden", "8192", "--heads", "64", "--kv-heads", "8", "--layers-per-chunk", "2",
                  "--offload-chunks", "1"],
}


#: Runs that also write a torch.profiler trace of one offloaded step (gzipped afterwards).
PROFILED = {"h4096 C=1": "offload_trace_h4096.json", "h16384 C=1 (p=4)": "offload_trace_h16384.json"}


#: The CPU smoke run's offload section: one tiny replay, with and without the pipeline's waits.
SMOKE_OFFLOAD_RUNS = {"tiny (cpu smoke)": ["--tiny", "-p", "2", "-m", "4", "--hidden", "32", "--seq-len", "32",
                                           "--steps", "1"]}
#: The goal for activation offload at k <= 1 (offload overhead, fraction of step time).
OVERHEAD_GOAL = 0.01


def offload(out_dir: Path) -> dict[str, Any]:
    """``bench_offload_gpu.py`` at each of OFFLOAD_RUNS, with and without the pipeline's
    waits, and the overhead at k <= 1 against the goal (reported, not a failure)."""
    import bench_offload_gpu

    out: dict[str, Any] = {}
    smoke = DEV != "cuda"
    for label, args in (SMOKE_OFFLOAD_RUNS if smoke else OFFLOAD_RUNS).items():
        print(f"  --- {label}", flush=True)
        extra = ["--device", DEV]
        if label in PROFILED:
            extra += ["--profile", str(out_dir / PROFILED[label])]
        if not smoke:
            extra += ["--seq-len", "4096", "--dtype", "bf16", "--steps", "3"]
        r = bench_offload_gpu.run(args + extra)
        for row in r["runs"].values():
            row.pop("step_s_all", None)
        out[label] = r
        if not smoke:
            torch.cuda.empty_cache()
    for name in PROFILED.values():
        trace = out_dir / name
        if trace.exists():
            with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb", compresslevel=6) as z:
                shutil.copyfileobj(f, z)
            trace.unlink()
    # bf16 with non-deterministic attention backward: equal within run-to-run noise
    # (bitwise equality under deterministic kernels is the correctness section's).
    runs = {k: r for k, r in out.items() if isinstance(r, dict)}
    out["summary"] = overhead_summary(runs)
    out["ok"] = all(r["max_rel_grad_diff"] <= 2e-2 and r.get("max_rel_grad_diff_waits", 0.0) <= 2e-2
                    for r in runs.values())
    return out


def overhead_summary(runs: dict[str, dict[str, Any]], goal: float = OVERHEAD_GOAL) -> dict[str, Any]:
    """Per run: measured k, offload overhead without the pipeline's waits (the bubble-free
    replay, the worst case) and with them; over the runs at k <= 1: the worst of each and
    whether the goal (overhead <= ``goal``) is met with the waits. Printed as a table."""
    rows = {label: {"k_measured": r.get("k_measured"), "overhead_no_waits": r["overhead"],
                    "overhead_with_waits": r.get("overhead_with_waits")} for label, r in runs.items()}
    print(f"  {'run':<30} {'k':>6} {'overhead, no waits':>19} {'with waits':>11}")
    for label, row in rows.items():
        k, w = row["k_measured"], row["overhead_with_waits"]
        print(f"  {label:<30} {'-' if k is None else f'{k:.2f}':>6} {100 * row['overhead_no_waits']:>+18.2f}% "
              f"{'-' if w is None else f'{100 * w:+.2f}%':>11}", flush=True)
    low = [r for r in rows.values() if r["k_measured"] is not None and r["k_measured"] <= 1]
    waits = [r["overhead_with_waits"] for r in low if r["overhead_with_waits"] is not None]
    summary: dict[str, Any] = {"goal": f"offload overhead <= {100 * goal:g}% of step time at k <= 1",
                               "runs": rows, "runs_at_k_le_1": len(low)}
    if low:
        summary["worst_overhead_no_waits"] = max(r["overhead_no_waits"] for r in low)
        summary["goal_met_no_waits"] = summary["worst_overhead_no_waits"] <= goal
    if waits:
        summary["worst_overhead_with_waits"] = max(waits)
        summary["goal_met_with_waits"] = summary["worst_overhead_with_waits"] <= goal
    print(f"  at k <= 1 ({len(low)} run(s)): worst overhead "
          + (f"{100 * summary['worst_overhead_no_waits']:+.2f}% without waits" if low else "-")
          + (f", {100 * summary['worst_overhead_with_waits']:+.2f}% with the pipeline's waits "
             f"(goal <= {100 * goal:g}%: {'met' if summary['goal_met_with_waits'] else 'missed'})" if waits else ""),
          flush=True)
    return summary


#: A subset of the suite for a short device slot (``--tests-paths`` with no value): the modules
#: whose processes, tensors and models touch the runtime's device paths.
TESTS_SHORT = ("tests/test_gpu_check.py", "tests/test_runtime_offload.py", "tests/test_hf_llama.py",
               "tests/test_mesh.py", "tests/test_transport.py")


def tests(out_dir: Path, paths: Sequence[str] = (), timeout_s: float | None = None) -> dict[str, Any]:
    """The test suite (or ``paths``, pytest's arguments) with CUDA present, in a subprocess; at
    most ``timeout_s`` seconds (None: no limit), after which it is stopped and reported as having
    run past its time with what it printed until then (pytest.log)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    try:
        import xdist  # noqa: F401

        cmd += ["-n", str(min(8, max(2, (os.cpu_count() or 2) // 2)))]
    except ImportError:
        pass
    cmd += list(paths)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    engine = build_engine()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout_s)
        text, code = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        text += f"\nran past its {timeout_s:g} s (--tests-timeout) and was stopped"
        code = None
    (out_dir / "pytest.log").write_text(text)
    tail = text.strip().splitlines()[-40:]
    print("\n".join("  " + x for x in tail), flush=True)
    return {"command": " ".join(cmd[1:]), "returncode": code, "seconds": time.time() - t0,
            "summary": tail[-1] if tail else "", "ok": code == 0, "engine": engine}


def build_engine() -> str:
    """Build the timing engine's C loops (``pipeoffload._engine``) in place, as ``pip install``
    does: a lent machine runs this tree from source, where the suite's tests/test_engine_c.py
    would otherwise fail on the missing extension. Returns "built" or why not (then those tests
    fail, naming it, and everything else runs the engine's Python loops)."""
    try:
        r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not built: {e}"
    if r.returncode != 0:
        return "not built: " + ((r.stderr or r.stdout).strip().splitlines() or ["setup.py failed"])[-1]
    return "built"


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="output folder (default gpu-check/)")
    ap.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, help="sections to leave out")
    ap.add_argument("--only", nargs="*", default=None, choices=SECTIONS, help="run only these sections")
    ap.add_argument("--mp-ranks", nargs="+", type=int, default=[2, 4], metavar="P",
                    help="multiprocess: the gloo worlds' numbers of ranks (default 2 4)")
    ap.add_argument("--mp-schedules", nargs="+", default=None, metavar="NAME",
                    help="multiprocess: these schedules only (default every registry schedule)")
    ap.add_argument("--mp-transports", nargs="+", default=list(MP_TRANSPORTS), metavar="MODE",
                    help="multiprocess: the gloo worlds' transports (default torch nccl-rules)")
    ap.add_argument("--tests-paths", nargs="*", default=None, metavar="PATH",
                    help="tests: pytest's paths or node ids (default the whole suite; the flag alone: "
                         + " ".join(TESTS_SHORT) + ")")
    ap.add_argument("--tests-timeout", type=float, default=None, metavar="SECONDS",
                    help="tests: stop the run after this long and report it (default no limit)")
    ap.add_argument("--mp-run", default=None, help=argparse.SUPPRESS)  # internal: one world's driver
    a = ap.parse_args(argv)
    if a.tests_timeout is not None and not a.tests_timeout > 0:
        ap.error(f"--tests-timeout: must be a positive number of seconds, got {a.tests_timeout:g}")
    if a.mp_run:
        _mp_drive(json.loads(Path(a.mp_run).read_text()))
        return 0
    if not torch.cuda.is_available() and DEV == "cuda":
        print("gpu-check: no CUDA device is visible to this PyTorch "
              f"({torch.__version__}); run it on a machine with a GPU", file=sys.stderr)
        return 2
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, Callable[[], dict[str, Any]]] = {
        "env": env, "profile": lambda: gpu_profile.measure(DEV), "correctness": correctness,
        "multiprocess": lambda: multiprocess(out_dir, ps=tuple(a.mp_ranks), schedules=a.mp_schedules,
                                             transports=tuple(a.mp_transports)),
        "runner": runner_timing if DEV == "cuda" else lambda: runner_timing(64, 64, 4, 2),
        "iteration": lambda: {**gpu_iteration.whole_iterations(
            gpu_iteration.default_profile(DEV), gpu_iteration.CONFIGS if DEV == "cuda" else gpu_iteration.TINY, DEV),
            "ok": True},
        "offload": lambda: offload(out_dir), "tests": lambda: tests(out_dir, TESTS_SHORT if a.tests_paths == [] else (a.tests_paths or ()),
                                 a.tests_timeout)}
    results: dict[str, Any] = {}
    for name in SECTIONS:
        if name in a.skip or (a.only is not None and name not in a.only):
            continue
        print(f"== {name}", flush=True)
        t0 = time.time()
        try:
            res = jobs[name]()
        except Exception as e:  # one section failing must not hide the others' figures
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            print(res["traceback"], flush=True)
        res["seconds"] = time.time() - t0
        results[name] = res
        (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
        if name == "env":
            print(f"  {res}", flush=True)
    failed = [n for n, r in results.items() if not r.get("ok", True)]
    print(f"== gpu-check: {len(results) - len(failed)}/{len(results)} sections ok"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"; results in {out_dir}/gpu_check.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
