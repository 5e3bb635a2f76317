"""Timing pass: place every compute op of a schedule in time (list scheduling).

Each rank runs its ops in the given order, each as early as its dependencies allow
(docs/algorithms.md#12-ops-and-dependencies): ``F(s,j)`` after ``F(s−1,j)``; ``B/BW(s,j)`` after ``B/BW(s+1,j)``
(the last layer group's after its own ``F``); ``W(s,j)`` after ``B(s,j)``. A dependency
that crosses ranks adds ``costs.comm``. The result is a :class:`Timeline`.

The same engine proves a schedule deadlock-free: if some rank can never run its next
op, :class:`ScheduleError` names the cycle of waiting ranks.

This module holds the only implementation of these rules. :class:`ListScheduler` is
the engine, incremental: it places ops one at a time (each at the end of its rank's
list, never before an optional release time) and answers "when could this op start?"
for a greedy generator that is still choosing (``schedules.zb_auto``).
:func:`place_rank_lists` drives it through fixed per-rank orders;
:func:`run_list_schedule` times a whole :class:`Schedule` with it, optionally with
per-op release times (the offload pass's delayed backwards and postponed forwards).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from functools import lru_cache
from itertools import repeat
from typing import Any, Callable, Mapping, Sequence

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError, ScheduleError
from ..ir import CompactOrders, Op, OpKind, Placement, Schedule, overlap_pairs
from ..native import _load_engine, c_engine  # noqa: F401  (re-exported: the loops' choice)
from ..timeline import ALLOC, FREE, EventColumns, TimedOp, Timeline, _clean, memory_sweep, running_peak

#: Completion key of an op: ("F"|"B"|"W", stage, microbatch). B and BW both
#: complete the "B" key (they produce the input gradient).
Key = tuple[str, int, int]

_F, _B, _W = OpKind.F, OpKind.B, OpKind.W
_COMPUTE = frozenset((OpKind.F, OpKind.B, OpKind.W, OpKind.BW))  #: OpKind.is_compute, as a set

#: The completion kinds as small ints, the engine's op address ``(code, stage, mb)``
#: (list indices in the hot loops): forward, backward (B or BW: the input gradient),
#: weight gradient.
F_CODE, B_CODE, W_CODE = 0, 1, 2
#: Each compute :class:`OpKind`'s completion code.
KIND_CODE = {OpKind.F: F_CODE, OpKind.B: B_CODE, OpKind.BW: B_CODE, OpKind.W: W_CODE}
_CODE_NAME = ("F", "B", "W")  #: code → completion key name
_CODE_OF_NAME = {"F": F_CODE, "B": B_CODE, "W": W_CODE}
#: Each code's OpKind in a B/W-split schedule (an OpKind that completes it).
CODE_KIND = (OpKind.F, OpKind.B, OpKind.W)
_NOT_PLACED = -math.inf  #: end time of an op not placed yet
_NO_RELEASE = -math.inf  #: release time of an op with none


def completion_key(op: Op) -> Key:
    k = op.kind
    if k is _F:
        return ("F", op.stage, op.microbatch)
    if k is _W:
        return ("W", op.stage, op.microbatch)
    return ("B", op.stage, op.microbatch)


def dependencies(op: Op, num_stages: int) -> list[Key]:
    """Keys that must complete before ``op`` may start."""
    s, j, k = op.stage, op.microbatch, op.kind
    if k is _F:
        return [("F", s - 1, j)] if s > 0 else []
    if k is _W:
        return [("B", s, j)]
    deps: list[Key] = [("F", s, j)]
    if s < num_stages - 1:
        deps.append(("B", s + 1, j))
    return deps


def dependents(key: Key, num_stages: int) -> list[Key]:
    """Keys of the ops that wait for ``key``: the inverse of :func:`dependencies`,
    derived from it (an op's inputs are of its own microbatch, one layer group away
    at most)."""
    _, s, j = key
    return [
        (name, s2, j)
        for name, code in _CODE_OF_NAME.items()
        for s2 in (s - 1, s, s + 1)
        if 0 <= s2 < num_stages and key in dependencies(Op(CODE_KIND[code], s2, j, 0, 0), num_stages)
    ]


def _code_dependencies(code: int, stage: int, num_stages: int) -> list[tuple[int, int]]:
    """:func:`dependencies` in the engine's codes: ``(code, stage)`` of each input."""
    op = Op(CODE_KIND[code], stage, 0, 0, 0)
    return [(_CODE_OF_NAME[name], s) for name, s, _ in dependencies(op, num_stages)]


