"""`make gpu-check`: the CUDA path, run and measured on one GPU, in one command.

Runs with the PyTorch already installed on the GPU machine (never installs or
downloads anything; the project is imported from ``src/``) and writes every figure
to ``--out`` (default ``gpu-check/``): ``gpu_check.json`` (all results),
``offload_trace_*.json.gz`` (torch.profiler traces of one offloaded step: the copy
streams next to the compute stream), ``pytest.log``.

Sections, in order (each is timed and reports ok / failed; one failing does not stop
the others; the exit status is 1 if any failed):

1. ``env``: device, driver, torch and CUDA versions.
2. ``correctness``: the reference transformer on the GPU, one process holding every
   layer group (p = 1, v layer groups; the runner needs no process group then), for
   a loop and a V schedule, fp32 and bf16: losses and gradients with offload equal
   those without, bit for bit (deterministic kernels); fp32 also equals plain
   single-process training within 1e-5 relative.
3. ``multiprocess``: p = 2 ranks sharing the one GPU, CUDA tensors, over gloo (NCCL
   needs one GPU per rank): whether it runs, and gradients against one process.
4. ``runner``: the real runtime (p = 1, interleaved v = 4) at h = 4096, s = 4096 bf16:
   step time with and without offload, timing sync on the compute stream only (the
   runtime's) against a device-wide sync (the earlier behaviour).
5. ``offload``: ``bench_offload_gpu.py`` at realistic sizes (h = 4096, 8192 and 16384,
   s = 4096, bf16, GQA), the offload planned from this GPU's measured op times and
   host-link bandwidth: step time with and without offload, d2h/h2d GB/s (pinned),
   hidden copy share (step times and profiler), allocator peak against the
   simulator, measured k against the cost model's, both reload allocation modes.
6. ``tests``: the whole test suite with CUDA present (``pytest``; ``-n`` workers when
   pytest-xdist is installed).

    python benchmarks/gpu_check.py [--out DIR] [--skip SECTION ...]
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
from typing import Any, Callable

# Deterministic cuBLAS: must be set before CUDA initialises (bitwise comparisons).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

SECTIONS = ("env", "correctness", "multiprocess", "runner", "offload", "tests")
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


_MP_CODE = r"""
import sys, torch
sys.path.insert(0, {src!r})
from pipeoffload.models import ModelConfig
from pipeoffload.models.data import ByteCorpus, load_corpus
from pipeoffload.models.transformer import build_stage, build_reference, lm_loss
from pipeoffload.runtime.executor import PipelineRunner
from pipeoffload.runtime.launcher import launch
from pipeoffload.runtime.measure import gather_results
from pipeoffload.runtime.offload_store import OffloadStore
from pipeoffload.passes.offload import plan_offload
from pipeoffload.schedules import generate

CFG = ModelConfig(layers=4, hidden=128, heads=4, kv_heads=2, seq_len=64, seed=1)

def data():
    return ByteCorpus(load_corpus(), CFG.seq_len, seed=3).microbatches(0, 4, 2)

def worker(ctx, path):
    if {dev!r} == "cuda":
        torch.cuda.set_device(0)
    sched = plan_offload(generate("zb-v", p=2, m=4), offload_chunks=2, on_infeasible="skip").schedule
    runner = PipelineRunner(lambda s: build_stage(CFG, s, 4), lm_loss, sched, device={dev!r},
                            activation_store=OffloadStore(), timeout_s=60)
    xs, ys = data()
    res = runner.step(xs, ys)
    got = gather_results({{"loss": res.loss, "grads": {{n: p.grad.cpu() for n, p in runner.named_parameters()}},
                          "moved": res.meta["offload"]["moved_bytes"]}})
    if ctx.rank == 0:
        torch.save(got, path)

