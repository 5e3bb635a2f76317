"""DualPipeV against DeepSeek's published formulas (docs/schedules.md#dualpipev): the busiest
rank's bubble and the per-rank peak, ours (simulated) and published, on a grid; then the
peak with offload in the activation window and in both windows; then the makespan with
the overlapped pairs run as one op and as two. Pure Python, a second.

    PYTHONPATH=src python benchmarks/dualpipev_table.py
"""

from __future__ import annotations

from pipeoffload.costs import Costs
from pipeoffload.ir import without_overlap
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate

# per chunk, in DualPipe's terms: F, full backward B, W (ours: B = full - W)
COSTS = [(1.0, 2.0, 1.0), (1.0, 3.0, 1.0), (1.0, 2.5, 0.5)]


def main() -> None:
    print("| p | m | F : B(full) : W | bubble ours | published (p−1)(F&B+B−3W) | peak ours (chunks) "
          "| published 2p+1 |")
    print("|---|---|---|---|---|---|---|")
    for p in (2, 4, 8):
        for m in (2 * p, 4 * p):
            for f, full, w in COSTS:
                s = generate("dualpipev", p=p, m=m)
                tl = simulate(s, Costs(F=2 * f, B=2 * (full - w), W=2 * w))
                ours = max(tl.spans()) - m * 2 * (f + full)
                pub = (p - 1) * ((f + full) + full - 3 * w)
                peak = 2 * max(tl.peak_memory())
                print(f"| {p} | {m} | {f:g} : {full:g} : {w:g} | {ours:g} | {pub:g} | {peak:g} | {2 * p + 1} |")
    print()
    print("| p | m | transfer (× F+B+W) | peak no offload | activation window C=1 | C=2 | C=2 + stash window | "
          "makespan + |")
    print("|---|---|---|---|---|---|---|---|")
    for p in (2, 4, 8):
        m = 4 * p
        s = generate("dualpipev", p=p, m=m)
        base = simulate(s)
        for t in (0.0, 0.25, 0.5):
            row, grow = [2 * max(base.peak_memory())], 0.0
            for c, stash in ((1, False), (2, False), (2, True)):
                res = plan_offload(s, base, offload_chunks=c, stash=stash, offload_time=t, on_infeasible="skip")
                row.append(2 * max(res.peak))
                grow = max(grow, res.timeline.makespan / base.makespan - 1)
            print(f"| {p} | {m} | {t:g} | " + " | ".join(f"{x:g}" for x in row) + f" | {100 * grow:.1f}% |")
    print()
    print("| p | m | comm | makespan, pairs as one op | as two ops (the runtime's default) |")
    print("|---|---|---|---|---|")
    for p in (2, 4, 8):
        s = generate("dualpipev", p=p, m=4 * p)
        for comm in (0.0, 0.2):
            c = Costs(comm=comm)
            print(f"| {p} | {4 * p} | {comm:g} | {simulate(s, c).makespan:g} | "
                  f"{simulate(without_overlap(s), c).makespan:g} |")


if __name__ == "__main__":
    main()
