"""The search's helper processes (``planner/workers.py``): a plan is the same with any number of
processes, the helpers' work is really used, and a helper that fails or dies changes nothing but
the time. Real forked processes, real pipes, real searches."""

from __future__ import annotations

import os
import pickle
import threading

import pytest

from pipeoffload.cli import main
from pipeoffload.costmodel.hardware import GiB
from pipeoffload.errors import ParameterError
from pipeoffload.planner import PlanOptions, plan, workers
from pipeoffload.planner.refusals import Refused
from pipeoffload.planner.simulate import Simulator

#: The counters that say how the work was shared, not what was found.
_WORK = ("seconds", "simulations", "offload_plans", "generator_calls", "processes", "simulations_ahead")

#: Searches where the plain phase leaves candidates untimed (the helpers' work) and the offload
#: phase fits several configurations that are completed at the end (forked_map's work).
CASES = [
    ("9.6B", 16, 12, PlanOptions(top=3)),
    ("1.5B", 8, 6, PlanOptions(recompute=(False, True))),
]


def _same(a, b) -> None:
    """``a`` and ``b`` give the same JSON and table apart from how the work was shared."""
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        for k in _WORK:
            d["search"].pop(k)
    assert da == db
    assert a.table().split("\n")[2:] == b.table().split("\n")[2:]


@pytest.mark.parametrize("model,gpus,budget,opts", CASES)
def test_helpers_give_the_same_plan(monkeypatch, model, gpus, budget, opts):
    alone = plan(model, "a100-80g", gpus, memory_budget=budget * GiB, options=opts, workers=1)
    # Every key handed to a helper is taken from it (the search's own way takes what has come back).
    monkeypatch.setattr(workers.Prefetcher, "wait_s", 60.0)
    helped = plan(model, "a100-80g", gpus, memory_budget=budget * GiB, options=opts, workers=2)
    assert alone.stats["processes"] == 1 and alone.stats["simulations_ahead"] == 0
    assert helped.stats["processes"] == 2
    assert helped.stats["simulations_ahead"] > 0, "no simulation came from a helper: the test checks nothing"
    _same(alone, helped)


def test_a_dead_helper_changes_nothing(monkeypatch):
    # The helper dies at its first key: the search simulates everything itself.
    def dies(simulator, tasks, results, ends):
        for end in ends:
            end.close()
        tasks.recv()
        os._exit(3)

    model, gpus, budget, opts = CASES[0]
    alone = plan(model, "a100-80g", gpus, memory_budget=budget * GiB, options=opts, workers=1)
    monkeypatch.setattr(workers.Prefetcher, "wait_s", 60.0)  # waits end when the helper is gone
    monkeypatch.setattr(workers, "_serve", dies)
    helped = plan(model, "a100-80g", gpus, memory_budget=budget * GiB, options=opts, workers=2)
    assert helped.stats["simulations_ahead"] == 0
    _same(alone, helped)


def test_prefetched_simulations_are_the_searchs_own():
    # A helper's Simulated, unpickled, holds the same floats as the search's own simulation.
    from pipeoffload.planner.search import _problem
    from pipeoffload.planner.space import Family, Split
    from pipeoffload.recompute import Recompute

    problem = _problem("1.5B", "a100-80g", 8, 6 * GiB, None, None, None, PlanOptions())
    here, there = Simulator(problem), Simulator(problem)
    keys = [(Split(tp=1, pp=8, dp=1), Family(name, v), 32, rc)
            for name, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2))
            for rc in (Recompute.NONE, Recompute.ELEMENTWISE)]
    ahead = workers.Prefetcher(there, 1)
    ahead.wait_s = 60.0
    try:
        ahead.submit(keys)
        for key in keys:
            taken = ahead.take(key)
            assert taken is not None, f"{key}: no result from the helper"
            (got,) = taken
            own = here.simulate(*key)
            assert (got.makespan, got.busy, got.act, got.dp_exposed) == (own.makespan, own.busy, own.act,
                                                                          own.dp_exposed)
            assert [(e.op, e.start, e.end, e.mem) for e in got.timeline.events] == \
                [(e.op, e.start, e.end, e.mem) for e in own.timeline.events]
        assert ahead.used == len(keys) and there.stats["simulations"] > 0
    finally:
        ahead.close()
    assert not any(p.is_alive() for p in ahead._procs)


