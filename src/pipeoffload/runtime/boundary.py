"""What crosses a stage boundary: a pytree of tensors and plain values.

A stage takes one value and returns one value: a tensor, or a tuple, list or dict
(nested as deep as wanted; ``torch.utils._pytree`` containers) whose leaves are tensors
or *plain values* (``None``, ``bool``, ``int``, ``float``, ``str``, ``torch.dtype``,
``torch.device``). Tensors that need no gradient (attention masks, position ids,
integer token ids) travel like the others and get no gradient message back.

Every forward message is preceded by a small **header** (:func:`encode_header`) that
carries the value's structure, each tensor leaf's shape, dtype and whether it needs a
gradient, and the plain leaves themselves, so a receiver always allocates exactly
what arrives: shapes may change from one step to the next, or between the
microbatches of one step, and a receive buffer is never reused. Gradient messages
need no header: the receiver of a gradient sent the activation and knows its shape.

Also here: splitting a whole batch into ``m`` microbatches (:func:`split_batch`) and
joining per-microbatch outputs (:func:`join_outputs`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree

from ..errors import ParameterError

#: Leaves other than tensors that may cross a boundary (sent inside the header).
PLAIN_TYPES = (type(None), bool, int, float, str, torch.dtype, torch.device)

#: Bytes of a header message: an 8-byte length, then the pickled description.
HEADER_BYTES = 2048
#: Most tensor leaves one boundary value may have (tags reserve room for them).
MAX_LEAVES = 63


@dataclass(frozen=True)
class LeafMeta:
    """One tensor leaf as the header describes it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass
class Flat:
    """A boundary value taken apart: ``leaves`` (tensors and plain values) and its
    tree ``spec``; ``tensors`` are the positions of the tensor leaves, in order."""

    leaves: list[Any]
    spec: Any
    tensors: list[int]

    def tensor_leaves(self) -> list[torch.Tensor]:
        return [self.leaves[i] for i in self.tensors]

    def rebuild(self) -> Any:
        return pytree.tree_unflatten(self.leaves, self.spec)


def flatten(value: Any, where: str) -> Flat:
    """Take a boundary value apart; ParameterError (naming ``where``) for a leaf that is
    neither a tensor nor a plain value, or for more than :data:`MAX_LEAVES` tensors."""
    leaves, spec = pytree.tree_flatten(value)
    tensors = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors.append(i)
        elif not isinstance(leaf, PLAIN_TYPES):
            raise ParameterError("stage_modules", f"{where} holds a {type(leaf).__name__} (leaf {i}); a boundary "
                                 "carries tensors in tuples, lists and dicts, and plain values (None, bool, int, "
                                 "float, str, torch.dtype, torch.device)")
    if len(tensors) > MAX_LEAVES:
        raise ParameterError("stage_modules", f"{where} holds {len(tensors)} tensors; at most {MAX_LEAVES} may "
                             "cross one boundary (pack them into fewer tensors)")
    return Flat(list(leaves), spec, tensors)


def leaf_metas(flat: Flat) -> list[LeafMeta]:
    return [LeafMeta(tuple(t.shape), t.dtype, bool(t.requires_grad)) for t in flat.tensor_leaves()]


class _T:
    """A tensor leaf's place in a header's skeleton."""

    __slots__ = ("shape", "dtype", "requires_grad")

    def __init__(self, shape: tuple[int, ...], dtype: str, requires_grad: bool) -> None:
        self.shape, self.dtype, self.requires_grad = shape, dtype, requires_grad

    def __getstate__(self):
        return (self.shape, self.dtype, self.requires_grad)

    def __setstate__(self, state):
        self.shape, self.dtype, self.requires_grad = state


def header_body(flat: Flat) -> bytes:
    """The value's skeleton (its containers and plain leaves, each tensor replaced by
    its shape, dtype and whether it needs a gradient), pickled: what a header carries.
    Equal bodies mean the receiver may reuse the buffers' shapes it knows."""
    skel = [_T(tuple(x.shape), str(x.dtype).removeprefix("torch."), bool(x.requires_grad))
            if isinstance(x, torch.Tensor) else x for x in flat.leaves]
    return pickle.dumps(pytree.tree_unflatten(skel, flat.spec), protocol=pickle.HIGHEST_PROTOCOL)


