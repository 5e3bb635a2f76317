"""``OrderTimer``: one schedule's timings with changing costs, the later ones replaying the
first one's event runs, equal to ``simulate`` float for float and in event order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import Op, OpKind, Placement, Schedule
from pipeoffload.passes.lower import lower
from pipeoffload.passes.timing import OrderTimer, _untimed_control, simulate
from pipeoffload.schedules import generate
from pipeoffload.timeline import Timeline


def _same(fast: Timeline, ref: Timeline) -> None:
    """The same figures, rows in event order and events, float for float."""
    assert fast.summary() == ref.summary()
    assert fast.busy() == ref.busy() and fast.peak_memory() == ref.peak_memory()
    assert list(fast.event_rows()) == list(ref.event_rows())  # event order included
    assert fast.events == ref.events


_FAMILIES = {"1f1b": {}, "zb-h1": {}, "zb-v": {}, "v-half": {}, "interleaved-1f1b": {"v": 2},
             "group-interleaved": {"v": 3}, "gpipe": {}}


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(_FAMILIES)), p=st.integers(2, 5), extra=st.integers(0, 6),
       costs=st.lists(st.tuples(st.floats(0.05, 3.0), st.floats(0.05, 3.0), st.floats(0.05, 3.0),
                                st.floats(0.0, 1.0)), min_size=2, max_size=4),
       per_group=st.booleans())
def test_replays_equal_simulate(name: str, p: int, extra: int, costs: list, per_group: bool) -> None:
    m = 2 * p + extra
    if name == "interleaved-1f1b" and m % p:
        m += p - m % p
    kw = dict(_FAMILIES[name])
    if name == "group-interleaved":
        kw["g"] = p  # the widest valid group (ceil(p/2) <= g <= p), not the generator's default
    sched = generate(name, p, m, **kw)
    timer = OrderTimer(sched)
    memory = MemoryDeltas(F=2.0, B=-0.5, W=-1.5)
    S = sched.num_stages
    for n, (f, b, w, comm) in enumerate(costs):
        # per layer group: unequal costs, so the replay does not lean on uniform ones
        c = Costs(comm=comm, group_costs=[(f * (1 + s / 7), b * (1 + s % 3 / 5), w) for s in range(S)]) \
            if per_group else Costs(F=f, B=b, W=w, comm=comm)
        _same(timer.simulate(c, memory), simulate(sched, c, memory))
        assert timer.replays == n  # the first timing records, every later one replays


def test_replay_fires_in_the_planner_and_equals_lower() -> None:
    """The planner's timings (``Simulator._time``) go through one timer per schedule: the
    repeated fixed-order schedules replay, and every timeline equals ``lower``'s."""
    import pipeoffload.planner.simulate as sim_mod
    from pipeoffload.planner.search import plan

    seen: list[tuple] = []
    timers: dict[int, object] = {}  # each schedule's timer (plan() clears its simulator's when it returns)
    orig = sim_mod.Simulator._time

    def spy(self, schedule, sh):
        tl = orig(self, schedule, sh)
        seen.append((self, schedule, sh, tl))
        timers[id(schedule)] = self._timers[id(schedule)][1]
        return tl

    sim_mod.Simulator._time = spy
    try:
        plan("1.5B", "a100-80g", 32)  # 0.2 s; two timings replay there
    finally:
        sim_mod.Simulator._time = orig
    assert seen
    for _, schedule, sh, tl in seen:
        ref = lower(schedule, sh.costs, sh.memory, memory_unit="bytes", validated=True).timeline
        _same(tl, ref)
    assert sum(t.replays for t in timers.values()) > 0  # type: ignore[attr-defined]


def test_untimed_control() -> None:
    """The replay is used only where the engine's control flow reads no time."""
    assert _untimed_control([1.0, 0.0, 2.5], 0.0)
    assert not _untimed_control([1.0, -0.5], 0.0)
    assert not _untimed_control([1.0, float("inf")], 0.0)
    assert not _untimed_control([1.0, 2.0], -0.1)
    assert not _untimed_control([1.0, 2.0], float("nan"))
    assert not _untimed_control([float("nan"), 2.0], 0.1)


def test_a_deadlock_keeps_nothing_and_raises_as_simulate() -> None:
    pl = Placement.loop(2)
    F, B = OpKind.F, OpKind.B
    # rank 0 runs B(0, 0) before F(0, 0) reaches rank 1: a cycle
    ranks = [[Op(B, 0, 0, 0, 0), Op(F, 0, 0, 0, 0)], [Op(F, 1, 0, 1, 0), Op(B, 1, 0, 1, 0)]]
    sched = Schedule("stuck", 1, pl, ranks, {})
    timer = OrderTimer(sched)
    with pytest.raises(ScheduleError) as got:
        timer.simulate(Costs())
    with pytest.raises(ScheduleError) as want:
        simulate(sched, Costs())
    assert str(got.value) == str(want.value)
    assert timer.runs is None and timer.addresses() is None and timer.replays == 0
