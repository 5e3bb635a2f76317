"""Validation's fused pass (rules 1 and 3 in one pass over the ops) and the compact
deadlock proof give exactly the verdicts of the paths they replace, on randomly
broken schedules."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload import native
from pipeoffload.errors import ScheduleError
from pipeoffload.ir import OpKind, Schedule, build_schedule
from pipeoffload.passes import validate as V
from pipeoffload.passes import timing
from pipeoffload.passes.timing import (KIND_CODE, _code_dependencies, _compact_addresses, _proved_compact,
                                       prove_deadlock_free, run_list_schedule, simulate)
from pipeoffload.schedules import generate


def _old_shape(schedule: Schedule) -> list[bytearray]:
    """Rule 1 before the fusion (validate._check_shape without rule 3)."""
    pl = schedule.placement
    S, m = pl.num_stages, schedule.num_microbatches
    counts = [bytearray(S * m) for _ in range(4)]
    for r, lst in enumerate(schedule.ranks):
        for i, op in enumerate(lst):
            k = V._KIND_INDEX.get(op.kind)
            if k is None:
                continue
            stage, j, bad = op.stage, op.microbatch, None
            if not 0 <= stage < S:
                bad = f"stage out of range 0..{S - 1} (rule: placement consistent)"
            elif not 0 <= j < m:
                bad = f"microbatch out of range 0..{m - 1}"
            elif op.rank != r or pl.stage_to_rank[stage] != r:
                bad = (f"layer group {stage} is placed on rank {pl.stage_to_rank[stage]}, "
                       f"not rank {r} (rule: placement consistent)")
            elif op.chunk != pl._chunk_of[stage]:
                bad = (f"chunk {op.chunk} but layer group {stage} is chunk "
                       f"{pl._chunk_of[stage]} of rank {r} (rule: placement consistent)")
            else:
                idx = stage * m + j
                if counts[k][idx]:
                    bad = "duplicate op (rule: each op runs exactly once)"
                else:
                    counts[k][idx] = 1
                    if k == V._BW and (counts[V._B][idx] or counts[V._W][idx]):
                        bad = "BW together with B/W for the same layer group and microbatch"
                    elif k in (V._B, V._W) and counts[V._BW][idx]:
                        bad = "B/W together with BW for the same layer group and microbatch"
            if bad:
                raise ScheduleError(f"rank {r}, position {i}: {op}: {bad}")
    return counts


def _old_local_order(schedule: Schedule) -> None:
    """Rule 3 before the fusion: its own pass."""
    pl = schedule.placement
    S = pl.num_stages
    done = set()
    for r, lst in enumerate(schedule.ranks):
        for i, op in enumerate(lst):
            code = KIND_CODE.get(op.kind)
            if code is None:
                continue
            for dc, ds in _code_dependencies(code, op.stage, S):
                if pl.stage_to_rank[ds] == pl.stage_to_rank[op.stage] and (dc, ds, op.microbatch) not in done:
                    raise ScheduleError(f"rank {r}, position {i}: {op} comes before its same-rank dependency "
                                        f"{'FBW'[dc]}(stage={ds}, mb={op.microbatch}) (rule: local order)")
            done.add((code, op.stage, op.microbatch))


def _old_validate(schedule: Schedule) -> None:
    counts = _old_shape(schedule)
    V._check_complete(schedule, counts)
    _old_local_order(schedule)
    V._check_overlap(schedule)
    run_list_schedule(schedule, lambda o: 1.0, 0.0)  # the deadlock proof as a full timing


def _verdict(f, schedule: Schedule) -> str:
    try:
        f(schedule)
    except ScheduleError as e:
        return str(e)
    return "valid"


@st.composite
def broken(draw) -> Schedule:
    """A generated schedule with up to three random edits: ops swapped, moved to another
    rank or position, dropped, duplicated, or given another microbatch or chunk."""
    name = draw(st.sampled_from(["1f1b", "zb-v", "zb-h1", "v-half", "interleaved-1f1b", "gpipe"]))
    p = draw(st.integers(1, 4))
    m = draw(st.integers(1, 6)) * (p if name == "interleaved-1f1b" else 1)
    sched = generate(name, p, m, **({"v": 2} if name == "interleaved-1f1b" else {}))
    ranks = [list(lst) for lst in sched.ranks]
    for _ in range(draw(st.integers(0, 3))):
        r = draw(st.integers(0, p - 1))
        if not ranks[r]:
            continue
        i, j = draw(st.integers(0, len(ranks[r]) - 1)), draw(st.integers(0, len(ranks[r]) - 1))
        edit = draw(st.sampled_from(["swap", "move", "drop", "dup", "mb", "chunk", "rank"]))
        op = ranks[r][i]
        if edit == "swap":
            ranks[r][i], ranks[r][j] = ranks[r][j], ranks[r][i]
        elif edit == "move":
            ranks[r].insert(j, ranks[r].pop(i))
        elif edit == "drop":
            ranks[r].pop(i)
        elif edit == "dup":
            ranks[draw(st.integers(0, p - 1))].insert(j, op)
        elif edit == "mb":
            ranks[r][i] = dataclasses.replace(op, microbatch=draw(st.integers(0, m)))
        elif edit == "chunk":
            ranks[r][i] = dataclasses.replace(op, chunk=op.chunk + 1)
        else:
            ranks[r][i] = dataclasses.replace(op, rank=draw(st.integers(0, p - 1)))
    return sched.with_ranks(ranks)


@settings(max_examples=300, deadline=None)
@given(sched=broken())
def test_validate_gives_the_old_verdict(sched: Schedule) -> None:
    assert _verdict(V.validate, sched) == _verdict(_old_validate, sched)


@settings(max_examples=200, deadline=None)
@given(sched=broken())
def test_compact_proof_is_the_timing_proof(sched: Schedule) -> None:
    """Where the compact proof applies, it proves exactly what timing the schedule does."""
    addr = _compact_addresses(sched)
    if addr is not None and _verdict(V._check_shape, sched) == "valid":
        timed = _verdict(lambda s: run_list_schedule(s, lambda o: 1.0, 0.0), sched)
        assert _proved_compact(sched, *addr) == (timed == "valid")
        saved = native._engine
        native._engine = None  # the Python loop proves the same (the C one ran above, where built)
        try:
            assert _proved_compact(sched, *addr) == (timed == "valid")
        finally:
            native._engine = saved
        assert _verdict(prove_deadlock_free, sched) == timed


def test_edits_reach_every_rule() -> None:
    """Edits like the strategy's break each rule (the comparison is not vacuous)."""
    sched = generate("1f1b", 2, 2)
    r0, r1 = list(sched.ranks[0]), list(sched.ranks[1])
    assert r1[0].kind is OpKind.F and r1[1].kind is OpKind.BW
    verdicts = [_verdict(V.validate, sched.with_ranks(ranks)) for ranks in (
        [r0, [r1[1], r1[0]] + r1[2:]],                                   # BW before its F
        [[dataclasses.replace(r0[0], chunk=1)] + r0[1:], r1],            # wrong chunk
        [r0[1:], r1],                                                    # an F dropped
        [r0[:1] + [r0[2], r0[1]] + r0[3:], [r1[2], r1[0], r1[1], r1[3]]])]                         # rank 0 waits for itself via rank 1
    assert ["local order" in verdicts[0], "placement consistent" in verdicts[1], "missing" in verdicts[2],
            "deadlock" in verdicts[3]] == [True] * 4, verdicts
    assert verdicts == [_verdict(_old_validate, sched.with_ranks(ranks)) for ranks in (
        [r0, [r1[1], r1[0]] + r1[2:]], [[dataclasses.replace(r0[0], chunk=1)] + r0[1:], r1], [r0[1:], r1],
        [r0[:1] + [r0[2], r0[1]] + r0[3:], [r1[2], r1[0], r1[1], r1[3]]])]


