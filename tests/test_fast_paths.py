"""The V generators' fast paths (issue 24) give exactly what the paths they replace give:
the timing figures without a timeline, the refill's fused loop and its skipped rerun, the
fused replay, the slot reorder's incremental peak and its bisections."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import OpKind, build_schedule
from pipeoffload.passes.timing import KIND_CODE, order_figures, place_rank_lists, simulate
from pipeoffload.schedules import generate
from pipeoffload.schedules.building_block import orders_from_block
from pipeoffload.schedules.v_reorder import _MEM, _first_fit, _kth, _peak, _RankLevels
from pipeoffload.schedules.vshape import unit_peak_bound, v_half_block, v_min_block, v_zb_block
from pipeoffload.schedules.w_refill import refill_both, refill_weights
from pipeoffload.schedules.zb_auto import Infeasible, Tracker, replay

BLOCKS = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}
costs_st = st.builds(
    Costs,
    F=st.sampled_from([0.5, 1.0, 1.3, 2.0]),
    B=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
    W=st.sampled_from([0.25, 0.5, 1.0, 2.1]),
    comm=st.sampled_from([0.0, 0.05, 0.1]),
)
memory_st = st.sampled_from([MemoryDeltas(), MemoryDeltas(F=2.0, B=-0.5, W=-1.5)])


def _orders(s):
    return [[(o.kind, o.stage, o.microbatch) for o in r] for r in s.ranks]


@settings(deadline=None)
@given(name=st.sampled_from(["zb-v", "v-min", "v-half", "v-zb", "zb-h1", "1f1b"]), p=st.integers(1, 6),
       m=st.integers(1, 14), costs=costs_st, memory=memory_st)
def test_order_figures_are_simulates(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas) -> None:
    s = generate(name, p, m)
    tl = simulate(s, costs, memory)
    assert order_figures(s.placement, m, _orders(s), costs, memory) == (
        max(tl.peak_memory()), max(tl.spans()), tl.makespan)


def _old_replay(tracker: Tracker, per_rank) -> Tracker:
    """zb_auto.replay before issue 24: the shared driver calling Tracker.put."""
    lists = [[(KIND_CODE[k], s, j) for k, s, j in ops] for ops in per_rank]
    placed = place_rank_lists(tracker, lists, lambda r, i: tracker.put(*lists[r][i]))
    if any(n < len(ops) for n, ops in zip(placed, lists)):
        raise Infeasible("the order deadlocks")
    return tracker


def _state(tr: Tracker) -> tuple:
    return (tr.order, tr.end, tr.clock, tr.level, tr.peak, tr.idle, tr.first, tr.started)


@settings(deadline=None)
@given(name=st.sampled_from(["zb-v", "v-half", "zb-h2", "1f1b"]), p=st.integers(1, 6), m=st.integers(1, 12),
       costs=costs_st, memory=memory_st, limit=st.sampled_from([1.0, 2.0, 3.0, 1e9]))
def test_replay_is_the_tracker_driven_one(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas,
                                          limit: float) -> None:
    s = generate(name, p, m)
    results = []
    for run in (replay, _old_replay):
        try:
            results.append(_state(run(Tracker(s.placement, m, costs, memory, limit), _orders(s))))
        except Infeasible:
            results.append("infeasible")
    assert results[0] == results[1]


@settings(deadline=None)
@given(name=st.sampled_from(sorted(BLOCKS)), p=st.integers(1, 7), m=st.integers(1, 16), costs=costs_st,
       tight=st.booleans())
def test_refill_both_is_both_refills(name: str, p: int, m: int, costs: Costs, tight: bool) -> None:
    """refill_both leaves out only a rerun that would repeat the first run."""
    orders = orders_from_block(BLOCKS[name](p), m)
    caps = [max(1, unit_peak_bound(name, p) - tight)] * p
    s = build_schedule(name, m, v_half_block(p).placement, orders)
    full = []
    for partial in (True, False):
        try:
            full.append(_orders(refill_weights(s, costs, MemoryDeltas(), caps, partial)))
        except Infeasible:
            pass
    trackers = refill_both(s.placement, m, orders, costs, MemoryDeltas(), caps)
    for tr in trackers:  # the tracker's times are the timing pass's
        assert (tr.max_span(), tr.makespan()) == order_figures(s.placement, m, tr.order, costs, MemoryDeltas())[1:]
    fast = [tr.order for tr in trackers]
    assert fast == full or (len(full) == 2 and full[0] == full[1] and fast == full[:1])


@settings(deadline=None)
@given(xs=st.sets(st.integers(0, 200), min_size=1, max_size=40), data=st.data())
def test_kth_is_sorted_union(xs: set[int], data) -> None:
    xs = list(xs)
    cut = data.draw(st.integers(0, len(xs)))
    a, b = sorted(xs[:cut]), sorted(xs[cut:])
    k = data.draw(st.integers(0, len(xs) - 1))
    assert _kth(a, b, k) == sorted(xs)[k]


@settings(deadline=None)
@given(data=st.data())
def test_rank_levels_first_fit_is_whole_rank_peak(data) -> None:
    """_RankLevels.first_fit picks what re-checking the whole rank's _peak picks, and its
    kept levels stay those of the moved rows."""
    n = data.draw(st.integers(1, 8))
    slots = deque(data.draw(st.permutations(range(4 * n + 6)))[:4 * n])
    rows = [sorted(slots.popleft() for _ in range(n)) for _ in range(4)]
    cap = _peak(rows) + data.draw(st.integers(0, 1))
    levels = _RankLevels(rows)
    for _ in range(3):
        k = data.draw(st.integers(0, 3))
        j = data.draw(st.integers(0, n - 1))
        t = rows[k][j]
        lo = rows[k][j - 1] + 1 if j else 0
        taken = {u for r in rows for u in r}
        free = [q for q in range(lo, t) if q not in taken]
        want = t
        for q in free:
            rows[k][j] = q
            if _peak(rows) <= cap:
                want = q
                break
        rows[k][j] = t
        got = levels.first_fit(k, t, free, cap)
        assert got == want
        rows[k][j] = got
        fresh = _RankLevels(rows)
        assert (levels.events, levels.level, levels.pending) == (fresh.events, fresh.level, fresh.pending)


def _old_first_fit(rows, k: int, t: int, free: list[int], cap: int) -> int:
    """v_reorder._first_fit before issue 24: the level after every slot of the window."""
    if not free:
        return t
    if _MEM[k] <= 0:
        return free[0]
    lo = free[0]
    deltas = sorted((u, _MEM[kk]) for kk in range(len(rows)) for u in rows[kk] if _MEM[kk] and u < t)
    level = sum(d for u, d in deltas if u < lo)
    highest = []
    for u in range(lo, t):
        level += sum(d for x, d in deltas if x == u)
        highest.append(level)
    for n in range(len(highest) - 2, -1, -1):
        highest[n] = max(highest[n], highest[n + 1])
    return next((q for q in free if highest[q - lo] + 1 <= cap), t)


@settings(deadline=None)
@given(data=st.data())
def test_first_fit_is_the_slot_by_slot_scan(data) -> None:
    n = data.draw(st.integers(1, 6))
    slots = deque(data.draw(st.permutations(range(6 * n + 6)))[:6 * n])
    rows = [sorted(slots.popleft() for _ in range(n)) for _ in range(6)]
    k, j = data.draw(st.integers(0, 5)), data.draw(st.integers(0, n - 1))
    t = rows[k][j]
    taken = {u for r in rows for u in r}
    free = [q for q in range(data.draw(st.integers(0, t)), t) if q not in taken]
    cap = data.draw(st.integers(0, 2 * n))
    assert _first_fit(rows, k, j, t, free, cap) == _old_first_fit(rows, k, t, free, cap)


def test_order_figures_names_a_deadlock_as_simulate_does() -> None:
    s = generate("1f1b", 2, 2)
    orders = _orders(s)
    orders[1] = orders[1][::-1]  # the last rank's backwards before its forwards
    with pytest.raises(ScheduleError, match="deadlock"):
        order_figures(s.placement, 2, orders, Costs(), MemoryDeltas())


@settings(deadline=None, max_examples=40)
@given(name=st.sampled_from(sorted(BLOCKS)), p=st.integers(1, 6), m=st.integers(1, 14), costs=costs_st,
       memory=memory_st, holes=st.booleans())
@example(name="v-zb", p=4, m=8, costs=Costs(), memory=MemoryDeltas(), holes=False)
@example(name="v-zb", p=3, m=9, costs=Costs(), memory=MemoryDeltas(), holes=True)
def test_lowering_at_the_bounds_is_the_full_lowering(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas,
                                                      holes: bool) -> None:
    """The V lowering's shortcut at the lower bounds returns what building and comparing
    every candidate returns."""
    from pipeoffload.schedules import vshape
    from pipeoffload.schedules.spec import ScheduleSpec

    spec = ScheduleSpec(name, p, m, costs=costs, memory=memory)
    fast = vshape._lower_block(name, BLOCKS[name](p), spec, holes)
    saved = vshape._at_bounds
    vshape._at_bounds = lambda *a: False
    try:
        full = vshape._lower_block(name, BLOCKS[name](p), spec, holes)
    finally:
        vshape._at_bounds = saved
    assert fast == full


def test_lowering_shortcut_is_taken() -> None:
    """V-ZB at equal costs, m >= 2p: the first lowering is at both bounds (so the test above
    exercises the shortcut); V-Half's is not."""
    from pipeoffload.schedules import vshape
    from pipeoffload.schedules.spec import ScheduleSpec

    for name, expect in (("v-zb", True), ("v-half", False)):
        block = BLOCKS[name](4)
        orders = orders_from_block(block, 8)
        figures = order_figures(block.placement, 8, orders, Costs(), MemoryDeltas())
        assert vshape._at_bounds(list(figures), block.placement, 8, ScheduleSpec(name, 4, 8)) is expect


