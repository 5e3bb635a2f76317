"""Fit a GPU's hardware profile to the op times our runtime measured on it, and check it on another run.

`make gpu-check` records, for each offload configuration (``offload`` section), the median F, B and W
of one layer group of the reference transformer on the GPU (bf16, s = 4096, h = 4096 to 16384). The
cost model prices an op as its GEMM FLOPs at ``compute_rate · w / (w + gemm_half_width)`` (``w`` the
smallest GEMM dimension) plus, for F and B, ``elementwise_f`` / ``elementwise_b`` passes over the
bytes F writes at ``hbm_bw`` (docs/cost-model.md §2). This script fits ``compute_rate``,
``elementwise_f`` and ``elementwise_b`` by least squares on the relative errors of every F, B and W
(``gemm_half_width`` comes from the profile section's GEMM sweep, ``hbm_bw`` is the GPU's nominal),
prints each op's error, and the errors of the fitted constants on a second run (``--check``), e.g.
the other GPU of the same compute die.

    python benchmarks/fit_gpu_profile.py docs/gpu/gpu_check_h200.json --hbm-tbs 4.8 \
        --check docs/gpu/gpu_check_h100.json --check-hbm-tbs 3.35
    python benchmarks/fit_gpu_profile.py ... --profile h200   # the built-in profile's errors, no fit
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeoffload.costmodel.hardware import get_hardware  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402


def measured_ops(path: str | Path) -> list[dict[str, Any]]:
    """Per offload configuration of a gpu_check.json: the layer group's GEMM FLOPs of F, B, W, the
    bytes F writes, the smallest GEMM dimension, and the measured F, B, W (ms)."""
    runs = json.loads(Path(path).read_text())["offload"]
    out = []
    for label, r in runs.items():
        if not isinstance(r, dict) or "plan" not in r:
            continue
        cfg = ModelConfig(layers=r["layers_per_chunk"], hidden=r["hidden"], heads=r["heads"],
                          kv_heads=r["kv_heads"], seq_len=r["seq_len"], seed=0)
        spec = cfg.spec(microbatch=r["microbatch_size"], dtype="bf16")
        lay, n = spec.layer(), r["layers_per_chunk"]
        out.append({"label": label, "w": min(spec.tokens, spec.hidden), "f": lay.f_flops * n,
                    "b": (lay.b_flops + lay.recompute_flops) * n, "wf": lay.w_flops * n,
                    "bytes": lay.traffic_bytes * n, "F": 1e3 * r["plan"]["F_s"], "B": 1e3 * r["plan"]["B_s"],
                    "W": 1e3 * r["plan"]["W_s"]})
    if not out:
        raise SystemExit(f"{path}: no offload runs with measured op times (run gpu_check.py --only offload)")
    return out


def predict(row: dict[str, Any], rate: float, half_width: float, ew_f: float, ew_b: float,
            hbm: float) -> tuple[float, float, float]:
    """F, B, W in ms as the cost model prices them (costmodel/model.py ``_group_cost``)."""
    per_ms = rate * row["w"] / (row["w"] + half_width) / 1e3
    ew = row["bytes"] / hbm * 1e3
    return row["f"] / per_ms + ew_f * ew, row["b"] / per_ms + ew_b * ew, row["wf"] / per_ms


def errors(rows: list[dict[str, Any]], *args: float) -> list[float]:
    out = []
    for r in rows:
        out += [p / m - 1 for p, m in zip(predict(r, *args), (r["F"], r["B"], r["W"]))]
    return out


def fit(rows: list[dict[str, Any]], half_width: float, hbm: float) -> tuple[float, float, float]:
    """:func:`least_squares` rounded to the profile's precision (1 TFLOP/s, 0.25 passes)."""
    rate, ew_f, ew_b = least_squares(rows, half_width, hbm)
    return round(rate / 1e12) * 1e12, round(4 * ew_f) / 4, round(4 * ew_b) / 4


