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


@settings(deadline=None, max_examples=200)
@given(rank_costs=costs_st, m=st.integers(1, 20), data=st.data(), b=st.sampled_from([-1.0, -0.25, 0.0, 0.5]),
       w=st.sampled_from([-0.75, -0.5, 0.0, 0.25]), mult=st.floats(-0.5, 3.0))
def test_levels_alone_refuse_what_the_replay_refuses(rank_costs, m, data, b, w, mult) -> None:
    """zero_bubble._over says exactly whether replaying a handcrafted order with the
    tracker's limit is refused (ZB-H1's and ZB-H2's shapes and every 1F1B window), on
    per-layer-group deltas of either sign and limits down to below 0."""
    from pipeoffload.ir import OpKind
    from pipeoffload.schedules import zero_bubble as zb

    p = len(rank_costs)
    costs = Costs(comm=0.1, rank_costs=tuple(rank_costs))
    deltas = [(1.0 + 0.1 * r, b - 0.05 * r, w) for r in range(p)]
    memory = MemoryDeltas(group_deltas=tuple(deltas))
    pl = Placement.loop(p, 1)
    limit = mult * default_limit(pl, memory)
    window = data.draw(st.integers(1, p))
    shapes = [zb._h1_shape(p, m), zb._h2_shape(p, m), ([min(p - r - 1, window - 1, m) for r in range(p)], [0] * p)]
    mem = [(d[OpKind.F], d[OpKind.B], d[OpKind.W]) for d in memory.delta_table(pl)]
    for warmup, defer in shapes:
        tr = zb_auto.Tracker(pl, m, costs, memory, limit)
        try:
            zb_auto.replay(tr, zb._handcrafted(p, m, warmup, defer))
            refused = False
        except zb_auto.Infeasible:
            refused = True
        assert zb._over(m, warmup, defer, mem, tr.limit + tr.tol) == refused


def test_too_wide_windows_are_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1F1B's memory (ZB-1p) ZB-H2 and the wider 1F1B windows are refused from the
    levels: fewer orders are built than tried, and the schedule is the one without it."""
    from pipeoffload.schedules import zero_bubble as zb

    built: list[int] = []
    handcrafted = zb._handcrafted
    monkeypatch.setattr(zb, "_handcrafted", lambda *a: built.append(1) or handcrafted(*a))
    p, m = 6, 18
    costs = Costs(comm=0.05, rank_costs=tuple((1.0 + 0.1 * r, 1.7, 0.9) for r in range(p)))
    memory = MemoryDeltas(F=2.0, B=-0.5, W=-1.5)
    limit = 0.7 * default_limit(Placement.loop(p, 1), memory)
    got = _orders(p, m, costs, memory, limit)
    assert 0 < len(built) <= 2  # ZB-H1 or not, and the one window that fits: the others never built
    monkeypatch.setattr(zb, "_over", lambda *a: False)
    assert _orders(p, m, costs, memory, limit) == got
