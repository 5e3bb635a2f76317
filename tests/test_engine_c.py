"""The timing engine's C loops (``pipeoffload._engine``) against their Python twins
(``_time_compact_py``, ``_time_in_runs_py``): the same starts and ends, the same number
placed, the same event runs, and the engine's ``clock`` and ``end`` left the same, float
for float, on random orders (deadlocks, duplicates and missing ops included) and random
costs; inputs the C loop does not take fall back to Python."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload import native
from pipeoffload.errors import ParameterError
from pipeoffload.ir import Placement
from pipeoffload.passes import timing
from pipeoffload.passes.timing import ListScheduler, _own_of, _time_compact_py, _time_in_runs_py
from pipeoffload.schedules import generate


def _engine_module():
    try:
        from pipeoffload import _engine
    except ImportError:  # fail, not skip: CI must run the C loops it ships
        pytest.fail("pipeoffload._engine is not built: `make install` (pip install -e .) builds it with the C compiler")
    return _engine


def _orders(placement: Placement, m: int, rng: random.Random, drop: float, dup: float
            ) -> tuple[list[list[int]], list[list[int]]]:
    """Per rank, table indices and microbatches of every (kind, stage, mb) the rank holds,
    shuffled a little (so some orders deadlock), some dropped, some repeated."""
    S, rank_of = placement.num_stages, placement.stage_to_rank
    p = max(rank_of) + 1
    tis: list[list[int]] = [[] for _ in range(p)]
    mbs: list[list[int]] = [[] for _ in range(p)]
    split = rng.random() < 0.7
    for j in range(m):
        for kind in ((0, 1, 2) if split else (0, 3)):
            for s in (range(S) if kind == 0 else range(S - 1, -1, -1)):
                if rng.random() < drop:
                    continue
                for _ in range(2 if rng.random() < dup else 1):
                    tis[rank_of[s]].append(kind * S + s)
                    mbs[rank_of[s]].append(j)
    for r in range(p):
        pairs = list(zip(tis[r], mbs[r]))
        for _ in range(rng.choice((0, 0, 0, 0, 1, 2))):  # a few swaps: some orders wait forever
            if len(pairs) > 1:
                a, b = rng.randrange(len(pairs)), rng.randrange(len(pairs))
                pairs[a], pairs[b] = pairs[b], pairs[a]
        tis[r], mbs[r] = [k for k, _ in pairs], [j for _, j in pairs]
    return tis, mbs


_FAMILIES = {"1f1b": {}, "zb-h1": {}, "zb-v": {}, "v-half": {}, "interleaved-1f1b": {"v": 2}, "gpipe": {}}


def _registry_orders(name: str, p: int, m: int, rng: random.Random, swaps: int
                     ) -> tuple[Placement, list[list[int]], list[list[int]], int]:
    """A registry schedule's compact addresses (its placement, table indices, microbatches
    and the engine's m), with ``swaps`` random swaps of neighbours on random ranks."""
    if name == "interleaved-1f1b" and m % p:
        m += p - m % p
    sched = generate(name, p, max(m, 2 * p) if name in ("zb-v", "v-half") else m, **_FAMILIES[name])
    _, tis, mbs, m_engine = timing._compact_addresses(sched)
    tis, mbs = [list(t) for t in tis], [list(j) for j in mbs]
    for _ in range(swaps):
        r = rng.randrange(len(tis))
        if len(tis[r]) > 1:
            i = rng.randrange(len(tis[r]) - 1)
            tis[r][i], tis[r][i + 1] = tis[r][i + 1], tis[r][i]
            mbs[r][i], mbs[r][i + 1] = mbs[r][i + 1], mbs[r][i]
    return sched.placement, tis, mbs, m_engine


def _placement(p: int, v: int, vshape: bool) -> Placement:
    return Placement.vshape(p) if vshape and v == 2 else Placement.loop(p, v)


def _state(engine: ListScheduler) -> tuple[list[float], list[float]]:
    return list(engine.clock), list(engine.end)


def _same_floats(a, b) -> bool:
    """Equal lists of floats, NaN equal to NaN (the loops carry a NaN cost through)."""
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(["random"] + sorted(_FAMILIES)), p=st.integers(1, 6), v=st.integers(1, 2),
       vshape=st.booleans(), m=st.integers(1, 9), seed=st.integers(0, 10**6),
       drop=st.sampled_from([0.0, 0.0, 0.05]), dup=st.sampled_from([0.0, 0.0, 0.05]),
       comm=st.sampled_from([0.0, 0.25, 1.0]), origin=st.sampled_from([0.0, -2.0, 3.5]),
       durs=st.sampled_from(["plain", "zero", "mixed"]), record=st.booleans())
def test_time_compact_equals_the_python_loop(base, p, v, vshape, m, seed, drop, dup, comm, origin, durs,
                                             record) -> None:
    """Random orders (some deadlock, some place an op twice or miss one) and registry
    schedules (a neighbour swap now and then), under random costs."""
    engine_c = _engine_module()
    rng = random.Random(seed)
    if base == "random":
        pl = _placement(p, v, vshape)
        tis, mbs = _orders(pl, m, rng, drop, dup)
    else:
        pl, tis, mbs, m = _registry_orders(base, max(p, 2), m, rng, rng.choice((0, 0, 1, 3)))
    S = pl.num_stages
    own_of = _own_of(S)
    if durs == "plain":
        dur_of = [rng.choice([0.5, 1.0, 2.0, 1.0 / 3.0]) for _ in own_of]
    elif durs == "zero":
        dur_of = [0.0] * len(own_of)
    else:  # negative, tiny, huge and infinite durations: the comparisons, not the arithmetic, decide
        dur_of = [rng.choice([1.0, -0.75, 1e-300, 1e300, math.inf, 0.1]) for _ in own_of]
    ref, fast = (ListScheduler(pl.stage_to_rank, m, comm, origin) for _ in range(2))
    runs_ref = [] if record else None
    runs_fast = [] if record else None
    want = _time_compact_py(ref, [list(t) for t in tis], [list(j) for j in mbs], own_of, dur_of, runs_ref)
    got = engine_c.time_compact(m, fast.deps, fast.clock, fast.origin, fast.end, tis, mbs, own_of, dur_of, runs_fast)
    assert got is not None, "the C loop declined inputs it takes"
    assert got[2] == want[2]
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert a.typecode == b.typecode == "d" and _same_floats(a, b)
    assert runs_fast == runs_ref
    clock_c, end_c = _state(fast)
    clock_p, end_p = _state(ref)
    assert _same_floats(clock_c, clock_p) and _same_floats(end_c, end_p)
    assert all(type(x) is float for x in clock_c + end_c)


