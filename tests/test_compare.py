"""`pipeoffload compare`: rows for every schedule, P2P counts, Pareto frontier, JSON and PNG."""

from __future__ import annotations

import json

import pytest

from pipeoffload import schedules as registry
from pipeoffload.cli import main
from pipeoffload.studies.compare import Candidate, candidates, compare, p2p_messages, pareto_frontier
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.schedules import ScheduleInfo, generate

from helpers import ALL_SCHEDULES


# --- Pareto frontier ---------------------------------------------------------------------


def test_frontier_hand_made_points():
    pts = [(2, 0.3), (3, 0.1), (4, 0.0), (4, 0.2), (5, 0.0), (3, 0.1), (1, 0.5), (6, 0.6)]
    assert pareto_frontier(pts) == [True, True, True, False, False, True, True, False]


def test_frontier_edge_cases():
    assert pareto_frontier([]) == []
    assert pareto_frontier([(1.0, 1.0)]) == [True]
    # Float noise is not a difference: neither of these dominates the other.
    assert pareto_frontier([(3.0, 0.1), (3.0 + 1e-13, 0.1 - 1e-13)]) == [True, True]
    # Better in one coordinate and equal in the other dominates.
    assert pareto_frontier([(3, 0.1), (3, 0.2), (2, 0.2)]) == [True, False, True]


def test_frontier_matches_brute_force_on_a_grid():
    import itertools
    import random

    rng = random.Random(7)
    for _ in range(50):
        pts = [(rng.randint(0, 5), rng.randint(0, 5) / 10) for _ in range(rng.randint(1, 9))]
        front = pareto_frontier(pts)
        for (x, y), f in zip(pts, front):
            dominated = any(a <= x and b <= y and (a, b) != (x, y) for a, b in pts)
            assert f == (not dominated)
        # The frontier is a staircase: sorted by memory, bubble strictly falls.
        stair = sorted({pt for pt, f in zip(pts, front) if f})
        assert all(b1 > b2 for (_, b1), (_, b2) in itertools.pairwise(stair))


# --- P2P ---------------------------------------------------------------------------------


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (5, 7)])
def test_p2p_counts(p, m):
    assert p2p_messages(generate("1f1b", p=p, m=m)) == 2 * (p - 1) * m
    assert p2p_messages(generate("gpipe", p=p, m=m)) == 2 * (p - 1) * m
    # V placement: two chains of p−1 hops each way, the turn at rank p−1 is local.
    assert p2p_messages(generate("v-half", p=p, m=m)) == 4 * (p - 1) * m
    # Loop placement, v = 2: all 2p−1 boundaries cross ranks.
    assert p2p_messages(generate("interleaved-1f1b", p=p, m=max(m, p))) == 2 * (2 * p - 1) * max(m, p)


# --- the comparison ----------------------------------------------------------------------


def test_candidates_cover_the_registry():
    cands = candidates(4)
    assert {c.name for c in cands} == set(ALL_SCHEDULES)
    gis = [c.params["g"] for c in cands if c.name == "group-interleaved" and not c.offload]
    assert gis == [2, 4]
    # PipeOffload's variants on group-interleaved g = ⌈p/2⌉ (issue 17)
    assert [(c.label, c.params["v"], c.offload) for c in cands if c.offload] == [
        ("PO-half", 2, 1), ("PO-full", 2, 2), ("PO selective v=4 C=1", 4, 1), ("PO selective v=4 C=2", 4, 2),
        ("PO selective v=4 C=3", 4, 3)]
    assert not any(c.offload for c in candidates(4, offload=False)) and not any(c.offload for c in candidates(1))
    assert [c.params for c in cands if c.name == "interleaved-1f1b"] == [{"v": 2}]
    assert [c.params["mem_limit"] for c in cands if c.name == "zb-auto"] == [4, 8]
    assert [c.params["g"] for c in candidates(5) if c.name == "group-interleaved" and not c.offload] == [3, 5]
    assert len([c for c in candidates(1) if c.name == "group-interleaved"]) == 1  # g = 1 once
    assert len({c.label for c in cands}) == len(cands)


def test_compare_p4_m8_unit_costs():
    cmp = compare(4, 8, which=candidates(4, offload=False))  # the plain schedules' frontier
    rows = {r.label: r for r in cmp.rows}
    assert all(r.ok for r in cmp.rows)
    one = rows["1f1b"]
    assert one.bubble_rate == pytest.approx(9 / 33) and one.peak_memory == 4
    assert one.peak_memory_per_rank == [4, 3, 2, 1] and one.p2p_relative == 1.0
    assert rows["v-half"].p2p_relative == 2.0 and rows["v-half"].peak_memory == 3
    assert rows["interleaved-1f1b v=2"].p2p_relative == pytest.approx(7 / 3)
    front = {r.label for r in cmp.frontier}
    # V-Min (2 units) and V-Half (3) are the low-memory end; zero bubble is reached at p units.
    assert {"v-min", "v-half"} <= front
    assert "1f1b" not in front and "gpipe" not in front
    assert min(r.bubble_rate for r in cmp.frontier if r.peak_memory <= 4) == 0.0
    # The frontier is exactly the non-dominated rows.
    ok = [r for r in cmp.rows if r.ok]
    for r in ok:
        dominated = any(
            q.peak_memory <= r.peak_memory and q.bubble_rate <= r.bubble_rate
            and (q.peak_memory, q.bubble_rate) != (r.peak_memory, r.bubble_rate) for q in ok
        )
        assert r.on_frontier == (not dominated), r.label


