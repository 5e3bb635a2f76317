"""The timing pass through the periodic steady state: a generated schedule's timeline
with the middle periods written by shifting instead of timed op by op.

Generated orders repeat in their middle: on each rank the op ``P`` places later is the
same op one microbatch on. :mod:`pipeoffload.passes.steady_timing` holds the one
implementation of the argument (its module docstring): it runs the timing pass's
recurrence up to a cut, checks that a period ends exactly ``T`` after the one before
and that the period's inputs lie inside the periodic ranges, then writes the ends of
the later periods by slices of the engine's end table (the same floats, when every
duration and the latency are exact binary fractions) and times the cool-down. This
module uses that engine for :func:`~pipeoffload.passes.timing.simulate`'s columns:
each op's end is the end table's, its start ``end − duration`` (exact under the same
condition: ``end = start + duration`` was an exact sum), and the event order, which
only a listing in event order reads, is made when first read by the plain timing.

Pure Python.
"""

from __future__ import annotations

from array import array
from operator import add, sub

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Schedule
from ..timeline import EventColumns, Timeline
from .steady_timing import _Engine, _exact, _run_with_skip
from .timing import KIND_CODE, _EventOrder, _timeline_fields

__all__ = ["steady_timeline"]

_TABLE_KINDS = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)  #: the compact kind codes' order
_CODE_OF_INDEX = tuple(KIND_CODE[k] for k in _TABLE_KINDS)  #: kind index -> engine code (BW: B)


def steady_timeline(schedule: Schedule, costs: Costs, memory: MemoryDeltas, memory_unit: str,
                    placed: list | None = None) -> tuple[Timeline, int] | None:
    """``simulate(schedule, costs, memory, memory_unit)`` with the periodic steady state
    shifted, and how many periods were shifted; None where the shortcut does not apply.

    Args:
        schedule: a compute-only schedule held as
            :class:`~pipeoffload.ir.CompactOrders`, without overlapped pairs, every
            microbatch in ``[0, m)`` (:func:`~pipeoffload.passes.validate.counted_shape`).
        costs, memory, memory_unit: as :func:`~pipeoffload.passes.timing.simulate`.
        placed: when given, gets the engine's end table appended (``-inf`` at an op
            never placed; the validator's fused proof reads it).

    Returns:
        The timeline and the number of periods written by shifting (0: every op timed
        by the engine), or None: a duration that is not a positive float or not an
        exact binary fraction (:func:`~pipeoffload.passes.steady_timing._exact`), B
        and BW ops together, or the orders deadlock (the caller times them as ever).

    Guarantees: the same timeline as :func:`~pipeoffload.passes.timing.simulate`: the
    same floats (the engine's recurrence; the shifted ends by
    :mod:`~pipeoffload.passes.steady_timing`'s argument, tests/test_steady_columns.py
    against the plain timing) and, when read, the same event order (made by the plain
    timing). Cost: the engine over the warm-up and cool-down plus O(p·m) list work in
    C; O(p·m) engine steps when no period is shifted.
    """
    compact, pl = schedule.compact, schedule.placement
    S, m = pl.num_stages, schedule.num_microbatches
    kind_bytes = [k.tobytes() for k in compact.kinds]  # one byte a kind code
    uses_bw = any(k.count(3) for k in kind_bytes)
    if uses_bw and any(k.count(1) for k in kind_bytes):
        return None  # B and BW share the engine's code but not their duration
    dur_t, mem_t = costs.duration_table(pl), memory.delta_table(pl)
    dur_of = [dur_t[s][k] for k in _TABLE_KINDS for s in range(S)]
    mem_of = [mem_t[s][k] for k in _TABLE_KINDS for s in range(S)]
    if not all(type(x) is float for x in dur_of + mem_of) or min(dur_of) <= 0:
        return None
    durc = dur_of[:S] + dur_of[3 * S:] + dur_of[2 * S:3 * S] if uses_bw else dur_of[:3 * S]  # per engine code
    n_ops = sum(map(len, compact.kinds))
    if not _exact(durc + [costs.comm], n_ops):
        return None
    own_of = [_CODE_OF_INDEX[k] * S + s for k in range(4) for s in range(S)]
    slot0 = [own * m for own in own_of]  # table index -> end-table slot of microbatch 0
    tis = [list(map(add, map(S.__mul__, ks), ss)) for ks, ss in zip(compact.kinds, compact.stages)]
    codes = [list(map(add, map(slot0.__getitem__, ti), js)) for ti, js in zip(tis, compact.mbs)]
    eng = _Engine(pl, m, costs.comm, codes, durc)
    skipped = _run_with_skip(eng, m)
    if any(d < len(c) for d, c in zip(eng.done, codes)):
        return None  # a deadlock: the plain timing and the validator name it
    end = eng.end
    if placed is not None:
        placed.append(end)
    ends = [array("d", map(end.__getitem__, c)) for c in codes]
    ranges = eng.ranges or [(0, 0)] * len(codes)
    periods = eng.periods or [0] * len(codes)
    starts = [array("d", map(sub, e, _column(dur_of, ti, c, rng, per, m)))
              for e, ti, c, rng, per in zip(ends, tis, codes, ranges, periods)]
    mems = [_column(mem_of, ti, c, rng, per, m) for ti, c, rng, per in zip(tis, codes, ranges, periods)]
    ops = [compact.rank_ops(pl, r) for r in range(len(codes))]
    columns = EventColumns(ops, starts, ends, mems, _EventOrder(schedule, costs.comm, dur_of), serial=True)
    return Timeline.from_columns(schedule.num_ranks, columns, **_timeline_fields(schedule, memory_unit)), skipped


def _column(table: list[float], ti: list[int], codes: list[int], rng: tuple[int, int], period: int,
            m: int) -> array:
    """``array('d')`` of ``table[t]`` for each op's table index ``t`` in ``ti``. Inside the
    periodic range ``rng`` of ``codes`` (each op the one ``period`` before it one
    microbatch on: the same table index) one period's values are repeated (in C, the same
    floats), once each chain of the range is checked to be one op (a microbatch wrapping
    into the next op's slots would change it); elsewhere one lookup per op."""
    k = _repeats(codes, rng, period, m)
    if k < 2:
        return array("d", map(table.__getitem__, ti))
    get, lo = table.__getitem__, rng[0]
    return (array("d", map(get, ti[:lo])) + array("d", map(get, ti[lo:lo + period])) * k
            + array("d", map(get, ti[lo + k * period:])))


def _repeats(codes: list[int], rng: tuple[int, int], period: int, m: int) -> int:
    """Whole periods in the periodic range ``rng`` of ``codes`` (slots of ``m``
    microbatches) when each of its chains is one op (0 otherwise): :func:`_column`."""
    lo, hi = rng
    k = (hi - lo) // period if period else 0
    if k < 2 or any(codes[i] // m != codes[i + (k - 1) * period] // m for i in range(lo, lo + period)):
        return 0
    return k

