"""Hole filling: move a later op of a rank into an idle gap, timed with the real costs.

A generic pass for split-backward (F/B/W) schedules. The generators build their orders
from unit-cost rhythms (building blocks, hand orders, greedy rounds); with other costs or
a comm latency a rank often waits for an input while a later op of its own is already
runnable. The exact scheduler's orders (docs/solver.md) show the fix: run that op in the
gap. This pass does it, one move at a time:

1. time the order with the timing pass's engine (:class:`.zb_auto.Tracker`);
2. visit the idle gaps in time order; for the gap before op ``a`` of rank ``r``, try
   (a) the next :data:`WINDOW` ops of ``r`` whose inputs arrive before ``a`` starts, put
   just before ``a`` (those that fit the gap entirely first), then (b) the gap's *late
   input*: follow ``a``'s latest-arriving input back while each op starts the moment its
   input arrives; the first op that instead waited for its own rank moves up to
   :data:`WINDOW` places earlier there (while its input arrives before the op it passes
   ends). A move never passes an op of the same (kind, layer group) (microbatches stay in
   order) and keeps the rank's memory within its cap;
3. a move is kept when it makes the schedule strictly better by (longest rank span,
   makespan, sum of rank spans, sum of op ends), compared with a relative tolerance of
   1e-9; a late-input move that leaves the first two unchanged may chain up to
   :data:`CHAIN` more late-input moves (ranks often have to advance together) before it
   must pay off. After a kept move the scan restarts from that gap.

It stops when no gap has an improving move, or when the work (every trial counted as the
number of ops of the schedule, whatever its timing re-timed) would pass ``budget``: the
default, :data:`BUDGET`, allows about 16 trials at p = 16, m = 32 on the V placement
(3072 ops); it is enough for the p ≤ 6 grid of docs/solver.md.

A trial is timed incrementally (:meth:`_Search.retime`): a move to position ``k`` of a
rank cannot change any op that ends by the end ``T0`` of the op before ``k`` (with
positive durations, such an op's inputs and its rank's earlier ops end by ``T0`` too, and
none of them is the moved op or one after it, which end after ``T0``), so those ops keep
their times and only the others are placed again, by the same list scheduling — the same
times, float for float, as timing the whole trial (a test holds it to the full timing).

Guarantees: the result holds every op of the input once; each rank's memory level after
every op (the running sum of the deltas of ``memory``) stays within
``max(caps[r], the input's peak on r)``; the result is dependency-respecting
(deadlock-free, each (kind, layer group)'s microbatches in the input's order); its
longest rank span and makespan are never larger than the input's (only strictly better
orders are kept). Deterministic. Pure Python.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from typing import Sequence

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError
from ..ir import Placement, Schedule, build_schedule
from ..passes.timing import _NOT_PLACED, CODE_KIND, KIND_CODE
from .zb_auto import Infeasible, Tracker, replay

__all__ = ["fill_holes", "lex_better", "WINDOW", "CHAIN", "BUDGET"]

#: How many later ops of the rank are candidates for one gap.
WINDOW = 8
#: How many more late-input moves one trial may chain before it must pay off.
CHAIN = 4
#: Default work limit: each timing (the first and every trial) counts as every op of the schedule,
#: whatever it re-times (about 15 trials at p = 16, m = 32 on the V placement).
BUDGET = 50_000

Code = tuple[int, int, int]


def fill_holes(schedule: Schedule, costs: Costs, memory: MemoryDeltas, caps: Sequence[float],
               budget: int = BUDGET) -> Schedule:
    """``schedule`` with later ops moved into idle gaps (module docstring); ``caps``:
    per-rank memory caps in the units of ``memory``; ``budget``: the most work, each timing
    counted as every op of the schedule."""
    pl, m = schedule.placement, schedule.num_microbatches
    if len(caps) != pl.num_ranks:
        raise ParameterError("caps", f"needs one memory cap per rank ({pl.num_ranks}), got {len(caps)}")
    if not isinstance(budget, int) or budget < 0:
        raise ParameterError("budget", f"must be an integer >= 0, got {budget!r}")
    lists: list[list[Code]] = [[(KIND_CODE[o.kind], o.stage, o.microbatch) for o in ops] for ops in schedule.ranks]
    n_ops = sum(len(x) for x in lists)
    search = _Search(pl, m, costs, memory)
    try:
        tracker = search.time(lists)
    except Infeasible:
        raise ParameterError("schedule", "fill_holes needs a deadlock-free F/B/W schedule") from None
    caps = [max(float(c), pk) for c, pk in zip(caps, tracker.peak)]
    best = _Timing(tracker.end, tracker.clock, tracker.first)
    del tracker
    key = _key(best)
    work = [n_ops]  # ops timed so far (a list: the helpers below add to it)
    changed = False
    restart_at = 0.0
    while work[0] + n_ops <= budget:
        move = None
        for t, r, i in _gaps(search, best, lists, restart_at):
            a = lists[r][i]
            for rr, j, k in _moves(search, best, lists, r, i, caps):
                if work[0] + n_ops > budget:
                    break
                trial = list(lists)
                trial[rr] = _moved(lists[rr], j, k)
                move = _try(search, best, trial, (rr, k), a, key, caps, work, budget, CHAIN if rr != r else 0)
                if move is not None:
                    break
            if move is not None or work[0] + n_ops > budget:
                if move is not None:
                    move = move + (t,)
                break
        if move is None:
            break
        lists, best, key, restart_at = move
        changed = True
    if not changed:
        return schedule
    order = [[(CODE_KIND[c], s, j) for c, s, j in ops] for ops in lists]
    return build_schedule(schedule.name, m, pl, order, **schedule.params)


def _moved(ops: list[Code], j: int, k: int) -> list[Code]:
    """``ops`` with its op ``j`` moved to position ``k < j`` (a new list)."""
    return ops[:k] + [ops[j]] + ops[k:j] + ops[j + 1:]


def _try(search: "_Search", base: "_Timing", trial: list[list[Code]], moved: tuple[int, int], a: Code, key: tuple,
         caps: list[float], work: list[int], budget: int, chain: int):
    """Time ``trial`` (``base``'s orders with an op moved to position ``moved[1]`` of rank
    ``moved[0]``); (trial, timing, key) if strictly better than ``key``. Otherwise, if it is
    no worse in longest span and makespan, push the gap's late input again (up to ``chain``
    more moves: several ranks may have to advance together before a gap closes). None when
    nothing better was found. (The lists of ``trial`` are never changed in place: they may
    be shared with the current orders.)"""
    n_ops = sum(len(x) for x in trial)
    for _ in range(chain + 1):
        if work[0] + n_ops > budget:
            return None
        work[0] += n_ops
        tr = search.retime(base, trial, *moved)
        if tr is None:
            return None
        k2 = _key(tr)
        # Strictly better, and never a longer makespan: a shorter longest span alone could
        # still end the step later (v-half, p = 6, F:B:W = 5:2:7 did: 103 -> 103.5).
        if lex_better(k2, key) and not lex_better(key[1:2], k2[1:2]):
            return trial, tr, k2
        if lex_better(key[:2], k2[:2]):
            return None
        x = _late_input(search, tr, a)
        if x is None:
            return None
        rx = search.pl.rank_of(x[1])
        jx = trial[rx].index(x)
        slots = _earlier_slots(search, tr, trial[rx], jx, caps[rx])
        if not slots:
            return None
        trial = list(trial)
        trial[rx] = _moved(trial[rx], jx, slots[0])
        base, moved = tr, (rx, slots[0])
    return None


class _Timing:
    """A timing of per-rank orders, what the search reads of it: the end of every op (by
    :meth:`_Search.slot`), and per rank the end of its last op and the start of its first."""

    __slots__ = ("end", "clock", "first")

    def __init__(self, end: list[float], clock: list[float], first: list[float]) -> None:
        self.end, self.clock, self.first = end, clock, first


class _Search:
    """Timing of candidate orders (the timing pass's list scheduling, as
    :class:`.zb_auto.Tracker` places ops), with the tables the move tests need."""

    def __init__(self, pl: Placement, m: int, costs: Costs, memory: MemoryDeltas) -> None:
        self.pl, self.m, self.costs, self.memory = pl, m, costs, memory
        probe = Tracker(pl, m, costs, memory, float("inf"))
        self.dur, self.mem = probe.dur, probe.mem
        self.num_stages, self.deps, self.origin = probe.num_stages, probe.deps, probe.origin
        #: Whether a trial may re-time only the ops after its move (every duration > 0).
        self.incremental = min(min(d) for d in self.dur) > 0
        #: Trials timed incrementally, and the ops they placed again (the tests read them).
        self.retimed = [0, 0]

    def slot(self, op: Code) -> int:
        """Index of ``op`` in a timing's ``end``."""
        c, s, j = op
        return (c * self.num_stages + s) * self.m + j

    def time(self, lists: list[list[Code]]) -> Tracker:
        """The whole timing of ``lists``; raises :class:`Infeasible` if they deadlock."""
        ops = [[(CODE_KIND[c], s, j) for c, s, j in x] for x in lists]
        return replay(Tracker(self.pl, self.m, self.costs, self.memory, float("inf")), ops)

    def arrival(self, tr: _Timing, op: Code) -> float:
        """When every input of ``op`` is on its rank in ``tr``."""
        c, s, j = op
        t, end = self.origin, tr.end
        for base, latency in self.deps[c * self.num_stages + s]:
            e = end[base + j] + latency
            if e > t:
                t = e
        return t

    def retime(self, base: _Timing, lists: list[list[Code]], rank: int, k: int) -> _Timing | None:
        """The timing of ``lists``, which are ``base``'s orders except from position ``k`` of
        ``rank`` on (a move to ``k``), or None if they deadlock. Every op ending by ``T0``,
        the end of op ``k − 1`` of ``rank``, keeps its time (module docstring); the other
        ops are placed again in their ranks' orders. Equal to the whole timing, float for
        float (the list schedule's times do not depend on the order ranks are visited in)."""
        if k == 0 or not self.incremental:
            try:
                tr = self.time(lists)
            except Infeasible:
                return None
            return _Timing(tr.end, tr.clock, tr.first)
        S, M, slot = self.num_stages, self.m, self.slot
        old, clock, first = base.end, base.clock.copy(), base.first.copy()
        t0 = old[slot(lists[rank][k - 1])]
        # A fresh table holding the kept ops' ends (the cuts come early: most ops are placed
        # again, so copying the kept few beats unmarking the rest of a copy)
        end = [_NOT_PLACED] * len(old)
        cuts = []
        for q, ops in enumerate(lists):
            cut = k if q == rank else bisect_right(ops, t0, key=lambda op: old[(op[0] * S + op[1]) * M + op[2]])
            for c, s, j in ops[:cut]:
                at = (c * S + s) * M + j
                end[at] = old[at]
            clock[q] = end[slot(ops[cut - 1])] if cut else self.origin
            cuts.append(cut)
        self.retimed[0] += 1
        self.retimed[1] += sum(len(ops) for ops in lists) - sum(cuts)
        if not self._place_from(lists, cuts, end, clock, first):
            return None
        return _Timing(end, clock, first)

    def _place_from(self, lists: list[list[Code]], cuts: list[int], end: list[float], clock: list[float],
                    first: list[float]) -> bool:
        """Place each rank's ops from ``cuts[r]`` on, as early as their inputs and the rank
        allow (:func:`.zb_auto.replay`'s list scheduling, without its memory, idle and order
        records: rank by rank, a rank waiting for an input resumed when that input is placed);
        ``end``, ``clock`` and ``first`` are updated. False on a deadlock."""
        S, M, deps, dur, origin = self.num_stages, self.m, self.deps, self.dur, self.origin
        unplaced = _NOT_PLACED
        done = list(cuts)
        sizes = [len(ops) for ops in lists]
        waiting: dict[int, list[int]] = {}
        ready = deque(range(len(lists)))
        while ready:
            r = ready.popleft()
            ops = lists[r]
            i, n = done[r], sizes[r]
            while i < n:
                code, stage, mb = ops[i]
                own = code * S + stage
                t = origin
                for b, latency in deps[own]:
                    e = end[b + mb]
                    if e == unplaced:
                        waiting.setdefault(b + mb, []).append(r)
                        break
                    e += latency
                    if e > t:
                        t = e
                else:
                    if clock[r] > t:
                        t = clock[r]
                    if i == 0:
                        first[r] = t
                    slot = own * M + mb
                    end[slot] = clock[r] = t + dur[stage][code]
                    i += 1
                    woken = waiting.pop(slot, None)
                    if woken:
                        ready.extend(woken)
                    continue
                break
            done[r] = i
        return done == sizes


