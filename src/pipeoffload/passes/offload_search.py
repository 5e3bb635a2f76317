"""Order and offload chosen together under a memory limit, by search (loop placement). Pure Python.

The offload pass (:mod:`.offload`) keeps the order it is given; below 1F1B's memory the best
order for a limit is often none a generator makes: the exact scheduler (docs/solver.md) runs
rank 0 as 1F1B with one forward more in flight than the limit, that one on the host, and the
later ranks as zero-bubble orders within the limit. :func:`best_limited_plan` searches the
rank window orders (:mod:`pipeoffload.schedules.rank_windows`: per rank its own warm-up and
W deferral), each given to the offload pass's limit mode, from structured seeds and then by
local search (one rank's warm-up or deferral ±1 while that improves). A second stage takes the
orders that fit the limit without copies and fills their idle gaps within it
(:func:`~pipeoffload.schedules.hole_fill.fill_holes`), again from the seeds and then their
neighbours while that improves: on a slow link (a round trip as long as two microbatches'
compute) the best plan offloads nothing, and its order is one of those.

Pruning: the limit mode only makes ops wait (each rank keeps its order, its first op and
every start stay or move later), so an order's bubble rate without offload is a lower bound
on its bubble rate with it; an order whose bound is not below the best found is not planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError
from ..ir import OpKind, Placement, Schedule
from ..schedules.hole_fill import fill_holes
from ..schedules.rank_windows import Windows, neighbours, seeds, window_order
from .offload import OffloadResult, plan_offload
from .timing import simulate

#: Default number of orders given to the limit mode per search (the rest are timed only).
PLANS = 40
#: Orders timed (without offload) per search, at most.
TIMINGS = 4000
#: Orders within the limit given to hole filling per search, at most.
FILLS = 16
_EPS = 1e-12
_TOL = 1e-9


@dataclass
class LimitedPlan:
    """The best rank window order found and its plan within the limit."""

    windows: Windows  #: (warmup per rank, defer per rank)
    result: OffloadResult  #: the limit mode's plan on that order (schedule, timeline, transfers)
    filled: bool  #: the order is the rank window order after hole filling (no copies needed)
    planned: int  #: orders given to the limit mode
    timed: int  #: orders timed without offload

    @property
    def bubble_rate(self) -> float:
        return self.result.timeline.bubble_rate


def best_limited_plan(
    p: int, m: int, limit: float, *, costs: Costs | None = None, memory: MemoryDeltas | None = None,
    offload_time: float = 0.0, link_group: int = 2, solo_factor: float = 0.7, plans: int = PLANS,
) -> LimitedPlan | None:
    """The lowest-bubble rank window order and offload plan found within ``limit``.

    Args:
        p: ranks (loop placement, one layer group each); m: microbatches.
        limit: every rank's activation peak at most this, in the units of ``memory``.
        costs, memory: durations (with ``comm``) and memory deltas (defaults: unit costs,
            +1/0/−1).
        offload_time, link_group, solo_factor: the host link, as :func:`.offload.plan_offload`.
        plans: at most this many orders are given to the limit mode (the search's budget).

    Returns:
        The best order, its plan (``plan_offload(..., offload_chunks=1, mem_limit=limit)``,
        or with ``offload_chunks=0`` for a hole-filled order: ``filled``) and the search's
        counts; None when no order tried has a plan within ``limit``.

    Raises:
        ParameterError: naming ``limit`` (not a positive finite number), ``plans`` (below 1),
            or the parameter a generator or the offload pass refuses.

    Guarantees:
        The result's peak on every rank ≤ ``limit``; its schedule is a valid rank window
        order with its transfer ops (the limit mode's guarantees), or a hole-filled one with
        none; deterministic; the result has the lowest bubble rate (then makespan) among the
        orders planned and filled. Cost: at most ``plans`` plans, :data:`FILLS` hole fillings
        and :data:`TIMINGS` timings.
    """
    costs = costs or Costs()
    memory = memory or MemoryDeltas()
    if not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0):
        raise ParameterError("limit", f"must be a positive number (the per-rank activation limit), got {limit!r}")
    if not (isinstance(plans, int) and plans >= 1):
        raise ParameterError("plans", f"must be an integer ≥ 1, got {plans!r}")
    search = _Search(p, m, limit, costs, memory, dict(
        offload_time=offload_time, link_group=link_group, solo_factor=solo_factor, comm=costs.comm), plans)
    in_flight = _in_flight(p, limit, memory)
    search.run(seeds(p, m, in_flight))
    search.fill([((0,) * p, (0,) * p)] + seeds(p, m, in_flight))
    return search.best


def _in_flight(p: int, limit: float, memory: MemoryDeltas) -> int:
    """How many forwards the rank with the largest forward can hold within ``limit``."""
    a = max(d[OpKind.F] for d in memory.delta_table(Placement.loop(p, 1)))
    return max(1, int(math.floor(limit / a + 1e-9))) if a > 0 else p


class _Search:
    """One search's state: orders seen, counts, the best plan."""

    def __init__(self, p: int, m: int, limit: float, costs: Costs, memory: MemoryDeltas, link: dict,
                 plans: int) -> None:
        self.p, self.m, self.limit, self.costs, self.memory, self.link = p, m, limit, costs, memory, link
        self.plans, self.planned, self.timed = plans, 0, 0
        self.seen: set[Windows] = set()
        self.fitting: dict[Windows, Schedule] = {}  #: orders timed within the limit: their schedule
        self.filled: set[Windows] = set()
        self.best: LimitedPlan | None = None

    def run(self, start: list[Windows]) -> None:
        """Plan the seeds (lowest bound first), then climb from the best while a neighbour
        improves it."""
        self._try_all(start)
        while self.best is not None:
            before = self.best.windows
            self._try_all(neighbours(before, self.m))
            if self.best.windows == before:
                break
        self._count()

    def fill(self, start: list[Windows]) -> None:
        """Hole filling within the limit (:func:`~pipeoffload.schedules.hole_fill.fill_holes`,
        caps = the limit): of ``start``, those within the limit without copies, then the
        neighbours (within the limit) of the best filled one while that improves, at most
        :data:`FILLS` in all. A filled order that beats the best becomes it, with no copies."""
        self._try_all(start)  # times the ones not seen yet (and plans those that could win)
        top: tuple[float, Windows] | None = None  # the best filled order: (bubble rate, windows)
        queue = [w for w in start if w in self.fitting]
        while True:
            improved = False
            for w in queue:
                if len(self.filled) >= FILLS:
                    break
                if w in self.filled:
                    continue
                self.filled.add(w)
                b = self._fill_one(w)
                if top is None or b < top[0] - _EPS:
                    top, improved = (b, w), True
            if top is None or not improved or len(self.filled) >= FILLS:
                break
            nbrs = neighbours(top[1], self.m)
            self._try_all(nbrs)
            queue = [w for w in nbrs if w in self.fitting]
        self._count()

    def _fill_one(self, w: Windows) -> float:
        """Fill ``w``'s holes within the limit; keep it when it beats the best; its bubble rate."""
        filled = fill_holes(self.fitting[w], self.costs, self.memory, [self.limit] * self.p)
        tl = simulate(filled, self.costs, self.memory)
        if self.best is None or tl.bubble_rate < self.best.bubble_rate - _EPS:
            res = plan_offload(filled, tl, offload_chunks=0, mem_limit=self.limit, **self.link)
            if self._better(res):
                self.best = LimitedPlan(w, res, True, 0, 0)
        return tl.bubble_rate

    def _count(self) -> None:
        if self.best is not None:
            self.best.planned, self.best.timed = self.planned, self.timed

    def _try_all(self, cands: list[Windows]) -> None:
        """Time each order of ``cands`` not seen yet (noting those within the limit), then give
        them to the limit mode, lowest bound first, while the bound is below the best."""
        timed = []
        for w in cands:
            if w in self.seen or self.timed >= TIMINGS:
                continue
            self.seen.add(w)
            s = window_order(self.p, self.m, *w)
            tl = simulate(s, self.costs, self.memory)
            self.timed += 1
            if max(tl.peak_memory(), default=0.0) <= self.limit + _TOL * max(1.0, self.limit):
                self.fitting[w] = s
            timed.append((tl.bubble_rate, tl.makespan, w, s, tl))
        timed.sort(key=lambda t: (t[0], t[1], t[2]))
        for bound, _, w, s, tl in timed:
            if self.planned >= self.plans:
                return
            if self.best is not None and bound >= self.best.bubble_rate - _EPS:
                return  # sorted: no later order can beat the best either
            self.planned += 1
            try:
                res = plan_offload(s, tl, offload_chunks=1, mem_limit=self.limit, **self.link)
            except ParameterError:  # no plan keeps every rank within the limit
                continue
            if self._better(res):
                self.best = LimitedPlan(w, res, False, 0, 0)

    def _better(self, res: OffloadResult) -> bool:
        """Whether ``res`` has a lower bubble rate than the best, or the same and a shorter makespan."""
        if self.best is None:
            return True
        b, best = res.timeline.bubble_rate, self.best.bubble_rate
        return b < best - _EPS or (b <= best + _EPS and res.makespan < self.best.result.makespan - _EPS)
