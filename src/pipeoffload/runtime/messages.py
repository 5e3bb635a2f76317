"""Boundary values on the wire: a header, then one message per tensor.

A forward message ``("F", s, j)`` (the output of layer group ``s`` for microbatch
``j``) is sent as part 0, the header (:func:`~pipeoffload.runtime.boundary.encode_header`:
structure, shapes, dtypes, which tensors need a gradient, plain values), then one part
per tensor leaf. A gradient message ``("B", s, j)`` has one part per leaf that needed a
gradient, in leaf order, and no header: its receiver sent those leaves and knows their
shapes (:meth:`Mailbox.expect_grads`). Part ``k`` of a message travels under tag
``64·message_tag + k``.

Receives are posted in each peer's send order (NCCL matches by order, not tag): a
header first, its tensors once the header is in, then the peer's next message.
:meth:`Mailbox.post_ahead` does this without blocking for the next few receive ops
(``lookahead``); at a receive op :meth:`Mailbox.receive` waits — for the headers of
earlier messages from that peer too, which is safe: the peer sent them before the one
this op needs. Every wait has the P2P timeout and names rank, op and peer.

Cost of the headers (dynamic shapes): one extra message of
:data:`~pipeoffload.runtime.boundary.HEADER_BYTES` per forward message, and a
payload receive that can be posted only once its header has arrived (on gloo the
payload then moves after a round trip instead of being pushed at once).
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir import Op
from ..passes.comm import MessageKey, message_tag
from .boundary import HEADER_BYTES, MAX_LEAVES, Flat, assemble, decode_header, encode_header
from .p2p import P2P

_PARTS = MAX_LEAVES + 1


class Mailbox:
    """The messages of one rank for one program run (module docstring)."""

    def __init__(self, p2p: P2P, num_stages: int, num_microbatches: int, device: torch.device) -> None:
        self.p2p, self.S, self.m, self.device = p2p, num_stages, num_microbatches, device
        self.begin({})

    def begin(self, incoming: dict[int, list[MessageKey]]) -> None:
        """A new run: ``incoming[peer]`` lists the messages from ``peer`` in its send order."""
        self.order = incoming
        self.index = {key: (peer, i) for peer, keys in incoming.items() for i, key in enumerate(keys)}
        self.posted = {peer: 0 for peer in incoming}  #: per peer: messages fully posted
        self.headers: dict[MessageKey, tuple[Any, list]] = {}
        self.parts: dict[MessageKey, int] = {}
        self.grad_metas: dict[MessageKey, list[tuple[tuple[int, ...], torch.dtype]]] = {}

    def _tag(self, key: MessageKey, part: int) -> int:
        return _PARTS * message_tag(key, self.S, self.m) + part

    # ------------------------------------------------------------------ sending
    def send_value(self, op: Op, key: MessageKey, flat: Flat) -> None:
        """A forward message: the header, then every tensor leaf."""
        hdr = encode_header(flat, self.device if self.device.type != "cpu" else "cpu")
        self.p2p.send(op, hdr, self._tag(key, 0))
        for k, t in enumerate(flat.tensor_leaves()):
            self.p2p.send(op, t, self._tag(key, 1 + k))

    def send_grads(self, op: Op, key: MessageKey, grads: list[torch.Tensor]) -> None:
        for k, g in enumerate(grads):
            self.p2p.send(op, g, self._tag(key, 1 + k))

    def expect_grads(self, key: MessageKey, leaves: list[torch.Tensor]) -> None:
        """The gradient message ``key`` will carry gradients shaped like ``leaves``."""
        self.grad_metas[key] = [(tuple(t.shape), t.dtype) for t in leaves]

    # ------------------------------------------------------------------ receiving
    def post_ahead(self, keys: list[MessageKey]) -> None:
        """Post, without blocking, what can be posted up to each of ``keys``."""
        for key in keys:
            peer, i = self.index[key]
            self._post_upto(peer, i, None)

    def receive(self, op: Op, key: MessageKey) -> Flat | list[torch.Tensor]:
        """Wait for message ``key`` (at its receive op): a forward value as a
        :class:`~pipeoffload.runtime.boundary.Flat`, a gradient message as a list."""
        peer, i = self.index[key]
        self._post_upto(peer, i, op)
        tensors = [self.p2p.wait_recv((key, 1 + k), op) for k in range(self.parts.pop(key))]
        if key[0] == "B":
            return tensors
        spec, desc = self.headers.pop(key)
        return assemble(spec, desc, tensors)

    def _post_upto(self, peer: int, i: int, op: Op | None) -> None:
        """Post the messages of ``peer`` up to its ``i``-th, in order; ``op`` set: block
        for headers (with the timeout); None: stop at the first that is not ready."""
        while self.posted[peer] <= i:
            key = self.order[peer][self.posted[peer]]
            if not self._post(peer, key, op):
                return
            self.posted[peer] += 1

    def _post(self, peer: int, key: MessageKey, op: Op | None) -> bool:
        if key[0] == "B":
            metas = self.grad_metas.pop(key, None)
            if metas is None:
                if op is not None:
                    raise RuntimeError(f"rank {self.p2p.rank}: gradient message {key} before its forward was sent")
                return False
        else:
            header = self._header(peer, key, op)
            if header is None:
                return False
            metas = [(item.shape, item.dtype) for kind, item in header[1] if kind == "t"]
        for k, (shape, dtype) in enumerate(metas):
            self.p2p.post_recv((key, 1 + k), shape, dtype, peer, self._tag(key, 1 + k))
        self.parts[key] = len(metas)
        return True

    def _header(self, peer: int, key: MessageKey, op: Op | None) -> tuple[Any, list] | None:
        if key in self.headers:
            return self.headers[key]
        hk = (key, 0)
        if not self.p2p.is_posted(hk):
            self.p2p.post_recv(hk, (HEADER_BYTES,), torch.uint8, peer, self._tag(key, 0))
        if op is None and not self.p2p.is_done(hk):
            return None
        self.headers[key] = decode_header(self.p2p.wait_recv(hk, op if op is not None else f"header of {key}"))
        return self.headers[key]
