"""Communication pass: insert sends and receives, and prove the order deadlock-free.

Pure Python (no torch). Input: a schedule whose rank lists hold compute ops (and
possibly offload/reload ops, kept in place). Output: a *program* — the same
:class:`~pipeoffload.ir.Schedule` type with ``SEND_*``/``RECV_*`` ops — in which

- a ``SEND_F(stage=s)`` follows ``F(s, j)`` when layer group ``s+1`` lives on another
  rank (``peer``), and a ``RECV_F(stage=s+1)`` precedes ``F(s+1, j)`` there;
- a ``SEND_B(stage=s)`` follows ``B``/``BW(s, j)`` when group ``s−1`` lives on
  another rank, and a ``RECV_B(stage=s−1)`` precedes ``B``/``BW(s−1, j)`` there;
- consecutive groups on the same rank (the turn of a V placement) hand off locally:
  no op is inserted.

An op's ``stage`` is always the layer group *on its own rank* (the producer for a
send, the consumer for a receive). A message is identified by
``(direction, sender stage, microbatch)`` (:func:`message_key`), which the runtime
turns into a unique tag.

:func:`check_deadlock_free` runs the program under the runtime's semantics — a send
never blocks (non-blocking isend), a receive blocks until the matching send has been
issued, a compute op needs its inputs computed earlier on its rank or received — and
raises :class:`ScheduleError` naming each stuck rank, its op and the peer it waits
for, if the program cannot complete. :func:`insert_comm` always runs it.
"""

from __future__ import annotations

import bisect

from ..errors import ScheduleError
from ..ir import Op, OpKind, Placement, Schedule
from .timing import completion_key, dependencies, overlapped_positions

#: (direction "F" or "B", sender stage, microbatch)
MessageKey = tuple[str, int, int]

_SEND = (OpKind.SEND_F, OpKind.SEND_B)
_RECV = (OpKind.RECV_F, OpKind.RECV_B)


def message_key(op: Op) -> MessageKey:
    """The message a send or receive op carries."""
    k = op.kind
    if k is OpKind.SEND_F:
        return ("F", op.stage, op.microbatch)
    if k is OpKind.RECV_F:
        return ("F", op.stage - 1, op.microbatch)
    if k is OpKind.SEND_B:
        return ("B", op.stage, op.microbatch)
    if k is OpKind.RECV_B:
        return ("B", op.stage + 1, op.microbatch)
    raise ValueError(f"{op} is not a send or receive")


def message_tag(key: MessageKey, num_stages: int, num_microbatches: int) -> int:
    """A unique non-negative tag per message of one iteration."""
    d, s, j = key
    return 2 * (s * num_microbatches + j) + (1 if d == "B" else 0)


def insert_comm(schedule: Schedule) -> Schedule:
    """The program for ``schedule``: sends right after producers, receives right before
    consumers. Existing send/receive ops are dropped and re-derived. An overlapped pair
    that runs as one op (:func:`~pipeoffload.passes.timing.overlapped_positions`) gets both
    halves' receives before it and both sends after it. Raises :class:`ScheduleError`
    if the result is not deadlock-free."""
    pl = schedule.placement
    S = pl.num_stages
    kept = [[op for op in lst if not op.kind.is_comm] for lst in schedule.ranks]
    pairs = overlapped_positions(schedule, kept)
    ranks: list[list[Op]] = []
    for r, lst in enumerate(kept):
        out: list[Op] = []
        i = 0
        while i < len(lst):
            op = lst[i]
            if not op.kind.is_compute:
                out.append(op)
                i += 1
                continue
            group = lst[i:i + 2] if (r, i) in pairs else [op]
            for o in group:
                out.extend(_receives(o, pl, S))
            out.extend(group)
            for o in group:
                out.extend(_sends(o, pl, S))
            i += len(group)
        ranks.append(out)
    program = schedule.with_ranks(ranks)
    check_deadlock_free(program)
    return program


def _receives(op: Op, pl: Placement, S: int) -> list[Op]:
    """The receive compute op ``op`` needs before it (none when its input is local)."""
    s, j, r, c = op.stage, op.microbatch, op.rank, op.chunk
    if op.kind is OpKind.F and s > 0 and pl.rank_of(s - 1) != r:
        return [Op(OpKind.RECV_F, s, j, r, c, pl.rank_of(s - 1))]
    if op.kind.is_backward and s < S - 1 and pl.rank_of(s + 1) != r:
        return [Op(OpKind.RECV_B, s, j, r, c, pl.rank_of(s + 1))]
    return []


