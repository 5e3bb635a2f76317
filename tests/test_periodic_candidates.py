"""The V lowering's candidates on fewer microbatches (issue 24, passes/steady_timing.periodic_figures,
schedules/w_refill.refill_periodic): timing and refilling the short orders and inserting the
periods gives the figures, orders, spans, makespans and refill peaks of the full path, float for
float, and the tests fail if the shortcuts never fire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes import steady_timing
from pipeoffload.passes.steady_timing import PeriodicOrders, periodic_figures, steady_figures
from pipeoffload.passes.timing import order_figures
from pipeoffload.schedules import w_refill
from pipeoffload.schedules.building_block import op_table, periodic_from_block
from pipeoffload.schedules.v_reorder_periods import reorder_periodic
from pipeoffload.schedules.vshape import unit_peak_bound, v_half_block, v_min_block, v_zb_block

BLOCKS = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}
COSTS = [Costs(), Costs(F=1, B=1.5, W=0.5, comm=0.25), Costs(F=1, B=2, W=1, comm=0.5)]
MEMORY = [MemoryDeltas(), MemoryDeltas(F=1, B=-0.25, W=-0.75)]


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often each shortcut's checks passed (the derived result was used)."""
    fired = {"timing": 0, "refill": 0}
    inserts, stretched = steady_timing._inserts_shift, w_refill._stretched

    def counted_inserts(*a):
        ok = inserts(*a)
        fired["timing"] += ok
        return ok

    def counted_stretched(*a):
        out = stretched(*a)
        fired["refill"] += out is not None
        return out

    monkeypatch.setattr(steady_timing, "_inserts_shift", counted_inserts)
    monkeypatch.setattr(w_refill, "_stretched", counted_stretched)
    return fired


def _candidates(name: str, p: int, m: int) -> list[PeriodicOrders]:
    block = BLOCKS[name](p)
    ops = op_table(block.placement, m)
    return [periodic_from_block(block, m, ops), reorder_periodic(block, m, ops)]


def _figures(trackers: list) -> list[tuple]:
    """What refill_periodic gives for each of refill_both's trackers."""
    return [(tr.order, tr.max_span(), tr.makespan(), max(tr.peak)) for tr in trackers]


