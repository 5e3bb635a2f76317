"""ZB's memory-limited automatic scheduler ("ZB-1p", "ZB-2p"), and the op-placing
tracker that the zero-bubble greedy schedulers share. Pure Python.

The heuristic (docs/algorithms.md#26-automatic-zero-bubble-zb-auto, a reading of the ZB reference code, one layer
group per rank):

1. Warm-up: every stage runs as many forwards as fit under the memory limit before
   the first backward can arrive from the next stage, strictly fewer on each later
   stage.
2. Steady state: alternate F and B. Before each, run W's while memory is at the
   limit, and while a whole W fits into the idle gap before the op's input arrives;
   a partial gap may take one W when leaving it idle would make this stage the one
   with the most idle time (or always, in the "greedy filling" variant).
3. All remaining W's at the end.

A few tie-breaking variants run; the caller keeps the one with the shortest
longest-rank span (then the shortest makespan).
:class:`Tracker` times every op the moment it is placed with the timing pass's own
engine (:class:`pipeoffload.passes.timing.ListScheduler`: same dependencies, ``comm``
on cross-rank edges, same per-layer-group durations), so the greedy decisions see the
times the final schedule really has.
"""

from __future__ import annotations

from collections import deque
from functools import reduce
from itertools import accumulate, product
from operator import add, sub
from typing import NamedTuple, Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement
from ..passes.timing import _NOT_PLACED as _UNPLACED
from ..passes.timing import B_CODE, CODE_KIND, F_CODE, KIND_CODE, W_CODE, ListScheduler, _TABLE_KIND_INDEX, _own_of, _time_compact

_EPS = 1e-9

__all__ = [
    "F_CODE", "B_CODE", "W_CODE", "CODE_KIND", "Infeasible", "Tracker", "replay", "default_limit",
    "auto_variant", "auto_candidates", "lower_bounds", "VARIANTS",
]


_BW = OpKind.BW


class Infeasible(Exception):
    """A greedy variant cannot continue (memory limit, or a rule it cannot keep)."""


class _Pruned(Exception):
    """A greedy run stopped because its longest span is sure to end above a candidate's
    (:meth:`_AutoGreedy._beyond`): it cannot be the best."""


