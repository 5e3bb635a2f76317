"""The training job's outputs: its folder, pictures and traces, and the report it prints.

Split from :mod:`pipeoffload.training.job` (which runs the steps): everything here
formats or writes what a finished run measured; nothing here runs a step.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..timeline import Timeline
from .config import TrainConfig


def output_dir(path: str | None) -> Path:
    p = Path(path) if path else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_outputs(out: Path, measured: Timeline, predicted: Timeline, title: str | None = None) -> dict[str, str]:
    """Write the run's pictures and traces to ``out``; returns ``{kind: path}`` (or
    ``"not written (why)"`` where an optional drawing module is missing)."""
    files: dict[str, str] = {}
    try:
        from ..viz.png import draw_timeline

        draw_timeline(measured, out / "timeline.png")
        files["timeline_png"] = str(out / "timeline.png")
        draw_timeline(predicted, out / "predicted.png")
        files["predicted_png"] = str(out / "predicted.png")
    except ImportError as e:  # drawing module not available
        files["timeline_png"] = f"not written ({e})"
    # The explorer page (issue 16): measured above predicted with the per-op error, one
    # self-contained file (data and script inline) that opens offline.
    from ..viz.html import write_measured_html

    write_measured_html(measured, predicted, out / "timeline.html", title=title)
    files["timeline_html"] = str(out / "timeline.html")
    try:
        from ..viz.trace import write_trace

        write_trace(measured, out / "trace.json")
        files["trace"] = str(out / "trace.json")
        write_trace(predicted, out / "predicted_trace.json")
        files["predicted_trace"] = str(out / "predicted_trace.json")
    except ImportError as e:
        files["trace"] = f"not written ({e})"
    ops = [{"rank": e.rank, "kind": e.op.kind.value, "stage": e.op.stage, "chunk": e.op.chunk,
            "microbatch": e.op.microbatch, "peer": e.op.peer, "stream": e.stream, "start": e.start,
            "end": e.end, "mem": e.mem} for e in sorted(measured.events, key=lambda e: (e.rank, e.start))]
    (out / "timeline.json").write_text(json.dumps({"time_unit": "s", "memory_unit": "bytes", "ops": ops}))
    files["timeline_json"] = str(out / "timeline.json")
    return files


def _mean_after_first(xs: list[float]) -> float:
    """Mean over steps 2.. (the first includes warm-up), or the only value."""
    return sum(xs[1:]) / (len(xs) - 1) if len(xs) > 1 else (xs[0] if xs else 0.0)


def mesh_block(cfg: TrainConfig, gathered: list[dict]) -> dict[str, Any]:
    """``summary["mesh"]``: the parallel sizes and, per global rank, its (pp, dp, tp)
    coordinates, mean step time, last step's peak activation memory and mean DP/TP
    communication seconds per step."""
    par = cfg.parallel
    ranks = [{"rank": i, **g["coords"], "step_time_s": _mean_after_first(g["step_times"]),
              "peak_memory": g["result"].peak_memory, "dp_comm_s": _mean_after_first(g["dp_comm_s"]),
              "tp_comm_s": _mean_after_first(g["tp_comm_s"])} for i, g in enumerate(gathered)]
    return {"pp": cfg.schedule.ranks if not ranks else 1 + max(r["pp"] for r in ranks), "dp": par.dp, "tp": par.tp,
            "fsdp": par.fsdp, "sequence_parallel": par.sequence_parallel, "world_size": len(gathered),
            "step_time_s": max(r["step_time_s"] for r in ranks),
            "peak_memory_max": max(r["peak_memory"] for r in ranks),
            "dp_comm_s_max": max(r["dp_comm_s"] for r in ranks), "tp_comm_s_max": max(r["tp_comm_s"] for r in ranks),
            "ranks": ranks}


def plan_block(cfg: TrainConfig, summary: dict[str, Any]) -> dict[str, Any] | None:
    """``summary["plan"]``: the planner's prediction (``[plan]``, from ``plan --emit-config``)
    beside the measured figures, or None when the configuration was not planned."""
    pl = cfg.plan
    if pl.step_time_s is None:
        return None
    mesh = summary["mesh"]
    return {"prediction": asdict(pl), "measured": {
        "step_time_s": mesh["step_time_s"], "bubble": summary["bubble_measured"],
        "peak_activation_bytes": [row["peak_memory_measured"] for row in summary["ranks"]]}}


def _validation_line(summary: dict[str, Any]) -> list[str]:
    val = summary.get("val_losses") or []
    if not val:
        return []
    every = summary["config"]["training"]["eval_every"]
    holdout = summary["config"]["training"]["holdout"]
    (n0, v0), (n1, v1) = val[0], val[-1]
    return [f"validation loss {v0:.3f} (step {n0}) -> {v1:.3f} (step {n1}); every {every} steps on the held-out "
            f"{100 * holdout:g}% of the corpus"]


def _mib(x: float) -> str:
    return f"{x / 2**20:.2f}"


def _kib_by_group(bytes_by_group: dict) -> str:
    """``"0: 5640, 1: 5640"``: KiB per layer group, by group (keys may be JSON strings)."""
    return ", ".join(f"{int(st)}: {b / 1024:.0f}"
                     for st, b in sorted(bytes_by_group.items(), key=lambda item: int(item[0])))


def _offload_lines(off: dict[str, Any]) -> list[str]:
    per = off["moved_per_layer_per_microbatch"]
    without = off["without_recompute_per_layer_per_microbatch"]
    how = "auto" if off["auto"] else "--offload-chunks"
    line = (f"offload: C={off['chunks']} ({how}; planned offload_time {off['offload_time']:g}), "
            f"{sum(off['transfers_per_step'])} transfers/step, recompute {'on' if off['recompute'] else 'off'}; "
            f"KiB moved per layer and microbatch by layer group {{{_kib_by_group(per)}}}")
    if off["recompute"]:
        line += f" ({{{_kib_by_group(without)}}} without recompute)"
    return [line]


def _mesh_lines(mesh: dict[str, Any] | None) -> list[str]:
    """With dp or tp > 1: the sizes, the step's communication time, and one row per rank
    with its (pp, dp, tp) coordinates."""
    if not mesh or mesh["dp"] * mesh["tp"] == 1:
        return []
    how = "FSDP2 sharded" if mesh["fsdp"] else "replicated"
    lines = [f"mesh pp={mesh['pp']} dp={mesh['dp']} tp={mesh['tp']} ({mesh['world_size']} ranks; dp {how}"
             + (", sequence parallel" if mesh["sequence_parallel"] else "") + f"): step {1000 * mesh['step_time_s']:.0f} ms, "
             f"DP communication {1000 * mesh['dp_comm_s_max']:.1f} ms/step, TP communication "
             f"{1000 * mesh['tp_comm_s_max']:.1f} ms/step (max over ranks), peak act {_mib(mesh['peak_memory_max'])} MiB",
             f"{'rank':>4} {'pp':>3} {'dp':>3} {'tp':>3} {'step ms':>8} {'peak act MiB':>12} {'DP ms':>7} {'TP ms':>7}"]
    for r in mesh["ranks"]:
        lines.append(f"{r['rank']:>4} {r['pp']:>3} {r['dp']:>3} {r['tp']:>3} {1000 * r['step_time_s']:>8.0f} "
                     f"{_mib(r['peak_memory']):>12} {1000 * r['dp_comm_s']:>7.1f} {1000 * r['tp_comm_s']:>7.1f}")
    return lines


def _plan_lines(plan: dict[str, Any] | None) -> list[str]:
    """The planner's prediction for this configuration beside what was measured."""
    if not plan:
        return []
    pr, me = plan["prediction"], plan["measured"]
    acts = pr.get("peak_activation_bytes") or []
    act = ", ".join(f"{_mib(p)}/{_mib(m)}" for p, m in zip(acts, me["peak_activation_bytes"]))
    return [f"planner ({pr.get('configuration')}; {pr.get('hardware')} profile): step {pr['step_time_s']:.3f} s "
            f"predicted, {me['step_time_s']:.3f} s measured; bubble {pr['bubble']:.3f} predicted, "
            f"{me['bubble']:.3f} measured; peak act MiB per pipeline rank predicted/measured {act}"]


