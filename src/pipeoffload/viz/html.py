"""Interactive schedule explorer: one self-contained HTML file (data, script and style inline).

Three page kinds share one explorer (``explorer.js`` and ``explorer.css`` next to
this module, inlined into every page):

- **timeline** (:func:`write_timeline_html`, ``pipeoffload simulate --html``): one
  timeline;
- **compare** (:func:`write_compare_html`, ``pipeoffload compare --html``): every
  schedule of a :class:`~pipeoffload.studies.compare.Comparison`, a schedule selector
  (and a second one to show another schedule below it on the same axes), the table and
  the bubble-vs-memory Pareto plot whose points link to their timelines;
- **measured** (:func:`write_measured_html`, ``timeline.html`` of ``pipeoffload
  train``): the measured timeline above the predicted one on one time axis, each
  measured op with its error against the prediction.

Per rank the page draws the op lanes in the PNG's colours (:data:`~pipeoffload.viz.KIND_COLORS`,
compute, d2h, h2d, comm), the memory curve (and the curve without offload when the
timeline has one), and the rank's peak memory and bubble rate. Hovering an op shows
its kind, stage, chunk, microbatch, rank, start, end and the memory after it; the time
axis zooms and pans; ranks can be hidden. Ops are drawn on a ``<canvas>`` (a few
thousand rectangles per frame, culled to the view), not as DOM nodes.

The page needs no network: no ``src``/``href`` to another file, no font or library, and
a Content-Security-Policy that forbids loading anything. The data is one JSON object
in a ``<script type="application/json">`` element (``</`` escaped); its layout is
:func:`timeline_data`. Pure Python (no torch, no matplotlib).
"""

from __future__ import annotations

import json
import statistics
from bisect import bisect_right
from collections import defaultdict
import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from ..timeline import FREE, Timeline
from . import CHUNK_MIX, COMM_COLOR, KIND_COLORS, KIND_NAMES, LANE_ORDER, Box, boxes, default_title

__all__ = [
    "PAGE_KINDS", "OpError", "timeline_data", "op_errors", "render_page", "timeline_html", "compare_html",
    "measured_html", "write_timeline_html", "write_compare_html", "write_measured_html", "comparison_timelines",
]

#: The page kinds (``<body data-page=...>``).
PAGE_KINDS = ("timeline", "compare", "measured")

#: Significant digits of the numbers in a page's data (times, memory).
_DIGITS = 6


def _num(x: float) -> float | int:
    """``x`` with :data:`_DIGITS` significant digits; an int when it is whole (shorter JSON)."""
    r = float(f"{x:.{_DIGITS}g}")
    return int(r) if r.is_integer() and abs(r) < 2**53 else r


def _display_time(tl: Timeline) -> tuple[float, str, str]:
    """``(factor, unit, axis label)``: measured seconds are shown in milliseconds,
    simulated cost units as they are."""
    unit = tl.meta.get("time_unit")
    if unit == "s":
        return 1000.0, "ms", "time (ms)"
    if unit:
        return 1.0, str(unit), f"time ({unit})"
    return 1.0, "", "time (cost units)"


def _origin(tl: Timeline) -> float:
    """Time 0 of the page: the first compute op's start (so a measured and a predicted
    timeline line up), or the first event's when there is no compute op."""
    if any(True for _ in tl.compute_events()):
        return tl.start
    return min((e.start for e in tl.events), default=0.0)


def _step_curve(points: list[tuple[float, float]], origin: float, factor: float) -> list[list]:
    """``[[times], [levels]]``: one level per instant (the last one), times shifted to the page's origin."""
    last: dict[float, float] = {}
    for t, level in points:
        last[t] = level
    return [[_num((t - origin) * factor) for t in last], [_num(v) for v in last.values()]]