def least_squares(rows: list[dict[str, Any]], half_width: float, hbm: float) -> tuple[float, float, float]:
    """(compute_rate FLOP/s, elementwise_f, elementwise_b) minimising the sum of the squared relative
    errors of every F, B and W of ``rows`` (unrounded). Exact: each relative error is linear in
    (1 / rate, elementwise_f, elementwise_b), so the minimum solves the 3 × 3 normal equations. O(len(rows))."""
    a: list[list[float]] = []  # one row per op: coefficients of (1/rate, ew_f, ew_b), target 1
    for r in rows:
        flop_ms = 1e3 * (r["w"] + half_width) / r["w"]  # ms per FLOP, times the rate
        ew = r["bytes"] / hbm * 1e3
        a += [[r["f"] * flop_ms / r["F"], ew / r["F"], 0.0], [r["b"] * flop_ms / r["B"], 0.0, ew / r["B"]],
              [r["wf"] * flop_ms / r["W"], 0.0, 0.0]]
    n = [[sum(x[i] * x[j] for x in a) for j in range(3)] + [sum(x[i] for x in a)] for i in range(3)]
    for i in range(3):  # Gauss-Jordan on the (positive definite) normal equations
        for k in range(3):
            if k != i:
                f = n[k][i] / n[i][i]
                n[k] = [u - f * v for u, v in zip(n[k], n[i])]
    inv_rate, ew_f, ew_b = (n[i][3] / n[i][i] for i in range(3))
    return 1 / inv_rate, ew_f, ew_b


def _show(title: str, rows: list[dict[str, Any]], errs: list[float]) -> None:
    print(title)
    for i, r in enumerate(rows):
        e = errs[3 * i: 3 * i + 3]
        print(f"  {r['label']:<28} measured F {r['F']:6.2f} B {r['B']:6.2f} W {r['W']:6.2f} ms   error "
              + "  ".join(f"{k} {100 * x:+5.1f}%" for k, x in zip("FBW", e)))
    print(f"  largest error {100 * max(abs(x) for x in errs):.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="gpu_check.json with an offload section")
    ap.add_argument("--hbm-tbs", type=float, default=None, help="the GPU's nominal HBM TB/s (for a fit)")
    ap.add_argument("--half-width", type=float, default=320.0, help="gemm_half_width (default 320: H200 sweep)")
    ap.add_argument("--profile", default=None, help="check this built-in profile instead of fitting")
    ap.add_argument("--check", default=None, help="a second run to check the fitted constants on")
    ap.add_argument("--check-hbm-tbs", type=float, default=None)
    a = ap.parse_args(argv)
    rows = measured_ops(a.run)
    if a.profile:
        hw = get_hardware(a.profile)
        args = (hw.compute_rate, hw.gemm_half_width if hw.shape_efficiency else 0.0, hw.elementwise_f,
                hw.elementwise_b, hw.hbm_bw or 1.0)
        _show(f"{a.profile} on {a.run}", rows, errors(rows, *args))
        return 0
    if a.hbm_tbs is None:
        ap.error("--hbm-tbs is needed for a fit (the GPU's nominal HBM bandwidth, TB/s)")
    rate, ew_f, ew_b = fit(rows, a.half_width, a.hbm_tbs * 1e12)
    print(f"fit: compute_rate {rate / 1e12:.0f} TFLOP/s, gemm_half_width {a.half_width:g}, "
          f"elementwise_f {ew_f:g}, elementwise_b {ew_b:g} (hbm_bw {a.hbm_tbs:g} TB/s)")
    _show(f"fitted on {a.run}", rows, errors(rows, rate, a.half_width, ew_f, ew_b, a.hbm_tbs * 1e12))
    if a.check:
        other = measured_ops(a.check)
        hbm = (a.check_hbm_tbs or a.hbm_tbs) * 1e12
        _show(f"held out: {a.check}", other, errors(other, rate, a.half_width, ew_f, ew_b, hbm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
