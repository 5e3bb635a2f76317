"""Record and compare what the ZB-V and V generators produce, to prove a speed change changed
no result (issue 24): ``pipeoffload simulate NAME ... --json --ops`` (every op's start and end,
the memory curves, the report) over a grid, in one process, hashed per case.

    python benchmarks/generator_outputs.py record FILE [--quick]    # before the change
    python benchmarks/generator_outputs.py compare FILE [--quick]   # after: lists every case that differs

Grid: zb-v, v-min, v-half, v-zb, v-auto (``--families`` to choose); p = 2..9, 12, 16 (``--quick``:
2, 3, 4, 6, 8, 9); a few m from 1 to 3p+2; unit costs and four F:B:W(:comm) settings; with
``--offload auto``, a memory limit, and unequal memory deltas on some. ``--quick`` has 832 cases
(about 90 s CPU), the full grid 1240 (about 230 s CPU). ``--large`` is another grid: p = 4, 8, 16,
32 at m = 320 and 517, past the point (m′ ≈ 270–300) where the V lowerings build their candidates on
fewer microbatches and insert the missing periods (docs/algorithms.md §9.2), with unit costs and one
setting of binary fractions; 80 cases of the default families.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
from typing import Iterator

from pipeoffload.cli import main

FAMILIES = ["zb-v", "v-min", "v-half", "v-zb", "v-auto"]
COSTS = [None, "F=1,B=2,W=1", "F=1,B=1.5,W=0.5,comm=0.1", "F=1.3,B=1,W=2.1,comm=0.05", "F=2,B=1,W=1"]


def large_cases(families: list[str]) -> Iterator[list[str]]:
    """The ``--large`` grid: sizes where the periodic shortcuts of the V lowerings fire."""
    for fam in families:
        for p in (4, 8, 16, 32):
            for m in (320, 517):
                for c in (None, "F=1,B=1.5,W=0.5,comm=0.125"):
                    yield [fam, "-p", str(p), "-m", str(m)] + (["--costs", c] if c else [])


def cases(families: list[str], quick: bool) -> Iterator[list[str]]:
    """The command-line arguments of each case (without ``--json --ops``)."""
    ps = [2, 3, 4, 6, 8, 9] if quick else [2, 3, 4, 5, 6, 7, 8, 9, 12, 16]
    for fam in families:
        for p in ps:
            ms = sorted({1, p, 2 * p + 1, 3 * p + 2} if p <= 9 else {p, 2 * p + 3})
            for m in ms:
                for ci, c in enumerate(COSTS):
                    if fam == "v-auto" and p > 9 and ci > 1:
                        continue
                    args = [fam, "-p", str(p), "-m", str(m)] + (["--costs", c] if c else [])
                    yield args
                    if ci in (0, 2) and m >= p:
                        yield args + ["--offload", "auto"]
                    if ci == 1 and fam in ("zb-v", "v-auto"):
                        yield args + ["--mem-limit", str(max(1, p // 2 + 1))]
            if fam in ("v-half", "zb-v") and p in (4, 8):
                yield [fam, "-p", str(p), "-m", str(3 * p), "--memory", "F=2,B=-0.5,W=-1.5"]


def run_case(args: list[str]) -> list:
    """``[exit status, sha256 of the --json --ops output]`` of one case."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["simulate"] + args + ["--json", "--ops"])
    return [rc, hashlib.sha256(out.getvalue().encode()).hexdigest()]


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("file", help="the recorded outputs (JSON: case -> [status, hash])")
    ap.add_argument("--quick", action="store_true", help="the smaller grid")
    ap.add_argument("--large", action="store_true", help="the large-m grid instead (80 cases)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families")
    a = ap.parse_args()
    ref = None
    if a.mode == "compare":
        with open(a.file) as f:
            ref = json.load(f)
    res, bad = {}, 0
    fams = a.families.split(",")
    for args in (large_cases(fams) if a.large else cases(fams, a.quick)):
        key = " ".join(args)
        res[key] = run_case(args)
        if ref is not None and ref.get(key) != res[key]:
            bad += 1
            print("differs:", key, flush=True)
    if ref is None:
        with open(a.file, "w") as f:
            json.dump(res, f, indent=0)
    print(f"{len(res)} cases, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(cli())
