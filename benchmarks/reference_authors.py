"""Reference figures of the papers' authors' schedulers, timed by pipeoffload's simulator.

    .venv/bin/python benchmarks/reference_authors.py --authors PATH [--jobs 2] [--out tests/data/authors_reference.json]
    .venv/bin/python benchmarks/reference_authors.py --compare tests/data/authors_reference.json   # docs/schedules.md's table

PATH is a checkout of sail-sg/zero-bubble-pipeline-parallelism (the figures in tests/data were made
from main @ 39f2c186; ZB-H1/H2 are the orders of ``get_hand_schedule`` in the arxiv branch's
``megatron/core/pipeline_parallel/efficiency.py``, written out here). Their scheduler modules are
copied into a scratch directory with two stubs (``pulp.value``, ``megatron.training``) and run
there; every order they produce is converted to a :class:`pipeoffload.ir.Schedule` and timed by
:func:`pipeoffload.passes.timing.simulate` (both simulators agree when fed the same order), so the
file holds only figures, not their code. docs/schedules.md describes the grid and the
results; tests/test_reference_authors.py holds our schedules to them. Takes ~15 min on 2 cores
(the V-auto search is the slow part). Not a CI test.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.ir import Op, OpKind, Placement, build_schedule
from pipeoffload.passes.timing import simulate
from pipeoffload.timeline import TimedOp, Timeline

SCHEDULER = "megatron/core/pipeline_parallel/zerobubble/scheduler"
FILES = ["graph.py", "zb.py", "zbv.py", "zbv_greedy.py", "v_auto_schedule.py", "vpp.py",
         "group_interleaved_1f1b.py", "offloading.py", "basic1f1b.py", "passes.py", "communication.py"]
MODULES: dict = {}


def load_authors(repo: str, scratch: str) -> None:
    """Copy their scheduler package into ``scratch`` with stubs and import it."""
    root = Path(scratch)
    pkg = root / SCHEDULER
    pkg.mkdir(parents=True)
    for d in [root / "megatron", root / "megatron/core", root / "megatron/core/pipeline_parallel",
              root / "megatron/core/pipeline_parallel/zerobubble", pkg]:
        (d / "__init__.py").write_text("")
    for f in FILES:
        shutil.copy(Path(repo) / SCHEDULER / f, pkg / f)
    shutil.copy(Path(repo) / SCHEDULER / "v_auto_schedule.py", root / "v_auto_schedule.py")
    (root / "pulp.py").write_text("def value(x):\n    return x\n")
    (root / "megatron/training").mkdir()
    (root / "megatron/training/__init__.py").write_text("def get_args():\n    raise RuntimeError('stub')\n")
    sys.path.insert(0, str(root))
    import importlib
    base = "megatron.core.pipeline_parallel.zerobubble.scheduler."
    for name in ["graph", "zb", "zbv", "zbv_greedy", "vpp", "group_interleaved_1f1b", "offloading", "basic1f1b",
                 "passes"]:
        MODULES[name] = importlib.import_module(base + name)
    MODULES["v_auto_schedule"] = importlib.import_module("v_auto_schedule")


def _init(repo: str) -> None:
    load_authors(repo, tempfile.mkdtemp(prefix="zb-ref-"))


def _kinds():
    ft = MODULES['graph'].FuncType
    return {ft.F: OpKind.F, ft.B: OpKind.B, ft.W: OpKind.W, ft.BW: OpKind.BW}

MEMORY = {
    "unit": (1.0, 0.0, -1.0),
    # ZB Table 1, h = 2304, a = 24, s = 1024, normalised to F = 1
    "zb": (201216.0, -127488.0, -73728.0),
}


def quiet(fn, *a, **k):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*a, **k)


def to_schedule(name, local_order, p, m, placement):
    per_rank = [[(_kinds()[n.type], n.layer_group_idx, n.microbatch) for n in lst] for lst in local_order]
    return build_schedule(name, m, placement, per_rank)


def config(p, m, f, b, w, c, mem, chunks, max_mem=None):
    mf, mb, mw = mem
    return MODULES['graph'].GraphConfig(
        mem_f=[mf] * p, mem_b=[mb] * p, mem_w=[mw] * p, max_mem=max_mem,
        cost_f=[float(f)] * p, cost_b=[float(b)] * p, cost_w=[float(w)] * p, cost_comm=float(c),
        max_chunks=chunks, n_stages=p, n_micro=m,
    )


def ref_1f1b(p, m, cost, mem):
    return to_schedule("1f1b", quiet(MODULES['basic1f1b'].create_schedule, config(p, m, *cost, mem, 1)), p, m, Placement.loop(p))


def ref_vpp(p, m, cost, mem, v=2):
    if m % p:
        return None
    return to_schedule("vpp", quiet(MODULES['vpp'].create_schedule, config(p, m, *cost, mem, v)), p, m, Placement.loop(p, v))


def ref_zbh(p, m, cost, mem, warmup_c):
    """get_hand_schedule's order (efficiency.py on the arxiv branch); needs m >= 2p."""
    if m < 2 * p:
        return None
    per_rank = []
    for rank in range(p):
        warmup = (p - rank - 1) * warmup_c
        seq = [0] * warmup
        for i in range(m):
            if warmup + i < m:
                seq.append(0)
            seq.append(1)
            if warmup + i >= (p - 1) * warmup_c:
                seq.append(2)
        seq += [2] * ((p - 1) * warmup_c - warmup)
        cnt = [0, 0, 0]
        ops = []
        for t in seq:
            ops.append(((OpKind.F, OpKind.B, OpKind.W)[t], rank, cnt[t]))
            cnt[t] += 1
        per_rank.append(ops)
    return build_schedule(f"zb-h{warmup_c}", m, Placement.loop(p), per_rank)


