"""Activation-memory meters: how many bytes of activations a rank holds, now and at peak.

Two implementations with one interface (:class:`MemoryMeter`):

- :class:`SavedTensorMeter` (CPU, and any device when asked): counts the bytes of
  live tensors saved for backward — every tensor autograd saves during an F goes
  through a ``saved_tensors_hooks`` pack hook that wraps it in a small holder; a
  storage is counted once however many holders share it (keyed by its data pointer),
  and uncounted when its last holder dies (autograd frees saved tensors during B).
  Tensors the runtime keeps on purpose (a stage's input until B, the weight-gradient
  store's ``(input, grad_output)`` stash until W) are held through :meth:`hold`.
  Parameters and module buffers are excluded. Deterministic: the same ops give the
  same bytes on every run. With activation offload the store reports each storage
  it frees on the device (:meth:`MemoryMeter.offloaded`) and brings back
  (:meth:`MemoryMeter.reloaded`): the level is the *device-resident* bytes, while
  the bytes on the host are reported by the store (``OffloadStore.stats``).
- :class:`CudaAllocatorMeter`: the paper metric, from the CUDA caching allocator:
  ``memory_allocated() − (value at step start)``, peak from ``max_memory_allocated``.

Levels and peaks are relative to the level at :meth:`MemoryMeter.start_step`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

import torch

try:  # what torch.cuda.memory_allocated uses to resolve its device argument
    from torch.cuda._utils import _get_device_index
except ImportError:  # pragma: no cover - then the public functions are used
    _get_device_index = None


class MemoryMeter:
    """Interface. ``level()``/``peak()`` in bytes relative to the last ``start_step``."""

    name = "none"

    def start_step(self) -> None: ...

    def level(self) -> float:
        return 0.0

    def peak(self) -> float:
        return 0.0

    def wrap(self, packed: Any, tensor: torch.Tensor) -> Any:
        """Called by the pack hook with the activation store's packed object."""
        return packed

    def unwrap(self, obj: Any) -> Any:
        return obj

    def saved_tensor_hooks(self) -> tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]:
        """``(pack, unpack)`` for ``torch.autograd.graph.saved_tensors_hooks`` that keep
        each saved tensor as it is (a detached alias: holding the tensor itself would tie
        it to its grad_fn in a reference cycle) and count it: what the runner uses when no
        activation store moves anything, and what torch's side of the bench uses."""
        wrap = self.wrap
        return (lambda t: wrap(t.detach(), t)), self.unwrap

    def hold(self, *tensors: torch.Tensor) -> Any:
        """Count ``tensors`` until the returned handle is dropped (or released)."""
        return None

    def mark(self) -> None:
        """Start tracking the highest level from now (an op's in-op peak)."""

    def peak_since_mark(self) -> float:
        """The highest level since :meth:`mark` (this meter: the current level)."""
        return self.level()

    def offloaded(self, storage: torch.UntypedStorage) -> Any:
        """An activation store is about to free ``storage`` on the device (its bytes
        now live on the host). Returns a token for :meth:`reloaded`."""
        return None

    def reloaded(self, token: Any, storage: torch.UntypedStorage) -> None:
        """The storage of ``token`` is back on the device (possibly at a new address)."""


class _Entry:
    """One counted storage. ``resident`` is False while an activation store has it offloaded."""

    __slots__ = ("ptr", "nbytes", "count", "resident")

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes, self.count, self.resident = ptr, nbytes, 1, True


class _Holder:
    """Keeps storages counted while alive. ``value`` is what the pack hook packed."""

    __slots__ = ("meter", "keys", "value", "__weakref__")

    def __init__(self, meter: "SavedTensorMeter", keys: list[_Entry], value: Any) -> None:
        self.meter, self.keys, self.value = meter, keys, value

    def release(self) -> None:
        keys, self.keys = self.keys, []
        if keys:
            self.meter._release(keys)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


