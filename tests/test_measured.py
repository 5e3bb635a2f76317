"""The A100 profile against what the ZB paper measured (benchmarks/reproduce_measured.py, issue 26).

One profile, no per-row factors: every measured row within the profile's stated calibration error
(throughput and peak memory), the fit rows' schedules in the measured order, the ZB-1p/2p rows
timed with the order the ZB runtime generates, and what ran in the paper fitting the planner's
budget. Pure Python; all rows take a few seconds.
"""

from __future__ import annotations

import dataclasses

import pytest

from helpers import load_benchmark

from pipeoffload.costmodel.hardware import (A100_HELD_OUT_MEMORY_ERROR, A100_HELD_OUT_THROUGHPUT_ERROR,
                                            A100_MEMORY_ERROR, A100_THROUGHPUT_ERROR, GiB, HARDWARE,
                                            default_reserve, hardware_from_dict)
from pipeoffload.costmodel.measured import (FIT_MODELS, MEASURED, PROFILED_MS, MeasuredRow, Prediction, compare,
                                            predict, ranking_agrees)
from pipeoffload.costmodel.model import pipeline_costs
from pipeoffload.costmodel.presets import get_model
from pipeoffload.errors import ParameterError

A100 = HARDWARE["a100-80g"]


def _quick_rows() -> list:
    """The first m of every Table 4 model and of 6.2B in Tables 6 and 7: every table and schedule
    (the larger Table 6/7 pipelines take seconds each, they run under -m bench)."""
    first: dict[tuple, int] = {}
    for r in MEASURED:
        first.setdefault((r.source, r.model, r.gpus), r.group_m or r.m)
    return [r for r in MEASURED if (r.group_m or r.m) == first[(r.source, r.model, r.gpus)]
            and (r.source == "ZB Table 4" or r.model == "6.2B")]


@pytest.fixture(scope="module")
def preds():
    return compare(_quick_rows(), A100)


def _check_errors(preds) -> None:
    for p in preds:
        if p.throughput_error is not None:
            assert abs(p.throughput_error) <= A100_THROUGHPUT_ERROR + 1e-9, p.to_dict()
        if p.memory_error is not None:
            assert abs(p.memory_error) <= A100_MEMORY_ERROR + 1e-9, p.to_dict()


def test_rows_within_the_stated_calibration_error(preds):
    _check_errors(preds)
    # The issue's bar is 10% on every row, throughput and memory; the held-out rows' stated figures are
    # at most the whole table's.
    assert A100_MEMORY_ERROR <= 0.10 and A100_THROUGHPUT_ERROR <= 0.10
    assert A100_HELD_OUT_THROUGHPUT_ERROR <= A100_THROUGHPUT_ERROR and A100_HELD_OUT_MEMORY_ERROR <= A100_MEMORY_ERROR
    assert {p.row.source for p in preds} == {"ZB Table 4", "ZB Table 6", "ZB Table 7"}
    assert {p.row.model for p in preds if p.row.fit} == set(FIT_MODELS)


@pytest.mark.bench
def test_every_row_within_the_stated_calibration_error():
    # All 93 rows (benchmarks/reproduce_measured.py): the stated figures are the largest errors.
    # The held-out figures (every row outside Table 4's 1.5B and 6.2B settings) likewise.
    preds = compare(MEASURED, A100)
    _check_errors(preds)
    assert max(abs(p.throughput_error or 0) for p in preds) == pytest.approx(A100_THROUGHPUT_ERROR, abs=0.001)
    assert max(abs(p.memory_error or 0) for p in preds) == pytest.approx(A100_MEMORY_ERROR, abs=0.001)
    held = [p for p in preds if not p.row.fit]
    assert len(held) == len(preds) - 24  # the two fit settings: 3 m x 4 schedules each
    worst_thr = max(abs(p.throughput_error or 0) for p in held)
    worst_mem = max(abs(p.memory_error or 0) for p in held)
    assert worst_thr <= A100_HELD_OUT_THROUGHPUT_ERROR and worst_mem <= A100_HELD_OUT_MEMORY_ERROR
    assert (worst_thr, worst_mem) == pytest.approx((A100_HELD_OUT_THROUGHPUT_ERROR, A100_HELD_OUT_MEMORY_ERROR),
                                                   abs=0.001)


def test_table4_rankings_as_measured(preds):
    ranking = ranking_agrees(preds, tie=0.02)
    for setting in ("ZB Table 4: 1.5B, 8 GPUs, m=24", "ZB Table 4: 6.2B, 8 GPUs, m=24",
                    "ZB Table 4: 14.6B, 16 GPUs, m=48", "ZB Table 4: 28.3B, 32 GPUs, m=96"):
        assert ranking[setting], setting