def _sends(op: Op, pl: Placement, S: int) -> list[Op]:
    """The send after compute op ``op`` (none when its consumer is on its rank)."""
    s, j, r, c = op.stage, op.microbatch, op.rank, op.chunk
    if op.kind is OpKind.F and s < S - 1 and pl.rank_of(s + 1) != r:
        return [Op(OpKind.SEND_F, s, j, r, c, pl.rank_of(s + 1))]
    if op.kind.is_backward and s > 0 and pl.rank_of(s - 1) != r:
        return [Op(OpKind.SEND_B, s, j, r, c, pl.rank_of(s - 1))]
    return []


def check_deadlock_free(program: Schedule) -> None:
    """Simulate ``program`` (sends never block; a receive blocks until its send was
    issued); raise :class:`ScheduleError` unless every rank runs to its end.

    Also checks that sends and receives pair up one to one with the right peers and
    that every compute op's cross-rank input is received before it.
    """
    _check_pairs(program)
    p = program.num_ranks
    lists = program.ranks
    ptr = [0] * p
    issued: set[MessageKey] = set()
    done: list[set] = [set() for _ in range(p)]  # completion keys (local) and received messages
    progress = True
    while progress:
        progress = False
        for r in range(p):
            lst = lists[r]
            while ptr[r] < len(lst) and _run_op(program, r, ptr[r], issued, done[r]):
                ptr[r] += 1
                progress = True
    stuck = [r for r in range(p) if ptr[r] < len(lists[r])]
    if stuck:
        parts = []
        for r in stuck:
            op = lists[r][ptr[r]]
            d, s, j = message_key(op)
            parts.append(f"rank {r} waits at {op} for SEND_{d}(stage={s}, mb={j}) from rank {op.peer}")
        raise ScheduleError("deadlock in the send/receive order: " + "; ".join(parts))


def _run_op(program: Schedule, r: int, i: int, issued: set[MessageKey], done: set) -> bool:
    """Run op ``i`` of rank ``r``: False when it is a receive whose message was not sent
    yet (it blocks); raises ScheduleError when the op breaks a rule."""
    op = program.ranks[r][i]
    k = op.kind
    if k in _RECV:
        mk = message_key(op)
        if mk not in issued:
            return False
        done.add(("msg",) + mk)
    elif k in _SEND:
        produced = ("F" if k is OpKind.SEND_F else "B", op.stage, op.microbatch)
        if produced not in done:
            raise ScheduleError(
                f"rank {r}, position {i}: {op} sends a result its rank has not computed yet "
                f"(rule: a send follows its producer)")
        issued.add(message_key(op))
    elif k.is_compute:
        _check_inputs(program, r, i, op, done)
        done.add(completion_key(op))
    return True


def _check_inputs(program: Schedule, r: int, i: int, op: Op, done: set) -> None:
    """Each input of compute op ``op`` (position ``i`` on rank ``r``) was computed
    earlier on the rank, or received there from the rank that computed it."""
    pl = program.placement
    for dk in dependencies(op, program.num_stages):
        if pl.rank_of(dk[1]) == r:
            ok = dk in done
        else:
            ok = ("msg", dk[0], dk[1], dk[2]) in done
        if not ok:
            how = "computed earlier on this rank" if pl.rank_of(dk[1]) == r else \
                f"received from rank {pl.rank_of(dk[1])} before it"
            raise ScheduleError(
                f"rank {r}, position {i}: {op} needs {dk[0]}(stage={dk[1]}, mb={dk[2]}), "
                f"which is not {how} (rule: inputs precede their consumer)")


