"""The three figures of a candidate order, timed through its periodic steady state.

:func:`order_figures` (the timing pass's engine) times every op of a lowering's
candidate orders, O(p·m) steps of Python. The V lowerings' orders are periodic in
their middle: on each rank the op ``P`` places later is the same op one microbatch on
(``P`` = the rank's ops per microbatch). Once the list-scheduling recurrence
(``end = max(rank clock, inputs' ends + latency) + duration``) has settled, every op of
a period ends exactly ``T`` later than its copy one period before, and then so does
every later op of the periodic range (an induction over the recurrence, below), so the
middle need not be timed.

The check, at a cut ``c_r`` on each rank once every op before ``c_r + P`` is timed:
each op of the period ``[c_r, c_r + P)`` has its inputs at index ≥ ``lo_q + P`` on
their rank (inside the periodic range, one period in); on every rank, every op from
the earliest such input (or the cut) to ``c_r + P`` ends exactly ``T`` after its copy
one period before. Then by induction on the recurrence (an op's predecessor and inputs
are its copy's, one microbatch on, and max and + commute with a shift when the
arithmetic is exact) op ``[c_r + i]`` shifted ``n`` periods ends ``n·T`` later, for
every ``n`` that keeps it and its inputs inside the periodic ranges. Those ends are
written by slices of the engine's end table, and the timing resumes after them for
the cool-down. When the check fails the run goes on one period and checks again; if it
never passes, every op is timed as in :func:`order_figures`.

Exactness: a shift commutes with the recurrence bit for bit only when every sum is
exact, so the shortcut applies only when every duration, the latency and every memory
delta is a multiple of 2⁻²⁰ and the totals stay below 2³¹ (unit costs and halves, as
the defaults): then all times are exact binary fractions and the figures are the same
floats. With positive durations a rank's memory sweep (sorted by time, frees first) is
its ops' order, so its peak is the highest running sum of the deltas in op order; a
period's deltas sum to 0 exactly in a steady V order, so the skipped periods repeat
levels already seen. Otherwise (other costs, zero durations, BW ops, a period whose
deltas do not cancel) :func:`steady_figures` is :func:`order_figures`.

Orders for ``m`` microbatches that are orders for ``m' < m`` with periods inserted
(:class:`PeriodicOrders`, the V lowerings' candidates) are timed on ``m'``:
:func:`periodic_figures` derives the figures for ``m`` from that run when it proves them
the same (the run for ``m`` shifts more periods of the same steady state), else times
the expanded orders.

The engine's per-op loop runs in C where :mod:`pipeoffload._engine` is built (:meth:`_Engine.run`:
the same floats, tests/test_engine_c_loops.py), else in Python; no torch.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import itemgetter, sub
from typing import Callable, Mapping, Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement
from ..native import c_engine
from .timing import _NOT_PLACED, CODE_KIND, ListScheduler, order_figures
from ..timeline import _clean

__all__ = ["steady_figures", "op_slots", "PeriodicOrders", "insert_periods", "periodic_figures", "inputs_from", "inside_range", "exact_costs"]

_GRAIN = float(1 << 20)  #: times and deltas must be multiples of 1/_GRAIN
_LIMIT = float(1 << 31)  #: ... and their totals below this: every sum is exact
_CODE = {OpKind.F: 0, OpKind.B: 1, OpKind.W: 2}  #: the engine's completion codes (no BW)
_RUN = re.compile(rb"\x01+")


def steady_figures(placement: Placement, num_microbatches: int,
                   orders: Sequence[Sequence[tuple[OpKind, int, int]]], costs: Costs,
                   memory: MemoryDeltas) -> tuple[float, float, float]:
    """``(highest peak, longest span, makespan)`` of per-rank ``(kind, layer group,
    microbatch)`` orders: :func:`~pipeoffload.passes.timing.order_figures`, with the
    periodic steady state shifted instead of timed where that is exact (module docstring).

    Args:
        placement: the layer groups' ranks.
        num_microbatches: m.
        orders: each rank's compute ops in order.
        costs, memory: the durations, latency and memory deltas.

    Returns:
        The three figures.

    Raises:
        ScheduleError: the orders deadlock (as :func:`order_figures`).

    Guarantees: the same floats as :func:`order_figures` for any input. Cost: O(p·m)
    list work in C (one integer per op, the periodic ranges) plus the engine over the
    warm-up and cool-down, O(p²) ops for the V lowerings' orders (O(p·m) when the
    shortcut does not apply).
    """
    figures, _ = _steady(placement, num_microbatches, orders, costs, memory)
    if figures is None:
        return order_figures(placement, num_microbatches, orders, costs, memory)
    return figures


Cell = tuple[OpKind, int, int]  #: (kind, layer group, microbatch)


def insert_periods(row: Sequence[Cell], at: int, per: int, extra: int,
                   ops: Mapping[tuple[OpKind, int], Sequence[Cell]] | None = None) -> list[Cell]:
    """``row[:at]``, then the period ``row[at − per:at]`` ``1..extra`` microbatches on (copy
    by copy), then ``row[at:]`` ``extra`` microbatches on: a rank's order with ``extra``
    periods inserted at index ``at``. With ``ops`` (each ``(kind, layer group)``'s op
    tuples by microbatch, e.g. :func:`~pipeoffload.schedules.building_block.op_table`)
    the new entries are its tuples, else new ones. O(len(row) + per·extra), in C."""
    out = list(row[:at])
    period = row[at - per:at] if per else ()
    if ops is None:
        out += [(k, s, j + i) for i in range(1, extra + 1) for k, s, j in period]
        out += [(k, s, j + extra) for k, s, j in row[at:]]
    else:
        # copy i is each period op's column entry i: its column sliced once, then zipped
        out.extend(chain.from_iterable(zip(*[ops[k, s][j + 1:j + extra + 1] for k, s, j in period])))
        out += [ops[k, s][j + extra] for k, s, j in row[at:]]
    return out


@dataclass
class PeriodicOrders:
    """Per-rank orders for ``m`` microbatches held as those for ``m' = m − extra`` and
    where the ``extra`` missing periods go in: rank ``r``'s order for ``m`` is
    :func:`insert_periods` ``(orders[r], at[r], per[r], extra)``. The V lowerings make
    their candidates so (the building-block pipeline, the slot reorder and the W refill
    prove their result for ``m`` is theirs for ``m'`` with the periods inserted), time
    them on ``m'`` (:func:`periodic_figures`) and make only the winner's ``m`` orders."""

    orders: list[list[Cell]]
    at: list[int]
    per: list[int]
    extra: int

    @classmethod
    def plain(cls, orders: list[list[Cell]]) -> "PeriodicOrders":
        """``orders`` themselves (nothing inserted)."""
        return cls(orders, [len(r) for r in orders], [0] * len(orders), 0)

    def n_ops(self) -> int:
        """Ops of the orders for ``m``."""
        return sum(map(len, self.orders)) + self.extra * sum(self.per)

    def expand(self, ops: Mapping[tuple[OpKind, int], Sequence[Cell]] | None = None) -> list[list[Cell]]:
        """The orders for ``m`` (``orders`` itself when nothing is inserted); ``ops`` as
        :func:`insert_periods`. O(p·m) list work in C."""
        if not self.extra:
            return self.orders
        return [insert_periods(row, a, per, self.extra, ops) for row, a, per in zip(self.orders, self.at, self.per)]


def periodic_figures(placement: Placement, num_microbatches: int, cand: PeriodicOrders, costs: Costs,
                     memory: MemoryDeltas) -> tuple[float, float, float]:
    """:func:`steady_figures` of ``cand.expand()`` (``num_microbatches`` = m), from the
    timing of ``cand.orders`` on ``m' = m − cand.extra`` microbatches when that is exact.

    Why they are equal (:func:`_inserts_shift`'s checks). Let ``O'`` be the short orders
    and ``O`` those for ``m``; with ``at[r]`` inside rank ``r``'s periodic range
    ``[lo, hi)`` (one period past ``lo``), ``O`` is ``O'`` with that range ``Δ·P`` ops
    longer and ``O[i + Δ·P]`` = ``O'[i]`` ``Δ`` microbatches on for ``i ≥ lo``. The
    engine's runs on both are the same up to the cut where the one on ``O'`` proves its
    period (the limited runs place only ops below ``hi``, where both agree, and each check
    reads the same ops), so the one on ``O`` proves it there too and shifts ``Δ`` periods
    more, each ``T`` later. Its cool-down is then ``O'``'s, ``Δ`` microbatches and ``Δ·T``
    later, by induction on the recurrence, when every input a cool-down op of ``O'`` reads
    lies at or after its rank's checked period (those ends are ``Δ·T`` later in ``O``).
    So each rank's first start is the same, its last end ``Δ·T`` later (exact under the
    binary-fraction condition, checked for ``O``'s op count), and its peak — the running
    sum without the shifted periods, which sum to 0 — the same. Otherwise
    :func:`steady_figures` of the expanded orders.

    Cost: the engine on ``O'`` (O(p²) ops for the V candidates, O(p·m') list work) and
    the checks, O(p²)."""
    if not cand.extra:
        return steady_figures(placement, num_microbatches, cand.orders, costs, memory)
    small = num_microbatches - cand.extra
    figures, eng = _steady_run(placement, small, cand.orders, costs, memory, cand.n_ops())
    if figures is None or not _inserts_shift(eng, cand.at, cand.per, small):
        return steady_figures(placement, num_microbatches, cand.expand(), costs, memory)
    dT = cand.extra * eng.shift
    return (figures[0], *_spans(eng.first, [c + dT for c in eng.clock]))


def _inserts_shift(eng: "_Engine", at: Sequence[int], per: Sequence[int], m: int) -> bool:
    """:func:`periodic_figures`' checks on the engine's run over ``O'`` (``m`` = m'): it
    shifted periods; each ``at[r]`` lies in ``[lo + P, hi]`` of rank ``r``'s periodic
    range with ``per[r] = P`` (and the range's chains are the same op, not a microbatch
    wrapping into the next op's codes); every input of an op timed after the shifted
    periods sits at or after its rank's checked period."""
    if eng.skipped < 1:
        return False
    codes = eng.codes
    if not all(inside_range(ops, rng, P, a, c, m) for ops, rng, P, a, c in zip(codes, eng.ranges, eng.periods, at, per)):
        return False
    # the checked period's inputs from eng.low on, hence every op from one period before, end T after their copies
    low = [q - P for q, P in zip(eng.low, eng.periods)]
    reading = [ops[eng.cut[r][1]:] for r, ops in enumerate(codes)]
    return inputs_from(eng.deps, eng.rank_of, codes, reading, low, eng.ranges, eng.refs, eng.periods, m)


def inside_range(codes: list[int], rng: tuple[int, int], period: int, at: int, per: int, m: int) -> bool:
    """Whether periods of ``per`` ops inserted at index ``at`` go in inside the periodic
    range ``rng`` of ``codes`` (slots of ``m`` microbatches, ``period`` ops a period):
    ``per = period``, ``lo + period ≤ at ≤ hi``, and each chain of the range (an op, then
    ``period`` later its next microbatch) stays the same op, not a microbatch wrapping
    into the next op's slots (then the range is the same one for more microbatches)."""
    lo, hi = rng
    if per != period or not lo + period <= at <= hi:
        return False
    return _chains_whole(codes, rng, period, m)


def _chains_whole(codes: list[int], rng: tuple[int, int], period: int, m: int) -> bool:
    """Whether each chain of the periodic range ``rng`` (an op, then ``period`` later its
    next microbatch) stays the same op to the range's end. Then every op in the range sits
    where :func:`_index` looks for it (its first-period copy plus whole periods)."""
    lo, hi = rng
    return all(codes[i] // m == codes[i + (hi - 1 - i) // period * period] // m for i in range(lo, lo + period))


def inputs_from(deps: Sequence, rank_of: Sequence[int], codes: list[list[int]], reading: Sequence[Sequence[int]],
                low: Sequence[int], ranges: Sequence[tuple[int, int]], refs: Sequence, periods: Sequence[int],
                m: int) -> bool:
    """Whether every input of the ops ``reading`` (end-table slots) is at index ``≥ low[q]``
    in ``codes[q]``, its rank's list: found by the period inside the periodic range
    (``ranges``, ``refs``, ``periods``), and past the range (then after ``low``, which lies
    inside it) by a set of the ranges' tails; an input before the range fails. O(ops read
    plus the tails).

    Where a rank's range chains are whole (:func:`_chains_whole`, the usual case), an op
    of the range is found by :func:`_index` exactly at its index, so the inputs allowed on
    that rank are the set of its list from ``max(lo, min(low, hi))`` on (the tail
    included): one membership test per input instead of the index arithmetic."""
    S = len(deps) // 3
    allowed = [set(c[max(lo, min(q, hi)):]) if hi - lo >= P > 0 and _chains_whole(c, (lo, hi), P, m) else None
               for c, (lo, hi), q, P in zip(codes, ranges, low, periods, strict=True)]  # one of each per rank
    tails = [set(c[hi:]) if a is None else None for c, (_, hi), a in zip(codes, ranges, allowed)]
    loop = getattr(c_engine(), "inputs_from", None)
    if loop is not None and type(deps) is list and type(codes) is list:  # in C where built: the same answer
        return loop(deps, list(rank_of), codes, reading, list(low), list(ranges), list(refs), list(periods), m,
                    allowed, tails)
    for ops in reading:
        for x in ops:
            own, mb = divmod(x, m)
            for base, _ in deps[own]:
                y = base + mb
                q = rank_of[(y // m) % S]
                a = allowed[q]
                if a is not None:
                    if y not in a:
                        return False
                    continue
                k = _index(y, codes[q], ranges[q], refs[q], m, periods[q])
                if k is None:
                    if y not in tails[q]:
                        return False
                elif k < low[q]:
                    return False
    return True


def _steady(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
            costs: Costs, memory: MemoryDeltas) -> tuple[tuple[float, float, float] | None, int]:
    """The figures and how many periods were shifted (0: none), or ``(None, 0)`` when the
    shortcut does not apply (then :func:`order_figures` must time the orders)."""
    figures, eng = _steady_run(placement, m, orders, costs, memory, sum(map(len, orders)))
    return (None, 0) if figures is None else (figures, eng.skipped)


def _steady_run(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
                costs: Costs, memory: MemoryDeltas, n_ops: int) -> tuple[tuple[float, float, float] | None, _Engine | None]:
    """:func:`_steady`'s figures and the engine that made them (``(None, None)`` when the
    shortcut does not apply); the exactness bound is checked for ``n_ops`` ops (more than
    ``orders`` hold when :func:`periodic_figures` times the orders before periods go in)."""
    S = placement.num_stages
    if not orders or any(not lst for lst in orders):
        return None, None
    if any(max(map(itemgetter(2), lst)) >= m for lst in orders):
        return None, None
    tables = _exact_tables(placement, costs, memory, n_ops)
    if tables is None:
        return None, None
    durc, memc = tables
    try:
        codes = [op_slots(lst, S, m, _CODE) for lst in orders]
    except KeyError:  # a kind without an engine code (BW)
        return None, None
    eng = _Engine(placement, m, costs.comm, codes, durc)
    eng.skipped = _run_with_skip(eng, m)
    if any(eng.done[r] < len(c) for r, c in enumerate(codes)):
        return None, None  # deadlock: order_figures names it
    peaks = [_rank_peak(c, memc, m, eng.cut[r]) for r, c in enumerate(codes)]
    if None in peaks:
        return None, None
    peak = max(peaks)
    return (peak, *_spans(eng.first, eng.clock)), eng


def _exact_tables(placement: Placement, costs: Costs, memory: MemoryDeltas,
                  n_ops: int) -> tuple[list[float], list[float]] | None:
    """The durations and memory deltas by engine code (``code·S + layer group``) when the
    shortcut's exactness holds for ``n_ops`` ops (module docstring), else None."""
    S = placement.num_stages
    dur_t, mem_t = costs.duration_table(placement), memory.delta_table(placement)
    durc = [dur_t[s][CODE_KIND[c]] for c in range(3) for s in range(S)]
    memc = [mem_t[s][CODE_KIND[c]] for c in range(3) for s in range(S)]
    if not (_exact(durc + [costs.comm], n_ops) and _exact(memc, n_ops) and min(durc) > 0):
        return None
    return durc, memc


def exact_costs(placement: Placement, costs: Costs, memory: MemoryDeltas, n_ops: int) -> bool:
    """Whether :func:`steady_figures` (and so :func:`periodic_figures`) can shift periods
    of ``n_ops`` ops under ``costs`` and ``memory``: every duration positive, every
    duration, the latency and every delta an exact binary fraction (module docstring).
    Otherwise both time every op, and a :class:`PeriodicOrders` is best expanded once."""
    return _exact_tables(placement, costs, memory, n_ops) is not None


def _spans(first: Sequence[float], last: Sequence[float]) -> tuple[float, float]:
    """Longest rank span and makespan from each rank's first start and last end."""
    spans = [b - a if b >= a else 0.0 for a, b in zip(first, last)]
    return max(spans), max(last) - min(first)


def op_slots(ops: Sequence[tuple[OpKind, int, int]], num_stages: int, m: int,
             code_of: dict[OpKind, int]) -> list[int]:
    """Each ``(kind, layer group, microbatch)`` op's slot in the engine's end table,
    ``(code_of[kind]·num_stages + layer group)·m + microbatch``, in order.
    Raises KeyError for a kind ``code_of`` lacks. In C where built (the same list)."""
    loop = getattr(c_engine(), "op_slots", None)
    if loop is not None and type(code_of) is dict:
        return loop(ops, num_stages, m, code_of)
    return [(code_of[k] * num_stages + s) * m + j for k, s, j in ops]


def _exact(values: list[float], n_ops: int) -> bool:
    """Whether sums of up to ``n_ops`` of ``values`` are exact binary fractions (module
    docstring): each a multiple of 2⁻²⁰, their largest times ``2·(n_ops + 1)`` below 2³¹."""
    if any(not math.isfinite(x) or not (x * _GRAIN).is_integer() for x in values):
        return False
    return 2.0 * max(abs(x) for x in values) * (n_ops + 1) < _LIMIT


def _period_range(codes: list[int], period: int) -> tuple[int, int]:
    """``[lo, hi)``: the longest run where ``codes[i + period] == codes[i] + 1`` (the same
    op one microbatch on) for every ``lo ≤ i < hi − period``; ``(0, 0)`` if none. In C where
    built (the same range)."""
    loop = getattr(c_engine(), "period_range", None)
    if loop is not None and period > 0 and type(codes) is list:
        return loop(codes, period)
    same = bytes(map((1).__eq__, map(sub, codes[period:], codes[:-period])))
    best = (0, 0)
    for run in _RUN.finditer(same):
        if run.end() - run.start() > best[1] - best[0]:
            best = (run.start(), run.end())
    if best == (0, 0):
        return 0, 0
    return best[0], best[1] + period


class _Engine:
    """The timing pass's fused list-scheduling loop (``_time_rank_lists``: the same
    recurrence, the same float operations) on integer op codes, with a per-rank limit so
    it can stop at a cut, be checked, shifted and resumed."""

    def __init__(self, placement: Placement, m: int, comm: float, codes: list[list[int]],
                 durc: list[float]) -> None:
        ls = ListScheduler(placement.stage_to_rank, m, comm)
        self.m, self.codes, self.durc = m, codes, durc
        self.deps, self.end, self.origin, self.rank_of = ls.deps, ls.end, ls.origin, ls.rank_of
        #: per op code, its inputs' slot offsets from the op's own slot (``base + mb`` is
        #: ``slot + base − code·m``) and latencies: one ``//`` an op instead of a divmod
        self.rel = [[(base - own * m, latency) for base, latency in row] for own, row in enumerate(ls.deps)]
        p = len(codes)
        self.clock = [ls.origin] * p
        self.first = [math.inf] * p
        self.done = [0] * p
        self.lim = [0] * p
        self.cut = [None] * p  # per rank, (start, stop) of the shifted indices, or None
        self.skipped = 0  #: periods shifted (:func:`_run_with_skip`)
        self.shift = 0.0  #: the period's time ``T`` when shifted
        #: per rank: ops per period, the periodic range and its first period (:func:`_run_with_skip`)
        self.periods: list[int] = []
        self.ranges: list[tuple[int, int]] = []
        self.refs: list = []
        #: per rank, the earliest index whose end the check compared with its copy's (set when it passes)
        self.low: list[int] = []
        self.waiting: dict[int, list[int]] = {}
        self.blocked = [False] * p
        #: While limited: ``slot → (rank, index)`` of an op (None if unknown), so that a
        #: rank stopped at its limit goes on to an op another rank waits for.
        self.locate: Callable[[int], tuple[int, int] | None] | None = None
        #: While ``locate`` is :func:`_run_with_skip`'s: (codes, ranges, first periods, ops per
        #: period), from which the C loop locates an op itself (the same answer)
        self.periodic: tuple | None = None

    def _demand(self, slot: int, waiter: int, ready: deque) -> None:
        """Raise the limit of the rank of op ``slot`` (which ``waiter`` waits for) to
        include it, and restart that rank if it was stopped at its limit."""
        where = self.locate(slot)
        if where is None:
            return
        q, k = where
        if q == waiter or k < self.lim[q]:
            return
        stopped = self.done[q] == self.lim[q] and not self.blocked[q]
        self.lim[q] = k + 1
        if stopped:
            ready.append(q)

    def run(self) -> bool:
        """Time every rank up to its limit; whether each got there. In C where
        :mod:`pipeoffload._engine` is built and takes these inputs (``steady_run``: the same
        floats and state), else in Python (:meth:`_run_py`)."""
        loop = getattr(c_engine(), "steady_run", None)
        if loop is not None:
            got = loop(self)
            if got is not None:
                return got
        return self._run_py()

    def _run_py(self) -> bool:
        """:meth:`run`'s loop in Python."""
        m, rel, end, durc, origin, unplaced = self.m, self.rel, self.end, self.durc, self.origin, _NOT_PLACED
        clock, done, lim, waiting, blocked, first = (
            self.clock, self.done, self.lim, self.waiting, self.blocked, self.first)
        ready = deque(r for r in range(len(done)) if not blocked[r] and done[r] < lim[r])
        while ready:
            r = ready.popleft()
            ops, i, n, c = self.codes[r], done[r], lim[r], clock[r]  # c: the rank's clock, kept local
            blocked[r] = False
            while i < n:
                slot = ops[i]
                own = slot // m
                t = origin
                missing = -1
                for off, latency in rel[own]:
                    e = end[slot + off]
                    if e == unplaced:
                        missing = slot + off
                        break
                    e += latency
                    if e > t:
                        t = e
                if missing >= 0:
                    waiting.setdefault(missing, []).append(r)
                    blocked[r] = True
                    if self.locate is not None:  # reads limits, never clocks
                        self._demand(missing, r, ready)
                    break
                if c > t:
                    t = c
                if i == 0:
                    first[r] = t
                end[slot] = c = t + durc[own]
                i += 1
                woken = waiting.pop(slot, None)
                if woken:
                    ready.extend(woken)
            done[r], clock[r] = i, c
        return all(d == n for d, n in zip(done, lim))


def _run_with_skip(eng: _Engine, m: int) -> int:
    """Time ``eng``'s orders, shifting the steady state once the check at a cut passes
    (module docstring); returns how many periods were shifted (0: none, every op timed)."""
    codes = eng.codes
    periods = [len(c) // m if len(c) % m == 0 else 0 for c in codes]
    skipped = 0
    if all(periods):
        ranges = [_period_range(c, per) for c, per in zip(codes, periods)]
        refs = [_first_period(c, lo, per, m) for c, (lo, _), per in zip(codes, ranges, periods)]
        eng.periods, eng.ranges, eng.refs = periods, ranges, refs
        eng.lim = [lo + 3 * per for (lo, _), per in zip(ranges, periods)]
        S = len(eng.deps) // 3

        def locate(slot: int) -> tuple[int, int] | None:
            q = eng.rank_of[(slot // m) % S]
            k = _index(slot, codes[q], ranges[q], refs[q], m, periods[q])
            return None if k is None else (q, k)

        eng.locate = locate
        eng.periodic = (codes, ranges, refs, periods)
        while None not in refs and _run_to_limits(eng, periods, ranges):
            cut = [n - per for n, per in zip(eng.lim, periods)]
            n = min((hi - n) // per for n, per, (_, hi) in zip(eng.lim, periods, ranges))
            shift = _steady_shift(eng, cut, periods, ranges, refs) if n >= 1 else None
            if shift is not None:
                _shift(eng, cut, periods, n, shift)
                skipped = n
                break
            eng.lim = [n + per for n, per in zip(eng.lim, periods)]
    eng.locate = eng.periodic = None
    eng.lim = [len(c) for c in codes]
    eng.run()
    return skipped


def _run_to_limits(eng: _Engine, periods: list[int], ranges: list[tuple[int, int]]) -> bool:
    """Run ``eng`` until every rank is at its limit (a rank goes past it to an op another
    rank waits for); False once a limit leaves its rank's periodic range or the limited
    orders cannot reach their limits (then no cut is left to check)."""
    if any(n + per > hi for n, per, (_, hi) in zip(eng.lim, periods, ranges)):
        return False
    return eng.run() and all(n + per <= hi for n, per, (_, hi) in zip(eng.lim, periods, ranges))


def _first_period(codes: list[int], lo: int, period: int, m: int) -> dict[int, tuple[int, int]] | None:
    """Each op of the periodic range's first period: ``code·S + stage`` → ``(index,
    microbatch)``; None if a kind of op comes twice in it."""
    out = {}
    for i in range(lo, min(lo + period, len(codes))):
        own, mb = divmod(codes[i], m)
        if own in out:
            return None
        out[own] = (i, mb)
    return out


def _index(slot: int, codes: list[int], rng: tuple[int, int], ref: dict[int, tuple[int, int]],
           m: int, period: int) -> int | None:
    """The index of op ``slot`` in ``codes`` when it is in the periodic range, else None."""
    own, mb = divmod(slot, m)
    if own not in ref:
        return None
    i0, mb0 = ref[own]
    k = i0 + (mb - mb0) * period
    return k if rng[0] <= k < rng[1] and codes[k] == slot else None


def _steady_shift(eng: _Engine, cut: list[int], periods: list[int], ranges: list[tuple[int, int]],
                  refs: list) -> float | None:
    """The period's time ``T`` when the check at ``cut`` passes (module docstring), else
    None. Every op before ``cut[r] + periods[r]`` is timed."""
    codes, end, m, deps = eng.codes, eng.end, eng.m, eng.deps
    x0 = codes[0][cut[0]]
    shift = end[x0] - end[x0 - 1]
    for r, ops in enumerate(codes):  # the period after the cut first: it fails fast
        for x in ops[cut[r]:cut[r] + periods[r]]:
            if end[x - 1] + shift != end[x]:
                return None
    S = len(deps) // 3
    rank_of = eng.rank_of
    low = list(cut)
    for r, ops in enumerate(codes):
        for i in range(cut[r], cut[r] + periods[r]):
            own, mb = divmod(ops[i], m)
            for base, _ in deps[own]:
                y = base + mb
                q = rank_of[(y // m) % S]
                k = _index(y, codes[q], ranges[q], refs[q], m, periods[q])
                if k is None or k < ranges[q][0] + periods[q]:
                    return None
                if k < low[q]:
                    low[q] = k
    if not shift > 0:
        return None
    for q, ops in enumerate(codes):
        for x in ops[low[q]:cut[q]]:
            if end[x - 1] + shift != end[x]:
                return None
    eng.low = low
    return shift


def _shift(eng: _Engine, cut: list[int], periods: list[int], n: int, shift: float) -> None:
    """Write the ends of the ``n`` periods after each rank's checked one (each op ``k·T``
    after its copy in it, one slice per op) and resume the engine after them."""
    end = eng.end
    eng.shift = shift
    steps = [k * shift for k in range(1, n + 1)]
    for r, ops in enumerate(eng.codes):
        a, per = cut[r], periods[r]
        for x in ops[a:a + per]:
            end[x + 1:x + n + 1] = list(map(end[x].__add__, steps))
        eng.clock[r] = end[ops[a + per - 1] + n]
        eng.done[r] = a + per + n * per
        eng.cut[r] = (a + per, a + per + n * per)


def _rank_peak(codes: list[int], memc: list[float], m: int, cut: tuple[int, int] | None) -> float | None:
    """A rank's peak: the highest running sum of its deltas in op order (its memory sweep
    when every duration is positive), without the shifted periods ``cut`` (they repeat
    levels of the period before them when a period's deltas sum to 0 exactly; None if
    they do not). The sums in C where built (the same floats)."""
    loop = getattr(c_engine(), "rank_peak", None)
    if loop is not None and type(codes) is list and type(memc) is list:
        got = loop(codes, memc, m, *(cut if cut is not None else (-1, -1)))
        if got is not NotImplemented:
            return None if got is None else _clean(got)
    if cut is None:
        kept = codes
    else:
        a, b = cut
        per = len(codes) // m
        if sum([memc[x // m] for x in codes[a - per:a]]) != 0:
            return None
        kept = codes[:a] + codes[b:]
    return _clean(max(0.0, max(accumulate([memc[x // m] for x in kept]), default=0.0)))
