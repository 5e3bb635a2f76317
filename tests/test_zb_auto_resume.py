"""zb-auto's greedy runs for a larger m start at the checkpoint of the last call's runs
(``zb_auto._LAST_CALL``, docs/planner.md §4 item 20): the same candidates, float for float,
as runs from the start, and the shortcut must fire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.ir import Placement
from pipeoffload.schedules import zb_auto
from pipeoffload.schedules.zb_auto import auto_candidates, default_limit


def _digest(trackers: list[zb_auto.Tracker]) -> list:
    """Everything a candidate holds, and which entries are the same run."""
    first = {}
    return [(first.setdefault(id(t), i), t.order, t.end, t.level, t.peak, t.idle, t.first, t.clock, t.started)
            for i, t in enumerate(trackers)]


def _fresh(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> list:
    """``auto_candidates`` with every run from its start (the last call forgotten, then restored)."""
    saved = zb_auto._LAST_CALL[:]
    zb_auto._LAST_CALL.clear()
    try:
        return _digest(auto_candidates(p, m, costs, memory, limit))
    finally:
        zb_auto._LAST_CALL[:] = saved


@pytest.fixture
def restores(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs that started at a checkpoint."""
    seen: list[int] = []
    restore = zb_auto._AutoGreedy._restore

    def counted(self, state, prior):  # type: ignore[no-untyped-def]
        seen.append(state.round)
        return restore(self, state, prior)

    monkeypatch.setattr(zb_auto._AutoGreedy, "_restore", counted)
    zb_auto._LAST_CALL.clear()
    return seen


costs_st = st.lists(st.tuples(*[st.floats(0.3, 3.0)] * 3), min_size=1, max_size=8)


@settings(deadline=None)
@given(rank_costs=costs_st, m=st.integers(1, 30), more=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       comm=st.sampled_from([0.0, 0.1, 0.7]), b=st.sampled_from([-1.0, 0.0, 0.5]),
       mult=st.sampled_from([1.0, 1.5, 2.0, 4.0]))
def test_resumed_runs_equal_runs_from_the_start(rank_costs, m, more, comm, b, mult) -> None:
    """Calls with growing m on the same inputs (as the planner's m1, m2): each equals the
    call that runs every variant from its start (also when a variant is infeasible)."""
    p = len(rank_costs)
    costs = Costs(comm=comm, rank_costs=tuple(rank_costs))
    memory = MemoryDeltas(F=1.0, B=b, W=-1.0 - b)
    limit = mult * default_limit(Placement.loop(p, 1), memory)
    zb_auto._LAST_CALL.clear()
    for mm in (m, *(m + sum(more[:i + 1]) for i in range(len(more)))):
        expected = _fresh(p, mm, costs, memory, limit)
        assert _digest(auto_candidates(p, mm, costs, memory, limit)) == expected


def test_the_shortcut_fires_and_only_for_the_same_inputs_and_more_microbatches(restores: list[int]) -> None:
    costs = Costs(comm=0.2, rank_costs=((1.0, 1.3, 0.6), (1.2, 1.0, 0.9), (0.8, 1.5, 0.7), (1.1, 1.1, 1.1)))
    memory = MemoryDeltas(F=1.0, B=-0.25, W=-0.75)
    limit = default_limit(Placement.loop(4, 1), memory)
    auto_candidates(4, 12, costs, memory, limit)
    expected = _fresh(4, 13, costs, memory, limit)
    assert _digest(auto_candidates(4, 13, costs, memory, limit)) == expected
    assert restores and all(k >= 1 for k in restores)  # fails if no run starts at a checkpoint
    n = len(restores)
    for args in ((4, 12, costs, memory, limit),  # fewer microbatches
                 (4, 14, Costs(comm=0.3, rank_costs=costs.rank_costs), memory, limit),  # other inputs
                 (4, 15, costs, memory, 2 * limit)):
        auto_candidates(*args)
        assert len(restores) == n


def test_generated_schedules_equal(restores: list[int]) -> None:
    """The generator's output for m1 then m2, as the planner asks, with and without the resume."""
    from pipeoffload.schedules import ScheduleSpec, build

    costs = Costs(comm=0.05, rank_costs=tuple((1.0 + 0.1 * r, 1.7, 0.9 - 0.05 * r) for r in range(6)))
    memory = MemoryDeltas(F=2.0, B=-0.5, W=-1.5)
    spec = ScheduleSpec("zb-auto", 6, 18, costs=costs, memory=memory)
    build(spec, check=False)
    resumed = build(ScheduleSpec("zb-auto", 6, 19, costs=costs, memory=memory), check=False)
    assert restores
    zb_auto._LAST_CALL.clear()
    fresh = build(ScheduleSpec("zb-auto", 6, 19, costs=costs, memory=memory), check=False)
    assert resumed.ranks == fresh.ranks


def test_a_large_call_keeps_nothing(monkeypatch: pytest.MonkeyPatch, restores: list[int]) -> None:
    """Above ``_KEEP_OPS`` a call's trackers are let go when it returns (and the last call's too)."""
    costs, memory = Costs(comm=0.1), MemoryDeltas(F=1.0, B=-0.5, W=-0.5)
    limit = default_limit(Placement.loop(3, 1), memory)
    auto_candidates(3, 6, costs, memory, limit)
    assert zb_auto._LAST_CALL
    monkeypatch.setattr(zb_auto, "_KEEP_OPS", 3 * 3 * 6)
    auto_candidates(3, 7, costs, memory, limit)  # resumed, but over the bound: nothing kept
    assert restores and not zb_auto._LAST_CALL
