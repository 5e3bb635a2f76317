"""The resumable loops in C (``pipeoffload._engine.refill_run`` and ``steady_run``) against their
Python twins (``w_refill._Refill._run_py``, ``steady_timing._Engine._run_py``): the same orders,
end tables, clocks, levels, peaks, idle times, positions, limits and waits, float for float, on the
V lowerings and ZB orders with random costs and caps (binary fractions, where the steady state is
shifted, and not), orders that deadlock, caps no order keeps, and inputs the C loops decline."""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from typing import Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeoffload import native
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes import steady_timing, timing
from pipeoffload.schedules import generate, w_refill
from pipeoffload.schedules.zb_auto import Infeasible


def _engine_module():
    try:
        from pipeoffload import _engine
    except ImportError:  # fail, not skip: CI must run the C loops it ships
        pytest.fail("pipeoffload._engine is not built: `make install` (pip install -e .) builds it with the C compiler")
    return _engine


@contextmanager
def _loops(python: bool) -> Iterator[None]:
    """The engine's loops in Python (``python``) or in C while inside."""
    saved = native._engine
    native._engine = None if python else _engine_module()
    try:
        yield
    finally:
        native._engine = saved


def _twice(make):
    """``make()`` with the loops in Python, then in C."""
    out = []
    for python in (True, False):
        with _loops(python):
            out.append(make())
    return out


def _triples(sched) -> list[list[tuple]]:
    return [[(o.kind, o.stage, o.microbatch) for o in r] for r in sched.ranks]


def _shuffle(orders: list[list[tuple]], rng: random.Random, swaps: int) -> list[list[tuple]]:
    """A few swaps of neighbouring ops: some orders then deadlock."""
    out = [list(r) for r in orders]
    for _ in range(swaps):
        r = rng.randrange(len(out))
        if len(out[r]) > 1:
            i = rng.randrange(len(out[r]) - 1)
            out[r][i], out[r][i + 1] = out[r][i + 1], out[r][i]
    return out


def _costs(rng: random.Random, binary: bool) -> Costs:
    if binary:  # exact binary fractions: the refill and the steady timing shift periods
        pick = lambda: rng.choice((0.5, 1.0, 1.25, 1.5, 2.0, 0.75))  # noqa: E731
        return Costs(F=pick(), B=pick(), W=pick(), comm=rng.choice((0.0, 0.25, 0.5)))
    return Costs(F=rng.uniform(0.3, 2.0), B=rng.uniform(0.3, 3.0), W=rng.uniform(0.1, 1.5),
                 comm=rng.choice((0.0, rng.uniform(0.0, 0.4))))


def _refill_state(run) -> tuple:
    tr = run.tr
    return (tr.order, tr.end, tr.clock, tr.level, tr.peak, tr.idle, tr.first, tr.started, run.done, run.lim,
            run.pending, run.blocked, run.waiting, run.skipped, run.searched, run.steady)


def _refill(python: bool, *args) -> tuple:
    """``w_refill._refill(*args)``'s run state (or the Infeasible message) and its ``consulted``,
    on the Python loop or the C loop."""
    consulted = [False]
    with _loops(python):
        try:
            run = w_refill._refill(*args[:7], consulted)
        except Infeasible as err:
            return ("infeasible", str(err)), consulted
    return _refill_state(run), consulted


FAMILIES = [("v-half", 2), ("v-min", 2), ("v-zb", 2), ("zb-v", 2), ("zb-h1", 1), ("zb-h2", 1)]


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), p=st.integers(2, 7), mult=st.integers(1, 4), seed=st.integers(0, 10**6),
       binary=st.booleans(), partial=st.booleans(), swaps=st.sampled_from((0, 0, 0, 2)),
       cap_scale=st.sampled_from((None, 1.0, 0.6, 0.3)))
