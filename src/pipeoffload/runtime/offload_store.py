"""OffloadStore: PipeOffload's activation offload, driven by the schedule's offload ops.

The offload pass (:mod:`pipeoffload.passes.offload`) puts OFFLOAD_START/END and
RELOAD_START/END ops into each rank's program; the executor calls the store for them
(see :mod:`pipeoffload.runtime.activations`). What the store does (docs/algorithms.md#54-how-the-runtime-moves-activations):

Capture (during an offloaded F, through the saved-tensor pack hook)
    Parameters, module buffers, tensors on another device and *tiny* storages
    (≤ 1024 elements) pass through untouched. Every other saved tensor is recorded
    by its storage: the first tensor of a storage creates the storage's record (the
    base), every tensor of an already captured storage — a view, or the same tensor
    saved again — is an alias ``(base, dtype, size, stride, storage offset)``, so it
    is rebuilt as a view of the reloaded base. The runtime's stage input (``owned``)
    is captured too. With ``recompute=True``, tensors declared by the model with
    :func:`~pipeoffload.runtime.activations.recomputable` (norm outputs, SwiGLU's
    activation) are kept as recipes over their inputs and recomputed in backward.

OFFLOAD_START — begin the device→host copy
    Only storages that nothing else references are moved: the storage's use count
    must be exactly the store's own reference (+1 per owned tensor). A storage still
    held elsewhere (a send in flight, the next layer group's input, the caller's
    data, a module constant) stays resident — counted as *kept* — so offload never
    changes what any other code sees. The moved storages are packed into one host
    buffer (pinned on CUDA) from a pool keyed by size and reused across iterations.
    CUDA: the d2h stream waits on an event recorded on the compute stream (the F
    is done), copies asynchronously, records an event.

OFFLOAD_END — copy done; release device memory
    The compute stream waits for the copy's event (a no-op when the plan gave the
    copy enough time), then each moved storage is resized to 0 bytes: its memory
    goes back to the caching allocator, reusable at once by later compute work,
    however many tensors (views, the runtime's stage input) still point at it. The
    meter is told (:meth:`~pipeoffload.runtime.meter.MemoryMeter.offloaded`).

RELOAD_START / RELOAD_END — host→device before the B
    The storages get their bytes again *in place* (same storage objects, new
    memory, by default from the compute stream's pool: ``reload_alloc``) and the
    h2d copy starts once the d2h copy and the compute work issued before it are
    done; RELOAD_END makes the compute stream wait on the copy's event and returns
    the host buffer to the pool. Every alias, the stage input and the meter's
    holders are valid again, so the B (and a later W) computes exactly what it
    would have without offload: bitwise-identical gradients.

Both ends follow the plan on the GPU's own timeline: a copy starts when the compute
stream reaches its START op, however far the host has run ahead, and the compute
stream waits at an END op for a copy the plan did not give enough time. Measured on
an H100 in docs/gpu.md.

After the B (``release``)
    The store drops its references: each reloaded storage is freed as soon as
    autograd (and the weight-gradient stash, until W) is done with it — the same
    lifetime as without offload.

Errors (:class:`OffloadError`): an offloaded group that is never reloaded (at the
B, or at the end of the step), reloaded twice, reloaded before it was offloaded,
offloaded twice, or a B unpacking activations that are still on the host.

On CPU the same code runs with the streams as no-ops (copies are synchronous
memcpy); the "device" storage is really freed, so the :class:`SavedTensorMeter`
level is the resident bytes and the host pool is a separate accounting domain
(:meth:`OffloadStore.stats`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch

from .activations import ActivationStore, RecipeBook, recording_recipes

__all__ = ["OffloadStore", "OffloadError", "HostPool", "TINY_ELEMENTS", "RELOAD_ALLOC"]

#: Where reloaded storages are allocated on CUDA (see :class:`OffloadStore`).
RELOAD_ALLOC = ("compute", "copy")

#: Storages of at most this many elements pass through (not worth a transfer).
TINY_ELEMENTS = 1024
_ALIGN = 256  #: byte alignment of each storage inside a packed host buffer
_POOL_GRANULE = 4096  #: host buffers are sized in multiples of this (reuse across slight size changes)

# Group states, in order.
CAPTURING, CAPTURED, OFFLOADING, OFFLOADED, RELOADING, RELOADED = (
    "capturing", "captured", "offloading", "offloaded", "reloading", "reloaded")


class OffloadError(RuntimeError):
    """The offload/reload ops of a program are inconsistent (see module docstring)."""


def _use_count(storage: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


# ----------------------------------------------------------------------------- host pool


@dataclass
class _HostBuffer:
    tensor: torch.Tensor  #: uint8, pinned on CUDA
    size: int  #: capacity in bytes
    ready: Any = None  #: CUDA event after which the buffer may be overwritten (last h2d read)


class HostPool:
    """Host buffers reused across iterations, keyed by (rounded) size; pinned when
    ``pin``. ``in_use``/``peak_in_use`` count requested bytes, ``reserved`` the
    capacity of every buffer the pool has allocated."""

    def __init__(self, pin: bool = False, granule: int = _POOL_GRANULE) -> None:
        self.pin, self.granule = pin, granule
        self._free: dict[int, list[_HostBuffer]] = {}
        self.in_use = 0
        self.peak_in_use = 0
        self.reserved = 0
        self.hits = 0
        self.misses = 0

    def acquire(self, nbytes: int) -> _HostBuffer:
        size = max(self.granule, -(-nbytes // self.granule) * self.granule)
        free = self._free.get(size)
        if free:
            buf = free.pop()
            self.hits += 1
        else:
            buf = _HostBuffer(torch.empty(size, dtype=torch.uint8, pin_memory=self.pin), size)
            self.reserved += size
            self.misses += 1
        self.in_use += nbytes
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return buf

    def release(self, buf: _HostBuffer, nbytes: int, ready: Any = None) -> None:
        buf.ready = ready
        self.in_use -= nbytes
        self._free.setdefault(buf.size, []).append(buf)

    def reset_peak(self) -> None:
        self.peak_in_use = self.in_use

    def clear(self) -> None:
        """Drop every free buffer (buffers in use are dropped when released)."""
        for lst in self._free.values():
            for b in lst:
                self.reserved -= b.size
        self._free.clear()


# ----------------------------------------------------------------------------- copy lanes


class _Lanes:
    """The copy streams: on CUDA one d2h and one h2d stream with events; elsewhere
    every method is a no-op and copies run synchronously on the calling thread."""

    def __init__(self, device: torch.device, timing: bool) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.timing = timing and self.cuda
        if self.cuda:
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)
        else:
            self.d2h = self.h2d = None

    def compute(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.cuda else None

    def record(self, stream: Any, timing: bool = False) -> Any:
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream)
        return ev

    def wait(self, stream: Any, event: Any) -> None:
        if self.cuda and event is not None:
            stream.wait_event(event)

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        if self.cuda:
            t.record_stream(stream)

    @property
    def non_blocking(self) -> bool:
        return self.cuda


# ----------------------------------------------------------------------------- captured state


class _Record:
    """One captured device storage of a group (the base of its aliases)."""

    __slots__ = ("storage", "nbytes", "owned", "host_off", "token", "moved")

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.owned = 0  #: references the runtime holds on purpose (stage input)
        self.host_off = -1
        self.token: Any = None  #: the meter's handle while offloaded
        self.moved = False


class _Slot:
    """A saved tensor = a view of a captured storage. Slots (held by autograd's saved
    variables) keep their record, hence the storage, alive: once the B has started the
    group lets go, so a storage dies with its last saved tensor, as without offload."""

    __slots__ = ("group", "rec", "dtype", "size", "stride", "offset", "holder")
    keeps_storage = True

    def __init__(self, group: "_Group", rec: _Record, t: torch.Tensor, holder: Any = None) -> None:
        self.group, self.rec, self.holder = group, rec, holder
        self.dtype, self.size, self.stride, self.offset = t.dtype, tuple(t.shape), t.stride(), t.storage_offset()

    def materialize(self) -> torch.Tensor:
        rec, g = self.rec, self.group
        if rec.moved and g.state != RELOADED:
            raise OffloadError(f"{g.name}: its backward needs activations that are on the host "
                               f"(state {g.state}; RELOAD_END must come before the B)")
        if g.records:
            g.let_go()
        return torch.empty(0, dtype=self.dtype, device=rec.storage.device).set_(
            rec.storage, self.offset, self.size, self.stride)


class _Recipe:
    """A saved tensor kept as ``fn(*args)`` and recomputed (once) in backward."""

    __slots__ = ("group", "fn", "args", "uses", "value", "nbytes", "shape", "stride")
    keeps_storage = False

    def __init__(self, group: "_Group", fn: Callable[..., torch.Tensor], out: torch.Tensor) -> None:
        self.group, self.fn, self.args, self.uses, self.value = group, fn, (), 0, None
        self.nbytes = out.untyped_storage().nbytes()
        self.shape, self.stride = tuple(out.shape), out.stride()

    def materialize(self) -> torch.Tensor:
        v = self.value
        if v is None:
            args = [a.materialize() if isinstance(a, _PACKED) else a for a in self.args]
            with torch.no_grad():
                v = self.fn(*args)
            if tuple(v.shape) != self.shape or v.stride() != self.stride:
                raise OffloadError(f"{self.group.name}: recomputing {getattr(self.fn, '__name__', self.fn)} gave "
                                   f"shape {tuple(v.shape)} stride {v.stride()}, the forward had {self.shape} "
                                   f"{self.stride}")
        self.uses -= 1
        self.value = v if self.uses > 0 else None  # cached until every consumer has it
        return v


class _RecipeView:
    """A saved view of a recomputed output (e.g. the 2-D view a matmul saves)."""

    __slots__ = ("recipe", "size", "stride", "offset")
    keeps_storage = False

    def __init__(self, recipe: _Recipe, t: torch.Tensor) -> None:
        self.recipe, self.size, self.stride, self.offset = recipe, tuple(t.shape), t.stride(), t.storage_offset()

    def materialize(self) -> torch.Tensor:
        v = self.recipe.materialize()
        return v.as_strided(self.size, self.stride, v.storage_offset() + self.offset)


_PACKED = (_Slot, _Recipe, _RecipeView)


@dataclass
class _Group:
    """What one (layer group, microbatch) F saved, and where it is."""

    key: tuple[int, int]
    state: str = CAPTURING
    records: dict[int, _Record] = field(default_factory=dict)  # storage cdata -> record
    recipes: dict[int, _Recipe] = field(default_factory=dict)  # id(output) -> recipe
    keys: list[int] = field(default_factory=list)  # the records' storages, kept after let_go
    recomputed_bytes: int = 0
    moved: list[_Record] = field(default_factory=list)
    host: _HostBuffer | None = None
    host_bytes: int = 0
    ev_d2h: Any = None
    ev_h2d: Any = None
    t_d2h: tuple = ()
    t_h2d: tuple = ()

    @property
    def name(self) -> str:
        return f"layer group {self.key[0]}, microbatch {self.key[1]}"

    def let_go(self) -> None:
        """Drop the group's own references to records and recipes (the B has them)."""
        self.keys = list(self.records)
        self.recomputed_bytes = sum(r.nbytes for r in self.recipes.values())
        self.records = {}
        self.recipes = {}
        self.moved = [r for r in self.moved if r.moved]  # (none once reloaded)


