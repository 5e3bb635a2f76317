"""The issue policy: which point-to-point ops each rank issues where, grouped, in which order.

Pure Python (no torch). Input: a program from :func:`~pipeoffload.passes.comm.insert_comm`
(compute ops, offload transfers, ``SEND_*``/``RECV_*`` markers). Output: an
:class:`IssuePlan` that the runtime follows on every backend, and that
:mod:`pipeoffload.passes.nccl_check` proves deadlock-free under NCCL's rules
(docs/runtime.md, "Point-to-point on NCCL"):

1. the P2P ops of one communicator run in issue order on one stream;
2. a send may wait until its receive is running;
3. sends and receives match by order per peer (tags are ignored);
4. the ops of one group (``batch_isend_irecv``) progress together.

Construction (*rounds*). Every cross-rank message gets a time: the end of its producer
in the program timed with unit costs (any positive durations do; only the order
matters). Messages are taken in that order and packed greedily into *rounds*. Each
rank that takes part in a round issues all of that round's ops it is party to as one
group, at one *gap* of its program (the point after its ``k``-th non-communication
op): a send at the gap of its producer (right after it, never later), a receive at a
gap no later than its consumer. A message joins the current round unless its sender
already sends from another gap in the round, or would have to send after one of its
own receives in the round is consumed; then a new round starts. Rounds keep their
order on every rank, and both ends of a message are in the same round, so:

*Guarantee* (by induction over rounds): if every round before ``t`` has completed on
every rank, each rank reaches its gap of round ``t`` (its compute before that gap
consumes only messages of earlier rounds), its earlier groups are done (rule 1), and
each op of its round-``t`` group meets its match in the peer's round-``t`` group,
issued too; the ops of a group progress together (rule 4), in the same canonical order
per peer on both sides (rule 3). So round ``t`` completes: no deadlock, with one
communicator for the pipeline or one per peer, whether sends block (rule 2) or not.

*Headers* (dynamic shapes): a forward message whose shapes the receiver does not know
yet travels as a header part, then a payload part. Round ``t`` is then issued as two
groups: the headers (and everything else of the round), then — once the rank's own
header receives of the round completed — the payloads of those messages. Both ends
know statically which messages carry a header (``headers`` argument), so the induction
holds per half-round. With known shapes (the runtime caches them by the step's input
signature) a message is its payload alone.

Receives are issued as late as the order allows, but ``lookahead`` gaps before their
consumer at most (a receive posted early holds its buffer early), and never after the
rank's next send in the order (that would delay the send).

Cost: one timing of the program (``passes/timing.py``) plus ``O(M log M)`` for ``M``
messages; placing one rank's groups is linear in its own messages.
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from ..costs import Costs
from ..errors import ScheduleError
from ..ir import OpKind, Schedule
from .comm import MessageKey
from .timing import (B_CODE, F_CODE, ListScheduler, _op_codes, _time_rank_lists, overlapped_positions,
                     run_list_schedule, simulate)

__all__ = ["Xfer", "Group", "RankIssue", "IssuePlan", "issue_plan", "HEADER", "PAYLOAD"]

#: Parts of a message: the header (shapes, for dynamic shapes) and the payload (its tensors).
HEADER, PAYLOAD = "h", "p"

_SEND = (OpKind.SEND_F, OpKind.SEND_B)
_RECV = (OpKind.RECV_F, OpKind.RECV_B)


@dataclass(frozen=True, order=True, slots=True)
class Xfer:
    """One logical P2P op of a rank: a part of a message, sent to or received from ``peer``
    (a pipeline rank). The runtime issues one torch op per tensor of the part."""

    key: MessageKey
    part: str  #: HEADER or PAYLOAD
    send: bool
    peer: int


@dataclass(frozen=True, slots=True)
class Group:
    """One ``batch_isend_irecv`` of one rank: issued together, progressing together.

    ``after``: header receives (message keys) the rank waits for before issuing this
    group (the payload half of a round with headers); empty for the others."""

    round: int
    half: int  #: 0: the round's first group; 1: its payloads after headers
    xfers: tuple[Xfer, ...]
    after: tuple[MessageKey, ...] = ()


@dataclass
class RankIssue:
    """The issue policy of one rank.

    ``at[k]``: the groups issued at gap ``k`` (after the rank's ``k``-th
    non-communication op; ``k = 0`` before the first), in order. ``gap_of[i]``: the gap
    of program position ``i`` (the number of non-communication ops before it)."""

    at: dict[int, list[Group]] = field(default_factory=dict)
    gap_of: list[int] = field(default_factory=list)

    def groups(self) -> list[Group]:
        """Every group of the rank in issue order."""
        return [g for k in sorted(self.at) for g in self.at[k]]


@dataclass
class IssuePlan:
    """The issue policy of every rank of one program (module docstring)."""

    program: Schedule
    ranks: list[RankIssue]
    #: Message -> its round.
    rounds: dict[MessageKey, int]
    #: Forward messages that travel with a header.
    headers: frozenset[MessageKey]
    num_rounds: int = 0


def issue_plan(
    program: Schedule,
    *,
    headers: Callable[[MessageKey], bool] | bool = False,
    lookahead: int = 2,
    ranks: Iterable[int] | None = None,
) -> IssuePlan:
    """The issue policy of ``program`` (module docstring).

    Args:
        program: a program with send/receive markers (``insert_comm``'s output).
        headers: which forward messages carry a header part (True: all, False: none, or
            a predicate on the message key). Gradient messages never do: their receiver
            sent the forward and knows the shapes.
        lookahead: a receive is issued at most this many gaps before its consumer
            (and earlier only when the order forces it); >= 0.
        ranks: place only these ranks' groups (the runtime needs its own; the rounds
            are global either way); None: every rank.

    Returns: the :class:`IssuePlan`.

    Raises: ScheduleError when the program has no consistent order (it cannot happen
    for a program ``insert_comm`` accepted; the check guards the construction).

    Guarantees: every send and receive marker of the program is covered by exactly one
    payload xfer on each side; a send is issued at its producer's gap; a receive at a
    gap no later than its consumer's; on every rank the rounds appear in increasing
    order; both ends of a message are in the same round and half.
    """
    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    with paused_gc(promote=True):
        return _issue_plan(program, headers, lookahead, ranks)


@contextmanager
def paused_gc(*, promote: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off inside, back as it was after (also on an exception).

    For the passes that build a few objects per op and free none until they return
    (:func:`issue_plan`, :func:`~pipeoffload.passes.nccl_check.check_nccl`): the collector
    would rescan the program's ops again and again — about 40 % of ``issue_plan``'s time at
    p = 64, m = 512 — and finds no cycles there.

    Args:
        promote: on a normal exit, move every object the collector tracks into its oldest
            generation without scanning it (``gc.freeze()`` then ``gc.unfreeze()``), for a
            pass whose result outlives it (:func:`issue_plan`'s plan): otherwise the first
            young collection after the pause scans everything made inside, and a second
            one scans it again on its way to the oldest generation (a third of
            ``issue_plan``'s time at p = 64, m = 512). Nothing is lost: the oldest
            generation is still collected in full collections. Skipped when the process
            has frozen objects of its own (``gc.freeze()`` used by the application: an
            unfreeze would release them).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
        if promote and was and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
    finally:
        if was:
            gc.enable()


def _issue_plan(program: Schedule, headers: Callable[[MessageKey], bool] | bool, lookahead: int,
                ranks: Iterable[int] | None) -> IssuePlan:
    """:func:`issue_plan` after its argument check."""
    p = program.num_ranks
    hdr = (lambda k: bool(headers)) if isinstance(headers, bool) else headers
    gap_of, msgs = _gaps(program)
    t_end = _producer_end(program)
    order = sorted([(mk, v) for mk, v in msgs.items() if v[0] >= 0],
                   key=lambda it: (t_end(it[0]), it[0][0] == "F", it[0][1], it[0][2]))

    # Greedy rounds (module docstring); each message listed on both its ranks as it is placed,
    # as (message, send?, peer, gap of the send or of the consumer, carries a header?).
    rounds: dict[MessageKey, int] = {}
    mine: list[dict[int, list[tuple[MessageKey, bool, int, int, bool]]]] = [{} for _ in range(p)]
    rnd = 0
    r_send: dict[int, int] = {}  # rank -> its send gap in the current round
    r_cons: dict[int, float] = {}  # rank -> the earliest consumer gap of its receives in the round
    inf = math.inf
    header_keys = []
    for mk, (a, b, g, c) in order:
        if r_send.get(a, g) != g or r_cons.get(a, inf) < g:
            rnd, r_send, r_cons = rnd + 1, {}, {}
        r_send[a] = g
        if c < r_cons.get(b, inf):
            r_cons[b] = c
        rounds[mk] = rnd
        h = mk[0] == "F" and bool(hdr(mk))
        if h:
            header_keys.append(mk)
        lst = mine[a].get(rnd)
        if lst is None:
            lst = mine[a][rnd] = []
        lst.append((mk, True, b, g, h))
        lst = mine[b].get(rnd)
        if lst is None:
            lst = mine[b][rnd] = []
        lst.append((mk, False, a, c, h))
    n_rounds = rnd + 1 if order else 0

    with_header = frozenset(header_keys)
    plans = [RankIssue(gap_of=gap_of[r]) for r in range(p)]
    for r in (range(p) if ranks is None else ranks):
        _place_rank(r, mine[r], bool(with_header), lookahead, plans[r])
    return IssuePlan(program, plans, rounds, with_header, n_rounds)


def _gaps(program: Schedule) -> tuple[list[list[int]], dict[MessageKey, list[int]]]:
    """Per rank, the gap of each program position (and one past the end); per message,
    ``[sender, receiver, gap of its send, gap of its receive]`` (-1 where the program has
    no such op)."""
    gap_of: list[list[int]] = []
    msgs: dict[MessageKey, list[int]] = {}
    sf, sb, rf, rb = _SEND + _RECV
    for r, lst in enumerate(program.ranks):
        gaps: list[int] = []
        put = gaps.append
        k = 0
        for op in lst:
            put(k)
            kind = op.kind
            if kind is sf or kind is sb:
                mk = ("F" if kind is sf else "B", op.stage, op.microbatch)  # message_key, inline
                v = msgs.get(mk)
                if v is None:
                    msgs[mk] = [r, op.peer, k, -1]
                else:
                    v[0], v[1], v[2] = r, op.peer, k
            elif kind is rf or kind is rb:
                mk = ("F", op.stage - 1, op.microbatch) if kind is rf else ("B", op.stage + 1, op.microbatch)
                v = msgs.get(mk)
                if v is None:
                    msgs[mk] = [-1, -1, -1, k]
                else:
                    v[3] = k
            else:
                k += 1
        put(k)
        gap_of.append(gaps)
    return gap_of, msgs


def _producer_end(program: Schedule) -> Callable[[MessageKey], float]:
    """Per message, the end of its producer in the program timed with unit costs (a
    lookup function).

    The times are :func:`~pipeoffload.passes.timing.simulate`'s (``Costs()``, the same
    engine, the same floats), read from the engine's end-time table instead of a
    timeline of events; a program with overlapped F&B pairs goes through
    :func:`~pipeoffload.passes.timing.run_list_schedule`, which places each pair as one op."""
    co = program.compute_only()
    pl = co.placement
    dur = Costs().duration_table(pl)
    if overlapped_positions(co, co.ranks):
        out: dict[MessageKey, float] = {}
        for e in run_list_schedule(co, lambda o: dur[o.stage][o.kind], 0.0):
            op = e.op
            if op.kind is OpKind.F:
                out[("F", op.stage, op.microbatch)] = e.end
            elif op.kind.is_backward:
                out[("B", op.stage, op.microbatch)] = e.end
        return out.__getitem__
    codes, m = _op_codes(co, co.ranks)
    engine = ListScheduler(pl.stage_to_rank, m, 0.0)
    done, _ = _time_rank_lists(engine, codes, [[dur[o.stage][o.kind] for o in lst] for lst in co.ranks], None)
    if any(n < len(lst) for n, lst in zip(done, co.ranks)):
        simulate(co, Costs())  # raises, naming the cycle
    end, S = engine.end, engine.num_stages
    f_base, b_base = F_CODE * S, B_CODE * S

    def t_end(mk: MessageKey) -> float:
        return end[((f_base if mk[0] == "F" else b_base) + mk[1]) * m + mk[2]]

    return t_end


def _place_rank(r: int, mine: dict[int, list[tuple[MessageKey, bool, int, int, bool]]], headers: bool,
                lookahead: int, out: RankIssue) -> None:
    """Rank ``r``'s groups: one gap per round it takes part in (module docstring);
    ``mine[round]`` lists the rank's ``(message, send?, peer, gap, header?)`` of that round
    (the gap of the send, or of the receive's consumer; whether the message carries a
    header; ``headers``: whether any does).

    One pass per round for its bounds, then one for its groups; the ``Xfer``s and ``Group``s
    are made by :func:`_xfer` and :func:`_group` (their fields set directly: the frozen
    dataclasses' ``__init__`` was a third of this function's time at p = 64, m = 512)."""
    rs = sorted(mine)
    # Bounds per round: a send fixes the gap (its first send's); receives cap it at their earliest consumer.
    fixed: list[int | None] = []
    hi: list[float] = []
    for t in rs:
        f: int | None = None
        h = math.inf
        for _, s, _, g, _ in mine[t]:
            if s:
                if f is None:
                    f = g
            elif g < h:
                h = g
        fixed.append(f)
        hi.append(h)
    # Upper bound of a receive-only round: no later than any later round before the next send.
    upper = [0.0] * len(rs)
    nxt = math.inf
    for i in range(len(rs) - 1, -1, -1):
        nxt = min(hi[i], nxt) if fixed[i] is None else fixed[i]
        upper[i] = nxt if fixed[i] is None else fixed[i]
    prev = 0
    at = out.at
    for i, t in enumerate(rs):
        gap = fixed[i]
        if gap is not None:
            if gap > hi[i] or gap < prev:
                raise ScheduleError(f"rank {r}: no consistent point-to-point order at round {t} "
                                    f"(send gap {gap}, earliest consumer {hi[i]}, previous gap {prev})")
        else:
            cap = min(upper[i], hi[i])
            if cap < prev:
                raise ScheduleError(f"rank {r}: no consistent point-to-point order at round {t} "
                                    f"(receives due by gap {cap}, previous gap {prev})")
            gap = int(max(prev, min(cap, hi[i] - lookahead)))
        prev = gap
        xs = mine[t]
        if len(xs) > 1:
            xs = sorted(xs)  # by message: the same order on both ends (rule 3)
        groups = at.get(gap)
        if groups is None:
            groups = at[gap] = []
        if not headers:
            groups.append(_group(t, 0, tuple([_xfer(mk, PAYLOAD, s, peer) for mk, s, peer, _, _ in xs]), ()))
            continue
        # a header sorts before its payload ("h" < "p")
        first = tuple([_xfer(mk, HEADER if h else PAYLOAD, s, peer) for mk, s, peer, _, h in xs])
        groups.append(_group(t, 0, first, ()))
        second = tuple([_xfer(mk, PAYLOAD, s, peer) for mk, s, peer, _, h in xs if h])
        if second:
            groups.append(_group(t, 1, second, tuple([x.key for x in second if not x.send])))


def _xfer(key: MessageKey, part: str, send: bool, peer: int, _new: Callable = object.__new__,
          _k: Callable = Xfer.key.__set__, _p: Callable = Xfer.part.__set__,  # type: ignore[attr-defined]
          _s: Callable = Xfer.send.__set__, _q: Callable = Xfer.peer.__set__) -> Xfer:  # type: ignore[attr-defined]
    """``Xfer(key, part, send, peer)`` without the frozen dataclass's ``__init__`` (same object)."""
    x = _new(Xfer)
    _k(x, key)
    _p(x, part)
    _s(x, send)
    _q(x, peer)
    return x


def _group(rnd: int, half: int, xfers: tuple[Xfer, ...], after: tuple[MessageKey, ...],
           _new: Callable = object.__new__, _r: Callable = Group.round.__set__,  # type: ignore[attr-defined]
           _h: Callable = Group.half.__set__, _x: Callable = Group.xfers.__set__,  # type: ignore[attr-defined]
           _a: Callable = Group.after.__set__) -> Group:  # type: ignore[attr-defined]
    """``Group(rnd, half, xfers, after)`` without the frozen dataclass's ``__init__`` (same object)."""
    g = _new(Group)
    _r(g, rnd)
    _h(g, half)
    _x(g, xfers)
    _a(g, after)
    return g
