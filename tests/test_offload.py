"""Offload pass: the published selective-offload rows (docs/algorithms.md §8.4), plan invariants, infeasibility, auto, CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeoffload.cli import main
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.ir import OpKind
from pipeoffload.passes.offload import host_memory_curve, largest_feasible_chunks, plan_offload
from pipeoffload.passes.timing import completion_key, dependencies, simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules import generate

from helpers import assert_imports_no_torch

OS, OE, RS, RE = OpKind.OFFLOAD_START, OpKind.OFFLOAD_END, OpKind.RELOAD_START, OpKind.RELOAD_END
TRANSFER = (OS, OE, RS, RE)
EPS = 1e-7


def _timed(name: str, costs: Costs | None = None, **kw):
    s = generate(name, **kw)
    return s, simulate(s, costs)


# --- docs/algorithms.md#84-selective-offload-rows (group-interleaved, p=8, m=32, unit costs, instant) ----
@pytest.mark.parametrize(
    "v, g, peaks",
    [(2, 4, [12, 5, 1]), (4, 4, [20, 13, 9, 5, 1]), (4, 8, [32, 24, 16, 8])],
)
def test_reference_selective_offload_rows(v, g, peaks):
    s, tl = _timed("group-interleaved", p=8, m=32, v=v, g=g)
    for c, want in enumerate(peaks):
        res = plan_offload(s, tl, offload_chunks=c)
        assert max(res.peak) * v == pytest.approx(want), (v, g, c)
        assert max(res.peak_no_offload) * v == pytest.approx(peaks[0])
        assert res.makespan == tl.makespan and res.delayed == 0


def test_better_than_linear_with_small_groups():
    # GIS v=2, g=p/2: offloading chunk 0 (half the bytes) cuts the peak by more than half.
    s, tl = _timed("group-interleaved", p=8, m=32, v=2, g=4)
    res = plan_offload(s, tl, offload_chunks=1)
    assert max(res.peak) < 0.5 * max(res.peak_no_offload)


def test_realistic_transfer_times_peak_falls_and_makespan_holds():
    s, tl = _timed("group-interleaved", p=8, m=32, v=4, g=4)
    for ot in (0.25, 0.5):
        peaks = []
        for c in range(4):  # C = 0..3 are feasible at both transfer times
            res = plan_offload(s, tl, offload_chunks=c, offload_time=ot)
            assert res.makespan == pytest.approx(tl.makespan)
            peaks.append(max(res.peak))
        assert all(a > b for a, b in zip(peaks, peaks[1:])), (ot, peaks)
        assert peaks[-1] <= 0.5 * peaks[0]
    auto = plan_offload(s, tl, auto=True, offload_time=0.25)
    assert auto.makespan <= tl.makespan * 1.01 and max(auto.peak) * 4 <= 7


# --- invariants over random schedules and settings ----------------------------------------
def _check_plan(sched, tl, res, C, comm, mode, postpone):
    new_tl, new_s = res.timeline, res.schedule
    compute = {e.op.key: e for e in new_tl.events if e.op.kind.is_compute}
    base = {e.op.key: e for e in tl.events}
    assert set(compute) == set(base)
    # Compute times unchanged unless backwards were delayed or forwards postponed.
    if mode != "delay" and not postpone:
        assert all(compute[k].start == base[k].start for k in base)
    if postpone and mode != "delay":
        assert all(compute[k].start >= base[k].start - EPS for k in base)
        assert all(compute[k].start == base[k].start for k in base if k[0] is not OpKind.F)
    # The compute timeline obeys the dependencies and each rank's order.
    finish = {completion_key(e.op): e for e in compute.values()}
    for e in compute.values():
        for dk in dependencies(e.op, sched.num_stages):
            d = finish[dk]
            lat = comm if d.rank != e.rank else 0.0
            assert e.start >= d.end + lat - EPS, (e.op, dk)
    for r in range(sched.num_ranks):
        evs = sorted((e for e in compute.values() if e.rank == r), key=lambda e: e.start)
        assert [e.op for e in evs] == sched.ranks[r]
        assert all(a.end <= b.start + EPS for a, b in zip(evs, evs[1:]))
    # Transfer ops: exactly one of each kind per offloaded (chunk, microbatch), in order.
    by_item: dict = {}
    for e in new_tl.events:
        if e.op.kind in TRANSFER:
            assert e.op.chunk < C, "offloaded a chunk that was not selected"
            assert e.stream == ("d2h" if e.op.kind in (OS, OE) else "h2d")
            by_item.setdefault((e.op.stage, e.op.microbatch), {}).setdefault(e.op.kind, []).append(e)
    assert len(by_item) == len(res.transfers)
    for (s, j), kinds in by_item.items():
        assert all(len(kinds.get(k, [])) == 1 for k in TRANSFER), (s, j)
        os_, oe, rs, re_ = (kinds[k][0] for k in TRANSFER)
        bkey = (OpKind.B, s, j) if (OpKind.B, s, j) in compute else (OpKind.BW, s, j)
        b = compute[bkey]
        assert os_.start >= compute[(OpKind.F, s, j)].end - EPS
        assert os_.start <= oe.start <= rs.start <= re_.start <= b.start + EPS
        if os_.end > os_.start:  # positive transfer time: strict
            assert os_.start < oe.start and rs.start < re_.end
        assert oe.mem < 0 and rs.mem == -oe.mem and os_.mem == 0 and re_.mem == 0
        assert os_.end == oe.start and rs.end == re_.start
    # One copy at a time per direction on a link.
    group = res.settings["link_group"]
    for kind in (OS, RS):
        per_link: dict = {}
        for e in new_tl.events:
            if e.op.kind is kind and e.end > e.start:
                per_link.setdefault(e.rank // group, []).append((e.start, e.end))
        for ivs in per_link.values():
            ivs.sort()
            assert all(a[1] <= b[0] + EPS for a, b in zip(ivs, ivs[1:]))
    # Memory: never negative, ends at zero, never above the no-offload peak (unless delayed).
    for r in range(sched.num_ranks):
        curve = new_tl.memory_curve(r)
        assert min(x for _, x in curve) >= -EPS and abs(curve[-1][1]) < EPS
        assert min(x for _, x in host_memory_curve(new_tl, r)) >= -EPS
    if res.delayed == 0:
        assert all(a <= b + EPS for a, b in zip(res.peak, res.peak_no_offload))
    assert new_tl.meta["baseline_memory_curves"] == [tl.memory_curve(r) for r in range(tl.num_ranks)]
    # The op lists: same compute order, transfer ops in issue order, still a valid schedule.
    validate(new_s)
    for r in range(sched.num_ranks):
        assert [o for o in new_s.ranks[r] if o.kind.is_compute] == sched.ranks[r]
        pos = {o.key: i for i, o in enumerate(new_s.ranks[r])}
        for t in res.transfers:
            if t.rank != r:
                continue
            k = lambda kind: pos[(kind, t.stage, t.microbatch)]  # noqa: E731
            bpos = pos.get((OpKind.B, t.stage, t.microbatch), pos.get((OpKind.BW, t.stage, t.microbatch)))
            assert pos[(OpKind.F, t.stage, t.microbatch)] + 1 == k(OS)
            assert k(OS) < k(OE) < k(RS) < k(RE) < bpos
            assert not any(o.kind.is_compute for o in new_s.ranks[r][k(RE) + 1 : bpos])  # wait right before B


_CLASSIC = ["gpipe", "1f1b", "interleaved-1f1b", "group-interleaved"]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(_CLASSIC + ["zb-h1", "zb-h2", "zb-v", "v-min", "v-half", "v-zb"]),
    p=st.integers(2, 5),
    extra_m=st.integers(0, 4),
    costs=st.sampled_from([Costs(), Costs(F=1, B=2, W=1, comm=0.1), Costs(F=1, B=1.5, W=0.5, comm=0.3)]),
    ot=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]),
    link_group=st.integers(1, 3),
    solo=st.sampled_from([0.7, 1.0]),
    mode=st.sampled_from(["error", "skip", "delay"]),
    postpone=st.booleans(),
    c_frac=st.floats(0, 1),
)
def test_plan_invariants(name, p, extra_m, costs, ot, link_group, solo, mode, postpone, c_frac):
    sched = generate(name, p=p, m=p + extra_m)  # every one takes any p >= 2, m >= p
    tl = simulate(sched, costs)
    C = round(c_frac * sched.chunks)
    kw = dict(offload_time=ot, link_group=link_group, solo_factor=solo, comm=costs.comm, postpone_warmup=postpone)
    try:
        res = plan_offload(sched, tl, offload_chunks=C, on_infeasible=mode, **kw)
    except ParameterError as e:
        assert mode == "error" and e.param == "offload_chunks"
        best = largest_feasible_chunks(sched, tl, **kw)
        assert best < C and f"the largest feasible C for these settings is {best}" in str(e)
        res, C = plan_offload(sched, tl, offload_chunks=best, **kw), best
    _check_plan(sched, tl, res, C, costs.comm, mode, postpone)
    assert res.offloaded_chunks == C


def test_every_registry_schedule(schedule_name):
    sched = generate(schedule_name, p=4, m=8)
    tl = simulate(sched)
    for c in range(sched.chunks + 1):
        res = plan_offload(sched, tl, offload_chunks=c)  # instantaneous: always feasible
        _check_plan(sched, tl, res, c, 0.0, "error", False)
    full = plan_offload(sched, tl, offload_chunks=sched.chunks)
    # With instant transfers an activation is resident only during its F and from its B to its W.
    assert max(full.peak) <= max(full.peak_no_offload)


# --- infeasible requests, auto -------------------------------------------------------------
def test_infeasible_names_largest_feasible_c():
    s, tl = _timed("group-interleaved", p=8, m=32, v=4, g=8)
    assert largest_feasible_chunks(s, tl, offload_time=1.0) == 1
    with pytest.raises(ParameterError) as ei:
        plan_offload(s, tl, offload_chunks=3, offload_time=1.0)
    assert ei.value.param == "offload_chunks"
    assert "the largest feasible C for these settings is 1" in str(ei.value)
    s1, tl1 = _timed("1f1b", p=8, m=32)
    with pytest.raises(ParameterError, match="largest feasible C for these settings is 0"):
        plan_offload(s1, tl1, offload_chunks=1, offload_time=1.0)
    # Fallbacks instead of the error:
    skip = plan_offload(s, tl, offload_chunks=3, offload_time=1.0, on_infeasible="skip")
    # dropped: reloads that miss their B ("link_busy"), or whole chunks when the plan for fewer
    # chunks peaks lower ("no_gain": skip mode is never worse than a smaller C)
    assert skip.skipped.get("link_busy", 0) + skip.skipped.get("no_gain", 0) > 0 and skip.makespan == tl.makespan
    assert max(skip.peak) <= max(plan_offload(s, tl, offload_chunks=1, offload_time=1.0).peak)
    delay = plan_offload(s, tl, offload_chunks=3, offload_time=1.0, on_infeasible="delay")
    assert delay.delayed > 0 and delay.makespan >= tl.makespan


@settings(deadline=None)
@given(
    name=st.sampled_from(_CLASSIC),
    p=st.integers(2, 6),
    ot=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    tol=st.sampled_from([0.0, 0.01, 0.05]),
    mode=st.sampled_from(["skip", "delay", "error"]),
)
def test_auto_respects_tolerance_and_picks_lowest_peak(name, p, ot, tol, mode):
    s, tl = _timed(name, p=p, m=2 * p)
    res = plan_offload(s, tl, auto=True, offload_time=ot, tolerance=tol, on_infeasible=mode)
    assert res.makespan <= tl.makespan * (1 + tol) + EPS
    assert max(res.peak) <= max(res.peak_no_offload) + EPS
    for c in range(s.chunks + 1):
        try:
            other = plan_offload(s, tl, offload_chunks=c, offload_time=ot, on_infeasible=mode)
        except ParameterError:
            continue
        if other.makespan <= tl.makespan * (1 + tol) + EPS:
            assert max(res.peak) <= max(other.peak) + EPS


# --- the host link model -----------------------------------------------------------------
def test_link_groups_and_odd_last_rank():
    s, tl = _timed("gpipe", p=5, m=5)
    res = plan_offload(s, tl, offload_chunks=1, offload_time=0.25, on_infeasible="skip")
    links = {t.rank: t.link for t in res.transfers}
    assert links == {r: r // 2 for r in links} and links.get(4) == 2  # rank 4 alone on link 2
    # More ranks per link = less capacity each: never more feasible.
    s8, tl8 = _timed("1f1b", p=8, m=32)
    caps = [largest_feasible_chunks(s8, tl8, offload_time=0.5, link_group=n) for n in (1, 2, 4)]
    assert caps[0] >= caps[1] >= caps[2]
    assert caps[0] == 1 and caps[2] == 0


def test_solo_transfers_are_faster_shared_ones_are_not():
    s, tl = _timed("gpipe", p=1, m=4)  # F0..F3 then BW0..BW3 on one rank
    res = plan_offload(s, tl, offload_chunks=1, offload_time=0.25, link_group=1, solo_factor=0.7)
    d = 0.25 * 3.0  # one-way transfer = 0.25 × (F+B+W)
    durs = sorted(round(e.end - e.start, 9) for e in res.timeline.events if e.op.kind in (OS, RS))
    assert set(durs) <= {round(0.7 * d, 9), round(d, 9)}
    assert round(0.7 * d, 9) in durs  # the lone first offload overlaps no reload
    same = plan_offload(s, tl, offload_chunks=1, offload_time=0.25, link_group=1, solo_factor=1.0)
    assert all(e.end - e.start == pytest.approx(d) for e in same.timeline.events if e.op.kind in (OS, RS))


def test_absolute_transfer_times_match_relative():
    s, tl = _timed("interleaved-1f1b", p=4, m=8)  # chunk F+B+W = 1.5
    a = plan_offload(s, tl, offload_chunks=2, offload_time=0.2)
    b = plan_offload(s, tl, offload_chunks=2, transfer_times=[0.3] * s.num_stages)
    assert [(t.offload_start, t.reload_end) for t in a.transfers] == [(t.offload_start, t.reload_end) for t in b.transfers]


def test_byte_memory_model_offloads_the_forward_share():
    # Finer model: B frees part, W the rest; the offload moves what F kept.
    mem = MemoryDeltas(F=34.0, B=-7.0, W=-27.0)
    s = generate("group-interleaved", p=4, m=8, v=2)
    res = plan_offload(s, memory=mem, offload_chunks=2)
    assert all(t.amount == pytest.approx(17.0) for t in res.transfers)
    for r in range(4):
        assert abs(res.timeline.memory_curve(r)[-1][1]) < EPS
    assert max(res.peak) < max(res.peak_no_offload)


# --- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(offload_chunks=3), "offload_chunks"),
        (dict(offload_chunks=-1), "offload_chunks"),
        (dict(offload_time=-0.1), "offload_time"),
        (dict(offload_time=float("nan")), "offload_time"),
        (dict(link_group=0), "link_group"),
        (dict(solo_factor=0.0), "solo_factor"),
        (dict(tolerance=-0.01), "tolerance"),
        (dict(on_infeasible="maybe"), "on_infeasible"),
        (dict(transfer_times=[0.1, 0.2]), "transfer_times"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs, param):
    """The library names its own keyword argument (the command line maps it to its flag)."""
    s, tl = _timed("group-interleaved", p=4, m=8, v=2)
    with pytest.raises(ParameterError) as ei:
        plan_offload(s, tl, **kwargs)
    assert ei.value.param == param


def test_wrong_comm_is_detected_when_retiming():
    costs = Costs(comm=0.5)
    s, tl = _timed("1f1b", costs, p=4, m=8)
    with pytest.raises(ParameterError) as ei:
        plan_offload(s, tl, offload_chunks=1, postpone_warmup=True)  # comm defaults to 0
    assert ei.value.param == "comm"
    plan_offload(s, tl, offload_chunks=1, postpone_warmup=True, comm=0.5)


def test_offloaded_schedule_cannot_be_offloaded_again():
    s, tl = _timed("1f1b", p=4, m=8)
    res = plan_offload(s, tl, offload_chunks=1)
    with pytest.raises(ParameterError, match="already holds transfer"):
        plan_offload(res.schedule, res.timeline, offload_chunks=1)


def test_pass_does_not_import_torch():
    assert_imports_no_torch("pipeoffload.passes.offload", "pipeoffload.commands.simulate")


# --- CLI -----------------------------------------------------------------------------------
def _cli_json(capsys, *argv):
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_offload_json(capsys):
    base = _cli_json(capsys, "group-interleaved", "-p", "8", "-m", "32", "-v", "2", "-g", "4")
    assert "offload" not in base and "peak_memory_no_offload" not in base
    out = _cli_json(capsys, "group-interleaved", "-p", "8", "-m", "32", "-v", "2", "-g", "4", "--offload-chunks", "1")
    assert out["offloaded_chunks"] == 1 and out["peak_memory_max"] * 2 == 5
    assert max(out["peak_memory_no_offload"]) * 2 == 12 and out["peak_memory_no_offload"] == base["peak_memory"]
    assert len(out["host_memory"]) == 8 and out["offload"]["transfers"] == 256
    assert out["makespan"] == base["makespan"]
    auto = _cli_json(capsys, "1f1b", "-p", "8", "-m", "32", "--offload", "auto", "--offload-time", "0.25",
                     "--offload-tolerance", "0.01", "--link-group", "2", "--ops")
    assert auto["offload"]["auto"] is True and auto["offloaded_chunks"] == 1
    assert {op["stream"] for op in auto["ops"]} == {"compute", "d2h", "h2d"}


def test_cli_offload_text_and_errors(capsys):
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--offload-chunks", "1", "--offload-time", "0.25"]) == 0
    text = capsys.readouterr().out
    assert "offload" in text and "host memory" in text and "without offload" in text
    for argv, flag in [
        (["--offload-chunks", "1", "--offload-time", "1", "-p", "8", "-m", "32"], "--offload-chunks"),
        (["--offload-chunks", "2"], "--offload-chunks"),
        (["--offload-time", "0.5"], "--offload-time"),
        (["--offload-chunks", "1", "--link-group", "0"], "--link-group"),
        (["--offload", "auto", "--offload-tolerance", "-1"], "--offload-tolerance"),
    ]:
        assert main(["simulate", "1f1b", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0], (argv, err)


# --- the stash window: B→W (stash=True) ------------------------------------------------------
SOS, SOE, SRS, SRE = (OpKind.STASH_OFFLOAD_START, OpKind.STASH_OFFLOAD_END, OpKind.STASH_RELOAD_START,
                      OpKind.STASH_RELOAD_END)


def test_without_stash_no_stash_ops(schedule_name):
    s, tl = _timed(schedule_name, p=4, m=8)
    res = plan_offload(s, tl, auto=True, offload_time=0.1)
    assert not any(o.kind.window == "stash" for o in res.schedule.ops())
    assert all(t.window == "activation" for t in res.transfers)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["zb-h1", "zb-h2", "zb-auto", "zb-v", "v-min", "v-half", "group-interleaved"]),
    p=st.integers(2, 5),
    extra_m=st.integers(0, 4),
    costs=st.sampled_from([Costs(), Costs(F=1, B=2, W=1, comm=0.1)]),
    memory=st.sampled_from([MemoryDeltas(), MemoryDeltas(F=34.0, B=-7.0, W=-27.0)]),
    ot=st.sampled_from([0.0, 0.1, 0.25]),
    mode=st.sampled_from(["skip", "delay"]),
)
def test_stash_window_invariants(name, p, extra_m, costs, memory, ot, mode):
    sched = generate(name, p=p, m=p + extra_m)
    tl = simulate(sched, costs, memory)
    res = plan_offload(sched, tl, offload_chunks=sched.chunks, offload_time=ot, comm=costs.comm,
                       on_infeasible=mode, stash=True)
    compute = {e.op.key: e for e in res.timeline.events if e.op.kind.is_compute}
    stash = [t for t in res.transfers if t.window == "stash"]
    for t in stash:
        b, w = compute[(OpKind.B, t.stage, t.microbatch)], compute[(OpKind.W, t.stage, t.microbatch)]
        assert b.end - EPS <= t.offload_start <= t.offload_end <= t.reload_start <= t.reload_end <= w.start + EPS
        assert t.amount == pytest.approx(-w.mem)  # what W frees: what only W needs
    for r in range(sched.num_ranks):
        curve = res.timeline.memory_curve(r)
        assert min(x for _, x in curve) >= -EPS and abs(curve[-1][1]) < EPS
        lst = res.schedule.ranks[r]
        pos = {o.key: i for i, o in enumerate(lst)}
        for t in stash:
            if t.rank == r:
                k = lambda kind: pos[(kind, t.stage, t.microbatch)]  # noqa: E731
                assert pos[(OpKind.B, t.stage, t.microbatch)] + 1 <= k(SOS) < k(SOE) < k(SRS) < k(SRE)
                wpos = pos[(OpKind.W, t.stage, t.microbatch)]
                assert k(SRE) < wpos and not any(o.kind.is_compute for o in lst[k(SRE) + 1:wpos])  # right before W
    per_link: dict = {}  # both windows share each direction of a link, one copy at a time
    for e in res.timeline.events:
        if e.op.kind in (OS, SOS, RS, SRS) and e.end > e.start:
            d = "d2h" if e.op.kind in (OS, SOS) else "h2d"
            per_link.setdefault((d, e.rank // 2), []).append((e.start, e.end))
    for ivs in per_link.values():
        ivs.sort()
        assert all(a[1] <= b[0] + EPS for a, b in zip(ivs, ivs[1:]))
    if res.delayed == 0 and mode == "skip":
        assert all(a <= b + EPS for a, b in zip(res.peak, res.peak_no_offload))
    validate(res.schedule)


@pytest.mark.parametrize("name, without, with_stash", [("zb-h1", 8, 1), ("zb-v", 8, 0.5), ("v-half", 2, 0.5)])
def test_stash_lets_zero_bubble_schedules_gain_from_offload(name, without, with_stash):
    """p = 8, m = 32, free transfers: with the activation window alone a zero-bubble schedule keeps
    its activations from B to the deferred W; the stash window moves those too."""
    s, tl = _timed(name, p=8, m=32)
    a = plan_offload(s, tl, offload_chunks=s.chunks)
    b = plan_offload(s, tl, offload_chunks=s.chunks, stash=True)
    assert max(a.peak) == without and max(b.peak) == with_stash
    assert b.makespan == tl.makespan


@pytest.mark.parametrize("name, kw, before, after", [("zb-h1", {}, 8, 7), ("zb-h2", {}, 15, 12),
                                                      ("zb-v", {}, 7.5, 6.5)])
def test_peak_placement_shares_a_busy_link_between_its_ranks(name, kw, before, after):
    """p = 8, m = 32, k = 1 (a round trip as long as F+B+W), two ranks per host link, both
    windows: the link is too slow for every candidate, and the memory-blind placements gave
    it to one rank of each pair while the other kept its whole peak (``before``: the best of
    them, the "peak" placement left out). The "peak" placement lowers the highest rank."""
    from pipeoffload.passes import offload as mod

    s, tl = _timed(name, p=8, m=32, **kw)
    blind = {k: v for k, v in mod._STRATEGIES.items() if k != "peak"}
    full = dict(mod._STRATEGIES)
    try:
        mod._STRATEGIES.clear()
        mod._STRATEGIES.update(blind)
        old = plan_offload(s, tl, auto=True, offload_time=0.5, stash=True)
    finally:
        mod._STRATEGIES.clear()
        mod._STRATEGIES.update(full)
    new = plan_offload(s, tl, auto=True, offload_time=0.5, stash=True)
    assert max(old.peak) == before
    assert max(new.peak) == after and new.settings["placement"] == "peak"
    assert new.makespan == tl.makespan and all(a <= b + EPS for a, b in zip(new.peak, new.peak_no_offload))
    validate(new.schedule)


def test_stash_delay_mode_lets_w_wait():
    s, tl = _timed("zb-h1", p=4, m=8)
    res = plan_offload(s, tl, offload_chunks=1, offload_time=0.5, on_infeasible="delay", stash=True)
    assert any(t.window == "stash" for t in res.transfers)
    compute = {e.op.key: e for e in res.timeline.events if e.op.kind.is_compute}
    for t in res.transfers:
        consumer = compute[(OpKind.W if t.window == "stash" else OpKind.B, t.stage, t.microbatch)]
        assert t.reload_end <= consumer.start + EPS


def test_cli_offload_stash(capsys):
    rc = main(["simulate", "zb-h1", "-p", "4", "-m", "8", "--offload-chunks", "1", "--offload-stash", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["offload"]["stash"] is True and max(out["peak_memory"]) < max(out["peak_memory_no_offload"])
    assert main(["simulate", "zb-h1", "--offload-stash"]) == 2
    assert "--offload-stash" in capsys.readouterr().err


# --- defaults: postponed warm-up where it helps, offloads packed ------------------------------
@pytest.mark.parametrize("name, p, m, ot", [("group-interleaved", 8, 32, 0.25), ("group-interleaved", 12, 48, 0.25),
                                            ("1f1b", 6, 12, 0.2), ("zb-v", 4, 8, 0.1)])
def test_default_plans_with_and_without_postponing_and_keeps_the_better(name, p, m, ot):
    s, tl = _timed(name, p=p, m=m)
    key = lambda r: (round(r.makespan, 9), max(r.peak), sum(r.peak))  # noqa: E731
    default = plan_offload(s, tl, offload_chunks=1, offload_time=ot, on_infeasible="skip")
    both = [plan_offload(s, tl, offload_chunks=1, offload_time=ot, on_infeasible="skip", postpone_warmup=x)
            for x in (False, True)]
    assert key(default) == min(key(r) for r in both)
    assert default.settings["postponed"] in (False, True)


def test_warmup_offloads_are_packed_at_the_solo_rate():
    """The reference code's warm-up adjustment: back-to-back offloads at the solo rate while no
    reload runs; for group-interleaved p = 12, m = 48, g = 6, C = 1, k/2 = 0.25 its peak is 9
    chunk units (ours was 10 without postponing, 8 with, before packing)."""
    s, tl = _timed("group-interleaved", p=12, m=48, g=6)
    res = plan_offload(s, tl, offload_chunks=1, offload_time=0.25)
    assert max(res.peak) * 2 <= 8
    solo = 0.7 * 0.25 * 1.5
    first = sorted((e for e in res.timeline.events if e.op.kind is OS and e.rank in (0, 1)), key=lambda e: e.start)[:4]
    assert all(e.end - e.start == pytest.approx(solo) for e in first)


def test_options_is_the_one_settings_value_and_keywords_beside_it_are_refused():
    from pipeoffload.errors import ParameterError
    from pipeoffload.passes.offload import OffloadOptions, plan_offload
    from pipeoffload.schedules import generate

    sched = generate("group-interleaved", p=4, m=8, v=2)
    opts = OffloadOptions(offload_chunks=1, offload_time=0.25, link_group=1)
    by_options = plan_offload(sched, options=opts)
    by_keywords = plan_offload(sched, offload_chunks=1, offload_time=0.25, link_group=1)
    assert by_options.peak == by_keywords.peak and by_options.settings == by_keywords.settings
    assert by_options.settings["link_group"] == 1 and by_options.settings["on_infeasible"] == "error"
    with pytest.raises(ParameterError, match=r"^options: give the settings either .* \(also given: stash\)"):
        plan_offload(sched, options=opts, stash=True)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=40)
@given(
    name=st.sampled_from(_CLASSIC + ["zb-h1", "zb-h2", "zb-v", "v-min", "v-half", "v-zb", "dualpipev"]),
    p=st.integers(2, 5),
    extra_m=st.integers(0, 6),
    costs=st.sampled_from([Costs(), Costs(F=1, B=2, W=1, comm=0.1), Costs(F=1, B=1.5, W=0.5, comm=0.3)]),
    memory=st.sampled_from([MemoryDeltas(), MemoryDeltas(2.0, -0.5, -1.5)]),
    ot=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    link_group=st.integers(1, 3),
    postpone=st.booleans(),
    c_frac=st.floats(0, 1),
)
def test_offload_floor_is_below_every_plan_and_met_by_instant_copies_host_ceiling_above(name, p, extra_m, costs, memory, ot,
                                                                           link_group, postpone, c_frac):
    # The planner skips offload tries whose floor is over the budget (docs/planner.md §4): the floor
    # must never exceed a plan's peak, and with instantaneous copies (nothing dropped) it is the peak;
    # the host ceiling (which proves a try is not refused for pinned memory) is never below a plan's.
    from pipeoffload.passes.offload import OffloadOptions, offload_bounds, offload_peak_floor

    m = max(p + extra_m, 2 * p) if name == "dualpipev" else p + extra_m
    sched = generate(name, p=p, m=m)
    tl = simulate(sched, costs, memory)
    C = max(1, round(c_frac * sched.chunks))
    opts = OffloadOptions(offload_chunks=C, offload_time=ot, link_group=link_group, on_infeasible="skip",
                          postpone_warmup=postpone)
    floor = offload_peak_floor(sched, tl, comm=costs.comm, options=opts)
    assert floor is not None
    (same, ceiling), = offload_bounds(sched, tl, comm=costs.comm, options=opts, chunks=[C]).values()
    assert same == floor
    res = plan_offload(sched, tl, comm=costs.comm, options=opts)
    for r, (f, peak) in enumerate(zip(floor, res.peak)):
        assert f <= peak + 1e-9 * max(1.0, abs(peak)), (r, f, peak)
        assert f <= tl.peak_memory()[r] + 1e-9
        assert res.host_memory[r] <= ceiling[r] * (1 + 1e-9), (r, res.host_memory[r], ceiling[r])
    if ot == 0.0:
        assert floor == pytest.approx(res.peak, abs=1e-9)


def test_offload_peak_floor_says_nothing_for_other_modes():
    from pipeoffload.passes.offload import OffloadOptions, offload_peak_floor

    sched, tl = _timed("1f1b", p=4, m=8)
    for opts in (OffloadOptions(auto=True), OffloadOptions(offload_chunks=1, on_infeasible="delay"),
                 OffloadOptions(offload_chunks=1, on_infeasible="skip", stash=True),
                 OffloadOptions(offload_chunks=1, on_infeasible="skip")):  # postpone None: plans both ways
        assert offload_peak_floor(sched, tl, comm=0.0, options=opts) is None


@settings(deadline=None, max_examples=300)
@given(
    gaps=st.lists(st.tuples(st.floats(0, 3), st.floats(0.01, 3)), max_size=12),
    t=st.floats(-1, 30), d=st.floats(0.01, 4), limit=st.floats(-1, 40),
)
def test_bounded_gap_searches_answer_as_the_full_ones(gaps, t, d, limit):
    # The peak placement asks whether a copy ends by (starts after) a point; the scans stop once it
    # cannot, which must change no answer to that question (and no gap it books).
    from pipeoffload.passes.offload import _earliest_gap, _latest_gap

    busy, at = [], 0.0
    for gap, length in gaps:
        at += gap
        busy.append((at, at + length))
        at += length
    full, bounded = _earliest_gap(busy, t, d), _earliest_gap(busy, t, d, limit)
    assert (full + d > limit) == (bounded + d > limit)
    if full + d <= limit:
        assert bounded == full
    full, bounded = _latest_gap(busy, t, d), _latest_gap(busy, t, d, limit)
    assert (full - d <= limit) == (bounded - d <= limit)
    if full - d > limit:
        assert bounded == full


def _described(res) -> str:
    """Every field of an offload plan, as benchmarks/offload_outputs.py compares them."""
    return repr((res.schedule.ranks, res.schedule.params, res.timeline.events, res.timeline.meta, res.transfers,
                 res.skipped, res.settings, res.delayed, res.peak, res.peak_no_offload, res.host_memory,
                 res.makespan, res.makespan_no_offload, res.offloaded_chunks))


@pytest.mark.parametrize("name,p,m,kw", [
    ("zb-v", 4, 12, {}), ("group-interleaved", 4, 10, {"v": 3, "g": 3}), ("interleaved-1f1b", 3, 9, {"v": 3}),
    ("dualpipev", 4, 16, {}), ("v-half", 4, 12, {}),
])
@pytest.mark.parametrize("order", ["up", "down"])
def test_offload_session_plans_are_plan_offloads(name, p, m, kw, order):
    """OffloadSession (the planner's tries C = 1, 2, … in one context, each C's plan made once)
    gives, whatever it planned before, exactly plan_offload's plan, and leaves the plans it
    returned before as they were (each call gets its own copy of the kept draft)."""
    from dataclasses import replace

    from pipeoffload.passes.offload import OffloadOptions, OffloadSession

    sched = generate(name, p=p, m=m, **kw)
    costs = Costs(F=1.0, B=2.0, W=1.0, comm=0.1)
    tl = simulate(sched, costs)
    chunks = list(range(1, sched.chunks + 1))
    chunks = chunks if order == "up" else chunks[::-1]
    for postpone in (True, False):
        opts = OffloadOptions(offload_time=0.6, on_infeasible="skip", postpone_warmup=postpone, link_group=2)
        session = OffloadSession(sched, tl, comm=costs.comm, options=opts)
        got = [(C, session.plan(C)) for C in chunks]
        seen = [_described(r) for _, r in got]
        for (C, res), text in zip(got, seen):
            want = plan_offload(sched, tl, comm=costs.comm, options=replace(opts, offload_chunks=C))
            assert text == _described(want), (C, postpone)
            assert _described(res) == text  # not changed by the plans made after it
