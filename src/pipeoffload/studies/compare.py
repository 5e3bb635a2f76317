"""Compare every registered schedule at one (p, m, costs, memory): bubble, peak, P2P.

One :class:`Row` per schedule variant of the registry (:data:`pipeoffload.schedules.SCHEDULES`):
group-interleaved appears with ``g = ⌈p/2⌉`` and ``g = p``, interleaved 1F1B with
``v = 2``, zb-auto with memory limits ``p`` and ``2p`` units (ZB-1p and ZB-2p), every
other schedule with its defaults. A schedule that refuses the parameters, or whose
generator cannot be imported yet, becomes a row with the reason instead of numbers,
so the comparison works whatever the registry currently holds.

Metrics per row: bubble rate (per-rank span, :attr:`Timeline.bubble_rate`, plus the
global-makespan variant), peak activation memory (max over ranks and per rank, in the
units of ``memory``) and P2P volume: each cross-rank F→F or B→B dependency is one
message of one microbatch's boundary activation or gradient, relative to 1F1B's
``2(p−1)m``. The Pareto frontier is over (peak memory, bubble rate), both minimised.
Pure Python (no torch, no matplotlib; drawing is :mod:`pipeoffload.viz.pareto`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..costs import Costs, MemoryDeltas
from ..errors import PipeoffloadError, require
from ..ir import OpKind, Schedule
from ..passes.timing import simulate
from ..timeline import Timeline
from .defaults import COMPARE_OFFLOAD_TIME, STUDY_OFFLOAD, study_offload
from ..schedules import SCHEDULES, ScheduleSpec, build, info

__all__ = ["Candidate", "Row", "Comparison", "candidates", "compare", "p2p_messages", "pareto_frontier"]

#: Relative tolerance when two metric values count as equal (float noise of 1/v shares).
_EPS = 1e-9


@dataclass(frozen=True)
class Candidate:
    """One schedule variant to compare: registry ``name`` plus ScheduleSpec keyword args."""

    label: str
    name: str
    params: dict = field(default_factory=dict)
    offload: int = 0  #: chunks offloaded per rank by the offload pass (0 = none)


@dataclass
class Row:
    """The comparison's result for one candidate; ``error`` set means no numbers."""

    label: str
    schedule: str
    params: dict
    bubble_rate: float | None = None
    bubble_rate_makespan: float | None = None
    makespan: float | None = None
    peak_memory: float | None = None
    peak_memory_per_rank: list[float] | None = None
    p2p_messages: int | None = None
    p2p_relative: float | None = None
    error: str | None = None
    on_frontier: bool = False
    #: The timeline these numbers were read from (the offload pass's for offload rows): what
    #: pictures draw (:func:`pipeoffload.viz.html.comparison_timelines`); not in :meth:`to_json`.
    timeline: Timeline | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        return {
            "label": self.label,
            "schedule": self.schedule,
            "params": dict(self.params),
            "ok": self.ok,
            "error": self.error,
            "bubble_rate": self.bubble_rate,
            "bubble_rate_makespan": self.bubble_rate_makespan,
            "makespan": self.makespan,
            "peak_memory": self.peak_memory,
            "peak_memory_per_rank": self.peak_memory_per_rank,
            "p2p_messages": self.p2p_messages,
            "p2p_relative": self.p2p_relative,
            "pareto": self.on_frontier,
        }


