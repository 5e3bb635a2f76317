"""The peak placement's sweep and the plans' figures, against their full paths (issue 24):
the sweep that tries only the candidates whose producer has ended, the running sum of
whole-number savings, the sweep given up over its target and the best, and the draft
figures (peaks merged from the sorted compute changes) against the built timeline."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.passes import offload as off
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate

_EPS = off._EPS


def _scan_sweep(cands, ranks, levels, target, far_first):
    """The sweep as it was: every candidate of the rank scanned at every point over the target,
    the savings summed over every booked one in booking order."""
    base = {r: levels.get(r, []) for r in ranks}
    mine = {r: [] for r in ranks}
    sign = -1 if far_first else 1
    for c in sorted(cands, key=lambda c: (sign * c.backward_start, c.forward_end, c.stage, c.microbatch)):
        mine[c.rank].append(c)
    up, down, placed = [], [], {}
    booked = {r: [] for r in ranks}
    reached = {r: 0.0 for r in ranks}

    def level(r, t):
        i = bisect_right(base[r], (t + _EPS, math.inf, True)) - 1
        lvl = base[r][i][1] if i >= 0 else 0.0
        return lvl - sum(a for s0, u, a in booked[r] if t < u - _EPS and s0 <= t + _EPS)

    sweep = [(t, r) for r in ranks for t, _, alloc in base[r] if alloc]
    heapq.heapify(sweep)
    while sweep:
        t, r = heapq.heappop(sweep)
        now = level(r, t)
        for c in mine[r]:
            if now <= target + _EPS:
                break
            if id(c) in placed or not off._covers(c, t):
                continue
            slots = off._slots_around(c, t, up, down)
            if slots is None:
                continue
            placed[id(c)] = slots
            booked[r].append((slots[1], slots[2], c.amount))
            heapq.heappush(sweep, (slots[2], r))
            now -= c.amount
        reached[r] = max(reached[r], now)
    return placed, reached


_CASES = [  # (schedule, p, m, kwargs, memory deltas): byte-like whole amounts and fractional ones
    ("1f1b", 4, 12, {}, None),
    ("group-interleaved", 4, 12, {"v": 3, "g": 3}, MemoryDeltas(F=3.0, B=-1.0, W=-2.0)),
    ("zb-h1", 4, 10, {}, MemoryDeltas(F=1.3, B=-0.4, W=-0.9)),
    ("interleaved-1f1b", 4, 12, {"v": 2}, None),
]


def _setting(name, p, m, kw, memory, link_group=2, ot=0.5):
    sched = generate(name, p=p, m=m, **kw)
    costs = Costs(F=1.0, B=2.0, W=1.0, comm=0.05)
    tl = simulate(sched, costs, memory)
    ctx = off._Context.make(sched, tl, ot, None, link_group, 0.7, costs.comm)
    ctx.check_retimable()
    events = off._postponed_warmup(ctx)[0]
    return ctx, events


def _links(ctx, events, levels):
    """Each (C, host link)'s candidates with their ranks and the rank levels' distinct tops."""
    for C in range(1, ctx.schedule.chunks + 1):
        cands, _ = off._candidates(ctx, events, C)
        for lst in off._by_link(cands).values():
            ranks = sorted({c.rank for c in lst})
            yield lst, ranks, sorted({round(lvl, 9) for r in ranks for _, lvl, _ in levels.get(r, [])})


@pytest.mark.parametrize("name,p,m,kw,memory", _CASES)
def test_sweep_tries_the_same_candidates_as_the_scan(name, p, m, kw, memory, monkeypatch):
    ctx, events = _setting(name, p, m, kw, memory)
    levels = off._rank_levels(events)
    looked = [0]
    at = off._Covering.at

    def counting(self, t):
        got = at(self, t)
        looked[0] += len(self.cands) - len(got)  # candidates the scan would have looked at, skipped here
        return got

    monkeypatch.setattr(off._Covering, "at", counting)
    compared = 0
    for lst, ranks, tops in _links(ctx, events, levels):
        for target in tops[:: max(1, len(tops) // 6)]:
            for far_first in (False, True):
                want = _scan_sweep(lst, ranks, levels, target, far_first)
                assert off._sweep_link(lst, ranks, levels, target, far_first) == want
                key = (max(want[1].values()), sum(want[1].values()))
                for give_up in (key[0] - 1.0, key[0], key[0] + 1.0, -math.inf):
                    got = off._sweep_link(lst, ranks, levels, target, far_first, give_up)
                    # given up only where the full sweep neither meets the target nor beats `give_up`
                    assert got == want if got is not None else key[0] > max(give_up, target + _EPS)
                compared += 1
    assert compared >= 8 and looked[0] > 0  # the shortcut fires


def test_sweep_gives_up_somewhere():
    ctx, events = _setting("1f1b", 4, 12, {}, None)
    levels = off._rank_levels(events)
    cands, _ = off._candidates(ctx, events, 1)
    lst = off._by_link(cands)[0]
    ranks = sorted({c.rank for c in lst})
    assert off._sweep_link(lst, ranks, levels, 0.0, False, give_up=0.5) is None


@settings(deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), st.floats(0, 3), st.floats(0.01, 4),
                           st.one_of(st.integers(1, 2 ** 40).map(float), st.floats(0.01, 9))), max_size=40),
    whole=st.booleans(),
)
def test_savings_are_the_booking_order_sums(ops, whole):
    """A read is the sum over the savings begun and not over in booking order; whole amounts take
    the running sum, which must give the same float."""
    s, booked, t = off._Savings(), [], 0.0
    for read, step, length, amount in ops:
        amount = float(math.floor(amount)) if whole else amount
        if read:
            t += step
            want = sum(a for s0, u, a in booked if t < u - _EPS and s0 <= t + _EPS)
            assert s.at(t) == want
        else:
            start = t + step - 1.0
            s.add(start, start + length, amount)
            booked.append((start, start + length, amount))
    if whole and booked:
        assert s.exact  # the running sum fired


def test_savings_leave_the_running_sum_past_two_to_the_53():
    s = off._Savings()
    s.add(0.0, 10.0, 2.0 ** 52)
    s.add(0.0, 10.0, 2.0 ** 52 + 2)
    assert not s.exact
    assert s.at(1.0) == 2.0 ** 52 + (2.0 ** 52 + 2)


_NO_SPLIT_BACKWARD = ("1f1b", "interleaved-1f1b", "dualpipev")  #: no B→W stash window to offload


@pytest.mark.parametrize("name,p,m,kw,memory,stash",
                         [c + (stash,) for c in _CASES + [("dualpipev", 4, 16, {}, None)]
                          for stash in (False, True) if not (stash and c[0] in _NO_SPLIT_BACKWARD)])
def test_draft_figures_are_the_built_timelines(name, p, m, kw, memory, stash):
    """Every placement's draft peaks and makespan equal those of the timeline it builds."""
    ctx, _ = _setting(name, p, m, kw, memory)
    ctx.stash = stash
    n = 0
    for C in range(1, ctx.schedule.chunks + 1):
        for mode in ("skip", "delay"):
            for place in off._STRATEGIES.values():
                if mode == "delay" and (getattr(place, "long_lived", False) or getattr(place, "needs_events", False)):
                    continue
                for postpone in (False, True):
                    draft = off._plan_with_placement(ctx, C, mode, postpone, place)
                    res = draft.result()
                    assert draft.peak == res.timeline.peak_memory() == res.peak
                    assert draft.makespan == res.timeline.makespan == res.makespan
                    # the host memory _finish reads from the transfer events alone: the whole timeline's
                    whole = [off._clean(max(x for _, x in c)) for c in off.host_memory_curves(res.timeline)]
                    assert off._finish(res).host_memory == whole
                    n += bool(res.transfers)
    assert n > 0


