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

Cost: a run is O(p) per op (a round visits every rank and the idle allowance takes a
max over ranks); with exact float times (durations and comm multiples of 2**-10, unit
costs included) the steady state's repeated rounds are written at once
(:class:`_PeriodSkip`), so a run costs its warm-up and cool-down (O(p²) ops, O(p) each) plus
O(p·m) to write the rest: at p = 128, m = 4096, 639 + 387 rounds of ≈ 8.2 k.
"""

from __future__ import annotations

from collections import deque

from ..costs import Costs, MemoryDeltas
from ..ir import Placement
from ..passes.timing import KIND_CODE
from .zb_auto import B_CODE, F_CODE, W_CODE, Infeasible, Tracker

#: Re-runs with the previous run's idle times as allowances (the reference's
#: "approved bubble" loop), at most this many per variant.
MAX_RERUNS = 6
#: The longest period (in rounds) the steady state's repetition is looked for with.
_MAX_PERIOD = 4


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
        rounds, most = 0, 4 * (self.m + self.p)
        skip = _PeriodSkip(self) if _PeriodSkip.exact(self) else None
        while any(b0[i] + b1[i] < 2 * self.m for i in range(self.p)):
            rounds += 1
            if rounds > most:
                raise Infeasible("steady state does not converge")
            progressed = self._backward_round(fill_b)
            progressed = self._forward_round(fill_f) or progressed
            if not progressed:
                raise Infeasible("no op can run")
            if skip is not None:
                rounds += skip.after_round(most - rounds)

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


class _PeriodSkip:
    """The steady state's repeated rounds, written at once (docs/algorithms.md §9).

    A round's decisions read only: the per-chunk forward and backward counts, the
    pending W's, each rank's clock, memory level and idle time (and peak), and the end
    times of forwards and backwards at microbatches from the smallest count or pending
    W on (the inputs of the ops the round may place; a W's input is its pending B),
    besides comparisons of counts with ``m``. When float sums of times are exact
    (:meth:`exact`), these comparisons do not change when every time moves by the same
    amount. So if the state after a round is the state ``T`` rounds before (``T`` ≤
    :data:`_MAX_PERIOD`) with every count and pending microbatch one higher and every
    clock and every such end time ``delta`` later (level, idle time and peak equal), the
    next ``T`` rounds make the same moves one microbatch and ``delta`` on, and so on by
    induction, as long as every count stays below ``m − 1`` (the comparisons with ``m``
    then all come out as in the copied rounds). Those rounds are written at once: the
    copied rounds' ops, microbatch ``+ i`` and ends ``+ i·delta``. The run is the plain
    run: the same orders, end times, clocks, levels, idle times, peaks and flags.
    """

    __slots__ = ("run", "prev", "skipped", "_delta")

    def __init__(self, run: "_GreedyRun") -> None:
        #: The states after the last rounds (up to _MAX_PERIOD + 1), oldest first.
        self.run, self.prev, self.skipped, self._delta = run, [], 0, 0.0

    @staticmethod
    def exact(run: "_GreedyRun") -> bool:
        """Whether every time of ``run`` is a multiple of 2**-10 below 2**40, so that
        float sums and differences of times are exact: every duration and the comm
        latency are such multiples (unit costs are: a chunk's share is F/2), and all
        of them together stay below the bound."""
        tr = run.tracker
        durs = [d for row in tr.dur for d in row] + [tr.comm]
        if not all(d >= 0 and float(d * 1024).is_integer() for d in durs):
            return False
        return (max(durs) + 1) * 3 * tr.num_stages * (run.m + 1) < 2.0 ** 40

    def _state(self) -> tuple:
        run, tr = self.run, self.run.tracker
        counts = run.forwards[0] + run.forwards[1] + run.backwards[0] + run.backwards[1]
        return (counts, list(tr.clock), list(tr.level), list(tr.idle), list(tr.peak),
                [tuple(q) for q in run.pending], [len(o) for o in tr.order])

    def after_round(self, budget: int) -> int:
        """Called after each steady-state round: how many later rounds were written at
        once (0 when the state does not repeat shifted, or no round may be skipped)."""
        state = self._state()
        self.prev.append(state)
        if len(self.prev) > _MAX_PERIOD + 1:
            del self.prev[0]
        if not all(self.run.tracker.started):
            return 0
        for period in range(1, len(self.prev)):
            k = self._repeats(self.prev[-1 - period], state, budget // period)
            if k:
                self._write(self.prev[-1 - period][6], state[6], self._delta, k)
                self.prev, self.skipped = [], self.skipped + k * period
                return k * period
        return 0

    def _repeats(self, prev: tuple, state: tuple, most: int) -> int:
        """How many copies of the rounds from ``prev`` to ``state`` may be written, when
        ``state`` is ``prev`` one microbatch and ``delta`` (kept in ``_delta``) on; else 0."""
        counts, clock, level, idle, peak, pending, _ = state
        if counts != [c + 1 for c in prev[0]] or (level, idle, peak) != (prev[2], prev[3], prev[4]):
            return 0
        delta = clock[0] - prev[1][0]
        if delta <= 0 or clock != [c + delta for c in prev[1]]:
            return 0
        if pending != [tuple((s, j + 1) for s, j in q) for q in prev[5]]:
            return 0
        mbs = counts + [j for q in pending for _, j in q]
        k = min(self.run.m - 2 - max(mbs), most)
        if k <= 0 or not self._ends_shifted(min(mbs), delta):
            return 0
        self._delta = delta
        return k

    def _ends_shifted(self, lo: int, delta: float) -> bool:
        """Whether every placed forward and backward at microbatch ``j ≥ lo`` ends
        ``delta`` after the same op at ``j − 1`` (the counts, one higher than the round
        before, say which are placed)."""
        run, tr = self.run, self.run.tracker
        S, M, end = tr.num_stages, tr.num_microbatches, tr.end
        for code, counts in ((F_CODE, run.forwards), (B_CODE, run.backwards)):
            for chunk in (0, 1):
                for rank in range(run.p):
                    base = (code * S + run.stage(rank, chunk)) * M
                    now = end[base + lo:base + counts[chunk][rank]]
                    if now != [e + delta for e in end[base + lo - 1:base + counts[chunk][rank] - 1]]:
                        return False
        return True

    def _write(self, before: list[int], after: list[int], delta: float, k: int) -> None:
        """Append ``k`` copies of the last round (ops ``before[r]:after[r]`` of each rank),
        the i-th one microbatch ``i`` and ``i·delta`` later; move the state on by ``k``."""
        run, tr = self.run, self.run.tracker
        S, M, end, clock = tr.num_stages, tr.num_microbatches, tr.end, tr.clock
        shifts = [i * delta for i in range(1, k + 1)]
        for r, order in enumerate(tr.order):
            block = order[before[r]:after[r]]
            order.extend([(kind, s, j + i) for i in range(1, k + 1) for kind, s, j in block])
            for kind, s, j in block:  # an op's copies are the next k slots of its row
                slot = (KIND_CODE[kind] * S + s) * M + j
                e = end[slot]
                end[slot + 1:slot + k + 1] = [e + x for x in shifts]
            clock[r] += k * delta
        for counts in run.forwards + run.backwards:
            for r in range(run.p):
                counts[r] += k
        for q in run.pending:
            shifted = [(s, j + k) for s, j in q]
            q.clear()
            q.extend(shifted)


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
