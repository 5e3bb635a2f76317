"""V-auto's block family computed without building it (issue 24): the closed-form
family (:func:`pipeoffload.schedules.v_auto._family`) against the walk it replaced —
every member built rank by rank, deduplicated by its slots, its peak counted by
``steady_peak`` — and the search picking what the full family picks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes.steady_timing import PeriodicOrders
from pipeoffload.schedules import ScheduleSpec
from pipeoffload.schedules import v_auto as va
from pipeoffload.schedules.building_block import BuildingBlock, steady_peak

PERIOD = 6


def _walk_family(p: int) -> list[tuple[int, tuple[int, ...], BuildingBlock]]:
    """The family as block_family built it before issue 24's fifth pass: every member
    walked rank by rank, built, deduplicated by its slots (first met kept), its peak by
    ``steady_peak``; sorted by peak, stably."""
    seen: dict[frozenset, tuple[int, tuple[int, ...], BuildingBlock]] = {}
    steps = range(1, PERIOD)
    for f1 in steps:
        for b1 in steps:
            for b0 in steps:
                if len({f1, b1, b0}) < 3:
                    continue
                for d0 in steps:
                    for d1 in range(1, d0 + 1):
                        for k in range(1, p) if d1 < d0 else [p]:
                            ph, rows = (0, f1, b1, b0), []
                            for i in range(p):
                                if i:
                                    d = d0 if i <= k else d1
                                    ph = ((ph[0] + d) % 6, (ph[1] - 1) % 6, (ph[2] + d) % 6, (ph[3] - 1) % 6)
                                    if len(set(ph)) < 4:
                                        break
                                w = va._w_phases(ph)
                                if w is None:
                                    break
                                rows.append(list(ph) + list(w))
                            else:
                                blk = va._block_from_phases(p, rows)
                                key = frozenset(blk.slots.items())
                                if key not in seen:
                                    seen[key] = (max(steady_peak(blk)), (f1, b1, b0, d0, d1, k), blk)
    return sorted(seen.values(), key=lambda x: x[0])


@pytest.mark.parametrize("p", list(range(1, 17)) + [19, 23, 32])
def test_family_is_the_walked_family(p):
    """Same members (parameters and slots), same peaks, same order."""
    ref = _walk_family(p)
    fam = va._family(p)
    assert [(pk, prm) for pk, prm, _ in ref] == list(fam)
    built = va.block_family(p)
    assert len(built) == len(ref)
    for (blk, pk), (rpk, _, rblk) in zip(built, ref):
        assert pk == rpk and dict(blk.slots) == dict(rblk.slots)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 90), data=st.data())
def test_closed_form_peak_is_steady_peak(p, data):
    """The closed-form peak (six ranks per stretch) is steady_peak's highest rank, for
    members of any p (the walked family is only affordable for small p)."""
    fam = va._family(p)
    peak, params = fam[data.draw(st.integers(0, len(fam) - 1))]
    assert peak == max(steady_peak(va._family_block(p, params)))


def test_closed_form_peak_fails_when_a_stretch_is_cut_short():
    """Counting only the first rank of each stretch (not six) gives a wrong peak
    somewhere: the six-rank argument is needed, and the test above can fail."""
    wrong = 0
    for p in (7, 13):
        for peak, params in va._family(p):
            blk = va._family_block(p, params)
            sp = steady_peak(blk)
            n0 = min(params[5], p - 1)
            if max(sp[0], sp[n0]) != peak:
                wrong += 1
    assert wrong > 0


def test_a_member_that_is_no_block_is_refused():
    with pytest.raises(va.ParameterError, match="params"):
        va._rows(8, (1, 1, 2, 1, 1, 8))  # f and B phases collide on rank 0


def _search_with(family_of, spec: ScheduleSpec):
    """v_auto's orders with ``_family`` replaced by ``family_of``."""
    saved = va._family
    va._family = family_of
    try:
        s = va.v_auto(spec)
    finally:
        va._family = saved
    return [[(o.kind, o.stage, o.microbatch) for o in r] for r in s.ranks]


