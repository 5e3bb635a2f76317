"""Speed and quality of the searching schedules at scale.

Zero bubble (issue 3 target): zb-auto and zb-v at p=32, m=256 must generate
(validation included) and time in under 10 s each. Run:

    python benchmarks/bench_schedules.py

Prints, per schedule: op count, generation (+ validation) time, timing-pass time,
the makespan bubble rate (Timeline.bubble_rate) and the ZB paper's iteration
bubble (longest rank span), and the peak memory.
"""

from __future__ import annotations

import time

from pipeoffload.costs import Costs
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate

LIMIT_S = 10.0


def bench(name: str, p: int, m: int, costs: Costs, **kw) -> float:
    t0 = time.perf_counter()
    sched = generate(name, p, m, costs=costs, **kw)  # includes validation
    t1 = time.perf_counter()
    tl = simulate(sched, costs)
    t2 = time.perf_counter()
    span = max(ev[-1].end - ev[0].start for ev in (tl.rank_events(r) for r in range(tl.num_ranks)))
    ops = sum(len(r) for r in sched.ranks)
    extra = f" {kw}" if kw else ""
    print(
        f"{name:<8}{extra:<18} p={p} m={m} ops={ops:>6}  generate+validate {t1 - t0:5.2f}s  "
        f"timing {t2 - t1:4.2f}s  total {t2 - t0:5.2f}s  bubble {tl.bubble_rate:.4f}  "
        f"iteration bubble {1 - max(tl.busy()) / span:.4f}  peak {max(tl.peak_memory()):g}"
    )
    return t2 - t0


def zero_bubble() -> None:
    print("== zero bubble, p=32 m=256 ==")
    slow = []
    for label, costs in (
        ("unit costs", Costs()),
        ("ZB paper 1.5B costs", Costs(F=18.522, B=18.086, W=9.337, comm=0.601)),
        ("unequal stages",
         Costs(comm=0.05, stage_costs=tuple((1.0 + 0.02 * r, 1.1, 0.7 + 0.01 * r) for r in range(32)))),
    ):
        print(f"-- {label}")
        for name, kw in (("zb-h1", {}), ("zb-h2", {}), ("zb-auto", {}), ("zb-auto", {"mem_limit": 64}), ("zb-v", {})):
            t = bench(name, 32, 256, costs, **kw)
            if name in ("zb-auto", "zb-v") and t > LIMIT_S:
                slow.append((name, label, t))
    print("target (zb-auto, zb-v < 10 s each):", "met" if not slow else f"MISSED {slow}")


if __name__ == "__main__":
    zero_bubble()
