"""Bounds that decide a candidate without simulating it. Pure Python.

``time_bound``: no iteration can be shorter than the critical-path bound of
:func:`pipeline_bound` (each rank's compute for ``m`` microbatches, no earlier than the forward
chain reaches it, and followed by the backward chain below it). ``check_memory_bound``: a
candidate whose fullest rank's states plus one microbatch of its largest layer group's
activation exceed the budget cannot fit.
"""

from __future__ import annotations

from ..costmodel.hardware import GiB
from ..ir import Placement
from .refusals import Refused
from .sharding import RECOMPUTE_ORDER, CostTable, rank_states
from .space import Family, Problem, Split, placement_of
from .step import step_after_pipeline

__all__ = ["time_bound", "pipeline_bound", "check_memory_bound"]


def pipeline_bound(group_costs: tuple[tuple[float, float, float], ...], placement: Placement, m: int) -> float:
    """A lower bound of the makespan (ms) of any schedule of ``m`` microbatches on ``placement``
    whose ops on one rank run one at a time, with op ``(F, B, W)`` durations ``group_costs`` per
    layer group (a fused BW lasts B + W; recompute is inside B).

    Per rank ``r`` with lowest layer group ``lo`` and highest ``hi`` (the largest of four):

    - no op of ``r`` starts before the forward chain of groups ``0..lo−1`` (``head``), and ``r``
      then computes ``m·(F+B+W)`` of its groups;
    - the same, counting only its F and B, after the last of which the backward chain of groups
      ``lo−1..0`` of that microbatch still runs (``tail``);
    - no B or W of ``r`` starts before every forward and the backward chain of groups above
      ``hi`` (``head_b``), and ``r`` then computes ``m·(B+W)``;
    - the same, counting only its B, followed by ``tail``.

    Args:
        group_costs: ``(F, B, W)`` ms per layer group, in layer order.
        placement: which rank holds each layer group.
        m: microbatches.

    Returns:
        The bound in ms (cross-rank hops and transfers are left out: it stays a lower bound).

    Guarantees: ≥ ``m`` × the busiest rank's compute (the bound this one replaced); ≤ the
    makespan of every valid schedule timed with these durations.
    """
    n = len(group_costs)
    pre_f, pre_b = [0.0] * (n + 1), [0.0] * (n + 1)  # sums over groups 0..s-1
    for s, (f, b, _) in enumerate(group_costs):
        pre_f[s + 1] = pre_f[s] + f
        pre_b[s + 1] = pre_b[s] + b
    best = 0.0
    for r in range(placement.num_ranks):
        stages = placement.stages_of(r)
        lo, hi = min(stages), max(stages)
        f = sum(group_costs[s][0] for s in stages)
        b = sum(group_costs[s][1] for s in stages)
        w = sum(group_costs[s][2] for s in stages)
        head, tail = pre_f[lo], pre_b[lo]
        head_b = pre_f[n] + pre_b[n] - pre_b[hi + 1]
        best = max(best, head + max(m * (f + b + w), m * (f + b) + tail),
                   head_b + max(m * (b + w), m * b + tail))
    return best


def time_bound(costs: CostTable, split: Split, family: Family, m: int, recompute: bool | str,
               dp_sharding: str) -> float:
    """A lower bound of the iteration time (ms) of ``family`` on ``split`` with ``recompute``:
    :func:`pipeline_bound` of its per-GPU costs plus the step after the pipeline (exact:
    :func:`~.step.step_after_pipeline` with ``dp_sharding``; the exposed data-parallel time is ≥ 0)."""
    sh = costs.sharded(recompute, split.pp, family.v, split.tp, split.sp)
    placement = placement_of(family, split.pp)
    step = step_after_pipeline(costs.model, costs.hardware, costs.node, sh.state, placement, split.tp, split.dp,
                               dp_sharding, split.tp * split.pp * split.dp)
    return pipeline_bound(sh.costs.group_costs, placement, m) + step.ms  # type: ignore[arg-type]


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
