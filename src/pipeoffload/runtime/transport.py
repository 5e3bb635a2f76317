"""How point-to-point groups reach the wire: torch's own ``batch_isend_irecv``, or an
emulation of NCCL's point-to-point rules over gloo, for tests on CPU machines.

NCCL's P2P contract, which the runtime must survive and gloo forgives entirely:

1. The P2P ops of one communicator run **in issue order on one stream**: an op (or a
   group) starts only when the op or group issued before it on that communicator has
   finished.
2. A **send may block until its matching receive is running** (started on the peer).
3. Matching is **by order per peer**; tags are ignored.
4. Ops issued together in one ``batch_isend_irecv`` (``ncclGroupStart/End``)
   **progress together**: a send and a receive that cross must be in one group.

:class:`TorchTransport` is the real thing. :class:`NcclRulesTransport` enforces rules
1-4 on gloo, so a program that would hang on NCCL hangs here too and ends with a
timeout error naming the rank, the op, the peer and the rule:

- Each emulated communicator is a FIFO of groups served by one daemon thread (its
  "stream"): ``nccl-rules`` has one for the whole pipeline group (torch's
  ``batch_isend_irecv`` on NCCL always runs on the group's communicator),
  ``nccl-rules-peer`` one per peer (bare ``isend``/``irecv`` on NCCL with lazy
  initialisation get a two-rank communicator per pair). ``issue`` only enqueues.
- A group starts when the one before it in its FIFO finished (rule 1). Then every
  receive of the group publishes a clear-to-send (CTS, carrying its byte count) in the
  c10d store, and every send waits for the CTS of the peer's matching receive before
  it publishes its own header (its byte count) and moves its data (rule 2, the worst
  case). All ops of a group do this together (rule 4): the thread polls the whole
  group's handshakes and posts each op's data as soon as its handshake is done.
- The k-th send from A to B matches B's k-th receive from A whatever the tags
  (rule 3): handshake keys and the gloo tag of the data are that sequence number.
  A size mismatch is reported on both sides, before any data moves.
- The data moves on a dedicated gloo process group over the pipeline group's members
  (never the group the main thread runs collectives on). It is built directly on the
  default store under a prefix unique to the member set and to how many emulators
  this process built over it before, so only the members take part, in any DP x PP
  mesh, and no process-group name can collide.
- Every wait has the timeout, counted from when the group starts; a group that
  cannot finish fails its works with a message naming the rank, the op, the peer and
  what it waited for. A failed communicator stays failed (like an NCCL communicator
  after a timeout): later groups fail at once, citing rule 1 and the first failure.
"""

from __future__ import annotations

import collections
import datetime
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch
import torch.distributed as dist

from ..errors import ParameterError

#: The environment variable that picks the transport when no mode is passed.
ENV_VAR = "PIPEOFFLOAD_P2P"
#: Valid transport modes, the default first.
MODES = ("torch", "nccl-rules", "nccl-rules-peer")


@dataclass(frozen=True)
class P2PSpec:
    """One send or receive of a group."""

    send: bool  #: True: send ``tensor`` to ``peer``; False: receive into ``tensor`` from ``peer``
    tensor: torch.Tensor  #: contiguous; CPU tensors when the backend is gloo
    peer: int  #: GLOBAL rank of the peer (torch's dst/src convention)
    tag: int = 0  #: TorchTransport passes it on (gloo matches by it); NcclRulesTransport ignores it (rule 3)
    what: str = ""  #: description for error messages, e.g. "SEND_F(stage=1, mb=0, rank=0, peer=1) payload"


class Work(Protocol):
    def wait(self, timeout: datetime.timedelta) -> bool:
        """True when done; False on timeout; raises RuntimeError(text) if the op failed."""

    def is_completed(self) -> bool:
        """Whether the op finished (successfully or not), without waiting."""