@lru_cache(maxsize=64)
def _dependency_pattern(num_stages: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """Per ``code·S + stage`` (``S = num_stages``): each input of :func:`_code_dependencies`
    as ``(code·S + stage of the input, its stage, the op's stage)``. The same for every
    engine with ``S`` layer groups, so made once per ``S`` (an engine is made per timing
    and per generator run: the planner makes ~ 1100)."""
    S = num_stages
    return tuple(tuple((dc * S + ds, ds, s) for dc, ds in _code_dependencies(c, s, S))
                 for c in range(3) for s in range(S))


def _key_str(key: Key) -> str:
    kind = {"F": "F", "B": "B/BW", "W": "W"}[key[0]]
    return f"{kind}(stage={key[1]}, mb={key[2]})"


class ListScheduler:
    """The list-scheduling engine, one op at a time.

    An op is addressed as ``(code, stage, mb)`` with ``code`` one of
    ``F_CODE``/``B_CODE``/``W_CODE`` (:data:`KIND_CODE`), ``0 ≤ stage <`` the number
    of layer groups and ``0 ≤ mb < num_microbatches``; it runs on the rank that
    ``stage_to_rank`` gives its layer group. :meth:`place` appends an op to its
    rank: it starts at the latest of its rank's clock (the end of the rank's previous
    op, ``origin`` at first), its inputs' ends (+ ``comm`` when the input was computed
    on another rank) and its release time, and runs for the given duration.

    Guarantees: :meth:`earliest_start` is exactly the start :meth:`place` would give;
    placing every op of a schedule in each rank's order gives the times of
    :func:`run_list_schedule`. Asking for an input that is not placed yet calls
    :meth:`_not_placed`, which raises :class:`ScheduleError` (a subclass may raise
    its own error instead).
    """

    __slots__ = ("num_stages", "num_microbatches", "comm", "rank_of", "origin", "clock", "end", "deps")

    def __init__(
        self, stage_to_rank: Sequence[int], num_microbatches: int, comm: float = 0.0, origin: float = 0.0
    ) -> None:
        S, m = len(stage_to_rank), num_microbatches
        self.num_stages, self.num_microbatches = S, m
        self.comm = comm
        self.rank_of = list(stage_to_rank)
        self.origin = origin
        self.clock = [origin] * (max(self.rank_of) + 1)
        #: End time of every op (index :meth:`slot`), ``-inf`` until placed.
        self.end = [_NOT_PLACED] * (3 * S * m)
        #: Per ``code·S + stage``: each input as (slot of its microbatch 0, latency).
        rank_of = self.rank_of
        self.deps: list[tuple[tuple[int, float], ...]] = [
            tuple((own * m, comm if rank_of[ds] != rank_of[s] else 0.0) for own, ds, s in inputs)
            for inputs in _dependency_pattern(S)
        ]

    def slot(self, code: int, stage: int, mb: int) -> int:
        """Index of op ``(code, stage, mb)`` in :attr:`end`."""
        return (code * self.num_stages + stage) * self.num_microbatches + mb

    def done(self, code: int, stage: int, mb: int) -> bool:
        """Whether op ``(code, stage, mb)`` has been placed."""
        return self.end[(code * self.num_stages + stage) * self.num_microbatches + mb] != _NOT_PLACED

    def end_of(self, code: int, stage: int, mb: int) -> float:
        """End time of a placed op."""
        e = self.end[(code * self.num_stages + stage) * self.num_microbatches + mb]
        if e == _NOT_PLACED:
            self._not_placed(code, stage, mb, "is")
        return e

    def ready(self, code: int, stage: int, mb: int) -> bool:
        """Whether every input of op ``(code, stage, mb)`` has been placed."""
        end, unplaced = self.end, _NOT_PLACED
        for base, _ in self.deps[code * self.num_stages + stage]:
            if end[base + mb] == unplaced:
                return False
        return True

    def missing_input(self, code: int, stage: int, mb: int) -> int:
        """Slot of the first input of op ``(code, stage, mb)`` not placed yet, or −1."""
        end = self.end
        for base, _ in self.deps[code * self.num_stages + stage]:
            if end[base + mb] == _NOT_PLACED:
                return base + mb
        return -1

    def arrival(self, code: int, stage: int, mb: int) -> float:
        """When every input of op ``(code, stage, mb)`` is available on its rank
        (``origin`` for an op with none)."""
        t = self.origin
        end = self.end
        for base, latency in self.deps[code * self.num_stages + stage]:
            e = end[base + mb]
            if e == _NOT_PLACED:
                self._not_placed(code, stage, mb, "has an input that is")
            e += latency
            if e > t:
                t = e
        return t

    def earliest_start(self, code: int, stage: int, mb: int, release: float = _NO_RELEASE) -> float:
        """The start :meth:`place` would give op ``(code, stage, mb)`` now."""
        t = self.arrival(code, stage, mb)
        c = self.clock[self.rank_of[stage]]
        return max(t, c, release)

    def place(self, code: int, stage: int, mb: int, duration: float, release: float = _NO_RELEASE) -> float:
        """Append op ``(code, stage, mb)`` to its rank, not before ``release``; return
        its start. (The input loop of :meth:`arrival` is repeated inline: this is the
        hot path of every generator and of the timing pass.)"""
        end, unplaced = self.end, _NOT_PLACED
        own = code * self.num_stages + stage
        t = self.origin
        for base, latency in self.deps[own]:
            e = end[base + mb]
            if e == unplaced:
                self._not_placed(code, stage, mb, "has an input that is")
            e += latency
            if e > t:
                t = e
        clock = self.clock
        r = self.rank_of[stage]
        if clock[r] > t:
            t = clock[r]
        if release > t:
            t = release
        e = t + duration
        end[own * self.num_microbatches + mb] = e
        clock[r] = e
        return t

    def _not_placed(self, code: int, stage: int, mb: int, what: str) -> None:
        raise ScheduleError(f"{_CODE_NAME[code]}(stage={stage}, mb={mb}) {what} not placed yet")


def place_rank_lists(
    engine: ListScheduler,
    lists: Sequence[Sequence[tuple[int, int, int]]],
    place: Callable[[int, int], object],
) -> list[int]:
    """Place fixed per-rank orders: rank ``r``'s ops ``lists[r]`` (each ``(code,
    stage, mb)``) in order, each once all its inputs are placed, by calling
    ``place(r, i)`` (which must place ``lists[r][i]`` into ``engine``).

    Guarantees: ``place`` is called once per op, in each rank's order, and only when
    the op's inputs are placed; returns how many ops of each rank were placed — all of
    them unless the orders deadlock.
    """
    p = len(lists)
    S, m = engine.num_stages, engine.num_microbatches
    deps, end, unplaced = engine.deps, engine.end, _NOT_PLACED
    done = [0] * p
    waiting: dict[int, list[int]] = {}
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        ops = lists[r]
        i = done[r]
        while i < len(ops):
            code, stage, mb = ops[i]
            missing = -1  # engine.missing_input, inline: once per op of every timing
            for base, _ in deps[code * S + stage]:
                if end[base + mb] == unplaced:
                    missing = base + mb
                    break
            if missing >= 0:
                waiting.setdefault(missing, []).append(r)
                break
            place(r, i)
            i += 1
            woken = waiting.pop((code * S + stage) * m + mb, None)
            if woken:
                ready.extend(woken)
        done[r] = i
    return done


def _op_codes(schedule: Schedule, ranks: list[list[Op]]) -> tuple[list[list[tuple[int, int, int]]], int]:
    """Each op's engine address, and the number of microbatches to size the engine for.
    Raises ScheduleError for an op outside the placement's layer groups."""
    S, m = schedule.num_stages, schedule.num_microbatches
    codes = []
    for lst in ranks:
        row = []
        for op in lst:
            s, j = op.stage, op.microbatch
            if not (0 <= s < S and j >= 0):
                raise ScheduleError(f"{op}: stage or microbatch out of range (rule: placement consistent)")
            if j >= m:
                m = j + 1
            row.append((KIND_CODE[op.kind], s, j))
        codes.append(row)
    return codes, m


def run_list_schedule(
    schedule: Schedule,
    duration: Callable[[Op], float],
    comm: float,
    memory: Callable[[Op], float] | None = None,
    *,
    release: Mapping[tuple[OpKind, int, int], float] | None = None,
    origin: float = 0.0,
) -> list[TimedOp]:
    """Time every compute op of ``schedule``, each rank's in its order, each as early as
    its inputs allow (``comm`` across ranks) and never before ``release[op.key]``;
    every rank's clock starts at ``origin``.

    Guarantees: every compute op appears exactly once in the result, with its
    ``memory`` delta (0 without ``memory``); each rank's ops keep the schedule's order
    and never overlap; an op starts at the earliest time its rank, its inputs and its
    release allow. Raises ScheduleError naming the cycle of waiting ranks on deadlock.
    """
    ranks = [[o for o in lst if o.kind in _COMPUTE] for lst in schedule.ranks]
    codes, m = _op_codes(schedule, ranks)
    engine = ListScheduler(schedule.placement.stage_to_rank, m, comm, origin)
    pairs = overlapped_positions(schedule, schedule.ranks)  # in the full lists: a transfer between splits a pair
    if pairs:  # DualPipeV's overlapped F&B pairs: each pair placed as one op
        return _run_with_pairs(schedule, ranks, codes, engine, pairs, duration, memory, release)
    # Each op's duration, memory delta and release, asked once per op up front.
    durs = [[duration(op) for op in lst] for lst in ranks]
    mems = [[memory(op) for op in lst] for lst in ranks] if memory else [[0.0] * len(lst) for lst in ranks]
    rels = [[release.get(op.key, _NO_RELEASE) for op in lst] for lst in ranks] if release else None
    done, placed = _time_rank_lists(engine, codes, durs, rels)
    stuck = [r for r in range(len(ranks)) if done[r] < len(ranks[r])]
    if stuck:
        raise ScheduleError(_deadlock_message(schedule, ranks, done, stuck))
    return [TimedOp(ranks[r][i], t, t + durs[r][i], "compute", mems[r][i]) for r, i, t in placed]


def _time_rank_lists(
    engine: ListScheduler,
    lists: Sequence[Sequence[tuple[int, int, int]]],
    durs: Sequence[Sequence[float]],
    releases: Sequence[Sequence[float]] | None,
) -> tuple[list[int], list[tuple[int, int, float]]]:
    """:func:`place_rank_lists` driving :meth:`ListScheduler.place` (rank ``r``'s op ``i``
    runs for ``durs[r][i]``, not before ``releases[r][i]``), both loops fused: the timing
    pass's hot loop, one visit of each op's inputs (they are checked and timed at once).

    Returns how many ops of each rank were placed, and ``(rank, index, start)`` of each
    placed op in placement order. Cost: O(number of ops)."""
    p = len(lists)
    S, m = engine.num_stages, engine.num_microbatches
    deps, end, clock, rank_of, origin = engine.deps, engine.end, engine.clock, engine.rank_of, engine.origin
    unplaced = _NOT_PLACED
    done = [0] * p
    placed: list[tuple[int, int, float]] = []
    append = placed.append
    waiting: dict[int, list[int]] = {}
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        ops, dur = lists[r], durs[r]
        rel = releases[r] if releases is not None else None
        i, n = done[r], len(ops)
        while i < n:
            code, stage, mb = ops[i]
            own = code * S + stage
            t = origin
            missing = -1
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
            if clock[q] > t:
                t = clock[q]
            if rel is not None and rel[i] > t:
                t = rel[i]
            slot = own * m + mb
            end[slot] = clock[q] = t + dur[i]
            append((r, i, t))
            i += 1
            woken = waiting.pop(slot, None)
            if woken:
                ready.extend(woken)
        done[r] = i
    return done, placed


def prove_deadlock_free(schedule: Schedule) -> None:
    """Raise ScheduleError naming the cycle of waiting ranks if ``schedule``'s compute ops
    cannot all run in each rank's order; :func:`run_list_schedule`'s proof without the
    timing (only whether each op's inputs are placed matters).

    Cost: O(number of ops)."""
    addr = None if overlap_pairs(schedule) else _compact_addresses(schedule)
    if addr is not None and _proved_compact(schedule, *addr):
        return  # else the general proof below names the cycle (or the bad op)
    ranks = [[o for o in lst if o.kind in _COMPUTE] for lst in schedule.ranks]
    codes, m = _op_codes(schedule, ranks)
    engine = ListScheduler(schedule.placement.stage_to_rank, m, 0.0)
    end, S = engine.end, engine.num_stages

    def place(r: int, i: int) -> None:
        code, stage, mb = codes[r][i]
        end[(code * S + stage) * m + mb] = 0.0

    full = overlapped_positions(schedule, schedule.ranks)
    pairs: set[tuple[int, int]] = set()
    if full:  # each overlapped pair runs as one op, placed once both halves' inputs are
        firsts = {schedule.ranks[r][i] for r, i in full}
        pairs = {(r, i) for r, lst in enumerate(ranks) for i, o in enumerate(lst) if o in firsts}
        done = _place_overlapped(engine, codes, place, pairs, {})
    else:
        done = place_rank_lists(engine, codes, place)
    stuck = [r for r in range(len(ranks)) if done[r] < len(ranks[r])]
    if stuck:
        raise ScheduleError(_deadlock_message(schedule, ranks, done, stuck, pairs))


def _proved_compact(schedule: Schedule, ops: Sequence[Sequence[Op]], tis: Sequence[Sequence[int]],
                    mbs: Sequence[Sequence[int]], m: int) -> bool:
    """Whether every compute op runs: :func:`place_rank_lists` over the compact addresses
    of :func:`_compact_addresses`, a 0/1 table of the ops placed, no timing and no
    callback per op. Cost: O(number of ops); in C where :mod:`pipeoffload._engine` is built (its
    list-scheduling loop with zero durations: an op waits exactly when an input is not placed,
    whatever the durations, so it places the same ops)."""
    S = schedule.num_stages
    engine = ListScheduler(schedule.placement.stage_to_rank, m, 0.0)
    own_of = [KIND_CODE[k] * S + s for k in _TABLE_KINDS for s in range(S)]
    engine_c = c_engine()
    if engine_c is not None:
        got = engine_c.time_compact(m, engine.deps, engine.clock, engine.origin, engine.end, tis, mbs, own_of,
                                    [0.0] * len(own_of), None)
        if got is not None:
            return got[2] == sum(map(len, tis))
    deps = [tuple(base for base, _ in d) for d in engine.deps]
    placed = bytearray(len(engine.end))
    done = [0] * len(tis)
    waiting: dict[int, list[int]] = {}
    ready = deque(range(len(tis)))
    while ready:
        r = ready.popleft()
        ti, mb_of = tis[r], mbs[r]
        i, n = done[r], len(ti)
        while i < n:
            own, mb = own_of[ti[i]], mb_of[i]
            missing = -1
            for base in deps[own]:
                if not placed[base + mb]:
                    missing = base + mb
                    break
            if missing >= 0:
                waiting.setdefault(missing, []).append(r)
                break
            slot = own * m + mb
            placed[slot] = 1
            i += 1
            woken = waiting.pop(slot, None)
            if woken:
                ready.extend(woken)
        done[r] = i
    return all(d == len(t) for d, t in zip(done, tis))


def _run_with_pairs(schedule: Schedule, ranks: list[list[Op]], codes: Any, engine: ListScheduler,
                    pairs: set[tuple[int, int]], duration: Callable[[Op], float],
                    memory: Callable[[Op], float] | None,
                    release: Mapping[tuple[OpKind, int, int], float] | None) -> list[TimedOp]:
    """:func:`run_list_schedule` for a schedule with overlapped F&B pairs (positions
    ``pairs`` in the full per-rank lists): each pair placed as one op, its F not before
    its backward's inputs are in (:func:`_place_overlapped`)."""
    events: list[TimedOp] = []
    place_op = engine.place
    no_release = _NO_RELEASE
    firsts = {schedule.ranks[r][i] for r, i in pairs}
    pairs = {(r, i) for r, lst in enumerate(ranks) for i, o in enumerate(lst) if o in firsts}
    pair_start: dict[tuple[int, int], float] = {}  # F of an overlapped pair -> when its backward's inputs are in

    def place(r: int, i: int) -> None:
        op = ranks[r][i]
        code, stage, mb = codes[r][i]
        d = duration(op)
        rel = release.get(op.key, no_release) if release else no_release
        rel = max(rel, pair_start.pop((r, i), no_release))
        t = place_op(code, stage, mb, d, rel)
        events.append(TimedOp(op, t, t + d, "compute", memory(op) if memory else 0.0))

    done = _place_overlapped(engine, codes, place, pairs, pair_start)
    stuck = [r for r in range(len(ranks)) if done[r] < len(ranks[r])]
    if stuck:
        raise ScheduleError(_deadlock_message(schedule, ranks, done, stuck, pairs))
    return events


def overlapped_positions(schedule: Schedule, ranks: Sequence[Sequence[Op]]) -> set[tuple[int, int]]:
    """Positions ``(rank, i)`` in ``ranks`` (per-rank op lists) of each overlapped pair's
    F (:func:`pipeoffload.ir.overlap_pairs`) that its backward immediately follows: the
    pairs that run as one op. A pair split by another op (an offload transfer) runs apart."""
    pairs = overlap_pairs(schedule)
    if not pairs:
        return set()
    out = set()
    for r, lst in enumerate(ranks):
        for i in range(len(lst) - 1):
            a, b = lst[i], lst[i + 1]
            if a.kind is OpKind.F and b.kind.is_backward and pairs.get((a.stage, a.microbatch)) == (b.stage,
                                                                                                    b.microbatch):
                out.add((r, i))
    return out


def _place_overlapped(
    engine: ListScheduler,
    lists: Sequence[Sequence[tuple[int, int, int]]],
    place: Callable[[int, int], object],
    pairs: set[tuple[int, int]],
    pair_start: dict[tuple[int, int], float],
) -> list[int]:
    """:func:`place_rank_lists` where each overlapped pair ``(r, i)``, ``(r, i+1)`` is one op:
    placed once the inputs of both halves are (the backward's input from its own F
    aside), its F not before the backward's inputs arrive (``pair_start``), its
    backward right after. Returns how many ops of each rank were placed."""
    S = engine.num_stages
    deps, end, unplaced = engine.deps, engine.end, _NOT_PLACED
    done = [0] * len(lists)
    progress = True
    while progress:
        progress = False
        for r, ops in enumerate(lists):
            i = done[r]
            while i < len(ops):
                code, stage, mb = ops[i]
                half = [(code, stage, mb)] + ([ops[i + 1]] if (r, i) in pairs else [])
                own = engine.slot(code, stage, mb)
                start, ready = _NO_RELEASE, True
                for k, (c, s, j) in enumerate(half):
                    for base, lat in deps[c * S + s]:
                        e = end[base + j]
                        if k == 1 and base + j == own:
                            continue  # the backward's input is its own pair's F: run in order
                        if e == unplaced:
                            ready = False
                        elif k == 1:
                            start = max(start, e + lat)
                if not ready:
                    break
                if len(half) == 2:
                    pair_start[(r, i)] = start
                for k in range(len(half)):
                    place(r, i + k)
                i += len(half)
                progress = True
            done[r] = i
    return done


def _deadlock_message(schedule: Schedule, ranks: list[list[Op]], ptr: list[int], stuck: list[int],
                      pairs: set[tuple[int, int]] = frozenset()) -> str:
    """Where the stuck ranks wait, as a cycle. ``pairs``: positions in ``ranks`` of the
    overlapped pairs run as one op, which also wait for their backward half's inputs."""
    S = schedule.num_stages
    runs = {completion_key(o): o for lst in ranks for o in lst}

    def blocker(r: int) -> tuple[Op | str, Key]:
        op = ranks[r][ptr[r]]
        done = {completion_key(o) for o in ranks[r][: ptr[r]]}
        halves = [op] + ([ranks[r][ptr[r] + 1]] if (r, ptr[r]) in pairs else [])
        for half in halves:
            for dk in dependencies(half, S):
                if half is not op and dk == completion_key(op):
                    continue  # the pair's backward on its own forward: inside the one op
                producer = runs.get(dk)
                if producer is None or producer.rank != r or dk not in done:
                    if producer is None or not _completed(producer, ranks, ptr):
                        return (half if half is op else f"{half} (overlapped with {op}: one op)"), dk
        return op, next(dk for half in halves for dk in dependencies(half, S))

    seen: list[int] = []
    r = stuck[0]
    parts = []
    while r not in seen:
        seen.append(r)
        op, dk = blocker(r)
        producer = runs.get(dk)
        if producer is None:
            return (
                f"deadlock: rank {r} waits at {op} for {_key_str(dk)}, which no rank runs "
                f"(rule: every dependency must be scheduled)"
            )
        parts.append(f"rank {r} waits at {op} for {_key_str(dk)} on rank {producer.rank}")
        r = producer.rank
    cyc = parts[seen.index(r):]
    return "deadlock (cross-rank dependency cycle): " + "; ".join(cyc)


def _completed(op: Op, ranks: list[list[Op]], ptr: list[int]) -> bool:
    lst = ranks[op.rank]
    try:
        return lst.index(op) < ptr[op.rank]
    except ValueError:
        return False


def simulate(
    schedule: Schedule,
    costs: Costs | None = None,
    memory: MemoryDeltas | None = None,
    memory_unit: str = "units",
) -> Timeline:
    """Time ``schedule`` with ``costs`` (default unit F=B=W=1, comm=0) and memory deltas.

    Guarantees: every compute op appears exactly once in the result; each rank's ops
    keep the schedule's order and never overlap; every op starts no earlier than its
    dependencies' ends (+ comm across ranks). Raises ScheduleError on deadlock.
    """
    timeline = _simulate_columns(schedule, costs, memory, memory_unit)
    if timeline is not None:
        return timeline
    costs = costs or Costs()
    memory = memory or MemoryDeltas()
    pl = schedule.placement
    dur = costs.duration_table(pl)
    mem = memory.delta_table(pl)
    fields = _timeline_fields(schedule, memory_unit)
    events = run_list_schedule(
        schedule,
        lambda o: dur[o.stage][o.kind],
        costs.comm,
        lambda o: mem[o.stage][o.kind],
    )
    return Timeline(num_ranks=schedule.num_ranks, events=events, **fields)


def _timeline_fields(schedule: Schedule, memory_unit: str) -> dict[str, Any]:
    """The :class:`Timeline` fields :func:`simulate` copies from ``schedule``."""
    return dict(name=schedule.name, num_microbatches=schedule.num_microbatches, chunks=schedule.chunks,
                memory_unit=memory_unit, meta={"params": dict(schedule.params)})


def _simulate_columns(schedule: Schedule, costs: Costs | None, memory: MemoryDeltas | None, memory_unit: str,
                      placed: list[list[float]] | None = None, memo: "OrderTimer | None" = None) -> Timeline | None:
    """:func:`simulate` on compact addresses (:func:`_timed_columns`, whose ``placed``
    and ``memo`` this passes on), or None where that does not apply (then
    :func:`simulate` takes the general path)."""
    costs = costs or Costs()
    memory = memory or MemoryDeltas()
    pl = schedule.placement
    columns = _timed_columns(schedule, costs.duration_table(pl), memory.delta_table(pl), costs.comm, placed, memo)
    if columns is None:
        return None
    return Timeline.from_columns(schedule.num_ranks, columns, **_timeline_fields(schedule, memory_unit))


#: The compute kinds in the compact addresses' order: an op's *table index* is
#: ``kind index · S + stage``, which gives its engine code, duration and memory delta.
_TABLE_KINDS = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)
_TABLE_KIND_INDEX = {k: i for i, k in enumerate(_TABLE_KINDS)}


