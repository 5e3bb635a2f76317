"""ZB-V greedy (docs/algorithms.md#27-zb-v): V placement, v = 2, 1F1B's memory. Pure Python.

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
from .zb_auto import B_CODE, F_CODE, W_CODE, Infeasible, Tracker

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
    """One greedy run: warm-up, steady state, remaining W's (module docstring).
    ``fill_f``/``fill_b``: fill partial gaps with a W before forwards / chunk-1
    backwards; ``approved``: per-rank idle allowances from a previous run. Raises
    :class:`Infeasible` if it cannot keep its rules."""
    return _GreedyRun(p, m, costs, memory, limit, approved).run(fill_f, fill_b)


class _GreedyRun:
    """The state of one greedy run: the tracker, each rank's forwards and backwards
    done per chunk, and its backwards whose W is still pending (oldest first)."""

    def __init__(self, p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float,
                 approved: list[float] | None) -> None:
        self.tracker = Tracker(Placement.vshape(p), m, costs, memory, limit)
        self.p, self.m, self.limit = p, m, limit
        self.down = list(range(p))  # chunk-0 layer group of each rank
        self.up = [2 * p - 1 - i for i in range(p)]  # chunk-1 layer group
        self.forwards = ([0] * p, [0] * p)  # forwards done per chunk and rank
        self.backwards = ([0] * p, [0] * p)  # backwards done per chunk and rank
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.approved = approved
        self.approved_max = max(approved) if approved else 0.0
        #: Whether a partial-gap decision ever depended on the fill_f / fill_b flag (a run
        #: of the other value then makes exactly the same decisions).
        self.consulted = [False, False]
        #: Whether a partial W was ever put because a gap exceeded the idle allowance: the
        #: only decision the allowance (hence a re-run's ``approved``) changes.
        self.allowance_used = False

    def run(self, fill_f: bool, fill_b: bool) -> Tracker:
        """Warm-up, steady state, remaining W's; raises :class:`Infeasible`."""
        self.warm_up()
        self.steady_state(fill_f, fill_b)
        self.drain_weights()
        return self.tracker

    # ------------------------------------------------------------------ primitives
    def stage(self, rank: int, chunk: int) -> int:
        return self.up[rank] if chunk else self.down[rank]

    def allowance(self, rank: int) -> float:
        """Idle time this rank may still take: up to the idlest rank's (or the
        previous run's approved) idle time."""
        idle = self.tracker.idle
        worst = max(idle)
        if self.approved:
            worst = max(worst, self.approved_max - self.approved[rank])
        return worst - idle[rank]

    def put_weight(self, rank: int) -> None:
        stage, mb = self.pending[rank].popleft()
        self.tracker.put(W_CODE, stage, mb)

    def make_room(self, rank: int, code: int, chunk: int) -> None:
        """Pending W's until op ``code`` of ``chunk`` fits the memory limit."""
        stage = self.stage(rank, chunk)
        while not self.tracker.fits(stage, code):
            if not self.pending[rank]:
                raise Infeasible(f"rank {rank} cannot fit the memory limit")
            self.put_weight(rank)

    def put_forward(self, rank: int, chunk: int) -> None:
        self.make_room(rank, F_CODE, chunk)
        self.tracker.put(F_CODE, self.stage(rank, chunk), self.forwards[chunk][rank])
        self.forwards[chunk][rank] += 1

    def put_backward(self, rank: int, chunk: int) -> None:
        self.make_room(rank, B_CODE, chunk)
        stage, mb = self.stage(rank, chunk), self.backwards[chunk][rank]
        self.tracker.put(B_CODE, stage, mb)
        self.backwards[chunk][rank] += 1
        self.pending[rank].append((stage, mb))

    def fill(self, rank: int, arrive: float, partial: bool, flag: int = -1) -> None:
        # Whole W's that fit before the input arrives; a partial one when the gap
        # exceeds this rank's idle allowance (always before a chunk-0 B, and
        # before others when the variant asks: ``flag`` 0 for fill_f, 1 for fill_b).
        pending, clock, dur = self.pending[rank], self.tracker.clock, self.tracker.dur
        while pending and arrive >= clock[rank] + dur[pending[0][0]][W_CODE]:
            self.put_weight(rank)
        if (partial or flag >= 0) and pending and arrive - clock[rank] > self.allowance(rank):
            if flag >= 0:
                self.consulted[flag] = True
            if partial:
                self.allowance_used = True
                self.put_weight(rank)

    def can_forward(self, rank: int, chunk: int) -> bool:
        mb, stage = self.forwards[chunk][rank], self.stage(rank, chunk)
        return mb < self.m and self.tracker.ready(F_CODE, stage, mb) and self.tracker.fits(stage, F_CODE)

    def backward_ready(self, rank: int, chunk: int) -> bool:
        mb = self.backwards[chunk][rank]
        return mb < self.m and self.tracker.ready(B_CODE, self.stage(rank, chunk), mb)

    # ------------------------------------------------------------------ 1. warm-up
    def warm_up(self) -> None:
        """Chunk-0 forwards until the first chunk-1 forward can arrive, then chunk-1
        forwards so that each rank has at least as many in flight as the next.
        Forwards whose input or memory is missing are left to the steady state."""
        for rank in range(self.p):
            self.put_forward(rank, 0)
        for rank in range(self.p - 1, -1, -1):
            if rank < self.p - 1:
                self._forwards_until_turn(rank)
            if self.can_forward(rank, 1):
                self.put_forward(rank, 1)
        self._balance_in_flight()

    def _forwards_until_turn(self, rank: int) -> None:
        """Chunk-0 forwards on ranks 0..``rank`` while ``rank`` has memory to spare and
        time before the first chunk-1 forward reaches it from ``rank + 1``."""
        tr, down, done = self.tracker, self.down, self.forwards[0]
        arrive = tr.end_of(F_CODE, self.up[rank + 1], 0) + tr.comm
        reserve = tr.mem[down[rank]][F_CODE] * (2 + 2 * rank)
        while (done[rank] < self.m and tr.level[rank] + reserve <= self.limit + tr.tol
               and tr.clock[rank] + tr.dur[down[rank]][F_CODE] <= arrive):
            before = done[rank]
            for other in range(rank + 1):
                if self.can_forward(other, 0):
                    self.put_forward(other, 0)
            if done[rank] == before:
                break

    def _balance_in_flight(self) -> None:
        """Forwards, alternating chunks, until every rank has at least as many in
        flight as the one before it (and more chunk-1 ones while it can)."""
        f0, f1 = self.forwards
        chunk, idle_passes = 0, 0
        for rank in range(1, self.p):
            while f0[rank] + f1[rank] < f0[rank - 1] + f1[rank - 1] or f1[rank] <= f1[rank - 1] < self.m:
                progressed = False
                for other in range(self.p - 1, rank - 1, -1):
                    if self.can_forward(other, chunk):
                        self.put_forward(other, chunk)
                        progressed = True
                chunk = 1 - chunk
                idle_passes = 0 if progressed else idle_passes + 1
                if idle_passes >= 2:
                    break

    # ------------------------------------------------------------------ 2. steady state
    def steady_state(self, fill_f: bool, fill_b: bool) -> None:
        """Per round one backward, then one forward, on every rank.

        (The reference runs exactly 2m lockstep rounds; here a rank whose preferred
        backward cannot run yet takes the other chunk's, or sits the round out, so
        unequal costs and memory deltas cannot break the rhythm.)"""
        b0, b1 = self.backwards
        rounds = 0
        while any(b0[i] + b1[i] < 2 * self.m for i in range(self.p)):
            rounds += 1
            if rounds > 4 * (self.m + self.p):
                raise Infeasible("steady state does not converge")
            progressed = self._backward_round(fill_b)
            progressed = self._forward_round(fill_f) or progressed
            if not progressed:
                raise Infeasible("no op can run")

    def _backward_round(self, fill_b: bool) -> bool:
        """One backward per rank that can run one; whether any ran."""
        b0, b1 = self.backwards
        first, second = [], []  # ranks preferring the chunk-1 B / the chunk-0 B
        for i in range(self.p):
            if b0[i] >= b1[i]:
                first.append(i)
            elif i == self.p - 1 or b1[i] >= self.m or self.tracker.done(B_CODE, self.down[i] + 1, b0[i]):
                second.append(i)
            else:
                first.append(i)
        progressed = False
        for rank, chunk in [(i, 0) for i in reversed(second)] + [(i, 1) for i in first]:
            if not self.backward_ready(rank, chunk):
                chunk = 1 - chunk
                if not self.backward_ready(rank, chunk):
                    continue
            self.make_room(rank, B_CODE, chunk)
            arrive = self.tracker.arrival(B_CODE, self.stage(rank, chunk), self.backwards[chunk][rank])
            self.fill(rank, arrive, partial=(chunk == 0 or fill_b), flag=-1 if chunk == 0 else 1)
            self.put_backward(rank, chunk)
            progressed = True
        return progressed

    def _forward_round(self, fill_f: bool) -> bool:
        """One forward per rank that can run one; whether any ran."""
        tr, (f0, f1) = self.tracker, self.forwards
        progressed = False
        for rank in range(self.p):
            # Chunk 1 when its input exists, else chunk 0 when its input exists.
            if f1[rank] < f0[rank] and tr.ready(F_CODE, self.up[rank], f1[rank]):
                chunk = 1
            elif f0[rank] < self.m and tr.ready(F_CODE, self.down[rank], f0[rank]):
                chunk = 0
            else:
                continue
            if not self.pending[rank] and not tr.fits(self.stage(rank, chunk), F_CODE):
                continue  # memory full until a backward runs
            self.make_room(rank, F_CODE, chunk)
            self.fill(rank, tr.arrival(F_CODE, self.stage(rank, chunk), self.forwards[chunk][rank]), partial=fill_f,
                      flag=0)
            self.put_forward(rank, chunk)
            progressed = True
        return progressed

    # ------------------------------------------------------------------ 3. the rest
    def drain_weights(self) -> None:
        """The remaining W's, in order."""
        for rank in range(self.p):
            while self.pending[rank]:
                self.put_weight(rank)


