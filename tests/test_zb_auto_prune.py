"""zb-auto's greedy runs stop once their longest span is sure to end above a candidate's
(``auto_candidates``' bound, ``_AutoGreedy._beyond``): the generator's schedule is the same,
op for op, as with every run finished, and the pruning must fire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.ir import Placement
from pipeoffload.schedules import ScheduleSpec, build, zb_auto
from pipeoffload.schedules.zb_auto import auto_candidates, default_limit

costs_st = st.lists(st.tuples(*[st.floats(0.3, 3.0)] * 3), min_size=1, max_size=8)


def _made(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> list | str:
    """The generator's orders, or its refusal (no candidate fits the limit)."""
    try:
        return build(ScheduleSpec("zb-auto", p, m, costs=costs, memory=memory, mem_limit=limit), check=False).ranks
    except ParameterError as e:
        return str(e)


def _orders(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> list | str:
    zb_auto._LAST_CALL.clear()
    return _made(p, m, costs, memory, limit)


@pytest.fixture
def prunes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each bound test answered."""
    seen: list[bool] = []
    beyond = zb_auto._AutoGreedy._beyond

    def counted(self, bound):  # type: ignore[no-untyped-def]
        seen.append(beyond(self, bound))
        return seen[-1]

    monkeypatch.setattr(zb_auto._AutoGreedy, "_beyond", counted)
    return seen


@settings(deadline=None, max_examples=150)
@given(rank_costs=costs_st, m=st.integers(1, 30), more=st.integers(0, 3), comm=st.sampled_from([0.0, 0.1, 0.7]),
       b=st.sampled_from([-1.0, 0.0, 0.5]), mult=st.sampled_from([1.0, 1.5, 2.0, 4.0]))
def test_pruned_generator_is_the_generator(rank_costs, m, more, comm, b, mult) -> None:
    """The schedule for m (and then m + more, resumed from m's runs as the planner asks)
    equals the one made with the bound never answering yes."""
    p = len(rank_costs)
    costs = Costs(comm=comm, rank_costs=tuple(rank_costs))
    memory = MemoryDeltas(F=1.0, B=b, W=-1.0 - b)
    limit = mult * default_limit(Placement.loop(p, 1), memory)
    got = [_orders(p, m, costs, memory, limit)]
    got.append(_made(p, m + more, costs, memory, limit))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zb_auto._AutoGreedy, "_beyond", lambda self, bound: False)
        want = [_orders(p, m, costs, memory, limit), _orders(p, m + more, costs, memory, limit)]
    assert got == want


def test_pruning_fires_and_keeps_the_best(prunes: list[bool]) -> None:
    """Some runs stop early, the left-out variants' full runs are longer than a kept
    candidate, and the schedule is the one without pruning."""
    p, m = 8, 24
    costs = Costs(comm=0.05, rank_costs=tuple((1.0 + 0.05 * r, 1.6 - 0.03 * r, 0.8 + 0.02 * r) for r in range(p)))
    memory = MemoryDeltas(F=1.0, B=-0.25, W=-0.75)
    limit = 1.5 * default_limit(Placement.loop(p, 1), memory)
    zb_auto._LAST_CALL.clear()
    bound = 1e18
    kept = auto_candidates(p, m, costs, memory, limit, bound)
    assert any(prunes)  # fails if no run was pruned
    zb_auto._LAST_CALL.clear()
    full = auto_candidates(p, m, costs, memory, limit)
    assert len(kept) < len(full)
    best = min(t.max_span() for t in kept)
    kept_ids = {id(t) for t in kept}
    assert all(t.max_span() > best for t in full if not any(t.order == k.order for k in kept)) and kept_ids
    prunes.clear()
    with_prune = _orders(p, m, costs, memory, limit)
    assert any(prunes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zb_auto._AutoGreedy, "_beyond", lambda self, bound: False)
        assert _orders(p, m, costs, memory, limit) == with_prune


def test_no_bound_no_pruning(prunes: list[bool]) -> None:
    """Without a bound (the default) every variant runs to its end."""
    costs, memory = Costs(comm=0.1), MemoryDeltas(F=1.0, B=-0.5, W=-0.5)
    zb_auto._LAST_CALL.clear()
    auto_candidates(4, 12, costs, memory, default_limit(Placement.loop(4, 1), memory))
    assert prunes == []
