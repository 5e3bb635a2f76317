"""Deferred weight gradients: the B/W split of zero-bubble schedules, for every parameter.

``B`` must produce the input gradient (what the previous stage waits for) and ``W``
the weight gradients, later, without running the backward graph twice and without
keeping the whole graph alive until ``W``.

How (:meth:`WeightGradStore.defer`): during the F of a ``(stage, microbatch)`` whose
backward the schedule splits, a ``TorchFunctionMode`` watches every torch call. A
call that combines one of the stage's parameters (or a *derived* tensor: a view,
transpose, cast, slice, concatenation or scalar multiple of parameters) with an
activation is *deferred*:

- ``F.linear`` with a parameter weight (every ``nn.Linear``) goes through
  :class:`_LinearDefer`: B computes ``grad_input = gO·W``, W computes ``gOᵀ·X`` and
  ``Σ gO`` (under ``torch.autocast`` with the same casts autocast makes);
- ``x * weight`` with a parameter (a norm's scale) goes through :class:`_ScaleDefer`:
  B computes ``gO·w``, W ``Σ gO·x`` (the local graph's values, without its nested
  backward calls), when both are plain tensors of one floating dtype;
- any other call (``addmm`` of transformers' ``Conv1D``, ``matmul``/``bmm`` with expert
  weights, ``embedding``, ``layer_norm``, a product of mixed dtypes, a bare
  ``nn.Parameter`` in ``forward``) goes through :class:`_LocalGraph`: the call runs once,
  with grad, on leaves standing for its parameter-side tensors, giving a small local
  autograd graph; B runs that graph for the activations' gradients only
  (``torch.autograd.grad`` to the activations' edges, ``retain_graph``), W runs it for
  the parameter-side leaves only — each node computes each of its outputs once, nothing
  is recomputed, and side effects (running statistics) happen once, in F.

Gradients of derived tensors are carried back to the parameters in W by replaying
the (cheap, parameter-only) ops that made them. Every other path to a parameter —
an in-place op, a custom ``autograd.Function``, an op the mode does not see — keeps
ordinary autograd, so its gradient arrives during B: correct, just not deferred. The
store records which parameters reached W (:meth:`WeightGradStore.report`); the runner
warns when a split schedule meets a stage whose W is empty.

The mode changes nothing about the user's modules (no class swap, no hooks on them).
Outside :meth:`WeightGradStore.deferring` (a backward that is not a B) every deferred
call computes its weight gradients at once, like plain autograd.

Legacy (kept for existing callers): :class:`DeferredLinear` / :func:`convert_linears`
swap ``nn.Linear`` classes in place and report through :meth:`WeightGradStore.forward`;
the runner no longer uses them.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

Key = tuple[int, int]  #: (stage, microbatch)

#: (store, key) the forward being run belongs to; set by :meth:`WeightGradStore.forward` (legacy).
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
    """Deferred weight-gradient work per ``(stage, microbatch)``, drained by W.

    ``hold``: optional callable ``hold(*tensors) -> handle`` (the memory meter) whose
    handle is kept with each entry, so stashed bytes count as activation memory until W.
    """

    def __init__(self, hold: Callable[..., Any] | None = None) -> None:
        self._entries: dict[Key, list[Any]] = defaultdict(list)
        self._deferring = False
        self._hold = hold
        #: stage -> ids of parameters whose gradient some deferred call carried to W
        self.deferred: dict[int, set[int]] = defaultdict(set)
        #: stage -> {reason: count} of calls on parameters left to ordinary autograd
        self.bypassed: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    @property
    def is_deferring(self) -> bool:
        return self._deferring

    @contextlib.contextmanager
    def defer(self, stage: int, microbatch: int, params: dict[int, torch.Tensor]) -> Iterator[None]:
        """Run the F of ``(stage, microbatch)`` with its weight-gradient work deferred
        (module docstring); ``params``: id -> parameter, every parameter of the rank."""
        mode = _DeferMode(self, (stage, microbatch), params)
        with mode:
            yield
        mode.derived.clear()
        mode.side.clear()

    @contextlib.contextmanager
    def forward(self, stage: int, microbatch: int) -> Iterator[None]:
        """Legacy: a forward whose :class:`DeferredLinear` layers report under ``(stage, microbatch)``."""
        global _CURRENT
        prev, _CURRENT = _CURRENT, (self, (stage, microbatch))
        try:
            yield
        finally:
            _CURRENT = prev

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Inside: deferred calls stash their weight-gradient work instead of doing it (a B op)."""
        prev, self._deferring = self._deferring, True
        try:
            yield
        finally:
            self._deferring = prev

    def add(self, key: Key, entry: Any, *tensors: torch.Tensor) -> None:
        """Stash ``entry`` (with ``run()``) for the W of ``key``; ``tensors`` it keeps are
        counted by the meter until then."""
        entry.handle = self._hold(*tensors) if self._hold is not None else None
        self._entries[key].append(entry)

    def stash(self, key: Key, weight, bias, x: torch.Tensor, grad_out: torch.Tensor) -> None:
        """Legacy: a :class:`DeferredLinear`'s ``(input, grad_output)``."""
        self.add(key, _LinearEntry(weight, bias, x, grad_out), x, grad_out)

    def pending(self, key: Key | None = None) -> int:
        if key is None:
            return sum(len(v) for v in self._entries.values())
        return len(self._entries.get(key, ()))

    def flush(self, stage: int, microbatch: int) -> int:
        """The W op: accumulate the deferred weight gradients of ``(stage, microbatch)``
        into ``.grad`` and free the stash. Returns the number of entries done."""
        entries = self._entries.pop((stage, microbatch), [])
        for entry in entries:
            entry.run()
        n = len(entries)
        entries.clear()  # drop tensors and meter handles now
        return n

    def clear(self) -> None:
        self._entries.clear()

    def stash_tensors(self, key: Key) -> list[torch.Tensor]:
        """The tensors the stash of ``key`` keeps for its W (linear inputs and output
        gradients, local graphs' output gradients): what the stash window (B→W) moves.
        A local graph's own saved tensors stay where they are (the graph holds them)."""
        return [t for e in self._entries.get(key, ()) for t in e.tensors()]

    def swap_stash(self, key: Key, new: Callable[[torch.Tensor], torch.Tensor],
                   counted: Callable[[torch.Tensor], bool]) -> None:
        """Replace every tensor the stash of ``key`` keeps by ``new(t)`` (the same values,
        elsewhere: on the host and back); the meter counts those for which ``counted``
        holds (the resident ones)."""
        for e in self._entries.get(key, ()):
            e.swap(new)
            e.handle = None  # drop the old count before counting again
            if self._hold is not None:
                e.handle = self._hold(*[t for t in e.tensors() if counted(t)])

    def report(self, stage: int) -> dict[str, Any]:
        """``{"deferred": ids of parameters that reached W, "bypassed": {reason: calls}}``."""
        return {"deferred": set(self.deferred.get(stage, ())), "bypassed": dict(self.bypassed.get(stage, {}))}


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    """``param.grad += grad`` in the parameter's dtype (as autograd's AccumulateGrad)."""
    if not param.requires_grad or grad is None:
        return
    if grad.dtype != param.dtype:
        grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class _LinearEntry:
    """W of one linear call: ``dW = gOᵀ·X`` (and ``db = Σ gO``)."""

    __slots__ = ("weight", "bias", "x", "grad_out", "handle")

    def __init__(self, weight, bias, x, grad_out) -> None:
        self.weight, self.bias, self.x, self.grad_out, self.handle = weight, bias, x, grad_out, None

    def tensors(self) -> list[torch.Tensor]:
        return [self.x, self.grad_out]

    def swap(self, new: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.x, self.grad_out = new(self.x), new(self.grad_out)

    def run(self) -> None:
        with torch.no_grad():
            with_bias = self.bias is not None and self.bias.requires_grad
            gw, gb = linear_weight_grads(self.x, self.grad_out, with_bias)
            _accumulate(self.weight, gw)
            if gb is not None:
                _accumulate(self.bias, gb)


# ----------------------------------------------------------------------------- the deferring mode

#: Parameter-only calls whose results are *derived* tensors (cheap and pure: replayed in W).
_DERIVING = frozenset({
    "t", "T", "mT", "H", "mH", "transpose", "swapaxes", "permute", "movedim", "view", "view_as", "reshape",
    "reshape_as", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten", "to", "float", "half",
    "bfloat16", "double", "type", "type_as", "contiguous", "__getitem__", "narrow", "select", "chunk", "split",
    "unbind", "repeat", "flip", "clone", "cat", "concat", "concatenate", "stack", "mul", "__mul__", "__rmul__",
    "div", "__truediv__", "add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "neg", "__neg__",
})
_LINEARS = (F.linear, torch._C._nn.linear)


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property getter such as Tensor.T
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class _Recipe:
    """How a derived tensor was made from parameters: ``func(*args, **kwargs)[index]``,
    with parameters and other recipes among ``args``/``kwargs``."""

    __slots__ = ("func", "leaves", "spec", "index")

    def __init__(self, func: Any, leaves: list, spec: Any, index: int | None) -> None:
        self.func, self.leaves, self.spec, self.index = func, leaves, spec, index

    def replay(self, leaf_of: dict[int, torch.Tensor]) -> torch.Tensor:
        """The derived tensor again, from fresh parameter leaves ``leaf_of`` (id -> leaf)."""
        vals = [x.replay(leaf_of) if isinstance(x, _Recipe) else leaf_of.get(id(x), x) for x in self.leaves]
        args, kwargs = pytree.tree_unflatten(vals, self.spec)
        out = self.func(*args, **kwargs)
        return out if self.index is None else out[self.index]

    def params(self) -> list[torch.Tensor]:
        out = []
        for x in self.leaves:
            if isinstance(x, _Recipe):
                out += x.params()
            elif isinstance(x, torch.Tensor):
                out.append(x)
        return out


class _DeferMode(TorchFunctionMode):
    """Watches the torch calls of one F and defers their weight-gradient work (module docstring)."""

    def __init__(self, store: WeightGradStore, key: Key, params: dict[int, torch.Tensor]) -> None:
        super().__init__()
        self.store, self.key, self.params = store, key, params
        self.derived: dict[int, tuple[torch.Tensor, _Recipe]] = {}
        #: ids of every parameter-side tensor: the parameters and the derived tensors
        #: (one lookup per argument on the hot path, where most calls touch activations only)
        self.side: dict[int, Any] = dict(params)
        self._deferred = store.deferred[key[0]]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Fast path, every torch call of the F: is any argument (one level deep)
        # parameter-side? Most are not. (An id is unique among live objects, and every
        # parameter-side tensor is kept alive, so a non-tensor never matches.)
        side = self.side
        for a in args:
            if id(a) in side:
                break
            if isinstance(a, (list, tuple)) and any(id(t) in side for t in a):
                break
        else:
            if not kwargs:
                return func(*args)
            for a in kwargs.values():
                if id(a) in side:
                    break
                if isinstance(a, (list, tuple)) and any(id(t) in side for t in a):
                    break
            else:
                return func(*args, **kwargs)
        if func in _LINEARS and not kwargs and 2 <= len(args) <= 3:  # every nn.Linear: straight to its deferral
            x, w, b = args[0], args[1], args[2] if len(args) == 3 else None
            params = self.params
            if (isinstance(x, torch.Tensor) and id(x) not in side and id(w) in params
                    and (b is None or id(b) in params) and w.requires_grad):
                self._targets([w] if b is None else [w, b])
                return _LinearDefer.apply(x, w, b, self.store, self.key)
        kwargs = kwargs or {}
        side, act = self._scan(args, kwargs)
        if not side:
            return func(*args, **kwargs)
        name = _func_name(func)
        if not act:
            return self._parameter_only(func, name, args, kwargs)
        if (name.endswith("_") and not name.endswith("__")) or kwargs.get("out") is not None:
            self._bypass("in-place")
            return func(*args, **kwargs)
        if func in _LINEARS and self._linear_fits(args, kwargs):
            return self._linear(args, kwargs)
        if name in _SCALES and not kwargs and len(args) == 2:
            w, x = (args[1], args[0]) if id(args[1]) in self.params else (args[0], args[1])
            if _scale_fits(x, w) and id(w) in self.params:
                self._targets([w])
                return _ScaleDefer.apply(x, w, self.store, self.key)
        return self._local_graph(func, args, kwargs)

    def _is_side(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self.side

    def _scan(self, args: tuple, kwargs: dict) -> tuple[bool, bool]:
        """(any parameter-side tensor, any other tensor) among the call's arguments (one level deep)."""
        side = act = False
        ids = self.side
        for a in (*args, *kwargs.values()):
            items = a if isinstance(a, (list, tuple)) else (a,)
            for t in items:
                if isinstance(t, torch.Tensor):
                    if id(t) in ids:
                        side = True
                    else:
                        act = True
        return side, act

    def _bypass(self, reason: str) -> None:
        self.store.bypassed[self.key[0]][reason] += 1

    def _parameter_only(self, func, name: str, args: tuple, kwargs: dict):
        """A call on parameters alone runs as usual; a cheap pure one's result is recorded
        as derived (replayed in W when a deferred call used it)."""
        out = func(*args, **kwargs)
        if name not in _DERIVING:
            return out
        leaves, spec = pytree.tree_flatten((args, kwargs))
        leaves = [self.derived[id(x)][1] if isinstance(x, torch.Tensor) and id(x) in self.derived else x
                  for x in leaves]
        outs = [(None, out)] if isinstance(out, torch.Tensor) else \
            list(enumerate(out)) if isinstance(out, (tuple, list)) else []
        for index, o in outs:
            if isinstance(o, torch.Tensor) and o.requires_grad and id(o) not in self.params:
                self.derived[id(o)] = (o, _Recipe(func, leaves, spec, index))
                self.side[id(o)] = o
        return out

    def _targets(self, tensors: list[torch.Tensor]) -> list[Any]:
        """Per parameter-side tensor: the parameter itself, or the recipe of a derived one."""
        out = []
        deferred = self._deferred
        for t in tensors:
            if id(t) in self.params:
                out.append(t)
                deferred.add(id(t))
            else:
                rec = self.derived[id(t)][1]
                out.append(rec)
                deferred.update(id(p) for p in rec.params() if id(p) in self.params)
        return out

    def _linear_fits(self, args: tuple, kwargs: dict) -> bool:
        x = args[0] if args else kwargs.get("input")
        w = args[1] if len(args) > 1 else kwargs.get("weight")
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        return (isinstance(x, torch.Tensor) and not self._is_side(x) and id(w) in self.params
                and (b is None or id(b) in self.params) and w.requires_grad)

    def _linear(self, args: tuple, kwargs: dict):
        x = args[0] if args else kwargs["input"]
        w = args[1] if len(args) > 1 else kwargs["weight"]
        b = args[2] if len(args) > 2 else kwargs.get("bias")
        self._targets([w] + ([b] if b is not None else []))
        return _LinearDefer.apply(x, w, b, self.store, self.key)

    def _local_graph(self, func, args: tuple, kwargs: dict):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        tensors = [leaves[i] for i in pos]
        side = [self._is_side(t) for t in tensors]
        if not any(s and t.requires_grad for s, t in zip(side, tensors)):
            return func(*args, **kwargs)  # frozen parameters: nothing to defer
        targets = self._targets([t for s, t in zip(side, tensors) if s])
        call = _Call(func, leaves, spec, pos, side, targets, self.store, self.key)
        outs = _LocalGraph.apply(call, *tensors)
        return call.rebuild_output(outs)


#: Elementwise products deferred by :class:`_ScaleDefer` (a norm's ``x * weight``).
_SCALES = frozenset({"mul", "__mul__", "__rmul__"})
_PLAIN = (torch.Tensor, nn.Parameter)


def _scale_fits(x: Any, w: Any) -> bool:
    """``x * w`` with ``w`` a trainable parameter and ``x`` an activation: plain tensors
    of one real floating dtype on one device (anything else takes the local graph)."""
    return (type(x) in _PLAIN and type(w) in _PLAIN and w.requires_grad and x.dtype == w.dtype
            and x.dtype.is_floating_point and x.device == w.device)


class _ScaleDefer(torch.autograd.Function):
    """``x * w`` (broadcasting) with a parameter ``w``: B computes ``gO·w`` for ``x``, W
    ``Σ gO·x`` for ``w`` (reduced to its shape, as autograd does). The same values and
    the same saved tensor as the local graph would give, without its nested backward
    calls: ``x`` goes through the saved-tensor hooks, ``w`` is kept by reference."""

    @staticmethod
    def forward(ctx, x, w, store, key):  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.w, ctx.store, ctx.key = w, store, key
        return torch.mul(x, w)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        w = ctx.w
        grad_x = grad_out * w if ctx.needs_input_grad[0] else None  # reduced to x's shape by autograd
        if ctx.store.is_deferring:
            entry = _ScaleEntry(w, x, grad_out)
            # Like a local graph: x is W's (counted until W, not moved by the stash window),
            # the output gradient is the stash's.
            entry.keep = ctx.store._hold(x) if ctx.store._hold is not None else None
            ctx.store.add(ctx.key, entry, grad_out)
            return grad_x, None, None, None
        return grad_x, _scale_weight_grad(x, grad_out, w), None, None


def _scale_weight_grad(x: torch.Tensor, grad_out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    g = grad_out * x
    return g.sum_to_size(w.shape) if g.shape != w.shape else g


class _ScaleEntry:
    """W of one :class:`_ScaleDefer` call: ``Σ gO·x`` into the parameter."""

    __slots__ = ("weight", "x", "grad_out", "handle", "keep")

    def __init__(self, weight, x, grad_out) -> None:
        self.weight, self.x, self.grad_out, self.handle, self.keep = weight, x, grad_out, None, None

    def tensors(self) -> list[torch.Tensor]:
        return [self.grad_out]

    def swap(self, new: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.grad_out = new(self.grad_out)

    def run(self) -> None:
        with torch.no_grad():
            _accumulate(self.weight, _scale_weight_grad(self.x, self.grad_out, self.weight))


def _autocast_cast(t: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """What autocast does to an argument of a lower-precision op (``F.linear``)."""
    if t is None or dtype is None or not t.is_floating_point() or t.dtype in (torch.float64, dtype):
        return t
    return t.to(dtype)


class _LinearDefer(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose weight gradient can wait for W."""

    @staticmethod
    def forward(ctx, x, weight, bias, store, key):  # type: ignore[override]
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)
            xc = _autocast_cast(x, dt)
            out = F.linear(xc, _autocast_cast(weight, dt), _autocast_cast(bias, dt))
        else:
            dt, xc = None, x
            out = F.linear(x, weight, bias)
        ctx.save_for_backward(xc)  # through the saved-tensor hooks: offload and the meter see it
        ctx.weight, ctx.bias, ctx.dt, ctx.store, ctx.key = weight, bias, dt, store, key
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        (xc,) = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        grad_in = grad_out.matmul(_autocast_cast(weight, ctx.dt)) if ctx.needs_input_grad[0] else None
        if ctx.store.is_deferring:
            ctx.store.add(ctx.key, _LinearEntry(weight, bias, xc, grad_out), xc, grad_out)
            return grad_in, None, None, None, None
        gw, gb = linear_weight_grads(xc, grad_out, bias is not None)
        gw = gw.to(weight.dtype) if ctx.needs_input_grad[1] else None
        gb = gb.to(bias.dtype) if gb is not None and ctx.needs_input_grad[2] else None
        return grad_in, gw, gb, None, None


class _Call:
    """One deferred call: the function, its flattened arguments and which tensors are
    parameter-side (with their W targets: a parameter or a derived tensor's recipe)."""

    def __init__(self, func, leaves, spec, pos, side, targets, store, key) -> None:
        self.func, self.leaves, self.spec, self.pos, self.side = func, leaves, spec, pos, side
        self.targets, self.store, self.key = targets, store, key
        self.is_tuple = False

    def run(self, tensors: tuple) -> tuple[Any, list[tuple[int, torch.Tensor]]]:
        """The call on a local graph: ``(output, [(tensor position, leaf)])`` where the
        leaves stand for the parameter-side tensors."""
        vals = list(self.leaves)
        leaves = []
        for k, (i, t, s) in enumerate(zip(self.pos, tensors, self.side)):
            if s:
                t = t.detach().requires_grad_(t.requires_grad)
                leaves.append((k, t))
            vals[i] = t
        args, kwargs = pytree.tree_unflatten(vals, self.spec)
        return self.func(*args, **kwargs), leaves

    def rebuild_output(self, outs: Any) -> Any:
        return outs


class _LocalGraph(torch.autograd.Function):
    """Any call with parameter-side tensors: a local graph, run for the activations in
    B and for the parameter side in W (module docstring)."""

    @staticmethod
    def forward(ctx, call: _Call, *tensors):  # type: ignore[override]
        with torch.enable_grad():
            out, leaves = call.run(tensors)
        call.leaves = None  # held tensors would keep activations alive (and resident under offload)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        call.is_tuple = isinstance(out, (tuple, list))
        ctx.call, ctx.leaves = call, leaves
        ctx.out_edges = [get_gradient_edge(o) if isinstance(o, torch.Tensor) and o.requires_grad else None
                         for o in outs]
        ctx.act_edges = [(k, get_gradient_edge(t)) for k, (t, s) in enumerate(zip(tensors, call.side))
                         if not s and t.requires_grad]
        res = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
        ctx.mark_non_differentiable(*[r for r, e in zip(res, ctx.out_edges)
                                      if isinstance(r, torch.Tensor) and e is None])
        return tuple(res) if call.is_tuple else res[0]

    @staticmethod
    def backward(ctx, *grad_outs):  # type: ignore[override]
        call, store = ctx.call, ctx.call.store
        pairs = [(e, g) for e, g in zip(ctx.out_edges, grad_outs) if e is not None and g is not None]
        grads: list[Any] = [None] * len(call.pos)
        deferring = store.is_deferring
        acts = [(k, e) for k, e in ctx.act_edges if ctx.needs_input_grad[1 + k]]
        inputs = [e for _, e in acts] + ([] if deferring else [t for _, t in ctx.leaves])
        if pairs and inputs:
            res = torch.autograd.grad([e for e, _ in pairs], inputs, [g for _, g in pairs],
                                      retain_graph=deferring, allow_unused=True)
            for k, g in zip([k for k, _ in acts] + [k for k, _ in ctx.leaves], res):
                grads[k] = g
        if deferring and pairs and ctx.leaves:
            gos = [g for _, g in pairs]
            store.add(call.key, _GraphEntry([e for e, _ in pairs], gos, ctx.leaves, call.targets), *gos)
        ctx.out_edges = ctx.act_edges = ctx.leaves = None  # the stash (if any) keeps what W needs
        return (None, *grads)


class _GraphEntry:
    """W of one local graph: gradients of its parameter-side leaves, into the parameters."""

    __slots__ = ("edges", "grad_outs", "leaves", "targets", "handle")

    def __init__(self, edges, grad_outs, leaves, targets) -> None:
        self.edges, self.grad_outs, self.leaves, self.targets, self.handle = edges, grad_outs, leaves, targets, None

    def tensors(self) -> list[torch.Tensor]:
        return list(self.grad_outs)

    def swap(self, new: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.grad_outs = [new(g) for g in self.grad_outs]

    def run(self) -> None:
        wanted = [(t, target) for (_, t), target in zip(self.leaves, self.targets) if t.requires_grad]
        if not wanted:
            return
        grads = torch.autograd.grad(self.edges, [t for t, _ in wanted], self.grad_outs, allow_unused=True)
        for (_, target), g in zip(wanted, grads):
            if g is None:
                continue
            if isinstance(target, _Recipe):
                _replay_into(target, g)
            else:
                _accumulate(target, g)


def _replay_into(recipe: _Recipe, grad: torch.Tensor) -> None:
    """Carry a derived tensor's gradient back to the parameters it was made from."""
    params = {id(p): p for p in recipe.params() if p.requires_grad}
    leaf_of = {k: p.detach().requires_grad_() for k, p in params.items()}
    with torch.enable_grad():
        out = recipe.replay(leaf_of)
    if not out.requires_grad:
        return
    got = torch.autograd.grad(out, list(leaf_of.values()), grad, allow_unused=True)
    for (k, _), g in zip(leaf_of.items(), got):
        if g is not None:
            _accumulate(params[k], g)