def encode_header(flat: Flat, device: torch.device | str = "cpu", body: bytes | None = None) -> torch.Tensor:
    """The header of a forward message: a uint8 tensor of :data:`HEADER_BYTES` holding
    :func:`header_body` (``body`` when the caller computed it already)."""
    if body is None:
        body = header_body(flat)
    if len(body) + 8 > HEADER_BYTES:
        raise ParameterError("stage_modules", f"a boundary value's description takes {len(body)} bytes, more than "
                             f"the {HEADER_BYTES - 8} a header holds (too many leaves or long plain values)")
    buf = bytearray(HEADER_BYTES)
    buf[:8] = len(body).to_bytes(8, "little")
    buf[8:8 + len(body)] = body
    return torch.frombuffer(buf, dtype=torch.uint8).to(device)


def decode_header(header: torch.Tensor) -> tuple[Any, list[tuple]]:
    """``(spec, descriptions)`` from a received header: per leaf ``("t", LeafMeta)`` or
    ``("v", plain value)``."""
    raw = header.cpu().numpy().tobytes()
    n = int.from_bytes(raw[:8], "little")
    return decode_body(raw[8:8 + n])


def decode_body(body: bytes) -> tuple[Any, list[tuple]]:
    """``(spec, descriptions)`` from a :func:`header_body`."""
    leaves, spec = pytree.tree_flatten(pickle.loads(body))
    out = [("t", LeafMeta(x.shape, getattr(torch, x.dtype), x.requires_grad)) if isinstance(x, _T) else ("v", x)
           for x in leaves]
    return spec, out


def assemble(spec: Any, desc: list[tuple], tensors: Sequence[torch.Tensor]) -> Flat:
    """A received value: the header's plain leaves and the received ``tensors`` (in
    order), each marked as needing a gradient when the sender's did."""
    leaves: list[Any] = []
    positions: list[int] = []
    it = iter(tensors)
    for i, (kind, item) in enumerate(desc):
        if kind == "t":
            t = next(it)
            if item.requires_grad:
                t.requires_grad_()
            leaves.append(t)
            positions.append(i)
        else:
            leaves.append(item)
    return Flat(leaves, spec, positions)


def hand_off(flat: Flat) -> Flat:
    """The value as the next layer group on the same rank receives it: tensor leaves
    detached (the next group's leaves), needing a gradient where the output did."""
    leaves = list(flat.leaves)
    for i in flat.tensors:
        t = leaves[i]
        leaves[i] = t.detach().requires_grad_(t.requires_grad)
    return Flat(leaves, flat.spec, list(flat.tensors))


# ----------------------------------------------------------------------------- batches


def is_microbatch_list(value: Any) -> bool:
    """A ``list`` is a list of microbatches; anything else (tensor, tuple, dict) is one batch."""
    return isinstance(value, list)


def split_batch(batch: Any, m: int, param: str) -> list[Any]:
    """Split a whole batch into ``m`` microbatches along dimension 0, as
    ``torch.tensor_split`` does (sizes differ by at most one, the larger first); plain
    leaves and 0-dimensional tensors are given to every microbatch. ParameterError
    (naming ``param``) when tensor leaves disagree on dimension 0 or it is below ``m``."""
    leaves, spec = pytree.tree_flatten(batch)
    sizes = {t.shape[0] for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0}
    if not sizes:
        raise ParameterError(param, "a whole batch needs at least one tensor with a batch dimension "
                             "(or pass a list of microbatches)")
    if len(sizes) > 1:
        raise ParameterError(param, f"the batch's tensors disagree on dimension 0 (sizes {sorted(sizes)}); "
                             "split it yourself and pass a list of microbatches")
    n = sizes.pop()
    if n < m:
        raise ParameterError(param, f"a batch of {n} cannot be split into {m} microbatches (m); "
                             f"use at least {m} samples or a list of microbatches")
    parts = [torch.tensor_split(t, m, dim=0) if isinstance(t, torch.Tensor) and t.dim() > 0 else None
             for t in leaves]
    return [pytree.tree_unflatten([p[j] if p is not None else leaf for p, leaf in zip(parts, leaves)], spec)
            for j in range(m)]


def join_outputs(outputs: Sequence[Any]) -> Any:
    """Per-microbatch outputs joined back into one batch: tensor leaves with a batch
    dimension concatenated along dimension 0, other leaves taken from the first."""
    flats = [pytree.tree_flatten(o) for o in outputs]
    spec = flats[0][1]
    joined = []
    for k, leaf in enumerate(flats[0][0]):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            joined.append(torch.cat([f[0][k] for f in flats], dim=0))
        else:
            joined.append(leaf)
    return pytree.tree_unflatten(joined, spec)


def to_device(value: Any, device: torch.device) -> Any:
    """Every tensor leaf of ``value`` moved to ``device`` (other leaves as they are)."""
    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, value)
