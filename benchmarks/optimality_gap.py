"""How close each heuristic is to optimal: every split-backward generator's bubble rate against the
exact scheduler's best order (pipeoffload.solver) at the same placement and memory limit.

    .venv/bin/python benchmarks/optimality_gap.py                      # table from the stored reference
    .venv/bin/python benchmarks/optimality_gap.py --solve [--time-limit 10] [--sizes 4x8] [--costs 1:2:1]
        [--cases "V, V-Min's limit"] [--unproven]                      # (re)compute the reference

Grid: (p, m) in (3, 6), (4, 8), (6, 12); costs F:B:W = 1:1:1, 1:2:1, 1:1:0.5 (comm 0) and 1:1:1 with
comm 0.1; memory limits: 1F1B's (p units), ZB-H2's peak (2p − 1) and 2p on the loop placement (v = 1),
V-Min's, V-Half's and p units on the V placement. Each heuristic is compared at its own peak bound
(ZB-H2 at 2p − 1; at 2p the optimum may use one more unit than ZB-H2 ever does).

The reference, ``tests/data/optimality_reference.json``, holds per case the solver's best order (per
rank, tokens ``F3.5`` = kind, layer group, microbatch), its bubble rate as the timing pass gives it,
whether CP-SAT proved it optimal, the proven lower bound on the bubble, and the heuristics checked
there (name and generator kwargs). ``--solve`` re-solves the selected cases, each warm-started from
its stored order, and merges: a case keeps the better order, "proven" once any run proved it, and
the highest bound; the file is rewritten after every solve. ``tests/test_optimality_gap.py`` reads
the same file (no solver needed).

Without ``--solve``: prints the Markdown table of docs/solver.md (cells: heuristic bubble − reference
bubble in percentage points; ``*`` marks a reference not proven optimal, its bound in brackets) and
writes the heuristics' bubbles to ``--out``; ``--before FILE`` (an earlier ``--out``) prints
"before → after" where a bubble changed. Needs the `solver` extra only with ``--solve``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipeoffload.costs import Costs
from pipeoffload.errors import ParameterError
from pipeoffload.ir import OpKind, Placement, Schedule, build_schedule
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate
from pipeoffload.schedules.vshape import unit_peak_bound

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "optimality_reference.json"
SIZES = [(3, 6), (4, 8), (6, 12)]
COSTS = {"1:1:1": (1.0, 1.0, 1.0, 0.0), "1:2:1": (1.0, 2.0, 1.0, 0.0), "1:1:0.5": (1.0, 1.0, 0.5, 0.0),
         "1:1:1 comm .1": (1.0, 1.0, 1.0, 0.1)}
_KIND = {"F": OpKind.F, "B": OpKind.B, "W": OpKind.W}


def cases(p: int) -> list[tuple[str, str, float, list[tuple[str, dict]]]]:
    """(label, placement, limit in units, heuristics as (name, generator kwargs))."""
    return [
        ("loop, limit p", "loop", p, [("zb-h1", {}), ("zb-auto", {"mem_limit": p})]),
        # ZB-H2's own peak is 2p−1 (zero_bubble.zb_h2): compared there, not at 2p.
        ("loop, ZB-H2's limit 2p-1", "loop", 2 * p - 1, [("zb-h2", {}), ("zb-auto", {"mem_limit": 2 * p - 1})]),
        ("loop, limit 2p", "loop", 2 * p, [("zb-auto", {"mem_limit": 2 * p})]),
        ("V, V-Min's limit", "v", unit_peak_bound("v-min", p),
         [("v-min", {}), ("zb-v", {"mem_limit": unit_peak_bound("v-min", p)})]),
        ("V, V-Half's limit", "v", unit_peak_bound("v-half", p),
         [("v-half", {}), ("zb-v", {"mem_limit": unit_peak_bound("v-half", p)})]),
        ("V, limit p", "v", p, [("zb-v", {}), ("v-zb", {})]),
    ]


def case_costs(placement: str, cname: str) -> Costs:
    """Per-layer-group costs of a grid case: on the V placement (two groups per rank) each
    group costs the ratio's numbers times 2, so a rank's work per microbatch is the same."""
    f, b, w, c = COSTS[cname]
    v = 2 if placement == "v" else 1
    return Costs(F=v * f, B=v * b, W=v * w, comm=c)


def encode(schedule: Schedule) -> list[str]:
    """Per rank, the compute ops as tokens ``F3.5`` (kind, layer group, microbatch)."""
    return [" ".join(f"{o.kind.value}{o.stage}.{o.microbatch}" for o in lst if o.kind in _KIND.values())
            for lst in schedule.ranks]


def decode(entry: dict) -> Schedule:
    """The stored order of a reference entry as a schedule."""
    p, m = entry["p"], entry["m"]
    pl = Placement.vshape(p) if entry["placement"] == "v" else Placement.loop(p, 1)
    per_rank = []
    for line in entry["order"]:
        ops = []
        for tok in line.split():
            s, j = tok[1:].split(".")
            ops.append((_KIND[tok[0]], int(s), int(j)))
        per_rank.append(ops)
    return build_schedule("optimal", m, pl, per_rank, p=p, m=m, v=pl.max_chunks, mem_limit=entry["limit"])


def load(path: Path = REFERENCE) -> list[dict]:
    return json.loads(path.read_text())["cases"] if path.exists() else []


def save(entries: list[dict], path: Path = REFERENCE) -> None:
    entries = sorted(entries, key=_sort_key)
    for e in entries:  # an order that meets the proven bound is optimal (e.g. a bubble of 0)
        if e["bubble"] <= e["bound"] + 1e-9:
            e["optimal"] = True
    doc = {"about": "Best known orders of the optimality-gap grid (benchmarks/optimality_gap.py --solve); "
                    "'optimal': proven by CP-SAT; 'bound': proven lower bound on the bubble rate.",
           "cases": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _sort_key(e: dict) -> tuple:
    labels = [c[0] for c in cases(e["p"])]
    return (e["p"], e["m"], list(COSTS).index(e["costs"]), labels.index(e["case"]))


def solve_case(p: int, m: int, cname: str, case, time_limit: float, workers: int, old: dict | None) -> dict:
    """Solve one case and merge with ``old``. The solver starts from the best of ``old``'s
    order and the case's heuristics; when a heuristic's order beats the solver's, that
    order becomes the reference ("source" says which; it is then not proven optimal)."""
    from pipeoffload.solver import solve

    label, placement, limit, heuristics = case
    costs = case_costs(placement, cname)
    known = [("stored", decode(old))] if old else []
    for name, kw in heuristics:
        try:
            known.append((name, generate(name, p=p, m=m, costs=costs, **kw)))
        except ParameterError:
            continue
    timed = [(simulate(sch, costs).bubble_rate, src, sch) for src, sch in known
             if max(simulate(sch, costs).peak_memory()) <= limit + 1e-9]
    hint = min(timed, key=lambda x: x[0]) if timed else None
    t = time.monotonic()
    res = solve(p, m, placement=placement, costs=costs, mem_limit=limit, time_limit=time_limit,
                workers=workers, hint=hint[2] if hint else None)
    wall = time.monotonic() - t
    bubble, source, sched = res.timeline.bubble_rate, "solver", res.schedule
    if hint is not None and hint[0] < bubble - 1e-9:
        bubble, source, sched = hint[0], (old.get("source", "solver") if hint[1] == "stored" else hint[1]), hint[2]
    proven = res.optimal and source == "solver"
    new = {"p": p, "m": m, "costs": cname, "case": label, "placement": placement, "limit": limit,
           "cost_values": {"F": costs.F, "B": costs.B, "W": costs.W, "comm": costs.comm},
           "heuristics": [[n, kw] for n, kw in heuristics],
           "bubble": round(bubble, 9), "optimal": proven, "source": source,
           "bound": round(min(res.bubble_bound, bubble), 9),
           "solve_s": round(wall, 1), "time_limit": time_limit, "order": encode(sched)}
    if old is None:
        return new
    out = dict(new if new["bubble"] < old["bubble"] - 1e-9 else old)
    for k in ("heuristics", "cost_values", "solve_s"):
        out[k] = new[k]
    out["optimal"] = old["optimal"] or (new["optimal"] and not old["bubble"] < new["bubble"] - 1e-9)
    out["bound"] = out["bubble"] if out["optimal"] else max(old["bound"], new["bound"])
    out["time_limit"] = max(old["time_limit"], time_limit)
    out.setdefault("source", "solver")
    return out


def heuristic_rows(entries: list[dict]) -> list[dict]:
    """Each case's heuristics timed: bubble and peak (checked against the limit)."""
    rows = []
    for e in entries:
        costs = case_costs(e["placement"], e["costs"])
        got = {}
        for name, kw in e["heuristics"]:
            try:
                s = generate(name, p=e["p"], m=e["m"], costs=costs, **kw)
            except ParameterError:  # a generator that finds no order within this limit
                continue
            tl = simulate(s, costs)
            assert max(tl.peak_memory()) <= e["limit"] + 1e-9, (name, tl.peak_memory(), e["limit"])
            got[name] = tl.bubble_rate
        rows.append({"p": e["p"], "m": e["m"], "costs": e["costs"], "case": e["case"], "heuristics": got})
    return rows


