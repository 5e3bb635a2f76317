"""``validate_and_time`` (the deadlock proof and the timing as one engine run) gives
exactly ``validate`` then ``simulate``: the same timeline, the same error, on generated
and on randomly broken schedules; its shortcut fires where it should, and its checks
are needed (a timing that places every op alone would accept a broken schedule)."""

from __future__ import annotations

import importlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_validate_compact import broken

from pipeoffload.costs import Costs, MemoryDeltas, parse_costs, parse_memory
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import OpKind, Placement, Schedule, build_schedule
from pipeoffload.passes import validate as V
from pipeoffload.passes.timing import _simulate_columns, simulate
from pipeoffload.schedules import ScheduleSpec, build

L = importlib.import_module("pipeoffload.passes.lower")  # the module (the package exports the function)
COSTS = [Costs(), parse_costs("F=1,B=1.5,W=0.5,comm=0.1")]
MEMORY = [MemoryDeltas(), parse_memory("F=2,B=-0.5,W=-1.5")]


def _outcome(f, schedule: Schedule, costs: Costs, memory: MemoryDeltas) -> str:
    """The timeline (summary and every op's row, in event order) or the error."""
    try:
        tl = f(schedule, costs, memory)
    except ScheduleError as e:
        return "error: " + str(e)
    return json.dumps([tl.summary(), list(tl.event_rows()), tl.memory_curves()], default=str)


def _two_passes(schedule: Schedule, costs: Costs, memory: MemoryDeltas):
    V.validate(schedule)
    return simulate(schedule, costs, memory)


def _fused(schedule: Schedule, costs: Costs, memory: MemoryDeltas):
    return L.validate_and_time(schedule, costs, memory)


class _Spy:
    """Counts the calls of ``validate`` made from ``validate_and_time``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = V.validate

        def spy(schedule: Schedule) -> None:
            self.calls += 1
            real(schedule)

        monkeypatch.setattr(L, "validate", spy)


@pytest.mark.parametrize("name,p,m,v", [("1f1b", 4, 8, None), ("zb-v", 4, 9, None), ("zb-h1", 3, 7, None),
                                        ("interleaved-1f1b", 4, 8, 2), ("v-half", 4, 12, None),
                                        ("gpipe", 2, 3, None), ("zb-v", 1, 3, None)])
@pytest.mark.parametrize("ci", [0, 1])
def test_generated_schedules_take_the_shortcut(monkeypatch, name: str, p: int, m: int, v, ci: int) -> None:
    """Every generated compact schedule is proved by its timing (validate never runs)
    and gives the two passes' timeline."""
    sched = build(ScheduleSpec(name, p, m, v=v), check=False)
    assert sched.compact is not None
    spy = _Spy(monkeypatch)
    got = _outcome(_fused, sched, COSTS[ci], MEMORY[ci])
    assert spy.calls == 0  # the shortcut fired
    assert got == _outcome(_two_passes, sched, COSTS[ci], MEMORY[ci])


def test_overlapped_pairs_skip_the_proof(monkeypatch) -> None:
    """DualPipeV's overlapped pairs: rules 1 to 4 are checked, and the timing stands for
    the proof (validate and its proof never run), with the two passes' timeline."""
    sched = build(ScheduleSpec("dualpipev", 4, 8), check=False)
    assert V.overlap_pairs(sched)
    spy = _Spy(monkeypatch)
    proofs = []
    monkeypatch.setattr(V, "prove_deadlock_free", proofs.append)
    got = _outcome(_fused, sched, COSTS[1], MEMORY[0])
    assert spy.calls == 0 and proofs == []
    monkeypatch.undo()
    assert got == _outcome(_two_passes, sched, COSTS[1], MEMORY[0])


@st.composite
def broken_pairs(draw) -> Schedule:
    """A DualPipeV schedule (overlapped pairs) with up to three ops swapped, moved or dropped."""
    p = draw(st.integers(2, 4))
    sched = build(ScheduleSpec("dualpipev", p, draw(st.integers(2 * p, 3 * p))), check=False)
    ranks = [list(lst) for lst in sched.ranks]
    for _ in range(draw(st.integers(0, 3))):
        r = draw(st.integers(0, p - 1))
        i, j = draw(st.integers(0, len(ranks[r]) - 1)), draw(st.integers(0, len(ranks[r]) - 1))
        edit = draw(st.sampled_from(["swap", "move", "drop"]))
        if edit == "swap":
            ranks[r][i], ranks[r][j] = ranks[r][j], ranks[r][i]
        elif edit == "move":
            ranks[r].insert(j, ranks[r].pop(i))
        else:
            ranks[r].pop(i)
    return sched.with_ranks(ranks)


@settings(max_examples=200, deadline=None)
@given(sched=broken_pairs())
def test_broken_pairs_give_the_two_passes_verdict(sched: Schedule) -> None:
    """Including deadlocks, which the timing names with the proof's message."""
    assert _outcome(_fused, sched, COSTS[1], MEMORY[0]) == _outcome(_two_passes, sched, COSTS[1], MEMORY[0])