def test_refill_c_loop_equals_python(family, p, mult, seed, binary, partial, swaps, cap_scale) -> None:
    name, _ = family
    rng = random.Random(seed)
    m = p * mult if name not in ("zb-h1", "zb-h2") else max(p, p * mult - 1)
    costs = _costs(rng, binary)
    sched = generate(name, p=p, m=m, costs=costs)
    orders = _shuffle(_triples(sched), rng, swaps)
    memory = MemoryDeltas() if rng.random() < 0.5 else MemoryDeltas(F=1.0, B=-0.25, W=-0.75)
    peak_units = max(1.0, float(p))
    # caps: none binding, some binding, some too tight to keep (Infeasible); ints as well as floats
    caps = [math.inf] * p if cap_scale is None else \
        [rng.choice((int, float))(max(1, round(peak_units * cap_scale))) for _ in range(p)]
    args = (sched.placement, m, orders, costs, memory, caps, partial)
    got_py = _refill(True, *args)
    got_c = _refill(False, *args)
    assert got_c == got_py


def test_refill_c_loop_shifts_and_refuses_like_python() -> None:
    """The paths the random cases may miss: a shifted steady state (V-Half at p = 8, m = 64, unit
    costs, limited runs with ``pos``) and a rank that cannot keep its cap."""
    sched = generate("v-half", p=8, m=64)
    args = (sched.placement, 64, _triples(sched), Costs(), MemoryDeltas(), [5] * 8, True)
    state_py, c_py = _refill(True, *args)
    state_c, c_c = _refill(False, *args)
    assert state_c == state_py and c_c == c_py
    assert state_c[13] > 0  # periods were shifted (skipped)
    tight = args[:5] + ([1] * 8, True)
    assert _refill(False, *tight) == _refill(True, *tight)
    assert _refill(False, *tight)[0][0] == "infeasible"


def test_refill_inputs_the_c_loop_does_not_take_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input outside what the C loop handles (an int origin) makes it answer None without
    changing anything; ``run`` then runs the Python loop, with the same result."""
    engine = _engine_module()
    sched = generate("v-min", p=4, m=8)
    orders = _triples(sched)
    run = w_refill._Refill(sched.placement, 8, orders, Costs(), MemoryDeltas(), [math.inf] * 4, True, [False])
    run.tr.origin = 0
    before = [list(x) if isinstance(x, list) else x for x in _refill_state(run)]
    assert engine.refill_run(run, run.tr, timing.CODE_KIND) is None
    assert [list(x) if isinstance(x, list) else x for x in _refill_state(run)] == before
    monkeypatch.setattr(native, "_engine", engine)
    assert run.run() is True
    ref = w_refill._Refill(sched.placement, 8, orders, Costs(), MemoryDeltas(), [math.inf] * 4, True, [False])
    ref.tr.origin = 0
    assert ref._run_py() is True
    assert run.tr.order == ref.tr.order and run.tr.end == ref.tr.end


def test_refill_c_loop_raises_what_pos_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error inside a callback is raised, not swallowed, with the state written back."""
    engine = _engine_module()
    sched = generate("v-half", p=4, m=8)
    run = w_refill._Refill(sched.placement, 8, _triples(sched), Costs(), MemoryDeltas(), [math.inf] * 4, True,
                           [False])

    def pos(slot: int) -> int:
        raise LookupError(f"no position for {slot}")

    run.pos = pos
    run.lim = [len(s) for s in run.skeleton]
    with pytest.raises(LookupError, match="no position"):
        engine.refill_run(run, run.tr, timing.CODE_KIND)
    assert sum(run.done) > 0 and any(run.blocked)


def _steady_state(eng) -> tuple:
    return (eng.end, eng.clock, eng.first, eng.done, eng.lim, eng.waiting, eng.blocked, eng.skipped, eng.cut)


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), p=st.integers(2, 7),
       mult=st.integers(1, 4), seed=st.integers(0, 10**6), swaps=st.sampled_from((0, 0, 1, 3)))
