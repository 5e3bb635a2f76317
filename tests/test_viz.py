"""Pictures of a Timeline: PNG, Chrome trace, text grid (pipeoffload.viz)."""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs
from pipeoffload.ir import Op, OpKind
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate
from pipeoffload.timeline import TimedOp, Timeline
from pipeoffload.viz import boxes
from pipeoffload.viz.text import LETTERS, render_grid
from pipeoffload.viz.trace import to_trace, write_trace

from helpers import assert_imports_no_torch


def _tl(name: str, p: int = 4, m: int = 8, costs: Costs | None = None, **kw) -> Timeline:
    return simulate(generate(name, p=p, m=m, **kw), costs)


def _with_offload(tl: Timeline, pairs: bool) -> Timeline:
    """Hand-made offload: each chunk-0 activation with a long enough lifespan goes to
    the host right after its F (d2h, 0.4 long) and comes back just before its B
    (h2d). ``pairs``: as START/END instants; otherwise one event with a duration.
    Adds the curves without offload as ``baseline_memory_curves``."""
    d = 0.4
    base = [tl.memory_curve(r) for r in range(tl.num_ranks)]
    fs = {(e.op.stage, e.op.microbatch): e for e in tl.events if e.op.kind is OpKind.F}
    bs = {(e.op.stage, e.op.microbatch): e for e in tl.events if e.op.kind.is_backward}
    ev = list(tl.events)
    for key, f in fs.items():
        b = bs[key]
        if f.op.chunk != 0 or b.start - f.end < 3 * d:
            continue
        o = f.op

        def mk(k: OpKind) -> Op:
            return Op(k, o.stage, o.microbatch, o.rank, o.chunk)

        if pairs:
            ev += [TimedOp(mk(OpKind.OFFLOAD_START), f.end, f.end, "d2h", 0.0),
                   TimedOp(mk(OpKind.OFFLOAD_END), f.end + d, f.end + d, "d2h", -f.mem),
                   TimedOp(mk(OpKind.RELOAD_START), b.start - d, b.start - d, "h2d", f.mem),
                   TimedOp(mk(OpKind.RELOAD_END), b.start, b.start, "h2d", 0.0)]
        else:
            ev += [TimedOp(mk(OpKind.OFFLOAD_END), f.end, f.end + d, "d2h", -f.mem),
                   TimedOp(mk(OpKind.RELOAD_START), b.start - d, b.start, "h2d", f.mem)]
    meta = dict(tl.meta, baseline_memory_curves=base)
    return Timeline(tl.num_ranks, ev, tl.name + " + offload", tl.num_microbatches, tl.chunks, tl.memory_unit, meta)


def _transfers(tl: Timeline) -> int:
    return sum(1 for e in tl.events if e.op.kind in (OpKind.OFFLOAD_END, OpKind.RELOAD_START))


# --- boxes ---------------------------------------------------------------------------


@pytest.mark.parametrize("pairs", [False, True])
def test_transfer_events_merge_into_one_box_each(pairs: bool) -> None:
    tl = _with_offload(_tl("group-interleaved"), pairs)
    bxs = boxes(tl)
    n = _transfers(tl)
    assert n > 0
    xfer = [b for b in bxs if b.lane in ("d2h", "h2d")]
    assert len(xfer) == n
    assert all(abs(b.duration - 0.4) < 1e-9 for b in xfer)
    assert {b.kind for b in xfer if b.lane == "d2h"} == {"OFFLOAD"}
    assert {b.kind for b in xfer if b.lane == "h2d"} == {"RELOAD"}
    assert sum(1 for b in bxs if b.lane == "compute") == sum(1 for _ in tl.compute_events())


# --- PNG -----------------------------------------------------------------------------


def _png_dims(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _has_colour(path: Path, hex_colour: str, min_pixels: int = 50) -> bool:
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(path)[..., :3]
    want = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img - want).max(axis=-1) < 2 / 255).sum()) >= min_pixels


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "group-interleaved"])
def test_png_written_with_kind_colours(tmp_path: Path, name: str) -> None:
    from pipeoffload.viz.png import KIND_COLORS, draw_timeline

    tl = _tl(name)
    out = draw_timeline(tl, tmp_path / "sub" / f"{name}.png")
    assert out == tmp_path / "sub" / f"{name}.png"
    w, h = _png_dims(out)
    assert 800 <= w <= 4000 and 400 <= h <= 3200
    assert out.stat().st_size > 20_000
    kinds = {e.op.kind.value for e in tl.compute_events()}
    for k in ("F", "B", "W", "BW"):
        assert _has_colour(out, KIND_COLORS[k]) == (k in kinds), k


