"""The step after the pipeline (planner/step.py): the optimizer step and the tied embedding's
gradient all-reduce, part of the planner's iteration, its MFU, ranking, text and JSON (issue 26)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.cli import main
from pipeoffload.costmodel.hardware import HARDWARE
from pipeoffload.costmodel.presets import get_model
from pipeoffload.errors import ParameterError
from pipeoffload.ir import Placement
from pipeoffload.planner import PlanOptions, node_profile, plan
from pipeoffload.planner.step import (OPTIMIZER_BYTES_PER_PARAM, ZEROING_BYTES_PER_PARAM, optimizer_bytes_per_param,
                                      step_after_pipeline)

A100 = HARDWARE["a100-80g"]
NODE = node_profile(A100)


def _state(groups: int, params: float) -> list[tuple[float, float, float]]:
    """``groups`` layer groups of ``params`` 16-bit parameters each (bytes as ShardedCosts.state)."""
    return [(2.0 * params, 4.0 * params, 12.0 * params)] * groups


def test_optimizer_traffic_per_parameter_with_and_without_sharding():
    assert optimizer_bytes_per_param("bf16", 1, "none") == OPTIMIZER_BYTES_PER_PARAM == 50
    assert optimizer_bytes_per_param("fp16", 8, "none") == 50  # every replica steps everything
    # ZeRO-1: the shard's Adam, copy, norm and unscaling; the whole gradient buffer zeroed
    assert optimizer_bytes_per_param("bf16", 8, "optimizer") == pytest.approx(46 / 8 + ZEROING_BYTES_PER_PARAM)
    assert optimizer_bytes_per_param("bf16", 8, "full") == pytest.approx(50 / 8)  # FSDP: all of it sharded
    assert optimizer_bytes_per_param("fp32", 1, "none") == 36
    with pytest.raises(ParameterError, match="dp_sharding"):
        optimizer_bytes_per_param("bf16", 2, "zero2")


@settings(deadline=None, max_examples=50)
@given(dp=st.integers(1, 512), dtype=st.sampled_from(["bf16", "fp16", "fp32"]))
def test_sharding_never_adds_traffic(dp, dtype):
    none, zero1, fsdp = (optimizer_bytes_per_param(dtype, dp, s) for s in ("none", "optimizer", "full"))
    assert 0 < fsdp <= zero1 <= none
    assert (fsdp == zero1 == none) == (dp == 1)


def test_the_step_of_a_loop_placement_with_tied_embeddings():
    m = get_model("28.3B")
    state = _state(32, 1e9 / 32)
    state[0] = (2.0 * 0.2e9, 0.0, 0.0)  # rank 0 of 32 holds the most: the optimizer step is its
    s = step_after_pipeline(m, A100, NODE, state, Placement.loop(32), 1, 1, "none", 32)
    assert s.rank == 0 and s.params == pytest.approx(0.2e9)
    assert s.optimizer_ms == pytest.approx(50 * 0.2e9 / 2.0e12 * 1e3)
    # the tied embedding's fp32 gradient between rank 0 and rank 31, across nodes (22 GB/s)
    assert s.embedding_ms == pytest.approx((4 * m.vocab * m.hidden / 22e9 + 10e-6) * 1e3)
    inside = step_after_pipeline(m, A100, NODE, state, Placement.loop(32), 1, 1, "none", 8)
    assert inside.embedding_ms < s.embedding_ms  # NVLink inside a node
    tp = step_after_pipeline(m, A100, NODE, state, Placement.loop(32), 2, 1, "none", 64)
    assert tp.embedding_ms == pytest.approx((2 * m.vocab * m.hidden / 22e9 + 10e-6) * 1e3)  # vocab-parallel
    assert s.ms == s.optimizer_ms + s.embedding_ms


def test_no_embedding_all_reduce_when_one_rank_holds_both_ends_or_nothing_is_tied():
    m = get_model("6.2B")
    state = _state(8, 1e8)
    v = step_after_pipeline(m, A100, NODE, state, Placement.vshape(4), 1, 1, "none", 4)
    assert v.embedding_ms == 0 and v.optimizer_ms > 0  # the V keeps the first and last group on rank 0
    untied = step_after_pipeline(m.replace(tie_embeddings=False), A100, NODE, state, Placement.loop(8), 1, 1,
                                 "none", 8)
    assert untied.embedding_ms == 0


def test_the_step_shrinks_with_the_distributed_optimizer():
    m = get_model("6.2B")
    state = _state(8, 1e8)
    plain = step_after_pipeline(m, A100, NODE, state, Placement.loop(8), 1, 8, "none", 64)
    zero1 = step_after_pipeline(m, A100, NODE, state, Placement.loop(8), 1, 8, "optimizer", 64)
    assert zero1.optimizer_ms == pytest.approx(plain.optimizer_ms * (46 / 8 + 4) / 50)
    assert zero1.embedding_ms == plain.embedding_ms  # Megatron all-reduces the whole embedding gradient


@pytest.fixture(scope="module")
def planned():
    return plan("1.5B", A100, 8, options=PlanOptions(top=5))


def test_the_planners_iteration_includes_the_step(planned):
    res = planned
    times = [c.iteration_ms for c in res.configs]
    assert times == sorted(times)  # ranked with the step
    for c in res.configs:
        assert c.step_ms > 0
        assert c.iteration_ms == pytest.approx(c.makespan_ms + c.dp_exposed_ms + c.step_ms)
        flops = res.costs_of(c).flops * c.m * c.split.dp
        assert c.mfu == pytest.approx(flops / (c.iteration_ms / 1e3 * res.gpus * res.node.peak_rate))
        assert c.tokens_per_s == pytest.approx(res.global_batch * res.model.seq / (c.iteration_ms / 1e3))


def test_plan_text_and_json_show_the_step(planned, capsys):
    b = planned.best
    text = planned.table()
    assert f"step after the pipeline: {b.step.describe()}" in text
    assert "leaves out" not in text and "optimizer step this iteration" not in text
    assert main(["plan", "--model", "1.5B", "--gpus", "8", "--top", "5", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    best, pred = obj["best"], obj["prediction"]
    assert best["step_s"] == pytest.approx(b.step_ms / 1e3) == pytest.approx(pred["step_s"])
    assert best["step_after_pipeline"]["optimizer_s"] + best["step_after_pipeline"]["embedding_allreduce_s"] \
        == pytest.approx(best["step_s"])
    assert pred["iteration_s"] == pytest.approx(pred["pipeline_s"] + pred["dp_exposed_s"] + pred["step_s"])
    assert "step" in obj["assumptions"] and "leaves out" not in pred["calibration"]


def test_the_time_bound_adds_the_step_exactly_and_stays_a_lower_bound(planned):
    from pipeoffload.planner.bounds import pipeline_bound, time_bound
    from pipeoffload.planner.sharding import CostTable
    from pipeoffload.planner.space import placement_of

    res = planned
    table = CostTable(res.model, res.hardware, res.node, res.options.trim_edges,
                      crosses_nodes=res.gpus > res.hardware.gpus_per_node)
    for c in res.configs:
        bound = time_bound(table, c.split, c.family, c.m, c.recompute, res.options.dp_sharding)
        sh = res.costs_of(c)
        plain = pipeline_bound(sh.costs.group_costs, placement_of(c.family, c.split.pp), c.m)
        assert bound - plain == pytest.approx(c.step_ms)
        assert bound <= c.iteration_ms * (1 + 1e-9)


def test_the_cost_tables_layer_split_is_computed_once_per_p_v(monkeypatch):
    """CostTable.layer_split's memo fires (one computation per (p, v), whatever the recompute
    setting) and returns what a fresh table computes."""
    from pipeoffload.planner.sharding import CostTable

    model = get_model("14.6B")
    table = CostTable(model, A100, NODE)
    computed: list[tuple[int, int]] = []
    real = CostTable._layer_split
    monkeypatch.setattr(CostTable, "_layer_split", lambda self, p, v: computed.append((p, v)) or real(self, p, v))
    shapes = [(4, 1), (4, 2), (8, 3), (2, 4)]
    for recompute in (False, True):
        for p, v in shapes:
            assert table.sharded(recompute, p, v, 2).layers == table.layer_split(p, v)
    assert computed == shapes
    for p, v in shapes:
        assert table.layer_split(p, v) == real(CostTable(model, A100, NODE), p, v)