def ref_zb_auto(p, m, cost, mem, limit_units):
    cfg = config(p, m, *cost, mem, 1, max_mem=[limit_units * mem[0]] * p)
    try:
        order = quiet(MODULES['zb'].create_schedule, cfg)
    except (AssertionError, ValueError):
        return None
    return to_schedule("zb", order, p, m, Placement.loop(p))


def ref_zbv(p, m, cost, mem):
    f, b, w, c = cost
    g = MODULES['zbv'].PipelineGraph(p, m, f, b, w, c, mem[0], mem[1], mem[2], max_mem=None)
    try:
        order = quiet(g.create_schedule, config(p, m, *cost, mem, 2))
    except (AssertionError, ValueError, IndexError):
        return None
    return to_schedule("zbv", order, p, m, Placement.vshape(p))


def ref_vgreedy(p, m, cost, mem, which):
    f, b, w, c = cost
    g = MODULES['zbv_greedy'].PipelineGraph(p, m, which, f, b, w, c)
    try:
        order = quiet(g.create_schedule, config(p, m, *cost, mem, 2))
    except (AssertionError, ValueError, IndexError, KeyError):
        return None
    return to_schedule("v-" + which, order, p, m, Placement.vshape(p))


def ref_vauto(p, m, cost, max_mem):
    """CM's building-block search (MODULES['v_auto_schedule'].schedule) at max_mem chunk activations."""
    try:
        res = quiet(MODULES['v_auto_schedule'].schedule, p, m, cost, max_mem)
    except (AssertionError, ValueError, IndexError, TypeError, AttributeError):
        return None
    per_rank = []
    for stage, nodes in enumerate(res):
        ops = []
        for n in nodes:
            chunk1 = n.chunk  # True for f, B, W
            lg = 2 * p - 1 - stage if chunk1 else stage
            ops.append((OpKind(n.type), lg, n.minibatch))
        per_rank.append(ops)
    return build_schedule("v-auto", m, Placement.vshape(p), per_rank)


def ref_gis(p, m, cost, mem, g, v=2, offload_chunks=0):
    cfg = config(p, m, *cost, mem, v)
    order = quiet(MODULES['group_interleaved_1f1b'].create_schedule, cfg, cpu_offload=offload_chunks > 0,
                  recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
                  interleave_group_size=g, offload_chunk_num=offload_chunks)
    return cfg, order


def time_it(sched, cost, mem, v):
    f, b, w, c = cost
    tl = simulate(sched, Costs(F=v * f, B=v * b, W=v * w, comm=c), MemoryDeltas(*[v * x for x in mem]))
    return tl


