"""Zero-bubble schedules: ZB-H1, ZB-H2, zb-auto (ZB-1p / ZB-2p) and ZB-V.

Two bubble metrics appear below (see pipeoffload.timeline):

* ``tl.bubble_rate``: the ZB paper's metric, 1 − busiest rank / longest rank *span*
  (a rank's first op start to its last op end). The published ZB and V figures (docs/algorithms.md#8-published-figures-the-tests-check) are
  in this metric;
* ``tl.bubble_rate_makespan``: 1 − busiest rank / makespan over all ranks. ZB-2p's
  and ZB-V's published 0 is impossible in it: its makespan includes the (p−1)·T_F a
  later rank waits for its first input.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeoffload.cli import main as cli_main
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.ir import OpKind, Placement, build_schedule
from pipeoffload.passes.timing import simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules import ScheduleSpec, build, generate
from pipeoffload.schedules.zb_auto import auto_candidates
from pipeoffload.schedules.zb_v import v_candidates
from pipeoffload.timeline import Timeline

TOL = 0.002  # docs/algorithms.md#8-published-figures-the-tests-check: bubble within 0.002 absolute, or lower


def spans(tl: Timeline) -> list[float]:
    return tl.spans()


def iteration_bubble(tl: Timeline) -> float:
    return tl.bubble_rate


def run(name: str, p: int, m: int, costs: Costs | None = None, memory: MemoryDeltas | None = None, **kw) -> Timeline:
    costs, memory = costs or Costs(), memory or MemoryDeltas()
    return simulate(generate(name, p, m, costs=costs, memory=memory, **kw), costs, memory)


# --- unit-cost grid, p = 4 (docs/algorithms.md#82-unit-cost-grid-for-four-stages) --------------------------------------------------

GRID = {  # m: (1F1B, ZB-1p, ZB-2p, ZB-V) bubble rates
    8: (0.273, 0.111, 0.0, 0.0),
    16: (0.158, 0.059, 0.0, 0.0),
    32: (0.086, 0.030, 0.0, 0.0),
}


@pytest.mark.parametrize("m", sorted(GRID))
def test_unit_grid_p4(m: int) -> None:
    r1f1b, r1p, r2p, rv = GRID[m]
    ref = run("1f1b", 4, m)
    assert ref.bubble_rate == pytest.approx(r1f1b, abs=5e-4)
    assert max(ref.peak_memory()) == 4
    for tl in (run("zb-h1", 4, m), run("zb-auto", 4, m)):
        assert iteration_bubble(tl) <= r1p + TOL
        assert tl.bubble_rate == pytest.approx(3 / (3 * m + 3))  # (p−1)(F+B−W) in both metrics
        assert max(tl.peak_memory()) <= 4
    zb2 = run("zb-auto", 4, m, mem_limit=8)
    assert iteration_bubble(zb2) <= r2p + TOL and max(zb2.peak_memory()) <= 8
    zbv = run("zb-v", 4, m)
    assert iteration_bubble(zbv) <= rv + TOL and max(zbv.peak_memory()) <= 4
    # Makespan metric: only the fill of the first microbatch is left.
    assert zbv.bubble_rate_makespan == pytest.approx(1.5 / (3 * m + 1.5))


# --- the published ZB row, 1.5B model, 8 A100s (docs/algorithms.md#81-zero-bubble-row-for-the-15b-model) -------------------------------

PUB_COSTS = Costs(F=18.522, B=18.086, W=9.337, comm=0.601)
PUB_MEMORY = MemoryDeltas(F=201216, B=-127488, W=-73728)  # 34h+5as, −(2h+5as), −32h with h=2304 a=24 s=1024


def test_published_row() -> None:
    one_p, two_p = 8 * PUB_MEMORY.F, 16 * PUB_MEMORY.F
    assert (one_p, two_p) == (1609728, 3219456)
    h1 = run("zb-h1", 8, 24, PUB_COSTS, PUB_MEMORY)
    h2 = run("zb-h2", 8, 24, PUB_COSTS, PUB_MEMORY)
    zb1 = run("zb-auto", 8, 24, PUB_COSTS, PUB_MEMORY, mem_limit=one_p)
    zb2 = run("zb-auto", 8, 24, PUB_COSTS, PUB_MEMORY, mem_limit=two_p)
    assert iteration_bubble(h1) <= 0.1585 + TOL
    assert iteration_bubble(h2) <= 0.1083 + TOL
    assert iteration_bubble(zb1) <= 0.1585 + TOL
    assert iteration_bubble(zb2) <= 0.0433 + TOL
    assert max(zb1.peak_memory()) <= one_p and max(zb2.peak_memory()) <= two_p
    assert max(h1.peak_memory()) <= one_p
    # Makespan metric: ZB-1p = ZB-H1; ZB-2p no worse than ZB-H2.
    assert zb1.bubble_rate_makespan == pytest.approx(0.1585, abs=5e-4)
    assert zb2.bubble_rate_makespan <= h2.bubble_rate_makespan + 1e-9


@pytest.mark.parametrize("limit,expect", [(1609728, 0.1585), (3219456, 0.0433)])
def test_published_row_cli(capsys, limit: int, expect: float) -> None:
    rc = cli_main([
        "simulate", "zb-auto", "-p", "8", "-m", "24",
        "--costs", "F=18.522,B=18.086,W=9.337,comm=0.601",
        "--memory", "F=201216,B=-127488,W=-73728", "--mem-limit", str(limit), "--json",
    ])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bubble_rate"] == pytest.approx(expect, abs=TOL) or out["bubble_rate"] < expect
    assert out["peak_memory_max"] <= limit


# --- closed forms -------------------------------------------------------------------------

CLOSED_COSTS = [(1, 1, 1), (1.5, 1.5, 0.5), (2, 1, 1), (2, 1.5, 2), (1, 2, 0.5), (1, 1, 2), (1, 2, 1.5), (3, 1, 0.5)]


def _bubble_time(tl: Timeline) -> float:
    return max(spans(tl)) - max(tl.busy())


def _closed_costs(p: int) -> list[tuple[float, float, float]]:
    return CLOSED_COSTS if p <= 16 else CLOSED_COSTS[::3]  # keep p = 32 quick


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 16, 32])
def test_zb_h1_closed_form(p: int) -> None:
    """(p−1)(T_F+T_B−T_W) when T_W ≤ T_F; (p−1)·T_B when W is larger (rank 0 waits
    (p−1)·T_B for its first B with nothing to run). Peak exactly p."""
    for f, b, w in _closed_costs(p):
        costs = Costs(F=f, B=b, W=w)
        for m in (p, 2 * p, 3 * p + 1):
            tl = run("zb-h1", p, m, costs)
            assert _bubble_time(tl) == pytest.approx((p - 1) * (f + b - min(f, w)))
            assert max(tl.peak_memory()) == p


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 16, 32])
def test_zb_h2_closed_form(p: int) -> None:
    """(p−1)·max(0, T_F+T_B−2T_W) when T_B ≤ T_F (and (p−1)(T_B−T_F) is the floor
    otherwise), m ≥ 2p−1. Peak exactly 2p−1."""
    for f, b, w in _closed_costs(p):
        costs = Costs(F=f, B=b, W=w)
        for m in (2 * p - 1, 2 * p, 3 * p + 1):
            tl = run("zb-h2", p, m, costs)
            assert _bubble_time(tl) == pytest.approx((p - 1) * max(0.0, f + b - 2 * w, b - f))
            assert max(tl.peak_memory()) == 2 * p - 1


@pytest.mark.parametrize("p", [3, 8, 16, 32])
def test_large_grids_unit_costs(p: int) -> None:
    """ZB-1p = ZB-H1's closed form; ZB-2p and ZB-V reach 0 (iteration metric) once
    m ≥ 2p; peaks p, 2p and p."""
    for m in (2 * p, 3 * p) if p < 32 else (2 * p,):
        zb1 = run("zb-auto", p, m)
        assert iteration_bubble(zb1) == pytest.approx((p - 1) / (3 * m + p - 1))
        assert max(zb1.peak_memory()) <= p
        zb2 = run("zb-auto", p, m, mem_limit=2 * p)
        assert iteration_bubble(zb2) <= 1e-9 and max(zb2.peak_memory()) <= 2 * p
        zbv = run("zb-v", p, m)
        assert iteration_bubble(zbv) <= 1e-9 and max(zbv.peak_memory()) <= p


# --- the greedy's timing is the timing pass's ---------------------------------------------

def test_tracker_times_agree_with_simulate() -> None:
    """Every candidate the greedy schedulers time internally gets exactly the same
    makespan, spans and peak from the timing pass (unequal stages, B freeing part)."""
    costs = Costs(comm=0.3, rank_costs=((1.0, 2.0, 0.7), (1.6, 1.1, 1.3), (0.6, 0.9, 2.2), (2.0, 1.2, 0.5)))
    memory = MemoryDeltas(F=3.0, B=-1.0, W=-2.0)
    for pl, cands in (
        (Placement.loop(4, 1), auto_candidates(4, 10, costs, memory, 4 * 3.0 * 1.5)),
        (Placement.vshape(4), v_candidates(4, 10, costs, memory, 4 * 3.0)),
    ):
        assert cands
        for tr in cands:
            tl = simulate(build_schedule("x", 10, pl, tr.order), costs, memory)
            assert tl.makespan == pytest.approx(tr.makespan())
            assert max(spans(tl)) == pytest.approx(tr.max_span())
            assert tl.peak_memory() == pytest.approx(tr.peak)


def test_zb_auto_uses_rank_costs_and_limit() -> None:
    """A heavy last stage: zb-auto still beats 1F1B and matches or beats ZB-H1, and
    each limit between 1 and 2p forwards is respected."""
    costs = Costs(comm=0.1, rank_costs=((1, 1, 1),) * 5 + ((2.0, 2.5, 1.0),))
    ref, h1 = run("1f1b", 6, 18, costs), run("zb-h1", 6, 18, costs)
    auto = run("zb-auto", 6, 18, costs)
    assert max(spans(auto)) <= max(spans(h1)) + 1e-9 < max(spans(ref))
    prev = None
    for limit in (1, 2, 3.5, 6, 9, 12):
        tl = run("zb-auto", 6, 18, costs, mem_limit=limit)
        assert max(tl.peak_memory()) <= limit + 1e-9
        if prev is not None:  # more memory never hurts (the same candidates remain)
            assert max(spans(tl)) <= prev + 1e-9
        prev = max(spans(tl))


# --- properties ---------------------------------------------------------------------------

cost = st.floats(0.5, 3.0, allow_nan=False)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=st.integers(2, 16),
    mult=st.floats(1.0, 4.0),
    f=cost, b=cost, w=cost,
    comm=st.one_of(st.just(0.0), st.floats(0.0, 0.5)),
)
def test_properties(p: int, mult: float, f: float, b: float, w: float, comm: float) -> None:
    m = max(p, min(4 * p, round(p * mult)))
    costs = Costs(F=f, B=b, W=w, comm=comm)
    ref = run("1f1b", p, m, costs)
    bounds = {"zb-h1": p, "zb-h2": 2 * p - 1, "zb-auto": p, "zb-v": p}
    for name, bound in bounds.items():
        sched = generate(name, p, m, costs=costs)
        validate(sched)
        counts = Counter(o.key for o in sched.ops())
        assert set(counts.values()) == {1}
        assert len(counts) == 3 * sched.num_stages * m  # F, B, W once each
        tl = simulate(sched, costs)
        assert max(tl.peak_memory()) <= bound + 1e-9, name
        if name != "zb-h2":
            # Same compute per rank as 1F1B, so comparing times compares bubbles.
            assert max(tl.busy()) == pytest.approx(max(ref.busy()))
            assert max(spans(tl)) <= max(spans(ref)) + 1e-9, name
            assert tl.makespan <= ref.makespan + 1e-9, name
    two_p = run("zb-auto", p, m, costs, mem_limit=2 * p)
    assert max(two_p.peak_memory()) <= 2 * p + 1e-9
    assert max(spans(two_p)) <= max(spans(run("zb-auto", p, m, costs))) + 1e-9


@settings(deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 14), f=cost, b=cost, w=cost, comm=st.floats(0.0, 0.5))
def test_any_microbatch_count(p: int, m: int, f: float, b: float, w: float, comm: float) -> None:
    """Every generator works for any m ≥ 1 (also m < p) and stays valid."""
    costs = Costs(F=f, B=b, W=w, comm=comm)
    for name in ("zb-h1", "zb-h2", "zb-auto", "zb-v"):
        sched = build(ScheduleSpec(name, p, m, costs=costs))  # validates
        assert sum(1 for _ in sched.ops()) == 3 * sched.num_stages * m


# --- parameter errors ---------------------------------------------------------------------

@pytest.mark.parametrize(
    "name,kw,param",
    [
        ("zb-v", {"v": 3}, "v"),
        ("zb-v", {"g": 2}, "g"),
        ("zb-h1", {"v": 2}, "v"),
        ("zb-h2", {"g": 4}, "g"),
        ("zb-auto", {"v": 2}, "v"),
        ("zb-auto", {"mem_limit": 0.5}, "mem_limit"),
        ("zb-v", {"mem_limit": 0.25}, "mem_limit"),
    ],
)
def test_parameter_errors(name: str, kw: dict, param: str) -> None:
    with pytest.raises(ParameterError) as e:
        generate(name, 4, 8, **kw)
    assert e.value.param == param


def test_zb_v_placement_and_kinds() -> None:
    s = generate("zb-v", 4, 8)
    assert s.placement.kind == "v" and s.chunks == 2
    for r, ops in enumerate(s.ranks):
        assert {o.stage for o in ops} == {r, 7 - r}
        assert {o.kind for o in ops} == {OpKind.F, OpKind.B, OpKind.W}


@pytest.mark.parametrize("p", [3, 4, 6])
@pytest.mark.parametrize("costs", [Costs(F=2, B=2, W=2), Costs(F=2, B=4, W=2), Costs(F=2, B=2, W=2, comm=0.1)])
def test_zb_v_below_p_never_worse_than_the_controllable_blocks(p: int, costs: Costs) -> None:
    """Below 1F1B's memory ZB-V also lowers V-Half's and V-Min's blocks: at their peaks it is
    within their span (it was 17 to 29 bubble points worse, docs/solver.md), and within the limit."""
    from pipeoffload.schedules.vshape import unit_peak_bound

    m = 2 * p
    for name in ("v-min", "v-half"):
        limit = unit_peak_bound(name, p)
        zbv = simulate(generate("zb-v", p=p, m=m, costs=costs, mem_limit=limit), costs)
        fixed = simulate(generate(name, p=p, m=m, costs=costs), costs)
        assert max(zbv.peak_memory()) <= limit + 1e-9
        assert max(zbv.spans()) <= max(fixed.spans()) * (1 + 1e-9)


@given(p=st.integers(2, 5), extra=st.integers(0, 12), f=st.floats(0.5, 3), b=st.floats(0.5, 3), w=st.floats(0.2, 3),
       comm=st.sampled_from([0.0, 0.05, 0.3]))
@settings(deadline=None)
def test_zb_v_lower_bounds_hold_for_every_candidate(p, extra, f, b, w, comm):
    """ZB-V skips its fixed orders when the greedy's best is at these bounds: no candidate,
    greedy or fixed order, may ever go below them."""
    from pipeoffload.schedules.zb_auto import Tracker, default_limit
    from pipeoffload.schedules.zb_v import v_candidates
    from pipeoffload.schedules.zb_auto import lower_bounds
    from pipeoffload.schedules.zero_bubble import _replays, _zbv_handcrafted

    m = 1 + extra
    pl, costs, memory = Placement.vshape(p), Costs(F=f, B=b, W=w, comm=comm), MemoryDeltas()
    limit = default_limit(pl, memory)
    cands = v_candidates(p, m, costs, memory, limit)
    cands += _replays(lambda: Tracker(pl, m, costs, memory, limit), [_zbv_handcrafted(p, m)])
    assert cands
    span, makespan = lower_bounds(cands[0], pl, m)
    for t in cands:
        assert t.max_span() >= span - 1e-9 * span and t.makespan() >= makespan - 1e-9 * makespan