def _compact_addresses(schedule: Schedule) -> tuple[list[Sequence[Op]], list[list[int]], list[list[int]], int] | None:
    """Per rank: its compute ops (the schedule's own list when it holds nothing else),
    each op's table index (:data:`_TABLE_KINDS`) and microbatch as lists of ints (the
    engine's loop reads lists faster than arrays), and the number of microbatches to
    size the engine for. None when an op is outside the placement's layer groups, has a
    negative microbatch or sits in another rank's list (its ``rank`` or its layer
    group's rank is not the list's): the general path then raises or times it as before."""
    S, m = schedule.num_stages, schedule.num_microbatches
    compact = schedule.compact
    if compact is not None and compact.compute_only():
        return _compact_from_arrays(schedule, compact)
    kind_index, rank_of = _TABLE_KIND_INDEX, schedule.placement.stage_to_rank
    ops_out, tis_out, mbs_out = [], [], []
    top = m - 1
    for r, lst in enumerate(schedule.ranks):
        tis: list[int] = []
        mbs: list[int] = []
        ti_add, mb_add = tis.append, mbs.append
        other = False
        for op in lst:
            k = kind_index.get(op.kind)
            if k is None:
                other = True
                continue
            s, j = op.stage, op.microbatch
            if not (0 <= s < S and j >= 0) or op.rank != r or rank_of[s] != r:
                return None
            if j > top:
                top = j
            ti_add(k * S + s)
            mb_add(j)
        ops_out.append([o for o in lst if o.kind in _COMPUTE] if other else lst)
        tis_out.append(tis)
        mbs_out.append(mbs)
    return ops_out, tis_out, mbs_out, top + 1


