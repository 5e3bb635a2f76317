"""How close the heuristic offload pass is to the exact scheduler that also decides offload.

    PYTHONPATH=src .venv/bin/python benchmarks/offload_gap.py             # the table (docs/solver.md)
    PYTHONPATH=src .venv/bin/python benchmarks/offload_gap.py --solve [--time-limit 5] [--sizes 3x6]
        [--costs 1:2:1] [--links 0.5] [--unproven | --missing]         # (re)compute the reference (solver extra)

Grid: the optimality reference's (benchmarks/optimality_gap.py: p, m = 3, 6 / 4, 8 / 6, 12; F:B:W =
1:1:1, 1:2:1, 1:1:0.5, 1:1:1 with comm 0.1; its six placement/limit cases) with each memory limit
lowered by one unit (one whole-stage forward's activations: below every no-offload peak at that
limit; cases that then share placement and limit are merged) and three host links: a one-way copy of
a layer group's activations for one microbatch takes 0.25, 0.5 or 1 × that group's F+B+W, two ranks
share a link (one copy per direction at a time), no solo speed-up (solo_factor 1, the solver's link).
Memory: the papers' units (F +1, B 0, W −1 per device-stage). Only the F→B window is offloaded (what
the solver models).

Exact: ``pipeoffload.solver.solve(..., offload=SolverOffload(v, link, 2))``: which activations leave,
when each copy starts and returns, and the F/B/W order, under the limit; proven optimal or with its
bound. Heuristic: :func:`heuristic` — the best, within the limit, of the placement's generators
(loop: 1F1B, ZB-H1, ZB-H2, zb-auto at the grid's limits and at this one; V: V-Min, V-Half, V-ZB,
ZB-V at the grid's limits and at this one), each timed and given to the offload pass (``plan_offload``) for
every C with "skip" and "delay" and in the pass's limit mode (``mem_limit``; ``--no-limit-mode``
leaves it out), and on the loop placement the rank window search (``best_limited_plan``: per-rank
warm-up and W deferral chosen with the limit mode; ``--no-order-search`` leaves it out, the
"before" of docs/solver.md). Cells: the exact bubble rate and the heuristic's gap
in percentage points; "none": nothing within the limit. ``--missing``: re-solve only the cases with
no solution stored; ``--rows``: reuse an earlier ``--out`` instead of running the heuristic.

The reference, ``tests/data/offload_gap_reference.json``, holds per case the
solver's bubble rate, status ("optimal" or "feasible" at the time limit, or "none": no solution
found in time) and proven lower bound on the bubble; ``--solve`` merges (better bubble wins,
"optimal" sticks, highest bound kept) and rewrites it after each solve. ``tests/test_offload_gap.py`` re-solves a small sample (CI).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from optimality_gap import COSTS, SIZES, case_costs, cases

from pipeoffload.costs import Costs
from pipeoffload.errors import ParameterError
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.offload_search import best_limited_plan
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "offload_gap_reference.json"
LINKS = (0.25, 0.5, 1.0)
LINK_GROUP = 2


def offload_cases(p: int) -> list[tuple[str, str, float]]:
    """(label, placement, limit) of the grid's cases at one unit less, merged where equal."""
    out, seen = [], {}
    for label, placement, limit, _ in cases(p):
        key = (placement, limit - 1)
        if key in seen:
            continue
        seen[key] = True
        out.append((f"{label} − 1", placement, limit - 1))
    return out


def generators(p: int, placement: str, limit: float) -> list[tuple[str, dict]]:
    """The generators the heuristic starts from (module docstring)."""
    lims = sorted({c[2] for c in cases(p) if c[1] == placement} | {limit})
    if placement == "loop":
        return [("1f1b", {}), ("zb-h1", {}), ("zb-h2", {})] + [("zb-auto", {"mem_limit": x}) for x in lims]
    return [("v-min", {}), ("v-half", {}), ("v-zb", {})] + [("zb-v", {"mem_limit": x}) for x in lims]