def timeline_data(tl: Timeline, title: str | None = None, key: str | None = None) -> dict:
    """The JSON-ready data of one timeline as the page reads it.

    ``ops`` holds one entry per :func:`~pipeoffload.viz.boxes` box, in that order, as
    parallel arrays: ``rank``, ``lane`` (index into :data:`~pipeoffload.viz.LANE_ORDER`),
    ``kind`` (index into ``kinds``), ``start``, ``end`` (display units from the page's
    origin, see ``time``), ``stage``, ``chunk``, ``mb``, ``mem`` (the box's memory
    change), ``after`` (the rank's memory level when the op ends: its own change and every
    change up to then applied, frees at that instant before allocations) and ``peer``
    (−1 but for sends and receives). ``memory[r]`` is rank r's step curve ``[times,
    levels]``; ``baseline[r]`` the curve without offload, or None.
    """
    bxs = boxes(tl)
    factor, unit, label = _display_time(tl)
    origin = _origin(tl)
    kinds = [k for k in KIND_COLORS if any(b.kind == k for b in bxs)]
    kinds += sorted({b.kind for b in bxs} - set(kinds))
    kind_index = {k: i for i, k in enumerate(kinds)}
    lane_index = {name: i for i, name in enumerate(LANE_ORDER)}
    sweeps = tl.memory_sweeps()
    sweep_keys = [[(t, order) for t, order, _ in sweep] for sweep in sweeps]

    def after(b: Box) -> float:
        i = bisect_right(sweep_keys[b.rank], (b.end, FREE))
        return sweeps[b.rank][i - 1][2] if i else 0.0

    def t(x: float) -> float | int:
        return _num((x - origin) * factor)

    ops = {
        "rank": [b.rank for b in bxs], "lane": [lane_index[b.lane] for b in bxs],
        "kind": [kind_index[b.kind] for b in bxs], "start": [t(b.start) for b in bxs], "end": [t(b.end) for b in bxs],
        "stage": [b.stage for b in bxs], "chunk": [b.chunk for b in bxs], "mb": [b.microbatch for b in bxs],
        "mem": [_num(b.mem) for b in bxs], "after": [_num(after(b)) for b in bxs],
        "peer": [-1 if b.peer is None else b.peer for b in bxs],
    }
    baseline = tl.meta.get("baseline_memory_curves")
    in_op = tl.meta.get("measured_peak_memory") or tl.meta.get("peak_memory_in_op")
    return {
        "key": key or tl.name or "timeline",
        "title": title or default_title(tl),
        "name": tl.name,
        "p": tl.num_ranks,
        "m": tl.num_microbatches,
        "v": tl.chunks,
        "g": (tl.meta.get("params") or {}).get("g"),
        "measured": bool(tl.meta.get("measured")),
        "time": {"factor": factor, "unit": unit, "label": label},
        "memory_unit": tl.memory_unit,
        "kinds": kinds,
        "lanes": [ln for ln in LANE_ORDER if ln == "compute" or any(b.lane == ln for b in bxs)],
        "ops": ops,
        "memory": [_step_curve(c, origin, factor) for c in tl.memory_curves()],
        "baseline": [_step_curve(baseline[r], origin, factor) if r < len(baseline) and baseline[r] else None
                     for r in range(tl.num_ranks)] if baseline else None,
        "peaks": [_num(x) for x in tl.peak_memory()],
        "peaks_in_op": [_num(x) for x in in_op] if in_op else None,
        "baseline_peaks": [_num(max((lv for _, lv in c), default=0.0)) if c else 0 for c in baseline]
        if baseline else None,
        "bubbles": [_num(x) for x in tl.rank_bubble_rates()],
        "bubble": _num(tl.bubble_rate),
        "makespan": _num(tl.makespan * factor),
        "iteration_time": _num(tl.iteration_time * factor),
    }


# --- measured vs predicted ---------------------------------------------------------------


@dataclass(frozen=True)
class OpError:
    """A measured op and the predicted op it is matched with.

    ``duration_error`` = (measured − predicted duration) / predicted duration (None when
    the prediction is instantaneous); ``start_shift`` = measured − predicted start, each
    from its own timeline's first compute op (the timelines' time unit)."""

    measured: int  #: index into ``boxes(measured)``
    predicted: int  #: index into ``boxes(predicted)``
    duration_error: float | None
    start_shift: float


def _box_key(b: Box) -> tuple:
    return (b.rank, b.lane, b.kind, b.stage, b.microbatch)