@pytest.mark.parametrize("p, m", [(2, 3), (3, 7), (4, 4), (5, 11), (6, 13), (8, 9)])
@pytest.mark.parametrize("costs", [Costs(), Costs(F=1, B=2, W=1), Costs(F=1.3, B=1, W=2.1, comm=0.05)])
def test_search_picks_what_the_walked_family_picks(p, m, costs):
    """The search over the closed-form family (blocks built only when lowered) returns
    the orders it returns over the walked family, at the default limit and a lower one."""
    walked = {q: tuple((pk, prm) for pk, prm, _ in _walk_family(q)) for q in (p,)}
    for limit in (None, max(1.0, p // 2 + 1)):
        spec = ScheduleSpec("v-auto", p, m, costs=costs, memory=MemoryDeltas(), mem_limit=limit)
        try:
            fast = _search_with(va._family, spec)
        except va.ParameterError:
            with pytest.raises(va.ParameterError):
                _search_with(walked.__getitem__, spec)
            continue
        assert fast == _search_with(walked.__getitem__, spec)


def test_only_lowered_blocks_are_built():
    """At p = 24 V-auto builds the SCAN blocks and those its grid search times, not the
    family's 1.4 k members; and one proxy block is not timed as a repeated grid."""
    va._family_block.cache_clear()
    va.v_auto(ScheduleSpec("v-auto", 24, 48))
    built = va._family_block.cache_info().misses
    assert 0 < built <= va.SCAN + max(1, va.PROXY_CELLS // (24 * PERIOD * 48))
    assert built < len(va._family(24)) // 4


def test_one_proxy_block_is_lowered_without_its_repeated_grid(monkeypatch):
    """With room for one proxy block, its repeated grid is not timed (nothing to rank),
    and the grid candidate is the same."""
    spec = ScheduleSpec("v-auto", 4, 9, costs=Costs(F=1, B=2, W=1))
    calls = []
    real = va.time_grid

    def counting(grid, *a):
        calls.append(len(grid[0]))
        return real(grid, *a)

    monkeypatch.setattr(va, "time_grid", counting)
    monkeypatch.setattr(va, "PROXY_CELLS", 4 * PERIOD * 9)  # n_proxy = 1
    out = va._grid_candidate(4, 9, spec.costs, spec.memory, 10.0, 10.0)
    assert len(calls) == 1  # the lowered grid only
    va._repeated.cache_clear()
    monkeypatch.setattr(va, "_repeated", lambda *a: pytest.fail("a lone proxy block was timed"))
    assert va._grid_candidate(4, 9, spec.costs, spec.memory, 10.0, 10.0) == out


@pytest.mark.parametrize("p, m", [(3, 4), (4, 9), (5, 11), (8, 17), (12, 27)])
@pytest.mark.parametrize("costs", [Costs(), Costs(F=1, B=2, W=1), Costs(F=1.3, B=1, W=2.1, comm=0.05)])
@pytest.mark.parametrize("memory", [MemoryDeltas(), MemoryDeltas(1.0, -0.25, -0.75)])
def test_time_grid_figures_are_the_timing_passes(p, m, costs, memory):
    """V-auto drops a grid lowering on time_grid's span before making it orders: those
    figures are the timing pass's (steady_figures of the orders) bit for bit."""
    from pipeoffload.ir import Placement

    pl = Placement.vshape(p)
    dur, delta = costs.duration_table(pl), memory.delta_table(pl)
    fam = va._family(p)
    n = 0
    for pk, params in fam[::max(1, len(fam) // 5)]:
        grid = va._lowered(p, m, params, True) if pk <= 2 * p else None
        if grid is not None:
            n += 1
            key = va._key(pl, m, PeriodicOrders.plain(va.grid_orders(grid)), costs, memory)
            assert va.time_grid(grid, dur, costs.comm, delta) == key
    assert n > 0