@settings(max_examples=80, deadline=None)
@given(base=st.sampled_from(["random"] + sorted(_FAMILIES)), p=st.integers(1, 5), v=st.integers(1, 2),
       m=st.integers(1, 6), seed=st.integers(0, 10**6), comm=st.sampled_from([0.0, 0.5]))
def test_time_in_runs_equals_the_python_loop(base, p, v, m, seed, comm) -> None:
    """Replaying a complete timing's runs with other durations, as ``OrderTimer`` does."""
    engine_c = _engine_module()
    rng = random.Random(seed)
    if base == "random":
        pl = _placement(p, v, True)
        tis, mbs = _orders(pl, m, rng, 0.0, 0.0)
    else:
        pl, tis, mbs, m = _registry_orders(base, max(p, 2), m, rng, 0)
    own_of = _own_of(pl.num_stages)
    first = ListScheduler(pl.stage_to_rank, m, comm, 0.0)
    runs: list[tuple[int, int]] = []
    placed = _time_compact_py(first, tis, mbs, own_of, [1.0] * len(own_of), runs)[2]
    if placed < sum(map(len, tis)):
        return  # a deadlocked order has no runs to replay
    flat = [x for run in runs for x in run]
    dur_of = [rng.choice([0.25, 1.0, 3.0]) for _ in own_of]
    ref, fast = (ListScheduler(pl.stage_to_rank, m, comm, 0.0) for _ in range(2))
    want = _time_in_runs_py(ref, tis, mbs, own_of, dur_of, flat)
    got = engine_c.time_in_runs(m, fast.deps, fast.clock, fast.origin, fast.end, tis, mbs, own_of, dur_of, flat)
    assert got is not None
    assert [list(a) for a in got[0] + got[1]] == [list(a) for a in want[0] + want[1]]
    assert _state(fast) == _state(ref)


def test_inputs_the_c_loop_does_not_take_fall_back_to_python() -> None:
    """An int duration (the Python loop would keep it an int), a microbatch out of the
    engine's range and a run past a rank's list: the C loop declines, changes nothing, and
    ``_time_compact`` / ``_time_in_runs`` give the Python loop's result."""
    engine_c = _engine_module()
    pl = Placement.loop(2, 1)
    own_of = _own_of(pl.num_stages)
    tis = [[0, 2], [1, 3]]  # F then B of microbatch 0 on each rank
    mbs = [[0, 0], [0, 0]]
    for dur_of, bad_mbs in (([1] * len(own_of), mbs), ([1.0] * len(own_of), [[0, 5], [0, 0]])):
        e = ListScheduler(pl.stage_to_rank, 1, 0.0, 0.0)
        before = _state(e)
        assert engine_c.time_compact(1, e.deps, e.clock, e.origin, e.end, tis, bad_mbs, own_of, dur_of, None) is None
        assert _state(e) == before
    e = ListScheduler(pl.stage_to_rank, 1, 0.0, 0.0)
    ints = [1] * len(own_of)
    starts, ends, placed = timing._time_compact(e, tis, mbs, own_of, ints, None)
    ref = ListScheduler(pl.stage_to_rank, 1, 0.0, 0.0)
    assert (starts, ends, placed) == _time_compact_py(ref, tis, mbs, own_of, ints, None) and placed == 4
    e = ListScheduler(pl.stage_to_rank, 1, 0.0, 0.0)
    assert engine_c.time_in_runs(1, e.deps, e.clock, e.origin, e.end, tis, mbs, own_of, [1.0] * len(own_of),
                                 [0, 3]) is None  # rank 0 has two ops, not three


def test_the_timing_pass_runs_the_c_loops() -> None:
    """Built, the default (``PIPEOFFLOAD_ENGINE`` unset or ``auto``) takes the C loops."""
    assert native.c_engine() is _engine_module()


def test_a_bad_engine_choice_is_one_line_from_the_cli() -> None:
    r = subprocess.run([sys.executable, "-m", "pipeoffload", "simulate", "1f1b", "-p", "4", "-m", "8"],
                       capture_output=True, text=True, env=dict(os.environ, PIPEOFFLOAD_ENGINE="fast"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "PIPEOFFLOAD_ENGINE" in r.stderr and "auto, c or python" in r.stderr


def test_the_engine_choice_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEOFFLOAD_ENGINE", "fast")
    with pytest.raises(ParameterError) as err:
        native._load_engine()
    assert err.value.param == "PIPEOFFLOAD_ENGINE" and "auto, c or python" in str(err.value)
    monkeypatch.setenv("PIPEOFFLOAD_ENGINE", "python")
    assert native._load_engine() is None
    monkeypatch.setenv("PIPEOFFLOAD_ENGINE", "C")
    assert native._load_engine() is _engine_module()