def heuristic(p: int, m: int, costs: Costs, placement: str, limit: float, link: float,
              limit_mode: bool = True, order_search: bool = True) -> tuple[float, str, object] | None:
    """The lowest bubble rate the generators + offload pass reach within ``limit``, how
    (generator, C, mode) and the compute-only schedule; None when no combination fits.
    ``order_search`` (loop placement, with the limit mode): also the rank window search
    (``best_limited_plan``)."""
    best = None
    for name, kw in generators(p, placement, limit):
        try:
            s = generate(name, p=p, m=m, costs=costs, **kw)
        except ParameterError:
            continue
        tl = simulate(s, costs)
        tries = [(c, {"on_infeasible": mode}) for c in range(s.chunks + 1) for mode in ("skip", "delay")]
        if limit_mode:
            tries += [(c, {"mem_limit": limit}) for c in range(1, s.chunks + 1)]
        for c, kw2 in tries:
            try:
                res = plan_offload(s, tl, offload_chunks=c, offload_time=link, link_group=LINK_GROUP,
                                   solo_factor=1.0, comm=costs.comm, **kw2)
            except ParameterError:
                continue
            if max(res.peak) > limit + 1e-9:
                continue
            how = f"{name}{''.join(f' {k}={v}' for k, v in kw.items())}, C={c}, " + \
                  ("limit" if "mem_limit" in kw2 else kw2["on_infeasible"])
            b = res.timeline.bubble_rate
            if best is None or b < best[0] - 1e-12:
                best = (b, how, s)
    if placement == "loop" and limit_mode and order_search:
        found = best_limited_plan(p, m, limit, costs=costs, offload_time=link, link_group=LINK_GROUP,
                                  solo_factor=1.0)
        if found is not None and (best is None or found.bubble_rate < best[0] - 1e-12):
            warm, defer = (",".join(map(str, x)) for x in found.windows)
            fill = ", holes filled, C=0" if found.filled else ", C=1"
            best = (found.bubble_rate, f"rank-windows warmup={warm} defer={defer}{fill}, limit",
                    found.result.schedule.compute_only())
    return best


def solve_case(p: int, m: int, cname: str, case, link: float, time_limit: float, workers: int,
               old: dict | None) -> dict:
    """Solve one case (the solver starts from the offload pass's limit mode, its own hint)
    and merge with ``old``."""
    from pipeoffload.solver import SolverOffload, solve

    label, placement, limit = case
    costs = case_costs(placement, cname)
    v = 2 if placement == "v" else 1
    t = time.monotonic()
    try:
        res = solve(p, m, placement=placement, costs=costs, mem_limit=limit, time_limit=time_limit,
                    workers=workers, offload=SolverOffload(v, link, LINK_GROUP))
        assert max(res.offload.peak) <= limit + 1e-9, (res.offload.peak, limit)
        new = {"bubble": round(res.timeline.bubble_rate, 9), "status": res.status,
               "bound": round(min(res.bubble_bound, res.timeline.bubble_rate), 9),
               "transfers": len(res.offload.transfers)}
    except ParameterError as e:  # nothing found in time (or proven infeasible)
        new = {"bubble": None, "status": "infeasible" if "proved" in str(e) else "none", "bound": None,
               "transfers": 0}
    new.update({"p": p, "m": m, "costs": cname, "case": label, "placement": placement, "limit": limit,
                "link": link, "solve_s": round(time.monotonic() - t, 1), "time_limit": time_limit})
    if old is None or old.get("bubble") is None:
        return new
    if new["bubble"] is None or old["bubble"] <= new["bubble"] + 1e-9:
        out = dict(old, solve_s=new["solve_s"])
        if new["status"] == "optimal" and abs(old["bubble"] - new["bubble"]) <= 1e-9:
            out["status"] = "optimal"
    else:
        out = new
    out["bound"] = max(x for x in (old["bound"], new["bound"], 0.0) if x is not None)
    out["bound"] = min(out["bound"], out["bubble"])
    if out["status"] == "optimal":
        out["bound"] = out["bubble"]
    out["time_limit"] = max(old["time_limit"], time_limit)
    return out


