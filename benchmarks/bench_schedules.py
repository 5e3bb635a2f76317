"""Speed of every schedule family at scale (issue 24): whole process, one table.

    python benchmarks/bench_schedules.py                 # every family at p=64, m=512 (v=2 where it applies)
    python benchmarks/bench_schedules.py --large         # + 1f1b, zb-v, v-half at p=128, m=4096
    python benchmarks/bench_schedules.py --only zb-v,v-half --sizes 64x512,128x4096
    python benchmarks/bench_schedules.py --zero-bubble   # the older zb-auto / zb-v quality table at p=32, m=256

Each cell is one run of ``pipeoffload simulate NAME -p P -m M --json`` in a fresh process
(generate + validate, with the deadlock proof, + time + report; the package's bytecode
written first, as an installed wheel has it: :func:`compile_package`): wall seconds, CPU
seconds (user + system: what the run itself cost, stable when the machine is shared)
and the process's peak resident memory. The issue's targets: <= 2 s at p=64, m=512 for
every family; <= 10 s and <= 1 GiB at p=128, m=4096 for 1f1b, zb-v and v-half (wall,
on a quiet machine; the "target" column judges the CPU seconds, which are the wall
seconds of a quiet machine and do not grow with other people's load). ``-m bench`` runs
the same checks (tests/test_speed.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass

#: The issue's targets: (p, m) -> (seconds, peak RSS in MiB or None).
TARGETS = {(64, 512): (2.0, None), (128, 4096): (10.0, 1024.0)}
#: Families held to the p=128, m=4096 target.
LARGE = ("1f1b", "zb-v", "v-half")


@dataclass
class Run:
    """One whole-process run: wall and CPU seconds, peak RSS (MiB), exit status."""

    name: str
    p: int
    m: int
    wall_s: float
    cpu_s: float
    rss_mib: float
    rc: int


def families() -> list[str]:
    """Every registry family (gpipe included: it is one)."""
    from pipeoffload.schedules import names

    return names()


def compile_package() -> None:
    """Write the package's bytecode, as installing its wheel does (pip compiles every module).
    An editable checkout under ``PYTHONDONTWRITEBYTECODE=1`` (this machine sets it) would
    otherwise compile every module again in every timed run (≈ 0.06 s), which is not the
    command's own time. ``make install`` does the same once; this keeps it fresh after edits."""
    import compileall

    import pipeoffload

    compileall.compile_dir(os.path.dirname(pipeoffload.__file__), quiet=1)


def run_one(name: str, p: int, m: int, timeout: float = 900.0) -> Run:
    """``pipeoffload simulate NAME -p P -m M --json`` in a child process; its own rusage."""
    cmd = [sys.executable, "-m", "pipeoffload", "simulate", name, "-p", str(p), "-m", str(m), "--json"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    proc.returncode = rc  # reaped here, not by Popen
    if rc != 0:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
        print(f"{name} p={p} m={m}: exit {rc}: {err[-1] if err else ''}", file=sys.stderr)
    proc.stderr.close()
    return Run(name, p, m, wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, rc)


def table(runs: list[Run]) -> str:
    """The Markdown table: family x size, seconds (wall / CPU) and peak RSS, and the target."""
    out = ["| family | p | m | wall s | CPU s | peak RSS MiB | target |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        secs, rss = TARGETS.get((r.p, r.m), (None, None))
        if r.rc != 0:
            verdict = f"failed (exit {r.rc})"
        elif secs is None:
            verdict = ""
        else:
            ok = r.cpu_s <= secs and (rss is None or r.rss_mib <= rss)  # CPU: wall on a quiet machine
            verdict = ("met" if ok else "missed") + f" (<= {secs:g} s" + (f", <= {rss:g} MiB)" if rss else ")")
        out.append(f"| {r.name} | {r.p} | {r.m} | {r.wall_s:.2f} | {r.cpu_s:.2f} | {r.rss_mib:.0f} | {verdict} |")
    return "\n".join(out)


def zero_bubble() -> None:
    """The older quality table: zb-h1/h2/auto/v at p=32, m=256 under three cost sets."""
    from pipeoffload.costs import Costs
    from pipeoffload.passes.timing import simulate
    from pipeoffload.schedules import generate

    print("== zero bubble, p=32 m=256 ==")
    for label, costs in (
        ("unit costs", Costs()),
        ("ZB paper 1.5B costs", Costs(F=18.522, B=18.086, W=9.337, comm=0.601)),
        ("unequal stages",
         Costs(comm=0.05, rank_costs=tuple((1.0 + 0.02 * r, 1.1, 0.7 + 0.01 * r) for r in range(32)))),
    ):
        print(f"-- {label}")
        for name, kw in (("zb-h1", {}), ("zb-h2", {}), ("zb-auto", {}), ("zb-auto", {"mem_limit": 64}), ("zb-v", {})):
            t0 = time.perf_counter()
            sched = generate(name, 32, 256, costs=costs, **kw)  # includes validation
            tl = simulate(sched, costs)
            span = max(ev[-1].end - ev[0].start for ev in (tl.rank_events(r) for r in range(tl.num_ranks)))
            print(f"{name:<8}{str(kw) if kw else '':<18} total {time.perf_counter() - t0:5.2f}s  "
                  f"bubble {tl.bubble_rate:.4f}  iteration bubble {1 - max(tl.busy()) / span:.4f}  "
                  f"peak {max(tl.peak_memory()):g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated families (default: every registry family)")
    ap.add_argument("--sizes", default="64x512", help="comma-separated PxM (default 64x512)")
    ap.add_argument("--large", action="store_true", help="also 1f1b, zb-v and v-half at p=128, m=4096")
    ap.add_argument("--zero-bubble", action="store_true", help="the older zb quality table instead")
    args = ap.parse_args()
    if args.zero_bubble:
        zero_bubble()
        return
    names = args.only.split(",") if args.only else families()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    compile_package()
    runs = [run_one(n, p, m) for p, m in sizes for n in names]
    if args.large:
        runs += [run_one(n, 128, 4096) for n in LARGE if (128, 4096) not in sizes]
    print(table(runs))


if __name__ == "__main__":
    main()