def _compact_from_arrays(schedule: Schedule, compact: CompactOrders
                         ) -> tuple[list[Sequence[Op]], list[list[int]], list[list[int]], int] | None:
    """:func:`_compact_addresses` of a schedule still held as compute-only
    :class:`CompactOrders` (its kind codes are the table's kind indices, F, B, W, BW;
    every layer group is in range): no :class:`Op` is made. A rank's layer groups are
    checked once each (the set of its stages), not once per op."""
    pl = schedule.placement
    S, m, rank_of = pl.num_stages, schedule.num_microbatches, pl.stage_to_rank
    tis_out, top = [], m - 1
    for r, (ks, ss, js) in enumerate(zip(compact.kinds, compact.stages, compact.mbs)):
        if js and (min(js) < 0 or any(rank_of[s] != r for s in set(ss))):
            return None
        if js:
            top = max(top, max(js))
        tis_out.append([k * S + s for k, s in zip(ks, ss)])
    ops = [compact.rank_ops(pl, r) for r in range(len(tis_out))]
    return ops, tis_out, [js.tolist() for js in compact.mbs], top + 1


def _timed_columns(schedule: Schedule, dur: Sequence[Mapping[OpKind, float]],
                   mem: Sequence[Mapping[OpKind, float]], comm: float,
                   placed: list[list[float]] | None = None, memo: "OrderTimer | None" = None
                   ) -> EventColumns | None:
    """:func:`simulate`'s timing as :class:`EventColumns`, without an :class:`Op` lookup
    per op of the durations and deltas nor a :class:`TimedOp`: the same engine and fused
    loop as :func:`run_list_schedule`, the same floats in the same event order. The event
    order is made when first read (:class:`_EventOrder`, the same engine run again; the
    planner reads it for a few of its ~ 400 timings).

    None (the caller takes :func:`run_list_schedule`, which then raises or times as
    ever) for overlapped pairs, a deadlock, a duration or delta that is not a float,
    and the cases :func:`_compact_addresses` leaves out. ``placed``, when given, gets
    the engine's end table appended (a list of floats, ``-inf`` at an op never placed;
    index ``(code·S + stage)·m' + mb`` with ``m'`` the engine's size: the validator's
    fused proof reads it). ``memo``, when given, holds ``schedule``'s addresses and
    event runs once a timing has placed every op, and later timings replay them
    (:class:`OrderTimer`). Cost: O(number of ops)."""
    if overlap_pairs(schedule):
        return None
    S = schedule.num_stages
    dur_of = [dur[s][k] for k in _TABLE_KINDS for s in range(S)]
    mem_of = [mem[s][k] for k in _TABLE_KINDS for s in range(S)]
    if not all(type(x) is float for x in dur_of + mem_of):  # an int would print as one
        return None
    untimed = memo is not None and _untimed_control(dur_of, comm)
    replay = untimed and memo.runs is not None  # type: ignore[union-attr]
    addr = memo.addresses() if replay else _compact_addresses(schedule)  # type: ignore[union-attr]
    if addr is None:
        return None
    ops, tis, mbs, m = addr
    engine = ListScheduler(schedule.placement.stage_to_rank, m, comm, 0.0)
    own_of = _own_of(S)
    runs: array | None = None
    if replay:
        runs = memo.runs  # type: ignore[union-attr]
        starts, ends = _time_in_runs(engine, tis, mbs, own_of, dur_of, runs)  # type: ignore[arg-type]
        memo.replays += 1  # type: ignore[union-attr]
        n_placed = sum(map(len, tis))
    else:
        recorded: list[tuple[int, int]] | None = [] if untimed else None
        starts, ends, n_placed = _time_compact(engine, tis, mbs, own_of, dur_of, recorded)
        if recorded is not None and n_placed == sum(map(len, tis)):
            runs = memo.keep(addr, recorded)  # type: ignore[union-attr]
    if placed is not None:
        placed.append(engine.end)
    if n_placed < sum(map(len, tis)):
        return None  # deadlock: run_list_schedule names the cycle
    return EventColumns(ops, starts, ends, _Deltas(schedule, mem_of), _EventOrder(schedule, comm, dur_of, runs),
                        serial=_serial(dur_of, ends))