def test_zb_v_ranks_as_measured_because_its_runtime_does_not_block_on_p2p(monkeypatch):
    # Table 6 (6.2B, 16 GPUs, m=48): ZB-V 4.15 against ZB-1p 3.87 measured (+7.2%). Both ran the ZB
    # runtime, which posts its P2P ahead: so modelled, the gap is within 1.5 points of the measured
    # one; held for every hop as Megatron's 1F1B is, ZB-V (two hops per microbatch per rank, at the
    # inter-node rate) loses 4 points of it: the mechanism, not a factor, decides the gap.
    from pipeoffload.costmodel import measured

    rows = [r for r in MEASURED if r.source == "ZB Table 6" and r.model == "6.2B" and r.m == 48
            and r.schedule in ("ZB-V", "ZB-1p")]
    assert [r.runtime for r in rows] == ["zb", "zb"]
    gap = rows[0].throughput / rows[1].throughput
    v, one = (predict(r, A100) for r in rows)
    assert v.throughput / one.throughput == pytest.approx(gap, abs=0.015)
    monkeypatch.setitem(measured.RUNTIME_P2P_EXPOSED, "zb", 1.0)
    v, one = (predict(r, A100) for r in rows)
    assert v.throughput / one.throughput < gap - 0.04


def test_table6_and_7_rankings_as_measured(preds):
    ranking = ranking_agrees(preds)  # strict: no ties needed
    for setting in ("ZB Table 6: 6.2B, 16 GPUs, m=48", "ZB Table 7: 6.2B, 16 GPUs, m=64"):
        assert ranking[setting], setting


@pytest.mark.bench
def test_every_setting_ranks_as_measured_within_measurement_ties():
    # 21 of 24 settings strictly; all 24 counting differences under 2% as ties (the three others:
    # 1.5B at m = 24 and 32, 6.2B/8 at m = 32, 1F1B-I against ZB-1p; docs/planner.md §8).
    from pipeoffload.costmodel.measured import MEASUREMENT_TIE

    preds = compare(MEASURED, A100)
    strict, loose = ranking_agrees(preds), ranking_agrees(preds, tie=MEASUREMENT_TIE)
    assert sum(strict.values()) >= 21 and len(strict) == 24
    assert all(loose.values()), [s for s, ok in loose.items() if not ok]


def _order_of(row, zb_runtime: bool):
    from pipeoffload.costmodel.measured import simulate_exactly, row_problem
    from pipeoffload.planner.space import Split

    problem, family = row_problem(row, A100)
    return simulate_exactly(problem, Split(1, row.gpus, 1), family, row.m, zb_runtime=zb_runtime)


def test_zb_rows_time_the_order_the_zb_runtime_generates():
    # 1.5B/8 GPUs, m = 64: ZB-2p 14.9, ZB-1p 14.2 measured. The ZB runtime generates ZB-1p from
    # uniform (median) op times and its own memory model, p forwards per stage: stage 0 (two layers,
    # the lightest) runs 8 warm-up forwards, and 172 ms of the iteration are bubble. Our zb-auto on the
    # planner's inputs (per-stage times and bytes, the same byte limit on every stage) lets stage 0 run
    # 12 and reaches ZB-2p's steady state (128 ms): with that order ZB-1p and ZB-2p tied, with the
    # runtime's ZB-2p comes out ahead, as measured.
    zb1, zb2 = (next(r for r in MEASURED if r.model == "1.5B" and r.m == 64 and r.schedule == s)
                for s in ("ZB-1p", "ZB-2p"))
    runtime, planner = _order_of(zb1, True), _order_of(zb1, False)

    def warmup(sim) -> int:
        return next(i for i, op in enumerate(sim.schedule.ranks[0]) if op.kind.name == "B")

    assert (warmup(runtime), warmup(planner)) == (8, 12)
    assert runtime.makespan - max(runtime.busy) == pytest.approx(171.7, abs=0.1)
    assert planner.makespan - max(planner.busy) == pytest.approx(128.0, abs=0.1)
    one, two = predict(zb1, A100), predict(zb2, A100)
    assert two.throughput > one.throughput * 1.01 and one.to_dict()["order_from"] == "zb runtime's inputs"


