"""The building-block pipeline's cool-down compression by readiness events (issue 24):
the same grid as the slot-by-slot scan it replaced (kept here), for the three V blocks
and samples of V-auto's block family, on reordered and on plain repeated grids; and the
op table shared while someone holds it (V-auto's lowerings use one table)."""

from __future__ import annotations

import gc
import weakref

import pytest

from pipeoffload.ir import Placement
from pipeoffload.schedules import building_block as bb
from pipeoffload.schedules.building_block import _F, _W, SlotGrid, _dep_cells, compress_cooldown, repeat, reorder
from pipeoffload.schedules.v_auto import block_family
from pipeoffload.schedules import vshape
from pipeoffload.schedules.vshape import v_half_block, v_min_block, v_zb_block


def _plain(grid: SlotGrid) -> SlotGrid:
    """The scan compress_cooldown replaced: slot by slot, every rank from its last
    forward on runs its first ready B in grid order, else its first ready W."""
    p, S = grid.placement.num_ranks, grid.placement.num_stages
    tails, start = [], []
    for r in range(p):
        row = grid.cells[r]
        last_f = len(row) - 1
        while last_f >= 0 and (row[last_f] is None or row[last_f][0] is not _F):
            last_f -= 1
        tail = [c for c in row[last_f + 1:] if c is not None]
        for c in tail:
            grid.take(c)
        tails.append(tail)
        start.append(last_f + 1)
    lists = [([c for c in tail if c[0] is not _W], [c for c in tail if c[0] is _W]) for tail in tails]

    def ready(c: tuple, t: int) -> bool:
        return all(grid.pos.get(d, t) < t for d in _dep_cells(c, S))

    t, left = min(start), sum(map(len, tails))
    while left:
        placed = []
        for r in range(p):
            if t >= start[r]:
                pick = next((c for c in lists[r][0] if ready(c, t)), None) or next(
                    (c for c in lists[r][1] if ready(c, t)), None)
                if pick is not None:
                    placed.append((r, pick))
        for r, c in placed:
            lists[r][c[0] is _W].remove(c)
            grid.put(c, t)
        left -= len(placed)
        t += 1
        assert t < 10 ** 6
    return grid


def _both(block: bb.BuildingBlock, m: int, reordered: bool) -> tuple[SlotGrid, SlotGrid]:
    grids = []
    for compress in (compress_cooldown, _plain):
        grid = repeat(block, m)
        if reordered:
            reorder(grid)
        grids.append(compress(grid))
    return grids[0], grids[1]


def _blocks(p: int) -> list[bb.BuildingBlock]:
    family = block_family(p)
    return [v_min_block(p), v_half_block(p), v_zb_block(p)] + [b for b, _ in family[:: max(1, len(family) // 8)]]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 12])
def test_events_are_the_slot_scan(p: int) -> None:
    """Same cells and positions; some op waited for an input placed in the cool-down
    (the readiness events are exercised, not only the ops ready from the start)."""
    waited = 0
    for block in _blocks(p):
        for m in sorted({1, 2, p, 2 * p + 1, 3 * p + 2}):
            for reordered in (True, False):
                fast, plain = _both(block, m, reordered)
                assert fast.cells == plain.cells and fast.pos == plain.pos, (p, m, reordered, dict(block.slots))
                waited += any(fast.pos[d] > fast.pos[c] - 2 for c in fast.pos for d in _dep_cells(c, 2 * p)
                              if c[0] is not _F)
    assert p == 1 or waited > 0


def test_op_table_is_shared_while_held() -> None:
    """op_table hands out the table someone still holds (the same tuples), a fresh one
    once none is held; V-auto's lowerings then make only one table (fails if they
    stop sharing it)."""
    pl = Placement.vshape(3)
    held = bb.op_table(pl, 7)
    assert bb.op_table(pl, 7) is held and bb.op_table(pl, 8) is not held
    assert held == {(k, s): [(k, s, j) for j in range(7)] for k in (_F, bb._B, _W) for s in range(6)}
    del held
    gc.collect()
    assert (6, 7) not in bb._TABLES


def test_v_auto_makes_one_op_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """V-auto holds one table across V-Min's, V-Half's and its own lowerings: one table
    made (a collection before each ask, so no table outlives its holders in a cycle)."""
    from pipeoffload.schedules import generate

    made = []

    class Collected(weakref.WeakValueDictionary):
        def get(self, key: object, default: object = None) -> object:
            gc.collect()
            return super().get(key, default)

    class Counted(bb._OpTable):
        def __init__(self, *a: object) -> None:
            made.append(1)
            super().__init__(*a)

    monkeypatch.setattr(bb, "_TABLES", Collected())
    monkeypatch.setattr(bb, "_OpTable", Counted)
    vshape._lowered.cache_clear()  # (V-Min's and V-Half's lowerings are remembered per spec)
    generate("v-auto", p=5, m=11)
    assert len(made) == 1
