"""The GPU check's pieces that run anywhere: the profiler-trace overlap arithmetic, the
trace picture, the one-line refusal without CUDA, and OffloadStore's reload_alloc check.
(The CUDA sections themselves run with `make gpu-check` on a GPU: docs/gpu.md.)"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import import_torch

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.runtime.offload_store import OffloadStore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


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
    bench = _load("bench_offload_gpu")
    r = bench.copy_overlap(str(_trace(tmp_path)))
    assert r["copies"] == 2 and r["kernels"] == 3
    assert r["copy_s"] == pytest.approx(30e-6)
    assert r["copy_overlapped_s"] == pytest.approx(10e-6)  # [5,10) and [20,25) of the DtoH copy
    assert r["hidden_share"] == pytest.approx(1 / 3)


def test_trace_picture_is_drawn(tmp_path):
    plot = _load("plot_gpu_trace")
    spans = plot.lanes(str(_trace(tmp_path, gz=True)))
    assert len(spans["compute"]) == 3 and spans["d2h"] == [(0.005, 0.025)] and spans["h2d"] == [(0.04, 0.05)]
    png = tmp_path / "o.png"
    plot.draw(str(_trace(tmp_path, gz=True)), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CUDA is available: gpu_check.py runs its CUDA checks instead of refusing (make gpu-check)")
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_reload_alloc_is_checked():
    with pytest.raises(ParameterError, match="reload_alloc.*compute, copy"):
        OffloadStore(reload_alloc="h2d")
    assert OffloadStore().reload_alloc == "compute"
