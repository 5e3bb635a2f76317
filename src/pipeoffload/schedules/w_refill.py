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
with no W pending is the input's own level minus its pending W's). Pure Python.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement, Schedule, build_schedule
from ..passes.timing import _NOT_PLACED as _UNPLACED
from ..passes.timing import B_CODE, CODE_KIND, KIND_CODE, W_CODE
from .zb_auto import Infeasible, Tracker

__all__ = ["refill_weights", "refill_tracker", "refill_both"]


def refill_weights(schedule: Schedule, costs: Costs, memory: MemoryDeltas, caps: Sequence[float],
                   partial: bool = True) -> Schedule:
    """``schedule`` with its W's re-placed (module docstring); ``caps``: per-rank memory
    caps. Raises :class:`.zb_auto.Infeasible` if a rank cannot keep its cap.

    Cost: O(p·v·m), one greedy placement of every op."""
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
    return _refill(placement, m, orders, costs, memory, caps, partial, [False])


def refill_both(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
                costs: Costs, memory: MemoryDeltas, caps: Sequence[float]) -> list[Tracker]:
    """:func:`refill_tracker` with ``partial`` True, then False, leaving out a run that
    raises :class:`.zb_auto.Infeasible`, and the second when the first never came to a
    partly idle gap with a W pending (the only decision ``partial`` changes: the second
    would be the same run, e.g. with unit costs).

    Cost: O(p·v·m) per run."""
    out = []
    consulted = [False]
    try:
        out.append(_refill(placement, m, orders, costs, memory, caps, True, consulted))
    except Infeasible:
        consulted[0] = True  # where it stopped is not known: run the second
    if consulted[0]:
        try:
            out.append(_refill(placement, m, orders, costs, memory, caps, False, [False]))
        except Infeasible:
            pass
    return out


def _refill(placement: Placement, m: int, orders: Sequence[Sequence[tuple[OpKind, int, int]]],
            costs: Costs, memory: MemoryDeltas, caps: Sequence[float], partial: bool,
            consulted: list[bool]) -> Tracker:
    """:func:`refill_tracker`; sets ``consulted[0]`` when a decision depended on ``partial``."""
    tr = Tracker(placement, m, costs, memory, float("inf"))
    S, M = tr.num_stages, tr.num_microbatches
    # The new order reuses the input's op tuples (by slot of the tracker's end table): at
    # p = 128, m = 4096 a fresh tuple per op would be about 200 MB per run.
    ops_of: list = [None] * (3 * S * M)
    skeleton = []
    for lst in orders:
        row = []
        for op in lst:
            code = KIND_CODE[op[0]]
            ops_of[(code * S + op[1]) * M + op[2]] = op
            if code != W_CODE:
                row.append((code, op[1], op[2]))
        skeleton.append(row)
    put = _placer(tr, ops_of)
    S, M, deps, end, clock, origin = tr.num_stages, tr.num_microbatches, tr.deps, tr.end, tr.clock, tr.origin
    dur, mem, level = tr.dur, tr.mem, tr.level
    pending: list[deque] = [deque() for _ in skeleton]
    done = [0] * len(skeleton)
    waiting: dict[int, list[int]] = {}
    ready = deque(range(len(skeleton)))
    while ready:
        r = ready.popleft()
        ops, pend, cap = skeleton[r], pending[r], caps[r]
        tol = 1e-9 * max(1.0, abs(cap))
        i = done[r]
        while i < len(ops):
            code, stage, mb = ops[i]
            own = code * S + stage
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
                break
            # Pending W's: those that end before the input arrives, one more for a partly
            # idle gap (partial), and those the op's memory needs.
            while pend and clock[r] + dur[pend[0][0]][W_CODE] <= arrive + 1e-12:
                put(W_CODE, *pend.popleft(), r)
            if pend and clock[r] < arrive - 1e-12:
                consulted[0] = True
                if partial:
                    put(W_CODE, *pend.popleft(), r)
            while level[r] + mem[stage][code] > cap + tol:
                if not pend:
                    raise Infeasible(f"rank {r} cannot keep its cap {cap:g}")
                put(W_CODE, *pend.popleft(), r)
            put(code, stage, mb, r)
            if code == B_CODE:
                pend.append((stage, mb))
            i += 1
            woken = waiting.pop(own * M + mb, None)
            if woken:
                ready.extend(woken)
        done[r] = i
    if any(done[r] < len(skeleton[r]) for r in range(len(skeleton))):
        raise Infeasible("the skeleton deadlocks")
    for r, q in enumerate(pending):
        while q:
            put(W_CODE, *q.popleft(), r)
    return tr


def _placer(tr: Tracker, ops_of: list) -> Callable[[int, int, int, int], None]:
    """``put(code, stage, mb, rank)``: :meth:`Tracker.put` (no limit: the refill's tracker
    has none) with :meth:`ListScheduler.place` inline, for an op whose inputs are placed
    — the refill's hot path. Same times, levels, peaks, idle times and order (whose
    entries are ``ops_of[slot]``, the input's tuple of each op)."""
    S, M, deps, end, clock, origin = tr.num_stages, tr.num_microbatches, tr.deps, tr.end, tr.clock, tr.origin
    dur, mem, level, peak, idle, started, first, order = (
        tr.dur, tr.mem, tr.level, tr.peak, tr.idle, tr.started, tr.first, tr.order)

    def put(code: int, stage: int, mb: int, r: int) -> None:
        own = code * S + stage
        t = origin
        for base, latency in deps[own]:
            e = end[base + mb] + latency
            if e > t:
                t = e
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
