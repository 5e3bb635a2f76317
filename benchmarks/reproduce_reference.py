"""Reproduce the published tables (docs/algorithms.md#8-published-figures-the-tests-check) with the simulator and print them as Markdown.

Run: .venv/bin/python benchmarks/reproduce_reference.py
Bubble rates use the ZB paper's metric (largest per-rank span; see pipeoffload.timeline).
"""

from __future__ import annotations

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate


def cell(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas | None = None, **kw) -> str:
    memory = memory or MemoryDeltas()
    tl = simulate(generate(name, p=p, m=m, costs=costs, memory=memory, **kw), costs, memory)
    return f"{tl.bubble_rate:.3f} / {max(tl.peak_memory()):g}"


def unit_grid() -> None:
    print("### Unit-cost grid, p = 4 (bubble / peak units)\n")
    print("| m | 1F1B | ZB-1p | ZB-2p | ZB-V | V-Half | V-Min |")
    print("|---|---|---|---|---|---|---|")
    unit, per_chunk = Costs(), Costs(F=2, B=2, W=2)  # V schedules: 1 per chunk
    for m in (8, 16, 32):
        row = [cell("1f1b", 4, m, unit), cell("zb-auto", 4, m, unit), cell("zb-auto", 4, m, unit, mem_limit=8),
               cell("zb-v", 4, m, per_chunk), cell("v-half", 4, m, per_chunk), cell("v-min", 4, m, per_chunk)]
        print(f"| {m} | " + " | ".join(row) + " |")


def published_row() -> None:
    print("\n### ZB paper row: 1.5B model, p = 8, m = 24, measured costs (bubble rate)\n")
    c = Costs(F=18.522, B=18.086, W=9.337, comm=0.601)
    mem = MemoryDeltas(F=201216, B=-127488, W=-73728)
    runs = [("1F1B", "1f1b", {}), ("ZB-H1", "zb-h1", {}), ("ZB-H2", "zb-h2", {}),
            ("ZB-1p", "zb-auto", {"mem_limit": 1609728}), ("ZB-2p", "zb-auto", {"mem_limit": 3219456})]
    print("| " + " | ".join(r[0] for r in runs) + " |")
    print("|" + "---|" * len(runs))
    vals = []
    for _, name, kw in runs:
        tl = simulate(generate(name, p=8, m=24, costs=c, memory=mem, **kw), c, mem)
        vals.append(f"{tl.bubble_rate:.4f}")
    print("| " + " | ".join(vals) + " |")


def gis_rows() -> None:
    print("\n### Group-interleaved, p = 8, m = 32, unit costs (bubble / peak chunk units)\n")
    print("| v, g | ours | published |")
    print("|---|---|---|")
    for v, g, ref in ((2, 8, ".068"), (2, 4, ".086"), (4, 8, ".035"), (4, 4, ".063")):
        tl = simulate(generate("group-interleaved", p=8, m=32, v=v, g=g))
        print(f"| v={v}, g={g} | {tl.bubble_rate:.3f} / {max(tl.peak_memory()) * v:g} | {ref} / {g * v + 8 - g} |")


def selective_offload() -> None:
    print("\n### Selective offload, group-interleaved p = 8, m = 32, instantaneous transfers (peak chunk units)\n")
    print("| v, g | C = 0, 1, 2, … | published |")
    print("|---|---|---|")
    for v, g, ref in ((2, 4, "12 → 5 → 1"), (4, 4, "20 → 13 → 9 → 5 → 1"), (4, 8, "32 → 24 → 16 → 8")):
        sched = generate("group-interleaved", p=8, m=32, v=v, g=g)
        peaks = [max(plan_offload(sched, offload_chunks=c).peak) * v for c in range(v + 1)]
        print(f"| v={v}, g={g} | {' → '.join(f'{x:g}' for x in peaks)} | {ref} |")


if __name__ == "__main__":
    unit_grid()
    published_row()
    gis_rows()
    selective_offload()