def _untimed_control(dur_of: Sequence[float], comm: float) -> bool:
    """Whether :func:`_time_compact`'s control flow reads no time with these durations
    and latency: every one finite and ≥ 0, so every end is ≥ the origin 0.0 and never
    the "not placed" mark ``-inf``; which op the loop places next then depends only on
    the orders (which inputs are placed), not on the costs."""
    return 0.0 <= comm < math.inf and 0.0 <= min(dur_of, default=0.0) and max(dur_of, default=0.0) < math.inf


class OrderTimer:
    """Times one schedule's orders with durations that change from call to call: the
    planner times a fixed-order schedule once per split and recompute setting that
    share it (98.5B on 64 A100s: half of its timed ops).

    It keeps about 11 bytes per op (the addresses and the runs as ``array('i')``: as
    lists of ints and tuples they cost ≈ 40, 20 MB more peak RSS for that plan), and
    makes the addresses' lists again per replay (in C).

    :func:`_time_compact`'s control flow reads no time where :func:`_untimed_control`
    holds (which op it places next depends only on the orders and which inputs are
    placed), so the runs of ops it places rank by rank — the event order — are the same
    for every such cost table, and each op's inputs are placed before it in them. The
    first timing that places every op keeps the compact addresses and these runs; each
    later one replays the runs (:func:`_time_in_runs`), without the engine's checks for
    unplaced inputs, its waiting and its waking.

    Guarantees: :meth:`simulate` returns ``simulate(schedule.compute_only(), costs,
    memory, memory_unit)``, float for float and in the same event order (every op gets
    the max of the same floats, compared in the same order, plus the same duration);
    ``replays`` counts the timings that replayed the runs.
    """

    __slots__ = ("schedule", "_addr", "runs", "replays")

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule.compute_only()
        #: :func:`_compact_addresses` of the schedule, its int lists as arrays, once a timing
        #: placed every op.
        self._addr: tuple[list[Sequence[Op]], list[array], list[array], int] | None = None
        #: The event runs of that timing, flat: rank, ops placed in a row, rank, …
        self.runs: array | None = None
        self.replays = 0

    def keep(self, addr: tuple[list[Sequence[Op]], list[list[int]], list[list[int]], int],
             runs: list[tuple[int, int]]) -> array:
        """Keep a timing's addresses and runs (it placed every op); the runs, flat."""
        ops, tis, mbs, m = addr
        self._addr = (ops, [array("i", t) for t in tis], [array("i", j) for j in mbs], m)
        self.runs = array("i", [x for run in runs for x in run])
        return self.runs

    def addresses(self) -> tuple[list[Sequence[Op]], list[list[int]], list[list[int]], int] | None:
        """The kept :func:`_compact_addresses`, as lists again (None before :meth:`keep`)."""
        if self._addr is None:
            return None
        ops, tis, mbs, m = self._addr
        return ops, [t.tolist() for t in tis], [j.tolist() for j in mbs], m

    def simulate(self, costs: Costs | None = None, memory: MemoryDeltas | None = None,
                 memory_unit: str = "units") -> Timeline:
        """:func:`simulate` of the schedule (compute ops only) with these costs."""
        timeline = _simulate_columns(self.schedule, costs, memory, memory_unit, memo=self)
        return timeline if timeline is not None else simulate(self.schedule, costs, memory, memory_unit)