def _key(e: dict) -> tuple:
    labels = [c[0] for c in offload_cases(e["p"])]
    return (e["p"], e["m"], list(COSTS).index(e["costs"]), labels.index(e["case"]), e["link"])


def load(path: Path = REFERENCE) -> list[dict]:
    return json.loads(path.read_text())["cases"] if path.exists() else []


def save(entries: list[dict], path: Path = REFERENCE) -> None:
    doc = {"about": "The exact scheduler with offload on the offload-gap grid (benchmarks/offload_gap.py "
                    "--solve); 'status': optimal (proven) / feasible (time limit) / none (no solution in "
                    "time); 'bound': proven lower bound on the bubble rate.",
           "cases": sorted(entries, key=_key)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def rows(entries: list[dict], limit_mode: bool = True, order_search: bool = True) -> list[dict]:
    """Each stored case with the heuristic's result added."""
    out = []
    for e in entries:
        h = heuristic(e["p"], e["m"], case_costs(e["placement"], e["costs"]), e["placement"], e["limit"], e["link"],
                      limit_mode, order_search)
        out.append({**{k: e[k] for k in ("p", "m", "costs", "case", "link")},
                    "heuristic": None if h is None else round(h[0], 9), "how": None if h is None else h[1]})
    return out


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.3f}"


def _gap(h: float | None, ref: float | None) -> str:
    if h is None:
        return "none"
    return "—" if ref is None else f"{round(100 * (h - ref), 1) + 0.0:+.1f}"


def _cell(e: dict, r: dict, old: dict) -> str:
    """One link's cell: the exact bubble (✓ proven, * not: its bound in brackets) and the
    heuristic's gap in points ("a → b": before → after); against the better of the two
    where the heuristic beat an unproven solve."""
    ref = e["bubble"]
    if r["heuristic"] is not None and (ref is None or r["heuristic"] < ref):
        ref = r["heuristic"]
    if ref is None:
        head = "none"
    elif e["status"] == "optimal":
        head = f"{ref:.3f} ✓"
    else:
        head = f"{ref:.3f}* (≥ {(e['bound'] or 0.0):.3f})"
    gap = _gap(r["heuristic"], ref)
    k = (e["p"], e["m"], e["costs"], e["case"], e["link"])
    if k in old and old[k] != r["heuristic"]:
        gap = f"{_gap(old[k], ref)} → {gap}"
    return f"{head}: {gap}"


def table(entries: list[dict], got: list[dict], before: list[dict] | None = None) -> str:
    """The Markdown table of docs/solver.md, one row per case, one column per link
    (``before``: an earlier ``--out``, for "a → b")."""
    old = {(r["p"], r["m"], r["costs"], r["case"], r["link"]): r["heuristic"] for r in before or []}
    links = sorted({e["link"] for e in entries})
    out = ["| p, m | costs | placement, limit | " + " | ".join(f"link {x:g}" for x in links) + " |",
           "|---|---|---|" + "---|" * len(links)]
    by_case: dict = {}
    for e, r in zip(entries, got):
        by_case.setdefault((e["p"], e["m"], e["costs"], e["case"], e["limit"]), {})[e["link"]] = _cell(e, r, old)
    for (p, m, c, case, limit), cells in by_case.items():
        out.append(f"| {p}, {m} | {c} | {case} ({limit:g}) | " + " | ".join(cells.get(x, "") for x in links) + " |")
    return "\n".join(out)


