"""The timing pass's compact timeline (``Timeline.from_columns``) against the general
path: the same events, metrics, curves and --ops order, float for float."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import OpKind, Schedule
from pipeoffload.passes.timing import _Deltas, _EventOrder, run_list_schedule, simulate
from pipeoffload.schedules import generate
from pipeoffload.timeline import Timeline, _last_ops_serial


def _general(sched: Schedule, costs: Costs, memory: MemoryDeltas) -> Timeline:
    """``simulate`` through :func:`run_list_schedule` (a TimedOp per op)."""
    dur, mem = costs.duration_table(sched.placement), memory.delta_table(sched.placement)
    events = run_list_schedule(sched, lambda o: dur[o.stage][o.kind], costs.comm, lambda o: mem[o.stage][o.kind])
    return Timeline(sched.num_ranks, events, sched.name, sched.num_microbatches, sched.chunks)


def _check_same(sched: Schedule, costs: Costs, memory: MemoryDeltas) -> None:
    ref = _general(sched, costs, memory)
    fast = simulate(sched, costs, memory)
    assert fast._columns is not None  # the compact path was taken
    assert isinstance(fast._columns._order, _EventOrder)  # the event order not recorded: made when read
    assert isinstance(fast._columns._mem, _Deltas)  # nor the deltas
    # Metrics first, from the columns (no TimedOp made yet) ...
    assert fast.summary() == ref.summary()
    assert fast.spans() == ref.spans() and fast.busy() == ref.busy()
    assert (fast.start, fast.end, fast.makespan) == (ref.start, ref.end, ref.makespan)
    assert fast.memory_curves() == ref.memory_curves()
    assert fast.peak_memory() == ref.peak_memory()
    rows = list(fast.event_rows(sort=True))
    assert rows == [(e.op, e.start, e.end, e.stream, e.mem) for e in sorted(ref.events, key=lambda e: (e.rank, e.start))]
    assert list(fast.event_rows()) == [(e.op, e.start, e.end, e.stream, e.mem) for e in ref.events]
    assert fast._columns is not None
    # ... then the TimedOp list, in the same event order.
    assert fast.events == ref.events
    assert fast._columns is None and fast.summary() == ref.summary()


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 8), ("zb-v", 4, 10), ("v-half", 6, 14),
                                      ("interleaved-1f1b", 4, 8), ("zb-h1", 5, 7), ("gpipe", 3, 5)])
def test_columns_match_the_general_path(name: str, p: int, m: int) -> None:
    _check_same(generate(name, p, m), Costs(F=1.0, B=2.0, W=0.5, comm=0.25), MemoryDeltas(F=2.0, B=-0.5, W=-1.5))


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["1f1b", "zb-v", "zb-h2", "v-min", "interleaved-1f1b"]),
       p=st.integers(1, 6), extra=st.integers(0, 9),
       f=st.floats(0.1, 3.0), b=st.floats(0.1, 3.0), w=st.floats(0.1, 3.0), comm=st.floats(0.0, 1.0))
def test_columns_match_any_costs(name: str, p: int, extra: int, f: float, b: float, w: float, comm: float) -> None:
    m = 2 * p + extra
    kwargs = {"v": 2} if name == "interleaved-1f1b" else {}
    if name == "interleaved-1f1b" and m % p:
        m += p - m % p
    _check_same(generate(name, p, m, **kwargs), Costs(F=f, B=b, W=w, comm=comm), MemoryDeltas())


def test_events_list_is_the_timeline_once_read() -> None:
    """Reading ``events`` makes the list; appending to it or replacing it is seen."""
    tl = simulate(generate("1f1b", 2, 4))
    n = len(tl.events)
    tl.events.append(dataclasses.replace(tl.events[0], start=100.0, end=101.0))
    assert len(tl.events) == n + 1 and tl.end == 101.0
    tl.events = []
    assert tl.summary()["makespan"] == 0.0
    assert dataclasses.replace(simulate(generate("1f1b", 2, 4)), memory_unit="bytes").events


def test_general_path_cases_still_raise_or_time() -> None:
    """A deadlock and an op naming another rank than its list take the general path."""
    sched = generate("1f1b", 2, 2)
    swapped = sched.with_ranks([list(reversed(lst)) for lst in sched.ranks])
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(swapped)
    first = sched.ranks[0][0]
    wrong = sched.with_ranks([[dataclasses.replace(first, rank=1)] + sched.ranks[0][1:], sched.ranks[1]])
    tl = simulate(wrong)  # an op saying rank 1 in rank 0's list: timed as before, by the general path
    assert tl._columns is None and tl.summary() == _general(wrong, Costs(), MemoryDeltas()).summary()
    zb = generate("zb-h1", 2, 3)
    last_w = zb.ranks[1][-1]
    assert last_w.kind.value == "W"
    moved = zb.with_ranks([zb.ranks[0] + [dataclasses.replace(last_w, rank=0)], zb.ranks[1][:-1]])
    tl = simulate(moved)  # rank 1's W in rank 0's list, saying rank 0: the engine runs it on rank 1's clock
    assert tl._columns is None and tl.events == _general(moved, Costs(), MemoryDeltas()).events
    ints = simulate(sched, Costs(), MemoryDeltas(F=2, B=0, W=-2))
    assert ints.summary() == _general(sched, Costs(), MemoryDeltas(F=2, B=0, W=-2)).summary()


def _scanned_last_ops(tl: Timeline, kinds: frozenset) -> dict[int, tuple[float, float]]:
    """``Timeline.last_ops`` by its definition: the scan of every event."""
    last: dict[int, tuple[float, float]] = {}
    for e in tl.events:
        if e.op.kind in kinds and e.stream == "compute" and (e.op.stage not in last or e.end > last[e.op.stage][1]):
            last[e.op.stage] = (e.start, e.end)
    return last


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["1f1b", "zb-v", "zb-h2", "v-half", "interleaved-1f1b", "gpipe"]),
       p=st.integers(1, 6), extra=st.integers(0, 9), w=st.sampled_from([1e-3, 0.5, 1.25]),
       kinds=st.sampled_from([frozenset({OpKind.W, OpKind.BW}), frozenset({OpKind.F}), frozenset({OpKind.B})]))
def test_last_ops_read_backwards_match_the_scan(name: str, p: int, extra: int, w: float, kinds: frozenset) -> None:
    m = 2 * p + extra
    kwargs = {"v": 2} if name == "interleaved-1f1b" else {}
    if name == "interleaved-1f1b" and m % p:
        m += p - m % p
    sched = generate(name, p, m, **kwargs)
    costs = Costs(F=1.0, B=2.0, W=w, comm=0.25)
    fast = simulate(sched, costs, MemoryDeltas())
    assert fast._columns is not None and fast._columns.serial  # every duration positive: the backward read
    got = fast.last_ops(kinds)
    assert fast._columns is not None  # read from the columns, no TimedOp made
    ref = _general(sched, costs, MemoryDeltas())
    assert got == _scanned_last_ops(ref, kinds) == ref.last_ops(kinds)  # the events' path is the scan


def test_last_ops_backwards_read_fires_and_stops_early() -> None:
    """The backward read is what serial columns take (it does not fall back to the scan),
    and it reads only the ranks' tails: a rank's ops before its last W's are never made."""
    sched, costs = generate("1f1b", 4, 64), Costs(F=1.0, B=2.0, W=0.5, comm=0.25)
    tl = simulate(sched, costs, MemoryDeltas())
    cols = tl._columns
    assert cols is not None and cols.serial
    kinds = frozenset({OpKind.W, OpKind.BW})
    assert _last_ops_serial(cols, kinds) == _scanned_last_ops(simulate(sched, costs, MemoryDeltas()), kinds)
    made: list[int] = []
    ranks = [_Counting(ops, made) for ops in cols.ops]
    cols.ops = ranks
    assert len(tl.last_ops(kinds)) == 4 and tl._columns is cols
    assert 4 <= len(made) <= 4 * 2  # per rank its last op, and the one before where that is not a W