class Tracker(ListScheduler):
    """Places ops of a B/W-split schedule one at a time, each at the end of its
    rank's list and as early as its dependencies allow, and keeps the per-rank
    memory level, peak and idle time the greedy schedulers decide with.

    Ops are ``(code, stage, mb)`` as in :class:`~pipeoffload.passes.timing.ListScheduler`
    (code F_CODE, B_CODE or W_CODE). Guarantees: every op is timed by the timing
    pass's engine, so the times are those :func:`~pipeoffload.passes.timing.simulate`
    gives the finished order; a rank's memory level after each op is the running sum
    of its ops' deltas, which is exactly the timing pass's curve (ops on a rank never
    overlap), so ``peak`` is the peak the timeline reports; :meth:`put` raises
    :class:`Infeasible` rather than exceed ``limit`` or place an op whose input is
    missing.
    """

    __slots__ = ("p", "dur", "mem", "level", "peak", "idle", "started", "first", "order", "limit", "tol")

    def __init__(
        self, placement: Placement, m: int, costs: Costs, memory: MemoryDeltas, limit: float
    ) -> None:
        super().__init__(placement.stage_to_rank, m, costs.comm)
        self.p = placement.num_ranks
        dt, mt = costs.duration_table(placement), memory.delta_table(placement)
        #: Per layer group: (F, B, W) duration and memory delta, indexed by code.
        self.dur = [(d[OpKind.F], d[OpKind.B], d[OpKind.W]) for d in dt]
        self.mem = [(d[OpKind.F], d[OpKind.B], d[OpKind.W]) for d in mt]
        self.limit = limit
        #: Slack for float noise when comparing sums of deltas with the limit.
        self.tol = _EPS * max(1.0, abs(limit))
        self.level = [0.0] * self.p
        self.peak = [0.0] * self.p
        self.idle = [0.0] * self.p  #: idle time after the rank's first op
        self.started = [False] * self.p
        self.first = [0.0] * self.p  #: start of the rank's first op
        self.order: list[list[tuple[OpKind, int, int]]] = [[] for _ in range(self.p)]

    def _not_placed(self, code: int, stage: int, mb: int, what: str) -> None:
        raise Infeasible(f"{CODE_KIND[code]}(stage={stage}, mb={mb}) {what} not placed yet")

    def fits(self, stage: int, code: int, extra: float = 0.0) -> bool:
        """Whether op kind ``code`` of layer group ``stage`` (plus ``extra``) fits the limit now."""
        r = self.rank_of[stage]
        return self.level[r] + extra + self.mem[stage][code] <= self.limit + self.tol

    def put(self, code: int, stage: int, mb: int) -> float:
        """Append op ``(code, stage, mb)`` to its rank; return its end time. (The
        engine's :meth:`place` without a release time, inline: every greedy generator
        places each op through here.)"""
        r = self.rank_of[stage]
        delta = self.mem[stage][code]
        level = self.level
        if delta > 0 and not level[r] + delta <= self.limit + self.tol:
            raise Infeasible(f"rank {r} would exceed the memory limit")
        end = self.end
        own = code * self.num_stages + stage
        start = self.origin
        for base, latency in self.deps[own]:
            e = end[base + mb]
            if e == _UNPLACED:
                self._not_placed(code, stage, mb, "has an input that is")
            e += latency
            if e > start:
                start = e
        clock = self.clock
        before = clock[r]
        if before > start:
            start = before
        end[own * self.num_microbatches + mb] = clock[r] = e = start + self.dur[stage][code]
        if self.started[r]:
            self.idle[r] += start - before
        else:
            self.started[r] = True
            self.first[r] = start
        lv = level[r] + delta
        level[r] = lv
        if lv > self.peak[r]:
            self.peak[r] = lv
        self.order[r].append((CODE_KIND[code], stage, mb))
        return e

    # --- results ---------------------------------------------------------------
    def makespan(self) -> float:
        return max(self.clock) - min(self.first)

    def max_span(self) -> float:
        return max(c - f for c, f in zip(self.clock, self.first))

    def max_idle(self) -> float:
        return max(self.idle)


def replay(tracker: Tracker, per_rank: Sequence[Sequence[tuple[OpKind, int, int]]]) -> Tracker:
    """Place a fixed per-rank order into ``tracker`` (list scheduling, as the timing pass).

    Raises :class:`Infeasible` on deadlock or when the order breaks the memory limit.
    The ops must be tuples: the tracker's order keeps the caller's own F, B and W ops
    (:func:`_replay_lists`).
    """
    done = _replay_timed(tracker, per_rank)
    if done is None:
        placed = _replay_lists(tracker, per_rank)
        done = all(n >= len(ops) for n, ops in zip(placed, per_rank))
    if not done:
        raise Infeasible("the order deadlocks")
    return tracker


