"""The figures a hardware profile needs, measured on this GPU (``gpu_check.py``'s ``profile`` section).

A profile (``pipeoffload.costmodel.hardware.Hardware``) is built from a handful of achieved
rates. This module measures each on the GPU it runs on, so a profile can be checked against
(or fitted to) the device rather than to vendor figures:

- ``gemm``: dense 16-bit matmul rate at a large square shape (``compute_rate``), and at
  shapes whose smallest dimension ``w`` shrinks (the three orientations: tokens, output
  width, reduction width), with ``gemm_half_width`` fitted to ``rate(w) = rate_large *
  w / (w + gemm_half_width)`` by least squares.
- ``attention``: causal ``scaled_dot_product_attention`` forward and backward, FLOP/s.
- ``hbm``: device-to-device copy, bytes read + written per second (``hbm_bw``).
- ``host_link``: pinned device->host and host->device, each alone and both at once
  (``host_bw``: one GPU alone on its link).
- ``pair_overlap``: DualPipe's overlapped F&B pair on real layers. One layer group's
  forward and another's backward (input and weight gradients) run one after the other on
  one stream, and on two streams at once: the time saved is what running a pair's halves
  concurrently can gain on this GPU (issue 27's question before the runtime does it).

Without a GPU (``dev="cpu"``) everything runs at tiny sizes as a smoke test and the figures
mean nothing. Guarantees: each figure is a median over timed repetitions after warm-ups;
nothing is written outside the returned dict.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

GB = 1e9


def _timer(dev: str, fn: Callable[[], Any], reps: int, warmup: int = 2) -> float:
    """Median seconds of one ``fn()`` (CUDA events on a GPU, wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_half_width(rows: list[tuple[float, float]]) -> float:
    """Least-squares ``hw`` of ``eff = w / (w + hw)`` over ``(w, eff)`` rows (golden-section
    search on [0, 8192]; the error is unimodal in ``hw`` for efficiencies in (0, 1])."""
    def err(hw: float) -> float:
        return sum((e - w / (w + hw)) ** 2 for w, e in rows)

    lo, hi = 0.0, 8192.0
    g = (5 ** 0.5 - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if err(a) <= err(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def gemm(dev: str, dtype: torch.dtype, big: int, widths: list[int], reps: int) -> dict[str, Any]:
    """Matmul rates: ``big``³, then each orientation with one dimension ``w`` of ``widths``."""
    def rate(m: int, k: int, n: int) -> float:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        return 2 * m * k * n / _timer(dev, lambda: a @ b, reps)

    large = rate(big, big, big)
    rows: list[dict[str, Any]] = []
    for w in widths:
        for axis, shape in (("tokens", (w, big, big)), ("out", (big, big, w)), ("reduce", (big, w, big))):
            r = rate(*shape)
            rows.append({"w": w, "axis": axis, "tflops": r / 1e12, "efficiency": r / large})
    hw = fit_half_width([(r["w"], r["efficiency"]) for r in rows])
    worst = max(abs(r["efficiency"] - r["w"] / (r["w"] + hw)) for r in rows)
    return {"shape": big, "tflops": large / 1e12, "rows": rows, "gemm_half_width": hw,
            "fit_max_abs_error": worst}


def attention(dev: str, dtype: torch.dtype, seqs: list[int], heads: int, head_dim: int,
              reps: int) -> list[dict[str, Any]]:
    """Causal SDPA, batch 1: forward and backward TFLOP/s (causal: half the square's FLOPs;
    the backward counts 2.5 forwards, its five matmuls to the forward's two)."""
    out = []
    for s in seqs:
        q, k, v = (torch.randn(1, heads, s, head_dim, device=dev, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        flops = 4 * heads * s * s * head_dim / 2
        f = _timer(dev, lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), reps)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        dy = torch.randn_like(y)

        def fb() -> None:
            yy = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(yy, (q, k, v), dy)

        b = _timer(dev, fb, reps) - f
        out.append({"seq": s, "heads": heads, "head_dim": head_dim, "fwd_tflops": flops / f / 1e12,
                    "bwd_tflops": 2.5 * flops / max(b, 1e-12) / 1e12})
    return out


def hbm(dev: str, nbytes: int, reps: int) -> dict[str, Any]:
    x = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = _timer(dev, lambda: y.copy_(x), reps)
    return {"bytes": nbytes, "copy_tbs": 2 * nbytes / t / 1e12}


def host_link(dev: str, nbytes: int, reps: int) -> dict[str, Any]:
    """Pinned copies: each direction alone, and both at once on two streams."""
    pin = dev == "cuda"
    g_src = torch.empty(nbytes, device=dev, dtype=torch.uint8)
    g_dst = torch.empty(nbytes, device=dev, dtype=torch.uint8)
    h_dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    h_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    d2h = _timer(dev, lambda: h_dst.copy_(g_src, non_blocking=pin), reps)
    h2d = _timer(dev, lambda: g_dst.copy_(h_src, non_blocking=pin), reps)
    out: dict[str, Any] = {"bytes": nbytes, "d2h_gbs": nbytes / d2h / GB, "h2d_gbs": nbytes / h2d / GB}
    if dev == "cuda":
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

        def both() -> None:
            with torch.cuda.stream(s1):
                h_dst.copy_(g_src, non_blocking=True)
            with torch.cuda.stream(s2):
                g_dst.copy_(h_src, non_blocking=True)
            torch.cuda.current_stream().wait_stream(s1)
            torch.cuda.current_stream().wait_stream(s2)

        t = _timer(dev, both, reps)
        out["both_directions_gbs_each"] = nbytes / t / GB
    return out


def pair_overlap(dev: str, dtype: torch.dtype, hidden: int, seq: int, heads: int, kv_heads: int,
                 layers: int, reps: int) -> dict[str, Any]:
    """An overlapped F&B pair on two layer groups of the reference transformer: the
    forward of one and the backward (B and W) of the other, one after the other on one
    stream, and on two streams. Autograd runs a backward on the stream of its forward, so
    the backward's group runs its forward on the second stream before the timing."""
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.transformer import LayerGroup

    cfg = ModelConfig(layers=2 * layers, hidden=hidden, heads=heads, kv_heads=kv_heads, seq_len=seq, seed=0)
    gf = LayerGroup(cfg, range(0, layers), first=False, last=False).to(dev, dtype)
    gb = LayerGroup(cfg, range(layers, 2 * layers), first=False, last=False).to(dev, dtype)
    xf = torch.randn(1, seq, hidden, device=dev, dtype=dtype)
    xb = torch.randn(1, seq, hidden, device=dev, dtype=dtype, requires_grad=True)
    dy = torch.randn(1, seq, hidden, device=dev, dtype=dtype)
    cuda = dev == "cuda"
    main = torch.cuda.current_stream() if cuda else None
    side = torch.cuda.Stream() if cuda else None

    def on(stream: Any) -> Any:
        return torch.cuda.stream(stream) if cuda else _Null()

    def prepared(stream: Any) -> torch.Tensor:
        with on(stream):
            y = gb(xb)
        if cuda:
            torch.cuda.synchronize()
        return y

    def forward() -> None:
        with torch.no_grad():
            gf(xf)

    def timed(stream_b: Any, what: str) -> float:
        ts = []
        for k in range(reps + 1):
            y = prepared(stream_b)
            t0 = time.perf_counter()
            if what != "B":
                with on(main):
                    gf(xf)
            if what != "F":
                with on(stream_b):
                    torch.autograd.backward(y, dy)
            if cuda:
                torch.cuda.synchronize()
            if k:
                ts.append(time.perf_counter() - t0)
            gb.zero_grad(set_to_none=False)
        return statistics.median(ts)

    f, b = timed(main, "F"), timed(main, "B")
    one = timed(main, "FB")
    two = timed(side, "FB") if cuda else one
    return {"hidden": hidden, "seq": seq, "layers": layers, "F_ms": 1e3 * f, "BW_ms": 1e3 * b,
            "one_stream_ms": 1e3 * one, "two_streams_ms": 1e3 * two,
            "saved": 1 - two / one, "two_streams_measured": cuda}


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def measure(dev: str) -> dict[str, Any]:
    """Every figure above, at GPU sizes on a GPU, tiny sizes on the CPU (a smoke test)."""
    gpu = dev == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    reps = 10 if gpu else 2
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if gpu else "cpu (smoke run)"}
    out["gemm"] = gemm(dev, dtype, 8192 if gpu else 64, [128, 256, 512, 1024, 2048, 4096] if gpu else [8, 16, 32],
                       reps)
    out["attention"] = attention(dev, dtype, [2048, 4096, 8192] if gpu else [32], 32 if gpu else 2,
                                 128 if gpu else 8, reps)
    out["hbm"] = hbm(dev, (2 << 30) if gpu else (1 << 20), reps)
    out["host_link"] = host_link(dev, (1 << 30) if gpu else (1 << 20), reps)
    sizes = [(2048, 2048, 16, 4, 2), (4096, 4096, 32, 8, 2)] if gpu else [(32, 16, 4, 2, 1)]
    out["pair_overlap"] = [pair_overlap(dev, dtype, h, s, nh, kv, L, reps) for h, s, nh, kv, L in sizes]
    out["suggested"] = {"compute_tflops": out["gemm"]["tflops"], "gemm_half_width": out["gemm"]["gemm_half_width"],
                        "hbm_tbs": out["hbm"]["copy_tbs"],
                        "host_link_gbs": min(out["host_link"]["d2h_gbs"], out["host_link"]["h2d_gbs"])}
    out["ok"] = True
    print(f"  suggested profile figures: {out['suggested']}", flush=True)
    for r in out["pair_overlap"]:
        print(f"  F&B pair h={r['hidden']} s={r['seq']}: F {r['F_ms']:.2f} ms, B+W {r['BW_ms']:.2f} ms, one stream "
              f"{r['one_stream_ms']:.2f} ms, two {r['two_streams_ms']:.2f} ms (saved {r['saved']:.1%})", flush=True)
    return out