def test_png_offload_lanes_and_baseline(tmp_path: Path) -> None:
    from pipeoffload.viz.png import KIND_COLORS, draw_timeline

    plain = _tl("group-interleaved")
    tl = _with_offload(plain, pairs=True)
    a = draw_timeline(plain, tmp_path / "plain.png")
    b = draw_timeline(tl, tmp_path / "offload.png", title="hand-made offload")
    assert _has_colour(b, KIND_COLORS["OFFLOAD"]) and _has_colour(b, KIND_COLORS["RELOAD"])
    assert _has_colour(b, "#b03030", 20)  # dashed curve without offload
    assert not _has_colour(a, KIND_COLORS["OFFLOAD"]) and not _has_colour(a, "#b03030", 20)
    # Two extra lanes per rank make the picture taller, not wider.
    (wa, ha), (wb, hb) = _png_dims(a), _png_dims(b)
    assert wa == wb and hb > ha


def test_png_size_grows_with_ops_within_limits(tmp_path: Path) -> None:
    from pipeoffload.viz.png import draw_timeline

    small = _png_dims(draw_timeline(_tl("1f1b", 2, 4), tmp_path / "s.png"))
    big = _png_dims(draw_timeline(_tl("group-interleaved", 4, 16), tmp_path / "b.png"))
    assert big[0] > small[0] and big[1] > small[1]
    assert big[0] <= 4000 and big[1] <= 3200


def test_png_of_empty_timeline(tmp_path: Path) -> None:
    from pipeoffload.viz.png import draw_timeline

    assert _png_dims(draw_timeline(Timeline(2, []), tmp_path / "e.png"))[0] > 0


# --- trace ---------------------------------------------------------------------------


def _compute_multiset(tl: Timeline) -> Counter:
    return Counter((e.rank, e.op.kind.value, e.op.stage, e.op.microbatch) for e in tl.compute_events())