def test_steady_c_loop_equals_python(family, p, mult, seed, swaps) -> None:
    name, v = family
    rng = random.Random(seed)
    m = p * mult
    costs = _costs(rng, True)  # the steady timing runs only on binary fractions
    sched = generate(name, p=p, m=m, costs=costs)
    orders = _shuffle(_triples(sched), rng, swaps)
    pl = sched.placement
    out = []
    for python in (True, False):
        with _loops(python):
            figures, eng = steady_timing._steady_run(pl, m, orders, costs, MemoryDeltas(), sum(map(len, orders)))
        out.append((figures, None if eng is None else _steady_state(eng)))
    assert out[1] == out[0]


def test_steady_c_loop_is_used_and_shifts(monkeypatch: pytest.MonkeyPatch) -> None:
    """V-Half at p = 8, m = 64, unit costs: the C loop runs (the Python twin is never called),
    stops at the limits, shifts periods and gives the figures of the Python loop."""
    sched = generate("v-half", p=8, m=64)
    orders = _triples(sched)
    monkeypatch.setattr(native, "_engine", _engine_module())
    calls = []
    monkeypatch.setattr(steady_timing._Engine, "_run_py", lambda self: calls.append(1))
    got, eng = steady_timing._steady_run(sched.placement, 64, orders, Costs(), MemoryDeltas(), 10**6)
    assert not calls and eng.skipped > 0
    monkeypatch.undo()
    monkeypatch.setattr(native, "_engine", None)
    want, ref = steady_timing._steady_run(sched.placement, 64, orders, Costs(), MemoryDeltas(), 10**6)
    assert got == want and _steady_state(eng) == _steady_state(ref)


def test_steady_inputs_the_c_loop_does_not_take_fall_back() -> None:
    engine = _engine_module()
    sched = generate("zb-h1", p=3, m=6)
    pl = sched.placement
    codes = [steady_timing.op_slots(r, pl.num_stages, 6, steady_timing._CODE) for r in _triples(sched)]
    durc = [1.0] * (3 * pl.num_stages)
    eng = steady_timing._Engine(pl, 6, 0.0, codes, durc)
    eng.lim = [len(c) for c in codes]
    eng.durc = [1] * len(durc)  # ints: declined
    assert engine.steady_run(eng) is None
    assert eng.done == [0, 0, 0] and all(e == -math.inf for e in eng.end)
    eng.durc = durc
    assert engine.steady_run(eng) is True and eng.done == eng.lim


# ---------------------------------------------------------------- the slot reorder's loops

from pipeoffload.schedules import v_reorder  # noqa: E402
from pipeoffload.schedules.v_auto import _family, _family_block  # noqa: E402
from pipeoffload.schedules.vshape import v_half_block, v_min_block, v_zb_block  # noqa: E402


def _some_block(p: int, pick: int):
    """A V block: V-Min's, V-Half's, V-ZB's or a member of V-auto's family."""
    fixed = (v_min_block, v_half_block, v_zb_block)
    if pick < 3:
        return fixed[pick](p)
    fam = _family(p)
    return _family_block(p, fam[pick % len(fam)][1])


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 9), m=st.integers(1, 30), pick=st.integers(0, 40), split=st.booleans(),
       seed=st.integers(0, 10**6))
def test_with_weights_c_equals_python(p, m, pick, split, seed) -> None:
    """Every rank's W placement (and the states at random probes) of a repeated block and of
    its reordered grid, with and without the chunk split."""
    engine = _engine_module()
    rng = random.Random(seed)
    grid = v_reorder._repeated(_some_block(p, pick), m)
    for rows in grid:
        hi = max(max(ts) for ts in rows) + 3
        probes = sorted(rng.sample(range(-1, hi), min(hi + 1, rng.randrange(0, 6))))
        s_c: list = []
        s_py: list = []
        got = engine.with_weights([list(r) for r in rows], split, list(probes), s_c)
        want = v_reorder._with_weights_py([list(r) for r in rows], split, list(probes), s_py)
        assert got == want and s_c == s_py
        assert engine.with_weights([list(r) for r in rows], split, None, None) == \
            v_reorder._with_weights_py(rows, split)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 9), mult=st.integers(1, 6), pick=st.integers(0, 40), periodic=st.booleans())
