"""The W refill's lazy skeleton index (schedules/w_refill._skip_steady's ``pos``, issue 24):
an op's index on its rank by the period inside the periodic range, by a search outside
it — the same index as a table of every skeleton op, and both ways must be taken."""

from __future__ import annotations

import pytest

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes import steady_timing
from pipeoffload.schedules import w_refill
from pipeoffload.schedules.building_block import orders_from_block
from pipeoffload.schedules.vshape import unit_peak_bound, v_half_block, v_min_block


@pytest.mark.parametrize("name, block", [("v-min", v_min_block), ("v-half", v_half_block)])
def test_pos_is_the_full_table_and_takes_both_ways(name, block, monkeypatch):
    by_period = [0, 0]  # [found by the period, found by the search]
    index = steady_timing._index

    def counted(*args):
        k = index(*args)
        by_period[k is None] += 1
        return k

    monkeypatch.setattr(w_refill, "_index", counted)
    for p, m in ((4, 40), (6, 50), (8, 70)):
        pl_block = block(p)
        orders = orders_from_block(pl_block, m)
        run = w_refill._Refill(pl_block.placement, m, orders, Costs(), MemoryDeltas(),
                               [unit_peak_bound(name, p)] * p, True, [False])
        assert w_refill._skip_steady(run) > 0  # the shortcut that sets pos fired
        table = {x: i for row in run.skeleton for i, x in enumerate(row)}
        assert all(run.pos(x) == i for x, i in table.items())
    assert by_period[0] > 0 and by_period[1] > 0