def test_last_ops_on_compact_orders_read_the_arrays(monkeypatch) -> None:
    """On a generated (compact) schedule's columns the backward read takes the kind and group
    codes from the arrays: no Op is made, and the result is the scan's."""
    from pipeoffload.ir import CompactOrders, RankOps

    sched, costs = generate("zb-v", 4, 12), Costs(F=1.0, B=2.0, W=0.5, comm=0.25)
    tl = simulate(sched, costs, MemoryDeltas())
    cols = tl._columns
    assert cols is not None and cols.serial and all(isinstance(ops, RankOps) for ops in cols.ops)
    kinds = frozenset({OpKind.W, OpKind.BW})
    want = _scanned_last_ops(simulate(sched, costs, MemoryDeltas()), kinds)

    def no_op(*_a, **_k):
        raise AssertionError("an Op was made")

    monkeypatch.setattr(CompactOrders, "op", no_op)
    assert _last_ops_serial(cols, kinds) == want and len(want) == 8


class _Counting:
    """A rank's op sequence that records which indices were read."""

    def __init__(self, ops, made: list[int]) -> None:
        self.ops, self.made = ops, made

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def __getitem__(self, i: int):
        self.made.append(i)
        return self.ops[i]


@pytest.mark.parametrize("name,p,m,kw", [("zb-v", 4, 12, {}), ("interleaved-1f1b", 4, 8, {"v": 2}),
                                          ("group-interleaved", 6, 12, {"v": 3, "g": 5})])
def test_rank_ops_to_list_and_timed_ops_equal_reading_each_op(name, p, m, kw) -> None:
    """RankOps.to_list (what EventColumns.timed_ops makes a compact rank into) is, op for op,
    what reading each index gives; and the timeline's events from the columns equal events
    made by reading each rank's ops one at a time."""
    from pipeoffload.ir import RankOps
    from pipeoffload.timeline import TimedOp

    sched = generate(name, p, m, **kw)
    tl = simulate(sched, Costs(F=1.0, B=2.0, W=0.5, comm=0.25), MemoryDeltas())
    cols = tl._columns
    assert cols is not None and all(isinstance(ops, RankOps) for ops in cols.ops)
    for ops in cols.ops:
        assert ops.to_list() == [ops[i] for i in range(len(ops))]
    cursor, want = [0] * len(cols.ops), []
    for r in cols.order:
        i, cursor[r] = cursor[r], cursor[r] + 1
        want.append(TimedOp(cols.ops[r][i], cols.start[r][i], cols.end[r][i], "compute", cols.mem[r][i]))
    assert tl.events == want and len(want) == sum(map(len, cols.ops))
