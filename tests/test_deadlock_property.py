"""Deadlock freedom is checked before any run.

Property: for every schedule in the registry, with random p, m, v, g, op costs and
offload settings (the offload pass in "skip" or "delay" mode, optionally postponed
warm-up), the send/receive order the comm pass inserts into the *offloaded* schedule
runs to completion. "Runs" is judged here by an interpreter written independently of
``passes.comm``: the runtime's semantics (an isend never blocks, a receive blocks until
its message was sent), every compute op's inputs present on its rank when it starts,
each message sent and received exactly once between the right ranks, and every
offloaded activation back (RELOAD_END) before its backward.

And the runtime refuses a program that deadlocks: ``PipelineRunner`` raises
ScheduleError before any communication (here: with no process group at all; and in a
real two-process world, well before any receive could time out).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError, ScheduleError
from pipeoffload.ir import Op, OpKind, Placement, Schedule, build_schedule
from pipeoffload.passes.comm import insert_comm
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import SCHEDULES, generate

from helpers import import_torch

K = OpKind
#: Schedules that take any v (the others have a fixed chunk count).
ANY_V = {"gpipe", "interleaved-1f1b", "group-interleaved"}


# ----------------------------------------------------------------- the interpreter
class Stuck(AssertionError):
    pass


def interpret(prog: Schedule) -> int:
    """Run ``prog`` under the runtime's semantics; return the number of messages.
    Raises AssertionError on any rule broken, Stuck if it cannot complete."""
    pl, S, p = prog.placement, prog.num_stages, prog.num_ranks
    lists = prog.ranks
    ptr = [0] * p
    sent: dict[tuple, int] = {}  # message -> receiving rank
    received: set[tuple] = set()
    have = [set() for _ in range(p)]  # ("F"|"B", producing stage, mb) usable on this rank
    done = [set() for _ in range(p)]  # ("F"|"B"|"W", stage, mb) computed on this rank
    transfers: dict[tuple, list] = {}  # (rank, stage, mb) -> transfer kinds seen, in order

    def step(r: int) -> bool:
        op = lists[r][ptr[r]]
        k, s, j = op.kind, op.stage, op.microbatch
        assert op.rank == r and pl.rank_of(s) == r, f"{op} is on the wrong rank"
        if k in (K.RECV_F, K.RECV_B):
            msg = ("F", s - 1, j) if k is K.RECV_F else ("B", s + 1, j)
            if msg not in sent:
                return False  # blocks until its send was issued
            assert sent[msg] == r, f"{op}: message {msg} was sent to rank {sent[msg]}"
            assert msg not in received, f"{op}: message {msg} received twice"
            assert op.peer == pl.rank_of(msg[1]), f"{op}: wrong peer"
            received.add(msg)
            have[r].add(msg)
        elif k in (K.SEND_F, K.SEND_B):
            d = "F" if k is K.SEND_F else "B"
            assert (d, s, j) in done[r], f"{op} sends a result not computed yet"
            dst_stage = s + 1 if d == "F" else s - 1
            assert 0 <= dst_stage < S and op.peer == pl.rank_of(dst_stage) != r, f"{op}: bad destination"
            assert (d, s, j) not in sent, f"{op}: message sent twice"
            sent[(d, s, j)] = op.peer
        elif k is K.F:
            if s > 0:
                assert ("F", s - 1, j) in have[r], f"{op} runs before its input arrived"
            done[r].add(("F", s, j))
            if s + 1 < S and pl.rank_of(s + 1) == r:
                have[r].add(("F", s, j))  # the V turn: local hand-off
        elif k in (K.B, K.BW):
            assert ("F", s, j) in done[r], f"{op} before its forward"
            if s + 1 < S:
                assert ("B", s + 1, j) in have[r], f"{op} runs before its output gradient arrived"
            seen = transfers.get((r, s, j))
            if seen:
                assert seen[-1] is K.RELOAD_END, f"{op} runs while its activations are not back ({seen})"
            done[r].add(("B", s, j))
            if k is K.BW:
                done[r].add(("W", s, j))
            if s > 0 and pl.rank_of(s - 1) == r:
                have[r].add(("B", s, j))
        elif k is K.W:
            assert ("B", s, j) in done[r], f"{op} before its B"
            done[r].add(("W", s, j))
        else:  # offload / reload, in their one legal order, after the forward
            seq = transfers.setdefault((r, s, j), [])
            want = [K.OFFLOAD_START, K.OFFLOAD_END, K.RELOAD_START, K.RELOAD_END]
            assert len(seq) < 4 and want[len(seq)] is k, f"{op} out of order after {seq}"
            assert ("F", s, j) in done[r], f"{op} before its forward"
            seq.append(k)
        ptr[r] += 1
        return True

    progress = True
    while progress:
        progress = False
        for r in range(p):
            while ptr[r] < len(lists[r]) and step(r):
                progress = True
    stuck = [f"rank {r} at {lists[r][ptr[r]]}" for r in range(p) if ptr[r] < len(lists[r])]
    if stuck:
        raise Stuck("; ".join(stuck))
    assert set(sent) == received, "messages sent but never received"
    m = prog.num_microbatches
    for r in range(p):
        for s in pl.stages_of(r):
            for j in range(m):
                assert {("F", s, j), ("B", s, j), ("W", s, j)} <= done[r], f"rank {r} missed stage {s} mb {j}"
    for key, seq in transfers.items():
        assert len(seq) == 4, f"{key}: incomplete transfer {seq}"
    return len(sent)


def _compute_order(s: Schedule) -> list[list[tuple]]:
    return [[(o.kind, o.stage, o.microbatch) for o in lst if not o.kind.is_comm] for lst in s.ranks]


# ----------------------------------------------------------------- the property
@st.composite
def setups(draw, name: str):
    info = SCHEDULES[name]
    p = draw(st.integers(1, 6))
    v = draw(st.integers(1, 4)) if name in ANY_V else info.default_v
    m = draw(st.integers(1, 3 * p + 2))
    g = draw(st.integers(-(-p // 2), p)) if name == "group-interleaved" else None
    mem_limit = draw(st.sampled_from([None, float(p), 2.0 * p])) if name == "zb-auto" else None
    cost = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])
    costs = Costs(F=draw(cost), B=draw(cost), W=draw(cost), comm=draw(st.sampled_from([0.0, 0.1, 0.5])))
    offload = {
        "offload_chunks": draw(st.integers(0, v)),
        "offload_time": draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0])),
        "link_group": draw(st.integers(1, 3)),
        "on_infeasible": draw(st.sampled_from(["skip", "skip", "delay"])),
        "postpone_warmup": draw(st.booleans()),
    }
    return p, m, v, g, mem_limit, costs, offload


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_every_registry_schedule_with_offload_has_a_deadlock_free_program(schedule_name, data):
    p, m, v, g, mem_limit, costs, offload = data.draw(setups(schedule_name))
    try:
        sched = generate(schedule_name, p=p, m=m, v=v, g=g, mem_limit=mem_limit, costs=costs, memory=MemoryDeltas())
    except ParameterError:
        assume(False)  # outside this schedule's range (e.g. m too small for interleaving)
    tl = simulate(sched, costs, MemoryDeltas())
    off = plan_offload(sched, tl, comm=costs.comm, **offload)
    prog = insert_comm(off.schedule)  # raises ScheduleError if its own check finds a deadlock
    messages = interpret(prog)
    # The pass only adds sends/receives: compute and transfer order are untouched.
    assert _compute_order(prog) == _compute_order(off.schedule)
    # One message per cross-rank boundary crossing, each direction, each microbatch.
    crossings = sum(1 for s in range(sched.num_stages - 1)
                    if sched.placement.rank_of(s) != sched.placement.rank_of(s + 1))
    assert messages == 2 * crossings * m


def test_the_interpreter_detects_what_it_should():
    """The checker is not vacuous: a deadlock, a consumer before its receive, and a
    backward before its reload are all caught."""
    prog = insert_comm(generate("1f1b", p=2, m=2))
    r1 = list(prog.ranks[1])
    i = next(i for i, o in enumerate(r1) if o.kind is K.RECV_F)
    r1[i], r1[i + 1] = r1[i + 1], r1[i]  # F before its RECV_F
    with pytest.raises(AssertionError, match="before its input arrived"):
        interpret(prog.with_ranks([prog.ranks[0], r1]))
    # Both ranks wait on each other (comm ops inserted by hand, not by the pass).
    s2 = build_schedule("bad", 2, Placement.loop(2, 1), [
        [(K.F, 0, 0), (K.BW, 0, 0), (K.F, 0, 1), (K.BW, 0, 1)],
        [(K.F, 1, 1), (K.BW, 1, 1), (K.F, 1, 0), (K.BW, 1, 0)],
    ])
    pl = s2.placement

    def comm(r, lst):
        out = []
        for k, s, j in lst:
            op = Op(k, s, j, r, pl.chunk_of(s))
            if k is K.F and s == 1:
                out.append(Op(K.RECV_F, 1, j, 1, 0, 0))
            if k is K.BW and s == 0:
                out.append(Op(K.RECV_B, 0, j, 0, 0, 1))
            out.append(op)
            if k is K.F and s == 0:
                out.append(Op(K.SEND_F, 0, j, 0, 0, 1))
            if k is K.BW and s == 1:
                out.append(Op(K.SEND_B, 1, j, 1, 0, 0))
        return out

    bad = s2.with_ranks([comm(0, [(o.kind, o.stage, o.microbatch) for o in s2.ranks[0]]),
                         comm(1, [(o.kind, o.stage, o.microbatch) for o in s2.ranks[1]])])
    with pytest.raises(Stuck, match="rank 0 at RECV_B"):
        interpret(bad)
    with pytest.raises(ScheduleError, match="deadlock"):
        insert_comm(s2)
    # A backward scheduled between an offload and its reload.
    s3 = generate("1f1b", p=1, m=1)
    f, bw = s3.ranks[0]
    ops = [f, Op(K.OFFLOAD_START, 0, 0, 0, 0), Op(K.OFFLOAD_END, 0, 0, 0, 0), bw,
           Op(K.RELOAD_START, 0, 0, 0, 0), Op(K.RELOAD_END, 0, 0, 0, 0)]
    with pytest.raises(AssertionError, match="activations are not back"):
        interpret(s3.with_ranks([ops]))


# ----------------------------------------------------------------- the runtime refuses
def _deadlocking_schedule() -> Schedule:
    # Rank 0 waits for mb 0's gradient, which rank 1 computes only after mb 1's
    # forward, whose input rank 0 sends only after that gradient: a cycle.
    return build_schedule("deadlock", 2, Placement.loop(2, 1), [
        [(K.F, 0, 0), (K.BW, 0, 0), (K.F, 0, 1), (K.BW, 0, 1)],
        [(K.F, 1, 1), (K.BW, 1, 1), (K.F, 1, 0), (K.BW, 1, 0)],
    ])


def test_the_runner_refuses_a_deadlocking_program_before_any_communication():
    torch = import_torch()
    import torch.distributed as dist

    from pipeoffload.runtime.executor import PipelineRunner

    assert not dist.is_initialized()  # no process group: nothing could be communicated
    with pytest.raises(ScheduleError, match="deadlock|cycle|cannot"):
        PipelineRunner(lambda s: torch.nn.Linear(4, 4), lambda y, t: y.sum(), _deadlocking_schedule(), rank=0)


def _deadlock_world(ctx):
    import torch

    from pipeoffload.runtime.executor import PipelineRunner

    PipelineRunner(lambda s: torch.nn.Linear(4, 4), lambda y, t: y.sum(), _deadlocking_schedule(), timeout_s=60)


@pytest.mark.multiproc
def test_the_runner_refuses_a_deadlocking_program_in_a_real_world():
    import_torch()
    from pipeoffload.runtime.launcher import LaunchError, launch

    t = time.perf_counter()
    with pytest.raises(LaunchError) as e:
        launch(_deadlock_world, 2, backend="gloo", init_timeout_s=60)
    assert "ScheduleError" in str(e.value) and "deadlock" in str(e.value), str(e.value)
    assert time.perf_counter() - t < 45  # refused at construction, not after a 60 s receive timeout
