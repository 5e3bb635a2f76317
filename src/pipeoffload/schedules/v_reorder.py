"""The slot reorder of the CM reference runtime for V building blocks (docs/algorithms.md#28-the-building-block-method).

A second way from a V building block to per-rank orders, next to
:func:`.building_block.schedule_from_block`. It works on unit slots too, in three
passes over the repeated block, and never raises the highest per-rank peak:

1. every B's W goes to the first free slot after it; ops are then visited in slot
   order and each op of the warm-up (before rank 0's first chunk-0 backward) and of
   the cool-down (after the first last forward) moves to the earliest free slot after
   its inputs where the rank's memory stays under the highest peak; the grid is then
   squeezed (each op as early as its order and inputs allow, unit durations);
2. the W's are dropped and the cool-down alone is reordered the same way, W's being
   counted in the first free slots after their B's; squeezed again;
3. W's are put back, each chunk's in the first free slot after its B (chunk 1's
   first), and the slot order is the rank's op order.

The result differs from the other pipeline after the warm-up: on the steady state it
keeps the block's own rhythm, which wins for some unequal costs (V-Half at even p,
B ≠ F), while the other one wins elsewhere. The V generators build both and keep the
one with the shorter longest span for the costs at hand. The W placement's, the reorder's and the
squeeze's per-op loops run in C where :mod:`pipeoffload._engine` is built (the same slots,
tests/test_engine_c_loops.py), else in Python; no torch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterable
from itertools import compress, count, islice, repeat
from operator import ne, sub

from ..ir import OpKind, Placement
from ..native import c_engine
from .building_block import BuildingBlock, OpTable

#: Slot-list types per rank: chunk-0 forward, chunk-1 forward, chunk-1 backward,
#: chunk-0 backward, then W's (one list, or chunk 1's and chunk 0's).
_F0, _F1, _B1, _B0 = 0, 1, 2, 3
#: Memory change of each type in chunk units (W: −1).
_MEM = (1, 1, 0, 0, -1, -1)

Times = list[list[int]]  #: per type, the slot of each microbatch (increasing)


def full_orders(block: BuildingBlock, m: int, ops: OpTable | None = None) -> list[list[tuple[OpKind, int, int]]]:
    """:func:`.v_reorder_periods.reorder_orders` on all ``m`` microbatches (its passes run
    on every op; see there for the guarantees and the cost)."""
    pl = block.placement
    T = block.period
    grid = _repeated(block, m)
    grid = _squeeze(_reorder([_with_weights(r) for r in grid], m, with_w=True, period=T), T)
    grid = _reorder([r[:4] for r in grid], m, with_w=False, period=T)
    grid = _squeeze([_with_weights(r) for r in grid], T)
    grid = [_with_weights(r[:4], split=True) for r in grid]
    return [_lower(pl, i, rows, ops) for i, rows in enumerate(grid)]


def _repeated(block: BuildingBlock, m: int) -> list[Times]:
    """The block repeated ``m`` times as slot lists per rank (F, f, B, b)."""
    p, T = block.placement.num_ranks, block.period
    grid: list[Times] = []
    for i in range(p):
        c0, c1 = i, 2 * p - 1 - i
        row = [block.slots[(OpKind.F, c0)], block.slots[(OpKind.F, c1)],
               block.slots[(OpKind.B, c1)], block.slots[(OpKind.B, c0)]]
        grid.append([[x + T * j for j in range(m)] for x in row])
    return grid


def _with_weights(rows: Times, split: bool = False, probes: list[int] | None = None,
                  states: list[tuple[int, int, int]] | None = None) -> Times:
    """:func:`_with_weights_py`, in C where :mod:`pipeoffload._engine` is built (the same lists
    and states, tests/test_engine_c_loops.py)."""
    loop = getattr(c_engine(), "with_weights", None)
    if loop is not None and type(rows) is list and (probes is None or type(probes) is list):
        return loop(rows, split, probes, states)
    return _with_weights_py(rows, split, probes, states)


def _with_weights_py(rows: Times, split: bool = False, probes: list[int] | None = None,
                     states: list[tuple[int, int, int]] | None = None) -> Times:
    """``rows`` (F, f, B, b) plus W's, each in the first free slot after its backward;
    one W list, or (``split``) chunk 1's then chunk 0's (chunk 1's first when both wait).

    With ``probes`` (increasing slots) and ``states``, the scan's state as it reaches
    each probe (after every event before it, before the first one at or after it:
    W's waiting of chunk 1 or all, of chunk 0, and the last event's slot) is appended
    to ``states``, for :mod:`.v_reorder_periods`.

    Cost: O(n log n) in the rank's n ops: the free slots between two ops are handed to
    the waiting W's at once, not visited one by one."""
    taken = sorted([t * 8 + k for k in range(4) for t in rows[k]])
    out: Times = [list(r) for r in rows] + ([[], []] if split else [[]])
    w0, w1 = out[4], out[-1]
    wait0 = wait1 = 0  # W's waiting: chunk 1's (or all), chunk 0's
    prev = -1
    probe = iter(probes or ())
    at = next(probe, None)
    for e in taken:
        t, k = e >> 3, e & 7
        while at is not None and t >= at:
            states.append((wait0, wait1, prev))  # type: ignore[union-attr]
            at = next(probe, None)
        if wait0 or wait1:
            free = t - prev - 1  # slots prev+1 .. t-1, each runs one waiting W
            if free > 0:
                n = free if free < wait0 else wait0
                w0.extend(range(prev + 1, prev + 1 + n))
                wait0 -= n
                n1 = free - n if free - n < wait1 else wait1
                w1.extend(range(prev + 1 + n, prev + 1 + n + n1))
                wait1 -= n1
        if k == _B1 or (k == _B0 and not split):
            wait0 += 1
        elif k == _B0:
            wait1 += 1
        prev = t
    while at is not None:
        states.append((wait0, wait1, prev))  # type: ignore[union-attr]
        at = next(probe, None)
    w0.extend(range(prev + 1, prev + 1 + wait0))
    w1.extend(range(prev + 1 + wait0, prev + 1 + wait0 + wait1))
    return out


def _periodic_run(events: list[int], i: int, c: int, shift: int) -> int:
    """How many whole periods of ``c`` events after event ``i`` repeat the ``c`` up to it:
    the largest ``K`` with ``events[x] == events[x − c] + shift`` for every ``x`` in
    ``(i − c, i + K·c]``; 0 when the ``c`` up to ``i`` are not their copies. In C."""
    n = len(events)
    if any(events[x] - events[x - c] != shift for x in range(i - c + 1, i + 1)):
        return 0  # (checked first: the scan below starts by skipping i events)
    gaps = map(sub, islice(events, i - c + 1, None), islice(events, i - 2 * c + 1, None))
    end = next(compress(count(i - c + 1), map(ne, gaps, repeat(shift))), n)  # first x that is not its copy
    return max(0, (end - 1 - i) // c) if end > i else 0


def _peak(rows: Times) -> int:
    """Most chunk activations alive on a rank; without W lists, each W is counted in
    the first free slot after its backward.

    Cost: O(n log n) in the rank's n ops (one sort; the free slots between two ops are
    counted at once instead of visited one by one)."""
    events = sorted([t * 8 + k for k in range(len(rows)) for t in rows[k]])  # slot, then type
    implicit = len(rows) == 4
    level = peak = pending = 0
    prev = -1
    for e in events:
        t, k = e >> 3, e & 7
        if implicit and pending:
            free = t - prev - 1  # each free slot since the previous op runs one waiting W
            if free > 0:
                run = free if free < pending else pending
                level -= run
                pending -= run
        level += _MEM[k]
        if k == _B1 or k == _B0:
            pending += 1
        if level > peak:
            peak = level
        prev = t
    return peak


def _events_per_period(rows: Times) -> int:
    """Events of one period on a rank: each list's ops per microbatch (the one W list of
    both chunks holds two); 0 when the lists are not whole multiples of the first."""
    m = len(rows[0])
    if m == 0 or any(len(ts) % m for ts in rows):
        return 0
    return sum(len(ts) // m for ts in rows)


def _input_slots(grid: list[Times], r: int, k: int, j: int) -> list[int]:
    """Slots of the inputs of op (type ``k``, microbatch ``j``) on rank ``r``: the
    neighbour's op of the same type, the rank's previous type (the local chain), the
    same type's previous microbatch; a W, its backward (in backward order)."""
    p = len(grid)
    rows = grid[r]
    deps = []
    if k in (_F0, _B1) and r > 0:
        deps.append(grid[r - 1][k][j])
    if k in (_F1, _B0) and r + 1 < p:
        deps.append(grid[r + 1][k][j])
    if 0 < k < 4:
        deps.append(rows[k - 1][j])
    if k == 4:
        deps.append(_kth(rows[_B1], rows[_B0], j))
    if j > 0:
        deps.append(rows[k][j - 1])
    return deps


def _visits(grid: list[Times], m: int, with_w: bool) -> tuple[list[int], int, int, int | None]:
    """:func:`_reorder`'s visits in slot order, each op as one integer ``((slot·p + rank)·8 +
    type)·n + microbatch``; ``n``; ``t1``, the warm-up's end (rank 0's first chunk-0
    backward); ``t2``, the cool-down's first slot (the first chunk-0 forward of the last
    microbatch after ``t1`` in slot order), or None when there is none. The warm-up's ops
    (only ``with_w``) and the cool-down's are found by bisecting each type's slots."""
    p = len(grid)
    n = 1 + max((len(x) for rows in grid for x in rows), default=0)

    def key(t: int, r: int, k: int, j: int) -> int:  # slot order (slot, rank, type, microbatch) as one integer
        return ((t * p + r) * 8 + k) * n + j

    t1 = grid[0][_B0][0]
    e1 = key(t1, 0, _B0, 0)
    last_f = [key(grid[r][_F0][m - 1], r, _F0, m - 1) for r in range(p)]
    e2 = min((e for e in last_f if e > e1), default=None)
    t2, r2 = divmod(e2 // n >> 3, p) if e2 is not None else (0, 0)
    visit = []
    for r in range(p):
        for k in range(len(grid[r])):
            ts = grid[r][k]
            if with_w:
                visit.extend(key(ts[j], r, k, j) for j in range(bisect_left(ts, t1)))
            if e2 is not None:
                start = bisect_right(ts, t2) if r <= r2 else bisect_left(ts, t2)
                visit.extend(key(ts[j], r, k, j) for j in range(start, len(ts)))
    visit.sort()
    return visit, n, t1, t2 if e2 is not None else None


def _reorder(grid: list[Times], m: int, with_w: bool, period: int = 0,
             reads: dict[str, int] | None = None, levels: "list[_RankLevels] | None" = None) -> list[Times]:
    """Visit ops in slot order; move warm-up (only ``with_w``) and cool-down ops to the
    earliest free slot after their inputs that keeps every rank within the highest
    peak. In place; returns ``grid``.

    With ``reads``, records for :mod:`.v_reorder_periods`: ``t1`` (the warm-up's end),
    ``t2`` (the cool-down's first slot, or none), ``low`` (the earliest slot a cool-down
    visit reads: an input, a free slot, the event before a tried slot).

    The ops between the warm-up and the cool-down stay, so only theirs are visited
    (:func:`_visits`); a slot before the visited op is free when no op of its rank is
    there now (the ops not visited yet are all at later slots).

    ``levels``: each rank's :class:`_RankLevels` of ``grid`` (without W lists) if the caller
    made them (:func:`.v_reorder_periods._levels_repeat`), else made here; the cap is then
    their highest level, :func:`_peak`'s (the same running levels, from 0)."""
    if len(grid[0]) == 4:
        if levels is None:
            levels = [_RankLevels(rows, period) for rows in grid]
        cap = max(0, *(max(lv.level, default=0) for lv in levels))
    else:
        levels = None
        cap = max(_peak(r) for r in grid)
    p = len(grid)
    visit, n, t1, t2 = _visits(grid, m, with_w)
    loop = getattr(c_engine(), "reorder_visits", None)
    low: int | None = None
    if loop is not None:  # the loop below in C (the same moves, levels and reads)
        low = loop(grid, visit, n, t1, reads is not None, levels, cap)
    if low is NotImplemented or loop is None:
        if reads is not None:
            reads.update(t1=t1, t2=t2)
        _reorder_py(grid, p, visit, n, t1, reads, levels, cap)
    elif reads is not None:
        reads.update(t1=t1, t2=t2, low=low)
    if levels is not None and reads is not None:
        reads["low"] = min([reads["low"]] + [lv.low for lv in levels])
    return grid


def _reorder_py(grid: list[Times], p: int, visit: list[int], n: int, t1: int, reads: dict[str, int] | None,
                levels: "list[_RankLevels] | None", cap: int) -> None:
    """:func:`_reorder`'s loop over its visits in Python (``reads``: t1, t2 and low set by
    the caller's _visits; ``low`` recorded here)."""
    taken = [{t for ts in rows for t in ts} for rows in grid]  # every op's slot, kept up to date
    low = None
    if reads is not None:
        low = reads["low"] = _NO_READ
    for e in visit:
        e, j = divmod(e, n)
        k, e = e & 7, e >> 3
        t, r = divmod(e, p)
        rows, here = grid[r], taken[r]
        # Its inputs (_input_slots, inline: this loop runs once per warm-up and cool-down op):
        # the latest bounds where it may go, the earliest is what a cool-down visit reads.
        hi_dep, lo_dep = -1, t
        if k == _F0 or k == _B1:
            if r > 0:
                hi_dep = lo_dep = grid[r - 1][k][j]
        elif (k == _F1 or k == _B0) and r + 1 < p:
            hi_dep = lo_dep = grid[r + 1][k][j]
        if 0 < k < 4:
            u = rows[k - 1][j]
            if u > hi_dep:
                hi_dep = u
            if u < lo_dep:
                lo_dep = u
        elif k == 4:
            u = _kth(rows[_B1], rows[_B0], j)
            if u > hi_dep:
                hi_dep = u
            if u < lo_dep:
                lo_dep = u
        if j > 0:
            u = rows[k][j - 1]
            if u > hi_dep:
                hi_dep = u
            if u < lo_dep:
                lo_dep = u
        if low is not None and t >= t1 and lo_dep < low:  # a cool-down visit: what it reads
            low = reads["low"] = lo_dep  # type: ignore[index]
        if levels is None and _MEM[k] <= 0:
            # _first_fit's answer for an op that raises no level: the first free slot.
            q = hi_dep + 1
            while q < t and q in here:
                q += 1
        else:
            # The free slots between its inputs and it, made as far as the fit reads them.
            free = (q for q in range(hi_dep + 1, t) if q not in here)
            q = _first_fit(rows, k, j, t, free, cap) if levels is None else levels[r].first_fit(k, t, free, cap)
        if q != t:
            here.discard(t)
            here.add(q)
            rows[k][j] = q


#: ``low`` when nothing is read (no cool-down visit).
_NO_READ = 1 << 62


def _first_fit(rows: Times, k: int, j: int, t: int, free: Iterable[int], cap: int) -> int:
    """The first of ``free`` (slots before ``t``, increasing; a list or made lazily, read
    only as far as the answer) for op (``k``, ``j``), now at ``t``, that keeps the rank
    within ``cap`` (W's listed): a forward raises the level by one from its new slot up to
    ``t``, a backward changes nothing, a W lowers it; ``t`` when none does."""
    free = iter(free)
    lo = next(free, t)
    if lo >= t:
        return t
    if _MEM[k] <= 0:
        return lo
    # The level before slot lo and the changes in lo..t-1, from each type's sorted slots.
    level = rises = 0
    spans = []
    for kk in range(len(rows)):
        d = _MEM[kk]
        if d:
            ts = rows[kk]
            a = bisect_left(ts, lo)
            b = bisect_left(ts, t, a)
            level += d * a
            if d > 0:
                rises += b - a
            spans.append((ts, a, b, d))
    if level + rises < cap:
        return lo  # no level in lo..t-1 can reach the cap: the loop below would find none at it
    window = []
    for ts, a, b, d in spans:
        window.extend((u, d) for u in ts[a:b])
    # The level is constant between changes: find the last slot in lo..t-1 whose level
    # (after its change) is at the cap; the op fits at the first free slot after it.
    last_full = lo - 1
    start = lo
    for u, d in sorted(window):
        if level >= cap and u > start:
            last_full = u - 1
        level += d
        start = u
    if level >= cap and t > start:
        last_full = t - 1
    if lo > last_full:
        return lo
    return next((q for q in free if q > last_full), t)


def _kth(a: list[int], b: list[int], k: int) -> int:
    """The ``k``-th smallest (from 0) of the union of the increasing, disjoint lists
    ``a`` and ``b``: ``sorted(a + b)[k]`` by bisection, O(log n)."""
    lo, hi = max(0, k + 1 - len(b)), min(k + 1, len(a))  # how many of the first k+1 come from a
    while lo < hi:
        i = (lo + hi) // 2
        if a[i] < b[k - i]:
            lo = i + 1
        else:
            hi = i
    i = lo
    x = a[i - 1] if i > 0 else -1
    y = b[k - i] if k - i >= 0 else -1
    return x if x > y else y


class _RankLevels:
    """One rank's ops with W's counted implicitly (:func:`_peak`'s accounting), kept for
    :meth:`first_fit`: the events (``slot * 8 + type``, in slot order) and the level and
    pending W's after each. A move from slot ``t`` to ``q`` changes the levels only from
    ``q`` until they meet the old ones again (same level and pending W's after the same
    event: from there on every event sees the same state), so each candidate is checked
    and each move applied over that window only, not the whole rank.

    Invariant used: the rank's levels are within the cap before a move (the cap is the
    highest peak of the grid, and only moves that keep it are made)."""

    __slots__ = ("events", "level", "pending", "low")

    def __init__(self, rows: Times, period: int = 0) -> None:
        """``period`` (the block's, ``T``): where an event is its copy ``c`` events back
        (``c`` the events of one period: slot ``T`` later, same type) with the same level
        and pending W's after it, every later copy has its copy's state (:func:`_step`
        reads only these and the slot gap), so the copies' states are filled in by
        repeating the last period's (:func:`_periodic_run`); same levels. Cost: the sort,
        the Python steps of the warm-up and cool-down, and the copies made in C."""
        self.low = _NO_READ  #: earliest slot whose state a move read (the event before a tried slot)
        self.events = ev = sorted([t * 8 + k for k in range(4) for t in rows[k]])
        self.level, self.pending = lv, pd = [], []
        level = pending = 0
        prev = -1
        c = _events_per_period(rows) if period else 0
        i, n = 0, len(ev)
        while i < n:
            e = ev[i]
            level, pending = _step(e, level, pending, prev)
            lv.append(level)
            pd.append(pending)
            prev = e >> 3
            if c and i >= 2 * c and lv[i - c] == level and pd[i - c] == pending:
                K = _periodic_run(ev, i, c, 8 * period)
                if K:
                    lv.extend(lv[i - c + 1:i + 1] * K)
                    pd.extend(pd[i - c + 1:i + 1] * K)
                    i += c * K
                    prev = ev[i] >> 3
            i += 1

    def first_fit(self, k: int, t: int, free: Iterable[int], cap: int) -> int:
        """The first slot of ``free`` (increasing, before ``t``) where op type ``k``, now at
        ``t``, keeps every level of the rank within ``cap`` (:func:`_peak`'s check), moved
        there; ``t`` when none does."""
        for q in free:
            window = self._window(k, t, q, cap)
            if window is not None:
                a, b, states = window
                ev = self.events
                ev[a:b + 1] = [q * 8 + k] + ev[a:b]
                n = len(states)
                self.level[a:a + n] = [x for x, _ in states]
                self.pending[a:a + n] = [y for _, y in states]
                return q
        return t

    def _window(self, k: int, t: int, q: int, cap: int) -> tuple[int, int, list[tuple[int, int]]] | None:
        """Levels after the move of type ``k`` from ``t`` to ``q``, from the new event up to
        where they meet the old ones: ``(a, b, states)`` with ``a`` the new event's index,
        ``b`` the old one's (before the move), ``states`` (level, pending) of the events
        from ``a`` on; None when a level exceeds ``cap``."""
        ev, lv, pd = self.events, self.level, self.pending
        new, old = q * 8 + k, t * 8 + k
        a = bisect_left(ev, new)
        b = bisect_left(ev, old, a)
        if a > 0:
            level, pending, prev = lv[a - 1], pd[a - 1], ev[a - 1] >> 3
            if prev < self.low:
                self.low = prev
        else:
            level = pending = 0
            prev = -1
        states = []
        for e in [new] + ev[a:b]:
            level, pending = _step(e, level, pending, prev)
            if level > cap:
                return None
            states.append((level, pending))
            prev = e >> 3
        for i in range(b + 1, len(ev)):
            e = ev[i]
            level, pending = _step(e, level, pending, prev)
            if level > cap:
                return None
            states.append((level, pending))
            if level == lv[i] and pending == pd[i]:
                break
            prev = e >> 3
        return a, b, states


def _step(e: int, level: int, pending: int, prev: int) -> tuple[int, int]:
    """:func:`_peak`'s step: the free slots since ``prev`` run waiting W's, then event ``e``."""
    t, k = e >> 3, e & 7
    if pending:
        free = t - prev - 1
        if free > 0:
            run = free if free < pending else pending
            level -= run
            pending -= run
    level += _MEM[k]
    if k == _B1 or k == _B0:
        pending += 1
    return level, pending


def _squeeze(grid: list[Times], period: int = 0) -> list[Times]:
    """Each op as early as its rank's order and its inputs allow, unit durations.

    With ``period`` (the block's, ``T``), the scan skips what it proves periodic
    (:class:`_SqueezeSkip`): the same result. Cost: O(n log n) for the sort of the n ops;
    the scan is O(n) Python steps, or with ``period`` those of the warm-up, the first
    periods of the steady state and the cool-down (O(p²) for the V blocks) plus one slice
    write per op of a period."""
    p = len(grid)
    ntypes = len(grid[0])
    n = 1 + max((len(x) for rows in grid for x in rows), default=0)
    # Slot order as one integer per op (slot, rank, type, microbatch), sorted in C.
    slot_order = getattr(c_engine(), "slot_order", None)  # in C where built: the same list
    order = slot_order(grid, n) if slot_order is not None else \
        sorted([((t * p + r) * 8 + k) * n + j for r in range(p) for k in range(ntypes)
                for j, t in enumerate(grid[r][k])])
    out = [[[0] * len(grid[r][k]) for k in range(ntypes)] for r in range(p)]
    last = [0] * p
    skip = _SqueezeSkip(grid, order, out, last, period, n) if period else None
    x = 0
    run = getattr(c_engine(), "squeeze_run", _squeeze_run)  # in C where built: the same slots
    while x < len(order):
        x = run(order, x, out, last, n, skip)
    return out


def _squeeze_run(order: list[int], x: int, out: list[Times], last: list[int], n: int,
                 skip: "_SqueezeSkip | None") -> int:
    """:func:`_squeeze`'s scan from position ``x`` of ``order``: to the end, or (with
    ``skip``) to the end of the periods it proves. Returns the position to go on from."""
    p = len(out)
    streak = 0
    check = 2 * skip.N if skip is not None else len(order)  # the streak first worth a look: two periods
    # An op's end is its new slot + 1; each input is placed before it (earlier in slot order).
    for x in range(x, len(order)):
        key = order[x]
        e, j = divmod(key, n)
        k, r = e & 7, (e >> 3) % p
        t = last[r]
        rows = out[r]
        if k == _F0 or k == _B1:
            if r > 0:
                u = out[r - 1][k][j] + 1
                if u > t:
                    t = u
        elif k == _F1 or k == _B0:
            if r + 1 < p:
                u = out[r + 1][k][j] + 1
                if u > t:
                    t = u
        if 0 < k < 4:
            u = rows[k - 1][j] + 1
            if u > t:
                t = u
        if j > 0:
            u = rows[k][j - 1] + 1
            if u > t:
                t = u
        if skip is not None:
            # The op is its copy one period on (same place in the slot order) and so is its slot.
            c = skip.mult[k]
            if j >= c and t == rows[k][j - c] + skip.T and x >= skip.N and order[x - skip.N] == key - skip.D[k]:
                streak += 1
            else:
                streak, check = 0, 2 * skip.N
        rows[k][j] = t
        last[r] = t + 1
        if streak >= check:
            to, need = skip.skip(x + 1, streak)
            if to > x + 1:
                return to
            # Not proved here: try again once the streak covers what the next ops read.
            check = max(need, streak + skip.N)
    return len(order)


class _SqueezeSkip:
    """The periodic steady state of :func:`_squeeze`'s scan.

    In the slot order, position ``x`` is the copy of ``x − N`` (``N`` the ops of one
    period: each rank's types once) when its key is that one's plus ``D`` (slot ``T``
    later, microbatch one higher). An op's new slot is the largest of its rank's clock
    (its rank's previous op's slot + 1) and its inputs' slots + 1. Suppose that at a cut
    ``c``: every position from the earliest one read by the ops of ``[c, c + N)`` (their
    inputs and each rank's previous op) up to ``c`` is its copy's with a new slot ``T``
    later (the scan counts such a streak as it goes), and from there up to ``R`` every
    position is its copy's. Then by induction over the positions from ``c`` to ``R``, an
    op's rank's previous op and inputs are the copies' (the slot order repeats), so each
    new slot is its copy's plus ``T``: those periods are written at once (each op of the
    last period before the cut, its copies ``T`` apart, one slice) and the scan goes on
    from ``R``. When the check fails the scan just goes on; the result is the plain one."""

    def __init__(self, grid: list[Times], order: list[int], out: list[Times], last: list[int], period: int,
                 n: int) -> None:
        p = len(grid)
        self.grid, self.order, self.out, self.last, self.n = grid, order, out, last, n
        #: Ops of each type per period (the W list of both chunks: 2); a copy is that many microbatches on.
        self.mult = [len(ts) // max(1, len(grid[0][0])) for ts in grid[0]]
        self.T, self.N = period, p * sum(self.mult)
        self.D = [period * p * 8 * n + c for c in self.mult]
        self.skipped = 0  #: ops written by shifting (for the tests)

    def _decode(self, key: int) -> tuple[int, int, int, int]:
        """(slot, rank, type, microbatch) of a key."""
        e, j = divmod(key, self.n)
        t, r = divmod(e >> 3, len(self.grid))
        return t, r, e & 7, j

    def _position(self, r: int, k: int, j: int) -> int:
        """Position in the slot order of op (type ``k``, microbatch ``j``) on rank ``r``."""
        p, n = len(self.grid), self.n
        return bisect_left(self.order, ((self.grid[r][k][j] * p + r) * 8 + k) * n + j)

    def _reads(self, c: int) -> int:
        """The earliest position the ops of ``[c, c + N)`` read: inputs and, per rank, the
        op before the first of them."""
        p = len(self.grid)
        low = c
        seen: set[int] = set()
        for key in self.order[c:c + self.N]:
            _, r, k, j = self._decode(key)
            if r not in seen:
                seen.add(r)
                # The rank's previous op in slot order: the latest of its types before this one.
                for kk in range(len(self.grid[r])):
                    jj = bisect_left(self.grid[r][kk], self.grid[r][k][j]) - 1
                    if jj >= 0:
                        low = min(low, self._position(r, kk, jj))
            deps = []
            if (k == _F0 or k == _B1) and r > 0:
                deps.append((r - 1, k, j))
            elif (k == _F1 or k == _B0) and r + 1 < p:
                deps.append((r + 1, k, j))
            if 0 < k < 4:
                deps.append((r, k - 1, j))
            if j > 0:
                deps.append((r, k, j - 1))
            for d in deps:
                low = min(low, self._position(*d))
        return low

    def skip(self, c: int, streak: int) -> tuple[int, int]:
        """At cut ``c`` with the last ``streak`` positions each its copy shifted: the
        position to go on from (``c`` when nothing is proved) and the streak the proof
        needed (how far back the next period's ops read)."""
        order, N = self.order, self.N
        if c + N > len(order):
            return c, len(order)
        need = c - self._reads(c)
        if need > streak:
            return c, need
        # R: the first position from c that is not its copy's (or the end).
        D, n = self.D, self.n
        gaps = map(sub, islice(order, c, None), islice(order, c - N, None))
        wanted = map(lambda key: D[(key // n) & 7], islice(order, c, None))
        R = next(compress(count(c), map(ne, gaps, wanted)), len(order))
        if R < c + N:
            return c, len(order)
        T, out, last = self.T, self.out, self.last
        for y in range(c - N, c):
            _, r, k, j = self._decode(order[y])
            copies, step = (R - 1 - y) // N, self.mult[k]
            v = out[r][k][j]
            out[r][k][j + step:j + step * copies + 1:step] = range(v + T, v + T * copies + 1, T)
        for y in range(R - N, R):
            _, r, k, j = self._decode(order[y])
            if out[r][k][j] + 1 > last[r]:
                last[r] = out[r][k][j] + 1
        self.skipped += R - c
        return R, need


def _lower(pl: Placement, i: int, rows: Times, ops: OpTable | None = None) -> list[tuple[OpKind, int, int]]:
    """Rank ``i``'s ops in slot order (rows: F, f, B, b, W of chunk 1, W of chunk 0), as
    ``ops``' tuples when given."""
    p = pl.num_ranks
    c0, c1 = i, 2 * p - 1 - i
    what = [(OpKind.F, c0), (OpKind.F, c1), (OpKind.B, c1), (OpKind.B, c0), (OpKind.W, c1), (OpKind.W, c0)]
    n = 1 + max((len(ts) for ts in rows), default=0)
    loop = getattr(c_engine(), "slot_ordered", None)
    if ops is not None and loop is not None and type(rows) is list and len(rows) <= 8:  # in C where built
        return loop(rows, n, [ops[w] for w in what], [])[0]
    cells = sorted([(t * 8 + k) * n + j for k, ts in enumerate(rows) for j, t in enumerate(ts)])
    if ops is not None:
        table = [ops[w] for w in what]
        return [table[e // n & 7][e % n] for e in cells]
    out = []
    for e in cells:
        e, j = divmod(e, n)
        kind, stage = what[e & 7]
        out.append((kind, stage, j))
    return out