def test_hole_filling_is_skipped_only_when_it_cannot_try() -> None:
    """Above its budget fill_holes returns the winner itself: the lowering's skip (2·ops >
    BUDGET) changes nothing."""
    from pipeoffload.schedules.hole_fill import BUDGET, fill_holes

    p, m = 8, BUDGET // (2 * 6 * 8) + 1
    s = build_schedule("v-half", m, v_half_block(p).placement, orders_from_block(v_half_block(p), m))
    assert 2 * sum(len(r) for r in s.ranks) > BUDGET
    assert fill_holes(s, Costs(F=1, B=2, W=1), MemoryDeltas(), [unit_peak_bound("v-half", p)] * p) is s


# --- hole filling's incremental re-timing (schedules/hole_fill.py, _Search.retime) ------------


def _codes(s):
    return [[(KIND_CODE[o.kind], o.stage, o.microbatch) for o in r] for r in s.ranks]


@settings(deadline=None, max_examples=100)
@given(name=st.sampled_from(["v-min", "v-half", "v-zb", "zb-v", "zb-h1", "1f1b"]), p=st.integers(2, 6),
       k=st.integers(1, 3), costs=costs_st, memory=memory_st, data=st.data())
def test_retime_after_a_move_is_the_whole_timing(name: str, p: int, k: int, costs: Costs, memory: MemoryDeltas,
                                                 data) -> None:
    """A trial re-timed from the base timing (only the ops ending after the moved op's new
    slot opens placed again) has exactly the ends, rank ends and first starts of timing the
    whole trial, or is None exactly when the trial deadlocks; the shortcut fires (k > 0) and
    keeps some ops."""
    from pipeoffload.schedules.hole_fill import _Search, _Timing

    s = generate(name, p=p, m=k * p, costs=costs)
    search = _Search(s.placement, s.num_microbatches, costs, memory)
    lists = _codes(s)
    tr = search.time(lists)
    base = _Timing(tr.end, tr.clock, tr.first)
    r = data.draw(st.integers(0, len(lists) - 1))
    j = data.draw(st.integers(1, len(lists[r]) - 1))
    to = data.draw(st.integers(max(0, j - 8), j - 1))  # fill_holes moves an op at most WINDOW = 8 places
    trial = list(lists)
    trial[r] = lists[r][:to] + [lists[r][j]] + lists[r][to:j] + lists[r][j + 1:]
    fast = search.retime(base, trial, r, to)
    try:
        full = search.time(trial)
    except Infeasible:
        assert fast is None
        return
    assert fast is not None
    assert (fast.end, fast.clock, fast.first) == (full.end, full.clock, full.first)
    assert search.retimed[0] == (1 if to > 0 else 0)
    assert to == 0 or search.retimed[1] <= sum(map(len, lists)) - to