def _time_in_runs(engine: ListScheduler, tis: Sequence[list[int]], mbs: Sequence[list[int]],
                  own_of: Sequence[int], dur_of: Sequence[float], runs: Sequence[int]
                  ) -> tuple[list[array], list[array]]:
    """:func:`_time_in_runs_py`, in C where the optional extension is built and takes
    these inputs (as :func:`_time_compact`), else in Python."""
    out = _in_c("time_in_runs", engine, tis, mbs, own_of, dur_of, runs)
    return out if out is not None else _time_in_runs_py(engine, tis, mbs, own_of, dur_of, runs)


def _time_in_runs_py(engine: ListScheduler, tis: Sequence[list[int]], mbs: Sequence[list[int]],
                     own_of: Sequence[int], dur_of: Sequence[float], runs: Sequence[int]
                     ) -> tuple[list[array], list[array]]:
    """:func:`_time_compact` of orders whose event runs are known (``runs``: what it
    appended for these orders, flat, :class:`OrderTimer`), writing ``engine.end``: each
    rank's starts and ends. Every input is placed before the op that reads it, so no
    op waits; each op's start is computed as there (origin, its inputs' ends plus
    latency in the engine's order, then its rank's clock). The starts and ends as
    ``array('d')``."""
    m = engine.num_microbatches
    deps, clock, origin, end = engine.deps, engine.clock, engine.origin, engine.end
    done = [0] * len(tis)
    starts = [[0.0] * len(t) for t in tis]
    ends = [[0.0] * len(t) for t in tis]
    flat = iter(runs)
    for r, n in zip(flat, flat):
        ti, mb_of, st, en = tis[r], mbs[r], starts[r], ends[r]
        i0 = done[r]
        c = clock[r]
        for i in range(i0, i0 + n):
            k, mb = ti[i], mb_of[i]
            own = own_of[k]
            t = origin
            for base, latency in deps[own]:
                e = end[base + mb]
                e += latency
                if e > t:
                    t = e
            if c > t:
                t = c
            st[i] = t
            en[i] = end[own * m + mb] = c = t + dur_of[k]
        done[r], clock[r] = i0 + n, c
    return [array("d", st) for st in starts], [array("d", en) for en in ends]


