"""PNG of a schedule comparison: peak activation memory vs bubble rate, Pareto frontier marked.

One point per schedule that produced numbers (schedules at the same point share one
label); the frontier points are drawn larger, in colour, joined by the staircase that
bounds the reachable region; schedules that refused the parameters are listed under
the plot with their reason. matplotlib is imported inside :func:`draw_pareto` (Agg
canvas, no pyplot), so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path

from ..studies.compare import Comparison, Row

__all__ = ["draw_pareto"]

_FRONT = "#c9474b"
_OTHER = "#5b6f8a"
_DPI = 100


def _groups(rows: list[Row]) -> list[tuple[float, float, list[Row]]]:
    """Rows with numbers, grouped by identical (peak, bubble) point."""
    out: dict[tuple[float, float], list[Row]] = {}
    for r in rows:
        if r.ok:
            out.setdefault((round(r.peak_memory, 9), round(r.bubble_rate, 9)), []).append(r)
    return [(x, y, rs) for (x, y), rs in sorted(out.items())]


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])


def draw_pareto(comparison: Comparison, path: str | Path, memory_unit: str = "units",
                title: str | None = None) -> Path:
    """Draw ``comparison`` to a PNG at ``path`` (parent folders created); returns the path.

    Guarantees: every row with numbers is a point with its label; every frontier row
    is drawn in the frontier colour; every row with an error is named in the footnote.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = _groups(comparison.rows)
    note_lines = [f"not shown — {r.label}: {_short(r.error or '')}" for r in comparison.rows if not r.ok]
    fig_w, axes_h = 10.0, 6.2
    foot_h = 0.22 * len(note_lines) + (0.3 if note_lines else 0.0)
    top_h, below_h = 0.9, 1.05  # title and subtitle; x label and legend
    fig_h = axes_h + top_h + below_h + foot_h
    fig = Figure(figsize=(fig_w, fig_h), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.09, (below_h + foot_h) / fig_h, 0.86, axes_h / fig_h))

    _set_limits(ax, groups)
    _draw_points(ax, groups)
    _draw_labels(fig, ax, groups)
    _style_axes(ax, memory_unit)
    _draw_legend(fig, (below_h + foot_h - 0.5) / fig_h)
    _draw_texts(fig, comparison, title, note_lines, fig_h, foot_h)
    fig.savefig(path, dpi=_DPI)
    return path


def _set_limits(ax, groups: list[tuple[float, float, list[Row]]]) -> None:
    """Room around the points, more on the right for labels (bubble in %)."""
    if not groups:
        return
    xs = [x for x, _, _ in groups]
    ys = [100 * y for _, y, _ in groups]
    x_lo, x_hi = min(xs), max(xs)
    y_hi = max(ys)
    pad_x = max(0.06 * (x_hi - x_lo), 0.5)
    ax.set_xlim(max(0.0, x_lo - pad_x) if x_lo > 0 else -pad_x, x_hi + 3 * pad_x)
    ax.set_ylim(-max(0.06 * y_hi, 0.5), max(y_hi * 1.12, 1.0))


def _draw_points(ax, groups: list[tuple[float, float, list[Row]]]) -> None:
    """The frontier staircase (every frontier point, by increasing memory) and one
    marker per point, frontier points larger and in colour."""
    front = sorted(((x, 100 * y) for x, y, rs in groups if any(r.on_frontier for r in rs)))
    if front:
        sx = [x for x, _ in front] + [ax.get_xlim()[1]]
        sy = [y for _, y in front] + [front[-1][1]]
        ax.step(sx, sy, where="post", color=_FRONT, linewidth=1.4, alpha=0.55, zorder=2)
    for x, y, rs in groups:
        on = any(r.on_frontier for r in rs)
        ax.scatter([x], [100 * y], s=70 if on else 36, color=_FRONT if on else _OTHER,
                   edgecolor="white", linewidth=0.8, zorder=4 if on else 3)


