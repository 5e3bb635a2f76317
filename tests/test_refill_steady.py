"""The W refill's periodic steady state (schedules/w_refill._skip_steady, issue 24): the
same tracker (order, times, levels, idle times) as the plain greedy, and it must fire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.schedules import w_refill
from pipeoffload.schedules.building_block import orders_from_block
from pipeoffload.schedules.v_reorder_periods import reorder_orders
from pipeoffload.schedules.vshape import unit_peak_bound, v_half_block, v_min_block, v_zb_block
from pipeoffload.schedules.zb_auto import Infeasible

BLOCKS = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}
COSTS = [Costs(), Costs(F=1, B=2, W=1), Costs(F=1, B=1.5, W=0.5, comm=0.25), Costs(F=2, B=1, W=1, comm=0.5),
         Costs(F=1.3, B=1, W=2.1, comm=0.05)]


def _plain(pl, m, orders, costs, memory, caps, partial):
    """The greedy without the shortcut: every op placed in turn."""
    consulted = [False]
    run = w_refill._Refill(pl, m, orders, costs, memory, caps, partial, consulted)
    run.run()
    if any(d < len(s) for d, s in zip(run.done, run.skeleton)):
        raise Infeasible("the skeleton deadlocks")
    run.put_pending()
    return run.tr, consulted[0]


def _shifted(pl, m, orders, costs, memory, caps, partial):
    """The shortcut alone, then the rest: the tracker, whether ``partial`` was consulted,
    and how many periods were shifted."""
    consulted = [False]
    run = w_refill._Refill(pl, m, orders, costs, memory, caps, partial, consulted)
    n = w_refill._skip_steady(run)
    run.pos, run.lim = None, [len(s) for s in run.skeleton]
    run.run()
    run.put_pending()
    return run.tr, consulted[0], n


def _same(a, b):
    return (a.order == b.order and a.clock == b.clock and a.first == b.first and a.level == b.level
            and a.peak == b.peak and a.idle == b.idle and a.end == b.end)


def _check(name, p, m, costs, memory=MemoryDeltas(), which=0, partial=True):
    block = BLOCKS[name](p)
    orders = orders_from_block(block, m) if which == 0 else reorder_orders(block, m)
    caps = [unit_peak_bound(name, p)] * p
    try:
        want, flag = _plain(block.placement, m, orders, costs, memory, caps, partial)
    except Infeasible:
        with pytest.raises(Infeasible):
            w_refill.refill_tracker(block.placement, m, orders, costs, memory, caps, partial)
        return 0
    got = w_refill.refill_tracker(block.placement, m, orders, costs, memory, caps, partial)
    assert _same(got, want), (name, p, m, costs, which, partial)
    if not w_refill._shiftable(got, block.placement, costs, sum(map(len, orders))):
        return 0
    tr, flag2, n = _shifted(block.placement, m, orders, costs, memory, caps, partial)
    assert _same(tr, want) and flag2 == flag
    return n


@pytest.mark.parametrize("name", list(BLOCKS))
def test_equal_to_the_plain_greedy_and_fires(name):
    fired = 0
    for p in (1, 2, 3, 4, 6, 8, 12):
        for m in sorted({1, p, 2 * p + 1, 10 * p + 3} if p <= 8 else {p, 4 * p + 3}):
            for ci, costs in enumerate(COSTS):
                for which in (0, 1):
                    for partial in (True, False) if ci >= 2 else (True,):
                        fired += _check(name, p, m, costs, which=which, partial=partial) > 0
    assert fired >= 20, f"the shortcut fired in only {fired} cases"


def test_unequal_memory_and_tight_caps():
    for name in BLOCKS:
        for costs in COSTS[:3]:
            _check(name, 8, 30, costs, MemoryDeltas(F=2, B=-0.5, W=-1.5))
            _check(name, 6, 25, costs, MemoryDeltas(F=1, B=0, W=-1), which=1)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(list(BLOCKS)), p=st.integers(2, 9), extra=st.integers(0, 30),
       f=st.integers(1, 16), b=st.integers(1, 16), w=st.integers(1, 16), comm=st.integers(0, 4),
       which=st.integers(0, 1), partial=st.booleans())
def test_random_binary_costs(name, p, extra, f, b, w, comm, which, partial):
    _check(name, p, p + extra, Costs(F=f / 4, B=b / 4, W=w / 4, comm=comm / 4), which=which, partial=partial)


def test_the_check_is_what_keeps_it_exact(monkeypatch):
    """With the state check made blind (any positive clock shift passes), some case comes
    out different: the comparisons above would catch a check that is too weak."""
    def blind(run, before, now, codes, periods, ranges, refs):
        shift = now[1][0] - before[1][0]
        return shift if shift > 0 else None

    monkeypatch.setattr(w_refill, "_same_state", blind)
    differ = 0
    for name in BLOCKS:
        for p in (4, 6, 8):
            for costs in COSTS[:4]:
                block = BLOCKS[name](p)
                orders = orders_from_block(block, 6 * p)
                caps = [unit_peak_bound(name, p)] * p
                args = (block.placement, 6 * p, orders, costs, MemoryDeltas(), caps, True)
                try:
                    want, _ = _plain(*args)
                    got, _, _ = _shifted(*args)
                except Infeasible:
                    continue
                differ += not _same(got, want)
    assert differ > 0


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(list(BLOCKS)), p=st.integers(2, 8), extra=st.integers(0, 20),
       f=st.integers(1, 16), b=st.integers(1, 16), comm=st.integers(0, 4), partial=st.booleans())
def test_put_with_the_loops_arrival_equals_put_computing_it(name, p, extra, f, b, comm, partial):
    """The refill loop hands ``put`` the arrival it computed; a ``put`` that ignores it
    and computes its own places every op at the same times, levels and order."""
    m = p + extra
    block = BLOCKS[name](p)
    orders = orders_from_block(block, m)
    costs = Costs(F=f / 4, B=b / 4, W=1.0, comm=comm / 4)
    caps = [unit_peak_bound(name, p)] * p
    args = (block.placement, m, orders, costs, MemoryDeltas(), caps, partial)
    runs, handed = [], []
    for ignore in (False, True):
        run = w_refill._Refill(*args, [False])
        own = run.put

        def put(code, stage, mb, r, arrive=None, own=own, ignore=ignore):
            handed.append(arrive is not None)
            own(code, stage, mb, r, None if ignore else arrive)

        run.put = put
        try:
            run._run_py()  # the Python loop's put (the C loop has its own: tests/test_engine_c_loops.py)
        except Infeasible:
            runs.append(None)
            continue
        runs.append((run.tr.end, run.tr.clock, run.tr.peak, run.tr.order, run.done))
    assert runs[0] == runs[1]
    assert any(handed) or runs[0] is None