def format_report(summary: dict[str, Any], out: Path) -> str:
    """The end-of-run text: loss, step time, the per-rank table, files."""
    losses = summary["losses"]
    s = summary["schedule"]
    lines = [
        "",
        f"pipeoffload train: {s['name']} p={s['p']} m={s['m']} v={s['v']} ({s['layer_groups']} layer groups), "
        f"{summary['model_parameters'] / 1e6:.2f}M parameters, {summary['backend']} on {summary['device']}",
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps; wall {summary['wall_time_s']:.1f} s",
        *_validation_line(summary),
        f"bubble measured {summary['bubble_measured']:.3f}, predicted {summary['bubble_predicted']:.3f} "
        f"(simulator fed the measured per-op medians; comm latency {1000 * summary['comm_latency_s']:.2f} ms); "
        f"last step makespan {1000 * summary['makespan_measured_s']:.0f} ms measured, "
        f"{1000 * summary['makespan_predicted_s']:.0f} ms predicted",
    ]
    off = summary.get("offload")
    if off:
        lines += _offload_lines(off)
    lines += _mesh_lines(summary.get("mesh")) + _plan_lines(summary.get("plan"))
    lines += [
        "",
        f"{'rank':>4} {'step ms':>8} {'busy ms':>8} {'bubble':>7} {'pred':>6} "
        f"{'peak act MiB':>12} {'pred MiB':>9} {'err':>6}"
        + (f" {'host MiB':>9} {'moved MiB':>10} {'no-offload MiB':>15}" if off else ""),
    ]
    for r, row in enumerate(summary["ranks"]):
        lines.append(
            f"{row['rank']:>4} {1000 * summary['mean_step_time_s'][r]:>8.0f} {1000 * row['busy_s']:>8.0f} "
            f"{row['bubble_measured']:>7.3f} {row['bubble_predicted']:>6.3f} "
            f"{_mib(row['peak_memory_measured']):>12} {_mib(row['peak_memory_predicted']):>9} "
            f"{100 * row['peak_memory_error']:>5.1f}%"
            + (f" {_mib(off['host_peak_bytes'][r]):>9} {_mib(off['moved_bytes'][r]):>10} "
               f"{_mib(off['peak_predicted_no_offload'][r]):>15}" if off else "")
        )
    lines += [
        "",
        f"(step ms: mean over steps 2..; busy, bubble: last step; activation memory by the "
        f"{summary['memory_meter']} meter"
        + ("; peak act = device-resident, host = peak host memory in use, moved = device->host bytes per step, "
           "no-offload = predicted peak without offload)" if off else ")"),
        f"outputs in {out}/: " + ", ".join(Path(v).name for v in summary["files"].values() if not v.startswith("not ")),
    ]
    if summary.get("skipped_steps"):
        lines.append(f"skipped steps (non-finite loss or gradients): {', '.join(map(str, summary['skipped_steps']))}")
    if summary.get("checkpoint_dir"):
        resumed = f"; resumed from {summary['resumed_from']}" if summary.get("resumed_from") else ""
        lines.append(f"checkpoints in {summary['checkpoint_dir']}/{resumed}")
    return "\n".join(lines)
