"""PipeOffload's claim, reproduced with its sensitivity: pure PP + activation offload against the
best tensor-parallel configuration, in predicted iteration time and device memory.

Setup (docs/pipeoffload-vs-tp.md): the authors' public script ``examples/pretrain_offload.sh``
(sail-sg/zero-bubble-pipeline-parallelism): hidden 4096, FFN 16384, 32 heads, 8 KV groups (GQA),
flash attention, no dropout, layer-norm/GeLU recompute (``--recompute-lgd``), untied embeddings,
sequence parallelism, microbatch 1, ``L = 3p − 2`` layers (one layer per chunk, v = 3, the edge chunks
hold the embedding and the head), global batch ``2p`` sequences, p = number of GPUs. Hidden 8192
(64 heads) gives the larger models of the paper's range. Hardware: the ``a100-80g`` profile.

For each point the planner searches every split; "PP+offload" is its fastest TP = 1, DP = 1
configuration (pure PP over all GPUs, the authors' setting; offload and recompute allowed), "best TP"
its fastest configuration with TP ≥ 2, DP = 1 and no offload; "overall" its fastest of any split
(DP included), for context. Pure Python; a full run takes a few minutes on one core.

    python benchmarks/pipeoffload_vs_tp.py [--quick] [--json FILE] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pipeoffload.costmodel.hardware import GiB, get_hardware  # noqa: E402
from pipeoffload.costmodel.model import ModelSpec  # noqa: E402
from pipeoffload.planner import PlanOptions, plan  # noqa: E402

SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b", "group-interleaved", "zb-v", "v-half")


def authors_model(p: int, hidden: int = 4096, seq: int = 8192) -> ModelSpec:
    """The authors' PipeOffload model for p pipeline ranks (see the module docstring)."""
    heads = hidden // 128
    return ModelSpec(name=f"po-h{hidden}-L{3 * p - 2}", layers=3 * p - 2, hidden=hidden, heads=heads, kv_groups=8,
                     ffn=4 * hidden, seq=seq, vocab=32000, microbatch=1, dtype="fp16", activation="gelu",
                     flash_attention=True, dropout=False, recompute_elementwise=True, tie_embeddings=False)


def point(gpus: int, hidden: int = 4096, seq: int = 8192, batch_factor: int = 2, tp_gbs: float | None = None,
          host_gbs: float | None = None, hardware: str = "a100-80g") -> dict:
    """One comparison: PP+offload vs best TP (iteration s, device GiB) and their ratio."""
    hw = get_hardware(hardware)
    if host_gbs is not None:
        hw = replace(hw, host_bw=host_gbs * 1e9)
    if tp_gbs is not None:
        hw = replace(hw, tp_bw=tp_gbs * 1e9, dp_intra_bw=tp_gbs * 1e9)
    model = authors_model(gpus, hidden, seq)
    opts = PlanOptions(schedules=SCHEDULES, chunks=(2, 3), recompute=(True, "full"), top=400, trim_edges=True)
    t0 = time.perf_counter()
    res = plan(model, hw, gpus, global_batch=batch_factor * gpus, options=opts)
    # The paper's comparison: all GPUs model-parallel (DP = 1), pure PP + offload against TP·PP.
    pp = [c for c in res.configs if c.split.tp == 1 and c.split.dp == 1]
    tp = [c for c in res.configs if c.split.tp >= 2 and c.split.dp == 1 and not c.offload_chunks]
    out = {"gpus": gpus, "hidden": hidden, "seq": seq, "layers": model.layers, "params_b": model.params() / 1e9,
           "global_batch": batch_factor * gpus, "tp_busbw_gbs": (hw.tp_bw or 0) / 1e9, "host_gbs": hw.host_bw / 1e9,
           "seconds": round(time.perf_counter() - t0, 1)}
    for key, rows in (("pp", pp), ("tp", tp)):
        c = min(rows, key=lambda c: c.iteration_ms) if rows else None
        out[key] = None if c is None else {
            "config": c.describe(), "iteration_s": c.iteration_ms / 1e3, "device_gib": c.memory.device / GiB,
            "host_gib": c.memory.host_max / GiB, "mfu": c.mfu, "effective_k": c.effective_k}
    out["overall"] = res.configs[0].describe() if res.configs else None  # any DP, for context
    # Iso-memory: the fastest pure-PP plan within the best TP plan's device memory (offload, recompute
    # and the schedule as the planner finds them): the paper's "faster at lower memory" question.
    if tp:
        budget = min(tp, key=lambda c: c.iteration_ms).memory.device
        iso = plan(model, hw, gpus, global_batch=batch_factor * gpus, memory_budget=budget, options=opts)
        rows_iso = [c for c in iso.configs if c.split.tp == 1 and c.split.dp == 1]
        c = min(rows_iso, key=lambda c: c.iteration_ms) if rows_iso else None
        out["pp_iso"] = None if c is None else {
            "config": c.describe(), "iteration_s": c.iteration_ms / 1e3, "device_gib": c.memory.device / GiB,
            "host_gib": c.memory.host_max / GiB, "mfu": c.mfu, "effective_k": c.effective_k}
    if out["pp"] and out["tp"]:
        out["speedup"] = out["tp"]["iteration_s"] / out["pp"]["iteration_s"]  # > 1: PP faster
        out["memory_ratio"] = out["pp"]["device_gib"] / out["tp"]["device_gib"]  # < 1: PP lower
    if out.get("pp_iso") and out["tp"]:
        out["speedup_iso"] = out["tp"]["iteration_s"] / out["pp_iso"]["iteration_s"]
    return out