def _replay_timed(tr: Tracker, per_rank: Sequence[Sequence[tuple[OpKind, int, int]]]) -> bool | None:
    """:func:`_replay_lists` through the timing pass's compact loop (in C where built), then
    each rank's levels, peak, idle time, first start and order from its op list: the same
    floats (each rank's ops run in its list's order, so its sums are the same sums in the
    same order). Whether every op was placed; raises :class:`Infeasible` where
    :func:`_replay_lists` would for the memory limit. None (nothing changed) where that is
    not shown to be exact — a tracker already used, an op off its list's rank or of another
    kind, a negative limit, a NaN cost: :func:`_replay_lists` runs then.

    On a deadlock or over the limit the tracker's state differs from :func:`_replay_lists`'
    (which stops partway); :func:`replay` raises then and its callers drop the tracker."""
    S, rank_of, index = tr.num_stages, tr.rank_of, _TABLE_KIND_INDEX
    p = len(per_rank)
    cap = tr.limit + tr.tol
    if p > tr.p or any(tr.started) or any(tr.order) or not cap >= 0.0:
        return None
    try:
        tis = [[index[k] * S + s for k, s, _ in ops] for ops in per_rank]
        mbs = [[j for _, _, j in ops] for ops in per_rank]
    except (KeyError, TypeError, ValueError):
        return None
    for r, t in enumerate(tis):  # every op of list r on rank r, every address in the engine's table
        if t and not (min(t) >= 0 and max(t) < 4 * S and min(mbs[r]) >= 0 and max(mbs[r]) < tr.num_microbatches
                      and all(rank_of[k % S] == r for k in set(t))):
            return None
    # Per table index (kind index · S + stage, a BW as its B, as Tracker.put times and counts it)
    dur_of = [d[c] for c in (F_CODE, B_CODE, W_CODE, B_CODE) for d in tr.dur]
    mem_of = [d[c] for c in (F_CODE, B_CODE, W_CODE, B_CODE) for d in tr.mem]
    if any(x != x for x in dur_of + mem_of):
        return None
    starts, ends, placed = _time_compact(tr, tis, mbs, _own_of(S), dur_of)
    if placed < sum(map(len, tis)):
        return False
    level, peak, idle, started, first, order = tr.level, tr.peak, tr.idle, tr.started, tr.first, tr.order
    for r, (t, st, en, ops) in enumerate(zip(tis, starts, ends, per_rank)):
        if not t:
            continue
        levels = list(accumulate(map(mem_of.__getitem__, t), initial=0.0))
        top = max(levels)
        if top > cap:  # reached at a positive delta (the limit is ≥ 0): Tracker.put refuses it
            raise Infeasible(f"rank {r} would exceed the memory limit")
        level[r], peak[r] = levels[-1], top
        idle[r] = reduce(add, map(sub, st[1:], en[:-1]), 0.0)
        started[r], first[r] = True, st[0]
        order[r] = [op if op[0] is not _BW else (OpKind.B, op[1], op[2]) for op in ops] \
            if any(op[0] is _BW for op in ops) else list(ops)
    return True


def _replay_lists(tr: Tracker, per_rank: Sequence[Sequence[tuple[OpKind, int, int]]]) -> list[int]:
    """:func:`~pipeoffload.passes.timing.place_rank_lists` calling :meth:`Tracker.put`,
    both inline in one loop (each op's inputs visited once: checked and timed at once).
    Same placements, times, levels, peaks, idle times and orders; raises
    :class:`Infeasible` where :meth:`Tracker.put` would. Returns how many ops of each rank
    were placed. Cost: O(number of ops).

    The ops are read as given (``(kind, stage, mb)``, no list of engine codes made first)
    and an F, B or W op goes into the tracker's order as the caller's own tuple, which
    equals the ``(CODE_KIND[code], stage, mb)`` that :meth:`Tracker.put` appends (a BW is
    appended as that B, as there); a kind outside the engine's raises KeyError as before,
    though now when it is reached."""
    S, M, deps, end, clock, origin = tr.num_stages, tr.num_microbatches, tr.deps, tr.end, tr.clock, tr.origin
    dur, mem, level, peak, idle, started, first, order = (
        tr.dur, tr.mem, tr.level, tr.peak, tr.idle, tr.started, tr.first, tr.order)
    rank_of, cap, unplaced = tr.rank_of, tr.limit + tr.tol, _UNPLACED
    # Per kind: its engine code and whether the op tuple is the one Tracker.put appends
    code_of = {kind: (code, CODE_KIND[code] is kind) for kind, code in KIND_CODE.items()}
    done = [0] * len(per_rank)
    waiting: dict[int, list[int]] = {}
    ready = deque(range(len(per_rank)))
    while ready:
        r = ready.popleft()
        ops = per_rank[r]
        i, n = done[r], len(ops)
        while i < n:
            op = ops[i]
            kind, stage, mb = op
            code, same = code_of[kind]
            own = code * S + stage
            t, missing = origin, -1
            for base, latency in deps[own]:
                e = end[base + mb]
                if e == unplaced:
                    missing = base + mb
                    break
                e += latency
                if e > t:
                    t = e
            if missing >= 0:
                waiting.setdefault(missing, []).append(r)
                break
            q = rank_of[stage]
            delta = mem[stage][code]
            if delta > 0 and not level[q] + delta <= cap:
                raise Infeasible(f"rank {q} would exceed the memory limit")
            before = clock[q]
            if before > t:
                t = before
            slot = own * M + mb
            end[slot] = clock[q] = t + dur[stage][code]
            if started[q]:
                idle[q] += t - before
            else:
                started[q] = True
                first[q] = t
            lv = level[q] + delta
            level[q] = lv
            if lv > peak[q]:
                peak[q] = lv
            order[q].append(op if same else (CODE_KIND[code], stage, mb))
            i += 1
            woken = waiting.pop(slot, None)
            if woken:
                ready.extend(woken)
        done[r] = i
    return done


