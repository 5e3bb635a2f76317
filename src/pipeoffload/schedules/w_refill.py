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
from typing import Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Schedule, build_schedule
from ..passes.timing import B_CODE, KIND_CODE, W_CODE
from .zb_auto import Infeasible, Tracker

__all__ = ["refill_weights"]


def refill_weights(schedule: Schedule, costs: Costs, memory: MemoryDeltas, caps: Sequence[float],
                   partial: bool = True) -> Schedule:
    """``schedule`` with its W's re-placed (module docstring); ``caps``: per-rank memory
    caps. Raises :class:`.zb_auto.Infeasible` if a rank cannot keep its cap."""
    pl, m = schedule.placement, schedule.num_microbatches
    tr = Tracker(pl, m, costs, memory, float("inf"))
    skeleton = [[(KIND_CODE[o.kind], o.stage, o.microbatch) for o in lst if o.kind is not OpKind.W]
                for lst in schedule.ranks]
    pending: list[deque] = [deque() for _ in skeleton]
    done = [0] * len(skeleton)
    waiting: dict[int, list[int]] = {}
    ready = deque(range(len(skeleton)))
    while ready:
        r = ready.popleft()
        while done[r] < len(skeleton[r]):
            code, stage, mb = skeleton[r][done[r]]
            missing = tr.missing_input(code, stage, mb)
            if missing >= 0:
                waiting.setdefault(missing, []).append(r)
                break
            _fill(tr, pending[r], r, code, stage, mb, caps[r], partial)
            tr.put(code, stage, mb)
            if code == B_CODE:
                pending[r].append((stage, mb))
            done[r] += 1
            for woken in waiting.pop(tr.slot(code, stage, mb), []):
                ready.append(woken)
    if any(done[r] < len(skeleton[r]) for r in range(len(skeleton))):
        raise Infeasible("the skeleton deadlocks")
    for r, q in enumerate(pending):
        while q:
            tr.put(W_CODE, *q.popleft())
    return build_schedule(schedule.name, m, pl, tr.order, **schedule.params)


def _fill(tr: Tracker, pending: deque, r: int, code: int, stage: int, mb: int, cap: float, partial: bool) -> None:
    """Pending W's before op (code, stage, mb) of rank ``r``: those that end before its input
    arrives, one more for a partly idle gap (``partial``), and those its memory needs."""
    arrive = tr.arrival(code, stage, mb)
    dur = tr.dur
    while pending and tr.clock[r] + dur[pending[0][0]][W_CODE] <= arrive + 1e-12:
        tr.put(W_CODE, *pending.popleft())
    if partial and pending and tr.clock[r] < arrive - 1e-12:
        tr.put(W_CODE, *pending.popleft())
    tol = 1e-9 * max(1.0, abs(cap))
    while tr.level[r] + tr.mem[stage][code] > cap + tol:
        if not pending:
            raise Infeasible(f"rank {r} cannot keep its cap {cap:g}")
        tr.put(W_CODE, *pending.popleft())