def _fields(res) -> str:
    return repr((res.schedule.ranks, res.schedule.params, res.timeline.events, res.timeline.meta, res.transfers,
                 res.skipped, res.settings, res.delayed, res.peak, res.peak_no_offload, res.host_memory,
                 res.makespan, res.makespan_no_offload, res.offloaded_chunks))


@pytest.mark.parametrize("name,p,m,kw", [("group-interleaved", 4, 12, {"v": 3, "g": 3}),
                                         ("interleaved-1f1b", 4, 12, {"v": 3})])
@pytest.mark.parametrize("postpone", [True, False])
def test_plans_for_fewer_chunks_proved_worse_are_not_made(name, p, m, kw, postpone, monkeypatch):
    """"skip" mode compares the plan for C with those for fewer chunks; one whose floor is over
    the best peak is not made: the plans equal those made comparing with every one."""
    sched = generate(name, p=p, m=m, **kw)
    costs = Costs(F=1.0, B=2.0, W=1.0, comm=0.05)
    tl = simulate(sched, costs, MemoryDeltas(F=4.0, B=-1.0, W=-3.0))
    opts = off.OffloadOptions(offload_time=0.2, on_infeasible="skip", postpone_warmup=postpone)
    chunks = range(2, sched.chunks + 1)
    fired = []
    check = off._fewer_cannot_win
    monkeypatch.setattr(off, "_fewer_cannot_win", lambda *a: fired.append(check(*a)) or fired[-1])
    got = [_fields(off.OffloadSession(sched, tl, comm=costs.comm, options=opts).plan(C)) for C in chunks]
    monkeypatch.setattr(off, "_fewer_cannot_win", lambda *a: False)
    want = [_fields(off.OffloadSession(sched, tl, comm=costs.comm, options=opts).plan(C)) for C in chunks]
    assert got == want
    assert any(fired)  # the proof fires