def _own_of(num_stages: int) -> list[int]:
    """Per table index (``kind index · S + stage``, :data:`_TABLE_KINDS`): the engine's
    ``code · S + stage`` (a BW completes the B code)."""
    return [KIND_CODE[k] * num_stages + s for k in _TABLE_KINDS for s in range(num_stages)]


class _Deltas:
    """Makes each rank's memory deltas of :func:`_timed_columns`' columns (``array('d')``
    per rank, each op's ``mem_of`` at its table index) when called: the first time they
    are read (the planner reads them for a few of its ~ 400 timings). A class, not a
    closure, so that a timeline holding it still pickles."""

    __slots__ = ("schedule", "mem_of")

    def __init__(self, schedule: Schedule, mem_of: list[float]) -> None:
        self.schedule, self.mem_of = schedule, mem_of

    def __call__(self) -> list[array]:
        addr = _compact_addresses(self.schedule)
        assert addr is not None  # it was timed from these addresses
        mem_of = self.mem_of
        return [array("d", [mem_of[k] for k in t]) for t in addr[1]]


class _EventOrder:
    """Makes the plain timing's event order (the rank of each op in the order the engine
    places them) when called: run when a listing in event order first needs it (the
    timing itself does not record it, and :mod:`~pipeoffload.passes.steady_columns`
    writes most times without placing ops one by one). A class, not a closure, so that
    a timeline holding it still pickles.

    Guarantees: the order of :func:`_time_compact` run on ``schedule`` with ``comm`` and
    the per-table-index durations ``dur_of`` (the engine places the same ops in the same
    order whatever it records)."""

    __slots__ = ("schedule", "comm", "dur_of", "runs")

    def __init__(self, schedule: Schedule, comm: float, dur_of: list[float], runs: array | None = None) -> None:
        self.schedule, self.comm, self.dur_of = schedule, comm, dur_of
        #: The runs, flat (rank, count, …), when the timing kept or replayed them
        #: (:class:`OrderTimer`): the same runs as the engine's, which read no time there.
        self.runs = runs

    def __call__(self) -> array:
        schedule = self.schedule
        runs: Any
        if self.runs is None:
            addr = _compact_addresses(schedule)
            assert addr is not None  # it was timed from these addresses
            _, tis, mbs, m = addr
            engine = ListScheduler(schedule.placement.stage_to_rank, m, self.comm, 0.0)
            runs = []
            _time_compact(engine, tis, mbs, _own_of(schedule.num_stages), self.dur_of, runs)
        else:
            flat = iter(self.runs)
            runs = zip(flat, flat)
        order = array("l")
        for r, n in runs:
            order.extend(repeat(r, n))
        return order


def _serial(dur_of: Sequence[float], ends: Sequence[Sequence[float]]) -> bool:
    """Whether the engine's columns are :class:`EventColumns` ``serial``: every op starts
    at or after its rank's clock (the previous op's end), so each rank's starts and ends
    never fall; each lasts a positive time when every duration is positive and at least
    one unit in the last place of the latest end (then ``start + duration > start``)."""
    shortest = min(dur_of, default=0.0)
    latest = max([en[-1] for en in ends if en], default=0.0)
    return shortest > 0 and math.isfinite(latest) and latest >= 0 and shortest >= math.ulp(latest)


def _time_compact(engine: ListScheduler, tis: Sequence[list[int]], mbs: Sequence[list[int]], own_of: Sequence[int],
                  dur_of: Sequence[float], runs: list[tuple[int, int]] | None = None
                  ) -> tuple[list[array], list[array], int]:
    """:func:`_time_compact_py`, in C where the optional extension is built and takes
    these inputs (:mod:`pipeoffload._engine`: the same floats, the same ``runs``, the
    engine's ``clock`` and ``end`` left the same), else in Python."""
    out = _in_c("time_compact", engine, tis, mbs, own_of, dur_of, runs)
    return out if out is not None else _time_compact_py(engine, tis, mbs, own_of, dur_of, runs)


def _in_c(loop: str, engine: ListScheduler, tis: Sequence[list[int]], mbs: Sequence[list[int]],
          own_of: Sequence[int], dur_of: Sequence[float], runs: Any) -> Any:
    """The C loop ``loop`` of :mod:`pipeoffload._engine` on ``engine`` and these inputs; None
    where the extension is not in use or declines them (nothing is changed then)."""
    engine_c = c_engine()
    if engine_c is None:
        return None
    return getattr(engine_c, loop)(engine.num_microbatches, engine.deps, engine.clock, engine.origin, engine.end,
                                  tis, mbs, own_of, dur_of, runs)


