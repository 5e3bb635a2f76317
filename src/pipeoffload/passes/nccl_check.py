"""Prove an issue plan deadlock-free under NCCL's point-to-point rules. Pure Python (no torch).

Input: an :class:`~pipeoffload.passes.issue_policy.IssuePlan` (which groups of
point-to-point ops each pipeline rank issues at which gap of its program). Output: a
:class:`NcclReport`, or :class:`~pipeoffload.errors.ScheduleError` naming what is wrong.

**The model.** Every process (pipeline rank, times data- and tensor-parallel replicas
with a :class:`MeshModel`) is a CPU that walks its program, and a set of *streams*, one
per communicator it uses:

- the CPU, at gap ``k`` (after its ``k``-th non-communication op; at the very end for
  the last gap), issues ``at[k]`` in order: before a group with ``after`` it *blocks*
  until those header receives completed; issuing is otherwise non-blocking (the group is
  enqueued on its communicator's stream). Then the markers of the gap: a ``RECV_*``
  blocks until the receive of its payload (and header) completed; a ``SEND_*`` does
  nothing. At the end of the program it blocks until all its sends completed, then runs
  the tie exchanges (each a group {send, recv} with one peer, then a wait for it), then
  waits for its data-parallel reductions;
- NCCL rule 1: the items of one stream run in issue order: an item is *active* only
  once every item issued before it on that stream completed;
- rules 2 and 4, worst case: a point-to-point group completes only when, for each of
  its ops, the group holding the matching op on the peer is active too (a send waits
  for its receive to be running, and vice versa; the ops of a group progress together;
  a wait for any op of a group waits for the group);
- rule 3: ops match by order per peer (tags ignored): checked statically — the ``n``-th
  message ``a`` sends to ``b`` must be the ``n``-th ``b`` receives from ``a``;
- a collective (TP all-reduce, DP all-reduce) completes when every member of its
  communicator has it active.

``communicators="group"``: one stream per process for all its pipeline P2P ops (NCCL's
eager init, one communicator); ``"peer"``: one stream per pair of ranks (a group with
ops to several peers is split, one batch per peer's communicator).

``send_blocks=False`` models gloo instead: a send completes when issued (buffered), a
receive when its send was issued, P2P ops do not wait for one another (no stream order)
and match by tag (rule 3 not checked).

**The guarantee.** Every process's sequence of issues and waits is fixed by the plan
(no receive from "any source", no choice), and every condition above is monotone (once
true it stays true), so the run has one maximal state whatever the timing: if the
simulation completes, every real run of the step completes, under any mix of eager and
rendezvous sends (a send that completes earlier than the worst case only lets things
happen earlier). Every stream is empty at the end of a step (each group holds a send
waited for at the end or a receive waited for by its consumer), so steps compose. If
the simulation cannot complete, the wait-for chain of the stuck state closes into a
cycle, which the error names: each rank, the op it blocks at, the op queued ahead of it
on a stream, and the peer op that is not issued or not active.

Also rejected (while the scripts are built, before simulating) (each a :class:`ScheduleError` naming rank and op): an
xfer without its match on the peer, or in another round or half; per-peer orders that
differ between the two ends (rule 3 would pair the wrong messages); a send issued before
its producer ran; a receive issued after its consumer; a group waiting for a header it
has not posted; a program message no xfer covers.

:func:`legacy_plan` builds the runtime's previous policy (receives posted ahead after
compute ops, every part its own op, header before payload) for comparison: it
deadlocks on NCCL already at 1F1B with two ranks, and passes with ``send_blocks=False``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable, Sequence

from ..errors import ParameterError, ScheduleError
from ..ir import Op, OpKind, Schedule
from .comm import MessageKey, incoming_order, message_key
from .issue_policy import HEADER, PAYLOAD, Group, IssuePlan, RankIssue, Xfer, paused_gc

__all__ = ["MeshModel", "NcclReport", "check_nccl", "legacy_plan", "NO_ROUND"]

#: The round of a group from a plan without rounds (:func:`legacy_plan`): its xfers are
#: not required to meet their match in the same round.
NO_ROUND = -1

_SEND = (OpKind.SEND_F, OpKind.SEND_B)
_RECV = (OpKind.RECV_F, OpKind.RECV_B)
_COMPUTE = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)
_PEER = itemgetter(0)
_SF, _SB, _RF, _RB = OpKind.SEND_F, OpKind.SEND_B, OpKind.RECV_F, OpKind.RECV_B

#: Item kinds: a batch of point-to-point ops, a collective.
_P2P, _COLL = 0, 1


@dataclass(frozen=True)
class MeshModel:
    """Data and tensor parallelism around the pipeline (module docstring).

    Processes are ``(pp, dp, tp)``; each ``(dp, tp)`` slice runs the same program on its
    own pipeline communicator(s).

    - TP: every compute op of a layer group in ``tp_stages`` (None: all) holds one
      blocking all-reduce over the ``tp`` processes with the same ``(pp, dp)`` (their
      tp communicator);
    - DP (``dp_reduce``): after a layer group's last W/BW of the step, a non-blocking
      all-reduce over the ``dp`` processes with the same ``(pp, tp)`` (their dp
      communicator); waited at the end of the step in issue order, after the pipeline's
      sends finished and after the tie exchange; then, on tie holders, a blocking
      all-reduce of the shared parameters (the runtime's "late" parameters);
    - ``dp_shard`` (FSDP): also a blocking all-gather on the dp communicator before a
      layer group's first compute op, and the reductions waited *before* the tie
      exchange (the runtime's order for sharded replicas).

    ``dp_order``: a hook for what-if variants: ``(pp, dp_index, stages) -> stages`` gives
    the order in which that process issues its layer groups' reductions (the runtime's
    order is ``stages``: by last W/BW in the program); None = the runtime's.
    """

    dp: int = 1
    tp: int = 1
    tp_stages: frozenset[int] | None = None
    dp_reduce: bool = True
    dp_shard: bool = False
    dp_order: Callable[[int, int, list[int]], Sequence[int]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.dp, int) and self.dp >= 1):
            raise ParameterError("mesh.dp", f"must be an integer >= 1, got {self.dp!r}")
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise ParameterError("mesh.tp", f"must be an integer >= 1, got {self.tp!r}")
        if self.tp_stages is not None:
            object.__setattr__(self, "tp_stages", frozenset(self.tp_stages))


@dataclass
class NcclReport:
    """What :func:`check_nccl` proved, and the plan's shape."""

    communicators: str
    send_blocks: bool
    processes: int  #: simulated processes: pipeline ranks × dp × tp
    rounds: int  #: the plan's rounds
    groups: int  #: P2P groups (``batch_isend_irecv`` calls) of one pipeline, all ranks
    xfers: int  #: P2P ops (message parts, each side) of one pipeline, all ranks
    max_groups_per_gap: int  #: most groups one rank issues at one gap
    max_recv_ahead: int  #: most payload receives one rank holds issued and not yet consumed
    stream_items: int  #: items enqueued on streams, all processes (P2P batches, collectives, tie exchanges)
    collectives: int  #: collective items (TP, DP), all processes
    max_in_flight: int  #: most P2P batches issued and not completed on one process, in the simulated run
    max_stream_depth: int  #: longest queue on one stream in the simulated run (issued, not completed)

    def summary(self) -> dict:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- naming
def _recv_stage(key: MessageKey) -> int:
    d, s, _ = key
    return s + 1 if d == "F" else s - 1


def _xfer_name(key: tuple, part: str, send: bool) -> str:
    d, s, j = key
    if d == "T":
        return f"tie exchange {s} {'send' if send else 'receive'}"
    name = f"{'SEND' if send else 'RECV'}_{d}(stage={s if send else _recv_stage(key)}, mb={j})"
    return name + " header" if part == HEADER else name


# ----------------------------------------------------------------------------- structure
class _Checker:
    """The static rules of one pipeline's plan (module docstring), checked group by group
    while the first slice is built, then per pair of ranks."""

    def __init__(self, plan: IssuePlan, nccl: bool) -> None:
        self.plan, self.nccl = plan, nccl
        #: (sender, receiver, at the sender?) -> [(key, part, round, half)] in issue order
        self.seq: dict[tuple[int, int, bool], list] = {}
        self.n_groups = self.n_xfers = self.max_per_gap = 0

    def begin(self, r: int, last: int, sinfo: dict, rinfo: dict, ends: tuple) -> None:
        """Rank ``r``: its last gap; per message it sends (peer, producer's gap), per
        message it receives (peer, consumer's gap); the slice's ends (:meth:`_World.ends`),
        where :meth:`group` records where each xfer sits."""
        self.r, self.last, self.sinfo, self.rinfo = r, last, sinfo, rinfo
        self.ends = ends
        self.hdr: set[MessageKey] = set()
        #: peer -> [(key, part, round, half)] the rank sends to / receives from it, in issue order
        self.by_s: dict[int, list] = {}
        self.by_r: dict[int, list] = {}
        #: payload sends and receives issued (the ends' sizes before the rank: duplicates show as a gap)
        self.n_sp = self.n_rp = 0
        self.sp0, self.rp0 = len(ends[0]), len(ends[2])

    def gap(self, k: int) -> None:
        if not 0 <= k <= self.last:
            raise ScheduleError(f"rank {self.r}: the issue plan issues at gap {k}, but the program has gaps "
                                f"0..{self.last}")

    def no_header(self, k: int, g: Group, mk: MessageKey) -> None:
        raise ScheduleError(
            f"rank {self.r}, gap {k}: a group of round {g.round} waits for the header of "
            f"{_xfer_name(mk, PAYLOAD, False)}, which the rank has not posted before it (it would wait forever)")

    def bad_part(self, x: Xfer) -> None:
        raise ScheduleError(f"rank {self.r}: {_xfer_name(x.key, PAYLOAD, x.send)}: unknown part {x.part!r}")

    def group(self, k: int, g: Group, i: int, sends_of: list[int]) -> int:
        """Check group ``g``, issued at gap ``k`` (its ``after`` aside), and list its xfers per
        peer; when ``i >= 0`` (the group is one stream item) also record where each xfer sits
        and, if it sends, append ``i`` to ``sends_of``. Return how many payload receives it
        issues. (The hot loop of the build: one pass over the group's xfers.)"""
        xs = g.xfers
        self.n_xfers += len(xs)
        n = 0
        sp, sh, rp, rh = self.ends
        rnd = g.round
        half = g.half if rnd != NO_ROUND else 0
        slot = 0
        has_send = False
        for x in xs:
            mk, part, peer = x.key, x.part, x.peer
            if part != PAYLOAD and part != HEADER:
                self.bad_part(x)
            if x.send:
                e = self.sinfo.get(mk)
                if e is None or e[0] != peer or k < e[1]:
                    self._bad(k, x, e)
                if part == PAYLOAD:
                    self.n_sp += 1
                    if i >= 0:
                        sp[mk] = (i, slot)
                elif i >= 0:
                    sh[mk] = (i, slot)
                by = self.by_s
                has_send = True
            else:
                e = self.rinfo.get(mk)
                if e is None or e[0] != peer or k > e[1]:
                    self._bad(k, x, e)
                if part == PAYLOAD:
                    n += 1
                    if i >= 0:
                        rp[mk] = (i, slot)
                else:
                    self.hdr.add(mk)
                    if i >= 0:
                        rh[mk] = (i, slot)
                by = self.by_r
            lst = by.get(peer)
            if lst is None:
                lst = by[peer] = []
            lst.append((mk, part, rnd, half))
            slot += 1
        if has_send and i >= 0:
            sends_of.append(i)
        self.n_rp += n
        return n

    def _bad(self, k: int, x: Xfer, e: tuple | None) -> None:
        r, mk, name = self.r, x.key, _xfer_name(x.key, x.part, x.send)
        if e is None or e[0] != x.peer:
            raise ScheduleError(f"rank {r}, gap {k}: {name} {'to' if x.send else 'from'} rank {x.peer}: the program "
                                f"has no such {'send' if x.send else 'receive'} on this rank")
        if x.send:
            what = ("F" if mk[0] == "F" else "B/BW") + f"(stage={mk[1]}, mb={mk[2]})"
            raise ScheduleError(f"rank {r}: {name} is issued at gap {k}, before its producer {what} ran "
                                f"(gap {e[1]}): it would send a value not computed yet")
        raise ScheduleError(f"rank {r}: {name} is issued at gap {k}, after its consumer (gap {e[1]}): "
                            "the rank would wait for it before issuing it")

    def end(self) -> None:
        """Every payload sent and received once; the rank's per-peer sequences into :attr:`seq`
        (sends by peer, then receives by peer)."""
        sp, _, rp, _ = self.ends
        n_s, n_r = len(sp) - self.sp0, len(rp) - self.rp0  # distinct payloads (the slice's other ranks have others)
        if n_s != self.n_sp or n_s != len(self.sinfo) or n_r != self.n_rp or n_r != len(self.rinfo):
            self._coverage()
        seq, r = self.seq, self.r
        for q in sorted(self.by_s):
            seq[(r, q, True)] = self.by_s[q]
        for q in sorted(self.by_r):
            seq[(q, r, False)] = self.by_r[q]

    def _coverage(self) -> None:
        """The error :meth:`end` found: a payload issued twice, or never (in issue order)."""
        r = self.r
        at = self.plan.ranks[r].at
        xs = [x for k in range(self.last + 1) for g in at.get(k, ()) for x in g.xfers if x.part == PAYLOAD]
        for send, table in ((True, self.sinfo), (False, self.rinfo)):
            cov = [x.key for x in xs if x.send == send]
            got = set(cov)
            if len(got) != len(cov):
                twice = next(mk for mk in got if cov.count(mk) > 1)
                raise ScheduleError(f"rank {r}: {_xfer_name(twice, PAYLOAD, send)} is issued twice")
            if len(got) != len(table):
                mk = next(mk for mk in table if mk not in got)
                raise ScheduleError(f"rank {r}: {_xfer_name(mk, PAYLOAD, send)} "
                                    f"{'to' if send else 'from'} rank {table[mk][0]} is never issued")
        raise AssertionError("nccl_check: coverage counts disagree with the plan")  # pragma: no cover

    def pairs(self) -> None:
        """Both ends of every pair of ranks agree (NCCL: in order, round and half too)."""
        seq = self.seq
        for (a, b, at_sender) in list(seq):
            mine = seq[(a, b, at_sender)]
            theirs = seq.get((a, b, not at_sender), [])
            if not at_sender and theirs:
                continue  # compared from the sender's side
            if self.nccl and mine == theirs:
                continue
            ks, kr = ([(x[0], x[1]) for x in lst] for lst in ((mine, theirs) if at_sender else (theirs, mine)))
            only_s, only_r = set(ks) - set(kr), set(kr) - set(ks)
            if only_s:
                mk, part = min(only_s)
                raise ScheduleError(f"rank {a}: {_xfer_name(mk, part, True)} has no matching receive on rank {b}")
            if only_r:
                mk, part = min(only_r)
                raise ScheduleError(f"rank {b}: {_xfer_name(mk, part, False)} has no matching send on rank {a}")
            if not self.nccl:
                continue
            s, t = (mine, theirs) if at_sender else (theirs, mine)
            if ks == kr:
                n = next(i for i in range(len(s)) if s[i] != t[i])
                raise ScheduleError(
                    f"{_xfer_name(s[n][0], s[n][1], True)} is in round {s[n][2]} half {s[n][3]} on rank {a} but its "
                    f"receive is in round {t[n][2]} half {t[n][3]} on rank {b}")
            n = next(i for i in range(len(ks)) if ks[i] != kr[i])
            raise ScheduleError(
                f"rank {a}'s message #{n} to rank {b} is {_xfer_name(ks[n][0], ks[n][1], True)}, but rank {b}'s "
                f"receive #{n} from rank {a} is {_xfer_name(kr[n][0], kr[n][1], False)}: NCCL matches by order per "
                "peer (tags are ignored), so the data would land in the wrong buffer")


# ----------------------------------------------------------------------------- the world
class _World:
    """Every process's CPU script and every stream item (module docstring).

    ``describe``: also record what each wait waits for (:attr:`descs`), for
    :meth:`explain`; :func:`_check` builds the world again with it only when the run is
    stuck (the run is deterministic, so it sticks at the same place)."""

    def __init__(self, plan: IssuePlan, communicators: str, send_blocks: bool, ties, tie_pattern: str,
                 mesh: MeshModel, describe: bool = False) -> None:
        self.plan, self.send_blocks, self.mesh, self.describe = plan, send_blocks, mesh, describe
        self.peer_mode = communicators == "peer"
        self.p = p = plan.program.num_ranks
        self.nslices = mesh.dp * mesh.tp
        self.P = P = p * self.nslices
        #: per process, its CPU's steps: item ``i >= 0`` issues item i; ``~i`` waits for it
        self.scripts: list[list[int]] = [[] for _ in range(P)]
        # items: parallel lists
        self.owner: list[int] = []
        self.stream: list[int] = []  # -1: none (gloo P2P)
        self.kind: list[int] = []
        self.info: list = []  # P2P: its Xfers; collective: (name, instance)
        self.partners: list = []  # P2P: per Xfer, the item of its match; collective: None
        self.streams: dict[tuple, int] = {}
        self.stream_name: list[str] = []
        #: per slice: (payload sends, header sends, payload receives, header receives), each
        #: message key -> (item, slot) of that part's xfer
        self.ends: list[tuple[dict, dict, dict, dict]] = [({}, {}, {}, {}) for _ in range(self.nslices)]
        self.descs: list[dict[int, tuple]] = [{} for _ in range(P)]  # step index -> what a wait waits for
        self._skel: dict[int, tuple] = {}
        self.inst_of: dict[tuple, int] = {}
        self.inst_items: list[list[int]] = []
        self.inst_need: list[int] = []
        self.sends_of: list[list[int]] = [[] for _ in range(P)]
        self.ties = [tuple(sorted(set(int(h) for h in g))) for g in (ties or [])]
        self.tie_pattern = tie_pattern
        self.max_ahead = 0
        checker = _Checker(plan, send_blocks)
        for sl in range(self.nslices):
            for r in range(p):
                self._build(sl, r, checker if sl == 0 else None)
        checker.pairs()
        self.groups, self.xfers, self.max_per_gap = checker.n_groups, checker.n_xfers, checker.max_per_gap
        self._match()

    # names
    def rank_name(self, G: int) -> str:
        sl, r = divmod(G, self.p)
        if self.nslices == 1:
            return f"rank {r}"
        d, t = divmod(sl, self.mesh.tp)
        return f"rank {r} (dp={d}, tp={t})"

    def _stream_id(self, key: tuple, name: str) -> int:
        s = self.streams.get(key)
        if s is None:
            s = self.streams[key] = len(self.stream_name)
            self.stream_name.append(name)
        return s

    def _collective(self, G: int, comm: tuple, name: str, label: tuple, members: int) -> int:
        ident = (comm, label)
        inst = self.inst_of.get(ident)
        if inst is None:
            inst = self.inst_of[ident] = len(self.inst_items)
            self.inst_items.append([])
            self.inst_need.append(members)
        i = len(self.owner)
        self.owner.append(G)
        self.stream.append(self._stream_id((comm[0], G), f"{comm[0]} stream"))
        self.kind.append(_COLL)
        self.info.append((name, inst))
        self.partners.append(None)
        self.inst_items[inst].append(i)
        return i

    def _skeleton(self, r: int) -> tuple:
        """Rank ``r``'s program by gaps: (last gap, receive markers per gap as (op, key),
        the program positions of its non-communication ops in order, per message it sends
        (peer, producer's gap), per message it receives (peer, consumer's gap))."""
        sk = self._skel.get(r)
        if sk is not None:
            return sk
        recvs: dict[int, list] = {}
        nc: list[int] = []
        made: dict[MessageKey, int] = {}
        rinfo: dict[MessageKey, tuple[int, int]] = {}
        send_ops = []
        F, B, BW = OpKind.F, OpKind.B, OpKind.BW
        n = 0  # non-communication ops so far: the gap
        for i, op in enumerate(self.plan.program.ranks[r]):
            kind = op.kind
            if kind is _RF:  # message_key, inline
                mk = ("F", op.stage - 1, op.microbatch)
            elif kind is _RB:
                mk = ("B", op.stage + 1, op.microbatch)
            elif kind is _SF or kind is _SB:
                send_ops.append(op)
                continue
            else:
                nc.append(i)
                n += 1
                if kind is F:
                    made[("F", op.stage, op.microbatch)] = n
                elif kind is B or kind is BW:
                    made[("B", op.stage, op.microbatch)] = n
                continue
            lst = recvs.get(n)
            if lst is None:
                recvs[n] = [(op, mk)]
            else:
                lst.append((op, mk))
            rinfo[mk] = (op.peer, n)
        sinfo: dict[MessageKey, tuple[int, int]] = {}
        for op in send_ops:
            mk = ("F" if op.kind is _SF else "B", op.stage, op.microbatch)
            sinfo[mk] = (op.peer, made.get(mk, n + 1))
        sk = self._skel[r] = (n, recvs, nc, sinfo, rinfo)
        return sk

    def _pipe(self, G: int) -> int:
        """The stream of process ``G``'s pipeline P2P items (one communicator; -1: gloo)."""
        return -1 if not self.send_blocks else self._stream_id(("pipe", G), "pipeline stream")

    def _place(self, G: int, st: int, xs: tuple, ends: tuple) -> None:
        """Item: the xfers ``xs`` of process ``G`` on stream ``st``, issued now."""
        i = len(self.owner)
        self.owner.append(G)
        self.stream.append(st)
        self.kind.append(_P2P)
        self.info.append(xs)
        self.partners.append([0] * len(xs))
        self.scripts[G].append(i)
        if _record_ends(xs, i, ends):
            self.sends_of[G].append(i)

    def _place_group(self, G: int, xs: tuple) -> None:
        """Issue the group ``xs`` of process ``G``: one item, or one per peer's stream with
        ``communicators="peer"`` (under NCCL's rules)."""
        sl = G // self.p
        ends = self.ends[sl]
        if not (self.send_blocks and self.peer_mode):
            self._place(G, self._pipe(G), xs, ends)
            return
        by: dict[int, list] = {}
        for x in xs:
            by.setdefault(x.peer, []).append(x)
        for q in sorted(by):
            self._place(G, self._stream_id(("pipe", G, q), f"stream for {self.rank_name(sl * self.p + q)}"),
                        tuple(by[q]), ends)

    def _build(self, sl: int, r: int, check: _Checker | None) -> None:
        """Process ``(slice sl, rank r)``'s script and items; ``check`` (slice 0) checks the
        plan's static rules on the way."""
        mesh = self.mesh
        G = sl * self.p + r
        last, _, nc, sinfo, rinfo = self._skeleton(r)
        if check is not None:
            check.begin(r, last, sinfo, rinfo, self.ends[sl])
            for k in self.plan.ranks[r].at:
                check.gap(k)
        pipe = 0 if self.send_blocks and self.peer_mode else self._pipe(G)
        dp_items: list[int] = []
        coll = None
        if mesh.tp > 1 or (mesh.dp > 1 and mesh.dp_reduce):
            coll = self._mesh_steps(G, r, nc, dp_items)
        self._walk(G, r, pipe, check, coll)
        if check is not None:
            check.end()
        self._end_of_step(G, r, dp_items)

    def _walk(self, G: int, r: int, pipe: int, check: _Checker | None,
              coll: Callable[[int], None] | None) -> None:
        """Process ``G``'s program gap by gap: its groups (:meth:`_Checker.group` on the
        first slice), its receive markers' waits, its collectives (``coll(k)``, with a mesh)."""
        at = self.plan.ranks[r].at
        last, recvs_at = self._skeleton(r)[:2]
        script = self.scripts[G]
        sa = script.append
        desc = self.descs[G] if self.describe else None
        ends = self.ends[G // self.p]
        rp, rh = ends[2], ends[3]
        owner_a, stream_a, kind_a, info_a, partners_a = (self.owner.append, self.stream.append, self.kind.append,
                                                         self.info.append, self.partners.append)
        sends_of = self.sends_of[G]
        split = self.send_blocks and self.peer_mode
        chk = check is not None
        hdr = check.hdr if chk else None
        held = 0  # payload receives issued and not consumed yet
        for k in range(last + 1):
            groups = at.get(k)
            if groups:
                if chk:
                    check.n_groups += len(groups)
                    if len(groups) > check.max_per_gap:
                        check.max_per_gap = len(groups)
                for g in groups:
                    for mk in g.after:
                        if chk and mk not in hdr:
                            check.no_header(k, g, mk)
                        if desc is not None:
                            desc[len(script)] = ("after", g, mk, k)
                        sa(~rh[mk][0])
                    if split:
                        if chk:
                            held += check.group(k, g, -1, sends_of)
                        self._place_group(G, g.xfers)
                        continue
                    i = len(self.owner)
                    xs = g.xfers
                    owner_a(G)
                    stream_a(pipe)
                    kind_a(_P2P)
                    info_a(xs)
                    partners_a([0] * len(xs))
                    sa(i)
                    if chk:
                        held += check.group(k, g, i, sends_of)
                    elif _record_ends(xs, i, ends):
                        sends_of.append(i)
                if chk and held > self.max_ahead:
                    self.max_ahead = held
            rs = recvs_at.get(k)
            if rs:
                for op, mk in rs:
                    h = rh.get(mk)
                    if h is not None:
                        if desc is not None:
                            desc[len(script)] = ("recv", op, HEADER)
                        sa(~h[0])
                    e = rp.get(mk)
                    if e is None:
                        raise ScheduleError(f"rank {r}: {_xfer_name(mk, PAYLOAD, False)} is not issued by gap {k}, "
                                            "its consumer's: the rank would wait for it before issuing it")
                    if desc is not None:
                        desc[len(script)] = ("recv", op, PAYLOAD)
                    sa(~e[0])
                held -= len(rs)
            if coll is not None and k != last:
                coll(k)

    def _mesh_steps(self, G: int, r: int, nc: list[int], dp_items: list[int]) -> Callable[[int], None]:
        """With a mesh: the collectives of process ``G`` at each gap ``k`` (after its ``k``-th
        non-communication op), as a function of ``k`` that issues them; the DP reductions
        it issues are appended to ``dp_items`` (waited at the end of the step)."""
        mesh = self.mesh
        d, t = divmod(G // self.p, mesh.tp)
        ops = self.plan.program.ranks[r]
        script, desc = self.scripts[G], self.descs[G]
        sa = script.append
        dp_at: dict[int, int] = {}
        dp_first: dict[int, int] = {}
        if mesh.dp > 1 and mesh.dp_reduce:
            last_w: dict[int, int] = {}
            first_op: dict[int, int] = {}
            for i in nc:
                op = ops[i]
                if op.kind in _COMPUTE:
                    first_op.setdefault(op.stage, i)
                if op.kind is OpKind.W or op.kind is OpKind.BW:
                    last_w[op.stage] = i
            stages = sorted(last_w, key=last_w.__getitem__)
            order = list(mesh.dp_order(r, d, list(stages))) if mesh.dp_order is not None else stages
            if sorted(order) != sorted(stages):
                raise ParameterError("mesh.dp_order", f"must return a permutation of {stages}, got {order}")
            dp_at = {last_w[s]: s2 for s, s2 in zip(stages, order)}
            if mesh.dp_shard:
                dp_first = {i: s for s, i in first_op.items()}
        dp_comm = ("dp", r, t)
        tp_stages = mesh.tp_stages

        def blocking(c: int, op: Op) -> None:
            sa(c)
            if self.describe:
                desc[len(script)] = ("coll", op)
            sa(~c)

        def at_gap(k: int) -> None:
            i = nc[k]
            op = ops[i]
            kind_ = op.kind
            if i in dp_first:
                s = dp_first[i]
                blocking(self._collective(G, dp_comm, f"FSDP all-gather of layer group {s}", ("ag", s), mesh.dp), op)
            if mesh.tp > 1 and kind_ in _COMPUTE and (tp_stages is None or op.stage in tp_stages):
                blocking(self._collective(G, ("tp", r, d), f"TP all-reduce in {kind_.value}(stage={op.stage}, "
                                          f"mb={op.microbatch})", (kind_, op.stage, op.microbatch), mesh.tp), op)
            if i in dp_at:
                s = dp_at[i]
                c = self._collective(G, dp_comm, f"DP reduction of layer group {s}", ("ar", s), mesh.dp)
                sa(c)
                dp_items.append(c)

        return at_gap

    def _end_of_step(self, G: int, r: int, dp_items: list[int]) -> None:
        """The end of process ``G``'s step: wait for its sends, then the tie exchanges and the
        DP reductions in the runtime's order."""
        mesh, p = self.mesh, self.p
        base = G - r
        script, desc = self.scripts[G], self.descs[G] if self.describe else None
        sa = script.append
        for i in list(self.sends_of[G]):
            if desc is not None:
                desc[len(script)] = ("sends", i)
            sa(~i)

        def dp_wait() -> None:
            for c in dp_items:
                if desc is not None:
                    desc[len(script)] = ("dp", c)
                sa(~c)

        if mesh.dp_shard:
            dp_wait()
        holds_tie = False
        for gi, holders in enumerate(self.ties):
            if r not in holders or len(holders) < 2:
                continue
            holds_tie = True
            if self.tie_pattern == "star":
                peers = list(holders[1:]) if r == holders[0] else [holders[0]]
            else:
                peers = [q for q in holders if q != r]
            for q in peers:
                n0 = len(script)
                self._place_group(G, (Xfer(("T", gi, r * p + q), PAYLOAD, True, q),
                                      Xfer(("T", gi, q * p + r), PAYLOAD, False, q)))
                for it in script[n0:]:
                    if desc is not None:
                        desc[len(script)] = ("tie", gi, base + q)
                    sa(~it)
        if not mesh.dp_shard:
            dp_wait()
        if mesh.dp > 1 and mesh.dp_reduce and holds_tie:
            c = self._collective(G, ("dp", r, (G // p) % mesh.tp), "DP reduction of the shared parameters",
                                 ("late",), mesh.dp)
            sa(c)
            if desc is not None:
                desc[len(script)] = ("dp", c)
            sa(~c)

    def _match(self) -> None:
        """Each P2P op's match: the same message part (the checker proved the per-peer
        orders equal, so this is also NCCL's match by order)."""
        partners = self.partners
        for sp, sh, rp, rh in self.ends:
            for sends, recvs in ((sp, rp), (sh, rh)):
                for key, (i, si) in sends.items():
                    j, sj = recvs[key]
                    partners[i][si] = j
                    partners[j][sj] = i

    # ------------------------------------------------------------------ simulation
    def run(self) -> tuple[list[int], int, int]:
        """Simulate; return (position per process, max in flight, max stream depth)."""
        kind, owner, stream, info, partners = self.kind, self.owner, self.stream, self.info, self.partners
        n_items = len(owner)
        if self.send_blocks:
            notify = partners
            pending = [0 if x is None else len(x) for x in partners]
        else:  # a receive waits for its send to be issued; a send for nothing
            notify = [None if xs is None else [j for x, j in zip(info[i], xs) if x.send]
                      for i, xs in enumerate(partners)]
            pending = [0 if xs is None else sum(1 for x in info[i] if not x.send) for i, xs in enumerate(partners)]
        inst_need = list(self.inst_need)
        inst_items = self.inst_items
        activated = bytearray(n_items)
        issued = bytearray(n_items)
        done = bytearray(n_items)
        nstreams = len(self.stream_name)
        queue: list[list[int]] = [[] for _ in range(nstreams)]
        head = [0] * nstreams
        P = self.P
        pos = [0] * P
        waiting = [-1] * P
        in_flight = [0] * P
        max_fl = max_depth = 0
        ready = list(range(P - 1, -1, -1))
        scripts = self.scripts
        while ready:
            g = ready.pop()
            steps = scripts[g]
            i = pos[g]
            ns = len(steps)
            while i < ns:
                it = steps[i]
                i += 1
                if it < 0:
                    it = ~it
                    if not done[it]:
                        waiting[g] = it
                        i -= 1
                        break
                    continue
                issued[it] = 1
                if kind[it] == _P2P:
                    fl = in_flight[g] = in_flight[g] + 1
                    if fl > max_fl:
                        max_fl = fl
                s = stream[it]
                if s >= 0:
                    q = queue[s]
                    q.append(it)
                    depth = len(q) - head[s]
                    if depth > max_depth:
                        max_depth = depth
                    if depth != 1:
                        continue
                stack = [it]
                while stack:  # activate, and complete what that completes
                    a = stack.pop()
                    activated[a] = 1
                    if kind[a] == _P2P:
                        fin = []
                        for j in notify[a]:
                            pj = pending[j] = pending[j] - 1
                            if pj == 0 and activated[j] and not done[j]:
                                fin.append(j)
                        if pending[a] == 0:
                            fin.append(a)
                    else:
                        inst = info[a][1]
                        inst_need[inst] -= 1
                        fin = inst_items[inst] if inst_need[inst] == 0 else ()
                    for j in fin:
                        done[j] = 1
                        o = owner[j]
                        if kind[j] == _P2P:
                            in_flight[o] -= 1
                        if waiting[o] == j:
                            waiting[o] = -1
                            ready.append(o)
                        s2 = stream[j]
                        if s2 >= 0:
                            h = head[s2] = head[s2] + 1
                            q2 = queue[s2]
                            if h < len(q2):
                                stack.append(q2[h])
            pos[g] = i
        self.issued, self.activated, self.done = issued, activated, done
        self.queue, self.head, self.pending = queue, head, pending
        return pos, max_fl, max_depth

    # ------------------------------------------------------------------ diagnosis
    def _item_name(self, i: int) -> str:
        if self.kind[i] == _COLL:
            return self.info[i][0]
        xs = self.info[i]
        names = [_xfer_name(x.key, x.part, x.send) for x in xs[:4]]
        more = f" and {len(xs) - 4} more" if len(xs) > 4 else ""
        return names[0] if len(names) == 1 else "the group {" + ", ".join(names) + more + "}"

    def _members(self, inst: int) -> list[int]:
        comm, _ = next(ident for ident, n in self.inst_of.items() if n == inst)
        p, tp = self.p, self.mesh.tp
        if comm[0] == "tp":
            r, d = comm[1], comm[2]
            return [(d * tp + t) * p + r for t in range(tp)]
        r, t = comm[1], comm[2]
        return [(d * tp + t) * p + r for d in range(self.mesh.dp)]

    def _clause(self, i: int) -> tuple[str, tuple]:
        """Why item ``i`` (just named) has not completed: (a clause continuing the
        sentence that named it, the node it waits for)."""
        g = self.owner[i]
        if not self.issued[i]:
            return ", not issued: ", ("cpu", g)
        s = self.stream[i]
        if s >= 0 and not self.activated[i]:
            h = self.queue[s][self.head[s]]
            return (f", queued behind {self._item_name(h)} on {self.rank_name(g)}'s {self.stream_name[s]}",
                    ("item", h))
        if self.kind[i] == _COLL:
            inst = self.info[i][1]
            for j in self.inst_items[inst]:
                if not self.activated[j]:
                    return f", which waits for {self.rank_name(self.owner[j])}'s {self._item_name(j)}", ("item", j)
            have = {self.owner[j] for j in self.inst_items[inst]}
            missing = next(G for G in self._members(inst) if G not in have)
            return (f", which waits for {self.rank_name(missing)}, which has not issued it: ",
                    ("cpu", missing))
        base = g - g % self.p
        for x, j in zip(self.info[i], self.partners[i]):
            if not self.activated[j] and (self.send_blocks or not x.send):  # gloo: only receives wait
                return (f", which waits for {self.rank_name(base + x.peer)}'s matching "
                        f"{'receive' if x.send else 'send'} {_xfer_name(x.key, x.part, not x.send)}", ("item", j))
        return ", which never completes: ", ("cpu", g)

    def _what(self, what: tuple) -> str:
        tag = what[0]
        if tag == "recv":
            op = what[1]
            s = f"{op.kind.value}(stage={op.stage}, mb={op.microbatch})"
            return s + " (for its header)" if what[2] == HEADER else s
        if tag == "after":
            g, k = what[1], what[3]
            grp = f"round {g.round}'s payload group" if g.round != NO_ROUND else \
                ", ".join(_xfer_name(x.key, x.part, x.send) for x in g.xfers)
            return f"gap {k}, before issuing {grp} (it waits for the header first)"
        if tag == "sends":
            return "the end of the step, for its send"
        if tag == "coll":
            op = what[1]
            return f"{op.kind.value}(stage={op.stage}, mb={op.microbatch})"
        if tag == "tie":
            return f"the tie exchange {what[1]} with {self.rank_name(what[2])}"
        if tag == "dp":
            return f"the end of the step, for its {self.info[what[1]][0]}"
        return str(what)

    def _cpu_text(self, G: int, pos: list[int]) -> tuple[str, tuple]:
        i = ~self.scripts[G][pos[G]]
        what = self.descs[G][pos[G]]
        clause, nxt = self._clause(i)
        role = "receive" if what[0] in ("recv", "after") else \
            "send" if what[0] == "sends" else "collective" if self.kind[i] == _COLL else "exchange"
        if clause.startswith(", which "):
            clause = " " + clause[len(", which "):]
        elif clause.startswith(", queued"):
            clause = " is" + clause[1:]
        elif nxt == ("cpu", G):
            clause = " is issued only later by this rank"
        else:
            clause = " is" + clause[1:]
        return f"{self.rank_name(G)} blocks at {self._what(what)}: its {role} {self._item_name(i)}{clause}", nxt

    def explain(self, pos: list[int]) -> str:
        """The wait-for chain of a stuck run, in words, from the first stuck process
        until it closes into a cycle."""
        stuck = [G for G in range(len(self.scripts)) if pos[G] < len(self.scripts[G])]
        node: tuple = ("cpu", stuck[0])
        seen: dict[tuple, int] = {}
        nodes: list[tuple] = []
        text = ""
        while node not in seen:
            seen[node] = len(nodes)
            nodes.append(node)
            if node[0] == "cpu":
                t, node = self._cpu_text(node[1], pos)
            else:
                t, node = self._clause(node[1])
            text += t
        cycle = nodes[seen[node]:]
        ranks = sorted({c[1] if c[0] == "cpu" else self.owner[c[1]] for c in cycle})
        names = [self.rank_name(G) for G in ranks]
        through = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        if text.endswith(": "):
            text += f"{self.rank_name(node[1])}, blocked as above"
        text += f" — a cycle through {through}"
        involved = {c[1] if c[0] == "cpu" else self.owner[c[1]] for c in nodes}
        others = [G for G in stuck if G not in involved]
        if others:
            listed = "; ".join(f"{self.rank_name(G)} at {self._what(self.descs[G][pos[G]])}" for G in others[:6])
            text += f". Also stuck: {listed}" + (f" and {len(others) - 6} more" if len(others) > 6 else "")
        return text


# ----------------------------------------------------------------------------- the check
def check_nccl(
    plan: IssuePlan,
    *,
    communicators: str = "group",
    ties: Sequence[Sequence[int]] | None = None,
    tie_pattern: str = "all",
    mesh: MeshModel | None = None,
    send_blocks: bool = True,
) -> NcclReport:
    """Prove ``plan`` completes under NCCL's point-to-point rules (module docstring).

    Args:
        plan: what :func:`~pipeoffload.passes.issue_policy.issue_plan` returned (or
            :func:`legacy_plan`).
        communicators: ``"group"`` (one communicator, one stream, per process for all
            its pipeline P2P ops) or ``"peer"`` (one per pair of ranks).
        ties: tie groups, each the pipeline ranks holding a copy of a shared parameter;
            exchanged at the end of the step in index order, each holder with each other
            holder in increasing order (``tie_pattern="all"``) or holders[0] with each
            other holder (``"star"``: the start check), one group {send, recv} each.
        mesh: data/tensor parallelism around the pipeline (:class:`MeshModel`); None:
            the pipeline alone.
        send_blocks: True: NCCL (worst case: a send waits for its receive to run).
            False: gloo (sends buffered, no stream order, matching by tag).

    Returns: an :class:`NcclReport`.

    Raises: ScheduleError for a structural error (module docstring) or when the plan
    cannot complete, naming the cycle of waits; ParameterError for bad arguments.

    Cost: linear in the plan's ops and groups times ``dp × tp`` (each item is enqueued,
    activated and completed once); about a second for 1F1B at p=64, m=512.
    """
    if communicators not in ("group", "peer"):
        raise ParameterError("communicators", f"must be \"group\" or \"peer\", got {communicators!r}")
    if tie_pattern not in ("all", "star"):
        raise ParameterError("tie_pattern", f"must be \"all\" or \"star\", got {tie_pattern!r}")
    mesh = mesh or MeshModel()
    p = plan.program.num_ranks
    for gi, holders in enumerate(ties or []):
        bad = [h for h in holders if not (isinstance(h, int) and 0 <= h < p)]
        if bad:
            raise ParameterError("ties", f"tie group {gi} names ranks {bad}; valid ranks are 0..{p - 1}")
    # The simulation allocates a few objects per op and frees none until it returns: the
    # cyclic garbage collector would rescan them again and again (about half the time).
    with paused_gc():
        return _check(plan, communicators, send_blocks, ties, tie_pattern, mesh)


def _check(plan: IssuePlan, communicators: str, send_blocks: bool, ties, tie_pattern: str,
           mesh: MeshModel) -> NcclReport:
    world = _World(plan, communicators, send_blocks, ties, tie_pattern, mesh)
    pos, max_fl, max_depth = world.run()
    if any(pos[G] < len(world.scripts[G]) for G in range(len(pos))):
        world = _World(plan, communicators, send_blocks, ties, tie_pattern, mesh, describe=True)
        pos, max_fl, max_depth = world.run()  # the same run, now with what each wait waits for
        how = f"communicators={communicators!r}" if send_blocks else "gloo semantics"
        raise ScheduleError(f"deadlock under NCCL's point-to-point rules ({how}): " + world.explain(pos))
    return NcclReport(
        communicators=communicators,
        send_blocks=send_blocks,
        processes=len(world.scripts),
        rounds=plan.num_rounds,
        groups=world.groups,
        xfers=world.xfers,
        max_groups_per_gap=world.max_per_gap,
        max_recv_ahead=world.max_ahead,
        stream_items=len(world.stream) - world.stream.count(-1),  # -1: no stream (gloo P2P)
        collectives=world.kind.count(_COLL),
        max_in_flight=max_fl,
        max_stream_depth=max_depth,
    )


# ----------------------------------------------------------------------------- the old policy
def legacy_plan(program: Schedule, *, lookahead: int = 2, headers: bool = True) -> IssuePlan:
    """The runtime's previous issue policy as an :class:`IssuePlan` (for comparisons).

    Every part of every message is its own group (one ``isend``/``irecv`` each). Sends:
    at the ``SEND_*`` marker, the header (forward messages, with ``headers``) then the
    payload. Receives, in each peer's send order: after each F, B and BW op and at each
    ``RECV_*`` marker, the next ``lookahead + 1`` receive markers' messages are posted
    ahead without blocking — a gradient's payload once its forward has run on this rank
    (its shapes known), a forward message's header only (its payload needs the header's
    shapes); at the ``RECV_*`` marker the rank then waits for the headers and posts the
    payloads up to the message it consumes (``after``). A payload posted opportunistically
    by the old runtime when its header happened to have arrived is posted at the consumer
    here: the static, timing-free reading of the same policy.

    The groups have round :data:`NO_ROUND`.
    """
    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    ranks: list[RankIssue] = []
    for r, lst in enumerate(program.ranks):
        order = incoming_order(program, r)
        index = {mk: (peer, i) for peer, keys in order.items() for i, mk in enumerate(keys)}
        posted = {peer: 0 for peer in order}
        hdr_posted: set[MessageKey] = set()
        fwd_done: set[tuple[int, int]] = set()
        recv_pos = [i for i, op in enumerate(lst) if op.kind in _RECV]
        ri = RankIssue()
        at = ri.at

        def emit(k: int, x: Xfer, after: tuple = ()) -> None:
            at.setdefault(k, []).append(Group(NO_ROUND, 1 if after else 0, (x,), after))

        def post_upto(k: int, peer: int, upto: int, blocking: bool) -> None:
            while posted[peer] <= upto:
                mk = order[peer][posted[peer]]
                if mk[0] == "B":
                    if (mk[1] - 1, mk[2]) not in fwd_done:
                        if blocking:
                            raise ScheduleError(f"rank {r}: gradient {mk} consumed before its forward ran")
                        return
                    emit(k, Xfer(mk, PAYLOAD, False, peer))
                elif headers:
                    if mk not in hdr_posted:
                        hdr_posted.add(mk)
                        emit(k, Xfer(mk, HEADER, False, peer))
                    if not blocking:
                        return
                    emit(k, Xfer(mk, PAYLOAD, False, peer), (mk,))
                else:
                    emit(k, Xfer(mk, PAYLOAD, False, peer))
                posted[peer] += 1

        def post_ahead(k: int, i: int) -> None:
            j = bisect.bisect_left(recv_pos, i)
            for q in recv_pos[j:j + lookahead + 1]:
                peer, idx = index[message_key(lst[q])]
                post_upto(k, peer, idx, False)

        k = 0
        for i, op in enumerate(lst):
            kind = op.kind
            if kind in _SEND:
                mk = message_key(op)
                if mk[0] == "F" and headers:
                    emit(k, Xfer(mk, HEADER, True, op.peer))
                emit(k, Xfer(mk, PAYLOAD, True, op.peer))
            elif kind in _RECV:
                post_ahead(k, i)
                peer, idx = index[message_key(op)]
                post_upto(k, peer, idx, True)
            else:
                k += 1
                if kind is OpKind.F:
                    fwd_done.add((op.stage, op.microbatch))
                if kind in (OpKind.F, OpKind.B, OpKind.BW):
                    post_ahead(k, i + 1)
        ri.gap_of = _gaps(lst)
        ranks.append(ri)
    hdr = frozenset(message_key(o) for lst in program.ranks for o in lst if o.kind is OpKind.SEND_F)
    return IssuePlan(program, ranks, {}, hdr if headers else frozenset(), 0)


def _gaps(lst: list[Op]) -> list[int]:
    out, k = [], 0
    for op in lst:
        out.append(k)
        if op.kind not in _SEND and op.kind not in _RECV:
            k += 1
    out.append(k)
    return out


def _record_ends(xs: tuple, i: int, ends: tuple[dict, dict, dict, dict]) -> bool:
    """Record where each xfer of stream item ``i`` sits (its ``(item, slot)``) in the
    slice's ``ends`` (:attr:`_World.ends`); True when the item sends anything."""
    sp, sh, rp, rh = ends
    has_send = False
    for slot, x in enumerate(xs):
        if x.send:
            (sp if x.part == PAYLOAD else sh)[x.key] = (i, slot)
            has_send = True
        else:
            (rp if x.part == PAYLOAD else rh)[x.key] = (i, slot)
    return has_send
