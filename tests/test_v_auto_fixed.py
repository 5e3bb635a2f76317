"""V-auto's fixed candidates (V-Min, V-Half, V-ZB) without a second timing (issue 24):
:func:`pipeoffload.schedules.vshape.fixed_lowering` hands V-auto the orders each
generator makes and the figures its lowering timed its winner by, and these must be
what making the Schedule and timing its orders again gives (the path it replaced)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.ir import Placement
from pipeoffload.passes.steady_timing import PeriodicOrders, steady_figures
from pipeoffload.schedules import ScheduleSpec, generate
from pipeoffload.schedules import v_auto as va
from pipeoffload.schedules import vshape

NAMES = ("v-min", "v-half", "v-zb")
COSTS = [Costs(), Costs(F=1, B=1.5, W=0.5, comm=0.25), Costs(F=1, B=2, W=1, comm=0.5), Costs(F=1.1, B=2.3, W=0.7)]
MEMORY = [MemoryDeltas(), MemoryDeltas(F=1, B=-0.25, W=-0.75)]


def _full(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas) -> tuple[list, tuple]:
    """The replaced path: the generator's Schedule read back into orders, timed."""
    s = generate(name, p=p, m=m, costs=costs, memory=memory)
    orders = [[(o.kind, o.stage, o.microbatch) for o in r] for r in s.ranks]
    return orders, tuple(steady_figures(Placement.vshape(p), m, orders, costs, memory))


def _check(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas) -> None:
    orders, figures = vshape.fixed_lowering(name, ScheduleSpec(name, p, m, costs=costs, memory=memory))
    full_orders, full_figures = _full(name, p, m, costs, memory)
    assert orders == full_orders, (name, p, m)
    assert figures == full_figures, (name, p, m, figures, full_figures)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (4, 3), (4, 8), (5, 16), (8, 24), (12, 40)])
@pytest.mark.parametrize("costs", COSTS, ids=range(len(COSTS)))
@pytest.mark.parametrize("memory", MEMORY, ids=range(len(MEMORY)))
def test_fixed_lowering_is_the_generator_timed(name, p, m, costs, memory):
    """Orders and figures equal the Schedule's orders and their timing, float for float,
    whichever candidate of the lowering won (first, slot reorder, a refill, hole filling)."""
    _check(name, p, m, costs, memory)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(NAMES), p=st.integers(1, 9), m=st.integers(1, 30),
       f=st.integers(1, 16), b=st.integers(1, 32), w=st.integers(1, 16), comm=st.integers(0, 8))
def test_fixed_lowering_random_costs(name, p, m, f, b, w, comm):
    """The same on eighths (the periodic timing's exact case) and thirds (the plain timing)."""
    _check(name, p, m, Costs(F=f / 8, B=b / 8, W=w / 8, comm=comm / 8), MemoryDeltas())
    _check(name, p, m, Costs(F=f / 3, B=b / 3, W=w / 3, comm=comm / 3), MemoryDeltas())


def _winner_sources(monkeypatch) -> list[str]:
    """Record, per lowering, whether a W refill's orders won ('refill') or not ('other')."""
    seen: list[str] = []
    real, real_refill, real_best = vshape._lower_block_timed, vshape.refill_periodic, vshape._Best
    refills: list = []
    bests: list = []

    def refill(*a, **k):
        for cand, *figures in real_refill(*a, **k):
            refills.append(cand)
            yield cand, *figures

    class Best(real_best):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            bests.append(self)

    def spy(name, block, spec, holes=False):
        refills.clear()
        bests.clear()
        orders, figures = real(name, block, spec, holes)
        seen.append("refill" if bests and any(bests[-1].orders is o for o in refills) else "other")
        return orders, figures

    monkeypatch.setattr(vshape, "refill_periodic", refill)
    monkeypatch.setattr(vshape, "_Best", Best)
    monkeypatch.setattr(vshape, "_lower_block_timed", spy)
    return seen


def test_every_winner_source_is_covered(monkeypatch):
    """The grid above meets winners from a refill and from the first two lowerings, so the
    figures _Best keeps are checked for each way a candidate wins."""
    seen = _winner_sources(monkeypatch)
    vshape._lowered.cache_clear()
    try:
        for name in NAMES:
            for costs in COSTS:
                for p, m in [(4, 8), (8, 24)]:
                    vshape.fixed_lowering(name, ScheduleSpec(name, p, m, costs=costs))
    finally:
        vshape._lowered.cache_clear()
    assert "refill" in seen and "other" in seen, seen


@pytest.mark.parametrize("p,m,limit", [(4, 8, None), (6, 18, None), (8, 16, 5.0), (5, 10, 3.0)])
def test_v_auto_does_not_time_the_fixed_candidates(monkeypatch, p, m, limit):
    """The shortcut fires: V-auto's own timing (_key) never sees V-Min's or V-Half's
    orders, and V-auto's answer is the one made with them timed again."""
    costs = Costs(F=1, B=1.5, W=0.5, comm=0.25)
    fixed = [vshape.fixed_lowering(n, ScheduleSpec(n, p, m, costs=costs))[0] for n in ("v-min", "v-half")]
    timed: list = []
    real_key = va._key

    def key(pl, m_, orders, c, mem):
        timed.append(orders)
        return real_key(pl, m_, orders, c, mem)

    monkeypatch.setattr(va, "_key", key)
    fast = generate("v-auto", p=p, m=m, costs=costs, mem_limit=limit)
    assert timed and not any(o.expand() == f for o in timed for f in fixed)

    def full_fixed(name, spec):  # the replaced path: the Schedule made and timed again
        orders, _ = _full(name, spec.p, spec.m, spec.costs, spec.memory)
        span, makespan, peak = real_key(Placement.vshape(spec.p), spec.m, PeriodicOrders.plain(orders), spec.costs,
                                        spec.memory)
        return orders, (peak, span, makespan)

    monkeypatch.setattr(va, "fixed_lowering", full_fixed)
    full = generate("v-auto", p=p, m=m, costs=costs, mem_limit=limit)
    assert fast.ranks == full.ranks
