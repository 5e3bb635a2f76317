"""The pass pipeline, written once: validate → time → offload → communication.

Every front end that turns a generated schedule into something to report or run goes
through :func:`lower`: the runtime (with ``comm=True``, for the program each rank
interprets), the ``simulate`` command and the planner (timing and offload). Pure
Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import Costs, MemoryDeltas
from ..ir import Schedule
from ..timeline import Timeline
from .comm import insert_comm
from .offload import OffloadOptions, OffloadResult, plan_offload
from .timing import simulate
from .validate import validate

__all__ = ["Lowered", "lower"]


@dataclass
class Lowered:
    """What :func:`lower` produced."""

    #: The program: the compute ops, the offload pass's transfer ops when offload was
    #: planned, and the sends/receives when ``comm``.
    schedule: Schedule
    #: The simulated timeline of the compute ops (and transfers, when offloading).
    timeline: Timeline
    #: The timeline without offload (the same object as ``timeline`` when none was planned).
    base_timeline: Timeline
    #: The offload pass's result, or None.
    offload: OffloadResult | None = None


def lower(
    schedule: Schedule,
    costs: Costs | None = None,
    memory: MemoryDeltas | None = None,
    *,
    memory_unit: str = "units",
    offload: OffloadOptions | None = None,
    comm: bool = False,
    validated: bool = False,
) -> Lowered:
    """The one pass pipeline: validate, time, plan offload, add communication.

    Args:
        schedule: compute ops per rank (a generator's output, an imported CSV, ...).
        costs, memory: per-op durations and memory deltas (defaults: unit costs,
            +1/0/−1 memory), in ``memory_unit``.
        offload: the offload pass's settings (None: no offload; transfer ops the
            schedule already holds are kept).
        comm: add the sends and receives (proved deadlock-free).
        validated: the caller vouches that ``schedule`` passed
            :func:`~pipeoffload.passes.validate.validate` already (every generator's
            output does), so it is not checked again; the timing pass still raises
            ScheduleError on a deadlock. The planner times thousands of generated
            schedules and skips the second check.

    Returns:
        :class:`Lowered`: ``schedule`` (the program: with transfers and, with ``comm``,
        messages), ``timeline`` (timed with offload), ``base_timeline`` (timed without),
        ``offload`` (the pass's result or None).

    Raises:
        ScheduleError: an invalid or deadlocking schedule.
        ParameterError: bad offload settings (naming the keyword argument).

    Guarantees:
        The input is not modified; ``timeline`` times exactly the compute ops of
        ``schedule`` (plus the transfers the pass placed).
    """
    costs = costs or Costs()
    if not validated:
        validate(schedule)
    compute = schedule.compute_only()
    base = simulate(compute, costs, memory, memory_unit=memory_unit)
    program, timeline, result = schedule, base, None
    if offload is not None:
        result = plan_offload(compute, base, comm=costs.comm, options=offload)
        program, timeline = result.schedule, result.timeline
    if comm:
        program = insert_comm(program)
    return Lowered(program, timeline, base, result)