def _key(tr: _Timing) -> tuple[float, float, float, float]:
    spans = [c - f for c, f in zip(tr.clock, tr.first)]
    ends = sum(tr.end)  # every op is placed: the same sum, in slot order, as leaving out unplaced slots
    if ends == _NOT_PLACED:
        ends = sum(e for e in tr.end if e != _NOT_PLACED)
    return (max(spans), max(tr.clock) - min(tr.first), sum(spans), ends)


def lex_better(a: tuple[float, ...], b: tuple[float, ...] | None) -> bool:
    """``a`` before ``b`` lexicographically, each component equal within a relative 1e-9
    (``b`` None: no rival yet). The one comparison of schedule keys the generators share."""
    if b is None:
        return True
    for x, y in zip(a, b):
        eps = 1e-9 * max(1.0, abs(y))
        if x < y - eps:
            return True
        if x > y + eps:
            return False
    return False


def _start(search: _Search, tr: _Timing, op: Code) -> float:
    c, s, j = op
    return tr.end[search.slot(op)] - search.dur[s][c]


def _gaps(search: _Search, tr: _Timing, lists: list[list[Code]], since: float):
    """(gap start, rank, index of the op after the gap) for every idle gap that ends after
    ``since``, earliest first."""
    out = []
    S, M, dur, end = search.num_stages, search.m, search.dur, tr.end
    after = since + 1e-12
    for r, ops in enumerate(lists):
        prev_end = None
        for i, (c, s, j) in enumerate(ops):  # _start and slot, inline: the same floats
            en = end[(c * S + s) * M + j]
            st = en - dur[s][c]
            if prev_end is not None and st > prev_end + 1e-9 * max(1.0, st) and st > after:
                out.append((prev_end, r, i))
            prev_end = en
    out.sort()
    return out


