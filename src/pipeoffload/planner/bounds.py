"""Bounds that decide a candidate without simulating it. Pure Python.

``time_bound``: no iteration can be shorter than the busiest rank's compute for ``m``
microbatches (no bubble). ``check_memory_bound``: a candidate whose fullest rank's states plus
one microbatch of its largest layer group's activation exceed the budget cannot fit.
"""

from __future__ import annotations

from ..costmodel.hardware import GiB
from .refusals import Refused
from .sharding import RECOMPUTE_ORDER, CostTable, rank_compute, rank_states
from .space import Family, Problem, Split, placement_of

__all__ = ["time_bound", "check_memory_bound"]


def time_bound(costs: CostTable, split: Split, family: Family, m: int, recompute: bool) -> float:
    """A lower bound of the iteration time (ms): the busiest rank's compute for m microbatches."""
    sh = costs.sharded(recompute, split.pp, family.v, split.tp, split.sp)
    return m * max(rank_compute(sh, placement_of(family, split.pp)))


def check_memory_bound(problem: Problem, costs: CostTable, split: Split, family: Family, m: int) -> None:
    """Memory lower bound before simulating: the states of the fullest rank plus one microbatch of
    its largest layer group's activation (under the least-memory recompute setting) must fit the
    budget; else raises :class:`Refused` ("oom", by how much at least)."""
    recompute = [rc for rc in RECOMPUTE_ORDER if rc in problem.options.recompute][-1]  # least memory
    sh = costs.sharded(recompute, split.pp, family.v, split.tp, split.sp)
    placement = placement_of(family, split.pp)
    deltas = sh.memory.group_deltas
    states = rank_states(sh, placement, split.dp, problem.options.dp_sharding)
    worst, who = 0.0, 0
    for r, (a, b) in enumerate(states):
        one = max(max(deltas[s][0], deltas[s][0] + deltas[s][1]) for s in placement.stages_of(r))  # type: ignore[index]
        if a + b + one > worst:
            worst, who = a + b + one, r
    if worst > problem.budget:
        a, b = states[who]
        raise Refused("oom", f"parameters {a / GiB:.1f} + gradients/optimizer {b / GiB:.1f} GiB on rank {who} "
                             f"plus one microbatch's activation exceed the budget (lower bound, not simulated)",
                      over=worst - problem.budget, config=f"{family.label} {split} m={m}")
