"""ZB-V greedy (ALGORITHMS.md §3): V placement, v = 2, 1F1B's memory. Pure Python.

Rank ``i`` holds layer groups ``i`` (chunk 0, the way down) and ``2p−1−i``
(chunk 1, the way back up); the loss is on rank 0 and the turn at rank ``p−1`` is
local. A reading of the ZB reference scheduler:

1. Warm-up: chunk-0 forwards as memory allows before the chunk-1 forward of the
   first microbatch arrives, then chunk-1 forwards interleaved so that every rank
   has at least as many forwards in flight as the next one.
2. Steady state, one backward and one forward per rank per round. Backward: a
   rank that has run as many chunk-0 as chunk-1 backwards takes the next chunk-1
   backward (first in backward order); otherwise the chunk-0 backward when its
   input gradient exists, else the chunk-1 one. Forward: chunk 1 when its input
   exists, else chunk 0. Before each op, W's fill the idle gap until its input
   arrives, or are forced by the memory limit.
3. The remaining W's at the end.

Variants (partial-gap filling before F and before B on or off, and re-runs that
allow each rank the idle time the previous run found) are all kept as candidates;
:func:`v_candidates` returns them, timed exactly by :class:`Tracker`.
"""

from __future__ import annotations

from collections import deque

from ..costs import Costs, MemoryDeltas
from ..ir import Placement
from .zb_auto import KB, KF, KW, Infeasible, Tracker

#: Re-runs with the previous run's idle times as allowances (the reference's
#: "approved bubble" loop), at most this many per variant.
MAX_RERUNS = 6