def _check(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas) -> None:
    """Each candidate's figures and refills against the full path on its expanded orders."""
    block = BLOCKS[name](p)
    pl, caps = block.placement, [unit_peak_bound(name, p)] * p
    for cand in _candidates(name, p, m):
        full = cand.expand()
        assert periodic_figures(pl, m, cand, costs, memory) == order_figures(pl, m, full, costs, memory), (p, m)
        # (V-lowerings refill under unit deltas, V-auto under the real ones: its peak is the tracker's)
        for mem in dict.fromkeys([MemoryDeltas(), memory]):
            got = w_refill.refill_periodic(pl, m, cand, costs, mem, caps)
            want = w_refill.refill_both(pl, m, full, costs, mem, caps)
            assert [(c.expand(), *rest) for c, *rest in got] == _figures(want)
        for c, _, _, _ in got:  # the refilled candidates' figures the same way
            assert periodic_figures(pl, m, c, costs, memory) == steady_figures(pl, m, c.expand(), costs, memory)


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("p", [2, 3, 5])
def test_short_run_is_the_full_path(name: str, p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fired = _counting(monkeypatch)
    block = BLOCKS[name](p)
    span = max(block.slots.values()) - min(block.slots.values())
    for m in (2 * (span // 3 + 12) + 1, 5 * (span // 3 + 12)):
        for costs in COSTS:
            _check(name, p, m, costs, MEMORY[costs is COSTS[1]])
    assert fired["timing"] >= 4 and fired["refill"] >= 2, fired


@settings(max_examples=8, deadline=None)
@given(name=st.sampled_from(sorted(BLOCKS)), p=st.integers(1, 6), m=st.integers(1, 160),
       f=st.integers(1, 16), b=st.integers(1, 32), w=st.integers(1, 16), comm=st.integers(0, 8))
def test_short_run_random_costs(name: str, p: int, m: int, f: int, b: int, w: int, comm: int) -> None:
    """Eighths (exact: the shortcut may apply) and thirds (never exact: the full path)."""
    _check(name, p, m, Costs(F=f / 8, B=b / 8, W=w / 8, comm=comm / 8), MemoryDeltas())
    _check(name, p, m, Costs(F=f / 3, B=b / 3, W=w / 3, comm=comm / 3), MemoryDeltas())


def test_refused_checks_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """With each check stubbed to refuse, the full path runs: the same results."""
    name, p, m = "v-half", 4, 90
    block = BLOCKS[name](p)
    cands = _candidates(name, p, m)
    assert all(c.extra for c in cands)
    pl, caps = block.placement, [unit_peak_bound(name, p)] * p
    costs = COSTS[1]
    want = [periodic_figures(pl, m, c, costs, MemoryDeltas()) for c in cands]
    refills = [[(x.expand(), *rest) for x, *rest in w_refill.refill_periodic(pl, m, c, costs, MemoryDeltas(), caps)]
               for c in cands]
    monkeypatch.setattr(steady_timing, "_inserts_shift", lambda *a: False)
    monkeypatch.setattr(w_refill, "_stretched", lambda *a: None)
    assert [periodic_figures(pl, m, c, costs, MemoryDeltas()) for c in cands] == want
    assert [[(x.expand(), *rest) for x, *rest in w_refill.refill_periodic(pl, m, c, costs, MemoryDeltas(), caps)]
            for c in cands] == refills


def test_periods_outside_the_range_are_refused() -> None:
    """An insertion point outside the periodic range (or a period of another length) is
    not the same orders one period on: inside_range refuses it."""
    cand = _candidates("v-half", 4, 90)[0]
    fig, eng = steady_timing._steady_run(v_half_block(4).placement, 90 - cand.extra, cand.orders, Costs(),
                                         MemoryDeltas(), cand.n_ops())
    assert fig is not None and steady_timing._inserts_shift(eng, cand.at, cand.per, 90 - cand.extra)
    lo, hi = eng.ranges[0]
    for at, per in ((lo, cand.per[0]), (hi + 1, cand.per[0]), (cand.at[0], cand.per[0] + 1)):
        assert not steady_timing.inside_range(eng.codes[0], eng.ranges[0], eng.periods[0], at, per, 90 - cand.extra)


def test_insert_periods_with_and_without_the_table() -> None:
    """insert_periods makes the same ops from the op table's tuples or new ones."""
    for cand in _candidates("v-min", 5, 120):
        assert cand.extra
        block = v_min_block(5)
        assert cand.expand(op_table(block.placement, 120)) == cand.expand()
        assert PeriodicOrders.plain(cand.expand()).expand() == cand.expand()


@pytest.mark.parametrize("cap", [1, 2])
def test_caps_too_low_fall_back(cap: int) -> None:
    """A short run that cannot keep its cap says nothing of the run on m: the full path
    decides (here the same runs raise or not)."""
    name, p, m = "v-half", 4, 120
    block = BLOCKS[name](p)
    pl, caps = block.placement, [cap] * p
    for cand in _candidates(name, p, m):
        assert cand.extra
        got = [(c.expand(), *rest) for c, *rest in w_refill.refill_periodic(pl, m, cand, COSTS[1], MemoryDeltas(), caps)]
        want = w_refill.refill_both(pl, m, cand.expand(), COSTS[1], MemoryDeltas(), caps)
        assert got == _figures(want)


def test_inputs_from_by_sets_is_the_index_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """inputs_from's membership sets (ranks whose range chains are whole) against the
    per-input index arithmetic, on the calls the shortcuts make and on the same calls with
    other ``low`` cuts (before, inside and past the range: both answers met); fails unless
    the sets are used."""
    calls: list[tuple] = []
    real = steady_timing.inputs_from

    def spy(deps, rank_of, codes, reading, low, *rest):
        calls.append((deps, rank_of, [list(c) for c in codes], [list(r) for r in reading], list(low), *rest))
        return real(deps, rank_of, codes, reading, low, *rest)

    monkeypatch.setattr(steady_timing, "inputs_from", spy)
    monkeypatch.setattr(w_refill, "inputs_from", spy)
    for name in sorted(BLOCKS):
        _check(name, 4, 90, COSTS[1], MEMORY[0])
    monkeypatch.undo()
    assert len(calls) >= 6
    whole, seen = [], set()
    chains_whole = steady_timing._chains_whole

    def counted(*a):
        ok = chains_whole(*a)
        whole.append(ok)
        return ok

    for deps, rank_of, codes, reading, low, ranges, refs, periods, m in calls:
        for cut in (low, [lo - 1 for lo, _ in ranges], [q + P for q, P in zip(low, periods)],
                    [hi for _, hi in ranges], [(lo + hi) // 2 for lo, hi in ranges]):
            args = (deps, rank_of, codes, reading, cut, ranges, refs, periods, m)
            monkeypatch.setattr(steady_timing, "_chains_whole", counted)
            fast = steady_timing.inputs_from(*args)
            monkeypatch.setattr(steady_timing, "_chains_whole", lambda *a: False)
            assert fast == steady_timing.inputs_from(*args)
            seen.add(fast)
    assert any(whole) and seen == {True, False}, (any(whole), seen)
