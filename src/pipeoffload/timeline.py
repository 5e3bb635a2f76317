"""Timeline: when every op ran and what it did to memory. Simulated or measured.

The same type describes a simulated run (timing pass) and a measured one (runtime),
so reports, pictures and predicted-vs-measured comparisons share one code path.

Metrics. ``busy`` is the busiest rank's total compute time. The **bubble rate** is
the ZB paper's: ``1 − busy / iteration_time`` where ``iteration_time`` is the largest
per-rank *span* (a rank's first compute op's start to its last one's end; "cost is
the largest execution time of all stages"). That is the iteration time when the
optimizer step is not synchronised across stages (docs/algorithms.md#32-iteration-time-and-the-optimizer-step), and it is the
metric behind the published tables (docs/algorithms.md#8-published-figures-the-tests-check) (ZB-2p and ZB-V reach 0 only under
it: the last stage cannot start before (p−1)·T_F). ``makespan`` runs from the first
compute op's start to the last one's end over all ranks; ``bubble_rate_makespan``
= 1 − busy / makespan is reported too. The two agree for 1F1B, ZB-H1/H2, interleaved
and group-interleaved schedules, whose rank 0 both starts first and ends last.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter, le, lt, sub
from typing import Callable, Collection, Iterable, Iterator, Sequence

from .ir import ALL_KINDS, Op, OpKind, RankOps

#: Streams (lanes) an op may run on. Compute ops run on "compute"; transfers on
#: "d2h" / "h2d" (host link); sends and receives on "comm".
STREAMS = ("compute", "d2h", "h2d", "comm")

#: Order of memory changes at the same time: frees first, so a W that ends when an F
#: starts does not count both.
FREE, ALLOC = 0, 1
#: One memory change ``(time, FREE|ALLOC, amount)``; after :func:`memory_sweep` the
#: amount is the level after the change.
Change = tuple[float, int, float]


def memory_sweep(changes: Iterable[Change]) -> list[Change]:
    """The one memory sweep: ``changes`` (time, FREE|ALLOC, delta) in time order, frees
    before allocations at the same time, each with the running level after it. Every
    memory curve and peak (simulated, measured, host) is computed with it."""
    level = 0.0
    out = []
    append = out.append
    for t, order, delta in sorted(changes, key=_TIME_ORDER):
        level += delta
        append((t, order, level))
    return out


_TIME_ORDER = itemgetter(0, 1)  #: a change's sort key (time, FREE|ALLOC), in C


@dataclass(frozen=True, slots=True)
class TimedOp:
    """One op placed in time. ``mem`` is its activation-memory change on its rank:
    applied at ``start`` when positive (allocated as it runs) and at ``end`` when
    negative (freed when done)."""

    op: Op
    start: float
    end: float
    stream: str = "compute"
    mem: float = 0.0

    @property
    def rank(self) -> int:
        return self.op.rank

    @property
    def duration(self) -> float:
        return self.end - self.start


class EventColumns:
    """A timeline's compute events held compactly: per rank, its ops (in the rank's
    order), their starts, ends and memory deltas as ``array('d')``, and the rank of
    each event in event order. :class:`TimedOp` objects are made only on demand.

    ``order`` and ``mem`` may be given as functions that make them, called the first
    time they are read (the timing pass does not record the event order, and the
    periodic timing, :mod:`pipeoffload.passes.steady_columns`, writes the times without
    running the engine op by op, so the event order is made only when a listing in
    event order needs it; the planner reads the deltas of few of its timelines).

    Guarantees: :meth:`timed_ops` gives the :class:`TimedOp` list these columns stand
    for (event ``k`` is the next op of rank ``order[k]``), every op on the
    ``"compute"`` stream and with ``op.rank`` its column's rank.

    ``serial`` says that on every rank each op lasts a positive time and starts no
    earlier than the previous one ends (the timing pass's columns when every duration
    is positive: each op starts at or after its rank's clock); the metrics then read a
    rank's first start and last end at its ends, and its memory levels as running sums.
    """

    __slots__ = ("ops", "start", "end", "_mem", "_order", "serial")

    def __init__(self, ops: Sequence[Sequence[Op]], start: Sequence[array], end: Sequence[array],
                 mem: Sequence[array] | Callable[[], Sequence[array]], order: array | Callable[[], array],
                 serial: bool = False) -> None:
        self.ops, self.start, self.end, self._mem, self._order = ops, start, end, mem, order
        self.serial = serial

    @property
    def mem(self) -> Sequence[array]:
        """Per rank, each op's memory delta."""
        if callable(self._mem):
            self._mem = self._mem()
        return self._mem

    @property
    def order(self) -> array:
        """The rank of each event in event order."""
        if callable(self._order):
            self._order = self._order()
        return self._order

    def __len__(self) -> int:
        return sum(map(len, self.start))

    def rows(self, sort: bool = False) -> Iterator[tuple[Op, float, float, str, float]]:
        """Each event as ``(op, start, end, "compute", mem)``: in event order, or with
        ``sort`` in the order of a stable sort by (rank, start) — a rank's events come
        in its list order, so that is each rank's indices sorted by start, rank by rank."""
        ops, start, end, mem = self.ops, self.start, self.end, self.mem
        if sort:
            for r in range(len(ops)):
                o, st, en, me = ops[r], start[r], end[r], mem[r]
                for i in sorted(range(len(st)), key=st.__getitem__):
                    yield o[i], st[i], en[i], "compute", me[i]
            return
        cursor = [0] * len(ops)
        for r in self.order:
            i = cursor[r]
            cursor[r] = i + 1
            yield ops[r][i], start[r][i], end[r][i], "compute", mem[r][i]

    def timed_ops(self) -> list[TimedOp]:
        """The events as :class:`TimedOp` objects, in event order."""
        cursor = [0] * len(self.ops)
        # Every op is read: a rank held as RankOps is made into its list at once.
        ops = [o.to_list() if isinstance(o, RankOps) else o for o in self.ops]
        start, end, mem = self.start, self.end, self.mem
        out = []
        append = out.append
        for r in self.order:
            i = cursor[r]
            cursor[r] = i + 1
            append(TimedOp(ops[r][i], start[r][i], end[r][i], "compute", mem[r][i]))
        return out


@dataclass
class Timeline:
    """Every op's start/end per rank, with memory deltas. Times in any unit.

    ``events`` is a plain list of :class:`TimedOp`; a timeline made by the timing pass
    (:meth:`from_columns`) holds them as :class:`EventColumns` instead and makes that
    list the first time ``events`` is read (from then on the list is the timeline's
    events: appending to it or replacing it works as for any timeline). The metrics
    below read the columns directly while they are there, with the same floats.
    """

    num_ranks: int
    events: list[TimedOp]
    name: str = ""
    num_microbatches: int = 0
    chunks: int = 1
    #: Memory unit name for reports ("units", "bytes", ...).
    memory_unit: str = "units"
    #: Free-form facts (e.g. parameters, predicted values, peaks without offload).
    meta: dict = field(default_factory=dict)

    @classmethod
    def from_columns(cls, num_ranks: int, columns: EventColumns, **kwargs: object) -> "Timeline":
        """A timeline of compute events held as ``columns`` (``kwargs``: the other fields)."""
        tl = cls(num_ranks, [], **kwargs)
        tl._events, tl._columns = None, columns
        return tl

    def _get_events(self) -> list[TimedOp]:
        if self._events is None:
            self._events, self._columns = self._columns.timed_ops(), None
        return self._events

    def _set_events(self, events: list[TimedOp]) -> None:
        self._events, self._columns = events, None

    def event_rows(self, sort: bool = False) -> Iterator[tuple[Op, float, float, str, float]]:
        """Each event as ``(op, start, end, stream, mem)``, in event order, or with
        ``sort`` by (rank, start) as ``sorted(events, key=(rank, start))`` orders them
        (ties keep event order); no :class:`TimedOp` is made for a columns timeline."""
        cols = self._columns
        if cols is None:
            evs = sorted(self._events, key=_RANK_START) if sort else self._events
            return ((e.op, e.start, e.end, e.stream, e.mem) for e in evs)
        return cols.rows(sort)

    def last_ops(self, kinds: Collection[OpKind]) -> dict[int, tuple[float, float]]:
        """Per layer group: ``(start, end)`` of its compute op of one of ``kinds`` that ends
        last (of equal ends, the first in event order); groups without one are absent.

        Guarantees: equal to a scan of :meth:`event_rows`. On serial columns
        (:class:`EventColumns`) each rank's list is read from its end until every layer
        group of the rank is found: there a rank's ends rise strictly along its list, so a
        group's last op of ``kinds`` in the list ends last — when every group lies on one
        rank, as the placements make them (otherwise the scan)."""
        cols = self._columns
        if cols is not None and cols.serial:
            found = _last_ops_serial(cols, kinds)
            if found is not None:
                return found
        last: dict[int, tuple[float, float]] = {}
        for op, start, end, stream, _ in self.event_rows():
            if op.kind in kinds and stream == "compute":
                s = op.stage
                if s not in last or end > last[s][1]:
                    last[s] = (start, end)
        return last

    # --- selection -----------------------------------------------------------------
    def rank_events(self, rank: int, stream: str | None = "compute") -> list[TimedOp]:
        """Events of one rank (one stream, or all with ``stream=None``), by start time."""
        evs = [e for e in self.events if e.rank == rank and (stream is None or e.stream == stream)]
        evs.sort(key=lambda e: (e.start, e.end))
        return evs

    def compute_events(self) -> Iterable[TimedOp]:
        return (e for e in self.events if e.stream == "compute")

    # --- time metrics --------------------------------------------------------------
    @property
    def start(self) -> float:
        if self._columns is not None:
            return min((min(a) for a in self._columns.start if a), default=0.0)
        return min((e.start for e in self.compute_events()), default=0.0)

    @property
    def end(self) -> float:
        if self._columns is not None:
            return max((max(a) for a in self._columns.end if a), default=0.0)
        return max((e.end for e in self.compute_events()), default=0.0)

    @property
    def makespan(self) -> float:
        return self.end - self.start

    def spans(self) -> list[float]:
        """Per rank: its last compute op's end − its first compute op's start."""
        if self._columns is not None:
            first, last, _ = self._column_figures(self._columns)
            return [b - a if b >= a else 0.0 for a, b in zip(first, last)]
        first = [float("inf")] * self.num_ranks
        last = [float("-inf")] * self.num_ranks
        for e in self.compute_events():
            r = e.rank
            if e.start < first[r]:
                first[r] = e.start
            if e.end > last[r]:
                last[r] = e.end
        return [b - a if b >= a else 0.0 for a, b in zip(first, last)]

    @property
    def iteration_time(self) -> float:
        """The largest per-rank span (the bubble rate's denominator)."""
        return max(self.spans(), default=0.0)

    def busy(self) -> list[float]:
        """Total compute time of each rank."""
        if self._columns is not None:
            return self._column_figures(self._columns)[2]
        out = [0.0] * self.num_ranks
        for e in self.compute_events():
            out[e.rank] += e.duration
        return out

    @property
    def bubble_rate(self) -> float:
        """1 − busiest rank's compute / largest per-rank span (the ZB paper's metric)."""
        it = self.iteration_time
        return 1.0 - max(self.busy()) / it if it > 0 else 0.0

    @property
    def bubble_rate_makespan(self) -> float:
        """1 − busiest rank's compute / global makespan (first start to last end, all ranks)."""
        ms = self.makespan
        return 1.0 - max(self.busy()) / ms if ms > 0 else 0.0

    def rank_bubble_rates(self) -> list[float]:
        """Per rank: 1 − its own compute time / the iteration time."""
        it = self.iteration_time
        return [1.0 - b / it if it > 0 else 0.0 for b in self.busy()]

    # --- memory metrics ------------------------------------------------------------
    def memory_changes(self) -> list[list[Change]]:
        """Per rank, every memory change of its events as ``(time, FREE|ALLOC, delta)``:
        a positive ``mem`` at the event's start, a negative one at its end."""
        points: list[list[Change]] = [[] for _ in range(self.num_ranks)]
        if self._columns is not None:
            for r in range(len(self._columns.ops)):
                points[r] = _column_changes(self._columns, r)
            return points
        for e in self.events:
            mem = e.mem
            if mem > 0:
                points[e.op.rank].append((e.start, ALLOC, mem))
            elif mem < 0:
                points[e.op.rank].append((e.end, FREE, mem))
        return points

    def memory_sweeps(self) -> list[list[Change]]:
        """Per rank, :func:`memory_sweep` of its changes: ``(time, FREE|ALLOC, level after)``."""
        return [memory_sweep(pts) for pts in self.memory_changes()]

    def memory_curves(self) -> list[list[tuple[float, float]]]:
        """Every rank's memory step curve (see :meth:`memory_curve`), in one pass."""
        t0 = self.start
        return [[(t0, 0.0)] + [(t, level) for t, _, level in sweep] for sweep in self.memory_sweeps()]

    def memory_curve(self, rank: int) -> list[tuple[float, float]]:
        """Step curve ``[(time, level), …]`` of a rank's activation memory.

        Frees at a time are applied before allocations at the same time, so a W
        that ends when an F starts does not count both.
        """
        return self.memory_curves()[rank]

    def peak_memory(self) -> list[float]:
        """Per rank, the highest activation memory over the iteration (≥ 0)."""
        if self._columns is not None:  # one rank's changes at a time
            cols, n = self._columns, len(self._columns.ops)
            return [_clean(_column_peak(cols, r)) if r < n else 0.0 for r in range(self.num_ranks)]
        return [_clean(max([0.0] + [level for _, _, level in sweep])) for sweep in self.memory_sweeps()]

    def serial_peaks(self) -> list[float] | None:
        """Per rank, the highest running sum of its memory deltas in its order, from 0
        (:func:`running_peak`, not rounded), when the timeline still holds serial columns (the
        timing pass's when every op lasts a positive time); None otherwise. On such ranks every
        sweep of the same changes adds the same deltas in the same order
        (:func:`_column_peak`'s argument), so it is :meth:`peak_memory` before its rounding."""
        cols = self.serial_columns()
        if cols is None:
            return None
        n = len(cols.ops)
        return [running_peak(cols.mem[r]) if r < n else 0.0 for r in range(self.num_ranks)]

    def serial_columns(self) -> EventColumns | None:
        """The timeline's columns while it holds them and they are serial (each rank's ops one
        after another, each lasting a positive time: :class:`EventColumns`), else None. Read
        only: what is derived from them must hold for the events they stand for."""
        cols = self._columns
        return cols if cols is not None and cols.serial else None

    def summary(self) -> dict:
        """The JSON-ready core metrics: those of the properties above, from one pass over
        the events (each property alone makes its own pass)."""
        if self._columns is not None:
            first, last, busy = self._column_figures(self._columns)
            start, end = min(first, default=float("inf")), max(last, default=float("-inf"))
        else:
            start, end, first, last, busy = self._event_figures()
        if start > end:  # no compute event: as the properties' defaults
            start = end = 0.0
        makespan = end - start
        it = max([y - x if y >= x else 0.0 for x, y in zip(first, last)], default=0.0)
        top = max(busy)
        return {
            "makespan": _clean(makespan),
            "iteration_time": _clean(it),
            "bubble_rate": _clean(1.0 - top / it if it > 0 else 0.0),
            "bubble_rate_makespan": _clean(1.0 - top / makespan if makespan > 0 else 0.0),
            "peak_memory": self.peak_memory(),
            "busy": [_clean(b) for b in busy],
        }

    def _event_figures(self) -> tuple[float, float, list[float], list[float], list[float]]:
        """Over the compute events: first start, last end, and per rank the first
        start, last end and busy time (summed in event order)."""
        n = self.num_ranks
        start, end = float("inf"), float("-inf")
        first, last, busy = [float("inf")] * n, [float("-inf")] * n, [0.0] * n
        for e in self.events:
            if e.stream != "compute":
                continue
            r, a, b = e.op.rank, e.start, e.end
            if a < start:
                start = a
            if b > end:
                end = b
            if a < first[r]:
                first[r] = a
            if b > last[r]:
                last[r] = b
            busy[r] += b - a
        return start, end, first, last, busy

    def _column_figures(self, cols: EventColumns) -> tuple[list[float], list[float], list[float]]:
        """:meth:`_event_figures`' per-rank lists from the columns, in C: a rank's busy
        time is the running sum of its ``end − start`` in its order (its event order),
        the same additions as the loop over the events."""
        n = self.num_ranks
        first, last, busy = [float("inf")] * n, [float("-inf")] * n, [0.0] * n
        for r in range(len(cols.ops)):
            st, en = cols.start[r], cols.end[r]
            if st:
                first[r], last[r] = (st[0], en[-1]) if cols.serial else (min(st), max(en))
                busy[r] = deque(accumulate(map(sub, en, st), initial=0.0), maxlen=1)[0]
        return first, last, busy



def _last_ops_serial(cols: EventColumns, kinds: Collection[OpKind]) -> dict[int, tuple[float, float]] | None:
    """:meth:`Timeline.last_ops` on serial columns: each rank's list read backwards until
    each of its layer groups has its op; None when a group has ops on two ranks."""
    out: dict[int, tuple[float, float]] = {}
    codes = {i for i, k in enumerate(ALL_KINDS) if k in kinds}
    for r, ops in enumerate(cols.ops):
        # every group of the rank, whether or not it has such an op
        groups = ops.stages() if isinstance(ops, RankOps) else {op.stage for op in ops}
        if groups & out.keys():
            return None
        st, en = cols.start[r], cols.end[r]
        if isinstance(ops, RankOps):  # the kind codes and groups read from the arrays: no Op made
            kind_of, stage_of = ops.orders.kinds[ops.rank], ops.orders.stages[ops.rank]
            for i in range(len(ops) - 1, -1, -1):
                if not groups:
                    break
                s = stage_of[i]
                if s in groups and kind_of[i] in codes:
                    out[s] = (st[i], en[i])
                    groups.discard(s)
            continue
        for i in range(len(ops) - 1, -1, -1):
            if not groups:
                break
            op = ops[i]
            if op.stage in groups and op.kind in kinds:
                out[op.stage] = (st[i], en[i])
                groups.discard(op.stage)
    return out

def _column_peak(cols: EventColumns, r: int) -> float:
    """``max([0.0] + levels of memory_sweep(rank r's changes))``. A rank's ops run one
    after another, each starting no earlier than the previous one's end; when every one
    lasts a positive time, its changes (an allocation at its start, or a free at its end)
    are then already in the sweep's order (times never decrease, and where two meet it
    is a free at one op's end before an allocation at the next one's start), so the
    levels are the running sums of the deltas in the rank's order, taken in C. Otherwise
    the sweep itself."""
    st, en, mem = cols.start[r], cols.end[r], cols.mem[r]
    if cols.serial or all(map(lt, st, en)) and all(map(le, en, st[1:])):
        return running_peak(mem)
    return max([0.0] + [level for _, _, level in memory_sweep(_column_changes(cols, r))])


def running_peak(deltas: Iterable[float]) -> float:
    """The highest running sum of ``deltas`` from 0 (0 at least), in C: the peak of a
    rank whose memory changes come in its op order (its ops run one after another, each
    lasting a positive time), as :func:`memory_sweep` would level them (a zero delta,
    which the sweep leaves out, repeats a level)."""
    return max(accumulate(deltas, initial=0.0))


def _column_changes(cols: EventColumns, r: int) -> list[Change]:
    """Rank ``r``'s memory changes from the columns, as :meth:`Timeline.memory_changes`
    makes them from its events (the rank's events are in its order)."""
    out: list[Change] = []
    append = out.append
    for a, b, mem in zip(cols.start[r], cols.end[r], cols.mem[r]):
        if mem > 0:
            append((a, ALLOC, mem))
        elif mem < 0:
            append((b, FREE, mem))
    return out


#: Timeline.events is a property over ``_events`` / ``_columns`` (a dataclass field can
#: not be one in the class body); the generated ``__init__``, ``__eq__``, ``__repr__`` and
#: :func:`dataclasses.replace` go through it.
Timeline._events = None
Timeline._columns = None
Timeline.events = property(Timeline._get_events, Timeline._set_events,
                           doc="Every event as a :class:`TimedOp` list (made from the columns when first read).")
_RANK_START = lambda e: (e.rank, e.start)  # noqa: E731  the --ops listing's sort key


def _clean(x: float) -> float:
    """Round away float noise from 1/v shares (e.g. 2.9999999999 → 3.0)."""
    r = round(x, 9)
    return 0.0 if r == 0 else r
