"""ZB's memory-limited automatic scheduler ("ZB-1p", "ZB-2p"), and the op-placing
tracker that the zero-bubble greedy schedulers share. Pure Python.

The heuristic (ALGORITHMS.md §3, a reading of the ZB reference code, one layer
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
:class:`Tracker` times every op the moment it is placed, with the rules of
:func:`pipeoffload.passes.timing.simulate` (same dependencies, ``comm`` on
cross-rank edges, same per-layer-group durations), so the greedy decisions see the
times the final schedule really has.
"""

from __future__ import annotations

from itertools import product
from typing import Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement

#: Op kinds as small ints inside the greedy loops (speed).
KF, KB, KW = 0, 1, 2
KIND = (OpKind.F, OpKind.B, OpKind.W)
_EPS = 1e-9


class Infeasible(Exception):
    """A greedy variant cannot continue (memory limit, or a rule it cannot keep)."""


class Tracker:
    """Places ops of a B/W-split schedule one at a time, each at the end of its
    rank's list and as early as its dependencies allow.

    Dependencies (as the timing pass): ``F(s,j)`` after ``F(s−1,j)``; ``B(s,j)``
    after ``F(s,j)`` and ``B(s+1,j)``; ``W(s,j)`` after ``B(s,j)``; ``comm`` is added
    when the producer sits on another rank. Memory: a rank's level after each op is
    the running sum of its ops' deltas, which is exactly the timing pass's curve
    (ops on a rank never overlap), so ``peak`` is the peak the timeline reports.
    """

    __slots__ = (
        "p", "S", "m", "comm", "rank_of", "dur", "mem", "end", "clock", "level", "peak",
        "idle", "started", "first", "order", "limit", "tol", "deps",
    )

    def __init__(
        self, placement: Placement, m: int, costs: Costs, memory: MemoryDeltas, limit: float
    ) -> None:
        self.p, self.S, self.m = placement.num_ranks, placement.num_stages, m
        self.comm = costs.comm
        self.rank_of = list(placement.stage_to_rank)
        dt, mt = costs.duration_table(placement), memory.delta_table(placement)
        self.dur = [(d[OpKind.F], d[OpKind.B], d[OpKind.W]) for d in dt]
        self.mem = [(d[OpKind.F], d[OpKind.B], d[OpKind.W]) for d in mt]
        self.limit = limit
        #: Slack for float noise when comparing sums of deltas with the limit.
        self.tol = _EPS * max(1.0, abs(limit))
        n = 3 * self.S * m
        self.end = [-1.0] * n
        self.clock = [0.0] * self.p
        self.level = [0.0] * self.p
        self.peak = [0.0] * self.p
        self.idle = [0.0] * self.p  #: idle time after the rank's first op
        self.started = [False] * self.p
        self.first = [0.0] * self.p  #: start of the rank's first op
        self.order: list[list[tuple[OpKind, int, int]]] = [[] for _ in range(self.p)]
        #: Per op (k·S + s): its dependencies as (index base into ``end``, latency added).
        self.deps: list[tuple[tuple[int, float], ...]] = [
            tuple(
                ((dk * self.S + ds) * m, self.comm if self.rank_of[ds] != self.rank_of[s] else 0.0)
                for dk, ds in self._deps(k, s)
            )
            for k in range(3)
            for s in range(self.S)
        ]

    # --- lookups ---------------------------------------------------------------
    def done(self, k: int, s: int, j: int) -> bool:
        return self.end[(k * self.S + s) * self.m + j] >= 0.0

    def end_of(self, k: int, s: int, j: int) -> float:
        e = self.end[(k * self.S + s) * self.m + j]
        if e < 0.0:
            raise Infeasible(f"{KIND[k]}(stage={s}, mb={j}) not placed yet")
        return e

    def ready(self, k: int, s: int, j: int) -> bool:
        """Whether every dependency of op ``(k, s, j)`` has been placed."""
        end = self.end
        return all(end[base + j] >= 0.0 for base, _ in self.deps[k * self.S + s])

    def arrival(self, k: int, s: int, j: int) -> float:
        """When every input of op ``(k, s, j)`` is available on its rank."""
        t = 0.0
        end = self.end
        for base, lat in self.deps[k * self.S + s]:
            e = end[base + j]
            if e < 0.0:
                raise Infeasible(f"a dependency of {KIND[k]}(stage={s}, mb={j}) is not placed yet")
            e += lat
            if e > t:
                t = e
        return t

    def _deps(self, k: int, s: int) -> list[tuple[int, int]]:
        if k == KF:
            return [(KF, s - 1)] if s > 0 else []
        if k == KW:
            return [(KB, s)]
        return [(KF, s), (KB, s + 1)] if s < self.S - 1 else [(KF, s)]

    def fits(self, s: int, k: int, extra: float = 0.0) -> bool:
        r = self.rank_of[s]
        return self.level[r] + extra + self.mem[s][k] <= self.limit + self.tol

    # --- placing ---------------------------------------------------------------
    def put(self, k: int, s: int, j: int) -> float:
        """Append op ``(k, s, j)`` to its rank; return its end time."""
        r = self.rank_of[s]
        start = self.arrival(k, s, j)
        c = self.clock[r]
        if start < c:
            start = c
        elif self.started[r]:
            self.idle[r] += start - c
        if not self.started[r]:
            self.started[r] = True
            self.first[r] = start
        dm = self.mem[s][k]
        if dm > 0 and not self.fits(s, k):
            raise Infeasible(f"rank {r} would exceed the memory limit")
        e = start + self.dur[s][k]
        self.end[(k * self.S + s) * self.m + j] = e
        self.clock[r] = e
        lv = self.level[r] + dm
        self.level[r] = lv
        if lv > self.peak[r]:
            self.peak[r] = lv
        self.order[r].append((KIND[k], s, j))
        return e

    # --- results ---------------------------------------------------------------
    def makespan(self) -> float:
        return max(self.clock) - min(self.first)

    def max_span(self) -> float:
        return max(c - f for c, f in zip(self.clock, self.first))

    def max_idle(self) -> float:
        return max(self.idle)


