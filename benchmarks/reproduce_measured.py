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
    python benchmarks/reproduce_measured.py --wave-quantization 128x128  # GEMMs tile- and wave-quantized,
        # the constants re-fit (an analysis: docs/planner.md#calibration)
    python benchmarks/reproduce_measured.py --fit-stages all  # the three fitted constants by least squares
        # on every profiled stage (or e.g. 1.5B,6.2B), every row held out (an analysis: docs/planner.md#calibration)

PATH for ``--authors``: a checkout of sail-sg/zero-bubble-pipeline-parallelism at branch ``arxiv`` (the
paper's version; its ``megatron/core/pipeline_parallel/auto_schedule.py`` is imported from there with a
stub for ``pulp``, which the heuristic does not use; torch and numpy must be importable).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeoffload.costmodel.hardware import get_hardware  # noqa: E402
from pipeoffload.costmodel.measured import (FIT_MODELS, MEASURED, MEASUREMENT_TIE, PROFILED_MS,  # noqa: E402
                                            Prediction, compare, ranking_agrees)

from fit_gpu_profile import least_squares  # noqa: E402  (a sibling script: the one fit of the three constants)



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


def op_times(hardware: Any = "a100-80g", fit_models: tuple[str, ...] | None = None) -> str:
    """The profiled per-stage F, B, W (ms) of the ZB paper beside the cost model's (a middle stage);
    ``fit_models`` are labelled "fit" (default: the profile's, ``FIT_MODELS``)."""
    from pipeoffload.costmodel import get_hardware, get_model, pipeline_costs
    from pipeoffload.costmodel.measured import FIT_MODELS, PROFILED_MS

    hw = get_hardware(hardware)
    fit_models = FIT_MODELS if fit_models is None else fit_models
    lines = ["| model | p | fit/held out | T_F measured / ours | T_B | T_W |", "|---|---|---|---|---|---|"]
    for name, (p, tf, tb, tw, _) in PROFILED_MS.items():
        g = pipeline_costs(get_model(name), hw, p, trim_edges=True).groups[p // 2]
        cells = [f"{m:.2f} / {o:.2f} ({o / m - 1:+.1%})" for m, o in ((tf, g.F_ms), (tb, g.B_ms), (tw, g.W_ms))]
        lines.append(f"| {name} | {p} | {'fit' if name in fit_models else 'held out'} | " + " | ".join(cells) + " |")
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


#: GEMM tile and wave quantization (an analysis; docs/planner.md#calibration, "Tile and wave
#: quantization"). NVIDIA's Matrix Multiplication Background User's Guide (DU-09799-001, §2.3 and
#: §3): cuBLAS cuts a GEMM's M×N output into thread-block tiles — 256×128 and 128×256 the most
#: efficient, then 128×128, 256×64, 64×256, 128×64, 64×128, 64×64 — and runs them in waves of one
#: tile per SM for 256×128 on an A100 (108 SMs); a partial last wave costs a full one. The SM count is
#: the A100's; the tiles are the guide's, not fitted.
A100_SMS = 108
WAVE_TILES: dict[str, tuple[int, int]] = {"256x128": (256, 128), "128x128": (128, 128)}


def layer_gemms(model) -> dict[str, list[tuple[int, int, int, int]]]:
    """One layer's GEMMs per op as (M, N, K, batch), the output M×N: F = QKV, out-projection,
    FC1, FC2 (``tokens`` rows) and the core attention's batched Q·Kᵀ and A·V over
    ``microbatch·heads`` (cuBLAS GEMMs: the paper's rows ran without flash attention, whose fused
    kernel this does not describe); B = each linear's input gradient (output tokens × its
    input width, reduced over its output width) and the attention's four batched GEMMs; W = each
    linear's weight gradient (its weight's shape, reduced over the tokens). Their FLOPs are the
    cost model's layer FLOPs (a test)."""
    T, h, s, d = model.tokens, model.hidden, model.seq, model.head_dim
    heads = model.microbatch * model.heads
    lin = [(T, h + 2 * model.kv_dim, h), (T, h, h), (T, (model.ffn_matrices - 1) * model.ffn, h),
           (T, h, model.ffn)]
    attn_f = [(s, s, d, heads), (s, d, s, heads)]
    attn_b = [(s, s, d, heads)] + [(s, d, s, heads)] * 3  # dA = dO·Vᵀ; dV, dQ, dK
    return {"F": [(M, N, K, 1) for M, N, K in lin] + attn_f,
            "B": [(M, K, N, 1) for M, N, K in lin] + attn_b,
            "W": [(K, N, M, 1) for M, N, K in lin]}


def head_gemms(model) -> dict[str, list[tuple[int, int, int, int]]]:
    """The output layer's GEMMs per op (M, N, K, batch): logits, their input gradient, the weight's."""
    T, h, V = model.tokens, model.hidden, model.vocab
    return {"F": [(T, V, h, 1)], "B": [(T, h, V, 1)], "W": [(V, h, T, 1)]}


def wave_efficiency(m: int, n: int, batch: int, tile: tuple[int, int], sms: int = A100_SMS) -> float:
    """Useful fraction of the tile-waves an M×N output (``batch`` of them) occupies: tiles of
    ``tile`` in whichever orientation wastes less, padded at the edges (tile quantization), run
    ``sms`` at a time with the last wave counted whole (wave quantization). O(1)."""
    best = 0.0
    for tm, tn in (tile, tile[::-1]):
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        best = max(best, m * n * batch / (math.ceil(tiles / sms) * sms * tm * tn))
    return best


def quantized_flops(gemms: list[tuple[int, int, int, int]], tile: tuple[int, int] | None,
                    sms: int = A100_SMS) -> float:
    """The GEMMs' FLOPs, each over its :func:`wave_efficiency` (plain FLOPs for ``tile=None``)."""
    return sum(2 * m * n * k * b / (wave_efficiency(m, n, b, tile, sms) if tile else 1.0) for m, n, k, b in gemms)


#: The stage the tile-and-wave analysis re-fits the three constants on, exactly (three numbers, three
#: constants): the 1.5B stage, the profile's only fit stage when that analysis was made (issue 26's
#: third round, docs/planner.md#calibration). Kept so that the analysis stays the one documented; the
#: profile is now fit on more stages (``measured.FIT_MODELS``).
WAVE_FIT_MODEL = "1.5B"


def _fit_stage(hw, tile):
    """The profiled stages' (layers, shape efficiency, ms per elementwise pass, profiled ms) and
    the three constants re-fit exactly on :data:`WAVE_FIT_MODEL`'s stage with ``tile``'s quantization."""
    from pipeoffload.costmodel import get_model, pipeline_costs
    from pipeoffload.costmodel.measured import PROFILED_MS
    from pipeoffload.costmodel.model import gemm_shape_efficiency

    stages = {}
    for name, (p, tf, tb, tw, _) in PROFILED_MS.items():
        model = get_model(name)
        g = pipeline_costs(model, hw, p, trim_edges=True).groups[p // 2]
        flops = {op: g.layers * quantized_flops(gl, tile) / gemm_shape_efficiency(model, hw)
                 for op, gl in layer_gemms(model).items()}
        stages[name] = (flops, g.block.traffic_bytes / hw.hbm_bw * 1e3, (tf, tb, tw))
    flops, pass_ms, (tf, tb, tw) = stages[WAVE_FIT_MODEL]
    rate = flops["W"] / tw * 1e3  # FLOP/s: W is GEMMs only
    return stages, rate, (tf - flops["F"] / rate * 1e3) / pass_ms, (tb - flops["B"] / rate * 1e3) / pass_ms


def wave_op_times(hw, tile: tuple[int, int] | None) -> tuple[Any, dict[str, tuple[float, float, float]]]:
    """The profile with its three constants re-fit on the :data:`WAVE_FIT_MODEL` stage under ``tile``'s
    quantization (``None``: none, the exact re-fit), and each profiled stage's (F, B, W) error."""
    stages, rate, ew_f, ew_b = _fit_stage(hw, tile)
    errors = {}
    for name, (flops, pass_ms, measured) in stages.items():
        ours = (flops["F"] / rate * 1e3 + ew_f * pass_ms, flops["B"] / rate * 1e3 + ew_b * pass_ms,
                flops["W"] / rate * 1e3)
        errors[name] = tuple(o / m - 1 for o, m in zip(ours, measured))
    return dataclasses.replace(hw, compute_rate=rate, elementwise_f=ew_f, elementwise_b=ew_b), errors


@contextlib.contextmanager
def wave_quantized_costs(tile: tuple[int, int], sms: int = A100_SMS):
    """Within the block the cost model times each GEMM of a layer group at its
    :func:`wave_efficiency` (the layers' and, on the last group, the output layer's; the shape
    efficiency and the elementwise time as before). Patches ``model._group_cost``: an analysis
    only, restored on exit."""
    from pipeoffload.costmodel import model as cm

    plain = cm._group_cost

    def group_cost(model, hardware, blocks, index, layers, num_groups):
        g = plain(model, hardware, blocks, index, layers, num_groups)
        rate_ms = hardware.compute_rate / 1e3 * cm.gemm_shape_efficiency(model, hardware)
        last = index == num_groups - 1
        times = {}
        for op, gl in layer_gemms(model).items():
            flops = getattr(g.block, op.lower() + "_flops")  # no recompute in these rows
            extra = layers * (quantized_flops(gl, tile, sms) - quantized_flops(gl, None))
            if last:
                hg = head_gemms(model)[op]
                extra += quantized_flops(hg, tile, sms) - quantized_flops(hg, None)
            times[op + "_ms"] = getattr(g, op + "_ms") + extra / rate_ms if flops else getattr(g, op + "_ms")
        return dataclasses.replace(g, **times)

    cm._group_cost = group_cost
    try:
        yield
    finally:
        cm._group_cost = plain


def wave_quantization(hw, name: str) -> str:
    """Op times and the 93 rows with ``name``'s tile quantized (constants re-fit on :data:`WAVE_FIT_MODEL`)."""
    lines = [f"GEMMs tile- and wave-quantized ({name} tiles, {A100_SMS} SMs), three constants re-fit on the "
             f"{WAVE_FIT_MODEL} stage; an analysis, not the calibration (docs/planner.md#calibration)", ""]
    from pipeoffload.costmodel import get_model
    from pipeoffload.costmodel.measured import PROFILED_MS

    tile = WAVE_TILES[name]
    for model in PROFILED_MS:
        gl = layer_gemms(get_model(model))
        lines.append(f"{model}: a layer's GEMMs run at " + " / ".join(
            f"{quantized_flops(gl[op], None) / quantized_flops(gl[op], tile):.3f}" for op in "FBW")
            + " (F / B / W) of their unquantized rate")
    for label, t in (("none (exact re-fit)", None), (name, tile)):
        fitted, errors = wave_op_times(hw, t)
        held = [e for model, es in errors.items() if model != WAVE_FIT_MODEL for e in es]
        lines.append(f"{label}: {fitted.compute_rate / 1e12:.1f} TFLOP/s, passes {fitted.elementwise_f:.2f} / "
                     f"{fitted.elementwise_b:.2f}; held-out op times (F/B/W) "
                     + ", ".join(f"{m} " + "/".join(f"{e:+.1%}" for e in es) for m, es in errors.items()
                                 if m != WAVE_FIT_MODEL) + f"; largest {max(map(abs, held)):.1%}")
    with wave_quantized_costs(tile):
        preds = compare(MEASURED, fitted)
        sync = synchronised_check(fitted)
    s = summary(preds)
    lines += ["", sync, "", f"largest |error|: fit rows throughput {s['fit_throughput']:.1%}, memory "
              f"{s['fit_memory']:.1%}; held-out rows throughput {s['held_out_throughput']:.1%}, memory "
              f"{s['held_out_memory']:.1%}; ranking {sum(s['ranking'].values())} of {len(s['ranking'])} strict, "
              f"{sum(s['ranking_ties'].values())} with ties"]
    lines += [f"  differs: {k}{' (only within measured ties)' if s['ranking_ties'][k] else ''}"
              for k, ok in s["ranking"].items() if not ok]
    return "\n".join(lines)


def profiled_stages(hw, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The paper's profiled stages of ``names`` (its Table 6, ``measured.PROFILED_MS``) as
    ``fit_gpu_profile`` rows: a middle stage's (``p // 2``, as :func:`op_times`) GEMM FLOPs of F, B,
    W, the bytes F writes, the smallest GEMM dimension, and the profiled T_F, T_B, T_W (ms).

    Raises:
        ParameterError: no name, or one that is not a profiled stage.
    """
    from pipeoffload.costmodel import get_model, pipeline_costs
    from pipeoffload.costmodel.measured import PROFILED_MS
    from pipeoffload.errors import ParameterError

    unknown = [n for n in names if n not in PROFILED_MS]
    if not names or unknown:
        raise ParameterError("fit_stages", f"profiled stages are {', '.join(PROFILED_MS)} (or 'all'), got "
                                           f"{', '.join(names) or 'none'}")
    rows = []
    for name in names:
        p, tf, tb, tw, _ = PROFILED_MS[name]
        model = get_model(name)
        blk = pipeline_costs(model, hw, p, trim_edges=True).groups[p // 2].block  # layers only: no edge
        rows.append({"label": name, "w": min(model.tokens, model.hidden), "f": blk.f_flops,
                     "b": blk.b_flops + blk.recompute_flops, "wf": blk.w_flops, "bytes": blk.traffic_bytes,
                     "F": tf, "B": tb, "W": tw})
    return rows


def fit_stages(hw, names: tuple[str, ...]):
    """``hw`` with its three fitted constants (large-GEMM ``compute_rate``, ``elementwise_f``,
    ``elementwise_b``) replaced by the least-squares fit on the profiled stages ``names``: the
    values minimising the sum over their T_F, T_B, T_W of (ours / measured − 1)², ours the cost
    model's op time (FLOPs at ``compute_rate · w/(w + gemm_half_width)`` plus, in F and B, the
    passes over the bytes F writes at ``hbm_bw``). Exact and unrounded
    (``fit_gpu_profile.least_squares``: the normal equations); no throughput or memory figure enters."""
    half = hw.gemm_half_width if hw.shape_efficiency else 0.0
    rate, ew_f, ew_b = least_squares(profiled_stages(hw, names), half, hw.hbm_bw)
    return dataclasses.replace(hw, compute_rate=rate, elementwise_f=ew_f, elementwise_b=ew_b)


def _largest(preds: list[Prediction], attr: str) -> str:
    """The largest |``attr``| of ``preds`` and its row."""
    p = max((p for p in preds if getattr(p, attr) is not None), key=lambda p: abs(getattr(p, attr)))
    return f"{getattr(p, attr):+.2%} ({p.row.schedule}, {p.row.setting})"


def fit_stages_report(hw, names: tuple[str, ...]) -> str:
    """Op-time residuals and the 93 rows with the three constants fit on the profiled stages ``names``
    (:func:`fit_stages`): an analysis, the profile unchanged (docs/planner.md#calibration)."""
    fitted = fit_stages(hw, names)
    preds = compare(MEASURED, fitted)
    s = summary(preds)  # its fit / held-out split is the profile's (measured.FIT_MODELS): a comparison
    shown = [dataclasses.replace(p, row=dataclasses.replace(p.row, fit=False)) for p in preds]  # all held out
    lines = [f"Three constants by least squares on the relative errors of T_F, T_B, T_W of the profiled stages "
             f"{', '.join(names)} ({3 * len(names)} numbers); no throughput or memory figure in the fit; "
             "an analysis, not the calibration (docs/planner.md#calibration)",
             f"fitted: {fitted.compute_rate / 1e12:.2f} TFLOP/s, passes F {fitted.elementwise_f:.3f} / B "
             f"{fitted.elementwise_b:.3f} (the profile: {hw.compute_rate / 1e12:.2f}, {hw.elementwise_f:.3f} / "
             f"{hw.elementwise_b:.3f})", "", op_times(fitted, names), "", markdown(shown), "",
             synchronised_check(fitted), "",
             f"largest |error| over the {len(preds)} rows: throughput {_largest(preds, 'throughput_error')}, "
             f"memory {_largest(preds, 'memory_error')}",
             f"  the profile's fit rows (Table 4, {' and '.join(FIT_MODELS)}) throughput {s['fit_throughput']:.2%}, "
             f"memory {s['fit_memory']:.2%}; the others throughput {s['held_out_throughput']:.2%}, memory "
             f"{s['held_out_memory']:.2%}",
             "mean throughput error by runtime: "
             + ", ".join(f"{rt} {e:+.1%}" for rt, e in s["mean_by_runtime"].items())]
    return "\n".join(lines + ranking_lines(s))


def ranking_lines(s: dict) -> list[str]:
    """The ranking of :func:`summary` ``s``: settings as measured, strict and with ties, and those that differ."""
    strict, loose = s["ranking"], s["ranking_ties"]
    head = (f"schedule ranking as measured in {sum(strict.values())} of {len(strict)} settings; {sum(loose.values())} "
            f"of {len(loose)} counting measured differences under {MEASUREMENT_TIE:.0%} as ties")
    return [head] + [f"  differs: {k}{' (only within measured ties)' if loose[k] else ''}"
                     for k, ok in strict.items() if not ok]


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
    ap.add_argument("--wave-quantization", choices=sorted(WAVE_TILES),
                    help="time every GEMM with its tile and wave quantization at these tiles, the three "
                         "constants re-fit on the 1.5B stage (an analysis, not the calibration's figures)")
    ap.add_argument("--fit-stages", type=lambda x: tuple(PROFILED_MS) if x == "all" else tuple(x.split(",")),
                    metavar="all|MODEL,...",
                    help="fit the three constants by least squares on these profiled stages (Table 6) and "
                         "evaluate every row held out (an analysis, not the calibration's figures)")
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
    if args.wave_quantization:
        print(wave_quantization(hw, args.wave_quantization))
        return 0
    if args.fit_stages:
        print(fit_stages_report(hw, args.fit_stages))
        return 0
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
    print(op_times(hw))  # the profile as run, --set included
    print()
    print(synchronised_check(hw, args.post_validation, overhead))
    print()
    print(f"largest |error|: fit rows throughput {s['fit_throughput']:.1%}, memory {s['fit_memory']:.1%}; "
          f"held-out rows throughput {s['held_out_throughput']:.1%}, memory {s['held_out_memory']:.1%}")
    print("mean throughput error by runtime: " + ", ".join(f"{rt} {e:+.1%}" for rt, e in s["mean_by_runtime"].items()))
    print("\n".join(ranking_lines(s)))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [p.to_dict() for p in preds], "summary": s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
