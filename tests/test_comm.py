"""The communication pass (pure): sends/receives inserted where the runtime needs
them, and deadlock freedom proven by simulation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.errors import ScheduleError
from pipeoffload.ir import Op, OpKind, Placement, build_schedule
from pipeoffload.passes.comm import (
    check_deadlock_free,
    comm_volume,
    incoming_order,
    insert_comm,
    message_key,
    message_tag,
    send_retirements,
)
from pipeoffload.passes.timing import dependencies, overlapped_positions, run_list_schedule, simulate
from pipeoffload.schedules import SCHEDULES, generate

from helpers import assert_imports_no_torch

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW
SEND = (OpKind.SEND_F, OpKind.SEND_B)
RECV = (OpKind.RECV_F, OpKind.RECV_B)


#: The schedules on a V placement (rank i holds layer groups i and 2p−1−i).
V_SCHEDULES = [name for name, info in SCHEDULES.items() if info.placement == "v"]


def _next_compute(lst, i, step, kinds, pairs, r):
    """The compute ops of the unit (one op, or an overlapped pair run as one) found by
    walking from ``i`` over ``kinds`` (sends or receives) in direction ``step``."""
    while lst[i].kind in kinds:
        i += step
    first = min(i, i + step)
    return lst[first:first + 2] if (r, first) in pairs else [lst[i]]


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8)], ids=["p2", "p3", "p4"])
def test_sends_follow_producers_and_receives_precede_consumers(schedule_name, p, m):
    sched = generate(schedule_name, p=p, m=m)
    prog = insert_comm(sched)
    pl = sched.placement
    S = pl.num_stages
    pairs = overlapped_positions(prog, prog.ranks)
    assert prog.compute_only().ranks == sched.ranks  # compute order unchanged
    for r, lst in enumerate(prog.ranks):
        for i, op in enumerate(lst):
            assert op.rank == r
            if op.kind in SEND:
                prods = _next_compute(lst, i - 1, -1, SEND, pairs, r)
                assert any(c.kind.is_compute and (c.stage, c.microbatch) == (op.stage, op.microbatch) for c in prods)
                nxt = op.stage + 1 if op.kind is OpKind.SEND_F else op.stage - 1
                assert op.peer == pl.rank_of(nxt) != r
            elif op.kind in RECV:
                cons = _next_compute(lst, i + 1, 1, RECV, pairs, r)
                assert any(c.kind.is_compute and (c.stage, c.microbatch) == (op.stage, op.microbatch) for c in cons)
                prev = op.stage - 1 if op.kind is OpKind.RECV_F else op.stage + 1
                assert op.peer == pl.rank_of(prev) != r
            elif op.kind.is_compute:
                # every cross-rank dependency is received right before the op (or its pair)
                first = i - 1 if (r, i - 1) in pairs else i
                got = set()
                k = first - 1
                while k >= 0 and lst[k].kind in RECV:
                    got.add(message_key(lst[k]))
                    k -= 1
                for dk in dependencies(op, S):
                    if pl.rank_of(dk[1]) != r:
                        assert (dk[0], dk[1], dk[2]) in got, (op, dk)
    sends = [message_key(o) for o in prog.ops() if o.kind in SEND]
    recvs = [message_key(o) for o in prog.ops() if o.kind in RECV]
    assert sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)
    tags = {message_tag(k, S, m) for k in sends}
    assert len(tags) == len(sends)
    # cross-rank boundaries × microbatches × 2 directions
    cross = sum(1 for s in range(S - 1) if pl.rank_of(s) != pl.rank_of(s + 1))
    assert comm_volume(prog) == {"F": cross * m, "B": cross * m}


def test_the_registry_has_v_schedules():
    assert V_SCHEDULES  # test_v_turn_is_a_local_hand_off is not vacuous


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_v_turn_is_a_local_hand_off(name):
    sched = generate(name, p=4, m=8)
    assert sched.placement.kind == "v"
    prog = insert_comm(sched)
    last = prog.ranks[3]
    assert not any(o.kind in SEND + RECV and o.stage in (3, 4) and o.peer == 3 for o in prog.ops())
    # rank 3 holds groups 3 and 4: F(3)→F(4) and B(4)→B(3) need no message
    assert all(not (o.kind is OpKind.SEND_F and o.stage == 3) for o in last)
    assert comm_volume(prog)["F"] == 6 * 8  # 2(p-1) boundaries: twice 1F1B's volume


def test_timing_is_unchanged_by_comm_ops():
    s = generate("1f1b", p=4, m=8)
    a = simulate(s).summary()
    b = simulate(insert_comm(s)).summary()
    assert a == b


def test_incoming_order_is_the_senders_order():
    s = generate("interleaved-1f1b", p=2, m=4)
    prog = insert_comm(s)
    for r in range(2):
        for peer, msgs in incoming_order(prog, r).items():
            assert msgs == [message_key(o) for o in prog.ranks[peer] if o.kind in SEND and o.peer == r]


def test_deadlock_is_reported_with_rank_op_and_peer():
    # Both ranks of a 2-stage pipeline wait on each other's backward.
    pl = Placement.loop(2, 1)
    s = build_schedule("bad", 2, pl, [
        [(F, 0, 0), (F, 0, 1), (BW, 0, 1), (BW, 0, 0)],
        [(F, 1, 0), (BW, 1, 0), (F, 1, 1), (BW, 1, 1)],
    ])
    prog = insert_comm(s)  # fine: rank 1's BW(1,1) comes after its own F(1,1)
    check_deadlock_free(prog)
    s2 = build_schedule("bad", 2, pl, [
        [(F, 0, 0), (BW, 0, 0), (F, 0, 1), (BW, 0, 1)],
        [(F, 1, 1), (BW, 1, 1), (F, 1, 0), (BW, 1, 0)],
    ])
    with pytest.raises(ScheduleError) as e:
        insert_comm(s2)
    msg = str(e.value)
    assert "rank 0 waits at RECV_B(stage=0, mb=0, rank=0, peer=1)" in msg
    assert "rank 1 waits at RECV_F(stage=1, mb=1, rank=1, peer=0)" in msg


def test_malformed_programs_are_rejected():
    s = generate("1f1b", p=2, m=2)
    prog = insert_comm(s)
    # drop a receive: its send has no partner
    r1 = [o for o in prog.ranks[1] if not (o.kind is OpKind.RECV_F and o.microbatch == 1)]
    with pytest.raises(ScheduleError, match="no matching receive"):
        check_deadlock_free(prog.with_ranks([prog.ranks[0], r1]))
    # a send before its producer
    r0 = list(prog.ranks[0])
    i = next(i for i, o in enumerate(r0) if o.kind is OpKind.SEND_F)
    r0[i - 1], r0[i] = r0[i], r0[i - 1]
    with pytest.raises(ScheduleError, match="has not computed"):
        check_deadlock_free(prog.with_ranks([r0, prog.ranks[1]]))
    # a consumer before its receive
    r1 = list(prog.ranks[1])
    i = next(i for i, o in enumerate(r1) if o.kind is OpKind.RECV_F)
    r1[i], r1[i + 1] = r1[i + 1], r1[i]
    with pytest.raises(ScheduleError, match="inputs precede their consumer"):
        check_deadlock_free(prog.with_ranks([prog.ranks[0], r1]))


def test_existing_comm_and_offload_ops_are_handled():
    s = generate("1f1b", p=2, m=2)
    prog = insert_comm(s)
    assert insert_comm(prog).ranks == prog.ranks  # idempotent
    r0 = list(s.ranks[0])
    off = [Op(OpKind.OFFLOAD_START, 0, 0, 0, 0), Op(OpKind.OFFLOAD_END, 0, 0, 0, 0)]
    r0 = r0[:1] + off + r0[1:]
    prog2 = insert_comm(s.with_ranks([r0, s.ranks[1]]))
    kinds = [o.kind for o in prog2.ranks[0]][:4]
    assert kinds == [OpKind.F, OpKind.SEND_F, OpKind.OFFLOAD_START, OpKind.OFFLOAD_END]


def _random_schedule(rng: random.Random, p: int, v: int, m: int, split: bool):
    """Random per-rank orders that respect only the *local* dependencies."""
    pl = Placement.loop(p, v)
    S = p * v
    per_rank = []
    for r in range(p):
        todo = []
        for s in pl.stages_of(r):
            for j in range(m):
                todo += [(F, s, j)] + ([(B, s, j), (W, s, j)] if split else [(BW, s, j)])
        done, order = set(), []
        while todo:
            ready = []
            for t in todo:
                k, s, j = t
                op = Op(k, s, j, r, pl.chunk_of(s))
                deps = [d for d in dependencies(op, S) if pl.rank_of(d[1]) == r]
                if all(d in done for d in deps):
                    ready.append(t)
            t = rng.choice(ready)
            todo.remove(t)
            order.append(t)
            done.add(("F" if t[0] is F else "W" if t[0] is W else "B", t[1], t[2]))
        per_rank.append(order)
    return build_schedule("random", m, pl, per_rank)


@settings(deadline=None)
@given(seed=st.integers(0, 10**6), p=st.integers(2, 4), v=st.integers(1, 2), m=st.integers(1, 4),
       split=st.booleans())
def test_comm_pass_agrees_with_the_timing_pass_on_deadlocks(seed, p, v, m, split):
    """Sends never block, so the program deadlocks exactly when the compute-only
    schedule does: the comm pass and the timing pass must agree."""
    s = _random_schedule(random.Random(seed), p, v, m, split)
    try:
        run_list_schedule(s, lambda o: 1.0, 0.0)
        timing_ok = True
    except ScheduleError:
        timing_ok = False
    try:
        insert_comm(s)
        comm_ok = True
    except ScheduleError as e:
        comm_ok = False
        assert "deadlock" in str(e) and "waits at RECV_" in str(e)
    assert comm_ok == timing_ok


def test_pass_is_pure():
    assert_imports_no_torch("pipeoffload.passes.comm", "pipeoffload.training.config")


def _retirements_brute_force(program, rank):
    """``send_retirements`` by its definition, quadratically: X (rank → q) retires with
    the first Y (q → rank) that rank receives among those whose producer on q runs after
    q's receive op of X."""
    lst = program.ranks[rank]
    out = {}
    for i, op in enumerate(lst):
        if op.kind not in SEND:
            continue
        x, q = message_key(op), op.peer
        theirs = program.ranks[q]
        k = next(n for n, o in enumerate(theirs) if o.kind in RECV and message_key(o) == x)
        best = None
        for n, o in enumerate(theirs):
            if o.kind not in SEND or o.peer != rank:
                continue
            producer = max(j for j in range(n) if theirs[j].kind.is_compute)
            if producer <= k:
                continue
            y = message_key(o)
            at = next(j for j, r in enumerate(lst) if r.kind in RECV and message_key(r) == y)
            if best is None or at < best[0]:
                best = (at, y)
        if best is not None:
            out.setdefault(best[1], []).append(x)
    return {y: tuple(xs) for y, xs in out.items()}