def v_candidates(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> list[Tracker]:
    """All greedy runs that succeed (variants × re-runs with idle allowances).

    A variant's chain of re-runs records whether any of its runs' decisions depended on
    fill_f or fill_b; a later variant differing from a finished chain only in flags that
    chain never consulted makes exactly the same runs, so that chain's trackers stand for
    its own (the list is the same as running every variant)."""
    out: list[Tracker] = []
    chains: list[tuple[tuple[bool, bool], list[bool], list[Tracker]]] = []
    for fill_b in (True, False):
        for fill_f in (True, False):
            flags = (fill_f, fill_b)
            same = next((got for v, consulted, got in chains
                         if all(v[i] == flags[i] for i in range(2) if consulted[i])), None)
            if same is not None:
                out += same
                continue
            consulted, got = [False, False], []
            approved: list[float] | None = None
            best = None
            for _ in range(MAX_RERUNS + 1):
                run = _GreedyRun(p, m, costs, memory, limit, approved)
                try:
                    tr = run.run(fill_f, fill_b)
                except Infeasible:
                    break
                finally:
                    consulted = [a or b for a, b in zip(consulted, run.consulted)]
                got.append(tr)
                bubble = tr.max_idle()
                if best is not None and bubble >= best:
                    break
                best = bubble
                approved = list(tr.idle)
                if not run.allowance_used:
                    # The re-run's allowances are at least this run's at every step, so a run
                    # that never acted on one makes the same decisions: the same run, which
                    # ties and ends the chain (as running it would).
                    got.append(tr)
                    break
            chains.append((flags, consulted, got))
            out += got
    return out