def test_squeeze_c_equals_python(p, mult, pick, periodic) -> None:
    """The squeeze of the first reorder pass, plain and with the period skip (which the C loop
    calls back into), on blocks of every kind."""
    block = _some_block(p, pick)
    m = p * mult
    grid = v_reorder._reorder([v_reorder._with_weights_py(r) for r in v_reorder._repeated(block, m)], m,
                              with_w=True, period=block.period)
    period = block.period if periodic else 0
    out, asked = [], []
    real = v_reorder._SqueezeSkip.skip
    for python in (True, False):
        calls: list = []

        def skip(self, c, streak, calls=calls):  # the same proofs asked at the same cuts
            got = real(self, c, streak)
            calls.append((c, streak, got))
            return got

        v_reorder._SqueezeSkip.skip = skip
        try:
            with _loops(python):
                out.append(v_reorder._squeeze([[list(ts) for ts in rows] for rows in grid], period))
        finally:
            v_reorder._SqueezeSkip.skip = real
        asked.append(calls)
    assert out[1] == out[0]
    assert asked[1] == asked[0]


def test_the_reorder_runs_the_c_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the engine built, the slot reorder's W placement and squeeze never run in Python,
    and the orders are the Python loops' (V-Half at p = 8, m = 64: the squeeze skips periods)."""
    monkeypatch.setattr(native, "_engine", None)
    want = v_reorder.full_orders(v_half_block(8), 64)
    calls = []
    monkeypatch.setattr(native, "_engine", _engine_module())
    monkeypatch.setattr(v_reorder, "_with_weights_py", lambda *a: calls.append(a))
    monkeypatch.setattr(v_reorder, "_squeeze_run", lambda *a: calls.append(a))
    assert v_reorder.full_orders(v_half_block(8), 64) == want and not calls
    cuts = []
    real = v_reorder._SqueezeSkip.skip

    def skip(self, c, streak):
        got = real(self, c, streak)
        cuts.append((c, got[0]))
        return got

    monkeypatch.setattr(v_reorder._SqueezeSkip, "skip", skip)
    v_reorder.full_orders(v_half_block(8), 64)
    assert any(to > c for c, to in cuts)  # the C loop asked, and periods were proved and written


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 9), mult=st.integers(1, 6), pick=st.integers(0, 40), with_w=st.booleans(),
       listed=st.booleans(), own_levels=st.booleans(), read=st.booleans())
def test_reorder_c_equals_python(p, mult, pick, with_w, listed, own_levels, read) -> None:
    """The reorder's visits — W's listed (the first pass) or counted through each rank's levels
    (the second), the levels made by the caller or by the reorder, with and without the reads
    the periodic lowering records — move the same ops to the same slots, leave the same levels
    and record the same reads."""
    block = _some_block(p, pick)
    m = p * mult
    base = v_reorder._repeated(block, m)
    out = []
    for python in (True, False):
        with _loops(True):  # the inputs made the same way for both
            grid = [v_reorder._with_weights_py(r) for r in base] if listed else [[list(ts) for ts in r] for r in base]
            levels = [v_reorder._RankLevels(rows, block.period) for rows in grid] if own_levels and not listed else None
        reads = {} if read else None
        with _loops(python):
            got = v_reorder._reorder(grid, m, with_w, block.period, reads, levels)
        state = None if levels is None else [(lv.events, lv.level, lv.pending, lv.low) for lv in levels]
        out.append((got, reads, state))
    assert out[1] == out[0]


# ---------------------------------------------------------------- small scans

from pipeoffload.ir import OpKind  # noqa: E402
from pipeoffload.schedules import v_reorder_periods  # noqa: E402


def _both(fn, *args):
    """``fn(*args)`` on the Python path and on the C path."""
    out = []
    for python in (True, False):
        with _loops(python):
            try:
                out.append(("ok", fn(*args)))
            except KeyError as err:
                out.append(("KeyError", str(err)))
    return out


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from([OpKind.F, OpKind.B, OpKind.W, OpKind.BW]), st.integers(0, 9),
                              st.integers(0, 30)), max_size=40),
       S=st.integers(1, 10), m=st.integers(1, 31), tuple_input=st.booleans())
