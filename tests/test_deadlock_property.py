"""Deadlock freedom is checked before any run.

Property: for every schedule in the registry, with random p, m, v, g, op costs and
offload settings (the offload pass in "skip" or "delay" mode, optionally postponed
warm-up), the send/receive order the comm pass inserts into the *offloaded* schedule
runs to completion. "Runs" is judged here by an interpreter written independently of
``passes.comm``: the runtime's semantics (an isend never blocks, a receive blocks until
its message was sent), every compute op's inputs present on its rank when it starts,
each message sent and received exactly once between the right ranks, and every
offloaded activation back (RELOAD_END) before its backward.

On NCCL (in-order streams, sends that wait for their receive, matching by order per
peer) the program is not enough: the issue policy (``passes/issue_policy.py``) says
which groups of sends and receives each rank issues where, and ``passes/nccl_check.py``
proves that plan completes. Property: every registry schedule's plan passes, with and
without offload, headers, any lookahead, one communicator or one per peer, in a dp × tp
mesh; the checker agrees with a naive interpreter on plans edited to deadlock; the old
runtime's policy deadlocks at 1F1B with two ranks and the cycle is named.

And the runtime refuses a program that deadlocks: ``PipelineRunner`` raises
ScheduleError before any communication (here: with no process group at all; and in a
real two-process world, well before any receive could time out).
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError, ScheduleError
from pipeoffload.ir import Op, OpKind, Placement, Schedule, build_schedule
from pipeoffload.passes.comm import insert_comm, message_key
from pipeoffload.passes.issue_policy import Group, IssuePlan, RankIssue, issue_plan
from pipeoffload.passes.nccl_check import NO_ROUND, MeshModel, check_nccl, legacy_plan
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


def _shape(draw, name: str, *, p_min: int, v_max: int, m_extra: int) -> tuple:
    """(p, v, m, g, mem_limit) of a random ``name`` schedule: p in [p_min, 6], v where it
    applies, m in [1, m_extra·p + 2], g for group-interleaved, a memory limit for zb-auto."""
    p = draw(st.integers(p_min, 6))
    v = draw(st.integers(1, v_max)) if name in ANY_V else SCHEDULES[name].default_v
    m = draw(st.integers(1, m_extra * p + 2))
    g = draw(st.integers(-(-p // 2), p)) if name == "group-interleaved" else None
    mem_limit = draw(st.sampled_from([None, float(p), 2.0 * p])) if name == "zb-auto" else None
    return p, v, m, g, mem_limit


# ----------------------------------------------------------------- the property
@st.composite
def setups(draw, name: str):
    p, v, m, g, mem_limit = _shape(draw, name, p_min=1, v_max=4, m_extra=3)
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


@settings(deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
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


# ================================================================= NCCL: the issue policy
# passes/issue_policy.py says which groups of point-to-point ops each rank issues where;
# passes/nccl_check.py simulates that under NCCL's rules (in-order streams, blocking sends,
# match by order, groups progress together). Here: every registry schedule's plan passes,
# the checker agrees with a naive interpreter written below, and what it must reject it
# rejects, naming the cycle.


def _program(name: str, **kw) -> Schedule:
    return insert_comm(generate(name, **kw))


@st.composite
def nccl_setups(draw, name: str):
    p, v, m, g, mem_limit = _shape(draw, name, p_min=2, v_max=3, m_extra=2)
    window = draw(st.sampled_from([None, "activation", "stash"]))
    offload = None if window is None else {
        "offload_chunks": draw(st.integers(1, v)),
        "offload_time": draw(st.sampled_from([0.0, 0.5, 1.0])),
        "on_infeasible": "skip",
        "stash": window == "stash",
    }
    headers = draw(st.sampled_from([False, True, "even"]))
    lookahead = draw(st.integers(0, 3))
    dp, tp = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    tp_stages = draw(st.sampled_from([None, "first half"]))
    shard = draw(st.booleans())
    return p, m, v, g, mem_limit, offload, headers, lookahead, dp, tp, tp_stages, shard


@settings(deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_every_registry_schedule_has_an_issue_plan_nccl_runs(schedule_name, data):
    """issue_plan's output completes under NCCL's rules on one communicator and on one per
    peer, with and without offload (both windows), headers, any lookahead, in a dp × tp
    mesh (replicated or sharded), with a tied parameter between the first and last layer
    group's ranks."""
    p, m, v, g, mem_limit, offload, headers, lookahead, dp, tp, tp_stages, shard = data.draw(nccl_setups(schedule_name))
    try:
        sched = generate(schedule_name, p=p, m=m, v=v, g=g, mem_limit=mem_limit)
    except ParameterError:
        assume(False)
    if offload is not None:
        sched = plan_offload(sched, **offload).schedule
    prog = insert_comm(sched)
    hdr = (lambda mk: mk[2] % 2 == 0) if headers == "even" else headers
    plan = issue_plan(prog, headers=hdr, lookahead=lookahead)
    S = prog.num_stages
    mesh = MeshModel(dp=dp, tp=tp, tp_stages=None if tp_stages is None else frozenset(range(S // 2)), dp_shard=shard)
    pl = prog.placement
    ties = [[pl.rank_of(0), pl.rank_of(S - 1)]] if pl.rank_of(0) != pl.rank_of(S - 1) else None
    for comm in ("group", "peer"):
        rep = check_nccl(plan, communicators=comm, mesh=mesh, ties=ties)
        assert rep.processes == p * dp * tp
        assert rep.rounds == plan.num_rounds
        assert rep.groups == sum(len(ri.groups()) for ri in plan.ranks)
    # The plan also runs on gloo (sends buffered, matching by tag).
    check_nccl(plan, send_blocks=False)


# ----------------------------------------------------------------- a naive interpreter
def reference_completes(plan: IssuePlan, communicators: str = "group", send_blocks: bool = True) -> bool:
    """The runtime's CPU semantics and NCCL's rules, interpreted naively and written
    independently of nccl_check: messages match by their *ordinal* per (sender, receiver)
    (NCCL's rule 3, ignoring keys), streams run in issue order, a pair of matched ops
    completes once both their batches are at the head of their streams, a batch once all
    its pairs did. True when every rank reaches its end with its sends done."""
    prog = plan.program
    p = prog.num_ranks
    acts: list[list[tuple]] = []
    for r in range(p):
        a: list[tuple] = []
        at = plan.ranks[r].at
        k = 0

        def gap(k: int) -> None:
            for g in at.get(k, []):
                a.append(("after", g.after))
                a.append(("issue", g))

        gap(0)
        for op in prog.ranks[r]:
            if op.kind in (K.RECV_F, K.RECV_B):
                a.append(("recv", message_key(op)))
            elif op.kind not in (K.SEND_F, K.SEND_B):
                k += 1
                gap(k)
        a.append(("end",))
        acts.append(a)
    batch_pairs: list[list[tuple]] = []  # batch -> pair ids of its ops
    batch_stream: list[tuple] = []
    pair_batches: dict[tuple, dict[bool, int]] = defaultdict(dict)  # pair id -> {send?: batch}
    where: dict[tuple, int] = {}  # (rank, key, part, send) -> batch
    ordinal: dict[tuple, int] = defaultdict(int)
    queues: dict[tuple, list[int]] = defaultdict(list)
    done: set[int] = set()
    pairs_done: set[tuple] = set()
    sends_of: dict[int, list[int]] = defaultdict(list)
    pc = [0] * p
    changed = True
    while changed:
        changed = False
        for r in range(p):
            while pc[r] < len(acts[r]):
                a = acts[r][pc[r]]
                if a[0] == "issue":
                    by_stream: dict[tuple, list] = defaultdict(list)
                    for x in a[1].xfers:
                        s = (r,) if communicators == "group" else (r, x.peer)
                        by_stream[s].append(x)
                    for s in sorted(by_stream):
                        b = len(batch_pairs)
                        batch_pairs.append([])
                        batch_stream.append(s)
                        queues[s].append(b)
                        for x in by_stream[s]:
                            ends = (r, x.peer) if x.send else (x.peer, r)
                            if send_blocks:
                                pid = ends + (ordinal[ends + (x.send,)],)
                                ordinal[ends + (x.send,)] += 1
                            else:
                                pid = ends + (x.key, x.part)
                            batch_pairs[b].append((pid, x.send))
                            pair_batches[pid][x.send] = b
                            where[(r, x.key, x.part, x.send)] = b
                            if x.send:
                                sends_of[r].append(b)
                    ok = True
                elif a[0] == "after":
                    ok = all(where.get((r, mk, "h", False), -1) in done for mk in a[1])
                elif a[0] == "recv":
                    mk = a[1]
                    need = [where.get((r, mk, "p", False), -1)]
                    if (r, mk, "h", False) in where:
                        need.append(where[(r, mk, "h", False)])
                    ok = all(b in done for b in need)
                else:
                    ok = all(b in done for b in sends_of[r])
                if not ok:
                    break
                pc[r] += 1
                changed = True
        if send_blocks:
            heads = set()
            for q in queues.values():
                first = next((b for b in q if b not in done), None)
                if first is not None:
                    heads.add(first)
            for b in heads:
                for pid, send in batch_pairs[b]:
                    if pair_batches[pid].get(not send) in heads:
                        pairs_done.add(pid)
            for b in heads:
                if all(pid in pairs_done for pid, _ in batch_pairs[b]):
                    done.add(b)
                    changed = True
        else:
            for b in range(len(batch_pairs)):  # a send is done when issued, a receive once its send is
                if b not in done and all(send or (True in pair_batches[pid]) for pid, send in batch_pairs[b]):
                    done.add(b)
                    changed = True
    return all(pc[r] == len(acts[r]) for r in range(p))


def _shift(plan: IssuePlan, r: int, k: int, span: int) -> IssuePlan:
    """Rank ``r`` issues its groups of gaps ``k..k+span`` all at gap ``k+span`` (same order)."""
    ranks = []
    for q, ri in enumerate(plan.ranks):
        at = {kk: list(gs) for kk, gs in ri.at.items()}
        if q == r:
            last = ri.gap_of[-1]
            to = min(k + span, last)
            moved = [g for kk in range(k, to + 1) for g in at.pop(kk, [])]
            if moved:
                at[to] = moved
        ranks.append(RankIssue(at, list(ri.gap_of)))
    return IssuePlan(plan.program, ranks, plan.rounds, plan.headers, plan.num_rounds)


def _split(plan: IssuePlan, r: int, first: str | None = None) -> IssuePlan:
    """Rank ``r`` issues every op of its groups as its own group, in the same order (or
    with the group's receives, or sends, ``first``)."""
    ranks = []
    for q, ri in enumerate(plan.ranks):
        at = ri.at
        if q == r:
            def ops(g):
                return g.xfers if first is None else sorted(g.xfers, key=lambda x: x.send == (first == "recv"))
            at = {k: [Group(g.round, g.half, (x,), g.after if i == 0 else ()) for g in gs
                      for i, x in enumerate(ops(g))] for k, gs in ri.at.items()}
        ranks.append(RankIssue(at, list(ri.gap_of)))
    return IssuePlan(plan.program, ranks, plan.rounds, plan.headers, plan.num_rounds)


@settings(deadline=None)
@given(name=st.sampled_from(["1f1b", "gpipe", "zb-h1", "zb-v", "interleaved-1f1b"]),
       p=st.integers(2, 4), extra=st.integers(0, 4), headers=st.booleans(), lookahead=st.integers(0, 3),
       edits=st.lists(st.tuples(st.sampled_from(["shift", "split"]), st.integers(0, 3), st.integers(0, 40),
                                st.integers(1, 6)), max_size=3),
       comm=st.sampled_from(["group", "peer"]), legacy=st.booleans())
def test_the_checker_agrees_with_a_naive_interpreter(name, p, extra, headers, lookahead, edits, comm, legacy):
    """On issue plans (and the old policy's), with some ranks issuing later or ungrouped:
    check_nccl passes exactly when the naive interpreter runs to the end, and a deadlock
    it reports is one the interpreter gets stuck in (structural errors aside)."""
    m = p + extra
    try:
        prog = _program(name, p=p, m=m)
    except ParameterError:
        assume(False)
    plan = legacy_plan(prog, lookahead=lookahead, headers=headers) if legacy else \
        issue_plan(prog, headers=headers, lookahead=lookahead)
    for what, r, k, span in edits:
        r %= p
        plan = _shift(plan, r, k, span) if what == "shift" else _split(plan, r)
    ref = reference_completes(plan, comm)
    try:
        check_nccl(plan, communicators=comm)
    except ScheduleError as e:
        if "deadlock" not in str(e):
            return  # a structural error (e.g. a receive moved past its consumer): not compared
        assert not ref, f"the checker reports a deadlock the interpreter does not find: {e}"
    else:
        assert ref, "the checker passes a plan the interpreter gets stuck in"
    # gloo: sends never block
    try:
        check_nccl(plan, send_blocks=False)
        assert reference_completes(plan, comm, send_blocks=False)
    except ScheduleError as e:
        if "deadlock" in str(e):
            assert not reference_completes(plan, comm, send_blocks=False)


# ----------------------------------------------------------------- what it must reject
def test_the_old_issue_policy_deadlocks_on_nccl_and_the_cycle_is_named():
    """The previous runtime (receives posted ahead after compute ops; every part its own
    op; header before payload) hangs at 1F1B with two ranks on NCCL: rank 0 posts mb 0's
    gradient receive before it sends mb 0's header, so the header queues behind a
    receive whose send rank 1 issues only after that header. On gloo it runs."""
    prog = _program("1f1b", p=2, m=4)
    old = legacy_plan(prog, lookahead=2)
    for comm in ("group", "peer"):
        with pytest.raises(ScheduleError) as e:
            check_nccl(old, communicators=comm)
        msg = str(e.value)
        assert "deadlock" in msg and "rank 1 blocks at" in msg, msg
        assert "SEND_F(stage=0, mb=0) header, queued behind RECV_B(stage=0, mb=0) on rank 0's" in msg, msg
        assert "rank 1's matching send SEND_B(stage=1, mb=0), not issued" in msg and "a cycle" in msg, msg
        assert not reference_completes(old, comm)
    rep = check_nccl(old, send_blocks=False)
    assert rep.groups == rep.xfers  # one op per group
    assert reference_completes(old, send_blocks=False)
    # The new policy, same program: fine either way.
    for h in (False, True):
        for comm in ("group", "peer"):
            check_nccl(issue_plan(prog, headers=h), communicators=comm)


def test_ops_of_a_round_issued_one_by_one_in_opposite_orders_deadlock():
    """1F1B, two ranks: each round holds rank 0's send and receive and rank 1's. Issued
    as one group each (the policy), they pass. Issued one op at a time, both ranks
    receiving first, each receive waits for a send queued behind the other's receive: the
    cycle is named; gloo (sends never block) runs it."""
    prog = _program("1f1b", p=2, m=3)
    plan = issue_plan(prog, headers=False, lookahead=0)
    recv_first = _split(_split(plan, 0, "recv"), 1, "recv")
    with pytest.raises(ScheduleError) as e:
        check_nccl(recv_first)
    msg = str(e.value)
    assert "rank 0 blocks at RECV_B(stage=0, mb=0): its receive RECV_B(stage=0, mb=0) waits for rank 1's " \
           "matching send SEND_B(stage=1, mb=0), queued behind RECV_F(stage=1, mb=1) on rank 1's pipeline " \
           "stream, which waits for rank 0's matching send SEND_F(stage=0, mb=1), queued behind " \
           "RECV_B(stage=0, mb=0) on rank 0's pipeline stream" in msg, msg
    assert msg.endswith("a cycle through rank 0 and rank 1"), msg
    assert not reference_completes(recv_first)
    check_nccl(recv_first, send_blocks=False)
    # Sends first on both sides: the mirror image (each send waits for a receive queued
    # behind the other's send). Opposite orders pair up and run.
    send_first = _split(_split(plan, 0, "send"), 1, "send")
    with pytest.raises(ScheduleError, match=r"rank 0 blocks at RECV_B\(stage=0, mb=0\): its receive "
                                            r"RECV_B\(stage=0, mb=0\) is queued behind SEND_F\(stage=0, mb=1\)"):
        check_nccl(send_first)
    assert not reference_completes(send_first)
    for a, b in (("send", "recv"), ("recv", "send")):
        check_nccl(_split(_split(plan, 0, a), 1, b))
        assert reference_completes(_split(_split(plan, 0, a), 1, b))


def _edit(plan: IssuePlan, r: int, fn) -> IssuePlan:
    ranks = [RankIssue({k: list(v) for k, v in ri.at.items()}, list(ri.gap_of)) for ri in plan.ranks]
    fn(ranks[r].at)
    return IssuePlan(plan.program, ranks, plan.rounds, plan.headers, plan.num_rounds)


def test_structural_errors_are_named():
    prog = _program("1f1b", p=2, m=3)
    plan = issue_plan(prog, headers=True, lookahead=1)
    check_nccl(plan)
    first_send = min(k for k, gs in plan.ranks[0].at.items() if any(x.send for g in gs for x in g.xfers))

    def early_send(at):  # rank 0's first send moved to gap 0, before its producer F(0, 0)
        at.setdefault(0, []).insert(0, at.pop(first_send)[0])

    with pytest.raises(ScheduleError, match=r"rank 0: SEND_F\(stage=0, mb=0\) header is issued at gap 0, before "
                                            r"its producer F\(stage=0, mb=0\) ran"):
        check_nccl(_edit(plan, 0, early_send))

    last = plan.ranks[1].gap_of[-1]

    def late_recv(at):  # rank 1's first groups (its first receive) moved to the end
        at.setdefault(last, []).extend(at.pop(min(at)))

    with pytest.raises(ScheduleError, match=r"rank 1: RECV_F\(stage=1, mb=0\) is not issued by gap 0, its consumer's"):
        check_nccl(_edit(plan, 1, late_recv))

    def late_header(at):  # only the header of rank 1's second receive moved past its consumer
        k1 = sorted(at)[1]
        at.setdefault(last, []).append(at[k1].pop(0))

    with pytest.raises(ScheduleError, match=r"RECV_F\(stage=1, mb=1\)"):
        check_nccl(_edit(plan, 1, late_header))

    def drop(at):  # rank 1 forgets the payload of its first receive
        k0 = min(at)
        g = at[k0][-1]
        at[k0][-1] = Group(g.round, g.half, g.xfers[1:], g.after)

    with pytest.raises(ScheduleError, match=r"rank 1: RECV_F\(stage=1, mb=0\) is not issued by gap 0"):
        check_nccl(_edit(plan, 1, drop))

    def swap(at):  # rank 0 swaps two of its send groups: messages reach rank 1 in another order
        ks = sorted(k for k, gs in at.items() if any(x.send for g in gs for x in g.xfers))
        at[ks[0]], at[ks[1]] = at[ks[1]], at[ks[0]]

    # (moving a send to an earlier gap may also be caught as "before its producer"; either names the send)
    with pytest.raises(ScheduleError, match="matches by order|before its producer|round"):
        check_nccl(_edit(plan, 0, swap))

    def other_round(at):  # same order, but one group labelled with another round
        k0 = min(at)
        g = at[k0][0]
        at[k0][0] = Group(g.round + 1, g.half, g.xfers, g.after)

    with pytest.raises(ScheduleError, match=r"is in round \d+ half \d on rank 0 but its receive is in round"):
        check_nccl(_edit(plan, 0, other_round))

    def no_header(at):  # a payload group waiting for a header the rank never posted
        for k, gs in at.items():
            for n, g in enumerate(gs):
                if g.after:
                    gs[n] = Group(g.round, g.half, g.xfers, (("F", 7, 7),))
                    return

    with pytest.raises(ScheduleError, match="waits for the header of RECV_F.*not posted"):
        check_nccl(_edit(plan, 1, no_header))
    # A plan that pairs a send with a receive in the same order but on one side only
    with pytest.raises(ParameterError, match="communicators"):
        check_nccl(plan, communicators="world")


def test_reversed_order_within_a_group_is_a_rule_3_error():
    """Rank 1 receives GPipe's four forwards in one group, in the reverse of the order
    rank 0 sends them: NCCL pairs the n-th send with the n-th receive, whatever the tags,
    so the checker refuses it (gloo, matching by tag, would not mind)."""
    prog = _program("gpipe", p=2, m=4)
    plan = issue_plan(prog, headers=False, lookahead=3)
    plan = IssuePlan(prog, [RankIssue({k: [Group(NO_ROUND, 0, g.xfers, g.after) for g in gs]
                                       for k, gs in ri.at.items()}, ri.gap_of) for ri in plan.ranks],
                     {}, plan.headers, 0)
    fwd = [g.xfers[0] for g in plan.ranks[1].at[0]]
    assert [x.key for x in fwd] == [("F", 0, j) for j in range(4)]
    check_nccl(_edit(plan, 1, lambda at: at.__setitem__(0, [Group(NO_ROUND, 0, tuple(fwd))])))
    bad = _edit(plan, 1, lambda at: at.__setitem__(0, [Group(NO_ROUND, 0, tuple(reversed(fwd)))]))
    with pytest.raises(ScheduleError, match=r"rank 0's message #0 to rank 1 is SEND_F\(stage=0, mb=0\), but rank "
                                            r"1's receive #0 from rank 0 is RECV_F\(stage=1, mb=3\): NCCL matches "
                                            "by order per peer"):
        check_nccl(bad)
    check_nccl(bad, send_blocks=False)


# ----------------------------------------------------------------- the mesh
def test_the_mesh_is_free_of_cycles_and_a_bad_dp_order_is_caught():
    """A dp × tp mesh around ZB-V (two layer groups per rank, so two DP reductions
    each): TP all-reduces inside every compute op, DP reductions started after each
    layer group's last W and waited at the end, ties exchanged before: no cycle on
    either communicator layout. Replica 1 issuing its reductions in the other order
    (NCCL would pair the wrong all-reduces; here: each waits for the other) is caught."""
    prog = _program("zb-v", p=3, m=6)
    plan = issue_plan(prog, headers=True)
    for comm in ("group", "peer"):
        for shard in (False, True):
            rep = check_nccl(plan, communicators=comm, mesh=MeshModel(dp=2, tp=2, dp_shard=shard),
                             ties=[[0, 1, 2]], tie_pattern="all")
            assert rep.processes == 12 and rep.collectives > 0
    check_nccl(plan, mesh=MeshModel(dp=2, tp=1), ties=[[0, 2]], tie_pattern="star")

    def reverse_on_replica_1(pp, d, stages):
        return stages[::-1] if d == 1 else stages

    with pytest.raises(ScheduleError) as e:
        check_nccl(plan, mesh=MeshModel(dp=2, tp=2, dp_order=reverse_on_replica_1))
    msg = str(e.value)
    assert "DP reduction of layer group" in msg and "queued behind DP reduction of layer group" in msg, msg
    assert "(dp=0, tp=" in msg and "(dp=1, tp=" in msg and "a cycle" in msg, msg
    with pytest.raises(ParameterError, match="mesh.dp"):
        MeshModel(dp=0)


# ----------------------------------------------------------------- speed
@pytest.mark.bench
@pytest.mark.parametrize("name", ["1f1b", "zb-v"])
def test_issue_plan_and_check_at_64_ranks_and_512_microbatches_take_under_3_s(name):
    prog = _program(name, p=64, m=512)
    t = time.perf_counter()
    plan = issue_plan(prog, headers=True)
    t_plan = time.perf_counter() - t
    rep = check_nccl(plan)
    t_all = time.perf_counter() - t
    assert rep.groups > 64 * 512
    assert t_all < 3.0, f"issue_plan {t_plan:.2f} s + check_nccl {t_all - t_plan:.2f} s"


def test_a_reload_never_starts_before_its_offload_ends():
    """Found by the property above (CI, 2026-11-27): a reload whose start rounded one unit in
    the last place below its offload's end (the placements' tolerance; sums on two lanes), and
    the program, ordered by time, started the reload first. Every activation's four transfer
    ops now come in their one legal order (``offload._reloads_after_offloads``)."""
    costs = Costs(F=3.0, B=3.0, W=3.0, comm=0.1)
    sched = generate("interleaved-1f1b", p=4, m=9, v=4, costs=costs, memory=MemoryDeltas())
    tl = simulate(sched, costs, MemoryDeltas())
    off = plan_offload(sched, tl, comm=costs.comm, offload_chunks=3, offload_time=1.0, link_group=1,
                       on_infeasible="skip", postpone_warmup=False)
    assert off.transfers, "nothing offloaded: the case checks nothing"
    for t in off.transfers:
        assert t.reload_start >= t.offload_end, t
    interpret(insert_comm(off.schedule))
