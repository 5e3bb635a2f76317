"""Boundary values on the wire, issued as the issue policy says (``passes/issue_policy.py``).

A forward message ``("F", s, j)`` (the output of layer group ``s`` for microbatch
``j``) is its tensor leaves (the *payload*), preceded by a *header*
(:func:`~pipeoffload.runtime.boundary.encode_header`: structure, shapes, dtypes, which
tensors need a gradient, plain values) only when the receiver cannot know the shapes.
A gradient message ``("B", s, j)`` is one tensor per leaf that needed a gradient, never
with a header: its receiver sent those leaves and knows their shapes
(:meth:`Mailbox.expect_grads`).

Shapes without headers. The runner agrees on a *signature* of each microbatch's inputs
at the start of a run (one collective, ``PipelineRunner._agree_signatures``). A
microbatch whose signature a completed run of the same kind (training or forward-only)
has seen sends no headers: both ends take the skeleton from their :class:`ShapeBook`,
filled from the headers of that earlier run. Anything else travels with headers. A
sender whose value no longer matches what the book says for its inputs (shapes that
depend on values, not on input shapes) raises a ParameterError naming the layer group
and the remedy (``dynamic_shapes=True``: headers always).

Every part of a message is issued inside its group in the policy's canonical order
(the same on both ends, as NCCL matches by order per peer); part ``k`` of a message
travels under tag ``64·message_tag + k`` (used by gloo only). Every wait has the P2P
timeout and names rank, op and peer.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ParameterError
from ..ir import Op
from ..passes.comm import MessageKey, message_tag
from ..passes.issue_policy import HEADER, Group, RankIssue
from .boundary import HEADER_BYTES, MAX_LEAVES, Flat, assemble, decode_body, encode_header, header_body
from .p2p import P2P

_PARTS = MAX_LEAVES + 1


class ShapeBook:
    """What each forward message looked like, per kind of run and input signature.

    ``entries[(kind, signature, stage)]`` is the header body of the output of layer
    group ``stage`` for a microbatch with that input signature; ``seen`` holds the
    ``(kind, signature)`` pairs of completed runs (their messages need no header)."""

    #: Most signatures remembered per kind (variable-length batches make many).
    LIMIT = 256

    def __init__(self) -> None:
        self.entries: dict[tuple[str, int, int], bytes] = {}
        self.decoded: dict[bytes, tuple[Any, list]] = {}
        self.seen: dict[tuple[str, int], None] = {}

    def knows(self, kind: str, sig: int) -> bool:
        return (kind, sig) in self.seen

    def commit(self, kind: str, sigs: list[int]) -> None:
        """A run of ``kind`` completed: its microbatches' signatures are known now."""
        for sig in sigs:
            self.seen[(kind, sig)] = None
        while len(self.seen) > self.LIMIT:
            old = next(iter(self.seen))
            del self.seen[old]
            for key in [k for k in self.entries if k[:2] == old]:
                del self.entries[key]

    def skeleton(self, body: bytes) -> tuple[Any, list]:
        got = self.decoded.get(body)
        if got is None:
            got = self.decoded[body] = decode_body(body)
        return got