@pytest.mark.parametrize("name", ["1f1b", "group-interleaved"])
def test_trace_has_every_compute_op_once_with_scaled_durations(tmp_path: Path, name: str) -> None:
    tl = _tl(name, costs=Costs(F=1, B=2, W=1, comm=0.25))
    path = write_trace(tl, tmp_path / "t" / "trace.json")
    doc = json.loads(path.read_text())
    evs = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(tl.num_ranks)}
    xs = [e for e in evs if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == set(range(tl.num_ranks))
    assert all(e["tid"] == 0 for e in xs)  # no transfers: compute thread only
    got = Counter((e["pid"], e["args"]["kind"], e["args"]["stage"], e["args"]["microbatch"]) for e in xs)
    assert got == _compute_multiset(tl) and max(got.values()) == 1
    by_key = {(e.rank, e.op.kind.value, e.op.stage, e.op.microbatch): e for e in tl.compute_events()}
    for x in xs:
        src = by_key[(x["pid"], x["args"]["kind"], x["args"]["stage"], x["args"]["microbatch"])]
        assert x["dur"] == pytest.approx(src.duration * 1000)
        assert x["ts"] == pytest.approx((src.start - tl.start) * 1000)
        assert x["args"]["chunk"] == src.op.chunk and x["args"]["memory_delta"] == pytest.approx(src.mem)
    for r, peak in enumerate(tl.peak_memory()):
        levels = [c["args"][tl.memory_unit] for c in evs if c["ph"] == "C" and c["pid"] == r]
        assert levels and max(levels) == pytest.approx(peak)


def test_trace_seconds_become_microseconds() -> None:
    base = _tl("1f1b", 2, 2)
    t0 = 1_700_000_000.0  # measured timelines carry wall-clock seconds
    evs = [TimedOp(e.op, t0 + e.start * 0.01, t0 + e.end * 0.01, e.stream, e.mem) for e in base.events]
    tl = Timeline(2, evs, "measured", 2, 1, "bytes", {"time_unit": "s"})
    xs = [e for e in to_trace(tl)["traceEvents"] if e["ph"] == "X"]
    assert sorted(x["dur"] for x in xs) == pytest.approx(sorted(e.duration * 1e6 for e in evs), abs=1e-3)
    assert min(x["ts"] for x in xs) == 0


def test_trace_transfer_threads() -> None:
    tl = _with_offload(_tl("group-interleaved"), pairs=True)
    evs = to_trace(tl)["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads[(0, 0)] == "compute" and threads[(0, 1)] == "d2h" and threads[(0, 2)] == "h2d"
    xs = [e for e in evs if e["ph"] == "X"]
    assert sum(1 for e in xs if e["tid"] in (1, 2)) == _transfers(tl)
    assert sum(1 for e in xs if e["tid"] == 0) == sum(1 for _ in tl.compute_events())
    assert {e["name"] for e in evs if e["ph"] == "C"} == {"memory", "memory without offload"}


# --- text grid -----------------------------------------------------------------------


def _rows(grid: str, p: int) -> list[str]:
    lines = grid.splitlines()
    rows = [ln for ln in lines if ln.split("|")[0].strip() in {f"r{r}" for r in range(p)}]
    assert [r.split("|")[0].strip() for r in rows] == [f"r{r}" for r in range(p)]
    return [r.split("|", 1)[1] for r in rows]


def _label(e: TimedOp) -> str:
    ch = LETTERS[e.op.kind.value]
    return ch.lower() if e.op.chunk > 0 else ch


@settings(deadline=None)
@given(
    name=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "group-interleaved"]),
    p=st.integers(1, 4),
    extra=st.integers(0, 4),
    costs=st.sampled_from([Costs(), Costs(F=1, B=2, W=1), Costs(F=2, B=3, W=1, comm=1)]),
)
def test_text_grid_is_exact_for_small_unit_schedules(name: str, p: int, extra: int, costs: Costs) -> None:
    m = p + extra
    tl = _tl(name, p, m, costs=costs)
    grid = render_grid(tl, width=400)
    rows = _rows(grid, p)
    head = grid.splitlines()[0]
    assert "exact, 1 cell = " in head
    q = float(head.split("1 cell = ")[1].split()[0])
    assert q >= 0.5  # costs here are whole units, v <= 2
    w = 1 + len(str(m - 1))
    for e in tl.compute_events():
        col = round((e.start - tl.start) / q) * w
        assert rows[e.rank][col:col + w].rstrip() == f"{_label(e)}{e.op.microbatch}"
    for r, row in enumerate(rows):
        cells = [row[i:i + w] for i in range(0, len(row), w)]
        assert sum(c != "." * w for c in cells) == pytest.approx(tl.busy()[r] / q)


def test_text_grid_letters_legend_and_summary() -> None:
    tl = _tl("group-interleaved", 4, 8)
    grid = render_grid(tl)
    rows = _rows(grid, 4)
    for ch in "FBWfbw":
        assert all(ch in row for row in rows), ch
    assert "X" not in "".join(rows)
    lines = grid.splitlines()
    assert lines[0].startswith("legend:") and "B=B" in lines[0] and "lower case = chunk" in lines[0]
    assert "bubble 14.29%" in grid and "peak per rank: 3, 2.5, 2, 1.5" in grid
    assert "X=BW" in render_grid(_tl("1f1b", 2, 2)).splitlines()[0]


def test_text_grid_quantises_to_width() -> None:
    tl = _tl("group-interleaved", 8, 16)
    grid = render_grid(tl, width=60)
    rows = _rows(grid, 8)
    assert "quantised" in grid.splitlines()[0]
    assert all(len(f"r{r} |" + row) <= 60 for r, row in enumerate(rows))
    assert all(set(row) <= set("FBWfbw.") for row in rows)


def test_text_grid_transfer_rows() -> None:
    tl = _with_offload(_tl("group-interleaved", 4, 8), pairs=False)
    grid = render_grid(tl)
    assert "exact" in grid.splitlines()[0]  # transfers do not spoil the compute grid
    d2h = [ln for ln in grid.splitlines() if ln.startswith("r0 d2h")]
    h2d = [ln for ln in grid.splitlines() if ln.startswith("r0 h2d")]
    assert d2h and "O" in d2h[0] and h2d and "R" in h2d[0]
    _rows(grid, 4)


# --- import weight -------------------------------------------------------------------


def test_trace_and_text_import_neither_torch_nor_matplotlib() -> None:
    assert_imports_no_torch("pipeoffload.viz.trace", "pipeoffload.viz.text", "pipeoffload.viz.png",
                            forbidden=("torch", "matplotlib"))