def v_variant(
    p: int,
    m: int,
    costs: Costs,
    memory: MemoryDeltas,
    limit: float,
    fill_f: bool,
    fill_b: bool,
    approved: list[float] | None = None,
) -> Tracker:
    """One greedy run. Raises :class:`Infeasible` if it cannot keep its rules."""
    tr = Tracker(Placement.vshape(p), m, costs, memory, limit)
    S = 2 * p
    s0 = list(range(p))  # chunk-0 layer group of each rank
    s1 = [S - 1 - i for i in range(p)]  # chunk-1 layer group
    nF = ([0] * p, [0] * p)  # forwards done per chunk
    nB = ([0] * p, [0] * p)  # backwards done per chunk
    pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
    clock, idle, dur = tr.clock, tr.idle, tr.dur
    app_max = max(approved) if approved else 0.0

    def allowance(i: int) -> float:
        worst = max(idle)
        if approved:
            worst = max(worst, app_max - approved[i])
        return worst - idle[i]

    def stage(i: int, c: int) -> int:
        return s1[i] if c else s0[i]

    def put_w(i: int) -> None:
        s, j = pending[i].popleft()
        tr.put(KW, s, j)

    def make_room(i: int, k: int, c: int) -> None:
        s = stage(i, c)
        while not tr.fits(s, k):
            if not pending[i]:
                raise Infeasible(f"rank {i} cannot fit the memory limit")
            put_w(i)

    def put_f(i: int, c: int) -> None:
        make_room(i, KF, c)
        tr.put(KF, stage(i, c), nF[c][i])
        nF[c][i] += 1

    def put_b(i: int, c: int) -> None:
        make_room(i, KB, c)
        s, j = stage(i, c), nB[c][i]
        tr.put(KB, s, j)
        nB[c][i] += 1
        pending[i].append((s, j))

    def fill(i: int, arrive: float, partial: bool) -> None:
        # Whole W's that fit before the input arrives; a partial one when the gap
        # exceeds this rank's idle allowance (always before a chunk-0 B, and
        # before others when the variant asks).
        while pending[i] and arrive >= clock[i] + dur[pending[i][0][0]][KW]:
            put_w(i)
        if pending[i] and arrive - clock[i] > allowance(i) and partial:
            put_w(i)

    def can_f(i: int, c: int) -> bool:
        j = nF[c][i]
        return j < m and tr.ready(KF, stage(i, c), j) and tr.fits(stage(i, c), KF)

    # 1. Warm-up: chunk-0 forwards until the first chunk-1 forward can arrive, then
    # chunk-1 forwards so that each rank has at least as many in flight as the next.
    # Forwards whose input or memory is missing are left to the steady state.
    for i in range(p):
        put_f(i, 0)
    for i in range(p - 1, -1, -1):
        if i < p - 1:
            arrive = tr.end_of(KF, s1[i + 1], 0) + tr.comm
            reserve = tr.mem[s0[i]][KF] * (2 + 2 * i)
            while nF[0][i] < m and tr.level[i] + reserve <= limit + tr.tol and clock[i] + dur[s0[i]][KF] <= arrive:
                before = nF[0][i]
                for j in range(i + 1):
                    if can_f(j, 0):
                        put_f(j, 0)
                if nF[0][i] == before:
                    break
        if can_f(i, 1):
            put_f(i, 1)
    chunk, idle_passes = 0, 0
    for i in range(1, p):
        while nF[0][i] + nF[1][i] < nF[0][i - 1] + nF[1][i - 1] or nF[1][i] <= nF[1][i - 1] < m:
            progressed = False
            for j in range(p - 1, i - 1, -1):
                if can_f(j, chunk):
                    put_f(j, chunk)
                    progressed = True
            chunk = 1 - chunk
            idle_passes = 0 if progressed else idle_passes + 1
            if idle_passes >= 2:
                break

    def b_ready(i: int, c: int) -> bool:
        j = nB[c][i]
        return j < m and tr.ready(KB, stage(i, c), j)

    # 2. Steady state: per round one backward, then one forward, on every rank.
    # (The reference runs exactly 2m lockstep rounds; here a rank whose preferred
    # backward cannot run yet takes the other chunk's, or sits the round out, so
    # unequal costs and memory deltas cannot break the rhythm.)
    rounds = 0
    while any(nB[0][i] + nB[1][i] < 2 * m for i in range(p)):
        rounds += 1
        if rounds > 4 * (m + p):
            raise Infeasible("steady state does not converge")
        progressed = False
        first, second = [], []  # ranks preferring the chunk-1 B / the chunk-0 B
        for i in range(p):
            if nB[0][i] >= nB[1][i]:
                first.append(i)
            elif i == p - 1 or nB[1][i] >= m or tr.done(KB, s0[i] + 1, nB[0][i]):
                second.append(i)
            else:
                first.append(i)
        for i, c in [(i, 0) for i in reversed(second)] + [(i, 1) for i in first]:
            if not b_ready(i, c):
                c = 1 - c
                if not b_ready(i, c):
                    continue
            make_room(i, KB, c)
            fill(i, tr.arrival(KB, stage(i, c), nB[c][i]), partial=(c == 0 or fill_b))
            put_b(i, c)
            progressed = True
        for i in range(p):
            # Chunk 1 when its input exists, else chunk 0 when its input exists.
            if nF[1][i] < nF[0][i] and tr.ready(KF, s1[i], nF[1][i]):
                c = 1
            elif nF[0][i] < m and tr.ready(KF, s0[i], nF[0][i]):
                c = 0
            else:
                continue
            if not pending[i] and not tr.fits(stage(i, c), KF):
                continue  # memory full until a backward runs
            make_room(i, KF, c)
            fill(i, tr.arrival(KF, stage(i, c), nF[c][i]), partial=fill_f)
            put_f(i, c)
            progressed = True
        if not progressed:
            raise Infeasible("no op can run")

    # 3. The remaining W's.
    for i in range(p):
        while pending[i]:
            put_w(i)
    return tr


def v_candidates(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> list[Tracker]:
    """All greedy runs that succeed (variants × re-runs with idle allowances)."""
    out: list[Tracker] = []
    for fill_b in (True, False):
        for fill_f in (True, False):
            approved: list[float] | None = None
            best = None
            for _ in range(MAX_RERUNS + 1):
                try:
                    tr = v_variant(p, m, costs, memory, limit, fill_f, fill_b, approved)
                except Infeasible:
                    break
                out.append(tr)
                bubble = tr.max_idle()
                if best is not None and bubble >= best:
                    break
                best = bubble
                approved = list(tr.idle)
    return out