class Mailbox:
    """The messages of one rank for one program run (module docstring)."""

    def __init__(self, p2p: P2P, num_stages: int, num_microbatches: int, device: torch.device) -> None:
        self.p2p, self.S, self.m, self.device = p2p, num_stages, num_microbatches, device
        self.book = ShapeBook()
        self.begin(RankIssue(), frozenset(), "train", [0] * num_microbatches, {})

    def begin(self, issue: RankIssue, headers: frozenset, kind: str, sigs: list[int],
              to_send: dict[MessageKey, Any],
              retire: dict[MessageKey, tuple[MessageKey, ...]] | None = None) -> None:
        """A new run: this rank's issue policy, the messages that carry headers, the kind
        of run and the microbatches' input signatures; ``to_send`` is where the runner
        leaves each value to send (popped when its payload is issued); ``retire``: the
        sends known received once a message is
        (:func:`~pipeoffload.passes.comm.send_retirements`), whose buffers are then freed."""
        self.issue, self.with_header, self.kind, self.sigs = issue, headers, kind, sigs
        self.retire = retire or {}
        self.to_send = to_send
        self.works: dict[tuple[MessageKey, str], list[tuple[Any, torch.Tensor, int]]] = {}
        self.skeletons: dict[MessageKey, tuple[Any, list]] = {}
        self.grad_metas: dict[MessageKey, list[tuple[tuple[int, ...], torch.dtype]]] = {}

    def _tag(self, key: MessageKey, part: int) -> int:
        return _PARTS * message_tag(key, self.S, self.m) + part

    def expect_grads(self, key: MessageKey, leaves: list[torch.Tensor]) -> None:
        """The gradient message ``key`` will carry gradients shaped like ``leaves``."""
        self.grad_metas[key] = [(tuple(t.shape), t.dtype) for t in leaves]

    # ------------------------------------------------------------------ issuing
    def issue_gap(self, k: int) -> None:
        """Issue this rank's groups of gap ``k`` (after its ``k``-th non-communication op)."""
        for group in self.issue.at.get(k, ()):
            self._issue_group(group)

    def _issue_group(self, group: Group) -> None:
        for key in group.after:  # the payload half: the headers of this round first
            self._header_in(key, f"the header of {key}")
        items: list[tuple[bool, torch.Tensor, int, int, str]] = []
        parts: list[tuple[MessageKey, str]] = []
        keys: list[MessageKey] = []
        for x in group.xfers:
            what = f"{'send' if x.send else 'receive'} of {_name(x.key)} {'header' if x.part == HEADER else 'payload'}"
            n0 = len(items)
            if x.send:
                items.extend((True, t, x.peer, tag, what) for t, tag in self._outgoing(x.key, x.part))
            else:
                self.works.setdefault((x.key, x.part), [])  # registered even with no tensor to receive
                items.extend((False, b, x.peer, tag, what) for b, tag in self._buffers(x.key, x.part))
            parts.extend([(x.key, x.part)] * (len(items) - n0))
            keys.extend([x.key] * (len(items) - n0))
        if not items:
            return
        works = self.p2p.issue(items, keys)
        for (key, part), (send, buf, peer, _, _), work in zip(parts, items, works):
            if not send:
                self.works.setdefault((key, part), []).append((work, buf, peer))
        self.p2p.poll_sends()

    def _outgoing(self, key: MessageKey, part: str) -> list[tuple[torch.Tensor, int]]:
        """The tensors (with tags) of this rank's part ``part`` of message ``key``."""
        if key[0] == "B":
            return [(g, self._tag(key, 1 + i)) for i, g in enumerate(self.to_send.pop(key))]
        flat: Flat = self.to_send[key]
        if part == HEADER:
            body = header_body(flat)
            self.book.entries[(self.kind, self.sigs[key[2]], key[1])] = body
            return [(encode_header(flat, self.device if self.device.type != "cpu" else "cpu", body),
                     self._tag(key, 0))]
        del self.to_send[key]
        if key not in self.with_header:
            self._check_known(key, flat)
        return [(t, self._tag(key, 1 + i)) for i, t in enumerate(flat.tensor_leaves())]

    def _check_known(self, key: MessageKey, flat: Flat) -> None:
        """The value matches what the book says for its inputs (module docstring)."""
        known = self.book.entries.get((self.kind, self.sigs[key[2]], key[1]))
        body = header_body(flat)
        if body != known:
            was = self.book.skeleton(known)[1] if known is not None else []
            now = decode_body(body)[1]
            raise ParameterError(
                "dynamic_shapes",
                f"rank {self.p2p.rank}: the output of layer group {key[1]} for microbatch {key[2]} is "
                f"{_describe(now)}, but an earlier step whose inputs had the same shapes gave {_describe(was)}: "
                "its shapes (or plain values, or which tensors need a gradient) depend on more than the input "
                "shapes. Build the PipelineRunner with dynamic_shapes=True to send a header with every message")

    def _buffers(self, key: MessageKey, part: str) -> list[tuple[torch.Tensor, int]]:
        """Fresh receive buffers (with tags) for part ``part`` of message ``key``."""
        if part == HEADER:
            return [(self.p2p.buffer((HEADER_BYTES,), torch.uint8), self._tag(key, 0))]
        if key[0] == "B":
            metas = self.grad_metas.pop(key, None)
            if metas is None:
                raise RuntimeError(f"rank {self.p2p.rank}: the gradient message {key} is due before its forward "
                                   "was sent (issue policy broken)")
        else:
            if key not in self.skeletons:
                body = self.book.entries.get((self.kind, self.sigs[key[2]], key[1]))
                if body is None:
                    raise RuntimeError(f"rank {self.p2p.rank}: no known shapes for {key} (issue policy broken)")
                self.skeletons[key] = self.book.skeleton(body)
            metas = [(item.shape, item.dtype) for kind, item in self.skeletons[key][1] if kind == "t"]
        return [(self.p2p.buffer(shape, dtype), self._tag(key, 1 + i)) for i, (shape, dtype) in enumerate(metas)]

    def _header_in(self, key: MessageKey, op: Any) -> None:
        """Wait for the header of ``key`` (issued earlier) and record its skeleton."""
        if key in self.skeletons:
            return
        (work, buf, peer), = self.works.pop((key, HEADER))
        self.p2p.wait(work, op, peer, "for the header of its input")
        raw = buf.numpy().tobytes() if buf.device.type == "cpu" else buf.cpu().numpy().tobytes()
        body = raw[8:8 + int.from_bytes(raw[:8], "little")]  # encode_header's layout
        self.book.entries[(self.kind, self.sigs[key[2]], key[1])] = body
        self.skeletons[key] = self.book.skeleton(body)

    # ------------------------------------------------------------------ receiving
    def receive(self, op: Op, key: MessageKey) -> Flat | list[torch.Tensor]:
        """Wait for message ``key`` (at its receive op): a forward value as a
        :class:`~pipeoffload.runtime.boundary.Flat`, a gradient message as a list."""
        if key[0] == "F" and key in self.with_header:
            self._header_in(key, op)
        got = self.works.pop((key, "p"), None)
        if got is None:
            raise RuntimeError(f"rank {self.p2p.rank}: {op} waits for {_name(key)}, which was never issued "
                               "(issue policy broken)")
        tensors = []
        for work, buf, peer in got:
            self.p2p.wait(work, op, peer, "for its input")
            tensors.append(self.p2p.landed(buf))
        self.p2p.retire(self.retire.get(key, ()), op)
        if key[0] == "B":
            return tensors
        spec, desc = self.skeletons.pop(key)
        return assemble(spec, desc, tensors)

    def pending(self) -> int:
        """Receives issued and not consumed."""
        return len(self.works)


def _name(key: MessageKey) -> str:
    d, s, j = key
    return f"{'activation' if d == 'F' else 'gradient'} message of layer group {s}, microbatch {j}"


def _describe(desc: list) -> str:
    shapes = [f"{tuple(item.shape)} {str(item.dtype).removeprefix('torch.')}" + (" grad" if item.requires_grad else "")
              for kind, item in desc if kind == "t"]
    plain = [repr(item) for kind, item in desc if kind == "v"]
    return "[" + ", ".join(shapes + plain) + "]"
