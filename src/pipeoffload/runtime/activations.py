"""Activation stores: where the tensors autograd saves during an F live until its B.

This is the hook point for activation offload (PipeOffload, ALGORITHMS.md §5). The
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

An offloading store should (per §5): pass parameters and tiny tensors (≤ 1024
elements) through; record views of an already captured tensor as aliases; copy the
rest to pinned host buffers on a side stream and free device memory only after the
copy's event; reload before the B; and, on CPU with :class:`SavedTensorMeter`,
call ``handle.release()`` on the meter holder of what it moved off the device so
the measured level drops (the meter wraps what :meth:`pack` returns).
"""

from __future__ import annotations

from typing import Any

import torch


class ActivationStore:
    """Keep-everything base class; subclass and override to offload."""

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

    def end_step(self) -> None: ...


class KeepActivations(ActivationStore):
    """The default: no offload."""