def grid(quick: bool) -> list[dict]:
    rows = []
    base = [(8, 4096, 8192), (16, 4096, 8192), (32, 4096, 8192)] if not quick else [(8, 4096, 8192)]
    for gpus, hidden, seq in base:  # the authors' setting at 8-32 GPUs
        rows.append({"study": "scale", **point(gpus, hidden, seq)})
    for seq in ((4096, 16384, 32768) if not quick else (16384,)):  # sequence length
        rows.append({"study": "seq", **point(8, 4096, seq)})
    for tp_gbs in ((100, 150, 300) if not quick else (100,)):  # TP bus bandwidth (profile: 230)
        rows.append({"study": "tp_bw", **point(8, 4096, 8192, tp_gbs=tp_gbs)})
    for host in ((12, 48) if not quick else (12,)):  # host link of one GPU alone (profile: 24)
        rows.append({"study": "host_bw", **point(8, 4096, 8192, host_gbs=host)})
    for bf in ((1, 4, 8) if not quick else (8,)):  # global batch = bf · p
        rows.append({"study": "batch", **point(8, 4096, 8192, batch_factor=bf)})
    if not quick:
        rows.append({"study": "hidden", **point(8, 8192, 8192)})
    return rows


def _short(cfg: str) -> str:
    return cfg.replace("group-interleaved", "GIS").replace("interleaved-1f1b", "I1F1B").replace(" DP=1", "")


def markdown(rows: list[dict]) -> str:
    head = ("| study | GPUs | h | seq | L | params | batch | TP busbw GB/s | host GB/s | best TP (DP=1) | s | GiB | "
            "pure PP, any memory | s | GiB | pure PP within TP's memory | s | GiB | host GiB | "
            "TP s / PP s | TP s / PP s, iso-memory |\n" + "|---" * 21 + "|")
    lines = [head]
    for r in rows:
        pp, tp, iso = r["pp"], r["tp"], r.get("pp_iso")

        def cell(c: dict | None, host: bool = False) -> str:
            if not c:
                return "none fits | | | " + ("| " if host else "")
            return (f"{_short(c['config'])} | {c['iteration_s']:.2f} | {c['device_gib']:.1f} | "
                    + (f"{c['host_gib']:.1f} | " if host else ""))
        lines.append(
            f"| {r['study']} | {r['gpus']} | {r['hidden']} | {r['seq']} | {r['layers']} | {r['params_b']:.1f}B | "
            f"{r['global_batch']} | {r['tp_busbw_gbs']:.0f} | {r['host_gbs']:.0f} | "
            + cell(tp) + cell(pp) + cell(iso, host=True)
            + (f"{r['speedup']:.3f} | " if "speedup" in r else " | ")
            + (f"{r['speedup_iso']:.3f} |" if "speedup_iso" in r else " |"))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one point per study")
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    rows = grid(args.quick)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        print(markdown(rows))
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
