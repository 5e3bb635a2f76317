"""Schedule model, validator and timing pass: rules, errors, closed forms."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas, parse_costs, parse_memory
from pipeoffload.errors import ParameterError, ScheduleError
from pipeoffload.ir import Op, OpKind, Placement, Schedule, build_schedule
from pipeoffload.passes.timing import simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules import generate

from helpers import ALL_SCHEDULES, assert_imports_no_torch

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW


def test_pure_modules_do_not_import_torch():
    # Generating every registry schedule (each imports its generator module) stays torch-free too.
    assert_imports_no_torch("pipeoffload.schedules", "pipeoffload.passes.timing", "pipeoffload.passes.validate",
                            "pipeoffload.timeline", "pipeoffload.cli",
                            then="from pipeoffload.schedules import generate\n"
                                 f"for n in {ALL_SCHEDULES!r}:\n    generate(n, p=4, m=8)\n")


# --- placements --------------------------------------------------------------------
def test_placements():
    lp = Placement.loop(4, 2)
    assert lp.stage_to_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    assert lp.stages_of(1) == (1, 5) and lp.chunk_of(5) == 1
    vp = Placement.vshape(3)
    assert vp.stage_to_rank == (0, 1, 2, 2, 1, 0)
    assert vp.stages_of(0) == (0, 5) and vp.chunk_of(3) == 1
    cp = Placement.custom([0, 0, 1, 1])
    assert cp.num_ranks == 2 and cp.chunks_on(0) == 2
    with pytest.raises(ParameterError, match="rank 1 holds no layer group"):
        Placement.custom([0, 0], p=2)
    with pytest.raises(ParameterError, match="valid ranks are 0..1"):
        Placement.custom([0, 2], p=2)


# --- validator -----------------------------------------------------------------------
def _two_rank(ops0, ops1, m=1):
    return build_schedule("t", m, Placement.loop(2), [ops0, ops1])


def test_validator_accepts_minimal():
    validate(_two_rank([(F, 0, 0), (BW, 0, 0)], [(F, 1, 0), (BW, 1, 0)]))
    validate(_two_rank([(F, 0, 0), (B, 0, 0), (W, 0, 0)], [(F, 1, 0), (B, 1, 0), (W, 1, 0)]))


@pytest.mark.parametrize(
    "ops0, ops1, msg",
    [
        ([(F, 0, 0)], [(F, 1, 0), (BW, 1, 0)], r"missing B and W \(or BW\) for \(stage=0, mb=0\)"),
        ([(F, 0, 0), (B, 0, 0)], [(F, 1, 0), (BW, 1, 0)], r"missing W for \(stage=0, mb=0\)"),
        ([(F, 0, 0), (F, 0, 0), (BW, 0, 0)], [(F, 1, 0), (BW, 1, 0)], "duplicate op"),
        ([(BW, 0, 0), (F, 0, 0)], [(F, 1, 0), (BW, 1, 0)], "rule: local order"),
        ([(F, 0, 0), (W, 0, 0), (B, 0, 0)], [(F, 1, 0), (BW, 1, 0)], "rule: local order"),
        ([(F, 0, 0), (BW, 0, 0), (B, 0, 0)], [(F, 1, 0), (BW, 1, 0)], "B/W together with BW"),
    ],
)
def test_validator_rejects(ops0, ops1, msg):
    with pytest.raises(ScheduleError, match=msg):
        validate(_two_rank(ops0, ops1))


def test_validator_placement_consistency():
    pl = Placement.loop(2)
    bad = Op(F, 1, 0, rank=0, chunk=0)  # layer group 1 lives on rank 1
    s = Schedule("t", 1, pl, [[bad], []])
    with pytest.raises(ScheduleError, match=r"position 0: F\(stage=1, mb=0, rank=0\).*placement consistent"):
        validate(s)


def test_validator_reports_deadlock_cycle():
    # Rank 0 sends F(0,1) only after BW(0,0), which needs rank 1's BW(1,0); rank 1
    # runs F(1,1) first, which needs F(0,1): a cycle, each list locally valid.
    s = _two_rank(
        [(F, 0, 0), (BW, 0, 0), (F, 0, 1), (BW, 0, 1)],
        [(F, 1, 1), (F, 1, 0), (BW, 1, 0), (BW, 1, 1)],
        m=2,
    )
    with pytest.raises(ScheduleError) as e:
        validate(s)
    msg = str(e.value)
    assert msg.startswith("deadlock (cross-rank dependency cycle)")
    assert "rank 0 waits at BW(stage=0, mb=0, rank=0) for B/BW(stage=1, mb=0) on rank 1" in msg
    assert "rank 1 waits at F(stage=1, mb=1, rank=1) for F(stage=0, mb=1) on rank 0" in msg


def test_deadlock_never_hangs_in_simulate():
    s = _two_rank([(BW, 0, 0), (F, 0, 0)], [(F, 1, 0), (BW, 1, 0)])
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(s)


# --- generators' parameter errors -------------------------------------------------------
@pytest.mark.parametrize(
    "name, kw, msg",
    [
        ("1f1b", dict(p=4, m=0), r"^m: must be an integer >= 1"),
        ("1f1b", dict(p=0, m=4), r"^p: must be an integer >= 1"),
        ("1f1b", dict(p=4, m=4, v=2), r"^v: schedule 1f1b needs v in \{1\}"),
        ("interleaved-1f1b", dict(p=4, m=3), r"^m: schedule interleaved-1f1b needs m >= 4"),
        ("interleaved-1f1b", dict(p=4, m=4, v=0), r"^v: must be an integer >= 1"),
        ("group-interleaved", dict(p=8, m=8, g=3), r"^g: .*4..8 for p=8; got 3"),
        ("group-interleaved", dict(p=8, m=8, g=9), r"^g: .*got 9"),
        ("gpipe", dict(p=4, m=4, g=2), r"^g: schedule gpipe has no group size; `g` applies to group-interleaved"),
        ("zb-auto", dict(p=4, m=4, mem_limit=0.5), r"^mem_limit: .*in the units of `memory`"),
        ("nope", dict(p=4, m=4), r"^schedule: unknown schedule 'nope'; valid: gpipe, 1f1b"),
        ("zb-v", dict(p=4, m=8, costs={"f": 1}), r"^costs: must be a pipeoffload.costs.Costs \(or None for the "
                                                 r"defaults\), got dict"),
        ("zb-auto", dict(p=4, m=8, memory=2.0), r"^memory: must be a pipeoffload.costs.MemoryDeltas"),
    ],
)
def test_parameter_errors(name, kw, msg):
    """Library errors name the library's parameters, never a command-line flag."""
    with pytest.raises(ParameterError, match=msg):
        generate(name, **kw)


