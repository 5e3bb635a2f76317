"""Re-place the W's of a split-backward schedule with the real costs: W's fill idle time.

Each rank keeps its order of F and B ops (the *skeleton*); its W's are taken out and put
back greedily, timed by the timing pass's engine (:class:`.zb_auto.Tracker`): before each
skeleton op, pending W's (oldest first) run while they end before the op's input
arrives, one more runs when part of the gap would stay idle (``partial``), and W's are
forced while the op would take the rank above its cap; the rest run at the end. It is
the zero-bubble rule — W waits while the B chain moves — applied to a fixed F/B order,
so V-Min and V-Half, whose blocks place W's for unit costs, recover idle time when
B ≠ F (found by comparing them with the exact scheduler's orders, docs/solver.md).

Guarantees: every op once, in a dependency-respecting order; each rank's F/B order is
the input's; its peak (in the units of the memory deltas) is at most ``caps[r]``
when the input's is (a W is forced before a forward that would exceed it: the level
with no W pending is the input's own level minus its pending W's).

When every time is an exact binary fraction (durations and latency multiples of 2⁻²⁰:
unit costs, halves), the greedy is run up to cuts one period apart on the skeleton's
periodic range until a rank state repeats shifted by the period's time; the periods up
to the end of that range are then written at once (:func:`_skip_steady`, with the
argument why the result is the plain greedy's). The greedy's per-op loop runs in C where
:mod:`pipeoffload._engine` is built (:meth:`_Refill.run`: the same decisions and floats,
tests/test_engine_c_loops.py), else in Python; no torch.
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from operator import countOf, itemgetter
from typing import Callable, Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement, Schedule, build_schedule
from ..native import c_engine
from ..passes.timing import _NOT_PLACED as _UNPLACED
from ..passes.timing import B_CODE, CODE_KIND, KIND_CODE, W_CODE
from ..passes.steady_timing import (PeriodicOrders, _exact, _first_period, _index, _period_range, inputs_from,
                                    inside_range, op_slots)
from .zb_auto import Infeasible, Tracker

_KIND = itemgetter(0)  #: an op tuple's kind

__all__ = ["refill_weights", "refill_tracker", "refill_both", "refill_periodic"]


def refill_weights(schedule: Schedule, costs: Costs, memory: MemoryDeltas, caps: Sequence[float],
                   partial: bool = True) -> Schedule:
    """``schedule`` with its W's re-placed (module docstring); ``caps``: per-rank memory
    caps. Raises :class:`.zb_auto.Infeasible` if a rank cannot keep its cap.

    Cost: O(p·v·m), one greedy placement of every op (the periodic steady state shifted
    instead where that is exact: :func:`refill_both`)."""
    pl, m = schedule.placement, schedule.num_microbatches
    orders = [[(o.kind, o.stage, o.microbatch) for o in lst] for lst in schedule.ranks]
    tr = refill_tracker(pl, m, orders, costs, memory, caps, partial)
    return build_schedule(schedule.name, m, pl, tr.order, **schedule.params)


def refill_tracker(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
                   costs: Costs, memory: MemoryDeltas, caps: Sequence[float], partial: bool = True) -> Tracker:
    """:func:`refill_weights` on per-rank ``(kind, layer group, microbatch)`` orders (of
    ``m`` microbatches on ``placement``): the tracker that placed the result, whose
    ``order`` is the new orders and whose times (``max_span()``, ``makespan()``) are
    those the timing pass gives them (the same engine and ``costs``). Raises
    :class:`.zb_auto.Infeasible` as :func:`refill_weights`."""
    return _refill(placement, m, orders, costs, memory, caps, partial, [False]).tr


def refill_both(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
                costs: Costs, memory: MemoryDeltas, caps: Sequence[float]) -> list[Tracker]:
    """:func:`refill_tracker` with ``partial`` True, then False, leaving out a run that
    raises :class:`.zb_auto.Infeasible`, and the second when the first never came to a
    partly idle gap with a W pending (the only decision ``partial`` changes: the second
    would be the same run, e.g. with unit costs).

    Cost: O(p·v·m) per run; with binary-fraction costs (unit costs, halves) the periodic
    steady state is shifted once proved (:func:`_skip_steady`): O(p²) ops placed for the
    V orders, plus O(p·v·m) list work in C."""
    return [run.tr for run in _refill_runs(placement, m, orders, costs, memory, caps, sum(map(len, orders)))]


def _refill_runs(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
                 costs: Costs, memory: MemoryDeltas, caps: Sequence[float], n_ops: int,
                 extra: int = 0) -> list[_Refill]:
    """:func:`refill_both`'s runs; ``n_ops`` the op count the exactness bound is checked
    for and ``extra`` the microbatches :func:`_skip_steady` checks as if there (both for
    :func:`refill_periodic`: the orders with the periods inserted; then a run that raises
    :class:`.zb_auto.Infeasible` raises it here, since where it stopped says nothing of
    the run on more microbatches)."""
    out = []
    consulted = [False]
    try:
        out.append(_refill(placement, m, orders, costs, memory, caps, True, consulted, n_ops, extra))
    except Infeasible:
        if extra:
            raise
        consulted[0] = True  # where it stopped is not known: run the second
    if consulted[0]:
        try:
            out.append(_refill(placement, m, orders, costs, memory, caps, False, [False], n_ops, extra))
        except Infeasible:
            if extra:
                raise
    return out


def refill_periodic(placement: Placement, m: int, cand: PeriodicOrders, costs: Costs, memory: MemoryDeltas,
                    caps: Sequence[float]) -> list[tuple[PeriodicOrders, float, float, float]]:
    """:func:`refill_both` of ``cand.expand()`` (``m`` microbatches), from the runs on
    ``cand.orders`` (``m' = m − cand.extra`` microbatches) where they prove theirs equal:
    each result's new orders (periodic again), longest span, makespan and highest level
    (``max(tr.peak)`` of :func:`refill_both`'s tracker: a level, not yet rounded).

    Why they are equal: as :func:`~pipeoffload.passes.steady_timing.periodic_figures`
    argues for the timing, with the refill's state (clocks, levels, pending W's) for the
    engine's: the run on the orders for ``m`` is the one on ``m'`` up to the cut where
    :func:`_skip_steady` proves its period (only ops below the skeleton's periodic range's
    end are placed: a search past it is refused), shifts ``Δ`` periods more and places the
    same cool-down ``Δ`` microbatches and ``Δ·T`` later — when every input a cool-down op
    (W's included) reads sits at or after its rank's checked period. The same decisions
    also set ``consulted`` the same way, so the same runs are made, and each rank's levels
    are the same (the shifted periods repeat the level at the cut, the cool-down's ops have
    the same deltas): the same highest level. Where a check fails
    (or the costs are not binary fractions, or a run raises Infeasible) :func:`refill_both` runs on
    the expanded orders.

    Cost: the refills on ``m'`` (O(p²) ops placed for the V orders, O(p·m') list work)."""
    if cand.extra:
        try:
            runs = _refill_runs(placement, m - cand.extra, cand.orders, costs, memory, caps, cand.n_ops(),
                                cand.extra)
        except Infeasible:
            runs = [None]
        out = [None if run is None else _stretched(run, cand) for run in runs]
        if None not in out:
            return out
    return [(PeriodicOrders.plain(tr.order), tr.max_span(), tr.makespan(), max(tr.peak))
            for tr in refill_both(placement, m, cand.expand(), costs, memory, caps)]


def _stretched(run: _Refill, cand: PeriodicOrders) -> tuple[PeriodicOrders, float, float, float] | None:
    """:func:`refill_periodic`'s result from a run on ``cand.orders``, or None when its
    checks fail."""
    if not run.skipped or run.searched or run.steady is None:
        return None
    tr, m = run.tr, run.tr.num_microbatches
    codes, ranges, periods = run.skeleton, run.ranges, run.periods
    for r, row in enumerate(cand.orders):  # the input's periods go in inside the skeleton's periodic range
        a, per = cand.at[r], cand.per[r]
        at_s = a - countOf(map(_KIND, row[:a]), OpKind.W)  # (the skeleton's indices: W's not counted)
        per_s = per - countOf(map(_KIND, row[a - per:a]), OpKind.W)
        if not inside_range(codes[r], ranges[r], periods[r], at_s, per_s, m):
            return None
    before, now, shift, n, low = run.steady
    per_out = [b - a for a, b in zip(before[4], now[4])]
    at_out = [b + n * c for b, c in zip(now[4], per_out)]
    S = tr.num_stages
    reading = [op_slots(o[a:], S, m, KIND_CODE) for o, a in zip(tr.order, at_out)]
    # _same_state compared every skeleton op's end from low[q] + P on with its copy's P back
    if not inputs_from(tr.deps, tr.rank_of, codes, reading, low, ranges, run.refs, periods, m):
        return None
    dT = cand.extra * shift
    last = [c + dT for c in tr.clock]
    return (PeriodicOrders(tr.order, at_out, per_out, cand.extra), max(c - f for c, f in zip(last, tr.first)),
            max(last) - min(tr.first), max(tr.peak))


def _refill(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
            costs: Costs, memory: MemoryDeltas, caps: Sequence[float], partial: bool,
            consulted: list[bool], n_ops: int | None = None, extra: int = 0) -> _Refill:
    """:func:`refill_tracker`'s run (its tracker ``.tr``); sets ``consulted[0]`` when a
    decision depended on ``partial``. The periodic steady state is shifted instead of
    placed when that is exact for ``n_ops`` ops (default: the orders'; :class:`_Refill`,
    :func:`_skip_steady`, whose checks go on as far as on ``extra`` more microbatches);
    the result is the same."""
    run = _Refill(placement, m, orders, costs, memory, caps, partial, consulted)
    run.extra = extra
    if _shiftable(run.tr, placement, costs, sum(map(len, orders)) if n_ops is None else n_ops):
        flag = consulted[0]
        try:
            run.skipped = _skip_steady(run)
        except Infeasible:  # placed in another rank order: start again, to fail as the plain run does
            consulted[0] = flag
            run = _Refill(placement, m, orders, costs, memory, caps, partial, consulted)
    run.pos = run.periodic = None
    run.lim = [len(s) for s in run.skeleton]
    run.run()
    if any(run.done[r] < len(run.skeleton[r]) for r in range(len(run.skeleton))):
        raise Infeasible("the skeleton deadlocks")
    run.put_pending()
    return run


class _Refill:
    """The refill's greedy (module docstring) as a resumable loop: each rank places its
    skeleton ops, W's put before them, up to a per-rank limit (``lim``); while
    ``pos`` is set, a rank stopped at its limit goes on to an op another rank waits
    for (:func:`_skip_steady` stops every rank at a cut to check it)."""

    def __init__(self, placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
                 costs: Costs, memory: MemoryDeltas, caps: Sequence[float], partial: bool,
                 consulted: list[bool]) -> None:
        tr = Tracker(placement, m, costs, memory, float("inf"))
        S, M = tr.num_stages, tr.num_microbatches
        # The new order reuses the input's op tuples (by slot of the tracker's end table): at
        # p = 128, m = 4096 a fresh tuple per op would be about 200 MB per run. The skeleton
        # is each rank's F/B ops by slot.
        ops_of: list = [None] * (3 * S * M)
        skeleton = []
        w_first = W_CODE * S * M  # the lowest W slot
        for lst in orders:
            slots = op_slots(lst, S, M, KIND_CODE)
            for x, op in zip(slots, lst):
                ops_of[x] = op
            skeleton.append([x for x in slots if x < w_first])
        self.tr, self.ops_of, self.skeleton, self.caps = tr, ops_of, skeleton, caps
        self.partial, self.consulted = partial, consulted
        self.put = _placer(tr, ops_of)
        #: per rank, its pending W's (layer group, microbatch), oldest first: lists (a few
        #: entries each), which the C loop reads and changes in place
        self.pending: list[list[tuple[int, int]]] = [[] for _ in skeleton]
        self.done = [0] * len(skeleton)
        self.lim = [len(row) for row in skeleton]
        self.blocked = [False] * len(skeleton)
        self.waiting: dict[int, list[int]] = {}
        #: While limited: each skeleton op's index on its rank by slot, so that a rank
        #: stopped at its limit goes on to an op another rank waits for.
        self.pos: Callable[[int], int] | None = None
        #: While ``pos`` is :func:`_skip_steady`'s: (skeleton, ranges, first periods, ops per
        #: period), from which the C loop finds an op in a periodic range itself (``pos`` is
        #: then asked only for the others: the same index)
        self.periodic: tuple | None = None
        self.skipped = 0  #: periods shifted (for the tests)
        #: Set by :func:`_skip_steady` when it shifts: the states at the two cuts, the
        #: period's time and the periods shifted; the skeleton's periodic ranges, first
        #: periods and ops per period; whether ``pos`` searched a rank's list (an op
        #: outside its periodic range).
        self.steady: tuple | None = None
        self.ranges: list[tuple[int, int]] = []
        self.refs: list = []
        self.periods: list[int] = []
        self.searched = False
        self.extra = 0  #: :func:`_skip_steady` checks as far as on this many more microbatches
        self.low: list[int] = []  #: per rank, from where _same_state found the skeleton periodic in time

    def run(self) -> bool:
        """Place every rank's ops up to its limit; whether each got there. Raises
        :class:`.zb_auto.Infeasible` when a rank cannot keep its cap. The loop runs in C where
        :mod:`pipeoffload._engine` is built and takes these inputs (``refill_run``: the same
        decisions, floats and state), else in Python (:meth:`_run_py`)."""
        engine = c_engine()
        loop = getattr(engine, "refill_run", None)
        if loop is not None:
            got = loop(self, self.tr, CODE_KIND)
            if type(got) is int:
                raise Infeasible(f"rank {got} cannot keep its cap {self.caps[got]:g}")
            if got is not None:
                return got
        return self._run_py()

    def put_pending(self) -> None:
        """Put each rank's pending W's after its last op, oldest first (the refill's end)."""
        for r, q in enumerate(self.pending):
            for stage, mb in q:
                self.put(W_CODE, stage, mb, r)
            q.clear()

    def _run_py(self) -> bool:
        """:meth:`run`'s loop in Python."""
        tr, put, skeleton, pending, caps, done, lim, waiting, blocked = (
            self.tr, self.put, self.skeleton, self.pending, self.caps, self.done, self.lim, self.waiting,
            self.blocked)
        S, M, deps, end, clock, origin = tr.num_stages, tr.num_microbatches, tr.deps, tr.end, tr.clock, tr.origin
        dur, mem, level, partial = tr.dur, tr.mem, tr.level, self.partial
        ready = deque(r for r in range(len(skeleton)) if not blocked[r] and done[r] < lim[r])
        while ready:
            r = ready.popleft()
            ops, pend, cap = skeleton[r], pending[r], caps[r]
            tol = 1e-9 * max(1.0, abs(cap))
            i, n = done[r], lim[r]
            blocked[r] = False
            while i < n:
                slot = ops[i]
                own, mb = divmod(slot, M)
                code, stage = divmod(own, S)
                missing, arrive = -1, origin  # tr.missing_input and tr.arrival, inline
                for base, latency in deps[own]:
                    e = end[base + mb]
                    if e == _UNPLACED:
                        missing = base + mb
                        break
                    e += latency
                    if e > arrive:
                        arrive = e
                if missing >= 0:
                    waiting.setdefault(missing, []).append(r)
                    blocked[r] = True
                    if self.pos is not None:  # limited: the rank that owes the op goes on to it
                        q, k = tr.rank_of[(missing // M) % S], self.pos(missing)
                        if q != r and k >= lim[q]:
                            if done[q] == lim[q] and not blocked[q]:
                                ready.append(q)
                            lim[q] = k + 1
                    break
                # Pending W's: those that end before the input arrives, one more for a partly
                # idle gap (partial), and those the op's memory needs.
                while pend and clock[r] + dur[pend[0][0]][W_CODE] <= arrive + 1e-12:
                    put(W_CODE, *pend.pop(0), r)
                if pend and clock[r] < arrive - 1e-12:
                    self.consulted[0] = True
                    if partial:
                        put(W_CODE, *pend.pop(0), r)
                while level[r] + mem[stage][code] > cap + tol:
                    if not pend:
                        raise Infeasible(f"rank {r} cannot keep its cap {cap:g}")
                    put(W_CODE, *pend.pop(0), r)
                put(code, stage, mb, r, arrive)
                if code == B_CODE:
                    pend.append((stage, mb))
                i += 1
                woken = waiting.pop(slot, None)
                if woken:
                    ready.extend(woken)
            done[r] = i
        return all(d == n for d, n in zip(done, lim))


def _shiftable(tr: Tracker, placement: Placement, costs: Costs, n_ops: int) -> bool:
    """Whether every time of the refill is an exact binary fraction (durations and the
    latency multiples of 2⁻²⁰, totals below 2³¹): then shifting a period by its time
    is exact, and the greedy's comparisons (with their 1e-12 slack) come out the same."""
    return _exact([d for row in tr.dur for d in row] + [costs.comm], n_ops)


def _skip_steady(run: _Refill) -> int:
    """Place the skeleton up to cuts one period apart until the state at a cut is the
    state one period before shifted (:func:`_same_state`), then write the periods up to
    the end of the periodic range at once (:func:`_shift_periods`). Returns the periods
    shifted (0: none; the caller places the rest).

    Why it is exact: a rank's decisions for its next skeleton op read only its clock,
    level and pending W's and the ends of the op's inputs. At the cut every rank's clock
    is ``T`` later than a period before, its level and pending W's (one microbatch on)
    the same, and every input end the next periods can read among the ops already placed
    is ``T`` after its copy a period before; the inputs of an op one microbatch on are
    its copy's one microbatch on. So the next period makes the same decisions shifted by
    ``T`` and ends in the same state shifted again, and by induction every period does
    while the skeleton and the inputs stay in the periodic ranges. With exact binary
    times (:func:`_shiftable`) a shift commutes with max, + and the 1e-12 comparisons."""
    tr, m = run.tr, run.tr.num_microbatches
    S = tr.num_stages
    codes = run.skeleton  # each rank's F/B slots
    periods = [len(c) // m if len(c) % m == 0 else 0 for c in codes]
    if not all(periods):
        return 0
    ranges = [_period_range(c, per) for c, per in zip(codes, periods)]
    refs = [_first_period(c, lo, per, m) for c, (lo, _), per in zip(codes, ranges, periods)]
    if None in refs:
        return 0
    run.ranges, run.refs, run.periods = ranges, refs, periods

    def pos(slot: int) -> int:
        """The index of skeleton op ``slot`` on its rank: by the period in the periodic
        range, else by a search (ValueError if absent)."""
        q = tr.rank_of[(slot // m) % S]
        k = _index(slot, codes[q], ranges[q], refs[q], m, periods[q])
        if k is None:
            k = codes[q].index(slot)
            run.searched |= k >= ranges[q][1]
        return k

    run.pos = pos
    run.periodic = (codes, ranges, refs, periods)
    run.lim = [lo + 2 * per for (lo, _), per in zip(ranges, periods)]
    before, fails = None, 0
    # Checked while at least half the periodic range is left to shift (past that the
    # checks would cost more than they can save).
    # (With run.extra, as a run on that many more microbatches checks: refill_periodic.)
    extra = run.extra
    while all(2 * (n + per) <= lo + hi + extra * per for n, per, (lo, hi) in zip(run.lim, periods, ranges)):
        if any(n + per > hi for n, per, (_, hi) in zip(run.lim, periods, ranges)):
            return 0  # (only with extra: no period is left to shift on these orders)
        if not run.run():
            return 0
        now = _state(run)
        if before is not None and all(a == b + per for a, b, per in zip(run.done, before[0], periods)):
            shift = _same_state(run, before, now, codes, periods, ranges, refs)
            n = min((hi - d) // per for d, per, (_, hi) in zip(run.done, periods, ranges))
            if shift is not None and n >= 1:
                _shift_periods(run, before, now, n, shift, periods)
                run.steady = (before, now, shift, n, run.low)
                return n
            fails += 1
            if fails >= 8:  # not steady yet: the next check a few periods on (fewer stops)
                before = None
                run.lim = [d + per * (fails // 8) for d, per in zip(run.done, periods)]
                continue
        before = now
        run.lim = [d + per for d, per in zip(run.done, periods)]
    return 0


def _state(run: _Refill) -> tuple:
    """What :func:`_same_state` compares: per rank the skeleton position, clock, level,
    pending W's, length of the new order and idle time."""
    tr = run.tr
    return (list(run.done), list(tr.clock), list(tr.level), [tuple(q) for q in run.pending],
            [len(o) for o in tr.order], list(tr.idle))


def _same_state(run: _Refill, before: tuple, now: tuple, codes: list[list[int]], periods: list[int],
                ranges: list[tuple[int, int]], refs: list) -> float | None:
    """The period's time ``T`` if the state ``now`` is ``before`` one period on
    (:func:`_skip_steady`), else None."""
    tr, m = run.tr, run.tr.num_microbatches
    shift = now[1][0] - before[1][0]
    if not shift > 0 or now[2] != before[2]:
        return None
    if any(b + shift != a for a, b in zip(now[1], before[1])):
        return None
    for a, b in zip(now[3], before[3]):
        if len(a) != len(b) or any(x[0] != y[0] or x[1] != y[1] + 1 for x, y in zip(a, b)):
            return None
    S, end = tr.num_stages, tr.end
    low = list(now[0])
    for r, row in enumerate(codes):
        for x in row[before[0][r]:now[0][r]]:
            own, mb = divmod(x, m)
            for base, _ in tr.deps[own]:
                y = base + mb
                q = tr.rank_of[(y // m) % S]
                k = _index(y, codes[q], ranges[q], refs[q], m, periods[q])
                if k is None:
                    return None
                if k < low[q]:
                    low[q] = k
    for q, row in enumerate(codes):
        if low[q] < ranges[q][0]:
            return None
        for x in row[low[q] + periods[q]:now[0][q]]:
            if end[x - 1] + shift != end[x]:
                return None
    run.low = low
    return shift


def _shift_periods(run: _Refill, before: tuple, now: tuple, n: int, shift: float, periods: list[int]) -> None:
    """Write ``n`` periods after the cut: each rank's ops of the last period, one to ``n``
    microbatches on (the input's op tuples), their ends ``k·T`` later; the clocks, idle
    times, pending W's and positions moved on."""
    tr, m = run.tr, run.tr.num_microbatches
    S, end, ops_of = tr.num_stages, tr.end, run.ops_of
    steps = [k * shift for k in range(1, n + 1)]
    for r, order in enumerate(tr.order):
        slots = op_slots(order[before[4][r]:now[4][r]], S, m, KIND_CODE)
        # period k is each slot's op k microbatches on: the columns' k-th entries, by zip
        order.extend(chain.from_iterable(zip(*[ops_of[x + 1:x + n + 1] for x in slots])))
        for x in slots:
            end[x + 1:x + n + 1] = list(map(end[x].__add__, steps))
        tr.clock[r] += n * shift
        tr.idle[r] += n * (now[5][r] - before[5][r])
        run.pending[r] = [(s, j + n) for s, j in run.pending[r]]
        run.done[r] += n * periods[r]


def _placer(tr: Tracker, ops_of: list) -> Callable[[int, int, int, int], None]:
    """``put(code, stage, mb, rank[, arrive])``: :meth:`Tracker.put` (no limit: the refill's tracker
    has none) with :meth:`ListScheduler.place` inline, for an op whose inputs are placed
    — the refill's hot path. Same times, levels, peaks, idle times and order (whose
    entries are ``ops_of[slot]``, the input's tuple of each op). ``arrive``, when given,
    must be the op's input arrival as :meth:`Tracker.arrival` computes it (the same max
    over the same ends in the same order): the refill's loop has just computed it."""
    S, M, deps, end, clock, origin = tr.num_stages, tr.num_microbatches, tr.deps, tr.end, tr.clock, tr.origin
    dur, mem, level, peak, idle, started, first, order = (
        tr.dur, tr.mem, tr.level, tr.peak, tr.idle, tr.started, tr.first, tr.order)

    def put(code: int, stage: int, mb: int, r: int, arrive: float | None = None) -> None:
        own = code * S + stage
        if arrive is None:
            t = origin
            for base, latency in deps[own]:
                e = end[base + mb] + latency
                if e > t:
                    t = e
        else:  # the caller's arrival of the op's inputs (placed: their ends do not change)
            t = arrive
        before = clock[r]
        if before > t:
            t = before
        end[own * M + mb] = clock[r] = t + dur[stage][code]
        if started[r]:
            idle[r] += t - before
        else:
            started[r] = True
            first[r] = t
        lv = level[r] + mem[stage][code]
        level[r] = lv
        if lv > peak[r]:
            peak[r] = lv
        op = ops_of[own * M + mb]
        order[r].append(op if op is not None else (CODE_KIND[code], stage, mb))

    return put
