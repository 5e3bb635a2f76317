"""The pass pipeline, written once: validate → time → offload → communication.

Every front end that turns a generated schedule into something to report or run goes
through :func:`lower`: the runtime (with ``comm=True``, for the program each rank
interprets), the ``simulate`` command and the planner (timing and offload). Pure
Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import Costs, MemoryDeltas
from ..ir import Schedule, overlap_pairs
from ..timeline import Timeline
from .comm import insert_comm
from .offload import OffloadOptions, OffloadResult, plan_offload
from .steady_columns import steady_timeline
from .timing import _simulate_columns, simulate
from .validate import check_rules, counted_shape, every_op_placed, validate

__all__ = ["Lowered", "lower", "validate_and_time"]


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
    compute = schedule.compute_only()
    if validated:
        base = simulate(compute, costs, memory, memory_unit=memory_unit)
    elif schedule.compact is not None and schedule.compact.compute_only():  # compute shares its arrays
        base = validate_and_time(compute, costs, memory, memory_unit)
    else:
        validate(schedule)
        base = simulate(compute, costs, memory, memory_unit=memory_unit)
    program, timeline, result = schedule, base, None
    if offload is not None:
        result = plan_offload(compute, base, comm=costs.comm, options=offload)
        program, timeline = result.schedule, result.timeline
    if comm:
        program = insert_comm(program)
    return Lowered(program, timeline, base, result)


def validate_and_time(schedule: Schedule, costs: Costs | None = None, memory: MemoryDeltas | None = None,
                      memory_unit: str = "units") -> Timeline:
    """:func:`~pipeoffload.passes.validate.validate` then
    :func:`~pipeoffload.passes.timing.simulate`, with the deadlock proof and the timing
    one engine run where the schedule allows it.

    The proof places each rank's ops in order, each once its inputs are placed; the
    timing does the same and also times them. For a compute-only schedule held as arrays
    without overlapped pairs whose op counts make it complete once every op is placed
    (:func:`~pipeoffload.passes.validate.counted_shape`, O(p) calls into C), the timing
    that places every op into a full end table is the proof
    (:func:`~pipeoffload.passes.validate.every_op_placed`): the rules' per-op pass,
    the compact addresses made twice and the proof's own run are skipped; the timing
    writes the periodic steady state by shifting where that gives the same floats
    (:mod:`~pipeoffload.passes.steady_columns`), and its end table (every slot written,
    each by the engine or by the shift its argument proves) is the proof's. A schedule
    with overlapped pairs is checked for rules 1 to 4 and timed: the timing places each
    pair as one op as the proof does and raises the proof's message on a deadlock.
    Otherwise, and whenever the compact timing does not place every op, the two passes
    run as ever.

    Args:
        schedule: the schedule to check and time.
        costs, memory, memory_unit: as :func:`~pipeoffload.passes.timing.simulate`.

    Returns:
        The timeline :func:`~pipeoffload.passes.timing.simulate` returns.

    Raises:
        ScheduleError: the error :func:`~pipeoffload.passes.validate.validate` raises
        (the same first broken rule and message), or the timing's.

    Guarantees: the same timeline (the same floats and event order) and the same error
    as ``validate(schedule); simulate(schedule, costs, memory, memory_unit)``; the
    shortcut's verdict is checked against the two passes by tests/test_validate_timed.py.
    """
    if counted_shape(schedule):
        placed: list = []
        steady = steady_timeline(schedule, costs or Costs(), memory or MemoryDeltas(), memory_unit, placed)
        timeline = steady[0] if steady else _simulate_columns(schedule, costs, memory, memory_unit, placed)
        if timeline is not None and every_op_placed(schedule, placed[0]):
            return timeline
    elif overlap_pairs(schedule) and check_rules(schedule):
        # Rules 1 to 4 hold; the timing places each pair as one op exactly as the proof
        # does (_place_overlapped, the same pairs) and raises the proof's message.
        return simulate(schedule, costs, memory, memory_unit)
    validate(schedule)
    return simulate(schedule, costs, memory, memory_unit)