def _moves(search: _Search, tr: _Timing, lists: list[list[Code]], r: int, i: int,
           caps: list[float]) -> list[tuple[int, int, int]]:
    """Moves ``(rank, from index, to index)`` for the gap before op ``i`` of rank ``r``:
    a later op of ``r`` into the gap (those that fit it first), then the gap's late
    input advanced on its own rank (module docstring, step 2)."""
    moves = [(r, j, i) for j in _into_gap(search, tr, lists[r], i, caps[r])]
    x = _late_input(search, tr, lists[r][i])
    if x is not None:
        rx = search.pl.rank_of(x[1])
        ops = lists[rx]
        jx = ops.index(x)
        moves += [(rx, jx, k) for k in _earlier_slots(search, tr, ops, jx, caps[rx])]
    return moves


def _late_input(search: _Search, tr: _Timing, op: Code) -> Code | None:
    """Follow the latest-arriving input back from ``op`` while each op starts exactly when
    its input arrives; the first op that waited for its own rank instead (it could run
    earlier if its rank ran it earlier), or None."""
    S, m = search.num_stages, search.m
    cur = op
    for _ in range(2 * S + 2):
        c, s, j = cur
        late, when = None, float("-inf")
        for base, lat in search.deps[c * S + s]:
            e = tr.end[base + j] + lat
            if e > when:
                late, when = base + j, e
        if late is None:
            return None
        code, rest = divmod(late, S * m)
        x = (code, rest // m, rest % m)
        if _start(search, tr, x) > search.arrival(tr, x) + 1e-9 * max(1.0, when):
            return x
        cur = x
    return None


def _earlier_slots(search: _Search, tr: _Timing, ops: list[Code], j: int, cap: float) -> list[int]:
    """Positions k < j (nearest first, at most WINDOW back) that op ``j`` may move to: it
    passes no op of its own (kind, layer group), its input arrives before op k ends (so
    it could run earlier; an op it depends on always ends before), and the rank's memory
    stays within ``cap``."""
    c, s, mb = ops[j]
    arrive = search.arrival(tr, ops[j])
    d = search.mem[s][c]
    levels = _levels(search, ops)
    tol = 1e-9 * max(1.0, abs(cap))
    out = []
    for k in range(j - 1, max(0, j - WINDOW) - 1, -1):
        ck, sk, _ = ops[k]
        if (ck, sk) == (c, s) or tr.end[search.slot(ops[k])] <= arrive + 1e-9 * max(1.0, arrive):
            break  # same (kind, group), or op k ends before op j's input is there (op k may be that input)
        before = levels[k - 1] if k > 0 else 0.0
        if d > 0 and max([before] + levels[k:j]) + d > cap + tol:
            break
        out.append(k)
    return out


def _levels(search: _Search, ops: list[Code]) -> list[float]:
    level, out = 0.0, []
    for c, s, _ in ops:
        level += search.mem[s][c]
        out.append(level)
    return out


def _into_gap(search: _Search, tr: _Timing, ops: list[Code], i: int, cap: float) -> list[int]:
    """Indices j > i of a rank's ops that may move to position ``i`` (module docstring,
    step 2), those that fit the gap first."""
    a_start = _start(search, tr, ops[i])
    gap_start = tr.end[search.slot(ops[i - 1])] if i > 0 else a_start
    levels = _levels(search, ops)
    before = levels[i - 1] if i > 0 else 0.0
    tol = 1e-9 * max(1.0, abs(cap))
    fit, rest = [], []
    passed: set[tuple[int, int]] = set()
    for j in range(i, min(len(ops), i + WINDOW + 1)):
        c, s, mb = ops[j]
        if j > i and (c, s) not in passed:
            arrive = search.arrival(tr, ops[j])
            d = search.mem[s][c]
            # Moving op j ahead raises the levels in between by its delta (if positive).
            if arrive < a_start - 1e-9 * max(1.0, a_start) and (
                    d <= 0 or max([before] + levels[i:j]) + d <= cap + tol):
                start = max(arrive, gap_start)
                (fit if start + search.dur[s][c] <= a_start + 1e-9 * max(1.0, a_start) else rest).append(j)
        passed.add((c, s))
    return fit + rest