def lower_bounds(tracker: Tracker, pl: Placement, m: int) -> tuple[float, float]:
    """(longest span, makespan) no order of ``m`` microbatches on a loop or V placement ``pl``
    goes below with ``tracker``'s durations and hop: the busiest rank's compute, and the
    latest end of a rank's compute started as early as its first forward's inputs allow (the
    forwards of the layer groups on the ranks before it, one hop each)."""
    dur, comm = tracker.dur, tracker.comm
    busy = [m * sum(sum(dur[s]) for s in pl.stages_of(r)) for r in range(pl.num_ranks)]
    reach = end = 0.0
    for r in range(pl.num_ranks):
        end = max(end, reach + busy[r])
        reach += dur[pl.stages_of(r)[0]][0] + comm
    return max(busy), end


def default_limit(placement: Placement, memory: MemoryDeltas) -> float:
    """1F1B's peak: ``p`` whole-stage forwards (the largest rank's, when deltas vary)."""
    per_rank = [0.0] * placement.num_ranks
    for s, d in enumerate(memory.delta_table(placement)):
        per_rank[placement.rank_of(s)] += d[OpKind.F]
    return placement.num_ranks * max(per_rank)


def auto_variant(
    p: int,
    m: int,
    costs: Costs,
    memory: MemoryDeltas,
    limit: float,
    allow_bubble_before_first_b: bool,
    prioritize_b: bool,
    greedy_fill: bool,
) -> Tracker:
    """One run of the heuristic (loop placement, one layer group per rank).

    Raises :class:`Infeasible` when this variant cannot respect ``limit``.
    """
    variant = (allow_bubble_before_first_b, prioritize_b, greedy_fill)
    return _AutoGreedy(p, m, costs, memory, limit, variant).run()


class _RoundState(NamedTuple):
    """A greedy run's state at the start of a steady round (:meth:`_AutoGreedy._state`)."""

    round: int
    lengths: list[int]  #: ops placed per rank
    clock: list[float]
    level: list[float]
    peak: list[float]
    idle: list[float]
    started: list[bool]
    first: list[float]
    placed: tuple[list[int], list[int], list[int]]  #: F, B, W placed per stage
    consulted: frozenset[int]