def test_a_helper_takes_on_the_searchs_schedules():
    # The search hands an untimed candidate's keys with the schedules it made for their peaks: the
    # helper times those, and generates only the ones the search had not made.
    from pipeoffload.planner.search import _problem
    from pipeoffload.planner.space import Family, Split
    from pipeoffload.recompute import Recompute

    problem = _problem("1.5B", "a100-80g", 8, 6 * GiB, None, None, None, PlanOptions())
    search, alone = Simulator(problem), Simulator(problem)
    keys = [(Split(tp=1, pp=8, dp=1), family, 32, rc)
            for family in (Family("zb-v", 2), Family("zb-auto", 1, limit=2), Family("interleaved-1f1b", 2))
            for rc in (Recompute.NONE, Recompute.ELEMENTWISE)]
    for key in keys:  # what the plain phase reads before it leaves a candidate untimed
        search.peaks_low(*key)  # the first m's schedule (zb-auto: None, nothing made)
    search.peaks(*keys[2])  # zb-auto's two m
    made = search.made_schedules(keys)
    assert len(made) == search.stats["generator_calls"] > 0
    helper = Simulator(problem)
    helper.adopt_schedules(made)
    for key in keys:
        got, own = helper.simulate(*key), alone.simulate(*key)
        assert (got.makespan, got.busy, got.act) == (own.makespan, own.busy, own.act)
    assert helper.stats["generator_calls"] == alone.stats["generator_calls"] - len(made) < \
        alone.stats["generator_calls"]
    # Handed whole through a helper process, too.
    ahead = workers.Prefetcher(Simulator(problem), 1)
    ahead.wait_s = 60.0
    try:
        ahead.submit(keys, made)
        taken = [ahead.take(key) for key in keys]
        assert all(t is not None for t in taken)
        assert [t[0].makespan for t in taken] == [alone.simulate(*key).makespan for key in keys]
    finally:
        ahead.close()


def test_a_helper_answers_the_offload_phases_first_question(monkeypatch):
    # For each candidate left untimed, the helper that simulated it also answers whether any offload
    # try can fit (search._hopeless_ahead); the search takes the answer instead of making it, and the
    # plan is the same. Each answer equals the one made in this process.
    from pipeoffload.planner.search import _hopeless_ahead, _problem

    taken: list[tuple[tuple, tuple]] = []
    take = workers.Prefetcher.take

    def spy(self, key):
        got = take(self, key)
        if key in self._calls:
            taken.append((key, got))
        return got

    model, gpus, budget, opts = CASES[0]
    alone = plan(model, "a100-80g", gpus, memory_budget=budget * GiB, options=opts, workers=1)
    monkeypatch.setattr(workers.Prefetcher, "take", spy)
    monkeypatch.setattr(workers.Prefetcher, "wait_s", 60.0)
    helped = plan(model, "a100-80g", gpus, memory_budget=budget * GiB, options=opts, workers=2)
    _same(alone, helped)
    assert taken, "the offload phase read no answer from the helper: the test checks nothing"
    here = Simulator(_problem(model, "a100-80g", gpus, budget * GiB, None, None, None, opts))
    for tag, got in taken:
        assert got is not None and isinstance(got[0], bool), f"{tag}: no answer from the helper"
        assert got[0] == _hopeless_ahead(here, *tag[1:])
    assert any(got[0] for _, got in taken), "no candidate proved hopeless: the answers are not read"


class _Slow:
    """A stand-in simulator for the helper's task order: a simulation takes 0.5 s (the tasks
    handed meanwhile queue up); it numbers the tasks it makes."""

    def __init__(self) -> None:
        self.stats: dict[str, int] = {}
        self.prefetch = None
        self.made = 0

    def adopt_schedules(self, made) -> None:
        pass

    def simulate(self, *key):
        import time

        time.sleep(0.5)
        self.made += 1
        return key, self.made


def _nth_call(simulator: _Slow, name: str) -> tuple[str, int]:
    simulator.made += 1
    return name, simulator.made


