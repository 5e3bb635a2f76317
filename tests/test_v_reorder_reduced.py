"""The slot reorder on fewer microbatches (issue 24, `schedules/v_reorder_periods.py`):
exactly the full path's orders, and the tests fail if the reduced run never proves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.schedules import v_reorder as vr
from pipeoffload.schedules import v_reorder_periods as vp
from pipeoffload.schedules.building_block import BuildingBlock, op_table
from pipeoffload.schedules.v_auto import block_family
from pipeoffload.schedules.vshape import v_half_block, v_min_block, v_zb_block

BLOCKS = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each reduced run's outcome (True: proved), as reorder_orders calls it."""
    runs: list[bool] = []
    plain = vp.reduced_periodic

    def counted(*args, **kwargs):
        orders = plain(*args, **kwargs)
        runs.append(orders is not None)
        return orders

    monkeypatch.setattr(vp, "reduced_periodic", counted)
    return runs


def _sizes(block: BuildingBlock) -> list[int]:
    small = vp.reduced_count(block, 10**9)
    return sorted({1, 2, small, 2 * small - 1, 2 * small, 2 * small + 1, 3 * small + 7, 5 * small})


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 11, 16])
def test_reduced_is_the_full_path(name: str, p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    block = BLOCKS[name](p)
    runs = _counted(monkeypatch)
    for m in _sizes(block):
        ops = op_table(block.placement, m)
        orders = vp.reorder_orders(block, m, ops)
        assert orders == vr.full_orders(block, m, ops), (p, m)
        assert orders == vp.reorder_orders(block, m), (p, m)  # with tuples made, not the table's
    assert sum(runs) >= 4, f"the reduced run proved {sum(runs)} times of {len(runs)}"


@given(name=st.sampled_from(sorted(BLOCKS)), p=st.integers(1, 12), m=st.integers(1, 600))
@settings(max_examples=40, deadline=None)
def test_reduced_is_the_full_path_anywhere(name: str, p: int, m: int) -> None:
    block = BLOCKS[name](p)
    assert vp.reorder_orders(block, m) == vr.full_orders(block, m)


@pytest.mark.parametrize("p", [3, 4, 6])
def test_reduced_on_v_auto_blocks(p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _counted(monkeypatch)
    family = block_family(p)
    for block, _ in family[:: max(1, len(family) // 8)]:
        m = 2 * vp.reduced_count(block, 10**9) + 5
        assert vp.reorder_orders(block, m) == vr.full_orders(block, m)
    assert any(runs), "the reduced run never proved on V-auto's blocks"


@pytest.mark.parametrize("step", ["_weights", "_reordered", "_squeezed", "_band"])
def test_a_failed_check_falls_back(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    block = v_half_block(8)
    m = 3 * vp.reduced_count(block, 10**9)
    full = vr.full_orders(block, m)
    assert vp.reduced_orders(block, vp.reduced_count(block, m), m) == full
    monkeypatch.setattr(vp, step, lambda *args, **kwargs: None)
    runs = _counted(monkeypatch)
    assert vp.reorder_orders(block, m) == full
    assert runs == [False, False]  # the shorter first run, then the run on m', both refused


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_too_few_microbatches_do_not_prove(name: str) -> None:
    """The checks are not vacuous: with a run too short for a steady stretch, or one
    whose cool-down reaches back past it, the proof fails (the caller runs the full path)."""
    block = BLOCKS[name](16)
    assert vp.reduced_orders(block, 6, 200) is None
    assert vp.reduced_orders(block, vp.reduced_count(block, 10**9), 200) is not None


def _final_grid(block: BuildingBlock, m: int) -> list:
    """The slot lists the full path lowers (its five passes, as reorder_orders runs them)."""
    T = block.period
    grid = vr._repeated(block, m)
    grid = vr._squeeze(vr._reorder([vr._with_weights(r) for r in grid], m, with_w=True, period=T), T)
    grid = vr._reorder([r[:4] for r in grid], m, with_w=False, period=T)
    grid = vr._squeeze([vr._with_weights(r) for r in grid], T)
    return [vr._with_weights(r[:4], split=True) for r in grid]


@pytest.mark.parametrize("small", [6, 10, 14, 16])
def test_a_blind_stretch_is_wrong_where_the_checks_refuse(small: int) -> None:
    """Repeating a period of a run too short to prove gives other orders than the full
    path: the checks refuse exactly such runs."""
    block, m = v_half_block(8), 60
    grid = _final_grid(block, small)
    tau = grid[0][0][small // 2]  # a cut in the middle of the run
    blind = [vp._lower_stretched(block.placement, i, rows, tau, block.period, m - small, None)
             for i, rows in enumerate(grid)]
    assert blind != vr.full_orders(block, m)
    assert vp.reduced_orders(block, small, m) is None


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("p", [2, 4, 7, 12, 24])
def test_the_shorter_first_run_is_the_run_on_m_prime(name: str, p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """reorder_periodic runs on shortest_count microbatches first and inserts the periods up
    to m' (rebased): the same orders on m', insertion points and periods as the run on m'
    itself (what the timings and refills then run on), and the same expansion; it fails
    unless the shorter run is taken and proves."""
    block = BLOCKS[name](p)
    runs = _counted(monkeypatch)
    small = vp.reduced_count(block, 10**9)
    fewer = vp.shortest_count(block, small)
    assert fewer < small
    for m in (2 * small, 3 * small + 7):
        ops = op_table(block.placement, m)
        got = vp.reorder_periodic(block, m, ops)
        want = vp.reduced_periodic(block, small, m, ops)
        assert want is not None
        assert (got.orders, got.at, got.per, got.extra) == (want.orders, want.at, want.per, want.extra), (p, m)
        assert got.expand(ops) == vr.full_orders(block, m, ops)
    assert runs[0::2] == [True, True], runs  # each reorder_periodic: the shorter run proved


def test_rebased_inserts_in_two_steps():
    """Inserting d periods, then the rest after the d-th copy, is inserting them all."""
    block = v_half_block(6)
    m = 3 * vp.reduced_count(block, 10**9)
    got = vp.reduced_periodic(block, vp.reduced_count(block, 10**9), m)
    for extra in (0, 1, got.extra // 2, got.extra):
        again = vp.rebased(got, extra)
        assert again.extra == extra and again.expand() == got.expand()