class _AutoGreedy:
    """The state of one run of the heuristic: the tracker and, per stage (= rank),
    how many F, B and W it has placed."""

    __slots__ = (
        "p", "m", "limit", "tracker", "allow_bubble_before_first_b", "prioritize_b", "greedy_fill",
        "dur_f", "dur_b", "dur_w", "mem_f", "mem_w", "placed", "n_f", "n_b", "n_w", "clock", "idle", "consulted",
        "exhausted", "checkpoint",
    )

    def __init__(self, p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float,
                 variant: tuple[bool, bool, bool]) -> None:
        """``variant``: one of :data:`VARIANTS`, see :func:`auto_variant`."""
        allow_bubble_before_first_b, prioritize_b, greedy_fill = variant
        self.p, self.m, self.limit = p, m, limit
        self.tracker = tr = Tracker(Placement.loop(p, 1), m, costs, memory, limit)
        self.allow_bubble_before_first_b = allow_bubble_before_first_b
        self.prioritize_b = prioritize_b
        self.greedy_fill = greedy_fill
        self.dur_f = [d[F_CODE] for d in tr.dur]
        self.dur_b = [d[B_CODE] for d in tr.dur]
        self.dur_w = [d[W_CODE] for d in tr.dur]
        self.mem_f = [d[F_CODE] for d in tr.mem]
        self.mem_w = [d[W_CODE] for d in tr.mem]
        #: Ops placed so far per stage, by code (F, B, W).
        self.placed = self.n_f, self.n_b, self.n_w = [0] * p, [0] * p, [0] * p
        self.clock, self.idle = tr.clock, tr.idle
        #: The variant flags (indices into the variant) whose value this run's decisions
        #: depended on; a variant differing only in the others makes the same run.
        self.consulted: set[int] = set()
        #: Whether a decision so far read ``m`` and went the way a larger m would not
        #: (:meth:`_more`): until then the run is the same run for every larger m.
        self.exhausted = False
        #: The state at the start of the last steady round begun before that (None before
        #: the first): a run for a larger m may start there (:meth:`run`).
        self.checkpoint: _RoundState | None = None

    def run(self, resume: tuple[_RoundState, Tracker] | None = None, bound: float | None = None) -> Tracker:
        """The whole run; with ``resume`` (a :attr:`checkpoint` of a run of the same inputs
        and variant for fewer microbatches, and that run's tracker) from that round on: the
        same tracker, float for float, since every decision before it is the same for both m.
        With ``bound``: raises :class:`_Pruned` after a steady round from which the run's
        longest span is sure to end above ``bound`` (:meth:`_beyond`)."""
        if resume is None:
            self._first_iteration()
            first_round = 1
        else:
            first_round = self._restore(*resume)
        for k in range(first_round, self.m):
            if not self.exhausted:
                self.checkpoint = self._state(k)
            self._steady_round()
            if bound is not None and self._beyond(bound):
                raise _Pruned
        self.exhausted = True
        n_w = self.n_w
        for j in range(self.p):
            while n_w[j] < self.m:
                self._put(j, W_CODE)
        return self.tracker

    def _beyond(self, bound: float) -> bool:
        """Whether some started rank's span is sure to end above ``bound``: its clock only
        grows, by at least each op still to run on it (the rank runs one op at a time), so
        its last end is at least clock + those durations, less the rounding of ≤ 3m float
        additions (< 1e-9 relative for m < 10⁶; the ``1 − 1e-9`` factor covers it), and
        the span, that end minus its fixed first start, is then above ``bound``.
        Cost: O(p)."""
        m, tr = self.m, self.tracker
        first, started = tr.first, tr.started
        for r, c in enumerate(self.clock):
            if started[r]:
                left = (m - self.n_f[r]) * self.dur_f[r] + (m - self.n_b[r]) * self.dur_b[r] + \
                    (m - self.n_w[r]) * self.dur_w[r]
                if (c + left) * (1 - 1e-9) - first[r] > bound:
                    return True
        return False

    # --- placing ------------------------------------------------------------------
    def _put(self, stage: int, code: int) -> None:
        counts = self.placed[code]
        self.tracker.put(code, stage, counts[stage])
        counts[stage] += 1

    def _more(self, n: int) -> bool:
        """``n < m``; the first False marks the run :attr:`exhausted` (for any larger m it
        would be True: every other decision reads no m, so the runs part here)."""
        if n < self.m:
            return True
        self.exhausted = True
        return False

    def _state(self, k: int) -> _RoundState:
        """The state at the start of steady round ``k`` (O(p): the op lists are kept by
        their lengths, the end table by the tracker's later values, which never change)."""
        tr = self.tracker
        return _RoundState(k, [len(o) for o in tr.order], tr.clock[:], tr.level[:], tr.peak[:], tr.idle[:],
                           tr.started[:], tr.first[:], tuple(c[:] for c in self.placed), frozenset(self.consulted))

    def _restore(self, state: _RoundState, prior: Tracker) -> int:
        """Set this run to ``state`` of a run on ``prior`` (fewer microbatches, the same inputs
        otherwise); returns the round to go on with. Cost: O(ops placed by then)."""
        tr = self.tracker
        S, M, M0, end, end0 = tr.num_stages, tr.num_microbatches, prior.num_microbatches, tr.end, prior.end
        for r, n in enumerate(state.lengths):
            ops = tr.order[r] = prior.order[r][:n]
            for kind, stage, mb in ops:  # the end table's slots, re-indexed for M microbatches
                own = KIND_CODE[kind] * S + stage
                end[own * M + mb] = end0[own * M0 + mb]
        for mine, theirs in ((tr.clock, state.clock), (tr.level, state.level), (tr.peak, state.peak),
                             (tr.idle, state.idle), (tr.started, state.started), (tr.first, state.first)):
            mine[:] = theirs  # in place: self.clock and self.idle are these lists
        for mine, theirs in zip(self.placed, state.placed):
            mine[:] = theirs
        self.consulted = set(state.consulted)
        return state.round

    def _make_room(self, stage: int, code: int) -> None:
        """W's forced by the memory limit (W frees what B left)."""
        tr, n_b, n_w = self.tracker, self.n_b, self.n_w
        level, r, need, cap = tr.level, tr.rank_of[stage], tr.mem[stage][code], tr.limit + tr.tol
        while not level[r] + need <= cap:  # not tr.fits(stage, code), inline: called ~ 1.2 times per op
            if n_w[stage] >= n_b[stage] or tr.mem[stage][W_CODE] >= 0:
                raise Infeasible(f"stage {stage} cannot fit the memory limit")
            self._put(stage, W_CODE)

    def _fill_gap(self, stage: int, arrive: float) -> None:
        """Whole W's that end before the input arrives, then maybe one partial W."""
        n_b, n_w, clock, idle = self.n_b, self.n_w, self.clock, self.idle
        dur_w = self.dur_w[stage]
        while n_w[stage] < n_b[stage] and clock[stage] + dur_w <= arrive:
            self._put(stage, W_CODE)
        if n_w[stage] < n_b[stage] and clock[stage] < arrive:
            if arrive - clock[stage] <= max(idle) - idle[stage]:
                self.consulted.add(2)
                if self.greedy_fill:
                    self._put(stage, W_CODE)
            else:
                self._put(stage, W_CODE)

    # --- iteration 0 --------------------------------------------------------------
    def _first_iteration(self) -> None:
        """The first forward everywhere, the warm-up forwards, the first B's."""
        p = self.p
        for j in range(p):
            self._put(j, F_CODE)
        warmup = self._warmup_forwards()
        for j in range(p):
            for _ in range(warmup[j]):
                self._make_room(j, F_CODE)
                self._put(j, F_CODE)
        for j in range(p - 1, -1, -1):
            self._make_room(j, B_CODE)
            self._put(j, B_CODE)

    def _warmup_forwards(self) -> list[int]:
        """How many more forwards each stage runs before its first B: as many as fit
        the limit before that B's input can arrive, strictly fewer on each later stage."""
        p, tr = self.p, self.tracker
        n_f = self.n_f
        limit, tol, comm = self.limit, tr.tol, tr.comm
        extra = [0] * p
        last_t = tr.end_of(F_CODE, p - 1, 0) + self.dur_b[p - 1]
        for j in range(p - 2, -1, -1):
            level, t = tr.level[j], tr.clock[j]
            while self._more(n_f[j] + extra[j]) and level + self.mem_f[j] <= limit + tol:
                if (t + self.dur_f[j] > last_t + comm) != (t >= last_t + comm):
                    self.consulted.add(0)  # the two warm-up rules part here
                if self.allow_bubble_before_first_b:
                    if t + self.dur_f[j] > last_t + comm:
                        break
                elif t >= last_t + comm:
                    break
                level += self.mem_f[j]
                t += self.dur_f[j]
                extra[j] += 1
            last_t = max(t, last_t + comm) + self.dur_b[j]
        for j in range(1, p):  # strictly fewer warm-up forwards on each later stage
            extra[j] = min(extra[j], extra[j - 1])  # (never more: its inputs come from j−1)
            while extra[j] > 0 and extra[j] >= extra[j - 1] and self._more(n_f[j] + extra[j]):
                extra[j] -= 1
        return extra

    # --- steady state -------------------------------------------------------------
    def _steady_round(self) -> None:
        """One F (where the heuristic wants it) and one B per stage."""
        p, tr, comm = self.p, self.tracker, self.tracker.comm
        n_f, n_b = self.n_f, self.n_b
        worst = max(self.idle)
        wanted = [self._forward_wanted(j, worst) for j in range(p)]
        for j in range(p - 2, -1, -1):
            wanted[j] = min(wanted[j], wanted[j + 1])
        for j in range(p):
            if not wanted[j]:
                continue
            self._make_room(j, F_CODE)
            if j > 0:
                self._fill_gap(j, tr.end_of(F_CODE, j - 1, n_f[j]) + comm)
            self._make_room(j, F_CODE)
            self._put(j, F_CODE)
        for j in range(p - 1, -1, -1):
            if n_b[j] >= n_f[j]:
                raise Infeasible(f"stage {j} has no forward for its next backward")
            self._make_room(j, B_CODE)
            if j + 1 < p:
                self._fill_gap(j, tr.end_of(B_CODE, j + 1, n_b[j]) + comm)
            if j == 0 and n_f[0] == self.m:  # n_f[0] ≤ m: never so for a larger m
                self.exhausted = True
                self._drain_weights(0)
            self._make_room(j, B_CODE)
            self._put(j, B_CODE)

    def _forward_wanted(self, j: int, worst: float) -> int:
        """1 if stage ``j`` runs a forward this round, else 0. With ``prioritize_b``, a
        stage far ahead of the next one skips it unless it is free."""
        n_f, n_b, n_w = self.n_f, self.n_b, self.n_w
        if not self._more(n_f[j]):
            return 0
        if j + 1 < self.p and n_f[j] >= n_f[j + 1] + 2:
            self.consulted.add(1)
        if not (self.prioritize_b and j + 1 < self.p and n_f[j] >= n_f[j + 1] + 2):
            return 1
        tr = self.tracker
        clock, limit = tr.clock, self.limit + tr.tol
        nxt = clock[j + 1] + self.dur_f[j + 1] + self.dur_b[j + 1] + tr.comm
        if clock[j] >= nxt:
            return 0
        w_cost, cnt, level = 0.0, 0, tr.level[j] + self.mem_f[j]
        while level > limit and n_w[j] + cnt < n_b[j]:
            w_cost += self.dur_w[j]
            level += self.mem_w[j]
            cnt += 1
        if clock[j] + self.dur_f[j] + w_cost <= nxt:
            return 1
        return 0 if nxt - clock[j] <= worst - tr.idle[j] else 1

    def _drain_weights(self, stage: int) -> None:
        """Every W whose B has run."""
        n_b, n_w = self.n_b, self.n_w
        while n_w[stage] < n_b[stage]:
            self._put(stage, W_CODE)


