"""Data parallelism of a pipeline: replicas of the same layer groups on the ``dp``
dimension of the mesh, their gradients reduced once per step.

Two kinds, both driven by the runner from its op loop (``runtime/executor.py``):

- :class:`Replicate` (``data_parallel="replicate"``, DDP's semantics): every replica
  holds whole layer groups. As soon as a layer group's *last* weight-gradient op of
  the step (its last ``W`` or ``BW``) is done, its gradients are all-reduced across
  the DP group, in buckets of ``bucket_bytes``, without blocking (``async_op``): the
  reduction runs while the pipeline does the rest of the step. :meth:`finish` waits
  for them before ``step()`` returns and divides by the DP size (the gradient of the
  mean loss over the global batch).
- :class:`Sharded` (``data_parallel="fsdp"``): each layer group is wrapped with FSDP2
  ``fully_shard`` on the DP mesh. Reshard policy: a layer group is unsharded (its
  parameters all-gathered) right before its first op of the step and stays unsharded
  until its last ``W``/``BW`` of the step — microbatches reuse the gathered weights
  rather than all-gathering for each of them — then its gradients, accumulated
  unsharded over all microbatches, are reduce-scattered once (asynchronously) and the
  layer group is resharded. FSDP's own per-backward reduction is switched off
  (``set_requires_gradient_sync(False)``): with a split backward the weight gradients
  arrive in ``W`` ops, outside autograd, where FSDP's hooks never see them.

Parameters whose gradient is only final at the end of the step — shared by several
layer groups on this rank, or tied across pipeline ranks (``runtime/params.py``) —
are reduced at the end, after the tie reduction among their pipeline holders: the sum
over holders is taken first, then the mean over replicas (sums commute, so every
replica's copies end equal). Sharded, the order is the other way round: each copy of
a shared parameter is its own sharded parameter (one per layer group that uses it,
sharded alike on every holder), reduce-scattered with its layer group; then the tie
reduction sums the copies' shards among the holders of the same dp index.
Gradients that are DTensors (tensor parallelism) are reduced through their local
tensors: DP replicas hold the same TP shard layout.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from .p2p import wait_collective

#: Default bucket size of the replicated all-reduce (DDP's default).
BUCKET_BYTES = 25 * 1024 * 1024


def local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def _unique_trainable(mod: nn.Module) -> list[nn.Parameter]:
    seen, out = set(), []
    for p in mod.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


class _Reducer:
    """What both kinds share: the group, the timeout, the time spent."""

    def __init__(self, group: Any, size: int, timeout_s: float, rank: int) -> None:
        self.group, self.size, self.timeout_s, self.rank = group, size, float(timeout_s), rank
        self.comm_s = 0.0  #: seconds this rank spent issuing and waiting for reductions this step

    def _wait(self, work: Any, what: str) -> None:
        wait_collective(work, self.timeout_s, self.rank, f"the data-parallel {what}")


class Replicate(_Reducer):
    """Bucketed asynchronous gradient all-reduce per layer group (module docstring)."""

    def __init__(self, modules: Mapping[int, nn.Module], late: Iterable[int], group: Any, size: int,
                 timeout_s: float, rank: int, bucket_bytes: int = BUCKET_BYTES) -> None:
        super().__init__(group, size, timeout_s, rank)
        late = set(late)
        self.stage_params = {s: [p for p in _unique_trainable(m) if id(p) not in late] for s, m in modules.items()}
        self.bucket_bytes = int(bucket_bytes)
        self._inflight: list[tuple[Any, torch.Tensor, list[torch.Tensor], int]] = []

    def begin_step(self) -> None:
        self.comm_s = 0.0
        self._inflight = []

    def before_op(self, stage: int) -> None:
        """Nothing to do before a layer group's first op (its weights are whole)."""

    def stage_done(self, stage: int) -> None:
        """Start the all-reduce of ``stage``'s gradients (its last W of the step is done)."""
        t0 = time.perf_counter()
        bucket: list[torch.Tensor] = []
        nbytes = 0
        for p in self.stage_params[stage]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # every replica must send the same layout
            g = local(p.grad)
            bucket.append(g)
            nbytes += g.numel() * g.element_size()
            if nbytes >= self.bucket_bytes:
                self._launch(bucket, stage)
                bucket, nbytes = [], 0
        if bucket:
            self._launch(bucket, stage)
        self.comm_s += time.perf_counter() - t0

    def _launch(self, grads: list[torch.Tensor], stage: int) -> None:
        flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1).clone()
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self._inflight.append((work, flat, grads, stage))

    def finish(self, late_params: Iterable[nn.Parameter]) -> None:
        """Wait for every bucket, write the means back; then reduce ``late_params``
        (synchronously: they are final only now)."""
        t0 = time.perf_counter()
        for work, flat, grads, stage in self._inflight:
            self._wait(work, f"gradient all-reduce of layer group {stage}")
            flat.div_(self.size)
            off = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[off:off + n].view_as(g))
                off += n
        self._inflight = []
        late = [p for p in late_params if p.requires_grad]
        for p in late:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if late:
            self._launch([local(p.grad) for p in late], -1)
            work, flat, grads, _ = self._inflight.pop()
            self._wait(work, "gradient all-reduce of shared parameters")
            flat.div_(self.size)
            off = 0
            for g in grads:
                g.copy_(flat[off:off + g.numel()].view_as(g))
                off += g.numel()
        self.comm_s += time.perf_counter() - t0