def summary(entries: list[dict], got: list[dict]) -> str:
    """One line: how many cases the solver proved, and the heuristic's gaps to the best known."""
    n = len(entries)
    st = {k: sum(e["status"] == k for e in entries) for k in ("optimal", "feasible", "none")}
    gaps = []
    for e, r in zip(entries, got):
        refs = [x for x in (e["bubble"], r["heuristic"]) if x is not None]
        if r["heuristic"] is not None:
            gaps.append(r["heuristic"] - min(refs))
    found = len(gaps)
    mean = sum(gaps) / found if found else 0.0
    return (f"{n} cases; exact: {st['optimal']} proven optimal, {st['feasible']} feasible at the time limit, "
            f"{st['none']} nothing found; heuristic: a plan within the limit in {found} (none in {n - found}), "
            f"gap to the best known: mean {100 * mean:.1f} pp, max {100 * max(gaps, default=0.0):.1f} pp, "
            f"≤ 1 pp in {sum(g <= 0.01 + 1e-12 for g in gaps)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solve", action="store_true", help="(re)solve the selected cases and update --reference")
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds per solve")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers per solve")
    ap.add_argument("--sizes", default=None, help="e.g. 3x6,4x8 (default: the whole grid)")
    ap.add_argument("--costs", default=None, help=f"comma-separated among {list(COSTS)}")
    ap.add_argument("--links", default=None, help="comma-separated among 0.25,0.5,1")
    ap.add_argument("--unproven", action="store_true", help="with --solve: only cases not proven optimal")
    ap.add_argument("--missing", action="store_true", help="with --solve: only cases with no solution stored")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--out", default="runs/offload_gap.json", help="the heuristic's results (table mode)")
    ap.add_argument("--before", default=None, help="an earlier --out, for 'before → after' cells")
    ap.add_argument("--rows", default=None, help="reuse the heuristic's results of an earlier --out")
    ap.add_argument("--no-limit-mode", action="store_true", help="the heuristic without plan_offload's mem_limit")
    ap.add_argument("--no-order-search", action="store_true", help="the heuristic without the rank window search")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")] if args.sizes else SIZES
    cnames = args.costs.split(",") if args.costs else list(COSTS)
    links = [float(x) for x in args.links.split(",")] if args.links else list(LINKS)
    for c in cnames:
        if c not in COSTS:
            raise ParameterError("costs", f"unknown cost ratio {c!r}; valid: {list(COSTS)}")
    stored = {(e["p"], e["m"], e["costs"], e["case"], e["link"]): e for e in load(args.reference)}
    if args.solve:
        for p, m in sizes:
            for cname in cnames:
                for case in offload_cases(p):
                    for link in links:
                        key = (p, m, cname, case[0], link)
                        if args.unproven and stored.get(key, {}).get("status") == "optimal":
                            continue
                        if args.missing and stored.get(key, {}).get("bubble") is not None:
                            continue
                        stored[key] = e = solve_case(p, m, cname, case, link, args.time_limit, args.workers,
                                                     stored.get(key))
                        save(list(stored.values()), args.reference)
                        print(f"{p},{m} {cname} {case[0]} link {link:g}: {_fmt(e['bubble'])} {e['status']} "
                              f"bound={_fmt(e['bound'])} ({e['solve_s']} s)", flush=True)
        return
    entries = sorted((e for e in stored.values() if (e["p"], e["m"]) in sizes and e["costs"] in cnames
                      and e["link"] in links), key=_key)
    if args.rows:  # the heuristic's results computed earlier (an --out of the same code)
        done = {(r["p"], r["m"], r["costs"], r["case"], r["link"]): r for r in json.loads(Path(args.rows).read_text())}
        got = [done[(e["p"], e["m"], e["costs"], e["case"], e["link"])] for e in entries]
    else:
        got = rows(entries, not args.no_limit_mode, not args.no_order_search)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(got, indent=1))
    before = json.loads(Path(args.before).read_text()) if args.before else None
    print(table(entries, got, before))
    print()
    print(summary(entries, got))


if __name__ == "__main__":
    main()
