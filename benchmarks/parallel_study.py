"""PP with offload vs TP vs PP×TP vs PP×DP on this machine: the same model, the same global
batch, 4 processes each; then the planner's answer for the PipeOffload paper's setting.

    .venv/bin/python benchmarks/parallel_study.py [--steps 8] [--out runs/parallel-study] [--json FILE]
    .venv/bin/python benchmarks/parallel_study.py --planner-only

Each configuration is one ``pipeoffload train`` run (real processes, gloo on CPU); the table
takes, from its ``summary.json``, the step time (mean over steps 2.., slowest rank) and every
rank's peak activation memory (saved-tensors meter, last step) with its (pp, dp, tp)
coordinates. The planner part runs ``pipeoffload plan --json`` for a paper-scale model and
reports the fastest pure-TP configuration next to the fastest PP-with-offload one. Not a test
(minutes on a 2-core machine); docs/parallel-study.md holds a run's output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The model every configuration trains (kv_heads = heads so that TP=4 splits it evenly).
MODEL = ["--layers", "8", "--hidden", "128", "--heads", "4", "--kv-heads", "4", "--seq-len", "128",
         "--microbatch-size", "4"]
#: Global batch: 8 microbatches of 4 sequences (a DP replica runs 8 / dp of them).
GLOBAL_MICROBATCHES = 8

#: name -> (pipeline ranks, dp, tp, schedule flags)
CONFIGS: dict[str, tuple[int, int, int, list[str]]] = {
    "PP4 + offload": (4, 1, 1, ["-s", "group-interleaved", "-v", "2", "--offload", "auto"]),
    "TP4": (1, 1, 4, ["-s", "1f1b", "--offload", "none"]),
    "PP2 × TP2": (2, 1, 2, ["-s", "group-interleaved", "-v", "2", "--offload", "none"]),
    "PP2 × DP2": (2, 2, 1, ["-s", "group-interleaved", "-v", "2", "--offload", "none"]),
}

#: The planner's side: PipeOffload's comparison of PP + offload with TP at the same GPU count —
#: a GPT-3-like 28.3B model (ZB's largest) at sequence 4096 on one node of 8 A100s, where the
#: states do not fit without sharding (DP = 1), in PipeOffload's runtime setting.
PLAN = ["--model", "28.3B", "--hardware", "a100-80g", "--gpus", "8", "--seq", "4096", "--po-runtime"]


def command(name: str, steps: int, out: Path) -> list[str]:
    """The ``pipeoffload train`` command line of configuration ``name``."""
    p, dp, tp, sched = CONFIGS[name]
    return ([sys.executable, "-m", "pipeoffload", "train", "-p", str(p), "--dp", str(dp), "--tp", str(tp),
             "-m", str(GLOBAL_MICROBATCHES // dp), "--steps", str(steps), "--eval-every", "0", "--no-progress",
             "--timeout", "300", "-o", str(out)] + sched + MODEL)


def run_config(name: str, steps: int, out: Path) -> dict:
    """One configuration: its command, wall time and the figures of its summary.json."""
    cmd = command(name, steps, out)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    shown = "pipeoffload " + " ".join(cmd[3:]).replace(str(out), f"runs/parallel-study/{out.name}")
    if r.returncode != 0:
        return {"name": name, "command": shown, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    s = json.loads((out / "summary.json").read_text())
    mesh = s["mesh"]
    return {
        "name": name, "command": shown, "wall_s": wall,
        "step_time_s": mesh["step_time_s"],
        "bubble": s["bubble_measured"],
        "dp_comm_s": mesh["dp_comm_s_max"], "tp_comm_s": mesh["tp_comm_s_max"],
        "ranks": [{k: row[k] for k in ("rank", "pp", "dp", "tp", "peak_memory")} for row in mesh["ranks"]],
        "loss": s["losses"][-1],
    }


def planner(extra: list[str]) -> dict:
    """``pipeoffload plan --json`` (``extra``: its arguments, default :data:`PLAN`): the fastest
    pure-TP configuration (PP = 1) and the fastest pipeline with offload (TP = 1, offload on),
    each with the plan's figures."""
    cmd = [sys.executable, "-m", "pipeoffload", "plan", *(extra or PLAN), "--top", "1000", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        return {"command": "pipeoffload " + " ".join(cmd[3:]), "error": r.stderr.strip()}
    res = json.loads(r.stdout)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)

    def best(pred):
        fits = [c for c in res["configs"] if c["fits"] and pred(c)]
        return min(fits, key=lambda c: c["iteration_s"]) if fits else None

    return {
        "command": "pipeoffload " + " ".join(cmd[3:]), "commit": commit.stdout.strip(),
        "best": res["best"],
        "tp": best(lambda c: c["pp"] == 1 and c["tp"] > 1),
        "pp_offload": best(lambda c: c["tp"] == 1 and c["offload_chunks"] > 0),
        "pp": best(lambda c: c["tp"] == 1),
    }


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f}"


