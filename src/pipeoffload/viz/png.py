"""PNG picture of a Timeline: one lane per rank, with that rank's memory curve under it.

Each rank gets a block: its compute lane (ops as boxes coloured by kind, lighter
for later chunks, labelled with the microbatch when the label fits), a thinner lane
per transfer stream that has events ("d2h" offloads, "h2d" reloads, "comm"), and a
strip with its activation-memory step curve (filled) and, when
``tl.meta["baseline_memory_curves"]`` is given, the curve without offload dashed.
Memory strips share one y scale so ranks compare at a glance; each is annotated
with its peak. The title gives schedule, p, m, v, bubble rate and peak memory.

matplotlib is imported inside :func:`draw_timeline` (Agg canvas, no pyplot, no
global backend switch), so importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

from ..timeline import Timeline
from . import CHUNK_MIX, KIND_COLORS, Box, boxes, default_title, format_memory, lanes_of, time_label
from . import COMM_COLOR as _COMM_COLOR
from . import KIND_NAMES as _KIND_NAMES

__all__ = ["draw_timeline", "KIND_COLORS"]
_MEM_COLOR = "#333f4f"
_DPI = 100
# Layout in inches.
_LANE_H = 0.40  # compute lane
_XFER_H = 0.20  # each transfer lane
_MEM_H = 0.50  # memory strip
_GAP_H = 0.16  # between rank blocks
_LEFT, _RIGHT, _TOP, _BOTTOM = 0.85, 1.05, 0.85, 0.80
_LEGEND_ROW_H = 0.16  # each legend row beyond two
_MIN_W, _MAX_W, _MAX_H = 9.0, 40.0, 32.0


def _rgb_of_hex(c: str) -> tuple[float, float, float]:
    c = c.lstrip("#")
    return tuple(int(c[i:i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def _shade(kind: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """Kind colour, mixed towards white by chunk index (chunk 0 = full colour)."""
    base = _rgb_of_hex(KIND_COLORS.get(kind, _COMM_COLOR))
    if chunks <= 1 or chunk <= 0 or kind not in ("F", "B", "W", "BW"):
        return base
    mix = CHUNK_MIX * min(chunk, chunks - 1) / (chunks - 1)
    return tuple(x + (1 - x) * mix for x in base)  # type: ignore[return-value]


def _text_color(rgb: tuple[float, float, float]) -> str:
    lum = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return "black" if lum > 0.55 else "white"


def draw_timeline(tl: Timeline, path: str | Path, title: str | None = None) -> Path:
    """Draw ``tl`` to a PNG at ``path`` (parent folders created); returns the path.

    ``title`` replaces the first title line (schedule, p, m, v); the metrics line
    (bubble rate, makespan, peak memory) is always drawn. Figure size grows with the
    number of ops per rank and with the rank count, within 9–40 × ≤32 inches at
    100 dpi; labels that do not fit their box are left out.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bxs = boxes(tl)
    xfer_lanes = [ln for ln in lanes_of(bxs) if ln != "compute"]
    lay = _layout(tl.num_ranks, bxs, xfer_lanes)
    mem = _memory_view(tl)
    legend = _legend_entries(tl, bxs, mem)
    ncol = max(1, min(len(legend), int(lay.fig_w // 2.0)))
    extra = _LEGEND_ROW_H * max(0, -(-len(legend) // ncol) - 2)  # legend rows beyond the two _BOTTOM holds
    lay = replace(lay, fig_h=lay.fig_h + extra)

    fig = Figure(figsize=(lay.fig_w, lay.fig_h), dpi=_DPI)
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(
        len(lay.ratios), 1, height_ratios=lay.ratios, hspace=0, left=_LEFT / lay.fig_w,
        right=1 - _RIGHT / lay.fig_w, top=1 - _TOP / lay.fig_h, bottom=(_BOTTOM + extra) / lay.fig_h,
    )
    lane_y, y_max = _lane_rows(xfer_lanes)
    first_ax = None
    mem_axes = []
    for r in range(tl.num_ranks):
        ax = fig.add_subplot(gs[r * 3], sharex=first_ax)
        first_ax = first_ax or ax
        _draw_lanes(ax, [b for b in bxs if b.rank == r], lane_y, tl.chunks, lay.t0, lay.px_per_t, lay.font,
                    lay.char_px)
        _style_rank_axes(ax, r, lane_y, y_max, xfer_lanes)
        mx = fig.add_subplot(gs[r * 3 + 1], sharex=first_ax)
        mem_axes.append(mx)
        _draw_memory_strip(mx, r, mem, lay, last=r == tl.num_ranks - 1)

    first_ax.set_xlim(0, lay.span)
    mem_axes[-1].set_xlabel(time_label(tl) + (", 0 = first op" if abs(lay.t0) > 1e-9 else ""), fontsize=8)
    _draw_title(fig, tl, title, mem, lay)
    _draw_legend(fig, legend, ncol, lay)
    fig.savefig(path, format="png", dpi=_DPI, facecolor="white")
    return path


@dataclass(frozen=True)
class _Layout:
    """Figure geometry (inches), time span and label font of one drawing."""

    fig_w: float
    fig_h: float
    ratios: list[float]  #: grid rows per rank: lanes, memory strip, then a gap (not after the last)
    t0: float
    t1: float
    span: float
    px_per_t: float  #: pixels per time unit
    font: int  #: box label size, points
    char_px: float  #: width of one label character at ``font``, pixels


def _layout(num_ranks: int, bxs: list[Box], xfer_lanes: list[str]) -> _Layout:
    """~18 px per typical compute op, within the width limits; rank blocks scaled
    down together when the figure would be taller than the limit."""
    times = [b.start for b in bxs] + [b.end for b in bxs]
    t0 = min(times, default=0.0)
    t1 = max(times, default=1.0)
    span = (t1 - t0) or 1.0
    comp = [b.duration for b in bxs if b.lane == "compute" and b.duration > 0]
    typical = median(comp) if comp else span
    axes_w = min(_MAX_W - _LEFT - _RIGHT, max(_MIN_W - _LEFT - _RIGHT, span / typical * 18 / _DPI))
    fig_w = axes_w + _LEFT + _RIGHT
    block = [_LANE_H + _XFER_H * len(xfer_lanes), _MEM_H]
    per_rank = sum(block) + _GAP_H
    scale = min(1.0, (_MAX_H - _TOP - _BOTTOM) / (num_ranks * per_rank))
    fig_h = num_ranks * per_rank * scale + _TOP + _BOTTOM
    ratios: list[float] = []
    for r in range(num_ranks):
        ratios += block + ([_GAP_H] if r < num_ranks - 1 else [])
    px_per_t = axes_w * _DPI / span
    font = 7 if typical * px_per_t >= 16 else 6 if typical * px_per_t >= 11 else 5
    return _Layout(fig_w, fig_h, ratios, t0, t1, span, px_per_t, font, 0.62 * font * _DPI / 72)


@dataclass(frozen=True)
class _MemoryView:
    """Per rank: the memory curve and peak, and the no-offload curve and peak (empty /
    0 without ``meta["baseline_memory_curves"]``); the shared y limit of the strips."""

    unit: str
    curves: list
    peaks: list[float]
    base_curves: list
    base_peaks: list[float]
    top: float


def _memory_view(tl: Timeline) -> _MemoryView:
    baseline = tl.meta.get("baseline_memory_curves")
    base_curves = [baseline[r] if baseline and r < len(baseline) else [] for r in range(tl.num_ranks)]
    peaks = tl.peak_memory()
    base_peaks = [max((lv for _, lv in c), default=0.0) for c in base_curves]
    top = max(peaks + base_peaks + [1e-12]) * 1.12
    return _MemoryView(tl.memory_unit, tl.memory_curves(), peaks, base_curves, base_peaks, top)


def _lane_rows(xfer_lanes: list[str]) -> tuple[dict[str, tuple[float, float]], float]:
    """Each lane's vertical extent in a rank's lane axes (compute on top, then the
    transfer lanes), and the axes' lower limit."""
    lane_y: dict[str, tuple[float, float]] = {"compute": (0.0, 1.0)}
    y = 1.0
    for ln in xfer_lanes:
        lane_y[ln] = (y + 0.08, y + 0.5)
        y += 0.5
    return lane_y, y + 0.04


def _style_rank_axes(ax, rank: int, lane_y: dict, y_max: float, xfer_lanes: list[str]) -> None:
    """Lane labels (the rank in bold), light vertical grid, no frame but the left spine."""
    ax.set_ylim(y_max, -0.04)
    ax.set_yticks([(a + b) / 2 for a, b in lane_y.values()])
    ax.set_yticklabels([f"rank {rank}"] + xfer_lanes)
    for lbl, ln in zip(ax.get_yticklabels(), lane_y):
        lbl.set_fontsize(8 if ln == "compute" else 6)
        if ln == "compute":
            lbl.set_fontweight("bold")
    ax.tick_params(axis="y", length=0, pad=3)
    ax.tick_params(axis="x", labelbottom=False, length=0)
    ax.grid(axis="x", color="#d8d8d8", linewidth=0.5)
    ax.set_axisbelow(True)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)


def _draw_memory_strip(mx, rank: int, mem: _MemoryView, lay: _Layout, last: bool) -> None:
    """One rank's memory strip: curves, peak tick, annotation; time labels on the last."""
    _draw_memory(mx, mem.curves[rank], mem.base_curves[rank], lay.t0, lay.t1)
    mx.set_ylim(0, mem.top)
    peak = mem.peaks[rank]
    # Tick the peak; keep the 0 tick only where the two labels do not collide.
    ticks = [peak] if peak > 0 else [0.0]
    if 0 < peak and peak >= 0.4 * mem.top:
        ticks.insert(0, 0.0)
    mx.set_yticks(ticks)
    mx.set_yticklabels([format_memory(t, mem.unit) for t in mx.get_yticks()], fontsize=6)
    mx.tick_params(axis="y", length=2, pad=1)
    mx.tick_params(axis="x", labelbottom=last, labelsize=8, length=2 if last else 0)
    mx.grid(axis="x", color="#d8d8d8", linewidth=0.5)
    mx.set_axisbelow(True)
    for side in ("top", "right"):
        mx.spines[side].set_visible(False)
    note = f"peak {format_memory(peak, mem.unit)}"
    if mem.base_curves[rank]:
        note += f"\nno offload {format_memory(mem.base_peaks[rank], mem.unit)}"
    mx.text(1.004, 0.5, note, transform=mx.transAxes, fontsize=6.5, va="center", ha="left", color=_MEM_COLOR)


def _draw_title(fig, tl: Timeline, title: str | None, mem: _MemoryView, lay: _Layout) -> None:
    """The title line and the metrics line (per-rank peaks when they fit)."""
    unit = mem.unit
    head = title or default_title(tl)
    metrics = (f"bubble rate {100 * tl.bubble_rate:.1f}%    makespan {tl.makespan:.6g}    "
               f"peak memory ({unit}) max {format_memory(max(mem.peaks, default=0.0), unit)}")
    if any(mem.base_curves):
        metrics += f" (without offload {format_memory(max(mem.base_peaks), unit)})"
    per = ", ".join(format_memory(x, unit) for x in mem.peaks)
    if len(metrics) + len(per) + 12 < lay.fig_w * 13:
        metrics += f"    per rank: {per}"
    fig.text(_LEFT / lay.fig_w, 1 - 0.22 / lay.fig_h, head, fontsize=12, fontweight="bold", va="top", ha="left")
    fig.text(_LEFT / lay.fig_w, 1 - 0.50 / lay.fig_h, metrics, fontsize=9, va="top", ha="left")


def _legend_entries(tl: Timeline, bxs: list[Box], mem: _MemoryView) -> list[tuple[str, tuple | str, str]]:
    """``(label, colour, style)`` per legend entry: each box kind present (per chunk when
    2–4 chunks; style "box"), comm, and the memory curves (styles "line", "dashed")."""
    out: list[tuple[str, tuple | str, str]] = []
    for k in (k for k in KIND_COLORS if any(b.kind == k for b in bxs)):
        chunks_here = sorted({b.chunk for b in bxs if b.kind == k}) if k in ("F", "B", "W", "BW") else [0]
        show = chunks_here if 1 < len(chunks_here) <= 4 else [0]
        for c in show:
            out.append((_KIND_NAMES[k] + (f", chunk {c}" if len(show) > 1 else ""), _shade(k, c, tl.chunks), "box"))
    if any(b.lane == "comm" for b in bxs):
        out.append(("send / recv", _COMM_COLOR, "box"))
    out.append((f"activation memory ({mem.unit})", _MEM_COLOR, "line"))
    if any(mem.base_curves):
        out.append(("memory without offload", "#b03030", "dashed"))
    return out


def _draw_legend(fig, entries: list[tuple[str, tuple | str, str]], ncol: int, lay: _Layout) -> None:
    """The legend of :func:`_legend_entries`, ``ncol`` columns, centred at the bottom."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colour, edgecolor="none", label=label) if style == "box" else
               Line2D([], [], color=colour, linewidth=1.2 if style == "line" else 1.0,
                      linestyle="-" if style == "line" else "--", label=label)
               for label, colour, style in entries]
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=7.5, frameon=False,
               bbox_to_anchor=(0.5, 0.02 / lay.fig_h), handlelength=1.6, columnspacing=1.4)


def _draw_lanes(ax, mine: list[Box], lane_y: dict, chunks: int, t0: float,
                px_per_t: float, font: int, char_px: float) -> None:
    from matplotlib.collections import PolyCollection

    for ln, (ya, yb) in lane_y.items():
        lb = [b for b in mine if b.lane == ln]
        if not lb:
            continue
        verts, colors = [], []
        for b in lb:
            xa, xb = b.start - t0, b.end - t0
            verts.append([(xa, ya), (xb, ya), (xb, yb), (xa, yb)])
            colors.append(_shade(b.kind, b.chunk, chunks))
        ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="white",
                                         linewidths=0.4 if ln == "compute" else 0.25))
        fs = font if ln == "compute" else max(4.5, font - 1.5)
        cpx = char_px * fs / font
        for b, col in zip(lb, colors):
            if b.lane == "comm":
                continue
            label = str(b.microbatch)
            if b.duration * px_per_t < len(label) * cpx + 3:
                continue
            ax.text((b.start + b.end) / 2 - t0, (ya + yb) / 2, label, ha="center", va="center",
                    fontsize=fs, color=_text_color(col), clip_on=True)


def _draw_memory(ax, curve: list[tuple[float, float]], base: list, t0: float, t1: float) -> None:
    def steps(c):
        # One level per instant: a free and an allocation at the same time are one
        # step, not a zero-width dip.
        last: dict[float, float] = {}
        for t, lv in c:
            last[t] = lv
        xs = [t - t0 for t in last]
        ys = list(last.values())
        if xs and xs[-1] < t1 - t0:
            xs.append(t1 - t0)
            ys.append(ys[-1])
        return xs, ys

    xs, ys = steps(curve)
    if xs:
        ax.fill_between(xs, ys, step="post", color=_MEM_COLOR, alpha=0.18, linewidth=0)
        ax.step(xs, ys, where="post", color=_MEM_COLOR, linewidth=1.0)
    if base:
        bx, by = steps(base)
        ax.step(bx, by, where="post", color="#b03030", linewidth=0.9, linestyle="--")
