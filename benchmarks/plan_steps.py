"""Where ``pipeoffload plan`` spends its CPU time, step by step, in-process (docs/planner.md §4b).

Each step is metered with ``time.process_time`` around its calls, each second counted once,
in the innermost metered step that holds it ("rest": ``plan()`` outside every metered step).
A sampling profiler misleads here and cProfile's per-call overhead inflates the many-call
paths several-fold (docs/planner.md §4, 17.); this is the measure the docs quote.

    python benchmarks/plan_steps.py --model 98.5B --hardware a100-80g --gpus 64
    python benchmarks/plan_steps.py --model 98.5B --gpus 64 --timings 3   # + the plan's timings replayed

``--timings N`` then replays the plan's timings (``Simulator._time``, inputs captured from the
run) on a fresh ``Simulator``, N times, and prints each pass's CPU seconds: the timing pass
alone, without the generators' noise. Compare two trees by running each alternately
(``PYTHONPATH=TREE/src``) in one sitting, and say the load (``uptime``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

# appended, not prepended: a PYTHONPATH naming another tree (the one to compare with) comes first
sys.path.append(str(Path(__file__).resolve().parents[1] / "src"))

#: (module, attribute path, label): the steps metered.
STEPS = [
    ("pipeoffload.planner.simulate", "Simulator._generate", "generators"),
    ("pipeoffload.planner.simulate", "Simulator._time", "timing pass"),
    ("pipeoffload.schedules.hole_fill", "fill_holes", "hole filling"),
    ("pipeoffload.schedules.zb_auto", "auto_candidates", "zb-auto greedy"),
    ("pipeoffload.planner.simulate", "Simulator.offload_bounds", "offload bounds"),
    ("pipeoffload.planner.simulate", "Simulator.offload", "offload plans"),
    ("pipeoffload.planner.simulate", "order_peaks", "untimed peaks"),
    ("pipeoffload.planner.simulate", "Simulator.peaks", "Simulator.peaks' own"),
    ("pipeoffload.planner.sharding", "CostTable.sharded", "per-GPU costs"),
    ("pipeoffload.planner.simulate", "_extrapolate", "extrapolation"),
    ("pipeoffload.timeline", "Timeline.busy", "Timeline.busy"),
    ("pipeoffload.planner.simulate", "dp_exposed", "DP tail"),
    ("pipeoffload.planner.simulate", "pipeline_bound", "pipeline_bound"),
]


class Meter:
    """Exclusive CPU seconds and calls per label (a call's time minus its metered callees')."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self._stack: list[list[Any]] = []  # [label, time the label last resumed]

    def wrap(self, f: Callable, label: str) -> Callable:
        @functools.wraps(f)
        def metered(*args: Any, **kwargs: Any) -> Any:
            now = time.process_time()
            if self._stack:
                outer = self._stack[-1]
                self.seconds[outer[0]] += now - outer[1]
            self._stack.append([label, now])
            self.calls[label] += 1
            try:
                return f(*args, **kwargs)
            finally:
                end = time.process_time()
                lab, since = self._stack.pop()
                self.seconds[lab] += end - since
                if self._stack:
                    self._stack[-1][1] = end
        return metered

    def install(self, module: str, attr: str, label: str) -> None:
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, self.wrap(getattr(owner, name), label))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="98.5B")
    ap.add_argument("--hardware", default="a100-80g")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--timings", type=int, default=0, metavar="N", help="replay the plan's timings N times")
    args = ap.parse_args(argv)

    t0 = time.process_time()
    import pipeoffload.commands.plan  # noqa: F401 - what `pipeoffload plan` imports
    from pipeoffload.planner import simulate as sim_mod
    from pipeoffload.planner.search import plan
    t1 = time.process_time()

    captured: list[tuple] = []
    problems: list[sim_mod.Simulator] = []
    meter = Meter()
    for module, attr, label in STEPS:
        meter.install(module, attr, label)
    if args.timings:  # capture the timings' inputs (outside the meters: the wrapper sits outermost)
        timed = sim_mod.Simulator._time
        init = sim_mod.Simulator.__init__

        def capture(self, schedule, sh):
            captured.append((schedule, sh))
            return timed(self, schedule, sh)

        def keep(self, *a, **k):
            init(self, *a, **k)
            problems.append(self)

        sim_mod.Simulator._time, sim_mod.Simulator.__init__ = capture, keep
    meter._stack.append(["rest", time.process_time()])
    plan(args.model, args.hardware, args.gpus, workers=1)  # the search alone: a helper's CPU is not metered
    end = time.process_time()
    meter.seconds["rest"] += end - meter._stack.pop()[1]
    print(f"{Path(pipeoffload.commands.plan.__file__).parents[2]}: {args.model} on {args.gpus} {args.hardware}")
    print(f"imports {t1 - t0:.3f} s, plan() {end - t1:.3f} s of CPU")
    print(f"{'step':24s} {'calls':>6s} {'CPU s':>7s}")
    for label, sec in sorted(meter.seconds.items(), key=lambda x: -x[1]):
        print(f"{label:24s} {meter.calls[label] or '':>6} {sec:7.3f}")
    if args.timings:
        sim_mod.Simulator._time, sim_mod.Simulator.__init__ = timed, init
        base = problems[0]
        passes = []
        for _ in range(args.timings):
            fresh = sim_mod.Simulator(base.problem, base.costs)
            t = time.process_time()
            for schedule, sh in captured:
                fresh._time(schedule, sh)
            passes.append(time.process_time() - t)
        print(f"the {len(captured)} timings replayed: " + ", ".join(f"{x:.3f}" for x in passes) + " s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