@pytest.mark.parametrize("name", ["zb-v", "zb-auto", "v-half", "1f1b"])
def test_costs_and_memory_none_are_the_defaults(name):
    """An explicit None is what leaving the argument out is (zb-v crashed on costs=None)."""
    assert generate(name, p=4, m=8, costs=None, memory=None).ranks == generate(name, p=4, m=8).ranks


def test_parameter_error_renders_with_other_names():
    """A front end renames the parameter and the parameters the message names in backquotes."""
    with pytest.raises(ParameterError) as e:
        generate("gpipe", p=4, m=4, g=2)
    assert e.value.param == "g"
    assert e.value.message == "schedule gpipe has no group size; `g` applies to group-interleaved"
    assert e.value.render({"g": "-g"}) == "-g: schedule gpipe has no group size; -g applies to group-interleaved"
    assert e.value.render({}) == str(e.value)
    again = pickle.loads(pickle.dumps(e.value))
    assert (type(again), again.param, again.message, str(again)) == (ParameterError, "g", e.value.message, str(e.value))


def test_costs_and_memory_parsing():
    c = parse_costs("F=2,b=3,W=1.5,comm=0.25")
    assert (c.F, c.B, c.W, c.comm) == (2, 3, 1.5, 0.25)
    with pytest.raises(ParameterError, match="^costs: unknown key 'X'"):
        parse_costs("X=1")
    with pytest.raises(ParameterError, match="^costs: F must be a positive"):
        parse_costs("F=-1")
    with pytest.raises(ParameterError, match="^costs: comm must be"):
        parse_costs("comm=-1")
    with pytest.raises(ParameterError, match="^rank_costs: gives 1 ranks. costs"):
        Costs(rank_costs=((1, 1, 1),)).check_fits(Placement.loop(2))
    with pytest.raises(ParameterError, match="^group_costs: B must be a positive"):
        Costs(group_costs=((1, 0, 1),))
    assert parse_memory("F=10,B=-4").W == -6
    with pytest.raises(ParameterError, match="^memory: F \\+ B \\+ W must be 0"):
        parse_memory("F=1,B=0,W=0")