def test_refusals_become_error_rows():
    cmp = compare(4, 3)
    rows = {r.label: r for r in cmp.rows}
    bad = rows["interleaved-1f1b v=2"]
    assert not bad.ok and bad.error.startswith("m: ") and "4" in bad.error
    assert bad.bubble_rate is None and bad.peak_memory is None and not bad.on_frontier
    assert rows["v-zb"].ok  # the V schedules need no minimum m


def test_unavailable_generator_is_an_error_row(monkeypatch):
    ghost = ScheduleInfo("ghost", "no_such_module", "nothing", "module that does not exist", "loop", 1, True)
    half = ScheduleInfo("half-done", "vshape", "no_such_function", "module without it", "v", 2, True)
    monkeypatch.setitem(registry.SCHEDULES, "ghost", ghost)
    monkeypatch.setitem(registry.SCHEDULES, "half-done", half)
    cmp = compare(4, 8)
    rows = {r.label: r for r in cmp.rows}
    assert rows["ghost"].error.startswith("not available")
    assert rows["half-done"].error.startswith("not available")
    assert rows["1f1b"].ok and len(cmp.rows) == len(candidates(4))


def test_explicit_candidates_and_memory_units():
    cmp = compare(4, 8, Costs(F=1, B=2, W=1), MemoryDeltas(F=10, B=-4, W=-6),
                  which=[Candidate("1f1b", "1f1b"), Candidate("unknown", "nope")])
    one, unknown = cmp.rows
    assert one.peak_memory == 40 and one.p2p_messages == 48
    assert not unknown.ok and "unknown schedule" in unknown.error


def test_compare_rejects_bad_p_and_m():
    from pipeoffload.errors import ParameterError

    with pytest.raises(ParameterError) as e:
        compare(0, 8)
    assert e.value.param == "p"
    with pytest.raises(ParameterError) as e:
        compare(4, 0)
    assert e.value.param == "m"


# --- CLI ---------------------------------------------------------------------------------


def test_cli_json_structure(capsys):
    assert main(["compare", "-p", "4", "-m", "8", "--costs", "F=1,B=1,W=1", "--json", "--no-offload-rows"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["p"] == 4 and obj["m"] == 8 and obj["p2p_baseline"] == 48 and obj["memory_unit"] == "units"
    assert obj["costs"]["F"] == 1 and obj["memory"] == {"F": 1.0, "B": 0.0, "W": -1.0}
    keys = {"label", "schedule", "params", "ok", "error", "bubble_rate", "bubble_rate_makespan", "makespan",
            "peak_memory", "peak_memory_per_rank", "p2p_messages", "p2p_relative", "pareto"}
    assert all(set(r) == keys for r in obj["rows"])
    assert [r["schedule"] for r in obj["rows"]].count("group-interleaved") == 2
    assert set(obj["frontier"]) == {r["label"] for r in obj["rows"] if r["pareto"]}
    assert all(len(r["peak_memory_per_rank"]) == 4 for r in obj["rows"] if r["ok"])


def test_cli_text_and_png(tmp_path, capsys):
    png = tmp_path / "out" / "pareto.png"
    assert main(["compare", "-p", "4", "-m", "3", "--png", str(png), "--no-offload-rows"]) == 0
    out = capsys.readouterr().out
    assert "P2P relative to 1F1B" in out and "* v-min" in out
    assert "interleaved-1f1b v=2" in out and "needs m >= 4" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_cli_parameter_error_is_one_line(capsys):
    assert main(["compare", "-p", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "-p" in err


def test_offload_rows_beside_the_plain_schedules():
    """PO-half/PO-full/selective C go through the offload pass: the peak falls below the same
    schedule's without offload, the bubble does not grow with free transfers, and they can sit on
    the Pareto frontier."""
    cmp = compare(8, 32, offload_time=0.0)
    rows = {r.label: r for r in cmp.rows}
    base = rows["group-interleaved v=2 g=4"]
    assert rows["PO-half"].ok and rows["PO-half"].peak_memory < base.peak_memory
    assert rows["PO-full"].peak_memory <= rows["PO-half"].peak_memory
    assert rows["PO-half"].bubble_rate <= base.bubble_rate + 1e-9
    assert rows["PO-half"].params["offload_chunks"] == 1
    assert any(r.on_frontier for r in cmp.rows if r.label.startswith("PO"))
    with pytest.raises(ParameterError):
        compare(4, 8, offload_time=-1)