@dataclass
class Comparison:
    """All rows of one comparison, in registry order."""

    p: int
    m: int
    costs: Costs
    memory: MemoryDeltas
    rows: list[Row]

    @property
    def p2p_baseline(self) -> int:
        """1F1B's message count, ``2(p−1)m``."""
        return 2 * (self.p - 1) * self.m

    @property
    def frontier(self) -> list[Row]:
        """Rows on the Pareto frontier, by increasing peak memory."""
        return sorted((r for r in self.rows if r.on_frontier), key=lambda r: (r.peak_memory, r.bubble_rate))

    def to_json(self) -> dict:
        c, mem = self.costs, self.memory
        return {
            "p": self.p,
            "m": self.m,
            "costs": {"F": c.F, "B": c.B, "W": c.W, "comm": c.comm,
                      "stage_costs": [list(t) for t in c.rank_costs] if c.rank_costs else None,
                      "group_costs": [list(t) for t in c.group_costs] if c.group_costs else None},
            "memory": {"F": mem.F, "B": mem.B, "W": mem.W},
            "p2p_baseline": self.p2p_baseline,
            "rows": [r.to_json() for r in self.rows],
            "frontier": [r.label for r in self.frontier],
        }


def candidates(p: int, memory: MemoryDeltas | None = None, offload: bool = True) -> list[Candidate]:
    """The variants of every registered schedule compared at ``p`` ranks (see module doc), then,
    with ``offload`` and ``p ≥ 2``, PipeOffload's variants on group-interleaved with
    ``g = ⌈p/2⌉`` (docs/algorithms.md#53-selective-offload-po-half-and-po-full): PO-half (v = 2,
    chunk 0 offloaded), PO-full (v = 2, both) and selective offload of C = 1..3 of v = 4 chunks."""
    memory = memory or MemoryDeltas()
    out: list[Candidate] = []
    for name in SCHEDULES:
        if name == "group-interleaved":
            for g in sorted({(p + 1) // 2, p}):
                out.append(Candidate(f"{name} v=2 g={g}", name, {"v": 2, "g": g}))
        elif name == "interleaved-1f1b":
            out.append(Candidate(f"{name} v=2", name, {"v": 2}))
        elif name == "zb-auto":
            # ZB-1p and ZB-2p: limits of p and 2p whole-stage forwards.
            for k, tag in ((1, "p"), (2, "2p")):
                out.append(Candidate(f"{name} limit={tag}", name, {"mem_limit": k * p * memory.F}))
        else:
            out.append(Candidate(name, name, {}))
    if offload and p >= 2 and "group-interleaved" in SCHEDULES:
        g = (p + 1) // 2
        out.append(Candidate("PO-half", "group-interleaved", {"v": 2, "g": g}, offload=1))
        out.append(Candidate("PO-full", "group-interleaved", {"v": 2, "g": g}, offload=2))
        out += [Candidate(f"PO selective v=4 C={c}", "group-interleaved", {"v": 4, "g": g}, offload=c)
                for c in (1, 2, 3)]
    return out


def p2p_messages(schedule: Schedule) -> int:
    """Cross-rank activation and gradient transfers of ``schedule``.

    One per F whose previous layer group is on another rank (its input activation)
    and one per B or BW whose next layer group is on another rank (its output-gradient
    input). 1F1B sends ``2(p−1)m``; a V placement ``4(p−1)m`` (its turn is local).
    """
    pl = schedule.placement
    S = pl.num_stages
    n = 0
    for o in schedule.ops():
        if o.kind is OpKind.F and o.stage > 0 and pl.rank_of(o.stage - 1) != o.rank:
            n += 1
        elif o.kind.is_backward and o.stage < S - 1 and pl.rank_of(o.stage + 1) != o.rank:
            n += 1
    return n


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (memory, bubble) point, whether no other point dominates it.

    ``q`` dominates ``x`` when ``q`` is no worse in both coordinates and better in one
    (values within a relative 1e-9 count as equal). Identical points are all on the
    frontier when any of them is.
    """
    def le(a: float, b: float) -> bool:
        return a <= b + _EPS * max(1.0, abs(a), abs(b))

    def lt(a: float, b: float) -> bool:
        return not le(b, a)

    out = []
    for i, x in enumerate(points):
        dominated = any(
            le(q[0], x[0]) and le(q[1], x[1]) and (lt(q[0], x[0]) or lt(q[1], x[1]))
            for j, q in enumerate(points) if j != i
        )
        out.append(not dominated)
    return out


def compare(
    p: int,
    m: int,
    costs: Costs | None = None,
    memory: MemoryDeltas | None = None,
    which: Sequence[Candidate] | None = None,
    offload_time: float = COMPARE_OFFLOAD_TIME,
) -> Comparison:
    """Generate, validate and time every candidate (default :func:`candidates`); offload rows go
    through the offload pass (skip mode, warm-up postponed, two ranks per host link) with a
    one-way transfer of ``offload_time`` × the chunk's F+B+W (0.5: k = 1, the largest k the
    paper says hides fully).

    Guarantees: one row per candidate, in order; a row has numbers exactly when its
    schedule generated, validated and timed; otherwise ``error`` says why (the
    schedule's own message for refused parameters, "not available" when its module
    or function cannot be imported). ``on_frontier`` marks the Pareto-optimal rows.
    """
    require(isinstance(p, int) and p >= 1, "p", f"must be an integer >= 1, got {p!r}")
    require(isinstance(m, int) and m >= 1, "m", f"must be an integer >= 1, got {m!r}")
    costs = costs or Costs()
    memory = memory or MemoryDeltas()
    require(isinstance(offload_time, (int, float)) and offload_time >= 0, "offload_time",
            f"must be a number >= 0, got {offload_time!r}")
    rows = [_row(c, p, m, costs, memory, offload_time)
            for c in (which if which is not None else candidates(p, memory))]
    ok = [r for r in rows if r.ok]
    for r, front in zip(ok, pareto_frontier([(r.peak_memory, r.bubble_rate) for r in ok])):
        r.on_frontier = front
    return Comparison(p, m, costs, memory, rows)


def _row(c: Candidate, p: int, m: int, costs: Costs, memory: MemoryDeltas,
         offload_time: float = COMPARE_OFFLOAD_TIME) -> Row:
    row = Row(c.label, c.name, dict(c.params) | ({"offload_chunks": c.offload} if c.offload else {}))
    try:
        info(c.name).generator()  # import only: is the generator written yet?
    except PipeoffloadError as e:
        row.error = str(e)
        return row
    except (ImportError, AttributeError) as e:
        row.error = f"not available: {type(e).__name__}: {e}"
        return row
    try:
        spec = ScheduleSpec(c.name, p, m, costs=costs, memory=memory, **c.params)
        sched = build(spec)
        if c.offload:
            from ..passes.lower import lower

            opts = study_offload(STUDY_OFFLOAD, offload_chunks=c.offload, offload_time=offload_time)
            lowered = lower(sched, costs, memory, offload=opts, validated=True)
            tl, off_peaks = lowered.timeline, list(lowered.offload.peak)  # type: ignore[union-attr]
        else:
            tl, off_peaks = simulate(sched, costs, memory), None
    except PipeoffloadError as e:
        row.error = str(e)
        return row
    except NotImplementedError as e:
        row.error = f"not available: {e or 'not implemented'}"
        return row
    peaks = off_peaks if off_peaks is not None else tl.peak_memory()
    row.bubble_rate = _clean(tl.bubble_rate)
    row.bubble_rate_makespan = _clean(tl.bubble_rate_makespan)
    row.makespan = _clean(tl.makespan)
    row.timeline = tl
    row.peak_memory = max(peaks)
    row.peak_memory_per_rank = peaks
    row.p2p_messages = p2p_messages(sched)
    base = 2 * (p - 1) * m
    row.p2p_relative = row.p2p_messages / base if base else None
    row.params = {**row.params, **{k: v for k, v in sched.params.items() if k in ("v", "g", "mem_limit")}}
    if c.offload:
        row.params["offload_time"] = offload_time
    return row


def _clean(x: float) -> float:
    """Round away float noise of 1/v shares (e.g. 2.9999999999 → 3.0)."""
    r = round(x, 9)
    return 0.0 if r == 0 else r