#: Label positions tried around a point, in points from it (first fit wins).
_LABEL_OFFSETS = [(8, 4), (8, -14), (-8, 4), (-8, -14), (8, 16), (8, -26), (-8, 16), (-8, -26), (8, 28), (-8, 28)]


def _draw_labels(fig, ax, groups: list[tuple[float, float, list[Row]]]) -> None:
    """Label each point: try a few offsets, keep the first whose box stays inside the
    axes and hits the fewest other labels and points (in display pixels)."""
    fig.canvas.draw()
    frame = ax.get_window_extent()
    inside = (frame.x0, frame.y0, frame.x1, frame.y1)
    pts = [ax.transData.transform((x, 100 * y)) for x, y, _ in groups]
    placed = [(px - 5, py - 5, px + 5, py + 5) for px, py in pts]  # the points themselves are obstacles too
    char_w, line_h = 0.6 * 8 * _DPI / 72, 10 * _DPI / 72
    for (x, y, rs), (px, py) in zip(groups, pts):
        text = ", ".join(r.label for r in rs)
        w = char_w * len(text)
        scored = []
        for n, (dx, dy) in enumerate(_LABEL_OFFSETS):
            x0 = px + dx if dx > 0 else px + dx - w
            box = (x0, py + dy - 2, x0 + w, py + dy + line_h)
            outside = box[0] < inside[0] or box[2] > inside[2] or box[1] < inside[1] or box[3] > inside[3]
            hits = sum(_overlaps(box, b) for b in placed)
            scored.append((outside, hits, n, dx, dy, box))  # inside first, then fewest collisions
        _, _, _, dx, dy, box = min(scored)
        placed.append(box)
        on = any(r.on_frontier for r in rs)
        ax.annotate(text, (x, 100 * y), xytext=(dx, dy), textcoords="offset points", fontsize=8,
                    ha="left" if dx > 0 else "right", va="bottom",
                    color=_FRONT if on else "#333333", fontweight="bold" if on else "normal", zorder=5)


def _style_axes(ax, memory_unit: str) -> None:
    unit = "units (one microbatch's activations on one stage)" if memory_unit == "units" else memory_unit
    ax.set_xlabel(f"peak activation memory, max over ranks ({unit})", fontsize=9)
    ax.set_ylabel("bubble rate (%)", fontsize=9)
    ax.grid(color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_legend(fig, top: float) -> None:
    """Frontier and dominated markers, centred below the x label (``top``: figure fraction)."""
    from matplotlib.lines import Line2D

    fig.legend(
        handles=[
            Line2D([], [], marker="o", color=_FRONT, markersize=8, linewidth=1.4, alpha=0.8,
                   label="Pareto frontier (no schedule has both less memory and less bubble)"),
            Line2D([], [], marker="o", color=_OTHER, linestyle="none", markersize=6, label="dominated"),
        ],
        loc="upper center", bbox_to_anchor=(0.52, top), ncol=2, fontsize=8, frameon=False,
    )


def _draw_texts(fig, comparison: Comparison, title: str | None, note_lines: list[str], fig_h: float,
                foot_h: float) -> None:
    """Title, subtitle (costs, how many schedules shown) and the footnote of refusals."""
    c = comparison.costs
    head = title or f"Schedules at p={comparison.p}, m={comparison.m}: peak memory vs bubble rate"
    sub = f"costs per stage F={c.F:g} B={c.B:g} W={c.W:g} comm={c.comm:g}"
    if c.rank_costs or c.group_costs:
        sub += " (per-stage overrides)"
    sub += f"; {sum(r.ok for r in comparison.rows)} of {len(comparison.rows)} schedules shown"
    fig.text(0.09, 1 - 0.25 / fig_h, head, fontsize=12, fontweight="bold", va="top")
    fig.text(0.09, 1 - 0.55 / fig_h, sub, fontsize=9, va="top")
    for i, line in enumerate(note_lines):
        fig.text(0.09, (foot_h - 0.15 - 0.22 * i) / fig_h, line, fontsize=7.5, va="top", color="#555555")


def _short(msg: str, n: int = 110) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n - 1] + "…"
