"""Draw the copy/compute overlap of a torch.profiler Chrome trace as a PNG.

Three lanes over time: compute kernels, device→host copies, host→device copies
(``gpu_memcpy`` DtoH / HtoD), with the share of copy time that overlaps compute.

    python benchmarks/plot_gpu_trace.py docs/gpu/offload_trace_h16384_h100.json.gz docs/gpu/overlap-h16384.png
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_offload_gpu import _overlap, _union  # noqa: E402


def lanes(path: str) -> dict[str, list[tuple[float, float]]]:
    """Spans (ms from the first GPU event) of compute kernels, DtoH and HtoD copies."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    out: dict[str, list[tuple[float, float]]] = {"compute": [], "d2h": [], "h2d": []}
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        lane = "compute" if cat == "kernel" else ("d2h" if "DtoH" in name else "h2d" if "HtoD" in name else None)
        if lane is None or (cat != "kernel" and cat != "gpu_memcpy"):
            continue
        out[lane].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    t0 = min(a for spans in out.values() for a, _ in spans)
    return {k: [((a - t0) / 1000, (b - t0) / 1000) for a, b in v] for k, v in out.items()}


def draw(path: str, png: str, title: str | None = None) -> None:
    spans = lanes(path)
    busy = _union(spans["compute"])
    copies = spans["d2h"] + spans["h2d"]
    total = sum(b - a for a, b in copies)
    hidden = sum(_overlap(c, busy) for c in copies) / total if total else 0.0
    fig, ax = plt.subplots(figsize=(12, 2.6))
    colors = {"compute": "#4c72b0", "d2h": "#dd8452", "h2d": "#55a868"}
    for y, lane in enumerate(("compute", "d2h", "h2d")):
        merged = _union(spans[lane])
        ax.broken_barh([(a, b - a) for a, b in merged], (2 - y - 0.35, 0.7), color=colors[lane])
    ax.set_yticks([2, 1, 0], ["compute", "device→host", "host→device"])
    ax.set_xlabel("ms")
    ax.set_title(title or f"{Path(path).name}: {100 * hidden:.0f}% of copy time overlaps compute")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    draw(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