class Transport:
    """Issues groups of point-to-point ops (one group = one ``batch_isend_irecv``)."""

    name: str = "transport"

    def issue(self, ops: Sequence[P2PSpec]) -> list[Work]:
        """Issue ``ops`` as ONE group; one Work per op, in the same order."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the transport holds (threads, process groups)."""


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return max(0.0, timeout.total_seconds())
    return max(0.0, float(timeout))


# ----------------------------------------------------------------------------- torch's own


class _TorchWork:
    """A torch Work behind the :class:`Work` protocol. Gloo's ``wait(timeout)`` raises
    on expiry ("Timed out waiting ... for recv operation to complete") and closes the
    pair; here that is ``False``. Gloo's ``is_completed()`` stays False until ``wait()``
    is called, however long ago the op finished (seen with torch 2.13); on NCCL it
    queries the op's CUDA event."""

    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        self.work = work

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        try:
            ok = self.work.wait() if timeout is None else self.work.wait(timeout)
        except RuntimeError as e:
            if "Timed out waiting" in str(e):
                return False
            raise
        return ok is not False

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def pending_reason(self) -> str:
        return ""


class TorchTransport(Transport):
    """``dist.batch_isend_irecv`` on ``group`` (None: the default group). On NCCL torch
    runs every batch on the group's communicator and returns one Work for the whole
    batch: each op of the group gets that Work."""

    name = "torch"

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def issue(self, ops: Sequence[P2PSpec]) -> list[Work]:
        if not ops:
            return []
        p2p = [dist.P2POp(dist.isend if o.send else dist.irecv, o.tensor, o.peer, self.group, o.tag) for o in ops]
        works = dist.batch_isend_irecv(p2p)
        if len(works) == len(ops):
            return [_TorchWork(w) for w in works]
        if len(works) == 1:  # NCCL: one Work for the coalesced group
            shared = _TorchWork(works[0])
            return [shared] * len(ops)
        raise RuntimeError(f"batch_isend_irecv returned {len(works)} works for {len(ops)} ops")


# ----------------------------------------------------------------------------- NCCL's rules on gloo

#: How many emulators this process built over each member set (the store prefix).
_BUILT: dict[tuple[int, ...], int] = {}
_BUILT_LOCK = threading.Lock()

#: The emulators' gloo groups, kept to the end of the process: tearing one down while a
#: peer still uses its end of a pair breaks that peer (see NcclRulesTransport).
_RETIRED: list = []

_POLL_MIN_S = 0.0002
_NO_TENSOR = torch.empty(0)
_POLL_MAX_S = 0.01


class _Failed(Exception):
    """A group failed; ``args[0]`` is the message for its ops."""


class _EmuWork:
    """The future of one op of :class:`NcclRulesTransport`."""

    __slots__ = ("_done", "_error", "_op", "__weakref__")

    def __init__(self, op: "_Op") -> None:
        self._done = threading.Event()
        self._error: str | None = None
        self._op: _Op | None = op

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """True when the op is done, False if ``timeout`` passed first; RuntimeError with
        the emulator's message if the op failed."""
        if not self._done.wait(_seconds(timeout)):
            return False
        if self._error is not None:
            raise RuntimeError(self._error)
        return True

    def is_completed(self) -> bool:
        """True once the op finished, successfully or not (no wait() needed)."""
        return self._done.is_set()

    def exception(self) -> str | None:
        """The failure message once failed, else None."""
        return self._error if self._done.is_set() else None

    def pending_reason(self) -> str:
        """What the op is waiting for now ("" once finished): queued behind an earlier
        group (rule 1), the peer's matching receive (rule 2) or send, or its data."""
        op = self._op
        if self._done.is_set() or op is None:
            return ""
        return op.reason()

    def _finish(self, error: str | None) -> None:
        if self._done.is_set():
            return
        self._error = error
        op, self._op = self._op, None
        if op is not None:
            op.release()
        self._done.set()