def ref_gis_offload(p, m, cost, mem, g, C, offload_time, v=2):
    """The authors' offload pass on their group-interleaved order; returns (schedule, timeline with
    their transfer times, in pipeoffload's accounting) or None when their pass refuses."""
    cfg, order = ref_gis(p, m, cost, mem, g, v=v, offload_chunks=C)
    sched = to_schedule("gis", order, p, m, Placement.loop(p, v))
    try:
        lo = MODULES['passes'].add_send_recv_peer_stage(cfg, order)
        lo = MODULES['passes'].add_time(cfg, lo)
        lo = quiet(MODULES['offloading'].add_offload, cfg, lo, offload_time)
    except AssertionError:
        return sched, None
    f, b, w, c = cost
    d = round(max(f + b + w for _ in range(1)) * offload_time, 2)
    pl = sched.placement
    delta = MemoryDeltas(*[v * x for x in mem]).delta_table(pl)
    events = []
    for rank, nodes in enumerate(lo):
        for n in nodes:
            ft = MODULES['graph'].FuncType
            if n.type in _kinds():
                k = _kinds()[n.type]
                op = Op(k, n.layer_group_idx, n.microbatch, rank, pl.chunk_of(n.layer_group_idx))
                events.append(TimedOp(op, n.start_time, n.completion_time, "compute", delta[op.stage][k]))
            elif n.type in (ft.OFFLOAD_SEND_END, ft.OFFLOAD_RECV_PREP):
                s = n.layer_group_idx
                a = delta[s][OpKind.F]
                if n.type is ft.OFFLOAD_SEND_END:
                    op = Op(OpKind.OFFLOAD_END, s, n.microbatch, rank, pl.chunk_of(s))
                    events.append(TimedOp(op, n.start_time, n.start_time, "d2h", -a))
                else:
                    op = Op(OpKind.RELOAD_START, s, n.microbatch, rank, pl.chunk_of(s))
                    events.append(TimedOp(op, n.start_time, n.start_time + d, "h2d", a))
    return sched, Timeline(num_ranks=p, events=events, chunks=v)


COSTS = {"unit": (1.0, 1.0, 1.0), "b2": (1.0, 2.0, 1.0), "w05": (1.0, 1.0, 0.5), "mixed": (1.0, 1.5, 0.6)}
COMMS = (0.0, 0.1)


def row(family, p, m, v, cost, memname, tl, **extra):
    f, b, w, c = cost
    mem = MEMORY[memname]
    return {
        "family": family, "p": p, "m": m, "v": v,
        "costs": [v * f, v * b, v * w, c], "memory": [v * x for x in mem], "memory_model": memname,
        **extra,
        "bubble": round(tl.bubble_rate, 6), "peak": round(max(tl.peak_memory()), 6),
    }


