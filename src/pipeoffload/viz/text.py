"""A compact text grid of a Timeline, for terminals.

One row per rank (plus a "d2h" / "h2d" row under a rank that has transfers), time
running left to right. Letters: ``F`` forward, ``B`` input-gradient backward, ``W``
weight-gradient backward, ``X`` fused backward (BW); upper case for chunk 0, lower
case for a later chunk (``f``, ``b``, ``w``, ``x``); ``O`` offload and ``R`` reload on
the transfer rows; ``.`` idle.

Exact mode (chosen whenever it fits in ``width``): all start/end times are multiples
of one quantum (e.g. 1/2 for unit costs with v = 2). Each quantum gets a cell of
``w`` columns; an op's first cell reads kind + microbatch (``F3``, ``b12``), its
later cells ``-``. When ``w`` = 2 columns are all that fit and m > 10, the digit is
the microbatch mod 10 (the legend says so). Otherwise the grid is quantised: one
column per ``makespan / columns`` of time, showing the op that covers most of it.
"""

from __future__ import annotations

import math
import textwrap
from fractions import Fraction

from ..timeline import Timeline
from . import Box, boxes, format_memory

__all__ = ["render_grid", "LETTERS"]

#: Grid letter of each box kind (chunk 0; later chunks are lower case).
LETTERS = {"F": "F", "B": "B", "W": "W", "BW": "X", "OFFLOAD": "O", "RELOAD": "R", "STASH_OFFLOAD": "o",
           "STASH_RELOAD": "r"}
_IDLE = "."


def _letter(b: Box) -> str:
    ch = LETTERS.get(b.kind, "C")  # C: a send / receive
    return ch.lower() if b.chunk > 0 and b.kind in ("F", "B", "W", "BW") else ch