def op_errors(measured: Timeline, predicted: Timeline) -> list[OpError]:
    """Every measured box matched with the predicted box of the same rank, lane, kind,
    stage and microbatch (the n-th of equal keys with the n-th, in time order); boxes
    without a counterpart are left out."""
    mb, pb = boxes(measured), boxes(predicted)
    mo, po = _origin(measured), _origin(predicted)
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for j, b in enumerate(pb):
        by_key[_box_key(b)].append(j)
    seen: dict[tuple, int] = defaultdict(int)
    out = []
    for i, b in enumerate(mb):
        k = _box_key(b)
        n = seen[k]
        seen[k] += 1
        if n >= len(by_key.get(k, ())):
            continue
        j = by_key[k][n]
        pd = pb[j].duration
        err = (b.duration - pd) / pd if pd > 0 else None
        out.append(OpError(i, j, err, (b.start - mo) - (pb[j].start - po)))
    return out


def _measured_payload(measured: Timeline, predicted: Timeline) -> dict:
    """Both timelines, each op's counterpart (``ops.pair``, −1 for none) and error
    (``ops.error``, measured side; None where undefined), and the per-rank summary."""
    dm = timeline_data(measured, key="measured")
    dp = timeline_data(predicted, key="predicted")
    errs = op_errors(measured, predicted)
    n_m, n_p = len(dm["ops"]["rank"]), len(dp["ops"]["rank"])
    pair_m, pair_p = [-1] * n_m, [-1] * n_p
    error: list[float | None] = [None] * n_m
    for e in errs:
        pair_m[e.measured], pair_p[e.predicted] = e.predicted, e.measured
        error[e.measured] = None if e.duration_error is None else _num(e.duration_error)
    dm["ops"]["pair"], dm["ops"]["error"], dp["ops"]["pair"] = pair_m, error, pair_p
    compute = LANE_ORDER.index("compute")
    per_rank: list[list[float]] = [[] for _ in range(measured.num_ranks)]
    for i, x in enumerate(error):
        if x is not None and dm["ops"]["lane"][i] == compute:
            per_rank[dm["ops"]["rank"][i]].append(abs(x))
    dm["error_median"] = [_num(statistics.median(xs)) if xs else None for xs in per_rank]
    everything = [x for xs in per_rank for x in xs]
    steps = measured.meta.get("step_time")
    return {
        "timelines": [dm, dp],
        "summary": {
            "matched": len(errs), "measured_ops": n_m, "predicted_ops": n_p,
            "unmatched": "; ".join(f"{side} only: {_lane_counts(d['ops']['lane'], pairs)}" for side, d, pairs
                                   in (("measured", dm, pair_m), ("predicted", dp, pair_p)) if -1 in pairs),
            "error_median": _num(statistics.median(everything)) if everything else None,
            "step_time": [_num(s * 1000.0) for s in steps] if steps else None,
        },
    }


def _lane_counts(lanes: list[int], pairs: list[int]) -> str:
    """"224 comm, 2 d2h": the ops without a counterpart, by lane."""
    counts = [sum(1 for ln, j in zip(lanes, pairs) if j < 0 and ln == i) for i in range(len(LANE_ORDER))]
    return ", ".join(f"{n} {name}" for name, n in zip(LANE_ORDER, counts) if n)


# --- comparison ----------------------------------------------------------------------------


def comparison_timelines(cmp: Any, memory_unit: str = "units") -> dict[str, Timeline]:
    """The timeline of every row of ``cmp`` (a :class:`~pipeoffload.studies.compare.Comparison`)
    that has numbers, by label: the one the comparison timed (``Row.timeline``; the offload
    pass's for PipeOffload's rows), never generated or timed again; labelled ``memory_unit``.
    A row without one (built by hand) has no timeline on the page."""
    out: dict[str, Timeline] = {}
    for r in cmp.rows:
        tl = getattr(r, "timeline", None)
        if r.ok and tl is not None:
            out[r.label] = tl if tl.memory_unit == memory_unit else dataclasses.replace(tl, memory_unit=memory_unit)
    return out