def plain_rows(args):
    p, m, costname, c, memname = args
    cost = (*COSTS[costname], c)
    mem = MEMORY[memname]
    out = []
    cands = [
        ("1f1b", 1, lambda: ref_1f1b(p, m, cost, mem), {}),
        ("interleaved-1f1b", 2, lambda: ref_vpp(p, m, cost, mem), {}),
        ("zb-h1", 1, lambda: ref_zbh(p, m, cost, mem, 1), {}),
        ("zb-h2", 1, lambda: ref_zbh(p, m, cost, mem, 2), {}),
        ("zb-auto", 1, lambda: ref_zb_auto(p, m, cost, mem, p), {"mem_limit": p * mem[0]}),
        ("zb-auto", 1, lambda: ref_zb_auto(p, m, cost, mem, 2 * p), {"mem_limit": 2 * p * mem[0]}),
        ("zb-v", 2, lambda: ref_zbv(p, m, cost, mem), {}),
        ("v-half", 2, lambda: ref_vgreedy(p, m, cost, mem, "half"), {}),
        ("v-min", 2, lambda: ref_vgreedy(p, m, cost, mem, "min"), {}),
    ]
    for g in sorted({(p + 1) // 2, p}):
        def gis(g=g):
            cfg, order = ref_gis(p, m, cost, mem, g)
            return to_schedule("gis", order, p, m, Placement.loop(p, 2))
        cands.append(("group-interleaved", 2, gis, {"g": g}))
    for family, v, make, extra in cands:
        try:
            s = make()
        except Exception as e:  # their code refused
            print("refused", family, p, m, costname, c, memname, repr(e)[:80], file=sys.stderr)
            continue
        if s is None:
            continue
        tl = time_it(s, cost, mem, v)
        out.append(row(family, p, m, v, cost, memname, tl, **extra))
    return out


def offload_rows(args):
    p, m, costname, c, g, C, k = args
    cost = (*COSTS[costname], c)
    s, tl = ref_gis_offload(p, m, cost, MEMORY["unit"], g, C, k)
    if tl is None:
        return []
    base = time_it(s, cost, MEMORY["unit"], 2)
    r = row("group-interleaved", p, m, 2, cost, "unit", base, g=g, offload_chunks=C, offload_time=k)
    r["bubble"] = round(base.bubble_rate, 6)
    r["peak"] = round(max(tl.peak_memory()), 6)
    return [r]


def vauto_rows(args):
    p, m, costname, c, mm = args
    cost = (*COSTS[costname], c)
    s = ref_vauto(p, m, cost, mm)
    if s is None:
        return []
    tl = time_it(s, cost, MEMORY["unit"], 2)
    return [row("v-auto", p, m, 2, cost, "unit", tl, max_mem=mm)]




def jobs(kind: str) -> tuple:
    if kind == "plain":
        return plain_rows, [(p, m, cn, c, mn) for p in range(3, 13) for m in (p, 2 * p, 3 * p, 5 * p)
                            for cn in COSTS for c in COMMS for mn in ("unit", "zb")]
    if kind == "offload":
        return offload_rows, [(p, m, cn, c, g, C, k) for p in (4, 6, 8, 10, 12) for m in (p, 2 * p, 3 * p, 5 * p)
                              for cn in ("unit", "b2", "w05") for c in COMMS for g in sorted({(p + 1) // 2, p})
                              for C in (1, 2) for k in (0.1, 0.25, 0.5)]
    return vauto_rows, [(p, m, cn, c, mm) for p in range(3, 8) for m in (p, 2 * p, 3 * p) for cn in COSTS
                        for c in COMMS for mm in sorted({2 * ((p + 4) // 3), 2 * ((p + 2) // 2), 2 * p})]


def compare(data: str) -> str:
    """Ours (with our defaults, as tests/test_reference_authors.py defines it) against every row of
    ``data``: a Markdown table per family of rows better / equal / worse in bubble and peak, and
    the largest gain of each."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import test_reference_authors as t

    stats: dict = {}
    for r in t.ROWS:
        key = r["family"] + (" + offload" if r["offload_chunks"] is not None else "")
        bubble, peak = t.ours(r)
        db, dp = bubble - r["bubble"], (peak - r["peak"]) / (r["peak"] or 1.0)
        s = stats.setdefault(key, {"rows": 0, "b_better": 0, "b_worse": 0, "p_better": 0, "p_worse": 0,
                                   "b_gain": 0.0, "p_gain": 0.0, "b_loss": 0.0})
        s["rows"] += 1
        s["b_better"] += db < -1e-6
        s["b_worse"] += db > 1e-6
        s["p_better"] += dp < -1e-9
        s["p_worse"] += dp > 1e-9
        s["b_gain"] = max(s["b_gain"], -db)
        s["b_loss"] = max(s["b_loss"], db)
        s["p_gain"] = max(s["p_gain"], -dp)
    out = ["| family | rows | bubble lower (largest gain) | bubble higher (largest loss) | peak lower (largest gain) | peak higher |",
           "|---|---|---|---|---|---|"]
    for k, s in sorted(stats.items()):
        out.append(f"| {k} | {s['rows']} | {s['b_better']} ({100 * s['b_gain']:.1f} pp) | {s['b_worse']} ({100 * s['b_loss']:.1f} pp) | "
                   f"{s['p_better']} ({100 * s['p_gain']:.0f}%) | {s['p_worse']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--authors", help="checkout of sail-sg/zero-bubble-pipeline-parallelism")
    ap.add_argument("--out", default="tests/data/authors_reference.json")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--compare", metavar="DATA", help="instead: compare ours with DATA (a file this script wrote)")
    args = ap.parse_args()
    if args.compare:
        print(compare(args.compare))
        return
    if not args.authors:
        ap.error("--authors is required (or --compare DATA)")
    rows = []
    for kind in ("plain", "offload", "vauto"):
        fn, todo = jobs(kind)
        t = time.time()
        with Pool(args.jobs, initializer=_init, initargs=(args.authors,)) as pool:
            for got in pool.imap(fn, todo, chunksize=4):
                rows += got
        print(kind, len(todo), "configurations", round(time.time() - t), "s", file=sys.stderr)
    write(rows, args.out)


COLUMNS = ["family", "p", "m", "v", "g", "mem_limit", "offload_chunks", "offload_time", "F", "B", "W", "comm",
           "memory_model", "bubble", "peak"]


def write(rows: list[dict], out: str) -> None:
    """The compact data file: one list per row in COLUMNS order."""
    table = [[r["family"], r["p"], r["m"], r["v"], r.get("g"), r.get("mem_limit", r.get("max_mem")),
              r.get("offload_chunks"), r.get("offload_time"), *r["costs"], r["memory_model"], r["bubble"], r["peak"]]
             for r in rows]
    doc = {"source": "sail-sg/zero-bubble-pipeline-parallelism main @ 39f2c186 (ZB-H1/H2: arxiv branch "
                     "efficiency.py get_hand_schedule); orders timed by pipeoffload.passes.timing.simulate",
           "memory_models": {k: list(v) for k, v in MEMORY.items()},
           "notes": "costs and memory per device-stage (pipeoffload's convention: a chunk gets 1/v); v-auto rows: "
                    "mem_limit is the authors' max_mem in chunk activations",
           "columns": COLUMNS, "rows": table}
    Path(out).write_text(json.dumps(doc, separators=(",", ":")).replace("],[", "],\n["))


if __name__ == "__main__":
    main()
