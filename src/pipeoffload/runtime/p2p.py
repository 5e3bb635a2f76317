"""Point-to-point transfers between pipeline ranks, every wait with a timeout.

- Sends are non-blocking (``isend``) and issued right after the producing op; the
  send buffers are kept until :meth:`P2P.finish_sends` (end of step) or until
  :meth:`P2P.poll_sends` sees them done.
- Receives are posted ahead (``irecv`` into a fresh buffer) and waited for just
  before the consuming op. Each message has a unique tag per
  ``(direction, sender stage, microbatch)``; receives from one peer are additionally
  posted in the order that peer sends them (NCCL matches by order, not tag).
- Every wait has a timeout; on expiry (or a dead peer) :class:`CommTimeout` /
  :class:`CommError` names this rank, the op and the peer it waited for.

Shapes are never learned once and reused: every forward message is preceded by a
header (``runtime/boundary.py``) from which the receiver allocates its buffers.

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

from ..ir import Op

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
                 ranks: list[int] | None = None) -> None:
        self.rank = rank
        #: Global rank of each pipeline rank (None: pipeline ranks are global ranks).
        #: torch's ``dst``/``src`` are global ranks even with ``group=``: a pipeline of
        #: global ranks [2, 3] talks to 2 and 3, not to 0 and 1.
        self.ranks = ranks
        self.timeout_s = float(timeout_s)
        self.device = device
        self.group = group
        self._sends: list[tuple[Any, int, Any, torch.Tensor]] = []  # (op or description, peer, work, buffer)
        self._recvs: dict[Any, tuple[Any, torch.Tensor, int]] = {}  # key -> (work, buffer, peer)
        self._stage = device.type != "cpu" and dist.is_initialized() and dist.get_backend(group) == "gloo"

    def _global(self, peer: int) -> int:
        """The global rank of pipeline rank ``peer``."""
        return peer if self.ranks is None else self.ranks[peer]

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """What goes on the wire: ``t`` itself, or its host copy when staging (module docstring)."""
        return t.cpu() if self._stage else t

    # --- sends -------------------------------------------------------------------
    def send(self, op: Op, tensor: torch.Tensor, tag: int) -> None:
        t = tensor.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        t = self._wire(t)
        try:
            work = dist.isend(t, dst=self._global(op.peer), group=self.group, tag=tag)
        except RuntimeError as e:
            raise CommError(f"rank {self.rank}: could not send at {op} to rank {op.peer} "
                            f"({str(e).splitlines()[0][:200]})") from None
        self._sends.append((op, op.peer, work, t))

    def poll_sends(self) -> None:
        """Drop the buffers of sends that completed (keeps memory bounded)."""
        if len(self._sends) > 4:
            self._sends = [s for s in self._sends if not s[2].is_completed()]

    def finish_sends(self) -> None:
        """Wait for every outstanding send (end of step), each with the timeout."""
        sends, self._sends = self._sends, []
        for op, peer, work, _ in sends:
            self._wait(work, op, peer, "for its send to be received")

    # --- receives ----------------------------------------------------------------
    def post_recv(self, key: Any, shape: tuple[int, ...], dtype: torch.dtype, peer: int, tag: int) -> None:
        if key in self._recvs:
            return
        buf = torch.empty(shape, dtype=dtype, device="cpu" if self._stage else self.device)
        try:
            work = dist.irecv(buf, src=self._global(peer), group=self.group, tag=tag)
        except RuntimeError as e:
            raise CommError(f"rank {self.rank}: could not post the receive of {key} from rank {peer} "
                            f"({str(e).splitlines()[0][:200]})") from None
        self._recvs[key] = (work, buf, peer)

    def is_posted(self, key: Any) -> bool:
        return key in self._recvs

    def wait_recv(self, key: Any, op: Any) -> torch.Tensor:
        """Wait (with the timeout) for the receive posted under ``key``; ``op`` names the
        waiting op (or a description) in errors."""
        work, buf, peer = self._recvs.pop(key)
        self._wait(work, op, peer, "for its input")
        return buf.to(self.device) if self._stage else buf

    def pending_recvs(self) -> int:
        return len(self._recvs)

    # --- waiting -------------------------------------------------------------------
    def _wait(self, work: Any, op: Any, peer: int | None, what: str) -> None:
        try:
            ok = work.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
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
                f"at {op} waiting on rank {peer} {what} ({text.splitlines()[0][:200]})"
            ) from None
        if ok is False:
            raise CommTimeout(f"rank {self.rank}: timed out after {self.timeout_s:g} s at {op} "
                              f"waiting on rank {peer} {what}")

    def is_done(self, key: Any) -> bool:
        """Whether the receive posted under ``key`` has completed (never blocks)."""
        return bool(self._recvs[key][0].is_completed())

    def exchange(self, tensor: torch.Tensor, peer: int, tag: int, what: str) -> torch.Tensor:
        """Send ``tensor`` to ``peer`` and receive its tensor of the same shape and dtype
        (same ``tag`` both ways), each wait with the timeout; returns the peer's."""
        out = torch.empty_like(self._wire(tensor))
        sent = dist.isend(self._wire(tensor.contiguous()), dst=self._global(peer), group=self.group, tag=tag)
        got = dist.irecv(out, src=self._global(peer), group=self.group, tag=tag)
        self._wait(got, what, peer, "for its part")
        self._wait(sent, what, peer, "to take this rank's part")
        return out.to(self.device) if self._stage else out


def _peer_gone(text: str) -> bool:
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))