#: Tie-breaking variants: (allow bubble before first B, prefer B over F, greedy filling).
VARIANTS: Sequence[tuple[bool, bool, bool]] = tuple(product((True, False), repeat=3))


def auto_candidates(
    p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float, bound: float | None = None
) -> list[Tracker]:
    """Every variant of the heuristic that respects ``limit`` (possibly none), in the
    order of :data:`VARIANTS`; with ``bound`` (the longest span of a candidate the caller
    keeps), those of them that can still be the shortest by longest span.

    A run records which of its variant's flags its decisions consulted; a later variant
    that differs from a finished run only in flags that run never consulted makes exactly
    the same decisions, so that run's tracker stands for it instead of a second run (the
    list is the same as running every variant; the same object may appear twice).

    With ``bound``, a run stops (is *pruned*) after a round from which its longest span is
    sure to end above ``bound`` or above a run's before it in this call
    (:meth:`_AutoGreedy._beyond`), and is left out: its (longest span, makespan) is above
    theirs, so it is never the first minimum of a list that holds them (zero_bubble's
    ``_best``). A later variant that agrees with a pruned run on the flags it had consulted
    makes the same decisions up to there, against a bound no higher: pruned too, not run.

    A run for ``m`` starts at the checkpoint of the last call's run of its variant when
    that call had the same inputs and fewer microbatches (:data:`_LAST_CALL`; the planner
    asks for ``m1`` and then ``m2``): no decision before that checkpoint read m
    (:meth:`_AutoGreedy._more`), so both runs make them alike, float for float (a pruned
    run's checkpoints are its state before it stopped: valid alike). The
    trackers returned must not be changed: the next call may start from their op lists
    and end tables (the callers only read them)."""
    out = []
    done: list[tuple[tuple[bool, bool, bool], _AutoGreedy]] = []
    pruned: list[tuple[tuple[bool, bool, bool], _AutoGreedy]] = []
    runs: dict[tuple[bool, bool, bool], _AutoGreedy] = {}  # per variant, the run made or standing for it
    key: tuple | None = None
    for variant in VARIANTS:
        same = next((g for v, g in done if all(v[i] == variant[i] for i in g.consulted)), None)
        if same is not None:
            runs[variant] = same
            out.append(same.tracker)
            continue
        same = next((g for v, g in pruned if all(v[i] == variant[i] for i in g.consulted)), None)
        if same is not None:
            runs[variant] = same
            continue
        greedy = runs[variant] = _AutoGreedy(p, m, costs, memory, limit, variant)
        key = key or _inputs(greedy.tracker)
        try:
            greedy.run(_resume_point(key, m, variant), bound)
        except _Pruned:
            pruned.append((variant, greedy))
            continue
        except Infeasible:
            continue
        done.append((variant, greedy))
        out.append(greedy.tracker)
        if bound is not None:
            bound = min(bound, greedy.tracker.max_span())
    _LAST_CALL[:] = [(key, m, runs)] if key is not None and 3 * p * m <= _KEEP_OPS else []
    return out


