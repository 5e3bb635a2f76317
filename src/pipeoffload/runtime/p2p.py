"""Point-to-point transfers between pipeline ranks, every wait with a timeout.

Every transfer goes through one call, :meth:`P2P.issue`: a *group* of sends and
receives issued together (one ``batch_isend_irecv``: on NCCL they progress together)
on the pipeline's one communicator, in the order the issue policy
(``passes/issue_policy.py``) gives — the same on every backend. Sends are never waited
for where they are issued: their buffers are kept until :meth:`P2P.poll_sends` sees
them done, :meth:`P2P.retire` is told that their receiver has them (the program says
when: :func:`~pipeoffload.passes.comm.send_retirements`; needed on gloo, whose
``is_completed()`` stays False until ``wait()``), or :meth:`P2P.finish_sends` (end of
step) waits for them. Receives are
waited for by their consumer (:meth:`P2P.wait`).

The transport (``runtime/transport.py``) is torch's own (``batch_isend_irecv``) or, for
tests, an emulation of NCCL's rules over gloo (``PIPEOFFLOAD_P2P=nccl-rules``).

Every wait has a timeout; on expiry (or a dead peer) :class:`CommTimeout` /
:class:`CommError` names this rank, the op and the peer it waited for.

Gloo cannot send or receive CUDA memory (its TCP transport reads the pointer on the
host: "writev ... Bad address", seen on an H100). When the process group is gloo and
the device is CUDA, messages are staged through host memory: a send copies to the
host first, a receive lands in a host buffer and is copied to the device when it is
waited for. Useful where ranks outnumber GPUs (several ranks sharing one GPU);
NCCL sends device memory directly.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from .transport import P2PSpec, Transport, make_transport

#: Tags at or above this base are the shared-parameter exchanges' (``runtime/ties.py``).
TIE_TAG_BASE = 1 << 30


class CommError(RuntimeError):
    """A transfer failed; the message names the rank, the op and the peer.
    ``lost_peer``: the peer whose connection closed (it died), else None."""

    lost_peer: int | None = None


class CommTimeout(CommError, TimeoutError):
    """A wait ran out of time; the message names the rank, the op and the peer."""


class P2P:
    """Sends and receives of one rank (see module docstring)."""

    def __init__(self, rank: int, timeout_s: float, device: torch.device, group: Any = None,
                 ranks: list[int] | None = None, transport: Transport | str | None = None) -> None:
        self.rank = rank
        #: Global rank of each pipeline rank (None: pipeline ranks are global ranks).
        #: torch's ``dst``/``src`` are global ranks even with ``group=``: a pipeline of
        #: global ranks [2, 3] talks to 2 and 3, not to 0 and 1.
        self.ranks = ranks
        self.timeout_s = float(timeout_s)
        self._timeout = datetime.timedelta(seconds=self.timeout_s)
        self.device = device
        self.group = group
        self._sends: list[tuple[Any, int, Any, torch.Tensor, Any]] = []  # (what, peer, work, buffer, key)
        self._stage = device.type != "cpu" and dist.is_initialized() and dist.get_backend(group) == "gloo"
        if isinstance(transport, Transport):
            self.transport = transport
        elif dist.is_initialized():
            self.transport = make_transport(group, rank, ranks, self.timeout_s, transport)
        else:
            self.transport = None  # a single process: nothing crosses ranks

    def _global(self, peer: int) -> int:
        """The global rank of pipeline rank ``peer``."""
        return peer if self.ranks is None else self.ranks[peer]

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """What goes on the wire: ``t`` itself, or its host copy when staging (module docstring)."""
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        return t.cpu() if self._stage else t

    def buffer(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A fresh receive buffer (in host memory when staging)."""
        return torch.empty(shape, dtype=dtype, device="cpu" if self._stage else self.device)

    def landed(self, buf: torch.Tensor) -> torch.Tensor:
        """A completed receive's buffer on this rank's device."""
        return buf.to(self.device) if self._stage else buf

    # --- issuing ---------------------------------------------------------------------
    def issue(self, items: list[tuple[bool, torch.Tensor, int, int, str]],
              keys: list[Any] | None = None) -> list[Any]:
        """Issue one group: ``items`` are ``(send?, tensor, peer, tag, what)`` with
        ``peer`` a pipeline rank; a send's tensor is put on the wire (host copy when
        staging), a receive's tensor is a :meth:`buffer`. Returns one work per item.
        The sends' buffers are kept until they complete; ``keys`` (one per item) name
        them for :meth:`retire`."""
        specs = []
        for send, t, peer, tag, what in items:
            specs.append(P2PSpec(send, self._wire(t) if send else t, self._global(peer), tag, what))
        try:
            works = self.transport.issue(specs)
        except RuntimeError as e:
            first = specs[0].what if specs else "?"
            text = str(e)
            peers = sorted({peer for _, _, peer, _, _ in items})
            if _peer_gone(text):  # a dead peer found when issuing, not waiting: name it all the same
                who = f"rank {peers[0]}" if len(peers) == 1 else "one of ranks " + ", ".join(map(str, peers))
                err = CommError(f"rank {self.rank}: lost {who} issuing the group of {first}: its "
                                f"connection closed (the process died or failed; {text.splitlines()[0][:200]})")
                # Only a group with one peer says which died (gloo names an address, not a rank).
                err.lost_peer = peers[0] if len(peers) == 1 else None
                raise err from None
            raise CommError(f"rank {self.rank}: could not issue the group of {first} "
                            f"({text.splitlines()[0][:200]})") from None
        for n, ((send, _, peer, _, what), spec, work) in enumerate(zip(items, specs, works)):
            if send:
                self._sends.append((what, peer, work, spec.tensor, None if keys is None else keys[n]))
        return works

    def retire(self, keys: tuple[Any, ...], op: Any) -> None:
        """The sends of ``keys`` have been received (the caller knows it from the
        program): wait for them — at once on every backend — and drop their buffers."""
        if not keys or not self._sends:
            return
        done = set(keys)
        keep = []
        for s in self._sends:
            if s[4] in done:
                self.wait(s[2], op, s[1], f"for its send {s[0]} (received, by the program)")
            else:
                keep.append(s)
        self._sends = keep

    def poll_sends(self) -> None:
        """Drop the buffers of sends that completed (keeps memory bounded)."""
        if len(self._sends) > 4:
            self._sends = [s for s in self._sends if not s[2].is_completed()]

    def finish_sends(self) -> None:
        """Wait for every outstanding send (end of step), each with the timeout."""
        sends, self._sends = self._sends, []
        for what, peer, work, _, _ in sends:
            self.wait(work, what, peer, "for its send to be received")

    # --- waiting -------------------------------------------------------------------
    def wait(self, work: Any, op: Any, peer: int | None, what: str) -> None:
        """Wait (with the timeout) for ``work``; ``op`` names the waiting op in errors."""
        try:
            ok = work.wait(timeout=self._timeout)
        except RuntimeError as e:
            text = str(e)
            if _peer_gone(text):  # the peer's process died or failed: say so, naming it
                err = CommError(f"rank {self.rank}: lost rank {peer} at {op}: its connection closed "
                                "(the process died or failed)")
                err.lost_peer = peer
                raise err from None
            cls = CommTimeout if "imed out" in text or "timeout" in text.lower() else CommError
            raise cls(
                f"rank {self.rank}: {'timed out after ' + format(self.timeout_s, 'g') + ' s' if cls is CommTimeout else 'failed'} "
                f"at {op} waiting on rank {peer} {what} ({text.splitlines()[0][:300]})"
            ) from None
        if ok is False:
            raise CommTimeout(f"rank {self.rank}: timed out after {self.timeout_s:g} s at {op} "
                              f"waiting on rank {peer} {what}")

    def exchange(self, tensor: torch.Tensor, peer: int, tag: int, what: str) -> torch.Tensor:
        """Send ``tensor`` to ``peer`` and receive its tensor of the same shape and dtype,
        as one group (the two cross: NCCL needs them together); each wait with the
        timeout; returns the peer's."""
        out = self.buffer(tuple(tensor.shape), tensor.dtype)
        sent, got = self.issue([(True, tensor, peer, tag, what), (False, out, peer, tag, what)])
        self.wait(got, what, peer, "for its part")
        self.finish_sends()
        return self.landed(out)


def wait_collective(work: Any, timeout_s: float, rank: int, what: str) -> None:
    """Wait (at most ``timeout_s``) for a collective's ``work``; :class:`CommTimeout`
    naming this rank and ``what`` (e.g. "the data-parallel all-reduce") otherwise."""
    try:
        ok = work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise CommTimeout(f"rank {rank}: {what} failed or timed out after {timeout_s:g} s "
                          f"({str(e).splitlines()[0][:300]})") from None
    if ok is False:
        raise CommTimeout(f"rank {rank}: timed out after {timeout_s:g} s waiting for {what}")


def _peer_gone(text: str) -> bool:
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))
