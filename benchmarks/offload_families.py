"""Peak activation memory per schedule family with and without offload (README "Offload for every family").

    .venv/bin/python benchmarks/offload_families.py [-p 8] [-m 32]

Unit costs (F = B = W per rank), unit memory (F +1, B 0, W −1: a chunk's activations stay
until its W), comm 0. For each family: the peak without offload; with the offload pass's
activation window (F → B) planned with its defaults (auto C, "skip"); and with the B → W stash
window added (``stash=True``, split-backward families only). Two transfer speeds: free
(``offload_time = 0``) and k = 1 (a round trip as long as the chunk's F + B + W, i.e. one
one-way copy ``offload_time = k/2``, docs/algorithms.md §5.1). Cells: peak in units (one
rank's activations for one microbatch) and, in brackets, the bubble rate after offload.
Pure Python, a few seconds per family.
"""

from __future__ import annotations

import argparse

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate

#: (label, generator name, keyword arguments, has a B/W split)
FAMILIES = [
    ("1F1B", "1f1b", {}, False),
    ("interleaved 1F1B (v=2)", "interleaved-1f1b", {"v": 2}, False),
    ("group-interleaved (g=p/2)", "group-interleaved", {"g": None}, False),
    ("ZB-H1", "zb-h1", {}, True),
    ("ZB-H2", "zb-h2", {}, True),
    ("zb-auto (limit p)", "zb-auto", {"mem_limit": None}, True),
    ("ZB-V", "zb-v", {}, True),
    ("V-Half", "v-half", {}, True),
    ("V-Min", "v-min", {}, True),
    ("V-ZB", "v-zb", {}, True),
]
SPEEDS = [("free", 0.0), ("k = 1", 0.5)]


def cell(sched, tl, offload_time: float, stash: bool) -> str:
    res = plan_offload(sched, tl, auto=True, offload_time=offload_time, stash=stash, comm=0.0)
    bubble = res.timeline.bubble_rate
    return f"{max(res.peak):g} ({bubble:.3f})"


def row(label: str, name: str, kw: dict, split: bool, p: int, m: int) -> str:
    kw = dict(kw)
    if "g" in kw:
        kw["g"] = max(1, p // 2)
    if "mem_limit" in kw:
        kw["mem_limit"] = p
    costs = Costs(F=1.0, B=1.0, W=1.0)
    sched = generate(name, p=p, m=m, costs=costs, **kw)
    tl = simulate(sched, costs, MemoryDeltas())
    cells = [f"{max(tl.peak_memory()):g} ({tl.bubble_rate:.3f})"]
    for _, t in SPEEDS:
        cells.append(cell(sched, tl, t, False))
        cells.append(cell(sched, tl, t, True) if split else "—")
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", type=int, default=8)
    ap.add_argument("-m", type=int, default=32)
    args = ap.parse_args()
    head = ["no offload"] + [f"{w}, {s}" for s, _ in SPEEDS for w in ("F→B", "F→B + B→W")]
    print(f"p = {args.p}, m = {args.m}; peak in units (bubble rate)\n")
    print("| family | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(head))
    for label, name, kw, split in FAMILIES:
        print(row(label, name, kw, split, args.p, args.m), flush=True)


if __name__ == "__main__":
    main()