def test_one_try_order_serves_every_target():
    """The peak placement makes each link's try order once (:class:`_TryOrder`) for every
    target of its bisection: a sweep given it equals one making its own, and the sweeps leave
    it as it was (only their :class:`_Covering` changes)."""
    ctx, events = _setting("group-interleaved", 4, 12, {"v": 3, "g": 3}, MemoryDeltas(F=3.0, B=-1.0, W=-2.0))
    levels = off._rank_levels(events)
    compared = 0
    for lst, ranks, tops in _links(ctx, events, levels):
        for far_first in (False, True):
            order = off._TryOrder(lst, ranks, levels, far_first)
            before = repr((order.ranks, order.points))
            for target in tops[:: max(1, len(tops) // 5)]:
                got = off._sweep_link(lst, ranks, levels, target, far_first, order=order)
                assert got == off._sweep_link(lst, ranks, levels, target, far_first)
                compared += got is not None and bool(got[0])  # something placed
            assert repr((order.ranks, order.points)) == before
    assert compared >= 4


def _solo_speedup_as_it_was(transfers, ready, solo):
    """:func:`_apply_solo_speedup` with its reloads grouped by a scan of every transfer per link."""
    if solo >= 1.0:
        return
    d2h, h2d = {}, {}
    for t in transfers:
        if t.offload_end > t.offload_start:
            d2h.setdefault(t.link, []).append((t.offload_start, t.offload_end))
        if t.reload_end > t.reload_start:
            h2d.setdefault(t.link, []).append((t.reload_start, t.reload_end))
    for dct in (d2h, h2d):
        for lst in dct.values():
            lst.sort()
    planned = [t.offload_start + solo * (t.offload_end - t.offload_start)
               if off._idle(h2d.get(t.link), t.offload_start, t.offload_end) else t.offload_end for t in transfers]
    solo_reloads = {}
    for t in transfers:
        if t.reload_end > t.reload_start and off._idle(d2h.get(t.link), t.reload_start, t.reload_end):
            t.reload_start = t.reload_end - solo * (t.reload_end - t.reload_start)
            solo_reloads.setdefault(t.link, []).append((t.reload_start, t.reload_end))
    reloads = {link: sorted((t.reload_start, t.reload_end) for t in transfers
                            if t.link == link and t.reload_end > t.reload_start) for link in h2d}
    for lst in solo_reloads.values():
        lst.sort()
    off._pack_offloads(transfers, ready, planned, reloads, solo_reloads, solo)


@settings(deadline=None, max_examples=60)
@given(
    copies=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 20), st.floats(0, 3), st.floats(0, 10),
                              st.floats(0, 3)), min_size=1, max_size=30),
    solo=st.sampled_from([0.5, 0.7, 1.0]),
)
def test_solo_speedup_groups_the_reloads_as_the_scan(copies, solo):
    """The reloads grouped per link in one pass give the same transfers as the scan per link
    (several links, zero-length copies included)."""
    def make():
        out, ready = [], []
        for k, (link, f, d_off, gap, d_rel) in enumerate(copies):
            rel_start = f + d_off + gap
            out.append(off.Transfer(link, k, 0, k, 1.0, f, f + d_off, rel_start, rel_start + d_rel,
                                    rel_start + d_rel, link))
            ready.append(f)
        return out, ready

    got, ready = make()
    off._apply_solo_speedup(got, ready, solo)
    want, ready = make()
    _solo_speedup_as_it_was(want, ready, solo)
    assert got == want