# --- closed forms -------------------------------------------------------------------------
GRID = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p, 4 * p, 4 * p + 1)]


@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("comm", [0.0, 0.3])
def test_1f1b_closed_form(p, m, comm):
    c = Costs(F=1.0, B=1.5, W=0.75, comm=comm)
    tl = simulate(generate("1f1b", p=p, m=m), c)
    per_mb = c.F + c.B + c.W
    no_comm = m * per_mb + (p - 1) * per_mb  # bubble time (p−1)(F+B+W)
    if comm == 0:
        assert tl.makespan == pytest.approx(no_comm)
    else:  # microbatch 0's round trip crosses 2(p−1) links; steady state may add more
        assert tl.makespan >= no_comm + 2 * (p - 1) * comm - 1e-9
    assert tl.peak_memory() == [min(p - i, m) for i in range(p)]


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_interleaved_closed_form(p, v, k):
    m = k * p
    tl = simulate(generate("interleaved-1f1b", p=p, m=m, v=v))
    assert tl.bubble_rate == pytest.approx((p - 1) / (v * m + p - 1))
    chunk_peak = max(tl.peak_memory()) * v
    assert chunk_peak == pytest.approx(min((v + 1) * p - 1, v * m) if k > 1 else v * m - (0 if p > 1 else 0))


def _interleaved_any_m_is_deadlock_free(ps):
    for p in ps:
        for v in range(1, 5):
            for m in range(p, 5 * p + 2):
                sched = generate("interleaved-1f1b", p=p, m=m, v=v)  # validates (incl. deadlock)
                if p <= 8 and v <= 2:
                    assert simulate(sched).bubble_rate == pytest.approx((p - 1) / (v * m + p - 1))


def test_interleaved_any_m_is_deadlock_free():
    """Every m in [p, 5p + 1] and v in 1..4, for p up to 9; the whole p range 1..12 runs
    under -m bench (the cost grows as p^3: p = 10..12 were two thirds of it)."""
    _interleaved_any_m_is_deadlock_free(range(1, 10))


@pytest.mark.bench
def test_interleaved_any_m_is_deadlock_free_every_p_to_12():
    _interleaved_any_m_is_deadlock_free(range(1, 13))


