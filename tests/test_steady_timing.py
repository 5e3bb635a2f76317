"""The periodic steady-state shortcut of the V lowerings' candidate timings
(passes/steady_timing.py, issue 24): the same floats as the full timing
(passes.timing.order_figures), and it must actually fire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ScheduleError
from pipeoffload.passes.timing import order_figures
from pipeoffload.passes import steady_timing
from pipeoffload.schedules.building_block import orders_from_block
from pipeoffload.schedules.v_reorder_periods import reorder_orders
from pipeoffload.schedules.vshape import unit_peak_bound, v_half_block, v_min_block, v_zb_block
from pipeoffload.schedules.w_refill import refill_both

BLOCKS = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}
COSTS = [Costs(), Costs(F=1, B=2, W=1), Costs(F=1, B=1.5, W=0.5, comm=0.25), Costs(F=2, B=1, W=1, comm=0.5),
         Costs(F=1.3, B=1, W=2.1, comm=0.05)]  # the last is not exact in binary: never shifted
MEMORY = [MemoryDeltas(), MemoryDeltas(F=2, B=-0.5, W=-1.5)]


def _candidates(name: str, p: int, m: int, costs: Costs):
    """The orders _lower_block times: the block's, the slot reorder's, their W refills."""
    block = BLOCKS[name](p)
    first, second = orders_from_block(block, m), reorder_orders(block, m)
    yield first
    yield second
    caps = [unit_peak_bound(name, p)] * p
    for base in (first, second):
        for tr in refill_both(block.placement, m, base, costs, MemoryDeltas(), caps):
            yield tr.order


def _grid():
    for name in BLOCKS:
        for p in (1, 2, 3, 4, 5, 6, 8, 12):
            for m in sorted({1, p, 2 * p + 1, 4 * p + 3}):
                yield name, p, m


@pytest.mark.parametrize("name", list(BLOCKS))
def test_equal_to_the_full_timing_and_fires(name):
    fired = 0
    for fam, p, m in _grid():
        if fam != name:
            continue
        pl = BLOCKS[name](p).placement
        for ci, costs in enumerate(COSTS):
            for memory in MEMORY if ci < 2 else MEMORY[:1]:
                for orders in _candidates(name, p, m, costs):
                    got, skipped = steady_timing._steady(pl, m, orders, costs, memory)
                    want = order_figures(pl, m, orders, costs, memory)
                    assert steady_timing.steady_figures(pl, m, orders, costs, memory) == want
                    if got is not None:
                        assert got == want, (name, p, m, costs, memory)
                    if ci == len(COSTS) - 1:
                        assert got is None  # not exact in binary: the full timing
                    fired += skipped > 0
    assert fired >= 50, f"the shortcut fired in only {fired} cases"


def test_the_check_is_what_keeps_it_exact(monkeypatch):
    """With the periodicity check made to pass at once, some case comes out different:
    the grid above would catch a check that is too weak."""
    def blind(eng, cut, periods, ranges, refs):
        x0 = eng.codes[0][cut[0]]
        shift = eng.end[x0] - eng.end[x0 - 1]
        return shift if shift > 0 else None

    monkeypatch.setattr(steady_timing, "_steady_shift", blind)
    differ = 0
    for name, p, m in _grid():
        if p < 4:
            continue
        pl = BLOCKS[name](p).placement
        for costs in COSTS[:4]:
            orders = orders_from_block(BLOCKS[name](p), m)
            got, _ = steady_timing._steady(pl, m, orders, costs, MemoryDeltas())
            differ += got is not None and got != order_figures(pl, m, orders, costs, MemoryDeltas())
    assert differ > 0


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(list(BLOCKS)), p=st.integers(2, 10), extra=st.integers(0, 30),
       f=st.integers(1, 24), b=st.integers(1, 24), w=st.integers(1, 24), comm=st.integers(0, 8),
       which=st.integers(0, 1))
def test_random_binary_costs(name, p, extra, f, b, w, comm, which):
    m = p + extra
    block = BLOCKS[name](p)
    orders = orders_from_block(block, m) if which == 0 else reorder_orders(block, m)
    costs = Costs(F=f / 8, B=b / 8, W=w / 8, comm=comm / 8)
    want = order_figures(block.placement, m, orders, costs, MemoryDeltas())
    assert steady_timing.steady_figures(block.placement, m, orders, costs, MemoryDeltas()) == want


def test_not_exact_or_not_periodic_falls_back():
    block = v_half_block(4)
    orders = orders_from_block(block, 12)
    assert steady_timing._steady(block.placement, 12, orders, Costs(F=0.1, B=0.2, W=0.1), MemoryDeltas())[0] is None
    short = [lst[:-1] for lst in orders]  # not a whole number of periods: timed in full, still equal
    stuck = [lst[1:] + lst[:1] for lst in orders]  # each rank's first op last: deadlocks
    with pytest.raises(ScheduleError) as want:
        order_figures(block.placement, 12, stuck, Costs(), MemoryDeltas())
    with pytest.raises(ScheduleError) as got:
        steady_timing.steady_figures(block.placement, 12, stuck, Costs(), MemoryDeltas())
    assert str(got.value) == str(want.value)
    assert steady_timing.steady_figures(block.placement, 12, short, Costs(), MemoryDeltas()) == order_figures(
        block.placement, 12, short, Costs(), MemoryDeltas())


def test_bw_orders_are_timed_in_full():
    """A BW op has no engine code: the shortcut declines (KeyError inside) and the
    figures are order_figures'."""
    from pipeoffload.ir import OpKind

    block = v_min_block(4)
    orders = [[(OpKind.BW, s, j) if k is OpKind.B else (k, s, j) for k, s, j in lst if k is not OpKind.W]
              for lst in orders_from_block(block, 12)]
    assert steady_timing._steady(block.placement, 12, orders, Costs(), MemoryDeltas()) == (None, 0)
    assert steady_timing.steady_figures(block.placement, 12, orders, Costs(), MemoryDeltas()) == \
        order_figures(block.placement, 12, orders, Costs(), MemoryDeltas())


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 10), m=st.integers(1, 40), comm=st.integers(0, 8))
def test_engine_input_offsets_name_the_same_slots(p, m, comm):
    """The engine's ``rel`` table (slot offsets) names, for every op, the inputs and
    latencies of the scheduler's ``deps`` (``base + mb``)."""
    block = v_half_block(p)
    codes = [[] for _ in range(p)]
    eng = steady_timing._Engine(block.placement, m, comm / 8, codes, [])
    for own, row in enumerate(eng.deps):
        for mb in range(m):
            slot = own * m + mb
            assert [(slot + off, lat) for off, lat in eng.rel[slot // m]] == [(b + mb, lat) for b, lat in row]