def table(entries: list[dict], rows: list[dict], before: list[dict] | None = None) -> str:
    old = {(r["p"], r["m"], r["costs"], r["case"]): r["heuristics"] for r in before or []}
    out = ["| p, m | costs | placement, limit | best known | heuristic: gap (pp) |", "|---|---|---|---|---|"]
    for e, r in zip(entries, rows):
        ref = e["bubble"]
        opt = f"{ref:.3f}" + ("" if e["optimal"] else f"* (≥ {e['bound']:.3f})")
        prev = old.get((e["p"], e["m"], e["costs"], e["case"]), {})
        cells = []
        for name, b in r["heuristics"].items():
            after = _pp(b - ref)
            if name in prev and abs(prev[name] - b) >= 5e-4:
                after = f"{_pp(prev[name] - ref)} → {after}"
            elif prev and name not in prev:  # the generator found no order there before
                after = f"none → {after}"
            cells.append(f"{name} {after}")
        out.append(f"| {e['p']}, {e['m']} | {e['costs']} | {e['case']} ({e['limit']:g}) | {opt} | "
                   f"{', '.join(cells)} |")
    return "\n".join(out)


def _pp(diff: float) -> str:
    """A bubble difference in percentage points, one decimal, never "-0.0"."""
    x = round(100 * diff, 1)
    return f"{x + 0.0:+.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solve", action="store_true", help="re-solve the selected cases and update --reference")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per solve")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers per solve")
    ap.add_argument("--sizes", default=None, help="e.g. 3x6,4x8 (default: the whole grid)")
    ap.add_argument("--costs", default=None, help=f"comma-separated among {list(COSTS)}")
    ap.add_argument("--cases", default=None, help="comma-separated case labels, e.g. \"V, V-Min's limit\" (use ;)")
    ap.add_argument("--unproven", action="store_true", help="with --solve: only cases not yet proven optimal")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--out", default="runs/optimality_gap.json", help="heuristic bubbles (table mode)")
    ap.add_argument("--before", default=None, help="an earlier --out, for 'before → after' cells")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")] if args.sizes else SIZES
    cnames = args.costs.split(",") if args.costs else list(COSTS)
    labels = args.cases.split(";") if args.cases else None
    for c in cnames:
        if c not in COSTS:
            raise ParameterError("costs", f"unknown cost ratio {c!r}; valid: {list(COSTS)}")
    stored = {(e["p"], e["m"], e["costs"], e["case"]): e for e in load(args.reference)}
    if args.solve:
        for p, m in sizes:
            for cname in cnames:
                for case in cases(p):
                    key = (p, m, cname, case[0])
                    if (labels and case[0] not in labels) or (args.unproven and stored.get(key, {}).get("optimal")):
                        continue
                    stored[key] = solve_case(p, m, cname, case, args.time_limit, args.workers, stored.get(key))
                    save(list(stored.values()), args.reference)
                    e = stored[key]
                    print(f"{p},{m} {cname} {case[0]}: {e['bubble']:.4f} optimal={e['optimal']} "
                          f"bound={e['bound']:.4f} ({e['solve_s']} s)", flush=True)
        return
    entries = sorted((e for e in stored.values() if (e["p"], e["m"]) in sizes and e["costs"] in cnames
                      and (not labels or e["case"] in labels)), key=_sort_key)
    rows = heuristic_rows(entries)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    before = json.loads(Path(args.before).read_text()) if args.before else None
    print(table(entries, rows, before))


if __name__ == "__main__":
    main()
