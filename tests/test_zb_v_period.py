"""ZB-V's greedy with its periodic steady state written at once (zb_v._PeriodSkip) is the
plain greedy: the same orders, end times, clocks, levels, peaks, idle times and flags."""

from __future__ import annotations

import itertools

import pytest

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.ir import Placement
from pipeoffload.schedules import zb_v as Z
from pipeoffload.schedules.zb_auto import Infeasible
from pipeoffload.schedules.zero_bubble import default_limit

COSTS = [Costs(), Costs(F=1, B=2, W=1, comm=1), Costs(F=2, B=3, W=1, comm=0), Costs(F=1, B=1, W=2, comm=2),
         Costs(F=1.5, B=1.5, W=0.75, comm=0.25)]


def _run(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float, flags: tuple[bool, bool],
         skip: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """One greedy run's whole state (or its Infeasible message), and the rounds skipped."""
    with monkeypatch.context() as mp:
        made: list[Z._PeriodSkip] = []
        if skip:
            init = Z._PeriodSkip.__init__
            mp.setattr(Z._PeriodSkip, "__init__", lambda self, run: (init(self, run), made.append(self))[0])
        else:
            mp.setattr(Z._PeriodSkip, "exact", staticmethod(lambda run: False))
        g = Z._GreedyRun(p, m, costs, memory, limit, None)
        try:
            tr = g.run(*flags)
        except Infeasible as e:
            return str(e), 0
        state = (tr.order, tr.end, tr.clock, tr.level, tr.peak, tr.idle, tr.first, tr.started, g.consulted,
                 g.allowance_used)
        return state, sum(s.skipped for s in made)


@pytest.mark.parametrize("p", range(1, 9))
def test_skipped_rounds_are_the_plain_rounds(p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    skipped = 0
    for m, costs, memory in itertools.product([1, 2, p, 2 * p, 3 * p + 1, 5 * p + 3, 40], COSTS,
                                              [MemoryDeltas(), MemoryDeltas(F=2.0, B=-0.5, W=-1.5)]):
        base = default_limit(Placement.vshape(p), memory)
        for limit, flags in itertools.product([base, 0.75 * base, 1.5 * base],
                                              itertools.product([True, False], repeat=2)):
            plain, _ = _run(p, m, costs, memory, limit, flags, False, monkeypatch)
            fast, k = _run(p, m, costs, memory, limit, flags, True, monkeypatch)
            assert fast == plain, (m, costs, memory, limit, flags)
            skipped += k
    assert skipped > 0  # the comparison is not vacuous: rounds were written at once


def test_skip_needs_exact_times() -> None:
    """Times that are not multiples of 2**-10 (float sums not exact) take every round."""
    run = Z._GreedyRun(4, 40, Costs(F=1.1, B=1.0, W=1.0), MemoryDeltas(), 4.0, None)
    assert not Z._PeriodSkip.exact(run)
    assert Z._PeriodSkip.exact(Z._GreedyRun(4, 40, Costs(), MemoryDeltas(), 4.0, None))


def test_most_of_a_long_steady_state_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    state, k = _run(16, 400, Costs(), MemoryDeltas(), 16.0, (True, True), True, monkeypatch)
    assert k > 600  # of about 2m = 800 rounds (warm-up and cool-down take the rest)