def test_dependents_from_their_pattern():
    """The postponed warm-up's dependents, from a pattern per (name, layer group), are
    :func:`timing.dependents`' for every microbatch."""
    from pipeoffload.passes.timing import dependents

    for S in (1, 2, 5):
        for name in ("F", "B", "W"):
            for s in range(S):
                for j in (0, 1, 7):
                    assert off._dependents((name, s, j), S) == dependents((name, s, j), S)


@pytest.mark.parametrize("name,p,m,kw,memory", _CASES + [("dualpipev", 4, 16, {}, None)])
@pytest.mark.parametrize("postpone", [True, False])
def test_peak_ceiling_bounds_the_plan(name, p, m, kw, memory, postpone):
    """``OffloadSession.peak_ceiling(C)``, made without the plan, is at least the plan's highest
    peak and gives its makespan change exactly, whatever was planned before, and ``host_floor``
    is at most the plan's host memory on every rank (and so is ``host_floor_within`` of the plan's
    own peaks, no smaller); None where the options are not "skip"
    with one warm-up setting."""
    sched = generate(name, p=p, m=m, **kw)
    costs = Costs(F=1.0, B=2.0, W=1.0, comm=0.05)
    tl = simulate(sched, costs, memory)
    fresh = simulate(sched, costs, memory)  # its columns kept (a session reads ``tl``'s events)
    serial = fresh.serial_peaks() is not None
    assert serial == (name != "dualpipev")  # DualPipeV's overlapped F&B pairs are not serial
    fired = []
    for ot in (0.05, 0.5):
        opts = off.OffloadOptions(offload_time=ot, on_infeasible="skip", postpone_warmup=postpone)
        session = off.OffloadSession(sched, tl, comm=costs.comm, options=opts)
        for C in range(1, sched.chunks + 1):
            got = session.peak_ceiling(C)
            res = off.OffloadSession(sched, tl, comm=costs.comm, options=opts).plan(C)
            assert got is not None and got[0] >= max(res.peak) and got[1] == res.makespan - res.makespan_no_offload
            floor = session.host_floor(C)  # the host memory the plan holds at least
            assert all(h >= f - 1e-9 * max(1.0, f) for h, f in zip(res.host_memory, floor))
            fired.append(max(floor) > 0)
            # with each rank's own peak as its room (what the plan's peaks allow at most), no draft:
            within = session.host_floor_within(C, res.peak)
            # no session, where the ranks are serial: the same floats (else it cannot say)
            assert off.serial_host_floor_within(fresh, res.peak) == (within if serial else None)
            assert all(h >= f - 1e-9 * max(1.0, f) for h, f in zip(res.host_memory, within))
            assert all(w >= f for w, f in zip(within, floor))  # a rank's peak is at most the ceiling
            assert _fields(session.plan(C)) == _fields(res)  # the ceiling's draft leaves the plan alone
    assert any(fired)  # some host floor says something
    for other in (dict(postpone_warmup=None), dict(stash=True), dict(on_infeasible="delay")):
        opts = off.OffloadOptions(offload_time=0.5, **{"on_infeasible": "skip", "postpone_warmup": True, **other})
        assert off.OffloadSession(sched, tl, comm=costs.comm, options=opts).peak_ceiling(1) is None