class _Op:
    """One op of a group inside the emulator."""

    __slots__ = ("spec", "seq", "flat", "nbytes", "state", "group", "work", "desc")

    def __init__(self, spec: P2PSpec, seq: int, desc: str) -> None:
        self.spec = spec
        self.seq = seq
        self.flat: torch.Tensor | None = spec.tensor.detach().reshape(-1).view(torch.uint8)
        self.nbytes = int(self.flat.numel())
        self.state = "queued"
        self.group: _Group | None = None
        self.work = _EmuWork(self)
        self.desc = desc

    def release(self) -> None:
        # Drop every reference to the user's tensor: a finished receive's buffer or send's
        # source must be freeable (and offloadable) as soon as the caller lets it go.
        self.flat = None
        self.group = None
        sp = self.spec
        self.spec = P2PSpec(sp.send, _NO_TENSOR, sp.peer, sp.tag, sp.what)

    def reason(self) -> str:
        g = self.group
        if self.state == "queued" and g is not None:
            ahead = g.stream.active
            if ahead is not None and ahead is not g:
                return (f"queued on the communicator's stream behind {ahead.describe()} "
                        "(NCCL rule 1: P2P ops of one communicator run in issue order)")
            return "queued on the communicator's stream (NCCL rule 1)"
        return self.state


class _Group:
    __slots__ = ("ops", "stream")

    def __init__(self, ops: list[_Op], stream: "_Stream") -> None:
        self.ops = ops
        self.stream = stream
        for o in ops:
            o.group = self

    def describe(self) -> str:
        pending = [o for o in self.ops if not o.work.is_completed()] or self.ops
        return "; ".join(f"{o.desc} ({o.state})" for o in pending)