def test_broken_pairs_reach_the_deadlock() -> None:
    """Op moves reach deadlocks that only rule 5 finds, which the fused path names as the
    two passes do (the comparison above is not vacuous there): every move of an op on a
    DualPipeV rank 2 to 6 places earlier."""
    sched = build(ScheduleSpec("dualpipev", 2, 5), check=False)
    deadlocks = 0
    for r in range(2):
        for i in range(len(sched.ranks[r])):
            for d in range(2, 7):
                ranks = [list(lst) for lst in sched.ranks]
                ranks[r].insert(max(0, i - d), ranks[r].pop(i))
                moved = sched.with_ranks(ranks)
                out = _outcome(_fused, moved, COSTS[0], MEMORY[0])
                assert out == _outcome(_two_passes, moved, COSTS[0], MEMORY[0])
                deadlocks += "deadlock" in out
    assert deadlocks > 0


@settings(max_examples=300, deadline=None)
@given(sched=broken(), ci=st.integers(0, 1))
def test_broken_compact_schedules_give_the_two_passes_verdict(sched: Schedule, ci: int) -> None:
    """Randomly broken orders held as arrays: the same error (or timeline) as the two passes."""
    triples = [[(o.kind, o.stage, o.microbatch) for o in lst] for lst in sched.ranks]
    compact = build_schedule(sched.name, sched.num_microbatches, sched.placement, triples)
    assert compact.compact is not None
    assert _outcome(_fused, compact, COSTS[ci], MEMORY[ci]) == _outcome(_two_passes, compact, COSTS[ci], MEMORY[ci])


@settings(max_examples=100, deadline=None)
@given(sched=broken())
def test_broken_op_lists_give_the_two_passes_verdict(sched: Schedule) -> None:
    assert _outcome(_fused, sched, COSTS[0], MEMORY[0]) == _outcome(_two_passes, sched, COSTS[0], MEMORY[0])


def test_a_timing_that_places_every_op_is_not_enough() -> None:
    """One rank, F/B/W of microbatch 0 twice and of microbatch 1 never: every op is
    placed (nothing waits for microbatch 1) and the counts per kind are right, so only
    the end table's empty slots show the schedule broken. The shortcut must not take it."""
    pl = Placement.custom([0])
    F, B, W = OpKind.F, OpKind.B, OpKind.W
    sched = build_schedule("dup", 2, pl, [[(F, 0, 0), (B, 0, 0), (W, 0, 0)] * 2])
    placed: list = []
    assert _simulate_columns(sched, None, None, "units", placed) is not None  # the timing places all
    assert V.counted_shape(sched)  # the counts are those of a complete schedule
    assert not V.every_op_placed(sched, placed[0])
    with pytest.raises(ScheduleError, match="duplicate op"):
        L.validate_and_time(sched)


def test_lower_takes_the_shortcut(monkeypatch) -> None:
    sched = build(ScheduleSpec("zb-v", 3, 7), check=False)
    spy = _Spy(monkeypatch)
    low = L.lower(sched, COSTS[1], MEMORY[1])
    assert spy.calls == 0
    assert low.timeline.summary() == _two_passes(sched, COSTS[1], MEMORY[1]).summary()


@st.composite
def broken_long(draw) -> Schedule:
    """A periodic generated schedule long enough for the timing to shift periods, held
    as arrays, with up to two ops swapped, moved, dropped, duplicated or given another
    microbatch (mostly in the steady state, where the shift would hide them)."""
    name = draw(st.sampled_from(["1f1b", "zb-v", "zb-h1", "v-half"]))
    p = draw(st.integers(2, 5))
    m = draw(st.integers(3 * p, 6 * p))
    sched = build(ScheduleSpec(name, p, m), check=False)
    triples = [[(o.kind, o.stage, o.microbatch) for o in lst] for lst in sched.ranks]
    for _ in range(draw(st.integers(1, 2))):
        r = draw(st.integers(0, p - 1))
        n = len(triples[r])
        i, j = draw(st.integers(n // 4, 3 * n // 4)), draw(st.integers(n // 4, 3 * n // 4))
        edit = draw(st.sampled_from(["swap", "move", "drop", "dup", "mb"]))
        if edit == "swap":
            triples[r][i], triples[r][j] = triples[r][j], triples[r][i]
        elif edit == "move":
            triples[r].insert(j, triples[r].pop(i))
        elif edit == "drop":
            triples[r].pop(i)
        elif edit == "dup":
            triples[r].insert(j, triples[r][i])
        else:
            k, s, _ = triples[r][i]
            triples[r][i] = (k, s, draw(st.integers(0, m - 1)))
    return build_schedule(sched.name, m, sched.placement, triples)


@settings(max_examples=200, deadline=None)
@given(sched=broken_long(), ci=st.integers(0, 1))
def test_broken_periodic_schedules_give_the_two_passes_verdict(sched: Schedule, ci: int) -> None:
    """The periodic timing's end table as the proof: never a broken schedule accepted."""
    assert sched.compact is not None
    assert _outcome(_fused, sched, COSTS[ci], MEMORY[ci]) == _outcome(_two_passes, sched, COSTS[ci], MEMORY[ci])
