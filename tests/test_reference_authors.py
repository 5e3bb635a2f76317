"""Never worse than the papers' authors: our schedules, with their defaults, against the reference
figures of the authors' own schedulers (tests/data/authors_reference.json, made by
benchmarks/reference_authors.py; docs/schedules.md).

Every row holds one configuration where the authors' code yields a schedule, its order timed by
our simulator: ours must have a bubble rate at most theirs + 0.003 and a peak at most theirs,
under the same costs and memory model. CI checks an evenly spread sample of every family
(one row in seven; one in 21 for V-Min, V-Half and V-auto, whose cost-aware lowerings are the
slow part; for the offload rows 16 rows spread over the grid), about 50 s of CPU in all.
``pytest -m bench`` checks all of them. No family has a slack beyond BUBBLE_SLACK: V-auto's former gaps closed with the grid
lowering (pipeoffload.schedules.v_grid_lowering; docs/schedules.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import PipeoffloadError
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate

DATA = json.loads((Path(__file__).parent / "data" / "authors_reference.json").read_text())
ROWS = [dict(zip(DATA["columns"], r)) for r in DATA["rows"]]
BUBBLE_SLACK = 0.003
#: CI checks every SAMPLE-th row of each family, at most OFFLOAD_SAMPLE offload rows (all of them under -m bench).
SAMPLE = 11  # coprime to the 16 cost × comm × memory rows of each (p, m): every combination is sampled
OFFLOAD_SAMPLE = 16
#: Families whose generators run the costly cost-aware lowerings (W refill, hole filling, the
#: grid lowering) are sampled one row in SLOW_SAMPLE (also coprime to 16) to keep CI short.
SLOW_SAMPLE = 33
SLOW_FAMILIES = frozenset({"v-min", "v-half", "v-auto"})


def _inputs(row: dict) -> tuple[Costs, MemoryDeltas]:
    mem = [row["v"] * x for x in DATA["memory_models"][row["memory_model"]]]
    return Costs(F=row["F"], B=row["B"], W=row["W"], comm=row["comm"]), MemoryDeltas(*mem)


def ours(row: dict) -> tuple[float, float]:
    """Our bubble rate and peak for the row's configuration, with our defaults."""
    costs, memory = _inputs(row)
    fam, p, m = row["family"], row["p"], row["m"]
    if fam == "v-auto":
        # Their search returns one point of the memory/bubble trade-off within max_mem; ours
        # at that limit may spend more of it for a lower bubble. Checked at their limit and,
        # when their peak is lower, at their peak: the point that meets both bounds counts.
        limit = row["mem_limit"] * memory.F / 2
        at_limit = _best_v(p, m, costs, memory, limit)
        if at_limit[1] <= row["peak"] * (1 + 1e-9) + 1e-9:
            return at_limit
        return _best_v(p, m, costs, memory, row["peak"] * memory.F / 2)
    kw = {k: row[k] for k in ("g", "mem_limit") if row[k] is not None}
    if fam == "interleaved-1f1b":
        kw["v"] = 2
    sched = generate(fam, p=p, m=m, costs=costs, memory=memory, **kw)
    tl = simulate(sched, costs, memory)
    if row["offload_chunks"] is None:
        return tl.bubble_rate, max(tl.peak_memory())
    # Theirs offloads chunks < C and drops what it cannot place; ours with its defaults for "up
    # to C chunks" (auto: "skip" mode, the best C' <= C within 1% of the makespan).
    res = plan_offload(sched, tl, comm=costs.comm, auto=True, offload_chunks=row["offload_chunks"],
                       offload_time=row["offload_time"])
    return tl.bubble_rate, max(res.peak)


def _best_v(p: int, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> tuple[float, float]:
    """The authors' V-auto searches building blocks under a memory limit; ours at that limit is
    the best V schedule that fits it: our V-auto (its block search, which includes V-Min,
    V-Half and V-ZB) or ZB-V at the limit."""
    best = None
    for name, kw in [("v-auto", {"mem_limit": limit}), ("zb-v", {"mem_limit": limit})]:
        try:
            tl = simulate(generate(name, p=p, m=m, costs=costs, memory=memory, **kw), costs, memory)
        except PipeoffloadError:
            continue
        peak = max(tl.peak_memory())
        if peak <= limit * (1 + 1e-9) and (best is None or tl.bubble_rate < best[0] - 1e-9
                                           or (tl.bubble_rate <= best[0] + 1e-9 and peak < best[1])):
            best = (tl.bubble_rate, peak)
    assert best is not None
    return best


def _label(row: dict) -> str:
    extra = "".join(f" {k}={row[k]}" for k in ("g", "mem_limit", "offload_chunks", "offload_time") if row[k] is not None)
    return (f"{row['family']} p={row['p']} m={row['m']}{extra} costs={row['F']:g},{row['B']:g},{row['W']:g},"
            f"{row['comm']:g} memory={row['memory_model']}")


def _check(row: dict) -> str | None:
    bubble, peak = ours(row)
    if bubble > row["bubble"] + BUBBLE_SLACK or peak > row["peak"] * (1 + 1e-9) + 1e-9:
        return f"{_label(row)}: ours {bubble:.4f} / {peak:g}, theirs {row['bubble']:.4f} / {row['peak']:g}"
    return None


def _sample(rows: list[dict]) -> list[dict]:
    by_family: dict = {}
    for r in rows:
        by_family.setdefault((r["family"], r["offload_chunks"] is not None), []).append(r)
    out = []
    for (family, offload), lst in by_family.items():
        step = SLOW_SAMPLE if family in SLOW_FAMILIES else SAMPLE
        if offload:
            step = max(step, -(-len(lst) // OFFLOAD_SAMPLE))
        out += lst[::step]
    return out


FAMILIES = sorted({(r["family"], r["offload_chunks"] is not None) for r in ROWS})


@pytest.mark.parametrize("family, offload", FAMILIES, ids=[f + ("+offload" if o else "") for f, o in FAMILIES])
def test_never_worse_than_the_authors_sample(family, offload):
    rows = [r for r in _sample(ROWS) if (r["family"], r["offload_chunks"] is not None) == (family, offload)]
    assert rows
    worse = [msg for msg in map(_check, rows) if msg]
    assert not worse, f"{len(worse)} of {len(rows)} rows worse than the authors':\n" + "\n".join(worse[:20])


@pytest.mark.bench
def test_never_worse_than_the_authors_every_row():
    worse = [msg for msg in map(_check, ROWS) if msg]
    assert not worse, f"{len(worse)} of {len(ROWS)} rows worse than the authors':\n" + "\n".join(worse[:40])


def test_the_data_covers_the_grid():
    fams = {r["family"] for r in ROWS}
    assert fams >= {"1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-auto", "zb-v", "v-half", "v-min",
                    "group-interleaved", "v-auto"}
    assert {r["p"] for r in ROWS} == set(range(3, 13))
    assert {r["memory_model"] for r in ROWS} == {"unit", "zb"}
    assert {r["comm"] for r in ROWS} == {0.0, 0.1}
    assert any(r["offload_chunks"] for r in ROWS)