#: The last :func:`auto_candidates` call: its inputs (:func:`_inputs`), m, and per variant
#: the run that made (or stood for) it. One call only: the planner's ``m2`` follows its ``m1``.
_LAST_CALL: list[tuple[tuple, int, dict[tuple[bool, bool, bool], _AutoGreedy]]] = []
#: The most ops (3·p·m) of a call whose runs are kept for the next: the planner's calls up to
#: p = 64 have at most 3·64·193 (m2 = 3p + 1); a larger call (``pipeoffload simulate`` at
#: p = 64, m = 1024 kept 26 MB more at its peak) lets its trackers go when it returns, as before.
_KEEP_OPS = 1 << 16


def _inputs(tr: Tracker) -> tuple:
    """What a run reads besides m and its variant: p, the durations, deltas, hop and limit."""
    return tr.p, tuple(tr.dur), tuple(tr.mem), tr.comm, tr.limit


def _resume_point(key: tuple, m: int, variant: tuple[bool, bool, bool]) -> tuple[_RoundState, Tracker] | None:
    """Where a run of ``variant`` for ``m`` with inputs ``key`` may start: the checkpoint of
    the last call's run of that variant (or of the run that stood for it: the same
    decisions) when that call had the same inputs and fewer microbatches; else None."""
    if not _LAST_CALL:
        return None
    last_key, last_m, runs = _LAST_CALL[0]
    prior = runs.get(variant) if last_m < m and last_key == key else None
    if prior is None or prior.checkpoint is None:
        return None
    return prior.checkpoint, prior.tracker