@settings(max_examples=300, deadline=None)
@given(sched=broken())
def test_compact_schedule_gives_the_old_verdict(sched: Schedule) -> None:
    """The same broken orders built as compact arrays (build_schedule: each op's rank
    and chunk are its layer group's) are judged by their arrays as the Op lists are."""
    triples = [[(o.kind, o.stage, o.microbatch) for o in lst] for lst in sched.ranks]
    compact = build_schedule(sched.name, sched.num_microbatches, sched.placement, triples)
    assert compact.compact is not None
    ops = build_schedule(sched.name, sched.num_microbatches, sched.placement, triples)
    expected = _verdict(_old_validate, ops.with_ranks(ops.ranks))
    assert _verdict(V.validate, compact) == expected
    if expected == "valid":
        assert compact.compact is not None  # judged without making the Op lists
        assert simulate(compact).summary() == simulate(ops.with_ranks(ops.ranks)).summary()


@settings(max_examples=200, deadline=None)
@given(sched=broken())
def test_shape_tables_in_c_are_the_python_ones(sched: Schedule) -> None:
    """Rule 1 and no op twice over compact orders: the C tables are the Python loop's, and where
    the C loop refuses an op the Python loop names the same error as without C."""
    from pipeoffload.ir import CompactOrders

    compact = CompactOrders.from_triples(sched.placement, [[(o.kind, o.stage, o.microbatch) for o in r]
                                                          for r in sched.ranks])
    if compact is None:
        return
    out = []
    saved = native._engine
    for engine in (None, saved):
        native._engine = engine
        try:
            out.append(("ok", V._check_shape_compact(sched, compact)))
        except ScheduleError as err:
            out.append(("error", str(err)))
        finally:
            native._engine = saved
    assert out[1] == out[0]


def test_shape_tables_name_a_split_and_fused_backward_alike() -> None:
    """A B/W split op that is also run fused (BW): the C loop refuses it and the error is the
    Python loop's."""
    from pipeoffload.ir import CompactOrders

    sched = generate("zb-h1", p=3, m=4)
    ranks = [list(r) for r in sched.ranks]
    i = next(i for i, o in enumerate(ranks[1]) if o.kind is OpKind.W)
    ranks[1].insert(i, dataclasses.replace(ranks[1][i], kind=OpKind.BW))
    bad = sched.with_ranks(ranks)
    compact = CompactOrders.from_triples(bad.placement, [[(o.kind, o.stage, o.microbatch) for o in r]
                                                        for r in bad.ranks])
    saved, msgs = native._engine, []
    for engine in (None, saved):
        native._engine = engine
        try:
            V._check_shape_compact(bad, compact)
        except ScheduleError as err:
            msgs.append(str(err))
        finally:
            native._engine = saved
    assert len(msgs) == 2 and msgs[0] == msgs[1] and "BW" in msgs[0]