# ----------------------------------------------------------------------------- the store


class OffloadStore(ActivationStore):
    """Offload the activations of the ``(stage, microbatch)`` pairs the program
    offloads to host memory, and bring them back before their B (module docstring).

    Args:
        recompute: True or "elementwise" (a :class:`~pipeoffload.recompute.Recompute`): honour
            :func:`~pipeoffload.runtime.activations.recomputable` hints
            in offloaded groups (recompute instead of moving those bytes).
        timing: on CUDA, time every copy with events (:meth:`stats` then has the
            device-side copy seconds; costs a synchronisation of the copy streams at
            the end of each step).
        tiny: storages of at most this many elements pass through (not worth a copy).
        reload_alloc: which CUDA stream the reloaded storages are allocated on:
            "compute" (default; the memory comes from, and returns to, the compute
            stream's pool, so what an offload frees serves the reload; the h2d copy
            first waits for the compute work issued before RELOAD_START) or "copy" (the
            h2d stream's own pool: the copy need not wait for compute, but reserved
            memory grows by the reloaded bytes).

    Raises:
        ParameterError: an unknown ``reload_alloc``.
        OffloadError: inside a step, when the program offloads a group that was never
            captured, reloads one never offloaded, or ends with one never reloaded.

    Guarantees:
        - Every offloaded tensor comes back bit for bit before the backward that needs
          it (the reload is awaited on the compute stream), so gradients equal those of
          training without offload.
        - Storages shared with what the runtime keeps (the stage input) or excluded
          (parameters, gathered weights) are never offloaded.
        - Copies run on their own CUDA streams, overlapped with compute; on CPU they
          are memcpy's into a host pool.
    """

    def __init__(self, recompute: bool | str = False, *, timing: bool = False, tiny: int = TINY_ELEMENTS,
                 reload_alloc: str = "compute") -> None:
        from ..errors import ParameterError
        from ..recompute import Recompute

        if reload_alloc not in RELOAD_ALLOC:
            raise ParameterError("reload_alloc", f"unknown value {reload_alloc!r}; valid: {', '.join(RELOAD_ALLOC)}")
        level = Recompute.of(recompute, "recompute")  # True / "elementwise": the elementwise outputs
        if level not in (Recompute.NONE, Recompute.ELEMENTWISE):
            raise ParameterError("recompute", f"the store recomputes elementwise outputs only: none or elementwise "
                                              f"(False/True), got {level}")
        self.recompute = level.elementwise
        self.reload_alloc = reload_alloc
        self.timing = timing
        self.tiny = tiny
        self.device = torch.device("cpu")
        self.meter: Any = None
        self._exclude: set[int] = set()
        self._offloaded: frozenset[tuple[int, int]] | None = None
        self._groups: dict[tuple[int, int], _Group] = {}
        self._capturing: dict[tuple[int, int], _Group] = {}
        self._book: RecipeBook | None = None
        self._shared: dict[int, int] = {}  # storage cdata -> number of live groups holding a record of it
        self._stashes: dict[tuple[int, int], _Stash] = {}  # (stage, mb) -> W stash on its way to/from the host
        self.pool = HostPool(pin=False)
        self._lanes = _Lanes(self.device, timing)
        self._last: dict[str, Any] | None = None
        self._new_stats()

    # ------------------------------------------------------------------ binding
    def bind(self, *, device: torch.device, meter: Any, exclude: Iterable[torch.Tensor],
             offloaded: Iterable[tuple[int, int]]) -> None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.meter = meter
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._offloaded = frozenset(offloaded)
        self.pool = HostPool(pin=self.device.type == "cuda")
        self._lanes = _Lanes(self.device, self.timing)
        self.reset()

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        self._exclude.update(t.untyped_storage().data_ptr() for t in tensors)

    def reset(self) -> None:
        """Forget every group (after a failed step)."""
        for g in self._groups.values():
            if g.host is not None:
                self.pool.release(g.host, g.host_bytes)
        self._groups.clear()
        self._capturing.clear()
        self._shared.clear()
        self._stashes.clear()
        self._new_stats()

    def close(self) -> None:
        """Forget every group and free the pool's host buffers."""
        self.reset()
        self.pool.clear()

    def offloads(self, stage: int, microbatch: int) -> bool:
        """Whether the program offloads ``(stage, microbatch)`` (all pairs when unbound)."""
        return self._offloaded is None or (stage, microbatch) in self._offloaded

    # ------------------------------------------------------------------ capture
    @contextlib.contextmanager
    def capture(self, stage: int, microbatch: int, owned: tuple[torch.Tensor, ...] = ()) -> Iterator[None]:
        key = (stage, microbatch)
        if not self.offloads(stage, microbatch):
            yield
            return
        if key in self._groups:
            raise OffloadError(f"layer group {stage}, microbatch {microbatch}: F ran again before its B")
        g = self._groups[key] = _Group(key)
        self._capturing[key] = g
        book = RecipeBook() if self.recompute else None
        self._book = book
        try:
            with recording_recipes(book):
                yield
        finally:
            self._capturing.pop(key, None)
            self._book = None
            if book is not None:
                book.clear()
        for t in owned:
            if isinstance(t, torch.Tensor) and not self._passes_through(t):
                self._record(g, t).owned += 1
        g.state = CAPTURED

    def pack(self, stage: int, microbatch: int, tensor: torch.Tensor) -> Any:
        g = self._capturing.get((stage, microbatch))
        if g is None:
            return tensor.detach()
        return self._pack(g, tensor)

    def unpack(self, stage: int, microbatch: int, packed: Any) -> torch.Tensor:
        if isinstance(packed, _PACKED):
            return packed.materialize()
        return packed

    def _passes_through(self, t: torch.Tensor) -> bool:
        if type(t) is not torch.Tensor or t.is_meta or t.layout is not torch.strided or t.is_conj() or t.is_neg():
            return True  # parameters (a subclass), tensor subclasses, sparse, lazy conj/neg views
        if t.device != self.device:
            return True
        st = t.untyped_storage()
        return st.data_ptr() in self._exclude or st.nbytes() <= self.tiny * t.element_size()

    def _record(self, g: _Group, t: torch.Tensor) -> _Record:
        st = t.untyped_storage()
        rec = g.records.get(st._cdata)
        if rec is None:
            rec = g.records[st._cdata] = _Record(st)
            self._shared[st._cdata] = self._shared.get(st._cdata, 0) + 1
        return rec

    def _pack(self, g: _Group, t: Any, held: bool = False) -> Any:
        """``held``: packed for a recipe, not by autograd: the meter counts it through the
        group (until its release) since no autograd holder does."""
        if not isinstance(t, torch.Tensor):
            return t  # a recipe's constant argument
        if self._book is not None:
            hit = self._book.find(t)
            if hit is not None:
                out, fn, inputs = hit
                r = g.recipes.get(id(out))
                if r is None:
                    r = g.recipes[id(out)] = _Recipe(g, fn, out)
                    r.args = tuple(self._pack(g, a, held=True) for a in inputs)
                r.uses += 1
                return r if t is out else _RecipeView(r, t)
        if self._passes_through(t):
            return t.detach()
        holder = self.meter.hold(t) if held and self.meter is not None else None
        return _Slot(g, self._record(g, t), t, holder)

    # ------------------------------------------------------------------ transfers
    def _group(self, stage: int, microbatch: int, what: str) -> _Group:
        g = self._groups.get((stage, microbatch))
        if g is None:
            raise OffloadError(f"{what} of layer group {stage}, microbatch {microbatch}: nothing captured "
                               "(its F has not run, or its activations were already released)")
        return g

    def offload_start(self, stage: int, microbatch: int) -> None:
        g = self._group(stage, microbatch, "OFFLOAD_START")
        if g.state != CAPTURED:
            raise OffloadError(f"OFFLOAD_START of {g.name}: already {g.state} (offloaded twice?)")
        t0 = time.perf_counter()
        moved, kept = [], 0
        for cd, rec in g.records.items():
            if (rec.nbytes > 0 and self._shared.get(cd, 0) == 1 and rec.storage.resizable()
                    and _use_count(rec.storage) == 1 + rec.owned):
                moved.append(rec)
            else:
                kept += rec.nbytes
        off = 0
        for rec in moved:
            rec.host_off = off
            off += -(-rec.nbytes // _ALIGN) * _ALIGN
        g.moved, g.host_bytes = moved, off
        lanes = self._lanes
        if moved:
            g.host = self.pool.acquire(off)
            lanes.wait(lanes.d2h, lanes.record(lanes.compute()))  # after the F
            lanes.wait(lanes.d2h, g.host.ready)  # the buffer's previous reload has read it
            start = lanes.record(lanes.d2h, self.timing) if lanes.timing else None
            host = g.host.tensor
            with lanes.on(lanes.d2h):
                for rec in moved:
                    # No record_stream here: OFFLOAD_END makes the compute stream wait for
                    # this copy before it frees the memory, so the caching allocator may
                    # hand it out again at once, in stream order (record_stream would hold
                    # it until the host *observes* the copy done: more memory reserved).
                    src = _bytes_of(rec.storage)
                    host[rec.host_off:rec.host_off + rec.nbytes].copy_(src, non_blocking=lanes.non_blocking)
                    del src
            g.ev_d2h = lanes.record(lanes.d2h, lanes.timing)
            g.t_d2h = (start, g.ev_d2h)
        g.state = OFFLOADING
        s = self._stats
        nb = sum(r.nbytes for r in moved)
        s["moved_bytes"] += nb
        s["kept_bytes"] += kept
        s["recomputed_bytes"] += sum(r.nbytes for r in g.recipes.values())
        s["groups"] += 1
        s["by_stage"].setdefault(stage, []).append(nb)
        s["kept_by_stage"].setdefault(stage, []).append(kept)
        s["recomputed_by_stage"].setdefault(stage, []).append(sum(r.nbytes for r in g.recipes.values()))
        s["d2h_host_s"] += time.perf_counter() - t0

    def offload_end(self, stage: int, microbatch: int) -> None:
        g = self._group(stage, microbatch, "OFFLOAD_END")
        if g.state != OFFLOADING:
            raise OffloadError(f"OFFLOAD_END of {g.name}: state {g.state} (needs OFFLOAD_START first, once)")
        if g.moved:
            # Compute work after this point may reuse the memory: it waits for the copy.
            self._lanes.wait(self._lanes.compute(), g.ev_d2h)
        for rec in g.moved:
            rec.token = self.meter.offloaded(rec.storage) if self.meter is not None else None
            rec.storage.resize_(0)
            rec.moved = True
        g.state = OFFLOADED

    def reload_start(self, stage: int, microbatch: int) -> None:
        g = self._group(stage, microbatch, "RELOAD_START")
        if g.state in (RELOADING, RELOADED):
            raise OffloadError(f"RELOAD_START of {g.name}: reloaded twice")
        if g.state != OFFLOADED:
            raise OffloadError(f"RELOAD_START of {g.name}: state {g.state}; it was never offloaded "
                               "(OFFLOAD_START and OFFLOAD_END must come first)")
        t0 = time.perf_counter()
        lanes = self._lanes
        if g.moved:
            on_compute = self.reload_alloc == "compute"
            if on_compute:
                # Allocate from the compute stream's pool; the memory may still be in use
                # by compute kernels queued before this point, so the copy waits for them.
                with lanes.on(lanes.compute()):
                    for rec in g.moved:
                        rec.storage.resize_(rec.nbytes)
                lanes.wait(lanes.h2d, lanes.record(lanes.compute()))
            lanes.wait(lanes.h2d, g.ev_d2h)  # the host copy is complete
            start = lanes.record(lanes.h2d, True) if lanes.timing else None
            host = g.host.tensor
            with lanes.on(lanes.h2d):  # "copy": allocate on the h2d stream, safe for the copy
                for rec in g.moved:
                    if not on_compute:
                        rec.storage.resize_(rec.nbytes)
                    dst = _bytes_of(rec.storage)
                    dst.copy_(host[rec.host_off:rec.host_off + rec.nbytes], non_blocking=lanes.non_blocking)
                    if on_compute:
                        lanes.record_stream(dst, lanes.h2d)  # freed on compute: wait for this copy too
                    del dst
                    if self.meter is not None:
                        self.meter.reloaded(rec.token, rec.storage)
                    rec.token = None
            g.ev_h2d = lanes.record(lanes.h2d, lanes.timing)
            g.t_h2d = (start, g.ev_h2d)
        g.state = RELOADING
        self._stats["h2d_host_s"] += time.perf_counter() - t0

    def reload_end(self, stage: int, microbatch: int) -> None:
        g = self._group(stage, microbatch, "RELOAD_END")
        if g.state == RELOADED:
            raise OffloadError(f"RELOAD_END of {g.name}: reloaded twice")
        if g.state != RELOADING:
            raise OffloadError(f"RELOAD_END of {g.name}: state {g.state} (needs RELOAD_START first)")
        lanes = self._lanes
        if g.moved:
            compute = lanes.compute()
            lanes.wait(compute, g.ev_h2d)
            for rec in g.moved:
                if self.reload_alloc == "copy":
                    # Allocated on the h2d stream, used (and freed) by the compute stream.
                    b = _bytes_of(rec.storage)
                    lanes.record_stream(b, compute)
                    del b
                rec.moved = False
            self.pool.release(g.host, g.host_bytes, g.ev_h2d)
            if lanes.timing:
                self._timed.append((g.host_bytes, g.t_d2h, g.t_h2d))
            g.host = None
        g.state = RELOADED
        g.let_go()  # from here on each storage lives as long as its saved tensors

    def release(self, stage: int, microbatch: int) -> None:
        g = self._groups.pop((stage, microbatch), None)
        if g is None:
            return
        self._drop(g)
        if g.state in (OFFLOADING, OFFLOADED, RELOADING):
            raise OffloadError(f"{g.name}: its B ran while its activations were {g.state} (never reloaded)")

    def _drop(self, g: _Group) -> None:
        if g.state == OFFLOADING and g.moved:  # a copy may still read memory that is freed below
            self._lanes.wait(self._lanes.compute(), g.ev_d2h)
        for cd in g.keys or list(g.records):
            n = self._shared.get(cd, 0) - 1
            if n > 0:
                self._shared[cd] = n
            else:
                self._shared.pop(cd, None)
        if g.host is not None:
            self.pool.release(g.host, g.host_bytes)
            g.host = None
        g.records = {}
        g.recipes = {}
        g.keys = []
        g.moved = []

    # ------------------------------------------------------------------ the stash window (B→W)
    # What only W needs (``WeightGradStore.stash_tensors``: linear inputs and output
    # gradients) goes to the host after B and comes back before W. Unlike the activation
    # window (F→B), the stash is replaced, not resized in place: the stash entries are the
    # only holders the runtime knows of, so the device copies die with their last
    # reference (as the stash itself would at W) and nothing else can see the move.
    # W then reads bit-identical tensors, so the gradients are unchanged.
    def stash_offload_start(self, stage: int, microbatch: int, stash: Any) -> None:
        key = (stage, microbatch)
        if key in self._stashes:
            raise OffloadError(f"STASH_OFFLOAD_START of layer group {stage}, microbatch {microbatch}: already "
                               f"{self._stashes[key].state}")
        t0 = time.perf_counter()
        lanes = self._lanes
        moving = {id(t): t for t in stash.stash_tensors(key) if not self._passes_through(t)}
        host: dict[int, torch.Tensor] = {}
        if moving:
            lanes.wait(lanes.d2h, lanes.record(lanes.compute()))  # after the B that made them
            with lanes.on(lanes.d2h):
                for i, t in moving.items():
                    h = torch.empty_like(t, device="cpu", pin_memory=self.device.type == "cuda")
                    h.copy_(t, non_blocking=lanes.non_blocking)
                    host[i] = h
        st = self._stashes[key] = _Stash(host, lanes.record(lanes.d2h, lanes.timing) if moving else None)
        nb = sum(h.numel() * h.element_size() for h in host.values())
        s = self._stats
        s["stash_moved_bytes"] += nb
        s["stash_groups"] += 1
        s["stash_by_stage"].setdefault(stage, []).append(nb)
        s["d2h_host_s"] += time.perf_counter() - t0
        st.nbytes = nb

    def stash_offload_end(self, stage: int, microbatch: int, stash: Any) -> None:
        st = self._stash((stage, microbatch), "STASH_OFFLOAD_END", "offloading")
        if st.host:
            # The device copies are dropped now; compute work after this point may reuse
            # their memory, so it waits for the copy (as OFFLOAD_END does).
            self._lanes.wait(self._lanes.compute(), st.event)
            host = st.host
            stash.swap_stash((stage, microbatch), lambda t: host.get(id(t), t), lambda t: t.device == self.device
                             and id(t) not in st.host_ids)
        st.state = "offloaded"

    def stash_reload_start(self, stage: int, microbatch: int, stash: Any) -> None:
        st = self._stash((stage, microbatch), "STASH_RELOAD_START", "offloaded")
        t0 = time.perf_counter()
        lanes = self._lanes
        if st.host:
            with lanes.on(lanes.compute()):  # allocated in the compute stream's order
                dev = {id(h): torch.empty_like(h, device=self.device) for h in st.host.values()}
            lanes.wait(lanes.h2d, lanes.record(lanes.compute()))
            lanes.wait(lanes.h2d, st.event)
            with lanes.on(lanes.h2d):
                for h in st.host.values():
                    dev[id(h)].copy_(h, non_blocking=lanes.non_blocking)
            st.dev, st.event = dev, lanes.record(lanes.h2d, lanes.timing)
        st.state = "reloading"
        self._stats["h2d_host_s"] += time.perf_counter() - t0

    def stash_reload_end(self, stage: int, microbatch: int, stash: Any) -> None:
        key = (stage, microbatch)
        st = self._stash(key, "STASH_RELOAD_END", "reloading")
        if st.host:
            self._lanes.wait(self._lanes.compute(), st.event)
            dev = st.dev
            stash.swap_stash(key, lambda t: dev.get(id(t), t), lambda t: t.device == self.device)
        del self._stashes[key]  # the host copies go with it

    def _stash(self, key: tuple[int, int], what: str, state: str) -> "_Stash":
        st = self._stashes.get(key)
        if st is None or st.state != state:
            raise OffloadError(f"{what} of layer group {key[0]}, microbatch {key[1]}: the stash is "
                               f"{st.state if st else 'not offloaded'}, expected {state}")
        return st

    def end_step(self) -> None:
        left = sorted(self._stashes)
        self._stashes.clear()
        if left:
            raise OffloadError(f"step ended with the W stash of {len(left)} (layer group, microbatch) pair(s) "
                               f"still on the host: {left[:4]} (STASH_RELOAD_END must come before W)")
        bad = [g for g in self._groups.values() if g.state in (OFFLOADING, OFFLOADED, RELOADING)]
        for g in list(self._groups.values()):
            self._drop(g)
        self._groups.clear()
        self._finish_stats()
        if bad:
            names = "; ".join(f"{g.name} ({g.state})" for g in bad[:4])
            raise OffloadError(f"step ended with {len(bad)} offloaded activation group(s) never reloaded: {names}")

    # ------------------------------------------------------------------ statistics
    def _new_stats(self) -> None:
        self._stats: dict[str, Any] = {
            "groups": 0, "moved_bytes": 0, "kept_bytes": 0, "recomputed_bytes": 0,
            "by_stage": {}, "kept_by_stage": {}, "recomputed_by_stage": {},
            "d2h_host_s": 0.0, "h2d_host_s": 0.0,
            "stash_groups": 0, "stash_moved_bytes": 0, "stash_by_stage": {},
        }
        self._timed: list[tuple[int, tuple, tuple]] = []
        self.pool.reset_peak()

    def _finish_stats(self) -> None:
        s = self._stats
        out = {k: v for k, v in s.items() if not k.endswith("by_stage")}
        out["moved_by_stage"] = {st: _median(v) for st, v in sorted(s["by_stage"].items())}
        out["kept_by_stage"] = {st: _median(v) for st, v in sorted(s["kept_by_stage"].items())}
        out["recomputed_by_stage"] = {st: _median(v) for st, v in sorted(s["recomputed_by_stage"].items())}
        out["stash_moved_by_stage"] = {st: _median(v) for st, v in sorted(s["stash_by_stage"].items())}
        out["host_peak_bytes"] = self.pool.peak_in_use
        out["host_reserved_bytes"] = self.pool.reserved
        out["pool_hits"], out["pool_misses"] = self.pool.hits, self.pool.misses
        out["recompute"] = self.recompute
        if self._timed:
            torch.cuda.synchronize(self.device)
            d2h = sum(a.elapsed_time(b) for _, (a, b), _ in self._timed if a is not None) / 1000
            h2d = sum(a.elapsed_time(b) for _, _, (a, b) in self._timed if a is not None) / 1000
            out["d2h_device_s"], out["h2d_device_s"] = d2h, h2d
        self._last = out
        self._new_stats()

    def stats(self) -> dict | None:
        """The last finished step: ``groups`` offloaded, ``moved_bytes`` (device→host,
        = host→device), ``kept_bytes`` (captured but still referenced elsewhere, left
        resident), ``recomputed_bytes`` (not stored: recomputed in backward), the
        per-layer-group medians per microbatch (``moved_by_stage``, ...), the host pool
        (``host_peak_bytes`` in use, ``host_reserved_bytes``, hits/misses) and the
        seconds spent issuing copies (CPU: doing them); with ``timing`` on CUDA, also
        the device-side copy seconds."""
        return self._last


class _Stash:
    """The W stash of one (stage, microbatch) between STASH_OFFLOAD_START and STASH_RELOAD_END."""

    __slots__ = ("host", "host_ids", "event", "state", "dev", "nbytes")

    def __init__(self, host: dict[int, torch.Tensor], event: Any) -> None:
        self.host = host  #: id(device tensor) -> its host copy
        self.host_ids = {id(h) for h in host.values()}
        self.event = event
        self.state = "offloading"
        self.dev: dict[int, torch.Tensor] = {}  #: id(host copy) -> its reloaded device tensor
        self.nbytes = 0


def _median(v: list[float]) -> float:
    s = sorted(v)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
