"""The exact scheduler (pipeoffload.solver, `pipeoffload simulate optimal`): small instances only
(each proved optimal in a few seconds); the optimality-gap table is benchmarks/optimality_gap.py."""

from __future__ import annotations

import json

import pytest

from helpers import assert_imports_no_torch
from pipeoffload.cli import main
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.passes.timing import simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules import generate

from helpers import missing, require  # noqa: E402

if require("ortools") is None:  # CI must run these: fail, do not skip (conftest.py)
    pytestmark = missing("OR-Tools", "the solver extra: pip install -e '.[solver]'")
    SolverOffload = solve = None
else:
    from pipeoffload.solver import SolverOffload, solve  # noqa: E402

FAST = dict(time_limit=30.0)


def _heuristic(name: str, p: int, m: int, costs: Costs, **kw):
    s = generate(name, p=p, m=m, costs=costs, **kw)
    return simulate(s, costs)


@pytest.mark.parametrize("costs", [Costs(), Costs(F=1, B=2, W=1, comm=0.1), Costs(F=1, B=1, W=0.5)])
def test_loop_optimum_is_no_worse_than_zb_auto(costs):
    res = solve(3, 4, costs=costs, **FAST)
    assert res.optimal and res.gap == 0
    validate(res.schedule)
    assert max(res.timeline.peak_memory()) <= 3 + 1e-9
    assert res.timeline.bubble_rate <= _heuristic("zb-auto", 3, 4, costs).bubble_rate + 1e-9
    assert res.timeline.bubble_rate <= _heuristic("zb-h1", 3, 4, costs).bubble_rate + 1e-9
    # The timing pass only starts ops earlier than the solver planned: never a longer span.
    assert max(res.timeline.spans()) <= res.span + 1e-9


def test_v_placement_with_a_tight_limit():
    costs = Costs(F=2, B=2, W=2)
    res = solve(3, 3, placement="v", mem_limit=2, costs=costs, **FAST)
    assert res.optimal
    assert res.schedule.placement.kind == "v"
    assert max(res.timeline.peak_memory()) <= 2 + 1e-9
    assert res.timeline.bubble_rate <= _heuristic("v-min", 3, 3, costs).bubble_rate + 1e-9


def test_memory_limit_is_respected_with_byte_deltas():
    mem = MemoryDeltas(F=201216, B=-127488, W=-73728)
    limit = 2 * 201216
    res = solve(3, 4, memory=mem, mem_limit=limit, **FAST)
    tl = simulate(res.schedule, Costs(), mem)
    assert max(tl.peak_memory()) <= limit
    assert res.optimal


def test_offload_decisions_lower_the_reachable_bubble():
    """With free transfers, offloading chunk 0 lets the solver keep the bubble of a larger
    memory limit under a small one."""
    costs = Costs(F=2, B=2, W=2)
    tight = solve(3, 3, placement="v", mem_limit=1, costs=costs, **FAST)
    off = solve(3, 3, placement="v", mem_limit=1, costs=costs, offload=SolverOffload(1, 0.0), **FAST)
    assert off.offload is not None and off.offload.transfers
    assert max(off.offload.peak) <= 1 + 1e-9
    assert off.span <= tight.span + 1e-9
    validate(off.schedule.compute_only())


@pytest.mark.parametrize("time_limit", [0.05, 1.0])
def test_unproven_result_reports_the_gap_and_is_no_worse_than_the_hint(time_limit):
    """p = 4, m = 8, B = 2F at V-Min's memory: not proven within seconds (docs/solver.md). The
    result is still a valid schedule within the limit, no worse than the best generator that fits
    (the default hint; returned as is when CP-SAT finds nothing in time), with an honest gap."""
    costs = Costs(F=2, B=4, W=2)
    res = solve(4, 8, placement="v", mem_limit=2, costs=costs, time_limit=time_limit, workers=1)
    assert res.status == "feasible" and not res.optimal
    validate(res.schedule)
    assert max(res.timeline.peak_memory()) <= 2 + 1e-9
    assert 0 < res.gap <= 1 and res.span_bound <= res.span * (1 - res.gap) + 1e-9
    assert res.bubble_bound <= res.timeline.bubble_rate + 1e-9
    assert res.timeline.bubble_rate <= _heuristic("v-min", 4, 8, costs).bubble_rate + 1e-9


def test_bad_input_names_the_parameter():
    with pytest.raises(ParameterError) as e:
        solve(3, 3, placement="ring")
    assert e.value.param == "placement"
    with pytest.raises(ParameterError) as e:
        solve(3, 3, mem_limit=0.5)
    assert e.value.param == "mem_limit"
    with pytest.raises(ParameterError) as e:
        solve(3, 3, time_limit=0)
    assert e.value.param == "time_limit"
    with pytest.raises(ParameterError) as e:
        solve(3, 3, placement="v", v=3)
    assert e.value.param == "v"


def test_cli_simulate_optimal_json(capsys):
    rc = main(["simulate", "optimal", "-p", "3", "-m", "4", "--costs", "F=1,B=2,W=1,comm=0.1", "--time-limit", "30",
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == "optimal"
    assert out["solver"]["optimal"] is True and out["solver"]["gap"] == 0
    assert out["bubble_rate"] <= out["solver"]["bubble_rate"] + 1e-9


def test_cli_simulate_optimal_text_and_errors(capsys):
    assert main(["simulate", "optimal", "-p", "3", "-m", "3", "--placement", "v", "--mem-limit", "2",
                 "--time-limit", "30"]) == 0
    assert "optimal (proven)" in capsys.readouterr().out
    assert main(["simulate", "zb-h1", "--placement", "v"]) == 2
    assert "--placement" in capsys.readouterr().err
    assert main(["simulate", "optimal", "-p", "3", "-m", "3", "--offload", "auto", "--offload-chunks", "1"]) == 2
    assert "--offload" in capsys.readouterr().err


@pytest.mark.parametrize("placement", ["loop", "v"])
def test_cli_simulate_optimal_decides_offload_itself(placement, capsys):
    # --offload auto: any chunk may leave; the solver picks which activations, when each copy
    # starts and returns, under a limit below the no-offload peak, and proves it optimal
    rc = main(["simulate", "optimal", "-p", "2", "-m", "4", "--placement", placement, "--mem-limit", "1.5",
               "--offload", "auto", "--offload-time", "0.25", "--time-limit", "30", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["solver"]["optimal"] is True
    assert max(out["peak_memory"]) <= 1.5 + 1e-9
    assert out["offload"]["transfers"] > 0


def test_solver_imports_no_torch():
    assert_imports_no_torch("pipeoffload.solver", then="""
from pipeoffload.solver import solve
solve(2, 2, time_limit=10)
""")