def test_fill_holes_with_incremental_retime_is_fill_holes_with_whole_timings(monkeypatch) -> None:
    """fill_holes gives the same schedule with every trial timed whole, and the incremental
    path fires (trials re-timed, fewer ops placed again than the trials hold)."""
    from pipeoffload.schedules import hole_fill

    cases = [("v-min", 4, 8, Costs(F=2, B=4, W=2)), ("v-half", 6, 12, Costs(F=1.3, B=2.1, W=0.7, comm=0.05)),
             ("zb-h1", 4, 12, Costs(F=1, B=2, W=1, comm=0.1))]
    seen = []
    init = hole_fill._Search.__init__

    def spy(self, *a):
        init(self, *a)
        seen.append(self)

    monkeypatch.setattr(hole_fill._Search, "__init__", spy)
    for name, p, m, costs in cases:
        s = generate(name, p=p, m=m, costs=costs)
        cap = {"zb-h1": p}.get(name) or unit_peak_bound(name, p)
        seen.clear()
        fast = hole_fill.fill_holes(s, costs, MemoryDeltas(), [cap] * p)
        n_ops = sum(len(r) for r in s.ranks)
        trials, placed = seen[0].retimed
        assert fast is not s and trials > 0 and placed < trials * n_ops
        with monkeypatch.context() as mp:
            mp.setattr(hole_fill._Search, "retime", _whole_retime)
            full = hole_fill.fill_holes(s, costs, MemoryDeltas(), [cap] * p)
        assert _orders(fast) == _orders(full)