# --- the bounds' context (issue 24, ninth round) -------------------------------------------------


def _sweep_floors_by_events(ctx, events, chunks):
    """The floors and host ceilings as ``_sweep_floors`` made them before: each C reading the
    events again and sweeping with ``memory_sweep``."""
    from pipeoffload.ir import OpKind
    from pipeoffload.timeline import ALLOC, FREE, memory_sweep

    back = {(e.op.stage, e.op.microbatch): e.start for e in events if e.op.kind.is_backward}
    widen = 1e-6 * max(1.0, abs(ctx.base_makespan))
    out = {}
    for C in chunks:
        changes = [[] for _ in range(ctx.timeline.num_ranks)]
        held = [[] for _ in range(ctx.timeline.num_ranks)]
        for e in events:
            mem, pts = e.mem, changes[e.op.rank]
            if e.op.kind is OpKind.F and e.op.chunk < C and mem > _EPS:
                b = back[(e.op.stage, e.op.microbatch)]
                pts += [(e.start, ALLOC, mem), (e.end, FREE, -mem), (b, ALLOC, mem)]
                held[e.op.rank] += [(e.end - widen, ALLOC, mem), (b + widen, FREE, -mem)]
            elif mem > 0:
                pts.append((e.start, ALLOC, mem))
            elif mem < 0:
                pts.append((e.end, FREE, mem))
        out[C] = ([max([0.0] + [lvl for _, _, lvl in memory_sweep(pts)]) for pts in changes],
                  [max([0.0] + [lvl for _, _, lvl in memory_sweep(pts)]) for pts in held])
    return out


_FAMILIES = [("1f1b", {}), ("zb-h1", {}), ("interleaved-1f1b", {"v": 2}), ("group-interleaved", {"v": 3, "g": 3}),
             ("zb-v", {}), ("v-half", {}), ("dualpipev", {})]


@settings(deadline=None, max_examples=30)
@given(fam=st.sampled_from(_FAMILIES), p=st.integers(3, 5), extra=st.integers(0, 6),
       per_group=st.lists(st.tuples(st.floats(0.3, 3.0), st.floats(0.3, 3.0), st.floats(0.1, 2.0)),
                          min_size=15, max_size=15),
       comm=st.sampled_from([0.0, 0.05, 0.3]), whole=st.booleans())
def test_timed_sessions_and_swept_floors_are_the_checked_ones(fam, p, extra, per_group, comm, whole):
    """A session told that its timeline is the timing pass's (``timed``, as the planner's are)
    skips the re-timing check: the check passes on every such timeline (per-layer-group costs,
    with and without comm), and its bounds, ceilings, host floors and plans equal the checked
    session's; the host floor's cap is above the floor; ``_sweep_floors`` equals the sweeps made
    per C from the events, float for float."""
    name, kw = fam
    if name == "group-interleaved":
        kw = {"v": 3, "g": p}
    sched = generate(name, p=p, m=2 * p + extra, **kw)
    S = sched.num_stages
    costs = Costs(comm=comm, group_costs=per_group[:S])
    memory = MemoryDeltas(F=3.0, B=-1.0, W=-2.0) if whole else MemoryDeltas(F=1.3, B=-0.4, W=-0.9)
    tl = simulate(sched, costs, memory)
    opts = off.OffloadOptions(offload_time=0.4, on_infeasible="skip", postpone_warmup=True)
    checked = off.OffloadSession(sched, tl, comm=comm, options=opts)
    checked._ctx.check_retimable()  # the timing pass's timeline re-times to itself
    timed = off.OffloadSession(sched, tl, comm=comm, options=opts, timed=True)
    chunks = range(1, sched.chunks + 1)
    assert timed.bounds(chunks) == checked.bounds(chunks)
    for C in chunks:
        assert timed.peak_ceiling(C) == checked.peak_ceiling(C)
        assert timed.host_floor(C) == checked.host_floor(C)
        assert timed.host_floor_cap(C) >= max(timed.host_floor(C))  # the cap is above every rank's floor
    assert _fields(timed.plan(sched.chunks)) == _fields(checked.plan(sched.chunks))
    ctx = checked._ctx
    for events in (ctx.base_events, off._postponed_warmup(ctx)[0]):
        assert off._sweep_floors(ctx, events, chunks) == _sweep_floors_by_events(ctx, events, chunks)
        levels = off._rank_levels(events)
        assert off._level_tops(events, p) == [max([0.0] + [x for _, x, _ in levels.get(r, [])]) for r in range(p)]