def _check_pairs(program: Schedule) -> None:
    sends: dict[MessageKey, Op] = {}
    recvs: dict[MessageKey, Op] = {}
    for lst in program.ranks:
        for op in lst:
            if op.kind in _SEND or op.kind in _RECV:
                table = sends if op.kind in _SEND else recvs
                mk = message_key(op)
                if mk in table:
                    raise ScheduleError(f"{op}: a second op for the same message (rule: one send and one receive each)")
                table[mk] = op
    for mk, s in sends.items():
        r = recvs.get(mk)
        if r is None:
            raise ScheduleError(f"{s} has no matching receive on rank {s.peer}")
        if r.rank != s.peer or r.peer != s.rank:
            raise ScheduleError(f"{s} is matched by {r}: peers disagree")
    for mk, r in recvs.items():
        if mk not in sends:
            raise ScheduleError(f"{r} has no matching send on rank {r.peer}")


def incoming_order(program: Schedule, rank: int) -> dict[int, list[MessageKey]]:
    """Per peer, the messages ``rank`` receives from it, in the order the peer sends them.

    A backend that matches point-to-point messages in issue order (NCCL ignores tags)
    needs receives posted in this order; the runtime posts them so on every backend.
    """
    out: dict[int, list[MessageKey]] = {}
    for r, lst in enumerate(program.ranks):
        if r == rank:
            continue
        for op in lst:
            if op.kind in _SEND and op.peer == rank:
                out.setdefault(r, []).append(message_key(op))
    return out


def send_retirements(program: Schedule, rank: int) -> dict[MessageKey, tuple[MessageKey, ...]]:
    """When each send of ``rank`` is known to be complete, from the program alone.

    Returns a map from a message ``rank`` *receives* (``Y``, from peer ``q``) to the
    messages ``rank`` *sent* to ``q`` (``X``) that have surely been received once ``Y``
    has: ``q`` produces ``Y`` after the receive op of ``X`` on ``q`` (where ``q`` waits
    for ``X``), so ``Y`` is sent only after ``X`` arrived. Each ``X`` appears under the
    ``Y`` that ``rank`` receives first; a send with no such ``Y`` (the last ones of a
    step) is absent.

    Guarantees: once ``rank`` has waited for ``Y``, every send under it has been matched
    and its data has arrived, so waiting for it returns at once on every backend (gloo,
    whose ``is_completed()`` stays False until ``wait()``, and NCCL); the runtime uses it
    to free send buffers early (``runtime/messages.py``). Cost: linear in the program
    plus ``O(M log M)`` for ``M`` messages of ``rank``.
    """
    recv_pos = {message_key(op): i for i, op in enumerate(program.ranks[rank]) if op.kind in _RECV}
    sent_to: dict[int, list[MessageKey]] = {}
    for op in program.ranks[rank]:
        if op.kind in _SEND:
            sent_to.setdefault(op.peer, []).append(message_key(op))
    out: dict[MessageKey, list[MessageKey]] = {}
    for q, xs in sent_to.items():
        # On q: where it waits for each X, and, for each Y it sends to rank, where Y's
        # producer runs (the last compute op before the send marker).
        waits: dict[MessageKey, int] = {}
        made: list[tuple[int, MessageKey]] = []
        last_compute = -1
        for i, op in enumerate(program.ranks[q]):
            if op.kind in _RECV and op.peer == rank:
                waits[message_key(op)] = i
            elif op.kind in _SEND and op.peer == rank:
                made.append((last_compute, message_key(op)))
            elif op.kind.is_compute:
                last_compute = i
        # Suffix minimum over the Ys by producer position: the Y that rank receives
        # first among those produced after position k.
        best: list[tuple[int, MessageKey] | None] = [None] * (len(made) + 1)
        for n in range(len(made) - 1, -1, -1):
            y = made[n][1]
            cand = (recv_pos[y], y) if y in recv_pos else None
            nxt = best[n + 1]
            best[n] = cand if nxt is None or (cand is not None and cand[0] < nxt[0]) else nxt
        starts = [pos for pos, _ in made]
        for x in xs:
            k = waits.get(x)
            if k is None:
                continue
            got = best[bisect.bisect_right(starts, k)]
            if got is not None:
                out.setdefault(got[1], []).append(x)
    return {y: tuple(x) for y, x in out.items()}


def comm_volume(program: Schedule) -> dict[str, int]:
    """Number of cross-rank messages by direction (reports: V placements send 2× 1F1B's)."""
    out = {"F": 0, "B": 0}
    for op in program.ops():
        if op.kind in _SEND:
            out[message_key(op)[0]] += 1
    return out