class _Stream:
    """One emulated communicator: a FIFO of groups and the daemon thread serving it."""

    def __init__(self, link: "_Link", label: str) -> None:
        self.link = link
        self.label = label
        self.queue: collections.deque[_Group] = collections.deque()
        self.cv = threading.Condition()
        self.active: _Group | None = None
        self.failed: str | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name=f"pipeoffload-{label}", daemon=True)
        self.thread.start()

    def submit(self, group: _Group) -> None:
        with self.cv:
            if not self.closed:
                self.queue.append(group)
                self.cv.notify()
                return
        for o in group.ops:
            o.work._finish(f"{self.link.me_name}: {o.desc}: the transport was closed")

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def _serve(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closed:
                    self.cv.wait()
                if self.closed:
                    left, self.queue = list(self.queue), collections.deque()
                    for g in left:
                        for o in g.ops:
                            o.work._finish(f"{self.link.me_name}: {o.desc}: the transport was closed "
                                           "before the op started")
                    return
                group = self.queue.popleft()
                self.active = group
            try:
                if self.failed is not None:
                    raise _Failed(None)
                self.link.run_group(group, self)
            except _Failed as e:
                first = self.failed
                for o in group.ops:
                    if first is None:
                        msg = e.args[0]
                    else:
                        verb = "send to" if o.spec.send else "receive from"
                        msg = (f"{self.link.me_name}: {o.desc} ({verb} {self.link.name(o.spec.peer)}) never "
                               "started: an earlier op on the same communicator's stream did not complete "
                               f"(NCCL rule 1: P2P ops run in issue order). Earlier failure: {first}")
                    o.work._finish(msg)
                if first is None:
                    self.failed = e.args[0]
            except BaseException as e:  # a bug here must not leave the caller waiting forever
                msg = f"{self.link.me_name}: the NCCL-rules emulator failed: {type(e).__name__}: {e}"
                self.failed = self.failed or msg
                for o in group.ops:
                    o.work._finish(msg)
            finally:
                with self.cv:
                    self.active = None


class _Link:
    """What the streams of one :class:`NcclRulesTransport` share: the control store, the
    data process group, names, the timeout."""

    def __init__(self, store: Any, pg: Any, emu_rank: dict[int, int], me: int, names: dict[int, str],
                 timeout_s: float) -> None:
        self.store = store
        self.pg = pg
        self.emu_rank = emu_rank
        self.me = me
        self.names = names
        self.me_name = names[me]
        self.timeout_s = timeout_s
        self.closed = False

    def name(self, g: int) -> str:
        return self.names.get(g, f"global rank {g}")

    def _keys(self, op: _Op) -> tuple[str, str]:
        """(the key this rank writes, the key it waits for) of ``op``'s handshake:
        ``c<src>_<dst>_<k>`` is the receiver's clear-to-send, ``h...`` the sender's header."""
        if op.spec.send:
            src, dst = self.me, op.spec.peer
            return f"h{src}_{dst}_{op.seq}", f"c{src}_{dst}_{op.seq}"
        src, dst = op.spec.peer, self.me
        return f"c{src}_{dst}_{op.seq}", f"h{src}_{dst}_{op.seq}"

    def run_group(self, group: _Group, stream: _Stream) -> None:
        """Rules 2-4 for one started group: handshakes of all its ops together, each op's
        data posted once its handshake is done, then wait for the data."""
        store, t = self.store, self.timeout_s
        deadline = time.monotonic() + t
        ops = group.ops
        for o in ops:
            peer = self.name(o.spec.peer)
            if o.spec.send:
                o.state = (f"waiting for {peer}'s matching receive to start (NCCL rule 2: a send may block "
                           "until its receive is running)")
            else:
                store.set(self._keys(o)[0], str(o.nbytes))  # clear to send
                o.state = f"waiting for {peer}'s matching send to start (this receive is running)"
        pending, posted, errors = list(ops), [], {}
        delay = _POLL_MIN_S
        try:
            while pending:
                if self.closed:
                    raise _Failed(f"{self.me_name}: {pending[0].desc}: the transport was closed")
                moved = False
                for o in list(pending):
                    mine, theirs = self._keys(o)
                    if not store.check([theirs]):
                        continue
                    n = int(store.get(theirs))
                    store.delete_key(theirs)
                    pending.remove(o)
                    moved = True
                    if o.spec.send:
                        store.set(mine, str(o.nbytes))  # header: the receiver checks the size too
                    if n != o.nbytes:
                        errors[o] = self._mismatch(o, n)
                        o.state = "failed: size mismatch"
                        continue
                    o.state = f"moving its data {'to' if o.spec.send else 'from'} {self.name(o.spec.peer)}"
                    if o.nbytes:
                        peer = self.emu_rank[o.spec.peer]
                        tag = o.seq & 0x3FFFFFFF
                        w = self.pg.send([o.flat], peer, tag) if o.spec.send else self.pg.recv([o.flat], peer, tag)
                        posted.append((o, w))
                if moved:
                    delay = _POLL_MIN_S
                    continue
                if time.monotonic() > deadline:
                    raise _Failed(self._timed_out(pending, t))
                time.sleep(delay)
                delay = min(2 * delay, _POLL_MAX_S)
        finally:  # the data of the ops whose handshake was done is in flight: see it through
            for o, w in posted:
                try:
                    w.wait(datetime.timedelta(seconds=max(t, 1.0)))
                except RuntimeError as e:
                    errors.setdefault(o, f"{self.me_name}: {o.desc}: gloo failed moving the data "
                                         f"{'to' if o.spec.send else 'from'} {self.name(o.spec.peer)}: "
                                         f"{str(e).splitlines()[0][:300]}")
        # gloo's works hold the user's tensors: drop them before the caller is woken, so a
        # finished receive's buffer is referenced by the caller alone (the offload store
        # moves only tensors nothing else holds).
        posted.clear()
        w = None  # noqa: F841
        if errors:
            first = next(iter(errors.values()))
            for o in ops:
                o.work._finish(errors.get(o, f"{self.me_name}: {o.desc}: its group failed: {first}"))
            raise _Failed(first)
        for o in ops:
            o.work._finish(None)

    def _mismatch(self, op: _Op, theirs: int) -> str:
        peer = self.name(op.spec.peer)
        if op.spec.send:
            return (f"{self.me_name}: {op.desc}: size mismatch: this send has {op.nbytes} bytes but the receive "
                    f"of {peer} it matches expects {theirs} bytes (NCCL rule 3: sends and receives match by "
                    f"their order between the two ranks, tags are ignored; this is send #{op.seq} to {peer})")
        return (f"{self.me_name}: {op.desc}: size mismatch: this receive expects {op.nbytes} bytes but the send "
                f"of {peer} it matches has {theirs} bytes (NCCL rule 3: sends and receives match by their "
                f"order between the two ranks, tags are ignored; this is receive #{op.seq} from {peer})")

    def _timed_out(self, pending: list[_Op], t: float) -> str:
        parts = []
        for o in pending:
            peer = self.name(o.spec.peer)
            if o.spec.send:
                parts.append(f"{o.desc} waited for {peer}'s matching receive to start (NCCL rule 2: a send may "
                             f"block until its receive is running; on {peer} that receive is not issued yet, or "
                             "is queued behind an op that cannot finish, rule 1)")
            else:
                parts.append(f"{o.desc} waited for {peer}'s matching send to start (this receive was running; on "
                             f"{peer} that send is not issued yet, or is queued behind an op that cannot finish, "
                             "rule 1)")
        return f"{self.me_name}: timed out after {t:g} s under NCCL rules: " + "; ".join(parts)


def _members(group: Any, ranks: list[int] | None) -> list[int]:
    """Global ranks of the pipeline group, sorted."""
    if ranks is not None:
        return sorted(int(r) for r in ranks)
    if group is None or group is dist.GroupMember.WORLD:
        return list(range(dist.get_world_size()))
    return sorted(dist.get_process_group_ranks(group))


class NcclRulesTransport(Transport):
    """NCCL's P2P rules 1-4 emulated over gloo (module docstring). ``rank``: this
    process's pipeline rank (for messages); ``ranks[i]``: global rank of pipeline rank
    i (None: pipeline ranks are global ranks); ``per_peer``: one communicator per peer
    instead of one for the group.

    Building one is a collective over the pipeline group's members (and only them):
    every member builds its emulators over the same member set in the same order.
    Tensors must be contiguous CPU tensors (stage CUDA tensors to the host first)."""

    def __init__(self, group: Any, rank: int, ranks: list[int] | None, timeout_s: float,
                 per_peer: bool = False) -> None:
        if not dist.is_initialized():
            raise RuntimeError("NcclRulesTransport needs an initialised process group")
        self.name = "nccl-rules-peer" if per_peer else "nccl-rules"
        self.per_peer = bool(per_peer)
        self.rank = rank
        self.timeout_s = float(timeout_s)
        me = dist.get_rank()
        members = _members(group, ranks)
        if me not in members:
            raise ValueError(f"global rank {me} is not a member of the pipeline group {members}")
        # Messages name pipeline ranks, as the runtime's do, with the global rank where it differs.
        if ranks is None:
            names = {g: f"rank {g}" for g in members}
        else:
            names = {int(g): f"rank {i}" if int(g) == i else f"rank {i} (global {g})" for i, g in enumerate(ranks)}
        names[me] = f"rank {rank}" if me == rank else f"rank {rank} (global {me})"
        key = tuple(members)
        with _BUILT_LOCK:
            n = _BUILT.get(key, 0)
            _BUILT[key] = n + 1
        prefix = f"pipeoffload/nccl-rules/{'_'.join(map(str, members))}/{n}/"
        base = dist.distributed_c10d._get_default_store()
        emu_rank = {g: i for i, g in enumerate(members)}
        # Its own gloo group over the members, outside torch's registry (no group name to
        # collide, no other rank takes part); its constructor is the rendezvous.
        setup = datetime.timedelta(seconds=max(self.timeout_s, 120.0))
        pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix + "gloo", base), emu_rank[me], len(members), setup)
        # A member returns from the constructor when its own pairs are connected, maybe
        # before its peers: one that closed its group right away broke a peer's connect
        # ("connectFullMesh failed ... Connection closed by peer", about 1 run in 3 of 60
        # builds on 4 ranks). The barrier makes the build collective; close() never
        # destroys the group either (_RETIRED keeps it to the end of the process).
        pg.barrier().wait(setup)
        _RETIRED.append(pg)
        self._link = _Link(dist.PrefixStore(prefix + "ctl", base), pg, emu_rank, me, names, self.timeout_s)
        self._streams: dict[int | None, _Stream] = {}
        self._sent: collections.Counter = collections.Counter()
        self._received: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._closed = False

    def _stream(self, peer: int | None) -> _Stream:
        s = self._streams.get(peer)
        if s is None:
            label = "nccl-rules" if peer is None else f"nccl-rules-peer{peer}"
            s = self._streams[peer] = _Stream(self._link, label)
        return s

    def _check(self, spec: P2PSpec) -> None:
        t = spec.tensor
        what = spec.what or ("send" if spec.send else "receive")
        if t.device.type != "cpu":
            raise ValueError(f"{what}: the NCCL-rules emulator moves CPU tensors over gloo; got one on {t.device} "
                             "(stage it through host memory first)")
        if not t.is_contiguous():
            raise ValueError(f"{what}: the tensor must be contiguous")
        if spec.peer == self._link.me or spec.peer not in self._link.emu_rank:
            raise ValueError(f"{what}: peer {spec.peer} must be another global rank of the pipeline group "
                             f"{sorted(self._link.emu_rank)}")

    def issue(self, ops: Sequence[P2PSpec]) -> list[Work]:
        """Enqueue ``ops`` as one group (never blocks); one Work per op."""
        for spec in ops:
            self._check(spec)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._link.me_name}: the {self.name} transport is closed")
            made = []
            for spec in ops:
                count = self._sent if spec.send else self._received
                seq = count[spec.peer]
                count[spec.peer] += 1
                verb = "send to" if spec.send else "receive from"
                desc = spec.what or f"{verb} {self._link.name(spec.peer)} ({spec.tensor.numel()} x {spec.tensor.dtype})"
                made.append(_Op(spec, seq, desc))
            by_stream: dict[int | None, list[_Op]] = {}
            for o in made:  # per peer: a group with several peers splits, each part on its peer's stream
                by_stream.setdefault(o.spec.peer if self.per_peer else None, []).append(o)
            for peer, part in by_stream.items():
                stream = self._stream(peer)
                stream.submit(_Group(part, stream))
        return [o.work for o in made]

    def close(self) -> None:
        """Stop the threads; ops not finished fail with "the transport was closed"."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._link.closed = True
            streams = list(self._streams.values())
        for s in streams:
            s.close()
        for s in streams:
            if s.thread is not threading.current_thread():
                s.thread.join(timeout=2.0)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------- choosing


def make_transport(group: Any, rank: int, ranks: list[int] | None, timeout_s: float,
                   mode: str | None = None) -> Transport:
    """The transport for ``mode`` (None: ``$PIPEOFFLOAD_P2P``, default "torch"):
    "torch" (:class:`TorchTransport`), "nccl-rules" (one emulated communicator for the
    group, as NCCL with eager init / ``device_id``, and as torch's ``batch_isend_irecv``
    on NCCL always) or "nccl-rules-peer" (one emulated communicator per peer pair, as
    NCCL's lazy per-peer communicators). ParameterError for an unknown value, naming
    ``PIPEOFFLOAD_P2P`` or ``mode``."""
    param = "mode"
    if mode is None:
        param, mode = ENV_VAR, os.environ.get(ENV_VAR, "").strip() or MODES[0]
    chosen = str(mode).strip().lower()
    if chosen not in MODES:
        raise ParameterError(param, f"unknown P2P transport {mode!r}; valid: {', '.join(MODES)}")
    if chosen == "torch":
        return TorchTransport(group)
    return NcclRulesTransport(group, rank, ranks, timeout_s, per_peer=chosen == "nccl-rules-peer")