if __name__ == "__main__":
    launch(worker, 2, ({path!r},), backend="gloo")
    got = torch.load({path!r})
    model = build_reference(CFG)
    xs, ys = data()
    loss = sum(lm_loss(model(x), y) for x, y in zip(xs, ys)) / len(xs)
    loss.backward()
    grads = {{k: v for g in got for k, v in g["grads"].items()}}
    err = max(float((grads[n] - p.grad).norm() / p.grad.norm()) for n, p in model.named_parameters())
    lossv = next(g["loss"] for g in got if g["loss"] is not None)
    print("RESULT", lossv, float(loss), err, sum(g["moved"] for g in got))
"""


def multiprocess(out_dir: Path) -> dict[str, Any]:
    # A script file, not ``python -c``: spawned ranks import the worker from it.
    script = out_dir / "multiprocess_check.py"
    script.write_text(_MP_CODE.format(src=str(ROOT / "src"), path=str(out_dir / "mp.pt"), dev=DEV))
    t0 = time.time()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    script.unlink()
    res: dict[str, Any] = {"backend": "gloo, CUDA tensors, 2 ranks on cuda:0", "returncode": r.returncode,
                           "seconds": time.time() - t0}
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT")), None)
    if line:
        loss, ref, err, moved = map(float, line.split()[1:])
        res.update({"loss": loss, "reference_loss": ref, "max_rel_grad": err, "moved_MiB": moved / 2**20})
        res["ok"] = err <= 1e-5 and abs(loss - ref) <= 1e-5 * abs(ref) and moved > 0
    else:
        res["ok"] = False
        res["error_tail"] = (r.stdout + r.stderr)[-3000:]
    print(f"  {res}", flush=True)
    return res


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def runner_timing(hidden: int = 4096, seq: int = 4096, heads: int = 32, kv_heads: int = 8) -> dict[str, Any]:
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.passes.offload import plan_offload
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.offload_store import OffloadStore
    from pipeoffload.schedules import generate

    from bench_offload_gpu import host_link_seconds
    from pipeoffload.runtime.measure import group_medians, predict_offload

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


def offload(out_dir: Path) -> dict[str, Any]:
    import bench_offload_gpu

    out: dict[str, Any] = {}
    for label, args in OFFLOAD_RUNS.items():
        print(f"  --- {label}", flush=True)
        extra = []
        if label in PROFILED:
            extra = ["--profile", str(out_dir / PROFILED[label])]
        r = bench_offload_gpu.run(args + ["--seq-len", "4096", "--dtype", "bf16", "--steps", "3"] + extra)
        for row in r["runs"].values():
            row.pop("step_s_all", None)
        out[label] = r
        torch.cuda.empty_cache()
    for name in PROFILED.values():
        trace = out_dir / name
        if trace.exists():
            with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb", compresslevel=6) as z:
                shutil.copyfileobj(f, z)
            trace.unlink()
    # bf16 with non-deterministic attention backward: equal within run-to-run noise
    # (bitwise equality under deterministic kernels is the correctness section's).
    out["ok"] = all(r["max_rel_grad_diff"] <= 2e-2 for r in out.values() if isinstance(r, dict))
    return out


def tests(out_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    try:
        import xdist  # noqa: F401

        cmd += ["-n", str(min(8, max(2, (os.cpu_count() or 2) // 2)))]
    except ImportError:
        pass
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    (out_dir / "pytest.log").write_text(r.stdout + r.stderr)
    tail = (r.stdout + r.stderr).strip().splitlines()[-40:]
    print("\n".join("  " + x for x in tail), flush=True)
    return {"command": " ".join(cmd[1:]), "returncode": r.returncode, "seconds": time.time() - t0,
            "summary": tail[-1] if tail else "", "ok": r.returncode == 0}


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check", help="output folder (default gpu-check/)")
    ap.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, help="sections to leave out")
    ap.add_argument("--only", nargs="*", default=None, choices=SECTIONS, help="run only these sections")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible to this PyTorch "
              f"({torch.__version__}); run it on a machine with a GPU", file=sys.stderr)
        return 2
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, Callable[[], dict[str, Any]]] = {
        "env": env, "correctness": correctness, "multiprocess": lambda: multiprocess(out_dir),
        "runner": runner_timing, "offload": lambda: offload(out_dir), "tests": lambda: tests(out_dir)}
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