def replay(tr: Tracker, per_rank: Sequence[Sequence[tuple[OpKind, int, int]]]) -> Tracker:
    """Place a fixed per-rank order into ``tr`` (list scheduling, as the timing pass).

    Raises :class:`Infeasible` on deadlock or when the order breaks the memory limit.
    """
    code = {OpKind.F: KF, OpKind.B: KB, OpKind.W: KW}
    lists = [[(code[k], s, j) for k, s, j in ops] for ops in per_rank]
    ptr = [0] * tr.p
    waiting: dict[int, list[int]] = {}
    ready = list(range(tr.p))
    S, m = tr.S, tr.m
    while ready:
        r = ready.pop()
        ops = lists[r]
        while ptr[r] < len(ops):
            k, s, j = ops[ptr[r]]
            missing = next((base + j for base, _ in tr.deps[k * S + s] if tr.end[base + j] < 0.0), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            tr.put(k, s, j)
            ptr[r] += 1
            ready.extend(waiting.pop((k * S + s) * m + j, ()))
    if any(ptr[r] < len(lists[r]) for r in range(tr.p)):
        raise Infeasible("the order deadlocks")
    return tr


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
    tr = Tracker(Placement.loop(p, 1), m, costs, memory, limit)
    dF = [d[KF] for d in tr.dur]
    dB = [d[KB] for d in tr.dur]
    dW = [d[KW] for d in tr.dur]
    mF = [d[KF] for d in tr.mem]
    mW = [d[KW] for d in tr.mem]
    comm = tr.comm
    f, b, w = [0] * p, [0] * p, [0] * p
    clock, idle = tr.clock, tr.idle
    tol = tr.tol

    def put(j: int, k: int) -> None:
        if k == KF:
            tr.put(KF, j, f[j])
            f[j] += 1
        elif k == KB:
            tr.put(KB, j, b[j])
            b[j] += 1
        else:
            tr.put(KW, j, w[j])
            w[j] += 1

    def make_room(j: int, k: int) -> None:
        # W's forced by the memory limit (W frees what B left).
        while not tr.fits(j, k):
            if w[j] >= b[j] or tr.mem[j][KW] >= 0:
                raise Infeasible(f"stage {j} cannot fit the memory limit")
            put(j, KW)

    def fill_gap(j: int, arrive: float) -> None:
        # Whole W's that end before the input arrives, then maybe one partial W.
        while w[j] < b[j] and clock[j] + dW[j] <= arrive:
            put(j, KW)
        if w[j] < b[j] and clock[j] < arrive:
            if arrive - clock[j] <= max(idle) - idle[j]:
                if greedy_fill:
                    put(j, KW)
            else:
                put(j, KW)

    # Iteration 0: the first forward everywhere, the warm-up forwards, the first B's.
    for j in range(p):
        put(j, KF)
    req = [0] * p
    last_t = tr.end_of(KF, p - 1, 0) + dB[p - 1]
    for j in range(p - 2, -1, -1):
        mem_j, cost = tr.level[j], clock[j]
        while f[j] + req[j] < m and mem_j + mF[j] <= limit + tol:
            if allow_bubble_before_first_b:
                if cost + dF[j] > last_t + comm:
                    break
            elif cost >= last_t + comm:
                break
            mem_j += mF[j]
            cost += dF[j]
            req[j] += 1
        last_t = max(cost, last_t + comm) + dB[j]
    for j in range(1, p):  # strictly fewer warm-up forwards on each later stage
        req[j] = min(req[j], req[j - 1])  # (never more: its inputs come from j−1)
        while req[j] > 0 and req[j] >= req[j - 1] and f[j] + req[j] < m:
            req[j] -= 1
    for j in range(p):
        for _ in range(req[j]):
            make_room(j, KF)
            put(j, KF)
    for j in range(p - 1, -1, -1):
        make_room(j, KB)
        put(j, KB)

    # Steady state: one F (where the heuristic wants it) and one B per stage.
    for i in range(1, m):
        req = [0] * p
        worst = max(idle)
        for j in range(p):
            if f[j] >= m:
                continue
            if prioritize_b and j + 1 < p and f[j] >= f[j + 1] + 2:
                # Far ahead of the next stage: skip this F unless it is free.
                nxt = clock[j + 1] + dF[j + 1] + dB[j + 1] + comm
                if clock[j] >= nxt:
                    continue
                w_cost, cnt, lv = 0.0, 0, tr.level[j] + mF[j]
                while lv > limit + tol and w[j] + cnt < b[j]:
                    w_cost += dW[j]
                    lv += mW[j]
                    cnt += 1
                if clock[j] + dF[j] + w_cost <= nxt:
                    req[j] = 1
                    continue
                if nxt - clock[j] <= worst - idle[j]:
                    continue
            req[j] = 1
        for j in range(p - 2, -1, -1):
            req[j] = min(req[j], req[j + 1])
        for j in range(p):
            if not req[j]:
                continue
            make_room(j, KF)
            if j > 0:
                fill_gap(j, tr.end_of(KF, j - 1, f[j]) + comm)
            make_room(j, KF)
            put(j, KF)
        for j in range(p - 1, -1, -1):
            if b[j] >= f[j]:
                raise Infeasible(f"stage {j} has no forward for its next backward")
            make_room(j, KB)
            if j + 1 < p:
                fill_gap(j, tr.end_of(KB, j + 1, b[j]) + comm)
            if j == 0 and f[0] == m:
                while w[0] < b[0]:
                    put(0, KW)
            make_room(j, KB)
            put(j, KB)

    for j in range(p):
        while w[j] < m:
            put(j, KW)
    return tr


#: Tie-breaking variants: (allow bubble before first B, prefer B over F, greedy filling).
VARIANTS: Sequence[tuple[bool, bool, bool]] = tuple(product((True, False), repeat=3))


def auto_candidates(
    p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float
) -> list[Tracker]:
    """Every variant of the heuristic that respects ``limit`` (possibly none)."""
    out = []
    for a, pb, g in VARIANTS:
        try:
            out.append(auto_variant(p, m, costs, memory, limit, a, pb, g))
        except Infeasible:
            continue
    return out