def _time_compact_py(engine: ListScheduler, tis: Sequence[list[int]], mbs: Sequence[list[int]],
                     own_of: Sequence[int], dur_of: Sequence[float], runs: list[tuple[int, int]] | None = None
                     ) -> tuple[list[array], list[array], int]:
    """:func:`_time_rank_lists` over compact addresses (rank ``r``'s op ``i`` is
    ``own_of[tis[r][i]]``, microbatch ``mbs[r][i]``, runs for ``dur_of[tis[r][i]]``),
    writing the engine's end table ``engine.end``. Returns each rank's starts and ends
    (``array('d')``, 0.0 at an op not placed) and how many ops were placed (fewer than all on a
    deadlock). With ``runs``, appends ``(rank, count)`` for each run of ops the loop
    places on one rank in a row: the event order, rank by rank (per run, not per op,
    and only when asked: the planner reads the order of few timings). Lists throughout:
    their reads and writes are the interpreter's fast paths, arrays' are not."""
    m = engine.num_microbatches
    deps, clock, origin, end = engine.deps, engine.clock, engine.origin, engine.end
    unplaced = _NOT_PLACED
    p = len(tis)
    done = [0] * p
    starts = [[0.0] * len(t) for t in tis]
    ends = [[0.0] * len(t) for t in tis]
    waiting: dict[int, list[int]] = {}
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        ti, mb_of, st, en = tis[r], mbs[r], starts[r], ends[r]
        i = i0 = done[r]
        n = len(ti)
        c = clock[r]  # every op of list r is on rank r (_compact_addresses): its clock, while r runs
        while i < n:
            k, mb = ti[i], mb_of[i]
            own = own_of[k]
            t = origin
            missing = -1
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
            if c > t:
                t = c
            slot = own * m + mb
            st[i] = t
            en[i] = end[slot] = c = t + dur_of[k]
            i += 1
            woken = waiting.pop(slot, None)
            if woken:
                ready.extend(woken)
        done[r], clock[r] = i, c
        if runs is not None and i > i0:
            runs.append((r, i - i0))
    return [array("d", st) for st in starts], [array("d", en) for en in ends], sum(done)


def order_figures(
    placement: Placement,
    num_microbatches: int,
    orders: Sequence[Sequence[tuple[OpKind, int, int]]],
    costs: Costs,
    memory: MemoryDeltas,
) -> tuple[float, float, float]:
    """``(highest peak, longest span, makespan)`` of per-rank ``(kind, layer group,
    microbatch)`` compute orders (no overlapped pairs), without building the timeline.

    Guarantees: the same floats as ``max(tl.peak_memory())``, ``max(tl.spans())`` and
    ``tl.makespan`` of ``tl = simulate(schedule, costs, memory)`` for the schedule of
    these orders (same engine, same per-rank memory changes in the same order, the same
    sweep); orders with an op outside its list's rank (or its layer groups, or a negative
    microbatch) are simulated so. Raises ScheduleError on deadlock, as :func:`simulate`.
    Cost: O(number of ops).
    """
    dur, mem = costs.duration_table(placement), memory.delta_table(placement)
    S, rank_of, kind_index = placement.num_stages, placement.stage_to_rank, _TABLE_KIND_INDEX
    tis = [[kind_index[k] * S + s for k, s, _ in lst] for lst in orders]
    mbs = [[j for _, _, j in lst] for lst in orders]
    groups = [{s for _, s, _ in lst} for lst in orders]
    if any(x and min(x) < 0 for x in mbs) or any(s not in range(S) or rank_of[s] != r
                                                 for r, g in enumerate(groups) for s in g):
        return _simulated_figures(placement, num_microbatches, orders, costs, memory)
    m = max([num_microbatches] + [max(x) + 1 for x in mbs if x])
    dur_of = [dur[s][k] for k in _TABLE_KINDS for s in range(S)]
    mem_of = [mem[s][k] for k in _TABLE_KINDS for s in range(S)]
    # every op of list r is on rank r: the timing pass's compact loop
    starts, ends, placed = _time_compact(ListScheduler(rank_of, m, costs.comm), tis, mbs, _own_of(S), dur_of)
    if placed < sum(map(len, tis)):
        return _simulated_figures(placement, num_microbatches, orders, costs, memory)  # raises
    lasts = [[en[-1]] if en else [] for en in ends]
    if _serial(dur_of, lasts):
        # Each rank's ops run one after another, each lasting > 0 (and more than an ulp):
        # its starts and ends rise along its list, and its memory changes (an allocation at
        # an op's start, a free at its end) come in its order in the sweep — the running
        # sums of its deltas, the same floats (as simulate's columns, timeline._column_peak).
        first = [st[0] if st else math.inf for st in starts]
        last = [x[0] if x else -math.inf for x in lasts]
        peaks = [_clean(running_peak([mem_of[k] for k in ti])) for ti in tis]
    else:
        first, last, peaks = _figures_swept(tis, starts, dur_of, mem_of)
    spans = [b - a if b >= a else 0.0 for a, b in zip(first, last)]
    if not placed:
        return max(peaks, default=0.0), max(spans, default=0.0), 0.0
    return max(peaks), max(spans), max(last) - min(first)


def _simulated_figures(placement: Placement, num_microbatches: int,
                       orders: Sequence[Sequence[tuple[OpKind, int, int]]], costs: Costs,
                       memory: MemoryDeltas) -> tuple[float, float, float]:
    """:func:`order_figures` by its definition: the orders' schedule simulated (raises
    ScheduleError on a deadlock)."""
    from ..ir import build_schedule

    tl = simulate(build_schedule("orders", num_microbatches, placement, orders), costs, memory)
    return max(tl.peak_memory(), default=0.0), max(tl.spans(), default=0.0), tl.makespan


def _figures_swept(tis: list[list[int]], starts: Sequence[Sequence[float]], dur_of: list[float], mem_of: list[float]
                   ) -> tuple[list[float], list[float], list[float]]:
    """:func:`order_figures`' per-rank first start, last end and peak through the memory
    sweep (ops by table index): the general case (an op shorter than an ulp of the times)."""
    p = len(tis)
    first, last = [math.inf] * p, [-math.inf] * p
    peaks = []
    for r, ti in enumerate(tis):
        st = starts[r]
        points = []
        for i, k in enumerate(ti):
            a, b = st[i], st[i] + dur_of[k]
            if a < first[r]:
                first[r] = a
            if b > last[r]:
                last[r] = b
            d = mem_of[k]
            if d > 0:
                points.append((a, ALLOC, d))
            elif d < 0:
                points.append((b, FREE, d))
        peaks.append(_clean(max([0.0] + [level for _, _, level in memory_sweep(points)])))
    return first, last, peaks
