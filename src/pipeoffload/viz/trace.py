"""Chrome / Perfetto trace of a Timeline (open in https://ui.perfetto.dev or chrome://tracing).

Layout: one process per rank (``pid = rank``, named "rank r"), one thread per stream
(``tid`` 0 compute, 1 d2h, 2 h2d, 3 comm; named after the stream). Every box (see
:func:`pipeoffload.viz.boxes`) is one complete event (``ph = "X"``) with its stage,
chunk, microbatch and memory delta in ``args``; each rank's memory curve is a
counter (``ph = "C"``) named "memory", and the curve without offload, when
``meta["baseline_memory_curves"]`` holds one, a counter named "memory without offload".

Times: ``ts``/``dur`` in microseconds from the timeline's earliest event. A simulated
time unit becomes 1000 µs (one millisecond); with ``meta["time_unit"] == "s"`` times
are seconds and become real microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..timeline import Timeline
from . import LANE_ORDER, Box, boxes, time_scale_us

__all__ = ["to_trace", "write_trace"]

_TID = {name: i for i, name in enumerate(LANE_ORDER)}


def _json_number(x: float) -> float | int:
    """JSON number without float noise (1000.0000001 → 1000)."""
    r = round(float(x), 6)
    return int(r) if r == int(r) else r


def to_trace(tl: Timeline) -> dict:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.

    Guarantees: every compute event of ``tl`` appears exactly once as a ``ph="X"``
    event on tid 0 of its rank, with ``dur`` = its duration × the time scale.
    """
    scale = time_scale_us(tl)
    bxs = boxes(tl)
    origin = min((e.start for e in tl.events), default=0.0)

    def us(t: float) -> float | int:
        return _json_number((t - origin) * scale)

    events = _metadata_events(tl.num_ranks, bxs)
    events += [_box_event(b, us, scale) for b in bxs]
    events += _memory_counters(tl, us)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": tl.name,
            "ranks": tl.num_ranks,
            "microbatches": tl.num_microbatches,
            "chunks": tl.chunks,
            "makespan": tl.makespan,
            "bubble_rate": round(tl.bubble_rate, 6),
            "peak_memory": tl.peak_memory(),
            "memory_unit": tl.memory_unit,
            "time_unit": tl.meta.get("time_unit", "cost units"),
            "us_per_time_unit": scale,
            "time_origin": origin,
        },
    }


def _metadata_events(num_ranks: int, bxs: list[Box]) -> list[dict]:
    """Names and sort order of each rank's process and of the threads (lanes) it uses."""
    events: list[dict] = []
    for r in range(num_ranks):
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        used = {b.lane for b in bxs if b.rank == r} | {"compute"}
        for lane in LANE_ORDER:
            if lane in used:
                events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": _TID[lane], "args": {"name": lane}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": _TID[lane],
                               "args": {"sort_index": _TID[lane]}})
    return events


def _box_event(b: Box, us: Callable[[float], float | int], scale: float) -> dict:
    """One box as a complete event (``ph="X"``); ``us`` maps a time to trace microseconds."""
    name = f"{b.kind}{b.microbatch}" if b.chunk == 0 else f"{b.kind}{b.microbatch}c{b.chunk}"
    return {
        "ph": "X",
        "name": name,
        "cat": b.kind,
        "pid": b.rank,
        "tid": _TID[b.lane],
        "ts": us(b.start),
        "dur": _json_number((b.end - b.start) * scale),
        "args": {"kind": b.kind, "stage": b.stage, "chunk": b.chunk, "microbatch": b.microbatch,
                 "memory_delta": _json_number(b.mem)},
    }


def _memory_counters(tl: Timeline, us: Callable[[float], float | int]) -> list[dict]:
    """Each rank's memory curve, and the one without offload when the timeline has it,
    as counter events (``ph="C"``)."""
    baseline = tl.meta.get("baseline_memory_curves")
    curves = tl.memory_curves()
    events: list[dict] = []
    for r in range(tl.num_ranks):
        for name, curve in (("memory", curves[r]),
                            ("memory without offload", baseline[r] if baseline and r < len(baseline) else None)):
            if not curve:
                continue
            for t, level in curve:
                events.append({"ph": "C", "name": name, "pid": r, "tid": 0, "ts": us(t),
                               "args": {tl.memory_unit: _json_number(level)}})
    return events


def write_trace(tl: Timeline, path: str | Path) -> Path:
    """Write :func:`to_trace` as JSON to ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        json.dump(to_trace(tl), f, separators=(",", ":"))
    return path