def _whole_retime(self, base, lists, rank, k):
    from pipeoffload.schedules.hole_fill import _Timing

    try:
        tr = self.time(lists)
    except Infeasible:
        return None
    return _Timing(tr.end, tr.clock, tr.first)


@settings(deadline=None, max_examples=60)
@given(name=st.sampled_from(["zb-v", "v-half", "zb-h1", "1f1b", "interleaved-1f1b"]), p=st.integers(1, 5),
       m=st.integers(1, 10), costs=costs_st, memory=memory_st, tiny_f=st.booleans())
def test_order_figures_running_sums_are_the_sweep(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas,
                                                  tiny_f: bool) -> None:
    """order_figures reads serial ranks' peaks as running sums of their deltas and their first
    start and last end at their ends: the same floats as the memory sweep over every op
    (_figures_swept, forced here); an op shorter than an ulp of the times takes the sweep
    (the shortcut's condition: there an op may end when it starts)."""
    from pipeoffload.passes import timing

    if name == "interleaved-1f1b":
        m = p * max(1, m // p)
    s = generate(name, p, m, **({"v": 2} if name == "interleaved-1f1b" else {}))
    if tiny_f:
        costs = Costs(F=1e-30, B=costs.B, W=costs.W, comm=costs.comm)
    swept, serial = timing._figures_swept, timing._serial
    calls = []
    timing._figures_swept = lambda *a: calls.append(1) or swept(*a)
    try:
        got = order_figures(s.placement, m, _orders(s), costs, memory)
        assert bool(calls) == tiny_f  # the running sums whenever every op lasts over an ulp
        timing._serial = lambda *a: False
        assert got == order_figures(s.placement, m, _orders(s), costs, memory)
    finally:
        timing._figures_swept, timing._serial = swept, serial


def test_order_figures_of_ops_on_another_rank_are_simulates() -> None:
    """An op in another rank's list leaves the compact loop (which times a list on its own
    rank's clock): the figures are then simulate's, by definition."""
    s = generate("zb-h1", 3, 4)
    orders = _orders(s)
    assert orders[2][-1][0] is OpKind.W
    orders[1].append(orders[2].pop())  # rank 2's last W listed last on rank 1
    costs, memory = Costs(F=1.0, B=2.0, W=0.5, comm=0.1), MemoryDeltas(F=2.0, B=-0.5, W=-1.5)
    tl = simulate(build_schedule("orders", 4, s.placement, orders), costs, memory)
    assert order_figures(s.placement, 4, orders, costs, memory) == (
        max(tl.peak_memory()), max(tl.spans()), tl.makespan)


@settings(deadline=None)
@given(name=st.sampled_from(["zb-h1", "zb-h2", "1f1b"]), p=st.integers(1, 5), m=st.integers(1, 10), costs=costs_st)
def test_replay_keeps_the_callers_op_tuples(name: str, p: int, m: int, costs: Costs) -> None:
    """replay's order holds the caller's own (kind, stage, mb) tuples for F, B and W (no tuple
    made again per op: the fast path fired), and a BW's entry is made as Tracker.put's B."""
    s = generate(name, p, m)
    per_rank = _orders(s)
    tr = replay(Tracker(s.placement, m, costs, MemoryDeltas(), 1e9), per_rank)
    for r, ops in enumerate(per_rank):
        assert tr.order[r] == [(OpKind.B if k is OpKind.BW else k, st_, j) for k, st_, j in ops]
        assert all((got is op) == (op[0] is not OpKind.BW) for got, op in zip(tr.order[r], ops))