def _compare_payload(cmp: Any, timelines: Mapping[str, Timeline]) -> dict:
    c = cmp.costs
    rows = []
    for r in cmp.rows:
        rows.append({
            "label": r.label, "schedule": r.schedule, "ok": r.ok, "error": r.error,
            "bubble": None if r.bubble_rate is None else _num(r.bubble_rate),
            "peak": None if r.peak_memory is None else _num(r.peak_memory),
            "p2p": None if r.p2p_relative is None else _num(r.p2p_relative),
            "frontier": r.on_frontier, "timeline": r.label in timelines,
        })
    subtitle = f"costs per stage F={c.F:g} B={c.B:g} W={c.W:g} comm={c.comm:g}"
    if c.rank_costs or c.group_costs:
        subtitle += " (per-stage overrides)"
    return {
        "rows": rows,
        "subtitle": subtitle + f"; {sum(r.ok for r in cmp.rows)} of {len(cmp.rows)} schedules shown",
        "timelines": [timeline_data(tl, title=label, key=label) for label, tl in timelines.items()],
    }


# --- the page ------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _escape_text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _json_for_script(obj: Any) -> str:
    """JSON safe inside ``<script>``: no ``</script>``, ``<!--`` or line separators can end or confuse it."""
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def render_page(kind: str, title: str, payload: dict) -> str:
    """The HTML of one page: ``payload`` (with ``title``, ``kind`` and the colours added)
    inline as JSON, the explorer's script and style inline."""
    if kind not in PAGE_KINDS:
        raise ValueError(f"page kind must be one of {PAGE_KINDS}, got {kind!r}")
    from .. import __version__

    data = {
        "kind": kind, "title": title, "version": __version__,
        "palette": {"kinds": KIND_COLORS, "comm": COMM_COLOR, "names": KIND_NAMES, "chunk_mix": CHUNK_MIX},
        "lanes": list(LANE_ORDER), **payload,
    }
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<meta name=\"generator\" content=\"pipeoffload {__version__}\">\n"
        f"<title>{_escape_text(title)}</title>\n<style>\n{_asset('explorer.css')}</style>\n</head>\n"
        f"<body data-page=\"{kind}\">\n"
        "<noscript><p>This page draws the schedule with JavaScript; turn it on to explore.</p></noscript>\n"
        "<div id=\"po-app\"></div>\n"
        f"<script type=\"application/json\" id=\"po-data\">{_json_for_script(data)}</script>\n"
        f"<script>\n{_asset('explorer.js')}</script>\n</body>\n</html>\n"
    )


def timeline_html(tl: Timeline, title: str | None = None) -> str:
    """The page of one timeline (see the module doc)."""
    title = title or default_title(tl)
    return render_page("timeline", title, {"timelines": [timeline_data(tl, title=title)]})


def compare_html(cmp: Any, timelines: Mapping[str, Timeline] | None = None, memory_unit: str = "units",
                 title: str | None = None) -> str:
    """The page of a comparison; ``timelines`` by row label (default: :func:`comparison_timelines`)."""
    if timelines is None:
        timelines = comparison_timelines(cmp, memory_unit)
    title = title or f"Schedules at p={cmp.p}, m={cmp.m}: peak memory vs bubble rate"
    payload = _compare_payload(cmp, timelines)
    payload["memory_unit"] = memory_unit
    return render_page("compare", title, payload)


def measured_html(measured: Timeline, predicted: Timeline, title: str | None = None) -> str:
    """The page of a measured run: ``measured`` above ``predicted``, each op with its error."""
    title = title or f"{measured.name or 'run'}: measured vs predicted"
    return render_page("measured", title, _measured_payload(measured, predicted))


def _write(text: str, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_timeline_html(tl: Timeline, path: str | Path, title: str | None = None) -> Path:
    """Write :func:`timeline_html` to ``path`` (parent folders created); returns the path."""
    return _write(timeline_html(tl, title), path)


def write_compare_html(cmp: Any, path: str | Path, timelines: Mapping[str, Timeline] | None = None,
                       memory_unit: str = "units", title: str | None = None) -> Path:
    """Write :func:`compare_html` to ``path`` (parent folders created); returns the path."""
    return _write(compare_html(cmp, timelines, memory_unit, title), path)


def write_measured_html(measured: Timeline, predicted: Timeline, path: str | Path,
                        title: str | None = None) -> Path:
    """Write :func:`measured_html` to ``path`` (parent folders created); returns the path.

    For ``pipeoffload train``'s output folder: ``write_measured_html(measured, predicted,
    out / "timeline.html")`` with the report's measured and predicted timelines."""
    return _write(measured_html(measured, predicted, title), path)