def test_op_slots_c_equals_python(ops, S, m, tuple_input) -> None:
    py, c = _both(steady_timing.op_slots, tuple(ops) if tuple_input else ops, S, m, steady_timing._CODE)
    assert c == py


def _periodicish(draw_ints: list[int], period: int) -> list[int]:
    """Codes with long periodic stretches (each a copy of the one ``period`` back plus one)
    broken where the draws say."""
    out: list[int] = []
    for i, d in enumerate(draw_ints):
        out.append(out[i - period] + 1 if i >= period and d % 5 else d)
    return out


@settings(max_examples=150, deadline=None)
@given(draws=st.lists(st.integers(0, 50), max_size=60), period=st.integers(1, 8))
def test_period_range_c_equals_python(draws, period) -> None:
    codes = _periodicish(draws, period)
    py, c = _both(steady_timing._period_range, codes, period)
    assert c == py


@settings(max_examples=150, deadline=None)
@given(draws=st.lists(st.integers(0, 50), min_size=1, max_size=60), c=st.integers(0, 8), T=st.integers(1, 3),
       at=st.integers(0, 60))
def test_stretch_c_equals_python(draws, c, T, at) -> None:
    ts: list[int] = []
    for i, d in enumerate(draws):  # increasing, periodic (T later every c) where the draws say
        ts.append(ts[i - c] + T if c and i >= c and d % 4 else (ts[-1] if ts else 0) + 1 + d % 3)
    a = min(at, len(ts))
    py, cc = _both(v_reorder_periods._stretch, ts, a, c, T)
    assert cc == py


def test_family_peaks_c_equal_python() -> None:
    """Every member of V-auto's family for p = 1..40, 47, 64, 72: the closed-form peak in C is the
    Python one (and so, by tests/test_v_auto_family.py, the built block's)."""
    from pipeoffload.schedules import v_auto

    engine = _engine_module()
    for p in list(range(1, 41)) + [47, 64, 72]:
        with _loops(True):
            v_auto._family.cache_clear()
            want = v_auto._family(p)
        v_auto._family.cache_clear()
        assert [(engine.family_peak(p, params, v_auto.PERIOD), params) for _, params in want] == list(want)
    v_auto._family.cache_clear()


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 9), mult=st.integers(1, 6), pick=st.integers(0, 40), listed=st.booleans())
def test_slot_order_c_equals_python(p, mult, pick, listed) -> None:
    block = _some_block(p, pick)
    grid = v_reorder._repeated(block, p * mult)
    if listed:
        grid = [v_reorder._with_weights_py(r) for r in grid]
    n = 1 + max(len(x) for rows in grid for x in rows)
    want = sorted([((t * p + r) * 8 + k) * n + j for r in range(p) for k in range(len(grid[0]))
                   for j, t in enumerate(grid[r][k])])
    assert _engine_module().slot_order(grid, n) == want


# ---------------------------------------------------------------- the grid lowering's sweeps

from pipeoffload.schedules import v_grid_lowering  # noqa: E402


@settings(max_examples=100, deadline=None)
@given(p=st.integers(2, 9), m=st.integers(1, 40), pick=st.integers(3, 200), release=st.booleans())
def test_grid_lowering_c_equals_python(p, m, pick, release) -> None:
    """The grid rules (their squeeze and hole filling sweeps in C or in Python) lower every kind
    of family block to the same grid, or refuse it alike."""
    block = _some_block(p, pick)
    py, c = _twice(lambda: v_grid_lowering.lower_grid(block, m, release))
    assert c == py