class Sharded(_Reducer):
    """FSDP2 per layer group, unsharded for the step, one reduce-scatter (module docstring)."""

    def __init__(self, modules: Mapping[int, nn.Module], dp_mesh: Any, timeout_s: float, rank: int) -> None:
        from torch.distributed.fsdp import fully_shard

        super().__init__(dp_mesh.get_group(), dp_mesh.size(), timeout_s, rank)
        self.modules = dict(modules)
        self.mesh = dp_mesh
        row = [int(r) for r in dp_mesh.mesh.tolist()]
        if row != sorted(row):
            # FSDP2 shards by process-group rank (groups sort their ranks) while DTensor
            # places shards by mesh position: they disagree on such a mesh.
            from ..errors import ParameterError

            raise ParameterError("mesh", f"data_parallel=\"fsdp\" needs the dp dimension's ranks in ascending "
                                 f"order (got {row}); FSDP2 shards by process-group rank")
        # ids of the tensors before sharding (all alive now, so distinct unless the same
        # tensor): a tensor used by two layer groups becomes two sharded parameters,
        # which the parameter table keeps as one tie group (runtime/params.py)
        before = {s: {n: id(p) for n, p in m.named_parameters()} for s, m in self.modules.items()}
        for mod in self.modules.values():
            fully_shard(mod, mesh=dp_mesh, reshard_after_forward=False)
            mod.set_requires_gradient_sync(False)  # gradients reduce-scattered by stage_done, once per step
            mod.set_reshard_after_backward(False)
        self.sharded = {s: _unique_trainable(m) for s, m in self.modules.items()}
        #: id of a sharded parameter -> id of the tensor it was made from
        self.origin = {id(p): before[s][n] for s, m in self.modules.items() for n, p in m.named_parameters()
                       if n in before[s]}
        self._whole: set[int] = set()
        #: id of a gathered (whole) parameter -> id of its sharded parameter (reports by name)
        self.alias: dict[int, int] = {}
        self._inflight: list[tuple[Any, torch.Tensor, nn.Parameter, int]] = []

    def begin_step(self) -> None:
        self.comm_s = 0.0
        self._inflight = []

    def before_op(self, stage: int) -> list[torch.Tensor] | None:
        """Unshard ``stage`` before its first op of the step; returns its whole
        parameters (the tensors the forward will use) when it just did."""
        if stage in self._whole:
            return None
        t0 = time.perf_counter()
        mod = self.modules[stage]
        mod.unshard()
        self._whole.add(stage)
        self.comm_s += time.perf_counter() - t0
        whole = list(mod.parameters())
        for sh, wp in zip(self.sharded[stage], [p for p in whole if p.requires_grad]):
            self.alias[id(wp)] = id(sh)
        return whole

    def stage_done(self, stage: int) -> None:
        """Reduce-scatter ``stage``'s accumulated whole gradients (started, not waited)
        and reshard it."""
        t0 = time.perf_counter()
        mod = self.modules[stage]
        whole = list(mod.parameters())  # unsharded: same order as the sharded list
        for sh, wp in zip(self.sharded[stage], [p for p in whole if p.requires_grad]):
            g = wp.grad if wp.grad is not None else torch.zeros_like(wp)
            wp.grad = None
            n = g.shape[0]
            rows = -(-n // self.size)  # FSDP2's Shard(0): torch.chunk sizes, padded to equal
            if rows * self.size != n:
                pad = g.new_zeros((rows * self.size - n, *g.shape[1:]))
                g = torch.cat([g, pad])
            out = g.new_empty((rows, *g.shape[1:]))
            work = _reduce_scatter(out, g.contiguous(), group=self.group, async_op=True)
            self._inflight.append((work, out, sh, stage))
        mod.reshard()
        self._whole.discard(stage)
        self.comm_s += time.perf_counter() - t0

    def finish(self, late_params: Iterable[nn.Parameter] = ()) -> None:
        """Wait for the reduce-scatters; each sharded parameter gets its shard of the mean."""
        from torch.distributed.tensor import DTensor

        t0 = time.perf_counter()
        for work, out, sh, stage in self._inflight:
            self._wait(work, f"gradient reduce-scatter of layer group {stage}")
            loc = sh.to_local()
            out = out[:loc.shape[0]].div_(self.size)
            grad = DTensor.from_local(out, sh.device_mesh, sh.placements, shape=sh.shape, stride=sh.stride(),
                                      run_check=False)
            if sh.grad is None:
                sh.grad = grad
            else:
                sh.grad.to_local().add_(out)
        self._inflight = []
        for mod in self.modules.values():  # a layer group with no op this step: nothing to reshard
            mod.reshard()
        self._whole.clear()
        self.comm_s += time.perf_counter() - t0


#: torch 2.13 renames reduce_scatter_tensor (deprecated there) to reduce_scatter_single.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
