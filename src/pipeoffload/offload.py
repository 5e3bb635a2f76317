"""Selective activation offload in one call: time a schedule, then plan its transfers.

>>> from pipeoffload.schedules import generate
>>> from pipeoffload.offload import plan_offload
>>> res = plan_offload(generate("group-interleaved", p=8, m=32, v=2, g=4), chunks=1)
>>> max(res.peak) * 2, max(res.peak_no_offload) * 2   # chunk units
(5.0, 12.0)

Pure Python (no torch). The pass itself is :mod:`pipeoffload.passes.offload`.
"""

from __future__ import annotations

from .costs import Costs, MemoryDeltas
from .ir import Schedule
from .passes.offload import LinkModel, OffloadResult, Transfer, host_memory_curve, largest_feasible_chunks, offload_plan
from .passes.timing import simulate

__all__ = [
    "plan_offload",
    "offload_plan",
    "largest_feasible_chunks",
    "host_memory_curve",
    "OffloadResult",
    "Transfer",
    "LinkModel",
]


def plan_offload(
    schedule: Schedule,
    costs: Costs | None = None,
    memory: MemoryDeltas | None = None,
    memory_unit: str = "units",
    **options,
) -> OffloadResult:
    """Time ``schedule`` with ``costs``/``memory`` (defaults: unit costs, +1/0/−1) and
    run :func:`~pipeoffload.passes.offload.offload_plan` on it with ``options``
    (chunks, auto, offload_time, transfer_times, link_group, solo_factor, tolerance,
    on_infeasible, postpone_warmup). The cost model's comm latency is passed on."""
    costs = costs or Costs()
    tl = simulate(schedule.compute_only(), costs, memory, memory_unit=memory_unit)
    options.setdefault("comm", costs.comm)
    return offload_plan(schedule.compute_only(), tl, **options)
