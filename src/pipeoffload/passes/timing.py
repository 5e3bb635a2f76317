"""Timing pass: place every compute op of a schedule in time (list scheduling).

Each rank runs its ops in the given order, each as early as its dependencies allow
(ALGORITHMS.md §1): ``F(s,j)`` after ``F(s−1,j)``; ``B/BW(s,j)`` after ``B/BW(s+1,j)``
(the last layer group's after its own ``F``); ``W(s,j)`` after ``B(s,j)``. A dependency
that crosses ranks adds ``costs.comm``. The result is a :class:`Timeline`.

The same engine proves a schedule deadlock-free: if some rank can never run its next
op, :class:`ScheduleError` names the cycle of waiting ranks.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from ..costs import Costs, MemoryDeltas
from ..errors import ScheduleError
from ..ir import Op, OpKind, Schedule
from ..timeline import TimedOp, Timeline

#: Completion key of an op: ("F"|"B"|"W", stage, microbatch). B and BW both
#: complete the "B" key (they produce the input gradient).
Key = tuple[str, int, int]

_F, _B, _W = OpKind.F, OpKind.B, OpKind.W


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


def _key_str(key: Key) -> str:
    kind = {"F": "F", "B": "B/BW", "W": "W"}[key[0]]
    return f"{kind}(stage={key[1]}, mb={key[2]})"


def run_list_schedule(
    schedule: Schedule,
    duration: Callable[[Op], float],
    comm: float,
    memory: Callable[[Op], float] | None = None,
) -> list[TimedOp]:
    """Core engine. Returns the timed compute ops; raises ScheduleError on deadlock."""
    p, S = schedule.num_ranks, schedule.num_stages
    ranks = [[o for o in lst if o.kind.is_compute] for lst in schedule.ranks]
    finish: dict[Key, tuple[float, int]] = {}
    waiting: dict[Key, list[int]] = {}
    ptr = [0] * p
    clock = [0.0] * p
    events: list[TimedOp] = []
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        ops = ranks[r]
        while ptr[r] < len(ops):
            op = ops[ptr[r]]
            t = clock[r]
            blocked = None
            for dk in dependencies(op, S):
                f = finish.get(dk)
                if f is None:
                    blocked = dk
                    break
                end, dr = f
                if dr != r:
                    end += comm
                if end > t:
                    t = end
            if blocked is not None:
                waiting.setdefault(blocked, []).append(r)
                break
            end = t + duration(op)
            events.append(TimedOp(op, t, end, "compute", memory(op) if memory else 0.0))
            key = completion_key(op)
            finish[key] = (end, r)
            clock[r] = end
            ptr[r] += 1
            woken = waiting.pop(key, None)
            if woken:
                ready.extend(woken)
    stuck = [r for r in range(p) if ptr[r] < len(ranks[r])]
    if stuck:
        raise ScheduleError(_deadlock_message(schedule, ranks, ptr, stuck))
    return events


def _deadlock_message(schedule: Schedule, ranks: list[list[Op]], ptr: list[int], stuck: list[int]) -> str:
    S = schedule.num_stages
    runs = {completion_key(o): o for lst in ranks for o in lst}

    def blocker(r: int) -> tuple[Op, Key]:
        op = ranks[r][ptr[r]]
        done = {completion_key(o) for o in ranks[r][: ptr[r]]}
        for dk in dependencies(op, S):
            producer = runs.get(dk)
            if producer is None or producer.rank != r or dk not in done:
                if producer is None or not _completed(producer, ranks, ptr):
                    return op, dk
        return op, dependencies(op, S)[0]

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
    costs = costs or Costs()
    memory = memory or MemoryDeltas()
    pl = schedule.placement
    dur = costs.duration_table(pl)
    mem = memory.delta_table(pl)
    events = run_list_schedule(
        schedule,
        lambda o: dur[o.stage][o.kind],
        costs.comm,
        lambda o: mem[o.stage][o.kind],
    )
    return Timeline(
        num_ranks=schedule.num_ranks,
        events=events,
        name=schedule.name,
        num_microbatches=schedule.num_microbatches,
        chunks=schedule.chunks,
        memory_unit=memory_unit,
        meta={"params": dict(schedule.params)},
    )
