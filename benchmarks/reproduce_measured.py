"""The planner against what the ZB paper measured on A100-80G: throughput and peak memory per row.

For every measured configuration of the ZB paper (Table 4: 1.5B on 8 GPUs, m = 24; 6.2B on 8,
14.6B on 16, 28.3B on 32 GPUs; arXiv Table 6: ZB-V against the others at equal memory, 6.2B / 16,
14.6B / 24, 28.3B / 32 GPUs; arXiv Table 7: half the microbatch; the memory columns) it sets up the
same model, microbatch, pure-PP split, schedule and m, and prints our prediction beside the published
figure with the relative error; then the largest error on the fit rows and on the held-out rows, and
whether each setting's schedules come out in the measured order. Rows, sources and caveats:
``pipeoffload.costmodel.measured`` and docs/planner.md#calibration. Pure Python, a few seconds.

    python benchmarks/reproduce_measured.py [--hardware a100-80g] [--json FILE] [--set FIELD=VALUE]
    python benchmarks/reproduce_measured.py --extrapolation   # the planner's m extrapolation vs exact
    python benchmarks/reproduce_measured.py --authors PATH    # ZB-1p/2p orders against the authors' scheduler,
        # and post-validation held at their POST_VALIDATION nodes
    python benchmarks/reproduce_measured.py --post-validation # the ZB rows back to back, without the barrier
    python benchmarks/reproduce_measured.py [--post-validation] --fit-op-overhead  # + the ZB runtime's op
        # overhead fitted on the fit rows; or --op-overhead zb=FRACTION (analyses, not the calibration)

PATH for ``--authors``: a checkout of sail-sg/zero-bubble-pipeline-parallelism at branch ``arxiv`` (the
paper's version; its ``megatron/core/pipeline_parallel/auto_schedule.py`` is imported from there with a
stub for ``pulp``, which the heuristic does not use; torch and numpy must be importable).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeoffload.costmodel.hardware import get_hardware  # noqa: E402
from pipeoffload.costmodel.measured import MEASURED, MEASUREMENT_TIE, Prediction, compare, ranking_agrees  # noqa: E402



def _authors_config(mod, r):
    """Measured row ``r``'s setting, simulated with the ZB runtime's order, and the authors'
    scheduler's ``GraphConfig`` (``mod``: their auto_schedule module) of the inputs their
    runtime feeds it (``zb_runtime_inputs``): (problem, simulated, config)."""
    from pipeoffload.costmodel.measured import row_problem, simulate_exactly, zb_runtime_inputs
    from pipeoffload.planner.space import Split

    problem, family = row_problem(r)
    sim = simulate_exactly(problem, Split(1, r.gpus, 1), family, r.m, zb_runtime=True)
    inp = zb_runtime_inputs(problem.model, sim.sharded.costs, r.gpus, float(family.limit))
    c, mem = inp["costs"], inp["memory"]
    return problem, sim, mod.GraphConfig(mem_f=mem.F, mem_b=mem.B, mem_w=mem.W, max_mem=inp["mem_limit"],
                                         cost_f=int(c.F), cost_b=int(c.B), cost_w=int(c.W), cost_comm=int(c.comm),
                                         print_scaling=1000)

def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}"


def markdown(preds: list[Prediction]) -> str:
    lines = ["| source | model | GPUs | b | m | schedule | fit/held out | measured samples/GPU/s | ours | error "
             "| measured GiB | ours (reserved) | error | MFU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in preds:
        r = p.row
        meas = "–" if p.throughput_error is None else f"{r.throughput:.3g}"
        ours = "–" if p.throughput_error is None else f"{p.throughput:.3g}"
        mem = "–" if r.memory_gib is None else f"{r.memory_gib:g}"
        ours_mem = f"{p.reserved_gib:.1f}" + ("" if p.fits else " (over budget)")
        sched = "ZB-2p*" if r.note.startswith("ZB-2p*") else r.schedule
        lines.append(f"| {r.source} | {r.model} | {r.gpus} | {r.microbatch} | {r.m} | {sched} | "
                     f"{'fit' if r.fit else 'held out'} | {meas} | {ours} | {_pct(p.throughput_error)} | {mem} | "
                     f"{ours_mem} | {_pct(p.memory_error)} | {p.mfu:.1%} |")
    return "\n".join(lines)


def op_times(hardware: str = "a100-80g") -> str:
    """The profiled per-stage F, B, W (ms) of the ZB paper beside the cost model's (a middle stage)."""
    from pipeoffload.costmodel import get_hardware, get_model, pipeline_costs
    from pipeoffload.costmodel.measured import FIT_MODEL, PROFILED_MS

    hw = get_hardware(hardware)
    lines = ["| model | p | fit/held out | T_F measured / ours | T_B | T_W |", "|---|---|---|---|---|---|"]
    for name, (p, tf, tb, tw, _) in PROFILED_MS.items():
        g = pipeline_costs(get_model(name), hw, p, trim_edges=True).groups[p // 2]
        cells = [f"{m:.2f} / {o:.2f} ({o / m - 1:+.1%})" for m, o in ((tf, g.F_ms), (tb, g.B_ms), (tw, g.W_ms))]
        lines.append(f"| {name} | {p} | {'fit' if name == FIT_MODEL else 'held out'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def extrapolation(ms: tuple[int, ...] = (8, 16, 24, 32, 48, 64, 96, 128)) -> str:
    """The planner's microbatch extrapolation (``Simulator.simulate``) against exact simulations
    (``measured.simulate_exactly``) at ``ms``: the worst relative makespan error per schedule over
    three settings (1.5B p = 8, 6.2B p = 8 TP = 2, 14.6B p = 16) on the profile."""
    from pipeoffload.costmodel.measured import simulate_exactly
    from pipeoffload.costmodel.presets import get_model
    from pipeoffload.planner.refusals import Refused
    from pipeoffload.planner.sharding import node_profile
    from pipeoffload.planner.simulate import Simulator
    from pipeoffload.planner.space import Family, PlanOptions, Problem, Split

    hw = get_hardware("a100-80g")
    families = [Family("1f1b"), Family("zb-h1"), Family("zb-auto", limit=1.0), Family("zb-auto", limit=2.0),
                Family("interleaved-1f1b", 2), Family("group-interleaved", 2, group="half"), Family("zb-v", 2),
                Family("v-half", 2), Family("v-min", 2)]
    lines = ["| schedule | worst extrapolated / exact − 1 | at |", "|---|---|---|"]
    for fam in families:
        worst, where = 0.0, "–"
        for name, b, p, tp in (("1.5B", 6, 8, 1), ("6.2B", 3, 8, 2), ("14.6B", 1, 16, 1)):
            for m in ms:
                prob = Problem(get_model(name, microbatch=b), hw, node_profile(hw), hw.default_budget, m * b, p * tp,
                               PlanOptions(dp_sharding="none", trim_edges=True))
                try:
                    ext = Simulator(prob).simulate(Split(tp, p, 1), fam, m, False)
                except Refused:  # m below what the generator needs (e.g. interleaved: m >= p)
                    continue
                err = ext.makespan / simulate_exactly(prob, Split(tp, p, 1), fam, m).makespan - 1
                if abs(err) > abs(worst):
                    worst, where = err, f"{name} p={p} TP={tp} m={m}"
        lines.append(f"| {fam.label} | {worst:+.2%} | {where} |")
    return "\n".join(lines)


def _load_authors_auto_schedule(path: str):
    """The authors' ``auto_schedule`` module from a checkout (or the file itself) at ``path``."""
    import importlib.util
    import types

    f = Path(path)
    if f.is_dir():
        f = f / "megatron/core/pipeline_parallel/auto_schedule.py"
    pulp = types.ModuleType("pulp")  # only the ILP (disabled in their auto_schedule) needs the solver
    pulp.value = lambda x: x  # type: ignore[attr-defined]
    for name in ("LpMinimize", "LpProblem", "LpStatus", "LpVariable", "lpDot", "lpSum", "constants"):
        setattr(pulp, name, None)
    sys.modules.setdefault("pulp", pulp)
    sys.modules.setdefault("pulp.constants", types.ModuleType("pulp.constants"))
    spec = importlib.util.spec_from_file_location("zb_authors_auto_schedule", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def authors_check(path: str) -> str:
    """For every measured ZB-1p / ZB-2p configuration: the authors' heuristic (``initial_solution``,
    what their ``auto_schedule`` runs) on :func:`~pipeoffload.costmodel.measured.zb_runtime_inputs`,
    each rank's ops in the order of their completion times (their ``ilp_results``), against the order
    ``predict`` times; with its bubble on the planner's per-stage costs."""
    from pipeoffload.costmodel.measured import RUNTIME_GENERATES

    mod = _load_authors_auto_schedule(path)
    lines = ["| setting | schedule | m | b | orders | bubble ms (makespan − busiest rank) |",
             "|---|---|---|---|---|---|"]
    seen, same = set(), 0
    for r in MEASURED:
        key = (r.model, r.gpus, r.microbatch, r.m, r.schedule)
        if r.schedule not in RUNTIME_GENERATES or key in seen:
            continue
        seen.add(key)
        problem, sim, cfg = _authors_config(mod, r)
        graph = mod.Graph.build_graph(r.gpus, r.m, cfg)
        _, _, end = mod.initial_solution(graph, print_result=False)
        theirs = [sorted(((k, s, i) for k in range(3) for i in range(r.m)), key=lambda n: end[graph.get_id(*n)])
                  for s in range(r.gpus)]
        ours = [[("FBW".index(op.kind.name), op.stage, op.microbatch) for op in ops] for ops in sim.schedule.ranks]
        same += ours == theirs
        lines.append(f"| {r.model}, {r.gpus} GPUs | {r.schedule} | {r.m} | {r.microbatch} | "
                     f"{'identical' if ours == theirs else 'DIFFERENT'} | {sim.makespan - max(sim.busy):.1f} |")
    lines.append(f"\n{same} of {len(seen)} configurations: our order is the authors' scheduler's")
    return "\n".join(lines)


def authors_post_validation_check(path: str, hops_ms: tuple[float, ...] = (5.0, 14.0)) -> str:
    """For the four ZB-2p rows whose synchronised run the paper measured (``measured.SYNCHRONISED``): where
    the authors' scheduler (``auto_schedule``, its ``POST_VALIDATION`` nodes) puts each rank's wait for
    the validation, and post-validation's gain in our model held there instead of at the first B, and
    with a scalar hop of ``hops_ms`` on the reduction's and the validation's chains; beside the gain
    the paper measured (Table 4's run against the synchronised one)."""
    import contextlib
    import io

    from pipeoffload.costmodel.measured import SYNCHRONISED, post_validation_iteration_ms, predict
    from pipeoffload.planner.config import assemble

    mod = _load_authors_auto_schedule(path)
    lines = ["| model | GPUs | m | F before the node, rank 0 / 1 / last (first B) | gain: measured "
             "| ours: at the first B | at the node | " + " | ".join(f"node, hop {h:g} ms" for h in hops_ms) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(hops_ms)]
    for sync in SYNCHRONISED:
        r = next(x for x in MEASURED
                 if (x.source, x.model, x.m, x.schedule) == ("ZB Table 4", sync.model, sync.m, "ZB-2p"))
        problem, sim, cfg = _authors_config(mod, r)
        with contextlib.redirect_stdout(io.StringIO()):  # their scheduler prints its whole result
            nodes = mod.auto_schedule(r.gpus, r.m, cfg)
        node = [sum(n.type in ("F", "B", "W") for n in ns[:[n.type for n in ns].index("POST_VALIDATION")])
                for ns in nodes]  # compute ops before each rank's POST_VALIDATION node
        ours = [[o for o in ops if o.kind.is_compute] for ops in sim.schedule.ranks]
        if [[(o.kind.name, o.microbatch) for o in ops] for ops in ours] != \
                [[(n.type, n.minibatch) for n in ns if n.type in ("F", "B", "W")] for ns in nodes]:
            raise SystemExit(f"{r.setting}: the authors' order is not ours")
        first_b = [next(i for i, o in enumerate(ops) if o.kind.name != "F") for ops in ours]
        step = assemble(problem, sim).step
        barrier = predict(r).iteration_s * 1e3
        gains = [barrier / post_validation_iteration_ms(sim.schedule, sim.sharded.costs, step.optimizer_ms,
                                                        step.embedding_ms, held_from=hold, hop_ms=h) - 1
                 for hold, h in ((None, 0.0), (node, 0.0), *((node, h) for h in hops_ms))]
        lines.append(f"| {r.model} | {r.gpus} | {r.m} | {node[0]} / {node[1]} / {node[-1]} "
                     f"({first_b[0]} / {first_b[1]} / {first_b[-1]}) | {r.throughput / sync.throughput - 1:+.1%} | "
                     + " | ".join(f"{g:+.1%}" for g in gains) + " |")
    return "\n".join(lines)


def synchronised_check(hw, post_validation: bool = False, op_overhead: dict | None = None) -> str:
    """The paper's ZB-2p runs with an all-reduce synchronisation (``measured.SYNCHRONISED``, the one
    ZB-runtime iteration that is a barrier, as the planner's) against our barrier iteration, and the
    gain post-validation gave them (Table 4's ZB-2p at the same m) against our post-validation model's."""
    from pipeoffload.costmodel.measured import SYNCHRONISED, predict

    lines = ["| model | GPUs | m | synchronised: measured | ours (barrier) | error | post-validation: measured "
             "| ours | error | post-validation's gain: measured / ours |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in SYNCHRONISED:
        pv = next(x for x in MEASURED if (x.source, x.model, x.m, x.schedule) == ("ZB Table 4", r.model, r.m, "ZB-2p"))
        sync, ours_pv = predict(r, hw, op_overhead=op_overhead), predict(pv, hw, True, op_overhead)
        model_gain = ours_pv.throughput / predict(pv, hw, False, op_overhead).throughput - 1
        lines.append(f"| {r.model} | {r.gpus} | {r.m} | {r.throughput:g} | {sync.throughput:.3g} | "
                     f"{_pct(sync.throughput_error)} | {pv.throughput:g} | {ours_pv.throughput:.3g} | "
                     f"{_pct(ours_pv.throughput_error)} | {pv.throughput / r.throughput - 1:+.1%} / {model_gain:+.1%} |")
    return "\n".join(lines)


def fit_op_overhead(hw, post_validation: bool, runtime: str = "zb") -> float:
    """The fraction by which ``runtime``'s F, B, W must run longer than the profile's for its FIT rows
    (``MeasuredRow.fit``) to come out with a mean log throughput error of 0, the iteration with or
    without ``post_validation``; bisection to 1e-5 (the error falls monotonically with the fraction)."""
    import math

    rows = [r for r in MEASURED if r.fit and r.runtime == runtime]
    lo, hi = -0.2, 0.2
    while hi - lo > 1e-5:
        mid = (lo + hi) / 2
        preds = compare(rows, hw, post_validation, {runtime: mid})
        lo, hi = (mid, hi) if sum(math.log1p(p.throughput_error) for p in preds) > 0 else (lo, mid)
    return round((lo + hi) / 2, 4)


def summary(preds: list[Prediction]) -> dict:
    def worst(rows: list[Prediction], attr: str) -> float:
        errs = [abs(getattr(p, attr)) for p in rows if getattr(p, attr) is not None]
        return max(errs) if errs else 0.0

    fit = [p for p in preds if p.row.fit]
    held = [p for p in preds if not p.row.fit]
    return {"fit_throughput": worst(fit, "throughput_error"), "fit_memory": worst(fit, "memory_error"),
            "held_out_throughput": worst(held, "throughput_error"), "held_out_memory": worst(held, "memory_error"),
            "all_throughput": worst(preds, "throughput_error"), "all_memory": worst(preds, "memory_error"),
            "ranking": ranking_agrees(preds), "ranking_ties": ranking_agrees(preds, tie=MEASUREMENT_TIE),
            "mean_by_runtime": {rt: sum(es) / len(es) for rt in sorted({p.row.runtime for p in preds})
                                for es in [[p.throughput_error for p in preds
                                            if p.row.runtime == rt and p.throughput_error is not None]] if es}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hardware", default="a100-80g")
    ap.add_argument("--json", help="write the rows and the summary as JSON to this file")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a profile field (a Hardware attribute, e.g. p2p_exposed=0.5): sensitivity")
    ap.add_argument("--extrapolation", action="store_true",
                    help="only compare the planner's microbatch extrapolation with exact simulations (m = 8..128)")
    ap.add_argument("--authors", metavar="PATH",
                    help="only check the ZB-1p/2p rows' orders against the authors' scheduler at PATH (branch arxiv)")
    ap.add_argument("--post-validation", action="store_true",
                    help="time the ZB runtime's rows back to back without the barrier between iterations "
                         "(its optimizer post-validation; an analysis, not the calibration's figures)")
    ap.add_argument("--op-overhead", action="append", default=[], metavar="RUNTIME=FRACTION",
                    help="time that runtime's rows (zb or megatron) with F, B, W longer by FRACTION: an analysis "
                         "of its overhead, not the calibration's figures")
    ap.add_argument("--fit-op-overhead", action="store_true",
                    help="fit the zb runtime's op overhead on the fit rows (mean log error 0) and use it")
    args = ap.parse_args()
    if args.authors:
        print(authors_check(args.authors))
        print()
        print(authors_post_validation_check(args.authors))
        return 0
    if args.extrapolation:
        print(extrapolation())
        return 0
    hw = get_hardware(args.hardware)
    for item in args.set:
        key, _, value = item.partition("=")
        hw = dataclasses.replace(hw, **{key: type(getattr(hw, key))(value) if getattr(hw, key) is not None
                                        else float(value)})
    overhead = {k: float(v) for k, _, v in (item.partition("=") for item in args.op_overhead)}
    if args.fit_op_overhead:
        overhead["zb"] = fit_op_overhead(hw, args.post_validation)
    preds = compare(MEASURED, hw, post_validation=args.post_validation, op_overhead=overhead)
    if args.post_validation:
        print("ZB runtime rows timed back to back under optimizer post-validation (no barrier between "
              "iterations); not the calibration's figures (docs/planner.md#calibration)\n")
    if overhead:
        print(f"F, B, W of the runtimes' rows longer by {overhead} than the profile's"
              f"{' (zb: fitted on the fit rows)' if args.fit_op_overhead else ''}; not the calibration's figures\n")
    s = summary(preds)
    print(markdown(preds))
    print()
    print(op_times())
    print()
    print(synchronised_check(hw, args.post_validation, overhead))
    print()
    print(f"largest |error|: fit rows throughput {s['fit_throughput']:.1%}, memory {s['fit_memory']:.1%}; "
          f"held-out rows throughput {s['held_out_throughput']:.1%}, memory {s['held_out_memory']:.1%}")
    print("mean throughput error by runtime: " + ", ".join(f"{rt} {e:+.1%}" for rt, e in s["mean_by_runtime"].items()))
    strict, loose = s["ranking"], s["ranking_ties"]
    print(f"schedule ranking as measured in {sum(strict.values())} of {len(strict)} settings; "
          f"{sum(loose.values())} of {len(loose)} counting measured differences under {MEASUREMENT_TIE:.0%} as ties")
    for setting, ok in strict.items():
        if not ok:
            print(f"  differs: {setting}{'' if not loose[setting] else ' (only within measured ties)'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [p.to_dict() for p in preds], "summary": s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
