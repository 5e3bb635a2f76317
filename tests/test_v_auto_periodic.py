"""V-auto's scan holds its candidates on fewer microbatches (issue 24,
:func:`pipeoffload.schedules.v_auto._scan_blocks`): the slot reorders, building-block
pipelines and W refills of the scanned blocks are kept as ``PeriodicOrders``, timed and
refilled on ``m'`` microbatches, and only the winner is expanded. V-auto's answer must be
the one it gives with every candidate expanded before it is timed or refilled (the full
path), and the tests fail unless the short path is taken."""

from __future__ import annotations

import pytest

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes.steady_timing import PeriodicOrders
from pipeoffload.schedules import generate
from pipeoffload.schedules import v_auto as va

CASES = [  # (the first three: a scanned block on m' microbatches wins, expanded at the end)
    (4, 48, Costs(), MemoryDeltas(), 3.6),
    (5, 60, Costs(F=1, B=1.5, W=0.5, comm=0.25), MemoryDeltas(), 4.5),
    (6, 72, Costs(F=1, B=1.5, W=0.5, comm=0.25), MemoryDeltas(), 5.4),
    (4, 60, Costs(F=1, B=1.5, W=0.5, comm=0.25), MemoryDeltas(F=1, B=-0.25, W=-0.75), None),
    (4, 48, Costs(F=1.1, B=2.3, W=0.7), MemoryDeltas(), None),  # not binary fractions: expanded when made
]


def _orders(schedule) -> list[list[tuple]]:
    return [[(o.kind, o.stage, o.microbatch) for o in r] for r in schedule.ranks]


@pytest.mark.parametrize("p,m,costs,memory,limit", CASES)
def test_scan_on_fewer_microbatches_is_the_full_path(p, m, costs, memory, limit, monkeypatch):
    short = {"timed": 0, "refilled": 0}
    held: list = []  # the candidates held on fewer microbatches
    real_key, real_refill, real_scan = va._key, va.refill_periodic, va._scan_blocks
    scanned: list = []  # the scan's winner (expanded)

    def key(pl, mm, cand, *rest):
        short["timed"] += cand.extra > 0
        held.append(cand)
        return real_key(pl, mm, cand, *rest)

    def refill(pl, mm, cand, *rest):
        out = real_refill(pl, mm, cand, *rest)
        short["refilled"] += sum(c.extra > 0 for c, *_ in out)
        held.extend(c for c, *_ in out)
        return out

    def scan(*args):
        best = real_scan(*args)
        scanned.append(best[0])
        return best

    monkeypatch.setattr(va, "_key", key)
    monkeypatch.setattr(va, "refill_periodic", refill)
    monkeypatch.setattr(va, "_scan_blocks", scan)
    fast = generate("v-auto", p=p, m=m, costs=costs, memory=memory, mem_limit=limit)
    if costs.F == 1:  # binary fractions: the short path must be taken
        assert short["timed"] >= 2 and short["refilled"] >= 1, short
    else:  # the short runs cannot shift: each candidate was expanded once, when made
        assert short == {"timed": 0, "refilled": 0} and held, short
    won = any(c.extra and c.expand() == scanned[0] for c in held)
    assert won == (CASES.index((p, m, costs, memory, limit)) < 3)
    # The full path: every candidate expanded before it is timed or refilled.
    for name in ("reorder_periodic", "periodic_from_block"):
        real = getattr(va, name)
        monkeypatch.setattr(va, name, lambda *a, real=real: PeriodicOrders.plain(real(*a).expand()))
    short.update(timed=0, refilled=0)
    slow = generate("v-auto", p=p, m=m, costs=costs, memory=memory, mem_limit=limit)
    assert short == {"timed": 0, "refilled": 0}
    assert _orders(fast) == _orders(slow)
