"""The offload pass's limit mode (``mem_limit``) and "skip" mode never worse with more chunks
(issue 27; docs/solver.md, docs/schedules.md#dualpipev)."""

from __future__ import annotations

import pytest

from pipeoffload.costs import Costs
from pipeoffload.errors import ParameterError
from pipeoffload.ir import OpKind
from pipeoffload.passes.offload import OffloadOptions, plan_offload
from pipeoffload.passes.timing import simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules import generate


def _timed(name: str, costs: Costs | None = None, **kw):
    s = generate(name, **kw) if costs is None else generate(name, costs=costs, **kw)
    return s, simulate(s, costs)


@pytest.mark.parametrize("name, kw", [("dualpipev", {"p": 4, "m": 16}), ("zb-v", {"p": 4, "m": 16}),
                                      ("group-interleaved", {"p": 4, "m": 16, "v": 4, "g": 4})])
@pytest.mark.parametrize("offload_time", [0.25, 0.5, 1.0])
def test_skip_mode_never_peaks_higher_with_more_chunks(name, kw, offload_time):
    """DualPipeV p = 4, m = 16 at 0.5 × F+B+W: C = 2 peaked at 3.5 units, C = 1 at 3 (the
    placements, given chunk 1's copies too, crowded out chunk 0's)."""
    s, tl = _timed(name, **kw)
    prev = None
    for c in range(1, s.chunks + 1):
        res = plan_offload(s, tl, offload_chunks=c, offload_time=offload_time, on_infeasible="skip")
        assert res.offloaded_chunks == c and res.schedule.params["offload_chunks"] == c
        assert res.makespan == tl.makespan
        assert all(t.chunk < c for t in res.transfers)
        if prev is not None:
            assert (max(res.peak), sum(res.peak)) <= (max(prev.peak), sum(prev.peak))
            if res.settings.get("placed_chunks", c) < c:
                assert res.skipped["no_gain"] > 0
        prev = res
    if name == "dualpipev" and offload_time == 0.5:
        assert max(prev.peak) == 3.0


def _orders(schedule):
    return [[(o.kind, o.stage, o.microbatch) for o in lst if o.kind.is_compute] for lst in schedule.ranks]


@pytest.mark.parametrize("link", [0.0, 0.25])
def test_limit_mode_keeps_every_rank_within_the_limit(link):
    """V-Min, p = 3, m = 6 (peak 2 units) down to 1 unit: forwards wait for the copies; the
    orders stay, the program validates, the makespan may only grow."""
    costs = Costs(F=2, B=2, W=2)
    s, tl = _timed("v-min", costs, p=3, m=6)
    assert max(tl.peak_memory()) > 1
    res = plan_offload(s, tl, offload_chunks=2, offload_time=link, solo_factor=1.0, mem_limit=1)
    assert max(res.peak) <= 1 + 1e-9
    assert _orders(res.schedule) == _orders(s)
    validate(res.schedule)
    assert res.makespan >= tl.makespan - 1e-9
    assert res.settings["mem_limit"] == 1
    # every copy in order, and the B waits for its reload
    starts = {(e.op.kind, e.op.stage, e.op.microbatch): e.start for e in res.timeline.compute_events()}
    for t in res.transfers:
        assert t.offload_start <= t.offload_end <= t.reload_start <= t.reload_end
        assert t.reload_end <= starts[(OpKind.B, t.stage, t.microbatch)] + 1e-9


def test_limit_mode_where_nothing_needs_to_wait_changes_no_compute_time():
    s, tl = _timed("zb-h1", p=4, m=8)
    res = plan_offload(s, tl, offload_chunks=1, mem_limit=max(tl.peak_memory()))
    assert res.makespan == tl.makespan and res.delayed == 0


def test_limit_mode_errors_name_mem_limit():
    s, tl = _timed("zb-h1", p=4, m=8)
    with pytest.raises(ParameterError) as e:
        plan_offload(s, tl, offload_chunks=1, offload_time=1.0, mem_limit=1)
    assert e.value.param == "mem_limit" and "no plan" in str(e.value)
    for bad in (dict(auto=True), dict(on_infeasible="skip")):
        with pytest.raises(ParameterError) as e:
            plan_offload(s, tl, mem_limit=3, **bad)
        assert e.value.param == "mem_limit"
    with pytest.raises(ParameterError) as e:
        plan_offload(s, tl, mem_limit=float("nan"))
    assert e.value.param == "mem_limit"


def test_settings_report_mem_limit_only_in_the_limit_mode():
    s, tl = _timed("zb-h1", p=4, m=8)
    assert "mem_limit" not in plan_offload(s, tl, offload_chunks=1).settings
    opts = OffloadOptions(offload_chunks=1, mem_limit=4.0)
    assert plan_offload(s, tl, options=opts).settings["mem_limit"] == 4.0
