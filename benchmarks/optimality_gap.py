"""How close each heuristic is to optimal: every split-backward generator's bubble rate against the
exact scheduler's optimum (pipeoffload.solver) at the same placement and memory limit.

    .venv/bin/python benchmarks/optimality_gap.py [--time-limit 10] [--workers 2] [--out runs/optimality_gap.json]

Grid: (p, m) in (3, 6), (4, 8), (6, 12); costs F:B:W = 1:1:1, 1:2:1, 1:1:0.5 (comm 0) and 1:1:1 with
comm 0.1; memory limits: 1F1B's (p units) and 2p on the loop placement (v = 1), V-Min's, V-Half's
and p units on the V placement. Prints a Markdown table (README "How close is each heuristic");
cells are bubble-rate differences in percentage points, "before → after" for V-Min and V-Half
where the W refill (schedules/w_refill.py) changed them ("before": the better of the two plain
lowerings, as generated until the refill landed); '*' marks an optimum not proven within the
time limit (then the bound on the bubble is printed too). About 60 solves: ~10 min with the
defaults on 2 cores. Needs the `solver` extra. Not a CI test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipeoffload.costs import Costs
from pipeoffload.errors import ParameterError
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate
from pipeoffload.schedules.vshape import unit_peak_bound
from pipeoffload.solver import solve


def before_refill(name: str, p: int, m: int, costs: Costs) -> float:
    """V-Min's / V-Half's bubble before the W refill: the better (by longest span) of the block's
    building-block pipeline and the reference reorder."""
    from pipeoffload.ir import Placement, build_schedule
    from pipeoffload.schedules.building_block import schedule_from_block
    from pipeoffload.schedules.v_reorder import reorder_orders
    from pipeoffload.schedules.vshape import v_half_block, v_min_block

    block = {"v-min": v_min_block, "v-half": v_half_block}[name](p)
    tls = [simulate(schedule_from_block(name, block, m, p=p, m=m, v=2), costs),
           simulate(build_schedule(name, m, Placement.vshape(p), reorder_orders(block, m)), costs)]
    return min(tls, key=lambda tl: (max(tl.spans()), tl.makespan)).bubble_rate

SIZES = [(3, 6), (4, 8), (6, 12)]
COSTS = {"1:1:1": (1.0, 1.0, 1.0, 0.0), "1:2:1": (1.0, 2.0, 1.0, 0.0), "1:1:0.5": (1.0, 1.0, 0.5, 0.0),
         "1:1:1 comm .1": (1.0, 1.0, 1.0, 0.1)}


def cases(p: int) -> list[tuple[str, str, float, list[tuple[str, dict]]]]:
    """(label, placement, limit in units, heuristics as (name, generator kwargs))."""
    return [
        ("loop, limit p", "loop", p, [("zb-h1", {}), ("zb-auto", {"mem_limit": p})]),
        ("loop, limit 2p", "loop", 2 * p, [("zb-h2", {}), ("zb-auto", {"mem_limit": 2 * p})]),
        ("V, V-Min's limit", "v", unit_peak_bound("v-min", p),
         [("v-min", {}), ("zb-v", {"mem_limit": unit_peak_bound("v-min", p)})]),
        ("V, V-Half's limit", "v", unit_peak_bound("v-half", p),
         [("v-half", {}), ("zb-v", {"mem_limit": unit_peak_bound("v-half", p)})]),
        ("V, limit p", "v", p, [("zb-v", {}), ("v-zb", {})]),
    ]


def run_one(p: int, m: int, cname: str, case, time_limit: float, workers: int) -> dict:
    label, placement, limit, heuristics = case
    f, b, w, c = COSTS[cname]
    v = 2 if placement == "v" else 1
    costs = Costs(F=v * f, B=v * b, W=v * w, comm=c)
    t = time.monotonic()
    res = solve(p, m, placement=placement, costs=costs, mem_limit=limit, time_limit=time_limit,
                workers=workers)
    row = {"p": p, "m": m, "costs": cname, "case": label, "limit": limit, "optimal": res.optimal,
           "opt_bubble": res.timeline.bubble_rate, "bound": res.bubble_bound, "solve_s": time.monotonic() - t,
           "heuristics": {}, "before": {}}
    for name, kw in heuristics:
        try:
            s = generate(name, p=p, m=m, costs=costs, **kw)
        except ParameterError:  # zb-v finds no order within the tightest limits
            continue
        tl = simulate(s, costs)
        assert max(tl.peak_memory()) <= limit + 1e-9, (name, tl.peak_memory(), limit)
        row["heuristics"][name] = tl.bubble_rate
        if name in ("v-min", "v-half"):
            row["before"][name] = before_refill(name, p, m, costs)
    return row


def table(rows: list[dict]) -> str:
    out = ["| p, m | costs | placement, limit | optimum | heuristic: gap (pp) | solve s |", "|---|---|---|---|---|---|"]
    for r in rows:
        opt = f"{r['opt_bubble']:.3f}" + ("" if r["optimal"] else f"* (≥ {r['bound']:.3f})")
        gaps = ", ".join(f"{n} {_gap(r, n, b)}" for n, b in r["heuristics"].items())
        out.append(f"| {r['p']}, {r['m']} | {r['costs']} | {r['case']} ({r['limit']:g}) | {opt} | {gaps} | "
                   f"{r['solve_s']:.0f} |")
    return "\n".join(out)


def _gap(r: dict, name: str, bubble: float) -> str:
    after = f"{100 * (bubble - r['opt_bubble']):+.1f}"
    old = r.get("before", {}).get(name)
    if old is None or abs(old - bubble) < 5e-4:
        return after
    return f"{100 * (old - r['opt_bubble']):+.1f} → {after}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers per solve")
    ap.add_argument("--out", default="runs/optimality_gap.json")
    ap.add_argument("--sizes", default=None, help="e.g. 3x6,4x8 (default: the whole grid)")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")] if args.sizes else SIZES
    rows = []
    for p, m in sizes:
        for cname in COSTS:
            for case in cases(p):
                rows.append(run_one(p, m, cname, case, args.time_limit, args.workers))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