class SavedTensorMeter(MemoryMeter):
    """Bytes of live saved-for-backward and held tensors (see module docstring).

    Offload-aware: :meth:`offloaded` stops counting a storage while an activation
    store keeps its bytes on the host (its holders stay attached), :meth:`reloaded`
    counts it again at its new address; holders released meanwhile are honoured.
    """

    name = "saved-tensors"

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, _Entry] = {}  # data_ptr -> entry (resident storages)
        self._level = 0
        self._base = 0
        self._peak = 0
        self._mark_peak = 0
        self._lock = threading.Lock()  # backward may run on another thread (CUDA)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        self._exclude.update(t.untyped_storage().data_ptr() for t in tensors)

    def start_step(self) -> None:
        with self._lock:
            self._base = self._level
            self._peak = self._level

    def level(self) -> float:
        return float(self._level - self._base)

    def peak(self) -> float:
        return float(self._peak - self._base)

    def mark(self) -> None:
        self._mark_peak = self._level

    def peak_since_mark(self) -> float:
        return float(self._mark_peak - self._base)

    def _acquire(self, tensors: Iterable[torch.Tensor]) -> list[_Entry]:
        keys = []
        with self._lock:
            for t in tensors:
                if t is None or not isinstance(t, torch.Tensor) or t.is_meta:
                    continue
                st = t.untyped_storage()
                ptr, nbytes = st.data_ptr(), st.nbytes()
                if nbytes == 0 or ptr in self._exclude:
                    continue
                ent = self._live.get(ptr)
                if ent is None:
                    ent = self._live[ptr] = _Entry(ptr, nbytes)
                    self._level += nbytes
                    if self._level > self._peak:
                        self._peak = self._level
                    if self._level > self._mark_peak:
                        self._mark_peak = self._level
                else:
                    ent.count += 1
                keys.append(ent)
        return keys

    def _release(self, keys: list[_Entry]) -> None:
        with self._lock:
            for ent in keys:
                ent.count -= 1
                if ent.count == 0:
                    if ent.resident:
                        self._level -= ent.nbytes
                    if self._live.get(ent.ptr) is ent:
                        del self._live[ent.ptr]

    def wrap(self, packed: Any, tensor: torch.Tensor) -> Any:
        # A packed object that keeps no device storage (e.g. a recompute recipe) is not counted.
        keep = getattr(packed, "keeps_storage", True)
        return _Holder(self, self._acquire([tensor]) if keep else [], packed)

    def unwrap(self, obj: Any) -> Any:
        return obj.value

    def hold(self, *tensors: torch.Tensor) -> _Holder:
        return _Holder(self, self._acquire(tensors), None)

    def offloaded(self, storage: torch.UntypedStorage) -> _Entry | None:
        with self._lock:
            ent = self._live.pop(storage.data_ptr(), None)
            if ent is not None and ent.resident:
                ent.resident = False
                self._level -= ent.nbytes
            return ent

    def reloaded(self, token: Any, storage: torch.UntypedStorage) -> None:
        if token is None:
            return
        with self._lock:
            ent: _Entry = token
            if ent.resident or ent.count == 0:  # nobody holds it any more
                return
            ent.ptr, ent.nbytes, ent.resident = storage.data_ptr(), storage.nbytes(), True
            self._live[ent.ptr] = ent
            self._level += ent.nbytes
            if self._level > self._peak:
                self._peak = self._level
            if self._level > self._mark_peak:
                self._mark_peak = self._level

    def live_bytes(self) -> int:
        """Absolute bytes counted now (0 when nothing is held: no leak)."""
        return self._level


class CudaAllocatorMeter(MemoryMeter):
    """Allocator-based meter (the paper's metric): peak minus step-start allocated.

    Read per op (twice or more), so :meth:`level` takes the one figure it needs from
    the allocator's statistics: ``torch.cuda.memory_allocated`` gives the same number
    but flattens and sorts every statistic (about 150) into a new dict on each call."""

    name = "cuda-allocator"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0

    def start_step(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base = _cuda_allocated(self.device, "current")

    def level(self) -> float:
        return float(_cuda_allocated(self.device, "current") - self._base)

    def peak(self) -> float:
        return float(_cuda_allocated(self.device, "peak") - self._base)


def _cuda_allocated(device: torch.device, which: str) -> int:
    """``allocated_bytes.all.<which>`` of ``device`` ("current": ``memory_allocated``,
    "peak": ``max_memory_allocated``), from the nested statistics those functions
    flatten (same values; 0 before CUDA is initialised, as they give)."""
    stats = getattr(torch._C, "_cuda_memoryStats", None)
    if stats is None or _get_device_index is None:  # no such binding: the public, slower path
        return (torch.cuda.memory_allocated if which == "current" else torch.cuda.max_memory_allocated)(device)
    if not torch.cuda.is_initialized():
        return 0
    got = stats(_get_device_index(device, optional=True))
    return int(got.get("allocated_bytes", {}).get("all", {}).get(which, 0))


def make_meter(device: torch.device, kind: str = "auto", exclude: Iterable[torch.Tensor] = ()) -> MemoryMeter:
    """``kind``: "auto" (allocator on CUDA, saved tensors elsewhere), "saved", "cuda" or "none"."""
    if kind == "auto":
        kind = "cuda" if device.type == "cuda" else "saved"
    if kind == "cuda":
        return CudaAllocatorMeter(device)
    if kind == "saved":
        return SavedTensorMeter(exclude)
    if kind == "none":
        return MemoryMeter()
    from ..errors import ParameterError

    raise ParameterError("runtime.memory_meter", f"unknown meter {kind!r}; valid: auto, saved, cuda, none")