def test_grid_lowering_runs_the_c_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the engine built, neither sweep runs in Python."""
    monkeypatch.setattr(native, "_engine", _engine_module())
    calls = []
    monkeypatch.setattr(v_grid_lowering._Squeezer, "_column_py", lambda self, t: calls.append(t))
    monkeypatch.setattr(v_grid_lowering._HoleFiller, "_column_py", lambda self, t: calls.append(t))
    grid = v_grid_lowering.lower_grid(v_half_block(8), 32, True)
    assert grid is not None and not calls


# ---------------------------------------------------------------- the building-block reorder

from pipeoffload.schedules import building_block  # noqa: E402


def _grid_state(grid) -> tuple:
    skip = grid.skip
    return (grid.cells, grid.pos, grid.skipped,
            None if skip is None else (skip.at, skip.after_lb, skip.min_lb, skip.skipped))


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 9), mult=st.integers(1, 8), pick=st.integers(0, 200), steady=st.booleans(),
       peaks=st.sampled_from((None, "tight")))
def test_building_block_reorder_c_equals_python(p, mult, pick, steady, peaks) -> None:
    """The building-block reorder's scan (with the period skip calling back, and without; the
    grid's own peaks or lower ones) moves the same ops, proves the same periods and leaves the
    same positions."""
    block = _some_block(p, pick)
    m = p * mult

    def reordered():
        grid = building_block.repeat(block, m)
        cap = None if peaks is None else [max(0, x - 1) for x in grid.peaks()]
        building_block.reorder(grid, cap, building_block.steady_range(block, m) if steady else None)
        return _grid_state(grid)

    py, c = _twice(reordered)
    assert c == py


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 9), mult=st.integers(1, 8), pick=st.integers(0, 200))
def test_building_block_pipeline_c_equals_python(p, mult, pick) -> None:
    """The whole pipeline on fewer microbatches (reorder with its skip, compress, the periods
    put back) gives the same periodic orders."""
    block = _some_block(p, pick)

    def lowered():
        got = building_block.periodic_from_block(block, p * mult)
        return got.orders, got.at, got.per, got.extra

    py, c = _twice(lowered)
    assert c == py


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 9), m=st.integers(1, 30), pick=st.integers(3, 200), seed=st.integers(0, 10**6),
       repeated=st.booleans())
def test_time_grid_c_equals_python(p, m, pick, seed, repeated) -> None:
    """A lowered grid or a repeated block, timed with random costs and deltas: the same floats."""
    from pipeoffload.ir import Placement

    block = _some_block(p, pick)
    grid = v_grid_lowering.repeated_grid(block, m) if repeated else v_grid_lowering.lower_grid(block, m, True)
    if grid is None:
        grid = v_grid_lowering.repeated_grid(block, m)
    rows = ["".join(r) for r in grid]
    rng = random.Random(seed)
    pl = Placement.vshape(p)
    costs = _costs(rng, rng.random() < 0.5)
    memory = MemoryDeltas() if rng.random() < 0.5 else MemoryDeltas(F=1.0, B=-0.25, W=-0.75)
    dur, delta = costs.duration_table(pl), memory.delta_table(pl)
    py, c = _both(v_grid_lowering.time_grid, rows, dur, costs.comm, delta)
    assert c == py
    assert py[0] == "ok"


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 9), m=st.integers(1, 30), pick=st.integers(3, 200), as_str=st.booleans())
def test_grid_peaks_c_equal_python(p, m, pick, as_str) -> None:
    block = _some_block(p, pick)
    grid = v_grid_lowering.repeated_grid(block, m)
    grid = ["".join(r) for r in grid] if as_str else [list(r) for r in grid]
    py, c = _both(v_grid_lowering._peaks, grid)
    assert c == py


_ITEM = st.one_of(
    st.tuples(st.sampled_from([OpKind.F, OpKind.B, OpKind.W, OpKind.BW]), st.integers(-1, 6), st.integers(-3, 40)),
    st.tuples(st.sampled_from([OpKind.F, "F", 0]), st.sampled_from([0, 1, 2.0, True]), st.sampled_from([0, 1, "1"])),
    st.tuples(st.sampled_from([OpKind.F, OpKind.W]), st.integers(0, 5)),
    st.lists(st.integers(0, 3), min_size=3, max_size=3),
    st.tuples(st.just(OpKind.B), st.integers(0, 5), st.just(2**70)),
)


_EDGES = [[(OpKind.F, 6, 0)], [(OpKind.F, -1, 0)], [(OpKind.F, 5, -4)], [(OpKind.F, 0)], [(OpKind.F, 0, 0, 0)],
          [[OpKind.F, 0, 0]], [(OpKind.F, True, 0)], [(OpKind.F, 0, 2**70)], [("F", 0, 0)], [(OpKind.W, 5, 9)], []]


@settings(max_examples=300, deadline=None)
@given(per_rank=st.lists(st.lists(_ITEM, max_size=8), min_size=1, max_size=4), clean=st.booleans())
@example(per_rank=[[(OpKind.B, 2, 3)], *_EDGES[:1]], clean=False)
@example(per_rank=[_EDGES[1]], clean=False)
@example(per_rank=[_EDGES[2], _EDGES[9]], clean=False)
@example(per_rank=[_EDGES[3]], clean=False)
@example(per_rank=[_EDGES[4]], clean=False)
@example(per_rank=[_EDGES[5], _EDGES[10]], clean=False)
@example(per_rank=[_EDGES[6]], clean=False)
@example(per_rank=[_EDGES[7]], clean=False)
@example(per_rank=[_EDGES[8]], clean=False)
def test_compact_triples_c_equals_python(per_rank, clean) -> None:
    """CompactOrders.from_triples in C and in Python: the same arrays, or None alike, on good
    triples, bad kinds and types, layer groups out of range, short items, lists and huge ints."""
    from pipeoffload.ir import CompactOrders, Placement

    pl = Placement.vshape(3)  # 6 layer groups
    if clean:
        per_rank = [[x for x in r if isinstance(x, tuple) and len(x) == 3 and isinstance(x[0], OpKind)
                     and type(x[1]) is int and 0 <= x[1] < 6 and type(x[2]) is int and abs(x[2]) < 100]
                    for r in per_rank]
    out = []
    for python in (True, False):
        with _loops(python):
            try:
                got = CompactOrders.from_triples(pl, [list(r) for r in per_rank])
                out.append(None if got is None else (got.kinds, got.stages, got.mbs))
            except OverflowError:
                out.append("overflow")
    assert out[1] == out[0]


@settings(max_examples=80, deadline=None)
@given(p=st.integers(2, 9), mult=st.integers(1, 6), pick=st.integers(0, 200), table=st.booleans(),
       tau=st.integers(0, 200), T=st.integers(1, 12))
def test_slot_order_lowerings_c_equal_python(p, mult, pick, table, tau, T) -> None:
    """A rank's ops in slot order (with the op table's tuples or made), and the short run's
    order with the indices around a cut."""
    from pipeoffload.ir import Placement
    from pipeoffload.schedules.building_block import op_table

    block = _some_block(p, pick)
    m = p * mult
    pl = Placement.vshape(p)
    ops = op_table(pl, m + 1) if table else None
    grid = [v_reorder._with_weights_py(r[:4], split=True) for r in v_reorder._repeated(block, m)]
    for i, rows in enumerate(grid):
        assert _both(v_reorder._lower, pl, i, rows, ops)[1] == _both(v_reorder._lower, pl, i, rows, ops)[0]
        py, c = _both(v_reorder_periods._lower_short, pl, i, rows, tau, T, ops)
        assert c == py


def test_op_table_rows_c_equal_python() -> None:
    from pipeoffload.ir import Placement
    from pipeoffload.schedules.building_block import _TABLES, op_table

    pl = Placement.vshape(5)
    out = []
    for python in (True, False):
        with _loops(python):
            _TABLES.clear()
            table = op_table(pl, 300)  # (microbatches past the small ints)
            out.append(dict(table))
    _TABLES.clear()
    assert out[1] == out[0] and len(out[0]) == 30 and out[0][OpKind.W, 4][299] == (OpKind.W, 4, 299)


def test_inputs_from_c_equals_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic timings' and refills' input check (V-Half and V-Min lowered on fewer microbatches): on
    the arguments the lowerings pass, and with every rank's bound moved (so that some inputs
    fall before it), the C loop answers as the Python one."""
    from pipeoffload.schedules import vshape

    seen: list[tuple] = []
    real = steady_timing.inputs_from

    def spy(*args):
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(w_refill, "inputs_from", spy)
    monkeypatch.setattr(steady_timing, "inputs_from", spy)  # (the periodic timing's own calls)
    for name in ("v-half", "v-min"):
        vshape._lowered.cache_clear()
        vshape._BASES.clear()
        generate(name, p=8, m=320, costs=Costs(F=1.0, B=1.5, W=0.5, comm=0.125))
    vshape._lowered.cache_clear()
    assert seen
    for whole in (True, False):  # every rank's chains whole (set lookups), or none (index lookups)
        if not whole:
            monkeypatch.setattr(steady_timing, "_chains_whole", lambda *a: False)
        verdicts = set()
        for args in seen:
            lows = [[max(0, x + shift) for x in args[4]] for shift in (0, 1, 3, -2, 40, 10**6)]
            deps, rank_of, codes, reading, low, ranges, refs, periods, m = args
            found = {(rank_of[(base + x % m) // m % (len(deps) // 3)], base + x % m)
                     for ops in reading for x in ops for base, _ in deps[x // m]}
            for q, y in sorted(found)[::7]:  # a bound at an input's own index, and one past it
                k = steady_timing._index(y, codes[q], ranges[q], refs[q], m, periods[q])
                if k is not None:
                    lows += [low[:q] + [b] + low[q + 1:] for b in (k, k + 1)]
            for moved_low in lows:
                py, c = _both(real, *args[:4], moved_low, *args[5:])
                assert c == py
                verdicts.add(py[1])
        assert verdicts == {True, False}


@settings(max_examples=100, deadline=None)
@given(p=st.integers(2, 9), m=st.integers(1, 20), pick=st.integers(3, 200), seed=st.integers(0, 10**6),
       swaps=st.integers(0, 3), as_str=st.booleans())
def test_grid_dependency_check_c_equals_python(p, m, pick, seed, swaps, as_str) -> None:
    """The grid rules' final check on repeated grids with a few cells swapped (most then break a
    dependency or a count): the same verdict."""
    grid = [list(r) for r in v_grid_lowering.repeated_grid(_some_block(p, pick), m)]
    rng = random.Random(seed)
    for _ in range(swaps):
        r = rng.randrange(p)
        a, b = rng.randrange(len(grid[r])), rng.randrange(len(grid[r]))
        grid[r][a], grid[r][b] = grid[r][b], grid[r][a]
    if as_str:
        grid = ["".join(r) for r in grid]
    py, c = _both(v_grid_lowering._dependencies_hold, grid, m)
    assert c == py


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 6), per=st.integers(1, 4), periods=st.integers(1, 6), seed=st.integers(0, 10**6),
       cut=st.booleans(), ints=st.booleans())
def test_rank_peak_c_equals_python(m, per, periods, seed, cut, ints) -> None:
    """A rank's peak from its deltas, with shifted periods left out (their period summing to 0
    or not) and without; integer deltas are declined by C (the Python sums keep their type)."""
    rng = random.Random(seed)
    S = 3
    memc = [rng.choice((1.0, -1.0, 0.5, -0.5, 0.0, 0.25)) for _ in range(3 * S)]
    if ints:
        memc = [int(x * 4) for x in memc]
    n = per * m
    codes = [rng.randrange(3 * S) * m + rng.randrange(m) for _ in range(n)]
    c = None
    if cut and m >= 2:
        a = per * rng.randrange(1, m)
        c = (a, rng.randrange(a, n + 1))
    py, cc = _both(steady_timing._rank_peak, codes, memc, m, c)
    assert cc == py and type(cc[1]) is type(py[1])