def test_zb_runtime_inputs_are_the_runtimes():
    from pipeoffload.costmodel.measured import zb_runtime_inputs
    from pipeoffload.costs import Costs

    model = get_model("1.5B")
    costs = Costs(group_costs=[(12.45, 12.16, 6.24)] + [(18.5768, 18.1575, 9.3537)] * 6 + [(13.1, 14.2, 6.3)],
                  comm=0.5762)
    got = zb_runtime_inputs(model, costs, 8, 2.0)
    c, mem = got["costs"], got["memory"]
    assert (c.F, c.B, c.W, c.comm) == (18576, 18157, 9353, 576)  # upper medians, whole microseconds
    assert (mem.F, mem.B, mem.W) == (201216, -127488, -73728)  # ZB's 34h + 5as, the rest, -32h
    assert got["mem_limit"] == 2 * 8 * 201216
    with pytest.raises(ParameterError, match="limit"):
        zb_runtime_inputs(model, costs, 8, 0.0)
    with pytest.raises(ParameterError, match="p"):
        zb_runtime_inputs(model, costs, 0, 1.0)
    row = next(r for r in MEASURED if r.schedule == "1F1B")
    with pytest.raises(ParameterError, match="zb_runtime"):
        _order_of(row, True)


def test_post_validation_adds_no_time_to_zb_1p_and_takes_the_fill_off_zb_2p():
    # The ZB runtime's optimizer post-validation (--enable-optimizer-post-validation, the paper's runs)
    # drops the barrier between iterations: a rank steps after its own last op and runs the next
    # iteration's warm-up while later ranks finish. It is not the time the ZB-1p rows miss: their
    # rank 0 or 1 ends last, so back to back they gain at most 0.5%; ZB-2p's last rank ends last
    # (the parallelogram), so its pipeline fill overlaps the previous iteration (here 130 ms of 1295).
    from pipeoffload.costmodel.measured import _timed_iteration, post_validation_iteration_ms, row_problem
    from pipeoffload.planner.config import assemble

    for sched, gain in (("ZB-1p", (0.0, 0.005)), ("ZB-2p", (0.09, 0.11))):
        row = next(r for r in MEASURED if r.model == "1.5B" and r.m == 24 and r.schedule == sched)
        sim, barrier = _order_of(row, True), predict(row, A100)
        costs, step = sim.sharded.costs, assemble(row_problem(row, A100)[0], sim).step
        # one iteration alone, from 0, is the simulator's makespan (hops on the dependency)
        alone = _timed_iteration(sim.schedule, costs, 0, [0.0] * 8, [0.0] * 8, [0] * 8)
        assert max(alone[0]) == pytest.approx(sim.makespan)
        steady = post_validation_iteration_ms(sim.schedule, costs, step.optimizer_ms, step.embedding_ms)
        assert gain[0] <= 1 - steady / (barrier.iteration_s * 1e3) <= gain[1]
        # the tied embedding's all-reduce couples rank 0 and rank 7: a longer one delays both
        assert post_validation_iteration_ms(sim.schedule, costs, 0.0, 500.0) > \
            post_validation_iteration_ms(sim.schedule, costs, 0.0, 0.0)
        pv = predict(row, A100, post_validation=True)
        assert pv.iteration_s == pytest.approx(steady / 1e3) and pv.reserved_gib == barrier.reserved_gib
    for kw, name in (({"iterations": 1}, "iterations"), ({"embedding_ms": -1.0}, "embedding_ms")):
        with pytest.raises(ParameterError, match=name):
            post_validation_iteration_ms(sim.schedule, costs, 1.0, **kw)
    with pytest.raises(ParameterError, match="optimizer_ms"):
        post_validation_iteration_ms(sim.schedule, costs, -1.0)
    row = next(r for r in MEASURED if r.schedule == "1F1B")  # Megatron's step is a barrier: unchanged
    assert predict(row, A100, post_validation=True).iteration_s == predict(row, A100).iteration_s


def test_predictions_carry_the_planners_step_after_the_pipeline():
    # One implementation: predict() takes the planner's configuration whole, the step included.
    from pipeoffload.planner.step import OPTIMIZER_BYTES_PER_PARAM

    row = next(r for r in MEASURED if r.model == "28.3B" and r.schedule == "1F1B")
    p = predict(row, A100)
    m = get_model("28.3B", microbatch=row.microbatch)
    emb = (4 * m.vocab * m.hidden / 22e9 + 10e-6)  # the tied embedding's fp32 gradient, rank 0 <-> 31, 22 GB/s
    opt = p.step_s - emb
    assert 0 < opt < OPTIMIZER_BYTES_PER_PARAM * 1.2e9 / 2.0e12  # 50 B per parameter of < 1.2B on a rank
    assert p.iteration_s == pytest.approx(row.m * row.microbatch / (p.throughput * row.gpus))
    assert 0.001 < p.step_s / p.iteration_s < 0.05  # 0.1-4.2% of the rows' iterations (docs/planner.md §8)