def markdown(rows: list[dict], plan: dict | None) -> str:
    """The study as Markdown: the measured table, the commands, the planner's answer."""
    out = ["| configuration | step time (ms) | bubble | peak activation MiB per rank (pp,dp,tp) | max | "
           "DP comm ms | TP comm ms |", "|---|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['name']} | failed: {r['error']} | | | | | |")
            continue
        per = ", ".join(f"({x['pp']},{x['dp']},{x['tp']}) {_mib(x['peak_memory'])}" for x in r["ranks"])
        peak = max(x["peak_memory"] for x in r["ranks"])
        out.append(f"| {r['name']} | {1000 * r['step_time_s']:.0f} | {r['bubble']:.3f} | {per} | {_mib(peak)} | "
                   f"{1000 * r['dp_comm_s']:.1f} | {1000 * r['tp_comm_s']:.1f} |")
    out += ["", "Commands (from the repository root):", "", "```"]
    out += [r["command"] for r in rows]
    out += ["```"]
    if plan:
        out += ["", f"Planner (`{plan['command']}`, commit {plan.get('commit', '?')}):", ""]
        if "error" in plan:
            out.append(f"failed: {plan['error']}")
        else:
            out += ["| planner's pick | iteration s | MFU | bubble | device GiB | activations GiB |",
                    "|---|---:|---:|---:|---:|---:|"]
            for label, key in (("best overall", "best"), ("best pure TP (PP=1)", "tp"),
                               ("best PP + offload (TP=1)", "pp_offload"), ("best PP, TP=1", "pp")):
                c = plan.get(key)
                if c is None:
                    out.append(f"| {label} | none fits | | | | |")
                    continue
                desc = (f"{c['family']} TP={c['tp']} PP={c['pp']} DP={c['dp']} m={c['microbatches']}"
                        + (", recompute" if c["recompute"] else "")
                        + (f", offload C={c['offload_chunks']}" if c["offload_chunks"] else ""))
                out.append(f"| {label}: {desc} | {c['iteration_s']:.3f} | {100 * c['mfu']:.1f}% | "
                           f"{100 * c['bubble_rate']:.1f}% | {c['memory']['device_gib']:.1f} | "
                           f"{c['memory']['activations_gib']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per configuration (default 8)")
    ap.add_argument("--out", default="runs/parallel-study", help="output folders (one per configuration)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="which configurations (comma-separated names)")
    ap.add_argument("--planner-only", action="store_true", help="only the planner's side")
    ap.add_argument("--plan-args", default="", help="pipeoffload plan's arguments instead of the paper setting "
                                                    f"({' '.join(PLAN)}; space-separated)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the raw figures as JSON")
    args = ap.parse_args(argv)
    rows = []
    if not args.planner_only:
        for i, name in enumerate(n.strip() for n in args.configs.split(",") if n.strip()):
            rows.append(run_config(name, args.steps, Path(args.out).resolve() / f"config{i}"))
            print(f"{name}: {rows[-1].get('step_time_s', rows[-1].get('error'))}", file=sys.stderr, flush=True)
    plan = planner(args.plan_args.split())
    text = markdown(rows, plan)
    print(f"machine: {os.cpu_count()} CPU cores; {args.steps} steps per configuration\n")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "plan": plan}, indent=2))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
