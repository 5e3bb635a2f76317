"""Record and compare what the offload pass plans, to prove a speed change changed no plan
(issue 24): ``repr`` of every :func:`~pipeoffload.passes.offload.plan_offload` result (the
schedule's op lists, the timeline's events, the transfers, skips, settings, peaks, host memory and
makespans) or of the error it raised, over a grid, hashed per case.

    python benchmarks/offload_outputs.py record FILE     # before the change
    python benchmarks/offload_outputs.py compare FILE    # after: lists every case that differs

Grid: every registry family but V-auto at p = 2, 3, 4, 6 (V-auto at 2, 4), m = p and 3p + 2
(where the generator takes them), three cost settings (unit; F:B:W = 1:2:1 with comm 0.1 and
F +2, B −0.5, W −1.5 memory; unequal groups) ; per timed schedule the pass is asked for a fifth
(a different one per schedule) of every C in 1..v × infeasibility mode × warm-ups postponed, not,
or both × two link groupings × two transfer times, then with the stash window, ``auto`` and a
memory limit;
plus the planner's own case (98.5B, a100-80g, V-ZB on TP = 1, PP = 16, m = 64, four plans).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from typing import Any, Callable, Iterator

from pipeoffload import Costs, MemoryDeltas, ParameterError, plan_offload, simulate
from pipeoffload.schedules import SCHEDULES, generate


def _schedules() -> Iterator[tuple[str, Any, Any, Any]]:
    """(name, schedule, its timeline, comm) of each timed schedule of the grid."""
    costs = [Costs(), Costs(1, 2, 1, comm=0.1)]
    for name in SCHEDULES:
        ps = (2, 4) if name == "v-auto" else (2, 3, 4, 6)
        for p, ci in itertools.product(ps, range(3)):
            for m in sorted({p, 3 * p + 2}):
                v = SCHEDULES[name].default_v
                c = costs[ci] if ci < 2 else Costs(group_costs=[(1 + 0.1 * s, 1.5 + 0.05 * s, 0.7) for s in
                                                               range(p * v)], comm=0.05)
                mem = MemoryDeltas() if ci != 1 else MemoryDeltas(2.0, -0.5, -1.5)
                kw: dict = {"v": v} if v > 1 else {}
                if name in ("zb-auto", "zb-v", "v-half", "v-min", "v-zb", "v-auto"):
                    kw.update(costs=c, memory=mem)
                try:
                    sched = generate(name, p, m, **kw)
                except ParameterError:
                    continue
                yield f"{name} p={p} m={m} c={ci}", sched, simulate(sched, c, mem), c.comm


def _settings(chunks: int, seed: int) -> Iterator[dict]:
    """Every fifth of the product of the settings (which fifth: ``seed``), then the other modes."""
    grid = itertools.product(range(1, chunks + 1), ("skip", "error", "delay"), (None, True, False), (0.25, 1.5),
                             (1, 2))
    for i, (C, mode, post, times, group) in enumerate(grid):
        if (i + seed) % 5 == 0:
            yield dict(offload_chunks=C, on_infeasible=mode, postpone_warmup=post, offload_time=times,
                       link_group=group)
    for times in (0.3, 1.0):
        yield dict(auto=True, offload_time=times)
        yield dict(offload_chunks=chunks, on_infeasible="skip", stash=True, offload_time=times)
        yield dict(offload_chunks=1, mem_limit=1.5, offload_time=times)


def _planner_case() -> Iterator[tuple[str, Callable[[], Any]]]:
    from pipeoffload.planner.search import _problem
    from pipeoffload.planner.simulate import Simulator
    from pipeoffload.planner.space import Family, PlanOptions, Split
    from pipeoffload.recompute import Recompute

    sim = Simulator(_problem("98.5B", "a100-80g", 64, None, None, None, None, PlanOptions()))
    for rc, C in itertools.product((Recompute.NONE, Recompute.ELEMENTWISE), (1, 2)):
        yield f"planner v-zb TP=1 PP=16 m=64 {rc.value} C={C}", \
            lambda rc=rc, C=C: sim.offload(Split(1, 16, 4), Family("v-zb", 2), 64, rc, C)[1]


def _describe(res: Any) -> str:
    return repr((res.schedule.ranks, res.schedule.params, res.timeline.events, res.timeline.meta, res.transfers,
                 res.skipped, res.settings, res.delayed, res.peak, res.peak_no_offload, res.host_memory,
                 res.makespan, res.makespan_no_offload, res.offloaded_chunks))


def cases() -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, thunk) of every case: the thunk returns the pass's result or raises."""
    for k, (name, sched, tl, comm) in enumerate(_schedules()):
        for kw in _settings(sched.chunks, k):
            yield f"{name} {kw}", lambda sched=sched, tl=tl, comm=comm, kw=kw: plan_offload(sched, tl, comm=comm, **kw)
    yield from _planner_case()


def run_case(thunk: Callable[[], Any]) -> str:
    try:
        text = _describe(thunk())
    except ParameterError as e:
        text = f"ParameterError {e}"
    return hashlib.sha256(text.encode()).hexdigest()


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("file")
    args = ap.parse_args()
    got = {name: run_case(thunk) for name, thunk in cases()}
    if args.mode == "record":
        with open(args.file, "w") as f:
            json.dump(got, f, indent=0, sort_keys=True)
        print(f"recorded {len(got)} cases in {args.file}")
        return 0
    with open(args.file) as f:
        want = json.load(f)
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    for k in bad:
        print(f"differs: {k}")
    print(f"{len(got)} cases, {len(bad)} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(cli())
