"""The GPU check's pieces that run anywhere: the profiler-trace overlap arithmetic, the
trace picture, the one-line refusal without CUDA, OffloadStore's reload_alloc check, the
multi-rank section on CPU ranks (two schedules, both transports, a failing case that
does not stop the others), and the offload replay with the pipeline's waits (the
simulated arrival times, the hold, a tiny end-to-end replay).
(The CUDA sections themselves run with `make gpu-check` on a GPU: docs/gpu.md.)"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import import_torch, load_benchmark

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.runtime.offload_store import OffloadStore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _trace(tmp_path: Path, gz: bool = False) -> Path:
    """Kernels on [0, 10) and [20, 30) µs; a DtoH copy on [5, 25) and an HtoD copy on
    [40, 50); a DtoD copy and a CPU op that must be ignored."""
    ev = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 20, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 22, "dur": 3},  # nested: no double count
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 5, "dur": 20},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 40, "dur": 10},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 0, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 0, "dur": 100},
    ]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    data = json.dumps({"traceEvents": ev}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_copy_overlap_counts_copy_time_under_compute_kernels(tmp_path):
    bench = load_benchmark("bench_offload_gpu")
    r = bench.copy_overlap(str(_trace(tmp_path)))
    assert r["copies"] == 2 and r["kernels"] == 3
    assert r["copy_s"] == pytest.approx(30e-6)
    assert r["copy_overlapped_s"] == pytest.approx(10e-6)  # [5,10) and [20,25) of the DtoH copy
    assert r["hidden_share"] == pytest.approx(1 / 3)


def test_trace_picture_is_drawn(tmp_path):
    plot = load_benchmark("plot_gpu_trace")
    spans = plot.lanes(str(_trace(tmp_path, gz=True)))
    assert len(spans["compute"]) == 3 and spans["d2h"] == [(0.005, 0.025)] and spans["h2d"] == [(0.04, 0.05)]
    png = tmp_path / "o.png"
    plot.draw(str(_trace(tmp_path, gz=True)), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CUDA is available: gpu_check.py runs its CUDA checks instead of refusing (make gpu-check)")
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPU_CHECK_DEVICE"}  # not the CPU smoke run
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_reload_alloc_is_checked():
    with pytest.raises(ParameterError, match="reload_alloc.*compute, copy"):
        OffloadStore(reload_alloc="h2d")
    assert OffloadStore().reload_alloc == "compute"


# ----------------------------------------------------------------------------- multi-rank section


@pytest.mark.multiproc
def test_multiprocess_section_runs_two_schedules_under_both_transports_on_cpu(tmp_path):
    gpu = load_benchmark("gpu_check")
    res = gpu.multiprocess(tmp_path, device="cpu", ps=(2,), schedules=["1f1b", "zb-v"],
                           transports=("torch", "nccl-rules"))
    assert "not run" in res["nccl"]  # no GPU here: said so, not silently left out
    g = res["groups"]["gloo p=2"]
    assert g["launches"] == 1 and g["m"] == 4
    assert set(g["cases"]) == {f"{n} / {t}" for n in ("1f1b", "zb-v") for t in ("torch", "nccl-rules")}
    for case, row in g["cases"].items():
        assert row["ok"], (case, row, g.get("driver_tail"))
        assert row["max_rel_grad"] <= 1e-5 and row["loss_rel"] <= 1e-5, case
        assert row["max_rel_grad_offload"] <= 1e-5 and row["loss_rel_offload"] <= 1e-5, case
        assert row["moved_MiB"] > 0 and row["step_s"] > 0 and row["step_s_offload"] > 0, case
        assert row["transport"] == [case.split(" / ")[1]], case  # the transport asked for ran
    assert res["ok"] and g["ok"]


@pytest.mark.multiproc
def test_multiprocess_section_a_failing_case_does_not_stop_the_others(tmp_path):
    gpu = load_benchmark("gpu_check")
    res = gpu.multiprocess(tmp_path, device="cpu", ps=(2,), schedules=["no-such-schedule", "1f1b"],
                           transports=("torch",), offload=False, steps=1)
    g = res["groups"]["gloo p=2"]
    bad, good = g["cases"]["no-such-schedule / torch"], g["cases"]["1f1b / torch"]
    assert not bad["ok"] and "unknown schedule 'no-such-schedule'" in bad["error"]
    assert good["ok"] and good["max_rel_grad"] <= 1e-5 and "moved_MiB" not in good
    assert g["launches"] == 2 and not g["ok"] and not res["ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where NCCL cannot start")
def test_multiprocess_driver_reports_a_world_that_cannot_start_on_every_case(tmp_path, monkeypatch):
    gpu = load_benchmark("gpu_check")
    monkeypatch.setitem(sys.modules, "gpu_check", gpu)  # the worker must be importable by name
    spec = {"p": 2, "m": 4, "backend": "nccl", "device": "cpu", "model": gpu.MP_MODEL["cpu"], "out": str(tmp_path),
            "offload": False, "steps": 1, "timeout_s": 10, "cases": [[0, "1f1b", "torch"], [1, "zb-v", "torch"]]}
    gpu._mp_drive(spec)  # no rank starts: nccl needs CUDA
    errs = json.loads((tmp_path / "errors.json").read_text())
    assert errs["launches"] == 1 and set(errs["errors"]) == {"0", "1"}
    assert all("before this case started" in e and "nccl needs CUDA" in e for e in errs["errors"].values())


def test_overhead_summary_reports_the_worst_case_at_k_le_1():
    gpu = load_benchmark("gpu_check")
    runs = {"a": {"k_measured": 0.9, "overhead": 0.05, "overhead_with_waits": 0.004},
            "b": {"k_measured": 0.95, "overhead": 0.07, "overhead_with_waits": 0.02},
            "c": {"k_measured": 1.7, "overhead": 0.17, "overhead_with_waits": 0.09},
            "old": {"overhead": 0.3}}  # a run without k or waits
    s = gpu.overhead_summary(runs)
    assert s["runs_at_k_le_1"] == 2
    assert s["worst_overhead_no_waits"] == 0.07 and s["worst_overhead_with_waits"] == 0.02
    assert s["goal_met_no_waits"] is False and s["goal_met_with_waits"] is False
    runs["b"]["overhead_with_waits"] = 0.01
    assert gpu.overhead_summary(runs)["goal_met_with_waits"] is True


# ----------------------------------------------------------------------------- replay with the pipeline's waits


def test_pipeline_releases_are_the_simulated_arrivals_of_remote_inputs():
    from pipeoffload.ir import OpKind
    from pipeoffload.schedules import generate

    bench = load_benchmark("bench_offload_gpu")
    F, BW = OpKind.F, OpKind.BW
    sched = generate("1f1b", p=2, m=2)
    # F = B = W = 1 per layer group (BW = 2). Rank 1: F(1,0) [1,2], BW [2,4], F(1,1) [4,5], BW [5,7];
    # rank 0: F F, then BW(0,0) after BW(1,0) ends at 4, BW(0,1) after 7.
    rel, info = bench.pipeline_releases(sched, 1, (1.0, 1.0, 1.0))
    assert rel == {(F, 1, 0): 1.0, (F, 1, 1): 2.0}  # the last layer group's BW waits for nothing remote
    assert info["rank_end_s"] == 7.0 and info["makespan_s"] == 9.0 and info["rank_busy_s"] == 6.0
    rel, info = bench.pipeline_releases(sched, 0, (1.0, 1.0, 1.0))
    assert rel == {(BW, 0, 0): 4.0, (BW, 0, 1): 7.0} and info["remote_input_ops"] == 2
    # 0.5 s per message: every arrival = the producer's end + 0.5
    rel, _ = bench.pipeline_releases(sched, 0, (1.0, 1.0, 1.0), comm=0.5)
    assert rel == {(BW, 0, 0): 5.0, (BW, 0, 1): 8.0}
    # the costs are per layer group, not per rank (v = 2 does not halve them)
    rel, _ = bench.pipeline_releases(generate("interleaved-1f1b", p=2, m=2), 1, (1.0, 1.0, 1.0))
    assert rel[(F, 1, 0)] == 1.0 and rel[(F, 3, 0)] == 3.0
    # V placement: the turn (stage 1 -> 2 on rank 1) and the loss turn are local
    zbv = generate("zb-v", p=2, m=2)
    for r in (0, 1):
        rel, _ = bench.pipeline_releases(zbv, r, (1.0, 1.0, 1.0))
        mine = {(o.kind, o.stage, o.microbatch) for o in zbv.ranks[r] if o.kind.is_compute}
        remote = {(o.kind, o.stage, o.microbatch) for o in zbv.ranks[r]
                  if (o.kind is F and o.stage in (1, 3)) or (o.kind is OpKind.B and o.stage in (0, 2))}
        assert set(rel) == remote and remote < mine, r


def test_wait_until_holds_the_host_until_the_deadline():
    import time

    bench = load_benchmark("bench_offload_gpu")
    t0 = time.perf_counter()
    held = bench.wait_until(t0 + 0.03)
    assert time.perf_counter() >= t0 + 0.03 and 0.0 < held < 0.5
    assert bench.wait_until(time.perf_counter() - 1.0) == 0.0


def test_replay_holds_each_released_op_until_its_time():
    from pipeoffload.models.config import ModelConfig
    from pipeoffload.schedules import generate

    bench = load_benchmark("bench_offload_gpu")
    sched = generate("1f1b", p=2, m=2)
    cfg = ModelConfig(layers=1, hidden=32, heads=4, kv_heads=2, seq_len=16)
    mods = {1: bench.Chunk(cfg, 1, seed=1)}
    rep = bench.Replay(sched.ranks[1], mods, (1, 16, 32), torch.float32, torch.device("cpu"), None)
    free = rep.step()
    g_free = {n: p.grad.clone() for n, p in mods[1].named_parameters()}
    rel, _ = bench.pipeline_releases(sched, 1, (0.05, 0.05, 0.05))  # F(1,1) arrives at 0.1 s
    rep.release = rel
    for p in mods[1].parameters():
        p.grad = None
    held = rep.step()
    assert held >= 0.1 and rep.holds >= 1 and rep.held_s > 0
    assert all(torch.equal(p.grad, g_free[n]) for n, p in mods[1].named_parameters())  # no number changes
    assert free >= 0 and rep.busy_seconds() > 0


def test_offload_replay_with_and_without_the_pipeline_waits_on_cpu(tmp_path):
    bench = load_benchmark("bench_offload_gpu")
    # A fixed transfer time: planned from this CPU's measured op times and copies, the plan
    # moved nothing in a loaded CI run (every transfer too long for its window: skipped).
    tiny = ["--device", "cpu", "--tiny", "-p", "2", "-m", "4", "--hidden", "32", "--seq-len", "32", "--steps", "1",
            "--offload-time", "0.1"]
    r = bench.run(tiny + ["--json", str(tmp_path / "r.json")])
    assert list(r["runs"]) == ["no offload", "offload", "no offload, waits", "offload, waits"]
    assert r["bitwise_equal_grads"] and r["bitwise_equal_grads_waits"] and r["max_rel_grad_diff_waits"] == 0.0
    w = r["waits"]["no offload"]
    assert w["remote_input_ops"] > 0 and w["comm_s"] == 0.0
    assert (w["F_s"], w["B_s"], w["W_s"]) == bench.group_costs(r["runs"]["no offload"]["op_s"])
    for label in ("no offload, waits", "offload, waits"):
        row = r["runs"][label]
        assert row["step_s"] >= w["last_release_s"]  # its last held op cannot be issued before its message
        assert "held_ops" in row and row["held_host_s"] >= 0
    assert r["runs"]["offload, waits"]["moved_bytes"] > 0
    assert isinstance(r["overhead_with_waits"], float) and r["waits"]["replay_vs_simulated_rank_end"] > 0
    assert json.loads((tmp_path / "r.json").read_text())["overhead_with_waits"] == r["overhead_with_waits"]
    old = bench.run(tiny + ["--no-pipeline-waits"])  # the old mode: the bubble-free replay only
    assert list(old["runs"]) == ["no offload", "offload"] and "overhead_with_waits" not in old and "waits" not in old


def test_gemm_half_width_fit_recovers_a_known_curve():
    prof = load_benchmark("gpu_profile")
    for hw in (0.0, 64.0, 320.0, 1000.0):
        rows = [(w, w / (w + hw)) for w in (128, 256, 512, 1024, 2048, 4096)]
        assert prof.fit_half_width(rows) == pytest.approx(hw, abs=0.01)
    # A noisy curve: the fit minimises the squared error (a grid of hw values cannot beat it).
    rows = [(128, 0.25), (256, 0.45), (512, 0.64), (1024, 0.80), (2048, 0.91), (4096, 0.98)]
    hw = prof.fit_half_width(rows)

    def err(h: float) -> float:
        return sum((e - w / (w + h)) ** 2 for w, e in rows)

    assert all(err(hw) <= err(h) + 1e-12 for h in range(0, 2000, 5))


def test_profile_section_runs_on_cpu_and_reports_every_figure(tmp_path):
    env = dict(os.environ, GPU_CHECK_DEVICE="cpu")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--only", "profile",
                        "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    prof = json.loads((tmp_path / "gpu_check.json").read_text())["profile"]
    assert prof["ok"] and prof["gemm"]["tflops"] > 0 and len(prof["gemm"]["rows"]) == 9
    assert set(prof["suggested"]) == {"compute_tflops", "gemm_half_width", "hbm_tbs", "host_link_gbs"}
    assert all(r["one_stream_ms"] > 0 and not r["two_streams_measured"] for r in prof["pair_overlap"])
    assert "F&B pair" in r.stdout


def test_whole_iteration_section_on_cpu():
    """The iteration section's code path on CPU (tiny fp32 models): both schedules run with the
    mixed-precision step, every figure is compared, and the activation peak the runtime measured
    matches the cost model's eager description of the reference transformer (GPipe holds m
    microbatches, 1F1B at p = 1 one). Timings on a CPU mean nothing and are not checked."""
    gi = load_benchmark("gpu_iteration")
    res = gi.whole_iterations("cpu", gi.TINY, "cpu", steps=1)
    runs = res["runs"]
    assert set(runs) == {label for label, *_ in gi.TINY}
    for run in runs.values():
        assert {"pipeline_s", "optimizer_s", "activation_GiB"} <= set(run["error"])
        assert abs(run["error"]["activation_GiB"]) < 0.05, run
    assert runs["tiny gpipe"]["measured"]["activation_GiB"] > 3 * runs["tiny 1f1b"]["measured"]["activation_GiB"]
    assert set(res["summary"]) == {"pipeline_s", "optimizer_s", "activation_GiB"}


# ----------------------------------------------------------------------------- tests section


def test_tests_section_runs_the_paths_given_and_reports_a_run_past_its_time(tmp_path):
    # A lent GPU's slot is short: the whole suite no longer fits one (2026-11-27), so the section
    # takes pytest's paths and a time limit, and a run stopped at its limit says so.
    gpu = load_benchmark("gpu_check")
    res = gpu.tests(tmp_path, ["tests/test_docs_links.py::test_the_readme_stays_short"], 300)
    assert res["ok"] and res["returncode"] == 0, res
    assert res["command"].endswith("tests/test_docs_links.py::test_the_readme_stays_short")
    assert "1 passed" in res["summary"] and (tmp_path / "pytest.log").exists()
    assert res["engine"] == "built"  # the C loops, as pip builds them (a lent machine runs from source)
    stopped = gpu.tests(tmp_path, ["tests/test_docs_links.py"], 0.05)
    assert not stopped["ok"] and stopped["returncode"] is None
    assert stopped["summary"] == "ran past its 0.05 s (--tests-timeout) and was stopped"
    assert all((Path(__file__).parents[1] / p).exists() for p in gpu.TESTS_SHORT)  # real modules


def test_tests_timeout_flag_is_checked():
    r = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"),
                        "--only", "tests", "--tests-timeout", "0"], capture_output=True, text=True,
                       env=dict(os.environ, GPU_CHECK_DEVICE="cpu"))
    assert r.returncode == 2 and "--tests-timeout: must be a positive number of seconds, got 0" in r.stderr
