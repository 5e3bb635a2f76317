"""Deferred weight gradients: the B/W split of zero-bubble schedules.

``B`` must produce the input gradient (what the previous stage waits for) and ``W``
the weight gradients, later, without running the backward graph twice and without
keeping the whole graph alive until ``W``. Linear layers carry almost all the
weight-gradient work, so :class:`DeferredLinear` (an ``nn.Linear`` whose backward is
the custom autograd function :class:`_LinearFn`) splits them:

- during a ``B`` run inside :meth:`WeightGradStore.deferring`, its backward computes
  ``grad_input = gO · Wᵀ`` only and stashes ``(input, gO)`` under the
  ``(stage, microbatch)`` the forward ran for; autograd then frees the graph as usual;
- ``W`` (:meth:`WeightGradStore.flush`) pops the stash and accumulates
  ``dW = gOᵀ · X`` (and ``db = Σ gO``) into ``.grad``.

Outside :meth:`deferring` (plain training, a reference model) the layer behaves like
``nn.Linear``. Other parameters (norm weights, embedding) get their gradients during
``B`` through ordinary autograd.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

Key = tuple[int, int]  #: (stage, microbatch)

#: (store, key) the forward being run belongs to; set by :meth:`WeightGradStore.forward`.
_CURRENT: tuple["WeightGradStore", Key] | None = None


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tag):  # type: ignore[override]
        # Only the input goes through save_for_backward (and the saved-tensor hooks);
        # the parameters are kept by reference: W must accumulate into *these* objects.
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias, ctx.tag = weight, bias, tag
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        grad_in = grad_out.matmul(weight) if ctx.needs_input_grad[0] else None
        want_w = ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[2])
        tag = ctx.tag
        if want_w and tag is not None and tag[0].is_deferring:
            tag[0].stash(tag[1], weight, bias, x, grad_out)
            return grad_in, None, None, None
        if not want_w:
            return grad_in, None, None, None
        gw, gb = linear_weight_grads(x, grad_out, bias is not None)
        return grad_in, (gw if ctx.needs_input_grad[1] else None), (gb if ctx.needs_input_grad[2] else None), None


def linear_weight_grads(x: torch.Tensor, grad_out: torch.Tensor, with_bias: bool):
    """``(gOᵀ·X, Σ gO)`` over all leading dimensions."""
    go = grad_out.reshape(-1, grad_out.shape[-1])
    gw = go.t().matmul(x.reshape(-1, x.shape[-1]))
    return gw, (go.sum(0) if with_bias else None)


class DeferredLinear(nn.Linear):
    """``nn.Linear`` whose weight gradient can be deferred to a W op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _CURRENT is None:
            return F.linear(x, self.weight, self.bias)
        return _LinearFn.apply(x, self.weight, self.bias, _CURRENT)


def convert_linears(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` in ``module`` into a :class:`DeferredLinear` in place
    (class swap: parameters, names and state dict are unchanged). Returns how many."""
    n = 0
    for mod in module.modules():
        if type(mod) is nn.Linear:
            mod.__class__ = DeferredLinear
            n += 1
    return n


class WeightGradStore:
    """Stashed ``(input, grad_output)`` pairs per ``(stage, microbatch)``, drained by W.

    ``hold``: optional callable ``hold(*tensors) -> handle`` (the memory meter) whose
    handle is kept with each entry, so stashed bytes count as activation memory until W.
    """

    def __init__(self, hold: Callable[..., Any] | None = None) -> None:
        self._entries: dict[Key, list[tuple]] = defaultdict(list)
        self._deferring = False
        self._hold = hold

    @property
    def is_deferring(self) -> bool:
        return self._deferring

    @contextlib.contextmanager
    def forward(self, stage: int, microbatch: int) -> Iterator[None]:
        """Run a forward whose DeferredLinear layers report to this store under ``(stage, microbatch)``."""
        global _CURRENT
        prev, _CURRENT = _CURRENT, (self, (stage, microbatch))
        try:
            yield
        finally:
            _CURRENT = prev

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Inside: DeferredLinear backward stashes instead of computing weight grads (a B op)."""
        prev, self._deferring = self._deferring, True
        try:
            yield
        finally:
            self._deferring = prev

    def stash(self, key: Key, weight, bias, x: torch.Tensor, grad_out: torch.Tensor) -> None:
        handle = self._hold(x, grad_out) if self._hold is not None else None
        self._entries[key].append((weight, bias, x, grad_out, handle))

    def pending(self, key: Key | None = None) -> int:
        if key is None:
            return sum(len(v) for v in self._entries.values())
        return len(self._entries.get(key, ()))

    def flush(self, stage: int, microbatch: int) -> int:
        """The W op: accumulate the deferred weight gradients of ``(stage, microbatch)``
        into ``.grad`` and free the stash. Returns the number of layers done."""
        entries = self._entries.pop((stage, microbatch), [])
        with torch.no_grad():
            for weight, bias, x, grad_out, _handle in entries:
                gw, gb = linear_weight_grads(x, grad_out, bias is not None and bias.requires_grad)
                _accumulate(weight, gw)
                if gb is not None:
                    _accumulate(bias, gb)
        n = len(entries)
        entries.clear()  # drop tensors and meter handles now
        return n

    def clear(self) -> None:
        self._entries.clear()


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    if not param.requires_grad:
        return
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)
