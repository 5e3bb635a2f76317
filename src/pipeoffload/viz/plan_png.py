"""PNG line plot of :func:`pipeoffload.studies.scale.scale`: per-device activation memory against the number
of pipeline stages, one line per schedule (offloading series dashed).

matplotlib is imported inside :func:`draw_scale` (Agg canvas, no pyplot), so importing this module
is cheap. The timeline of a plan is drawn by :func:`pipeoffload.viz.png.draw_timeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..studies.scale import ScaleResult

__all__ = ["draw_scale"]

_COLORS = ("#3f6fb5", "#c9474b", "#e8832a", "#4f9d48", "#8a62b8", "#2a9d9a", "#333f4f", "#9a9a9a")
GiB = 2**30


def draw_scale(res: "ScaleResult", path: str | Path, title: str | None = None) -> Path:
    """Draw ``res`` to a PNG at ``path`` (parent folders created); returns the path.

    x: ranks p (log2 axis, ticks at the measured counts); y: GiB per device (activations, the highest
    rank). Points that could not be built are left out of their line; points with dropped offloads
    are marked with an open circle.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11.0, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, s in enumerate(res.series):
        pts = [(pt.ranks, pt.activation / GiB, pt.dropped) for pt in res.points[s.key] if pt.activation is not None]
        if not pts:
            continue
        color = _COLORS[i % len(_COLORS)]
        xs, ys = [x for x, _, _ in pts], [y for _, y, _ in pts]
        ax.plot(xs, ys, marker="o", color=color, linestyle="--" if s.offload else "-", linewidth=1.8, label=s.label)
        for x, y, d in pts:
            if d:
                ax.plot([x], [y], marker="o", markersize=10, markerfacecolor="none", color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(res.ranks))
    ax.set_xticklabels([str(p) for p in res.ranks])
    ax.set_xlabel("pipeline ranks p (the model's layers split over more devices)")
    ax.set_ylabel("activation memory per device (GiB)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    m = res.model
    ax.set_title(title or f"{m.name} on {res.hardware.name}: m={res.m} microbatches of {m.microbatch}×{m.seq} "
                          f"tokens, TP=1 (open circle: some offloads dropped)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path