def test_ranking_counts_close_measurements_as_ties():
    row = MEASURED[0]
    a = Prediction(dataclasses.replace(row, schedule="ZB-2p", throughput=1.85), 1.0, 1, 0.5, 1, 1, True)
    b = Prediction(dataclasses.replace(row, schedule="ZB-V", throughput=1.84), 1.1, 1, 0.5, 1, 1, True)
    assert ranking_agrees([a, b]) == {row.setting: False}
    assert ranking_agrees([a, b], tie=0.02) == {row.setting: True}


def test_what_ran_in_the_paper_fits_the_budget(preds):
    # Every configuration ran on 80 GB: it must fit the planner's model of that device.
    for p in preds:
        assert p.fits, p.to_dict()
        assert p.allocated_gib * GiB <= A100.default_budget


def test_op_times_of_the_measured_stages():
    # The ZB paper's profiled stages: the 1.5B and 6.2B ones fixed the three fitted constants by least
    # squares (within 2.5%); 14.6B and 28.3B are held out (within 4.5%: 28.3B's W is +4.1%).
    for name, (p, tf, tb, tw, _) in PROFILED_MS.items():
        g = pipeline_costs(get_model(name), A100, p, trim_edges=True).groups[p // 2]
        tol = 0.025 if name in FIT_MODELS else 0.045
        for ours, measured in ((g.F_ms, tf), (g.B_ms, tb), (g.W_ms, tw)):
            assert ours == pytest.approx(measured, rel=tol), name


def test_blocking_p2p_holds_f_and_b_for_one_hop():
    from pipeoffload.planner.sharding import node_profile, shard_costs

    blocking = dataclasses.replace(A100, p2p_exposed=1.0)  # Megatron's send-and-wait
    pc = pipeline_costs(get_model("1.5B"), blocking, 8)
    free = A100  # P2P posted ahead (pipeoffload's and ZB's runtimes)
    assert free.p2p_exposed == 0.0
    held = shard_costs(pc, 1, node_profile(blocking))
    pc_free = pipeline_costs(get_model("1.5B"), free, 8)
    loose = shard_costs(pc_free, 1, node_profile(free))
    for (f, b, w), (f0, b0, w0) in zip(held.costs.group_costs, loose.costs.group_costs):
        assert f - f0 == pytest.approx(held.comm) and b - b0 == pytest.approx(held.comm) and w == w0


def test_w_is_gemms_only_and_flash_attention_cuts_elementwise_time():
    m = get_model("6.2B")
    g = pipeline_costs(m, A100, 4).groups[1]
    plain = pipeline_costs(m, dataclasses.replace(A100, elementwise_f=0.0, elementwise_b=0.0), 4).groups[1]
    assert g.W_ms == plain.W_ms and g.F_ms > plain.F_ms and g.B_ms > plain.B_ms
    flash = pipeline_costs(m.replace(flash_attention=True, dropout=False), A100, 4).groups[1]
    assert flash.F_ms < g.F_ms
    # recompute does not remove the elementwise work: it is done whatever is saved
    rc = pipeline_costs(m.replace(recompute_elementwise=True), A100, 4).groups[1]
    assert rc.F_ms == pytest.approx(g.F_ms)


def test_reserve_rule_and_allocator_overhead():
    hbm = 80 * GiB
    budget = hbm - default_reserve(hbm, 0.05)
    assert budget * 1.05 == pytest.approx(hbm - 2 * GiB)
    assert A100.reserved(10 * GiB) == pytest.approx(10.5 * GiB)
    assert default_reserve(1 * GiB) == 0.5 * GiB  # capped at half of a small device


def test_profile_file_keys_and_their_errors():
    h = hardware_from_dict({"compute_tflops": 100, "hbm_gib": 16, "host_link_gbs": 10, "interstage_gbs": 10,
                            "hbm_gbs": 1000, "shape_efficiency": True, "elementwise_f_passes": 2,
                            "elementwise_b_passes": 1.5, "allocator_overhead": 0.1, "p2p_exposed": 0.5,
                            "calibration": "±5% on X"})
    assert (h.shape_efficiency, h.elementwise_f, h.elementwise_b, h.allocator_overhead, h.p2p_exposed,
            h.calibration) == (True, 2.0, 1.5, 0.1, 0.5, "±5% on X")
    with pytest.raises(ParameterError, match="shape_efficiency"):
        hardware_from_dict({"compute_tflops": 1, "hbm_gib": 1, "host_link_gbs": 1, "interstage_gbs": 1,
                            "shape_efficiency": "yes"})
    with pytest.raises(ParameterError, match="hbm_gbs"):
        hardware_from_dict({"compute_tflops": 1, "hbm_gib": 1, "host_link_gbs": 1, "interstage_gbs": 1,
                            "elementwise_f_passes": 3})


def test_predict_rejects_an_unknown_schedule():
    with pytest.raises(ParameterError, match="schedule"):
        predict(MeasuredRow("x", "1.5B", 8, 6, 24, "GPipe", 1.0))


def test_plan_says_which_profiles_are_calibrated():
    from pipeoffload.planner.report import calibration_note

    assert calibration_note(A100) == A100.calibration and "ZB paper" in A100.calibration
    for name in ("h100-80g", "h200"):  # fit on our own GPU runs' op times (docs/gpu.md)
        assert "layer op times" in calibration_note(HARDWARE[name]) and "held out" in HARDWARE[name].calibration
    assert "uncalibrated" in calibration_note(HARDWARE["cpu"])


def test_post_validation_hold_and_scalar_hops():
    # Where each rank waits for the validation (held_from) and the gloo hop of the reduction down and the
    # validation up the pipeline (hop_ms). Holding from each rank's first B (the default), from the
    # authors' POST_VALIDATION node (before the last warm-up F) or not at all gives the same iteration:
    # the validation comes back before any rank needs it. Only holding every op (no overlap of the fill)
    # or a hop longer than the ranks' stagger (about one F + hop) moves it; the latter makes the chain
    # the iteration (docs/planner.md#calibration: 13-15 ms would match the paper at 16 and 32 GPUs, and
    # no part of the runtime's chain takes that long).
    from pipeoffload.costmodel.measured import post_validation_iteration_ms, row_problem
    from pipeoffload.ir import OpKind
    from pipeoffload.planner.config import assemble

    row = next(r for r in MEASURED if r.model == "1.5B" and r.m == 24 and r.schedule == "ZB-2p")
    sim = _order_of(row, True)
    costs, step = sim.sharded.costs, assemble(row_problem(row, A100)[0], sim).step

    def it(**kw):
        return post_validation_iteration_ms(sim.schedule, costs, step.optimizer_ms, step.embedding_ms, **kw)

    orders = [[o for o in ops if o.kind.is_compute] for ops in sim.schedule.ranks]
    first_b = [next(i for i, o in enumerate(ops) if o.kind is not OpKind.F) for ops in orders]
    base = it()
    assert it(held_from=first_b) == base
    assert it(held_from=[max(0, i - 1) for i in first_b]) == base  # the authors' node: before the last warm-up F
    assert it(held_from=[len(o) for o in orders]) == base  # the validation arrives in time: no hold binds
    assert it(held_from=[0] * 8) > base  # every op waits for the validation: the fill is not overlapped
    assert it(hop_ms=5.0) == base < it(hop_ms=30.0)
    for kw, name in (({"held_from": [0] * 7}, "held_from"), ({"hop_ms": -1.0}, "hop_ms")):
        with pytest.raises(ParameterError, match=name):
            it(**kw)


def test_synchronised_zb_rows_keep_the_barrier_and_show_the_zb_runtimes_level():
    # The paper's ablation (ZB, ICLR, Appendix E, Table 7): ZB-2p with an all-reduce synchronisation
    # instead of optimizer post-validation, 13.11 against Table 4's 14.5 at 1.5B, m = 24. Its
    # iteration is the planner's (a barrier) even under post_validation=True, and it is over-predicted
    # by 4.9% at a fit setting where the Megatron rows are within 1.3%: the ZB runtime's level
    # (docs/planner.md#calibration).
    from pipeoffload.costmodel.measured import SYNCHRONISED

    assert [(r.model, r.m, r.throughput) for r in SYNCHRONISED][0] == ("1.5B", 24, 13.11)
    assert all(r.synchronised and r.runtime == "zb" and r not in MEASURED for r in SYNCHRONISED)
    sync = SYNCHRONISED[0]
    barrier = predict(sync, A100)
    assert predict(sync, A100, post_validation=True).iteration_s == barrier.iteration_s
    assert 0.045 < barrier.throughput_error < 0.055
    meg = [predict(r, A100) for r in MEASURED if r.model == "1.5B" and r.m == 24 and r.runtime == "megatron"]
    assert all(abs(p.throughput_error) < 0.015 for p in meg)
    # post-validation's measured gain at this setting, 10.6%, against our model's
    pv_row = next(r for r in MEASURED if r.model == "1.5B" and r.m == 24 and r.schedule == "ZB-2p")
    gain = predict(pv_row, A100, post_validation=True).throughput / predict(pv_row, A100).throughput - 1
    assert pv_row.throughput / sync.throughput - 1 == pytest.approx(0.106, abs=0.001)
    assert gain == pytest.approx(0.110, abs=0.002)


def test_op_overhead_slows_only_its_runtimes_ops_and_keeps_the_order():
    # predict(..., op_overhead=...): the analysis of a runtime's overhead (not the calibration's).
    from pipeoffload.costmodel.measured import simulate_exactly, row_problem
    from pipeoffload.planner.space import Split

    zb = next(r for r in MEASURED if r.model == "1.5B" and r.m == 24 and r.schedule == "ZB-1p")
    meg = next(r for r in MEASURED if r.model == "1.5B" and r.m == 24 and r.schedule == "1F1B")
    base, slow = predict(zb, A100), predict(zb, A100, op_overhead={"zb": 0.05})
    # ops 5% longer, the hops not: the iteration grows by a little less than 5%
    assert 0.04 < slow.iteration_s / base.iteration_s - 1 < 0.05 and slow.reserved_gib == base.reserved_gib
    assert predict(meg, A100, op_overhead={"zb": 0.05}).iteration_s == predict(meg, A100).iteration_s
    problem, family = row_problem(zb, A100)
    a, b = (simulate_exactly(problem, Split(1, 8, 1), family, 24, True, op_scale=s) for s in (1.0, 1.05))
    assert a.schedule.ranks == b.schedule.ranks  # the order is the runtime's, from the undelayed inputs
    assert b.sharded.costs.group_costs[3][0] == pytest.approx(1.05 * a.sharded.costs.group_costs[3][0])
    for bad in ({"tpu": 0.1}, {"zb": -1.0}, {"zb": float("nan")}):
        with pytest.raises(ParameterError, match="op_overhead"):
            predict(zb, A100, op_overhead=bad)


def test_wave_quantization_gemms_are_the_cost_models_flops():
    rm = load_benchmark("reproduce_measured")
    for name in PROFILED_MS:
        m = get_model(name)
        lay, head = m.layer(), m.head()
        for op, layer_flops, head_flops in (("F", lay.f_flops, head.f_flops), ("B", lay.b_flops, head.b_flops),
                                            ("W", lay.w_flops, head.w_flops)):
            assert rm.quantized_flops(rm.layer_gemms(m)[op], None) == pytest.approx(layer_flops, rel=1e-12)
            assert rm.quantized_flops(rm.head_gemms(m)[op], None) == pytest.approx(head_flops, rel=1e-12)


def test_wave_efficiency_of_the_measured_shapes():
    # NVIDIA's rule: tiles padded at the edges, run 108 at a time on an A100, a partial wave whole.
    rm = load_benchmark("reproduce_measured")
    big, small = rm.WAVE_TILES["256x128"], rm.WAVE_TILES["128x128"]
    assert rm.wave_efficiency(6144, 2304, 1, big) == 1.0  # 1.5B's out-projection: 24 x 18 = 4 waves
    assert rm.wave_efficiency(3072, 4096, 1, big) == pytest.approx(384 / 432)  # 6.2B: 3.56 -> 4 waves
    assert rm.wave_efficiency(1024, 5120, 1, big) == pytest.approx(160 / 216)  # 14.6B: 1.48 -> 2 waves
    # 128x128 quantizes 6.2B's and 28.3B's out-projection alike (768 and 384 tiles: 8 and 4 waves)
    assert rm.wave_efficiency(3072, 4096, 1, small) == rm.wave_efficiency(1024, 6144, 1, small) == pytest.approx(8 / 9)
    assert rm.wave_efficiency(100, 100, 1, small) == pytest.approx(100 * 100 / (108 * 128 * 128))  # tile padding


def test_wave_quantization_does_not_bring_the_held_out_op_times_closer():
    # Issue 26, third round (docs/planner.md#calibration): re-fit on the 1.5B stage, neither of the
    # guide's tiles brings the held-out stages' F, B, W closer to the paper's; the profile keeps none.
    rm = load_benchmark("reproduce_measured")
    largest = {}
    for name, tile in [("none", None)] + list(rm.WAVE_TILES.items()):
        _, errors = rm.wave_op_times(A100, tile)
        assert max(map(abs, errors[rm.WAVE_FIT_MODEL])) < 1e-9  # the three constants re-fit exactly
        largest[name] = max(abs(e) for m, es in errors.items() if m != rm.WAVE_FIT_MODEL for e in es)
    assert largest["none"] < 0.035
    assert largest["128x128"] > largest["none"] + 0.02 and largest["256x128"] > largest["none"] + 0.05


def test_wave_quantized_costs_patch_the_gemm_time_only_and_restore():
    rm = load_benchmark("reproduce_measured")
    m, tile = get_model("6.2B"), rm.WAVE_TILES["128x128"]
    plain = pipeline_costs(m, A100, 8).groups
    with rm.wave_quantized_costs(tile):
        slow = pipeline_costs(m, A100, 8).groups
    assert pipeline_costs(m, A100, 8).groups == plain
    gl = rm.layer_gemms(m)["W"]
    ratio = rm.quantized_flops(gl, tile) / rm.quantized_flops(gl, None)
    assert slow[3].W_ms == pytest.approx(plain[3].W_ms * ratio)  # W is GEMMs only
    from pipeoffload.costmodel.model import gemm_shape_efficiency

    rate_ms = A100.compute_rate / 1e3 * gemm_shape_efficiency(m, A100)
    fl = rm.layer_gemms(m)["F"]
    extra = plain[3].layers * (rm.quantized_flops(fl, tile) - rm.quantized_flops(fl, None)) / rate_ms
    assert slow[3].F_ms - plain[3].F_ms == pytest.approx(extra)  # the elementwise time unchanged
    hf = rm.head_gemms(m)["F"]
    head = (rm.quantized_flops(hf, tile) - rm.quantized_flops(hf, None)) / rate_ms
    assert slow[-1].F_ms - plain[-1].F_ms == pytest.approx(extra * slow[-1].layers / slow[3].layers + head)


def _op_errors(hw) -> list[float]:
    """Every profiled T_F, T_B, T_W of the paper (Table 6) against the cost model's middle stage under ``hw``."""
    out = []
    for name, (p, *ms, _) in PROFILED_MS.items():
        g = pipeline_costs(get_model(name), hw, p, trim_edges=True).groups[p // 2]
        out += [o / m - 1 for o, m in zip((g.F_ms, g.B_ms, g.W_ms), ms)]
    return out


def test_fit_stages_is_the_least_squares_minimum_of_the_profiled_op_times():
    # Issue 26, fourth round (docs/planner.md#calibration): the three constants by least squares on the
    # relative errors of all 12 profiled op times, checked on the cost model itself (pipeline_costs), not
    # on the fit's linear form: nudging any constant either way makes the sum of squares larger.
    rm = load_benchmark("reproduce_measured")
    fitted = rm.fit_stages(A100, tuple(PROFILED_MS))
    best = sum(e * e for e in _op_errors(fitted))
    for field in ("compute_rate", "elementwise_f", "elementwise_b"):
        for f in (0.999, 1.001):
            nudged = dataclasses.replace(fitted, **{field: getattr(fitted, field) * f})
            assert sum(e * e for e in _op_errors(nudged)) > best, (field, f)
    # On the 1.5B stage alone the fit is the exact re-fit (three numbers, three constants).
    one = rm.fit_stages(A100, (rm.WAVE_FIT_MODEL,))
    exact, _ = rm.wave_op_times(A100, None)
    for field in ("compute_rate", "elementwise_f", "elementwise_b"):
        assert getattr(one, field) == pytest.approx(getattr(exact, field), rel=1e-9)
    with pytest.raises(ParameterError, match="fit_stages"):
        rm.fit_stages(A100, ("1.5B", "7B"))
    with pytest.raises(ParameterError, match="fit_stages"):
        rm.fit_stages(A100, ())


def test_the_profile_is_the_least_squares_fit_on_its_fit_stages_rounded():
    # Issue 26, fifth round (docs/planner.md#calibration): the profile's three constants are the least-
    # squares fit on the 1.5B and 6.2B stages (260.35 TFLOP/s, 4.589 / 3.979 passes), rounded as
    # benchmarks/fit_gpu_profile.py rounds the H100 and H200 fits (1 TFLOP/s, 0.25 passes).
    rm = load_benchmark("reproduce_measured")
    fgp = load_benchmark("fit_gpu_profile")
    fitted = rm.fit_stages(A100, FIT_MODELS)
    assert (fitted.compute_rate / 1e12, fitted.elementwise_f, fitted.elementwise_b) == pytest.approx(
        (260.35, 4.589, 3.979), abs=0.005)
    rows = rm.profiled_stages(A100, FIT_MODELS)
    assert fgp.fit(rows, A100.gemm_half_width, A100.hbm_bw) == (A100.compute_rate, A100.elementwise_f,
                                                                 A100.elementwise_b) == (260e12, 4.5, 4.0)
    # The one row over the 10% with the former profile (265 / 4.6 / 4.0, fit on 1.5B alone):
    # 6.2B/8 GPUs, m = 64, ZB-1p, +10.05%; +8.7% with this one (the largest of the 93 rows).
    former = dataclasses.replace(A100, compute_rate=265e12, elementwise_f=4.6, elementwise_b=4.0)
    row = next(r for r in MEASURED if (r.source, r.model, r.m, r.schedule) == ("ZB Table 4", "6.2B", 64, "ZB-1p"))
    assert predict(row, former).throughput_error > 0.10 > 0.09 > predict(row, A100).throughput_error > 0.085
    # Every profiled op time within 4.5% (was 3.1% with the former, off by up to 4.1% on a held-out W)
    assert max(map(abs, _op_errors(former))) < 0.032 and max(map(abs, _op_errors(A100))) < 0.045


def test_fitting_every_profiled_stage_brings_every_op_time_within_2_5_percent():
    rm = load_benchmark("reproduce_measured")
    fitted = rm.fit_stages(A100, tuple(PROFILED_MS))
    assert (fitted.compute_rate / 1e12, fitted.elementwise_f, fitted.elementwise_b) == pytest.approx(
        (264.05, 4.741, 4.095), abs=0.005)
    assert max(map(abs, _op_errors(A100))) > 0.03 > 0.025 > max(map(abs, _op_errors(fitted)))


@pytest.mark.bench
def test_fitting_every_profiled_stage_meets_every_bar_on_the_held_out_rows():
    # All 93 rows held out (no throughput or memory figure in the fit): within 10% and 10%, ranked
    # as measured in 21 of 24 settings strictly and 24 with ties; also fitting 1.5B and 6.2B only.
    rm = load_benchmark("reproduce_measured")
    for names, thr, mem in ((tuple(PROFILED_MS), 0.0909, 0.0948), (("1.5B", "6.2B"), 0.0862, 0.0600)):
        s = rm.summary(compare(MEASURED, rm.fit_stages(A100, names)))
        assert (s["all_throughput"], s["all_memory"]) == pytest.approx((thr, mem), abs=0.0005)
        assert (sum(s["ranking"].values()), sum(s["ranking_ties"].values()), len(s["ranking"])) == (21, 24, 24)


def test_fit_stages_option_reports_every_row_held_out(monkeypatch, capsys):
    # `reproduce_measured.py --fit-stages all|MODEL,...` (here on the 1.5B rows of the first m and the
    # ZB-2p rows the synchronised check compares with, for speed).
    import sys

    rm = load_benchmark("reproduce_measured")
    first = {"1.5B": 24, "6.2B": 24, "14.6B": 48, "28.3B": 96}
    rows = [r for r in MEASURED if r.source == "ZB Table 4" and r.m == first[r.model]
            and (r.model == "1.5B" or r.schedule == "ZB-2p")]
    monkeypatch.setattr(rm, "MEASURED", rows)
    monkeypatch.setattr(sys, "argv", ["reproduce_measured.py", "--fit-stages", "all"])
    assert rm.main() == 0
    out = capsys.readouterr().out
    assert "fitted: 264.05 TFLOP/s, passes F 4.741 / B 4.095" in out and "(12 numbers)" in out
    assert out.count("| held out |") == len(rows) == 7 and "| fit |" not in out.split("| source |")[1]
    assert out.count("| fit |") == 4  # the op-time table: every profiled stage is in the fit
    assert rm.fit_stages(A100, ("1.5B", "6.2B")).compute_rate / 1e12 == pytest.approx(260.35, abs=0.005)
    monkeypatch.setattr(sys, "argv", ["reproduce_measured.py", "--fit-stages", "6.2B,70B"])
    with pytest.raises(ParameterError, match="fit_stages"):
        rm.main()