def test_a_helper_takes_its_tasks_by_rank_and_skips_dropped_calls():
    ahead = workers.Prefetcher(_Slow(), 1)
    try:
        ahead.submit([("k",)], rank=0.0)  # begun at once: the rest queue up behind it
        for name, rank in (("c", 3.0), ("a", 1.0), ("gone", 0.5), ("b", 2.0)):
            ahead.submit_call(("call", name), _nth_call, (name,), near=("k",), rank=rank)
        ahead.submit([("k2",)], rank=2.0)  # a simulation goes before a call of its rank
        ahead.submit_call(("call", "nowhere"), _nth_call, ("nowhere",), near=("unknown",), rank=0.0)
        assert ahead.take(("call", "gone")) is None  # the search makes it itself: dropped
        ahead.wait_s = 10.0
        assert [ahead.take(k) for k in (("k",), ("k2",))] == [((("k",), 1),), ((("k2",), 3),)]
        assert [ahead.take(("call", n)) for n in "abc"] == [(("a", 2),), (("b", 4),), (("c", 5),)]
        assert ("call", "nowhere") not in ahead._sent  # no helper had its key: not handed
        assert ahead.calls_used == 3 and ahead.used == 2
    finally:
        ahead.close()


def _double_here(x: int) -> tuple[int, int]:
    return 2 * x, os.getpid()


def test_forked_map_is_the_comprehension():
    items = list(range(7))
    got = workers.forked_map(_double_here, items, 3)
    assert [v for v, _ in got] == [2 * x for x in items]
    pids = {pid for _, pid in got}
    assert os.getpid() in pids and len(pids) == 3, "the helpers made none of the items"


def test_forked_map_makes_a_failed_or_lost_item_here():
    parent = os.getpid()

    def flaky(x: int) -> int:
        if os.getpid() != parent:
            if x == 1:
                raise RuntimeError("only in a helper")
            if x == 4:
                os._exit(5)  # the helper dies: its later items too are made here
        return x * x

    assert workers.forked_map(flaky, list(range(8)), 2) == [x * x for x in range(8)]


def test_forked_map_raises_the_items_error_here():
    def bad(x: int) -> int:
        if x == 3:
            raise ValueError("item 3")
        return x

    with pytest.raises(ValueError, match="item 3"):
        workers.forked_map(bad, list(range(5)), 2)


def test_refusals_cross_processes_whole():
    r = Refused("oom", "too big", over=3.0, config="1f1b TP=1 PP=8 DP=1 m=32")
    back = pickle.loads(pickle.dumps(r))
    assert (back.kind, back.reason, back.over, back.config) == (r.kind, r.reason, r.over, r.config)
    again = r.again()
    assert again is not r and again.__traceback__ is None and str(again) == str(r)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_bad_workers_are_named(bad):
    with pytest.raises(ParameterError) as e:
        plan("1.5B", "a100-80g", 8, workers=bad)
    assert e.value.param == "workers" and "positive integer" in e.value.message


def test_workers_default(monkeypatch):
    monkeypatch.setattr(workers, "_cpus", lambda: 4)
    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    assert workers.resolve_workers(None) == (2 if workers._can_fork() else 1)
    monkeypatch.setattr(workers.threading, "active_count", lambda: 2)  # another thread: no fork
    assert workers.resolve_workers(None) == 1
    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    monkeypatch.setattr(workers, "_cpus", lambda: 1)
    assert workers.resolve_workers(None) == 1
    assert workers.resolve_workers(3) == 3


def test_cli_workers(capsys):
    assert main(["plan", "--model", "1.5B", "--gpus", "8", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err and "positive integer" in err and "Traceback" not in err
    args = ["plan", "--model", "1.5B", "--gpus", "8", "--memory-budget", "6", "--json"]
    assert main(args + ["--workers", "1"]) == 0
    one = capsys.readouterr().out
    assert main(args + ["--workers", "2"]) == 0
    two = capsys.readouterr().out
    import json

    a, b = json.loads(one), json.loads(two)
    for d in (a, b):
        for k in _WORK:
            d["search"].pop(k)
    assert a == b


def test_threads_left_after_a_plan_are_none():
    before = threading.active_count()
    plan("1.5B", "a100-80g", 8, memory_budget=6 * GiB, workers=2)
    assert threading.active_count() == before, "a reader thread outlived the search"