def _quantum(times: list[float], max_den: int = 64) -> Fraction | None:
    """The largest q with every time an integer multiple of q, or None if times are
    not (near-)rational with a small denominator (e.g. measured seconds)."""
    fracs = []
    for t in times:
        f = Fraction(t).limit_denominator(max_den)
        if abs(float(f) - t) > 1e-9 * max(1.0, abs(t)):
            return None
        fracs.append(f)
    den = 1
    for f in fracs:
        den = den * f.denominator // math.gcd(den, f.denominator)
    num = 0
    for f in fracs:
        num = math.gcd(num, f.numerator * (den // f.denominator))
    if num == 0:
        return None
    return Fraction(num, den)


def render_grid(tl: Timeline, width: int = 120) -> str:
    """The grid as text: a legend line, one row per rank (and transfer rows), summary lines.

    Guarantees: exactly one compute row per rank, labelled ``r<rank>``, in rank order;
    every grid row is at most ``width`` characters when ``width`` leaves room for the
    label and one column of time; the summary gives bubble rate and peak memory.
    """
    bxs = [b for b in boxes(tl) if b.lane in ("compute", "d2h", "h2d")]
    rows = _grid_rows(tl.num_ranks, bxs)
    label_w = max(len(name) for name, _, _ in rows) + 1
    avail = max(1, width - label_w - 1)
    t0 = min((b.start for b in bxs), default=0.0)
    span = max((b.end for b in bxs), default=0.0) - t0
    tunit = tl.meta.get("time_unit") or "time units"
    mb_digits = len(str(max(0, tl.num_microbatches - 1)))

    exact = _exact_body(rows, bxs, t0, span, avail, mb_digits)
    if exact is None:
        cols = avail
        body = [_quantised_row(row, t0, span / cols if span > 0 else 1.0, cols) for _, _, row in rows]
        mode = f"quantised, 1 column = {span / avail:.3g} {tunit}" if span > 0 else "empty"
        mod10 = False
    else:
        body, quantum, mod10 = exact
        mode = f"exact, 1 cell = {quantum:.3g} {tunit}"

    lines = [_legend_line(tl, bxs, mod10, mode)]
    lines += [f"{name:<{label_w}}|{text}" for (name, _, _), text in zip(rows, body)]
    return "\n".join(lines + _summary_lines(tl, width))


def _grid_rows(num_ranks: int, bxs: list[Box]) -> list[tuple[str, str, list[Box]]]:
    """``(label, lane, boxes)`` per row: each rank's compute row, then its transfer
    rows that have boxes."""
    rows: list[tuple[str, str, list[Box]]] = []
    for r in range(num_ranks):
        mine = [b for b in bxs if b.rank == r]
        rows.append((f"r{r}", "compute", [b for b in mine if b.lane == "compute"]))
        for lane in ("d2h", "h2d"):
            lane_boxes = [b for b in mine if b.lane == lane]
            if lane_boxes:
                rows.append((f"r{r} {lane}", lane, lane_boxes))
    return rows


def _exact_body(rows: list[tuple[str, str, list[Box]]], bxs: list[Box], t0: float, span: float, avail: int,
                mb_digits: int) -> tuple[list[str], float, bool] | None:
    """The rows in exact mode ``(rows, quantum, digit is microbatch mod 10)``, with the
    widest cell that fits ``avail`` columns; None when the times share no small
    quantum or no cell width fits."""
    # The quantum comes from compute ops only: transfers (arbitrary durations) are
    # drawn on the same columns, quantised, so they do not spoil an exact compute grid.
    comp = [b for b in bxs if b.lane == "compute"]
    q = _quantum([b.start - t0 for b in comp] + [b.end - t0 for b in comp] + [span]) if comp and span > 0 else None
    if q is None:
        return None
    cells = int(round(span / float(q)))
    for w in (1 + mb_digits, 2, 1):
        if cells * w <= avail:
            mod10 = w == 2 and mb_digits > 1
            body = [
                _exact_row(row, t0, float(q), cells, w, mod10) if lane == "compute"
                else _quantised_row(row, t0, float(q) / w, cells * w)
                for _, lane, row in rows
            ]
            return body, float(q), mod10
    return None


def _legend_line(tl: Timeline, bxs: list[Box], mod10: bool, mode: str) -> str:
    kinds = sorted({b.kind for b in bxs}, key=lambda k: list(LETTERS).index(k) if k in LETTERS else 99)
    legend = "".join(f"{LETTERS.get(k, 'C')}={k}, " for k in kinds)
    extra = "; lower case = chunk >= 1" if tl.chunks > 1 else ""
    extra += "; digit = microbatch mod 10" if mod10 else ""
    return f"legend: {legend}.=idle{extra} ({mode})"


def _summary_lines(tl: Timeline, width: int) -> list[str]:
    """Schedule, makespan, bubble and highest peak; then every rank's peak, wrapped."""
    peaks = tl.peak_memory()
    lines = [
        f"{tl.name}: p={tl.num_ranks} m={tl.num_microbatches} v={tl.chunks}  makespan {tl.makespan:.6g}  "
        f"bubble {100 * tl.bubble_rate:.2f}%  peak memory ({tl.memory_unit}) max "
        f"{format_memory(max(peaks, default=0.0), tl.memory_unit)}"
    ]
    per_rank = ", ".join(format_memory(x, tl.memory_unit) for x in peaks)
    lines.extend(textwrap.wrap(f"peak per rank: {per_rank}", width=max(20, width), subsequent_indent="  "))
    return lines


def _exact_row(row: list[Box], t0: float, q: float, cells: int, w: int, mod10: bool) -> str:
    out = [_IDLE * w] * cells
    for b in row:
        i = int(round((b.start - t0) / q))
        n = max(1, int(round((b.end - b.start) / q)))
        mb = b.microbatch % 10 if mod10 else b.microbatch
        lab = f"{_letter(b)}{mb}"[:w] if w > 1 else _letter(b)
        out[i] = lab.ljust(w)
        for k in range(i + 1, min(cells, i + n)):
            out[k] = "-" * w
    return "".join(out)


def _quantised_row(row: list[Box], t0: float, dt: float, cols: int) -> str:
    cover = [0.0] * cols
    out = [_IDLE] * cols
    for b in row:
        c0 = max(0, int((b.start - t0) / dt))
        c1 = min(cols - 1, int(math.ceil((b.end - t0) / dt)) - 1)
        for c in range(c0, c1 + 1):
            lo, hi = t0 + c * dt, t0 + (c + 1) * dt
            ov = min(hi, b.end) - max(lo, b.start)
            if ov > cover[c]:
                cover[c] = ov
                out[c] = _letter(b)
    return "".join(out)