def test_timed_sessions_do_not_retime_and_contexts_keep_the_compact_orders(monkeypatch):
    """The shortcuts fire: a timed session's bounds, ceiling and host floor never re-time the
    schedule, the host floor's levels are swept once per session, and the context reads a
    generated schedule's compact orders without making its Op lists."""
    sched = generate("group-interleaved", p=4, m=12, v=3, g=3).compute_only()
    assert sched.compact is not None
    costs = Costs(F=1.0, B=2.0, W=1.0, comm=0.05)
    tl = simulate(sched, costs, MemoryDeltas(F=3.0, B=-1.0, W=-2.0))
    retimed, swept = [], []
    real_retime, real_levels = off._retime, off._level_tops
    monkeypatch.setattr(off, "_retime", lambda *a: retimed.append(1) or real_retime(*a))
    monkeypatch.setattr(off, "_level_tops", lambda *a: swept.append(1) or real_levels(*a))
    opts = off.OffloadOptions(offload_time=0.4, on_infeasible="skip", postpone_warmup=True)
    session = off.OffloadSession(sched, tl, comm=costs.comm, options=opts, timed=True)
    assert sched.compact is not None  # no Op lists made for the context
    session.bounds(range(1, 4))
    floors = [session.host_floor(C) for C in range(1, 4)]
    assert not retimed and len(swept) == 1 and any(max(f) > 0 for f in floors)
    off.OffloadSession(sched, tl, comm=costs.comm, options=opts).bounds([1])
    assert retimed  # the untimed session checks

@settings(deadline=None, max_examples=80)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30), st.integers(1, 4), st.integers(0, 40)),
             min_size=1, max_size=60),
    st.sampled_from([1.0, 0.5, 0.3]),
)
def test_merged_busy_blocks_give_the_same_slots(copies, unit):
    """:func:`_slots_around` with the busy lists kept as blocks (:func:`_book_merged`) books
    the same copies as with every interval kept, whatever the order of the requests, and the
    blocks are fewer once copies touch (the shortcut fires)."""
    up, down, mup, mdown = [], [], [], []
    for f, life, d, at in copies:
        c = off._Candidate(0, 0, 0, 0, 1.0, f * unit, (f + life) * unit, d * unit, 0, "activation")
        t = (f + min(at, life)) * unit  # a point at or after the producer's end
        assert off._slots_around(c, t, mup, mdown, True) == off._slots_around(c, t, up, down)
    for lst, blocks in ((up, mup), (down, mdown)):
        assert [b for _, b in blocks] == sorted(b for _, b in blocks)
        covered = sum(b - a for a, b in lst)
        assert sum(b - a for a, b in blocks) == pytest.approx(covered)  # the same busy time


def test_merged_busy_blocks_fire():
    """Copies booked back to back make one block; a copy shorter than 2ε disables merging."""
    busy = []
    for iv in ((2.0, 3.0), (0.0, 1.0), (1.0, 2.0), (5.0, 6.0)):
        off._book_merged(busy, iv)
    assert busy == [(0.0, 3.0), (5.0, 6.0)]
    c = off._Candidate(0, 0, 0, 0, 1.0, 0.0, 9.0, 1.0, 0, "activation")
    tiny = off._Candidate(0, 0, 0, 1, 1.0, 0.0, 9.0, 1.5e-9, 0, "activation")
    levels = {0: [(0.0, 1.0, True)]}
    assert off._TryOrder([c], [0], levels, False).merged
    assert not off._TryOrder([c, tiny], [0], levels, False).merged


