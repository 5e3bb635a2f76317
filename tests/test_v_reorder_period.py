"""The slot reorder's periodic shortcuts (issue 24): each gives exactly what the plain
pass gives, and each test fails if its shortcut never fires."""

from __future__ import annotations

import pytest

from pipeoffload.ir import OpKind
from pipeoffload.schedules import v_reorder as vr
from pipeoffload.schedules import v_reorder_periods as vp
from pipeoffload.schedules.building_block import BuildingBlock
from pipeoffload.schedules.v_auto import block_family
from pipeoffload.schedules.vshape import v_half_block, v_min_block, v_zb_block

BLOCKS = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}


def _repeated(block: BuildingBlock, m: int) -> list:
    p, T = block.placement.num_ranks, block.period
    grid = []
    for i in range(p):
        c0, c1 = i, 2 * p - 1 - i
        row = [block.slots[(OpKind.F, c0)], block.slots[(OpKind.F, c1)],
               block.slots[(OpKind.B, c1)], block.slots[(OpKind.B, c0)]]
        grid.append([[x + T * j for j in range(m)] for x in row])
    return grid


def _squeezed_inputs(block: BuildingBlock, m: int) -> list:
    """The two grids reorder_orders squeezes, as the plain passes make them."""
    first = vr._reorder([vr._with_weights(r) for r in _repeated(block, m)], m, with_w=True)
    second = vr._reorder([r[:4] for r in vr._squeeze([list(map(list, r)) for r in first])], m, with_w=False)
    return [first, [vr._with_weights(r) for r in second]]


def _copy(grid: list) -> list:
    return [[list(ts) for ts in rows] for rows in grid]


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 8, 11, 16])
def test_periodic_squeeze_is_the_plain_one(name: str, p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    block = BLOCKS[name](p)
    skipped = []
    init = vr._SqueezeSkip.__init__
    monkeypatch.setattr(vr._SqueezeSkip, "__init__", lambda self, *a: (init(self, *a), skipped.append(self))[0])
    for m in sorted({1, 2, p, 3 * p + 1, 10 * p + 3, 25 * p + 2}):
        for grid in _squeezed_inputs(block, m):
            assert vr._squeeze(_copy(grid), block.period) == vr._squeeze(_copy(grid)), (p, m)
    assert p < 3 or sum(s.skipped for s in skipped) > 0, "the squeeze never skipped a period"


@pytest.mark.parametrize("p", [3, 5])
def test_periodic_squeeze_on_v_auto_blocks(p: int) -> None:
    family = block_family(p)
    for block, _ in family[:: max(1, len(family) // 8)]:
        for grid in _squeezed_inputs(block, 12 * p):
            assert vr._squeeze(_copy(grid), block.period) == vr._squeeze(_copy(grid))


@pytest.mark.parametrize("name", sorted(BLOCKS))
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 13])
def test_periodic_rank_levels_are_the_plain_ones(name: str, p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """_RankLevels with the period fills the copies' states in; same events, levels and
    pending W's as the plain scan, on the grids the cool-down reorder sees; fails if no
    period is ever filled in."""
    block = BLOCKS[name](p)
    runs = []
    real = vr._periodic_run
    monkeypatch.setattr(vr, "_periodic_run", lambda *a: (lambda k: (runs.append(k), k)[1])(real(*a)))
    for m in sorted({1, 2, p, 3 * p + 1, 10 * p + 3, 25 * p + 2}):
        first = vr._squeeze(vr._reorder([vr._with_weights(r) for r in _repeated(block, m)], m, with_w=True))
        for rows in [r[:4] for r in first] + _repeated(block, m):
            fast, plain = vr._RankLevels(rows, block.period), vr._RankLevels(rows)
            assert (fast.events, fast.level, fast.pending) == (plain.events, plain.level, plain.pending), (p, m)
    assert p < 3 or max(runs, default=0) > 0, "no period was filled in"


def test_reorder_orders_is_the_plain_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """reorder_orders with its shortcuts gives the orders of the passes without them."""
    cases = [(name, p, m) for name in sorted(BLOCKS) for p in (2, 4, 7) for m in (1, p + 1, 12 * p + 5)]
    fast = [vp.reorder_orders(BLOCKS[n](p), m) for n, p, m in cases]
    plain_squeeze, plain_levels = vr._squeeze, vr._RankLevels
    for mod in (vr, vp):  # the reduced run imported the passes by name
        monkeypatch.setattr(mod, "_squeeze", lambda grid, period=0: plain_squeeze(grid))
        monkeypatch.setattr(mod, "_RankLevels", lambda rows, period=0: plain_levels(rows))
    assert fast == [vp.reorder_orders(BLOCKS[n](p), m) for n, p, m in cases]


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_orders_from_an_op_table_share_its_tuples(name: str) -> None:
    """With an op table, both lowerings give the same orders, made of the table's tuples
    (the V lowerings hold one tuple per op for all their candidates)."""
    from pipeoffload.schedules.building_block import op_table, orders_from_block

    for p, m in ((1, 3), (4, 5), (5, 90), (8, 200)):
        block = BLOCKS[name](p)
        ops = op_table(block.placement, m)
        for make in (orders_from_block, vp.reorder_orders):
            shared = make(block, m, ops)
            assert shared == make(block, m), (make.__name__, p, m)
            assert all(c is ops[c[0], c[1]][c[2]] for row in shared for c in row), (make.__name__, p, m)