@pytest.mark.parametrize("p", [2, 4])
def test_interleaved_comm_latency_adds_to_makespan(p):
    base = simulate(generate("interleaved-1f1b", p=p, m=2 * p, v=2)).makespan
    slow = simulate(generate("interleaved-1f1b", p=p, m=2 * p, v=2), Costs(comm=0.5)).makespan
    assert slow > base


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_group_interleaved_peak_law(p, v):
    for g in range((p + 1) // 2, p + 1):
        tl = simulate(generate("group-interleaved", p=p, m=4 * p, v=v, g=g))
        assert max(tl.peak_memory()) * v == pytest.approx(g * v + p - g), (p, v, g)


@pytest.mark.parametrize("v,g,bubble", [(2, 8, 0.068), (2, 4, 0.086), (4, 8, 0.035), (4, 4, 0.063)])
def test_group_interleaved_reference_rows(v, g, bubble):
    tl = simulate(generate("group-interleaved", p=8, m=32, v=v, g=g))
    assert tl.bubble_rate <= bubble + 0.002
    assert tl.bubble_rate == pytest.approx(bubble, abs=0.002)


def test_gpipe_peak_is_m():
    tl = simulate(generate("gpipe", p=4, m=6))
    assert tl.peak_memory() == [6, 6, 6, 6]


def test_per_rank_costs_change_timing():
    uniform = simulate(generate("1f1b", p=4, m=8))
    heavy_last = Costs(rank_costs=((1, 1, 1), (1, 1, 1), (1, 1, 1), (2, 2, 2)))
    tl = simulate(generate("1f1b", p=4, m=8), heavy_last)
    assert tl.busy() == [24, 24, 24, 48]
    assert tl.makespan > uniform.makespan


def test_memory_in_bytes():
    mem = MemoryDeltas(F=201216, B=-127488, W=-73728)
    tl = simulate(generate("1f1b", p=4, m=8), memory=mem)
    assert tl.peak_memory()[0] == 4 * 201216


# --- properties -----------------------------------------------------------------------------
CLASSIC = ["gpipe", "1f1b", "interleaved-1f1b", "group-interleaved"]


@st.composite
def classic_params(draw):
    name = draw(st.sampled_from(CLASSIC))
    p = draw(st.integers(1, 10))
    m = draw(st.integers(p, 4 * p + 3))
    kw: dict = {}
    if name in ("interleaved-1f1b", "group-interleaved", "gpipe"):
        kw["v"] = draw(st.integers(1, 4))
    if name == "group-interleaved":
        kw["g"] = draw(st.integers((p + 1) // 2, p))
    costs = Costs(
        F=draw(st.floats(0.1, 3)), B=draw(st.floats(0.1, 3)), W=draw(st.floats(0.1, 3)), comm=draw(st.floats(0, 1))
    )
    return name, p, m, kw, costs


@settings(deadline=None)
@given(classic_params())
def test_classic_properties(params):
    name, p, m, kw, costs = params
    sched = generate(name, p=p, m=m, **kw)  # validates
    tl = simulate(sched, costs)
    keys = [e.op.key for e in tl.events]
    assert len(keys) == len(set(keys)) == sum(len(r) for r in sched.ranks)
    assert tl.makespan >= max(costs.rank_compute(sched.placement, m)) - 1e-9
    # Each rank's ops never overlap and keep the schedule's order.
    for r in range(p):
        evs = [e for e in tl.events if e.rank == r]
        assert [e.op for e in evs] == sched.ranks[r]
        assert all(a.end <= b.start + 1e-9 for a, b in zip(evs, evs[1:]))
    assert 0 <= tl.bubble_rate < 1


def test_bubble_metrics_span_vs_makespan():
    from pipeoffload.timeline import TimedOp, Timeline

    def ev(kind, stage, rank, s, e):
        return TimedOp(Op(kind, stage, 0, rank, 0), s, e)

    # Rank 0 works [0, 4); rank 1 starts late and works [2, 6): each is busy 4.
    tl = Timeline(2, [ev(F, 0, 0, 0, 2), ev(BW, 0, 0, 2, 4), ev(F, 1, 1, 2, 4), ev(BW, 1, 1, 4, 6)])
    assert tl.spans() == [4, 4] and tl.iteration_time == 4 and tl.makespan == 6
    assert tl.bubble_rate == 0.0  # ZB paper metric: largest per-rank span
    assert tl.bubble_rate_makespan == pytest.approx(1 / 3)