@settings(deadline=None, max_examples=60)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.sampled_from([0, 1]), st.integers(-50, 50)), max_size=40),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(-20, 40)), max_size=12),
    st.sampled_from([1.0, 2.0 ** 40, 0.5]),
)
def test_plan_peaks_by_runs_equal_the_merged_sum(compute, copies, scale):
    """Where every change is a whole number (:func:`_whole_sums`), :func:`_plan_peaks` takes each
    run of compute levels between two transfer changes at once (:func:`_merged_top`): the same
    peaks as the running sum over the merged changes; with fractional amounts the running sum."""
    fig = object.__new__(off._ComputeFigures)
    changes = sorted(((t * 0.5, o, d * scale) for t, o, d in compute), key=off._TIME_ORDER)
    fig.changes = [changes, []]
    fig.keys = [[(t, o) for t, o, _ in changes], []]
    fig.levels = [list(off.accumulate(d for _, _, d in changes)), []]
    whole = all(float(d).is_integer() for _, _, d in changes)
    fig.magnitude = sum(abs(d) for _, _, d in changes) if whole else None
    transfers = [off.Transfer(rank, 0, 0, j, a * scale, s * 0.5, (s + 1) * 0.5, (s + 1 + life) * 0.5,
                              (s + 2 + life) * 0.5, 0.0, 0) for j, (s, life, a) in enumerate(copies) for rank in (0, 1)]
    fast = off._plan_peaks(fig, transfers)
    fig.magnitude = None  # the running sum over the merged changes
    assert fast == off._plan_peaks(fig, transfers)
    if scale != 0.5:
        assert off._whole_sums(_with_magnitude(fig), transfers)  # the shortcut is what was compared


def _with_magnitude(fig):
    fig.magnitude = sum(abs(d) for ch in fig.changes for _, _, d in ch)
    return fig


@pytest.mark.parametrize("name", [n for n in __import__("pipeoffload.schedules", fromlist=["names"]).names()
                                  if n not in ("dualpipev",)])
@given(p=st.integers(2, 5), extra=st.integers(0, 6), F=st.sampled_from([1.0, 1.3]), B=st.sampled_from([1.0, 2.2]),
       W=st.sampled_from([0.7, 1.0]), room=st.floats(0.0, 8.0))
@settings(max_examples=8, deadline=None)
def test_serial_floors_are_the_sessions(name, p, extra, F, B, W, room):
    """``serial_host_floor_within`` (no session) is ``OffloadSession.host_floor_within``, warm-ups
    postponed or not, float for float, and ``serial_floors`` the device floors of
    ``OffloadSession.bounds`` without postponed warm-ups (with them, at most those: a lower
    bound), on the timing pass's serial timelines of every family whose ranks run one op at a time."""
    m = 2 * p + extra
    sched = generate(name, p=p, m=m)
    costs = Costs(F=F, B=B, W=W, comm=0.05)
    memory = MemoryDeltas(F=1.3, B=-0.4, W=-0.9)
    rooms = [room + 0.5 * r for r in range(p)]
    fresh = simulate(sched, costs, memory)
    got = off.serial_host_floor_within(fresh, rooms)
    assert got is not None
    for postpone in (True, False):
        opts = off.OffloadOptions(offload_time=0.5, on_infeasible="skip", postpone_warmup=postpone)
        session = off.OffloadSession(sched, simulate(sched, costs, memory), comm=costs.comm, options=opts)
        assert session.host_floor_within(1, rooms) == got
        every = range(1, sched.chunks + 1)
        lows, floors = off.serial_floors(fresh, every), session.bounds(every)
        if postpone:  # a postponed forward's end may pass the next start by a rounding: only higher
            assert all(lo <= f * (1 + 1e-12) + 1e-12 for C in every for lo, f in zip(lows[C], floors[C][0]))
        else:
            assert lows == {C: floor for C, (floor, _) in floors.items()}
