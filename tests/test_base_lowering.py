"""The cost-independent base lowerings remembered by their inputs (issue 24,
:func:`pipeoffload.schedules.vshape.base_lowering`): the slot reorder and the
building-block pipeline read only the block and ``m``, so V-Min's, V-Half's and V-auto's
lowerings under other costs reuse them. The answers must be those made without the memo,
and the tests fail unless it is used."""

from __future__ import annotations

import pytest

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.schedules import generate
from pipeoffload.schedules import v_auto as va
from pipeoffload.schedules import vshape
from pipeoffload.schedules.building_block import periodic_from_block
from pipeoffload.schedules.v_reorder_periods import reorder_periodic

COSTS = [Costs(), Costs(F=1, B=1.5, W=0.5, comm=0.25), Costs(F=1.3, B=1, W=2.1, comm=0.05)]


def _orders(schedule) -> list[list[tuple]]:
    return [[(o.kind, o.stage, o.microbatch) for o in r] for r in schedule.ranks]


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the real lowerings (not the remembered ones) under both callers' names."""
    runs = [0]

    def wrap(real):
        def counted(*args):
            runs[0] += 1
            return real(*args)
        return counted

    for name, real in (("reorder_periodic", reorder_periodic), ("periodic_from_block", periodic_from_block)):
        spy = wrap(real)  # one object for both modules: one key
        monkeypatch.setattr(vshape, name, spy)
        monkeypatch.setattr(va, name, spy)
    return runs


@pytest.mark.parametrize("name,p,m", [("v-min", 4, 40), ("v-half", 6, 100), ("v-auto", 4, 48), ("v-auto", 5, 13)])
def test_remembered_lowerings_give_the_same_schedules(name, p, m, monkeypatch):
    runs = _counted(monkeypatch)

    def each_cost() -> list:
        vshape._BASES.clear()
        out = []
        for costs in COSTS:
            vshape._lowered.cache_clear()  # (the whole lowering is remembered per costs too)
            out.append(_orders(generate(name, p=p, m=m, costs=costs, memory=MemoryDeltas())))
        return out

    fast = each_cost()
    remembered, runs[0] = runs[0], 0
    monkeypatch.setattr(vshape, "BASES_KEPT", 0)  # the memo keeps nothing
    slow = each_cost()
    assert fast == slow
    assert 0 < remembered < runs[0], (remembered, runs[0])  # later cost settings reused bases


def test_callers_get_their_own_lists():
    """A caller changing what it got does not change what the next caller gets."""
    block = vshape.v_half_block(4)
    vshape._BASES.clear()
    for lower in (reorder_periodic, periodic_from_block):
        for m in (6, 200):
            a = vshape.base_lowering(lower, block, m)
            want = lower(block, m)
            assert (a.orders, a.at, a.per, a.extra) == (want.orders, want.at, want.per, want.extra)
            a.orders[0].clear()
            a.at[0] = -1
            b = vshape.base_lowering(lower, block, m)
            assert (b.orders, b.at, b.per, b.extra) == (want.orders, want.at, want.per, want.extra)
    assert len(vshape._BASES) == 4
