"""The building-block reorder's periodic steady state (issue 24): the periods it proves
repeat and writes by shifting give exactly the plain scan's grid, for the three V blocks
and a sample of V-auto's block family over a grid of (p, m)."""

from __future__ import annotations

import pytest

from pipeoffload.schedules.building_block import (BuildingBlock, compress_cooldown, orders_from_block, reorder,
                                                   repeat, steady_range)
from pipeoffload.schedules import building_block as bb
from pipeoffload.schedules.v_auto import block_family
from pipeoffload.schedules.vshape import v_half_block, v_min_block, v_zb_block


def _full(block: BuildingBlock, m: int) -> list:
    grid = repeat(block, m)
    reorder(grid)
    compress_cooldown(grid)
    assert grid.skipped == 0
    return grid.orders()


def _periodic(block: BuildingBlock, m: int) -> tuple[list, int]:
    grid = repeat(block, m)
    reorder(grid, steady=steady_range(block, m))
    compress_cooldown(grid)
    return grid.orders(), grid.skipped


def _ms(p: int) -> list[int]:
    return sorted({1, 2, 3, p, 2 * p + 1, 3 * p + 2, 5 * p + 4, 8 * p + 3, 12 * p + 7})


@pytest.mark.parametrize("p", list(range(1, 13)) + [16, 20])
@pytest.mark.parametrize("make", [v_min_block, v_half_block, v_zb_block], ids=["v-min", "v-half", "v-zb"])
def test_periodic_reorder_is_the_full_scan(make, p: int) -> None:
    block = make(p)
    skipped_any = False
    for m in _ms(p):
        fast, skipped = _periodic(block, m)
        assert fast == _full(block, m), (p, m)
        assert fast == orders_from_block(block, m)
        skipped_any |= skipped > 0
    # The test can fail: at the largest m the steady state is found and shifted.
    assert skipped_any, f"no period was skipped at p={p}"


@pytest.mark.parametrize("p", [3, 4, 5, 6, 8])
def test_periodic_reorder_on_v_auto_blocks(p: int) -> None:
    family = block_family(p)
    for block, _ in family[:: max(1, len(family) // 12)]:
        for m in (p, 3 * p + 1, 10 * p + 3):
            fast, _ = _periodic(block, m)
            assert fast == _full(block, m), (p, m, dict(block.slots))


def _reduced_fires(block: BuildingBlock, m: int) -> bool:
    small = bb._reduced_count(block, m)
    return small < m and bb._orders_reduced(block, small, m) is not None


@pytest.mark.parametrize("p", list(range(1, 11)) + [13, 16, 24])
@pytest.mark.parametrize("make", [v_min_block, v_half_block, v_zb_block], ids=["v-min", "v-half", "v-zb"])
def test_reduced_run_is_the_full_pipeline(make, p: int) -> None:
    """orders_from_block from a run on fewer microbatches, the missing periods inserted,
    is the pipeline run on all of them; the test fails if the reduced run never proves."""
    block = make(p)
    fired = 0
    for m in sorted({1, 2, p, 3 * p + 2, 8 * p + 3, 12 * p + 7, 20 * p + 1, 30 * p + 5}):
        assert orders_from_block(block, m) == bb._orders_full(block, m), (p, m)
        fired += _reduced_fires(block, m)
    assert fired >= 2, f"the reduced run proved only {fired} times at p={p}"


@pytest.mark.parametrize("p", [3, 4, 5, 6])
def test_reduced_run_on_v_auto_blocks(p: int) -> None:
    family = block_family(p)
    fired = 0
    for block, _ in family[:: max(1, len(family) // 10)]:
        for m in (p, 10 * p + 3, 40 * p + 1):
            assert orders_from_block(block, m) == bb._orders_full(block, m), (p, m, dict(block.slots))
            fired += _reduced_fires(block, m)
    assert fired > 0


def test_reduced_run_refuses_what_it_cannot_prove(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reduced run whose cool-down reads before the periodic range is not used (the
    check is not blind): forcing the reach check to fail falls back to the full run."""
    block = v_half_block(6)
    assert _reduced_fires(block, 200)
    monkeypatch.setattr(bb, "_cooldown_reach", lambda grid: -1)
    assert not _reduced_fires(block, 200)
    assert orders_from_block(block, 200) == bb._orders_full(block, 200)


@pytest.mark.parametrize("make", [v_min_block, v_half_block, v_zb_block], ids=["v-min", "v-half", "v-zb"])
def test_reduced_run_with_the_op_table(make) -> None:
    """With an op table (as the V lowering passes it), the stretched orders are the full
    pipeline's, made of the table's own tuples (its copies are column slices, zipped)."""
    fired = 0
    for p, m in ((4, 125), (8, 245), (13, 400)):
        block = make(p)
        table = bb.op_table(block.placement, m)
        got = orders_from_block(block, m, table)
        assert got == bb._orders_full(block, m), (p, m)
        assert all(op is table[op[0], op[1]][op[2]] for row in got for op in row)
        fired += _reduced_fires(block, m)
    assert fired >= 2