@settings(deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(2, 4), extra=st.integers(0, 6))
def test_send_retirements_match_their_definition(name, p, extra):
    """Every registry schedule: the sends freed early are exactly those whose receiver
    had them before it produced a message this rank then receives (the runtime frees
    their buffers there; a wrong entry would wait early, a missing one holds memory)."""
    least = {"dualpipev": 2 * p, "interleaved-1f1b": p}.get(name, 1)  # what each family takes
    program = insert_comm(generate(name, p=p, m=least + extra))
    for r in range(p):
        assert send_retirements(program, r) == _retirements_brute_force(program, r)


def test_send_retirements_free_one_f_one_b_sends_as_gradients_return():
    """1F1B, p = 2: rank 0's forward send of microbatch j is known received when the
    gradient of microbatch j comes back; rank 1's gradient sends once a later forward
    arrives; GPipe's forwards all with the first gradient."""
    one = insert_comm(generate("1f1b", p=2, m=4))
    assert send_retirements(one, 0) == {("B", 1, j): (("F", 0, j),) for j in range(4)}
    assert send_retirements(one, 1) == {("F", 0, 2): (("B", 1, 0),), ("F", 0, 3): (("B", 1, 1),)}
    gpipe = insert_comm(generate("gpipe", p=2, m=4))
    assert send_retirements(gpipe, 0) == {("B", 1, 0): tuple(("F", 0, j) for j in range(4))}
    assert send_retirements(gpipe, 1) == {}
