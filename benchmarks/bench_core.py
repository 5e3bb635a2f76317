"""Speed of generating + timing the classic schedules at scale (issue 2 target:
interleaved-1f1b at p=64, v=2, m=512 in under 2 s). Run: python benchmarks/bench_core.py"""

from __future__ import annotations

import time

from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate


def bench(name: str, **kw) -> None:
    t0 = time.perf_counter()
    sched = generate(name, **kw)  # includes validation (and its deadlock proof)
    t1 = time.perf_counter()
    tl = simulate(sched)
    t2 = time.perf_counter()
    ops = sum(len(r) for r in sched.ranks)
    print(f"{name:<18} {kw}  ops={ops:>7}  generate+validate {t1 - t0:.2f}s  timing {t2 - t1:.2f}s  "
          f"total {t2 - t0:.2f}s  bubble {tl.bubble_rate:.4f}")


if __name__ == "__main__":
    bench("interleaved-1f1b", p=64, v=2, m=512)
    bench("group-interleaved", p=64, v=2, m=512)
    bench("1f1b", p=64, m=512)
