"""Activation stores: where the tensors autograd saves during an F live until its B.

This is the hook point for activation offload (PipeOffload, docs/algorithms.md#54-how-the-runtime-moves-activations). The
executor wraps every F op in ``torch.autograd.graph.saved_tensors_hooks`` whose pack
and unpack call :meth:`ActivationStore.pack` / :meth:`ActivationStore.unpack` with
the op's ``(stage, microbatch)``, and dispatches the offload pass's ops to the store:

====================  ==========================================================
op                    store call (in program order, on the rank's main thread)
====================  ==========================================================
``OFFLOAD_START``     :meth:`offload_start` — begin the device→host copy
``OFFLOAD_END``       :meth:`offload_end` — copy done; release device memory
``RELOAD_START``      :meth:`reload_start` — allocate device buffers, begin host→device
``RELOAD_END``        :meth:`reload_end` — copy done; B may unpack
====================  ==========================================================

Each call is recorded in the measured timeline on the "d2h"/"h2d" lane. After the
B (or BW) of ``(stage, microbatch)`` the executor calls :meth:`release`;
at the end of a step, :meth:`end_step`. The default :class:`KeepActivations` keeps
everything where autograd put it (no offload).

Two more hooks frame the capture: :meth:`bind` (once, from the runner: device,
meter, parameter/buffer tensors, and the ``(stage, microbatch)`` pairs the program
offloads) and :meth:`capture` (a context around each F, told which tensors the
runtime owns, i.e. the stage input it keeps until B).

:class:`~pipeoffload.runtime.offload_store.OffloadStore` is PipeOffload's store
(docs/algorithms.md#54-how-the-runtime-moves-activations): parameters and tiny tensors pass through, views of a captured
storage are recorded as aliases (base + size/stride/offset), the rest is copied to
(pinned) host buffers on a d2h stream and freed on the device; reloaded on an h2d
stream before the B; it tells the meter (:meth:`MemoryMeter.offloaded` /
:meth:`MemoryMeter.reloaded`) so the measured level is the device-resident bytes.

Recompute hints: model code may declare a cheap elementwise result recomputable with
:func:`recomputable` (``out == fn(*inputs)`` bit for bit); a store that honours it
(``OffloadStore(recompute=True)``) keeps the recipe instead of the bytes and
recomputes in backward. Outside such a store's capture the call is a no-op.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, ContextManager, Iterable

import torch


class ActivationStore:
    """Keep-everything base class; subclass and override to offload."""

    def bind(self, *, device: torch.device, meter: Any, exclude: Iterable[torch.Tensor],
             offloaded: Iterable[tuple[int, int]]) -> None:
        """Called once by the runner: its device, memory meter, the tensors never to
        move (parameters, buffers) and the ``(stage, microbatch)`` pairs whose
        activations the program offloads (they have OFFLOAD_START/RELOAD_END ops)."""

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Never move these tensors either (weights gathered after :meth:`bind`, e.g.
        an FSDP layer group unsharded for the step)."""

    def capture(self, stage: int, microbatch: int, owned: tuple[torch.Tensor, ...] = ()) -> ContextManager:
        """Context around the F of ``(stage, microbatch)``. ``owned``: tensors the
        runtime keeps until B only for autograd (the stage input); a store may
        release and restore their storage together with the saved tensors."""
        return contextlib.nullcontext()

    def stats(self) -> dict | None:
        """What the last step moved (JSON-ready), or None for a store that moves nothing."""
        return None

    def pack(self, stage: int, microbatch: int, tensor: torch.Tensor) -> Any:
        # A detached alias (same storage): holding the tensor itself would tie it to its
        # grad_fn and make a reference cycle node → saved → tensor → node.
        return tensor.detach()

    def unpack(self, stage: int, microbatch: int, packed: Any) -> torch.Tensor:
        return packed

    def offload_start(self, stage: int, microbatch: int) -> None: ...

    def offload_end(self, stage: int, microbatch: int) -> None: ...

    def reload_start(self, stage: int, microbatch: int) -> None: ...

    def reload_end(self, stage: int, microbatch: int) -> None: ...

    def release(self, stage: int, microbatch: int) -> None: ...

    # The stash window (B→W, STASH_* ops): ``stash`` is the runner's
    # :class:`~pipeoffload.runtime.weight_grad.WeightGradStore`; the base keeps the stash resident.
    def stash_offload_start(self, stage: int, microbatch: int, stash: Any) -> None: ...

    def stash_offload_end(self, stage: int, microbatch: int, stash: Any) -> None: ...

    def stash_reload_start(self, stage: int, microbatch: int, stash: Any) -> None: ...

    def stash_reload_end(self, stage: int, microbatch: int, stash: Any) -> None: ...

    def end_step(self) -> None: ...


class KeepActivations(ActivationStore):
    """The default: no offload."""


# ---------------------------------------------------------------------------- recompute hints

_RECIPES = threading.local()


class RecipeBook:
    """Recompute recipes declared during one F, found by output identity or, for a view
    of an output that owns its whole storage (``x.view(-1, h)`` saved by a matmul), by
    storage. Holds outputs and inputs until :meth:`clear` (the end of the F), so ids and
    storages are never reused while an entry lives."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple] = {}
        self._by_storage: dict[int, tuple] = {}

    def add(self, output: torch.Tensor, fn: Callable[..., torch.Tensor], inputs: tuple) -> None:
        # Versions at declaration: an in-place change afterwards voids the recipe.
        versions = tuple(a._version if isinstance(a, torch.Tensor) else None for a in (output,) + tuple(inputs))
        e = (output, fn, inputs, versions)
        self._by_id[id(output)] = e
        st = output.untyped_storage()
        if output.is_contiguous() and output.storage_offset() == 0 and \
                output.numel() * output.element_size() == st.nbytes():
            self._by_storage[st._cdata] = e

    def find(self, t: torch.Tensor) -> tuple[torch.Tensor, Callable[..., torch.Tensor], tuple] | None:
        """``(output, fn, inputs)`` when ``t`` is a declared output or a view of one,
        and neither it nor an input was modified in place since the declaration."""
        e = self._by_id.get(id(t))
        if e is None or e[0] is not t:
            e = self._by_storage.get(t.untyped_storage()._cdata)
            if e is None or e[0].dtype != t.dtype:
                return None
        out, fn, inputs, versions = e
        now = tuple(a._version if isinstance(a, torch.Tensor) else None for a in (out,) + tuple(inputs))
        return (out, fn, inputs) if now == versions else None

    def clear(self) -> None:
        self._by_id.clear()
        self._by_storage.clear()

    def __len__(self) -> int:
        return len(self._by_id)


@contextlib.contextmanager
def recording_recipes(book: RecipeBook | None):
    """Make :func:`recomputable` record into ``book`` (None: ignore hints) inside the block."""
    prev = getattr(_RECIPES, "book", None)
    _RECIPES.book = book
    try:
        yield book
    finally:
        _RECIPES.book = prev


def recompute_active() -> bool:
    """True inside the F of a store that honours :func:`recomputable` hints."""
    return getattr(_RECIPES, "book", None) is not None


def recomputable(output: torch.Tensor, fn: Callable[..., torch.Tensor], *inputs: Any) -> torch.Tensor:
    """Declare ``output == fn(*inputs)`` (bit for bit, cheap, elementwise): a store
    recording recipes keeps ``inputs`` instead of ``output`` and calls ``fn`` again
    in backward. Returns ``output``. A no-op outside such a store's capture."""
    book = getattr(_RECIPES, "book", None)
    if book is not None and torch.is_grad_enabled():
        book.add(output, fn, inputs)
    return output
