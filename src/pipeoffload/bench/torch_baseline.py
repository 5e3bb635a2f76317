"""PyTorch's own pipeline runtime (``torch.distributed.pipelining``) driven with our
stage modules: the baseline of ``pipeoffload bench`` and the proof that our exported
schedules run on the ecosystem's runtime.

- :func:`torch_pipeline` wraps this rank's layer groups in ``PipelineStage`` objects
  and builds one of torch's schedule classes (``ScheduleGPipe``, ``Schedule1F1B``,
  ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
  ``ScheduleZBVZeroBubble``) by name.
- :func:`torch_runtime_for` runs *any* of our schedules on torch's
  ``_PipelineScheduleRuntime``: the schedule is exported to torch's CSV
  (:func:`pipeoffload.interop.torch_csv.write_csv`) and loaded with
  ``_load_csv(path, format="compute_only")``, which infers the stage→rank mapping from
  the file — so V placements (stage ``i`` and ``2p−1−i`` on rank ``i``) work unchanged.
- :class:`MeteredStage` measures torch's activation memory with the same
  :class:`~pipeoffload.runtime.meter.SavedTensorMeter` our runtime uses: every tensor
  autograd saves in a stage forward (and in the loss) is counted through
  ``saved_tensors_hooks`` until autograd frees it, and the tensors torch's stage keeps
  on purpose are held while it keeps them: the stage inputs and outputs of
  ``fwd_cache`` until the backward, and for a split backward (I then W) the
  ``backward_state`` entry — inputs, outputs, received output gradient and the
  intermediate gradients of ``param_groups`` — until W.

Gradients follow torch's convention (``scale_grads=True``: divided by ``m``), which is
ours: both give the gradient of the mean loss over the microbatches. Last-stage
outputs are not kept for the caller (``return_outputs=False``), as in training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from ..errors import ParameterError
from ..ir import Schedule
from ..runtime.meter import MemoryMeter, SavedTensorMeter

#: torch's schedule classes that ``pipeoffload bench`` compares against, and their
#: placement: "loop" with v chunks per rank, or "v" (two chunks, V shape).
TORCH_CLASSES: dict[str, tuple[str, int]] = {
    "ScheduleGPipe": ("loop", 1),
    "Schedule1F1B": ("loop", 1),
    "ScheduleInterleaved1F1B": ("loop", 2),
    "ScheduleInterleavedZeroBubble": ("loop", 2),
    "ScheduleZBVZeroBubble": ("v", 2),
}


def stages_of(placement: str, p: int, v: int, rank: int) -> list[int]:
    """This rank's stage indices, ascending (the order torch expects its stage list in)."""
    if placement == "v":
        return sorted((rank, 2 * p - 1 - rank))
    return [rank + k * p for k in range(v)]


class MeteredStage(PipelineStage):
    """``PipelineStage`` whose activation memory is counted by ``meter`` (module docstring).

    With ``meter=None`` it is a plain ``PipelineStage``."""

    def __init__(self, *args: Any, meter: SavedTensorMeter | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meter = meter
        self._holds: dict[int, Any] = {}
        self.compute_s = 0.0  #: s spent in this stage's forward/backward/weight calls since the step start

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):  # type: ignore[override]
        t0 = time.perf_counter()
        if self._meter is None:
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        else:
            with saved_tensors_hooks(*self._meter.saved_tensor_hooks()):
                out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
            outputs, inputs = self.fwd_cache[fwd_chunk_id]
            self._holds[fwd_chunk_id] = self._meter.hold(*_tensors(outputs), *_tensors(inputs))
        self.compute_s += time.perf_counter() - t0
        return out

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):  # type: ignore[override]
        t0 = time.perf_counter()
        super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward)
        if self._meter is not None:
            old = self._holds.pop(bwd_chunk_id, None)
            state = self.backward_state.get(bwd_chunk_id)
            if state is not None:  # split backward: what W still needs stays counted
                self._holds[bwd_chunk_id] = self._meter.hold(*_tensors(state))
            del old
        self.compute_s += time.perf_counter() - t0

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):  # type: ignore[override]
        t0 = time.perf_counter()
        super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self._holds.pop(bwd_chunk_id, None)
        self.compute_s += time.perf_counter() - t0

    def clear_runtime_states(self) -> None:  # called by the schedule at the start of every step
        super().clear_runtime_states()
        self._holds.clear()
        self.compute_s = 0.0


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nest of tuples, lists, dicts and sets."""
    out: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set)):
            stack.extend(x)
    return out


@dataclass
class TorchStepResult:
    loss: float | None  #: mean over microbatches on the rank holding the last stage, else None
    losses: list[float] | None
    peak_memory: float  #: bytes above the step start (SavedTensorMeter); 0 without a meter
    step_time: float  #: s, this rank's wall time of ``schedule.step``
    compute_time: float  #: s inside the stages' forward/backward/weight calls (the rest: comm and runtime)


class TorchPipeline:
    """One rank's side of a torch pipeline: ``schedule`` (a torch schedule object) over
    ``stages`` (:class:`MeteredStage`). :meth:`step` takes lists of ``m`` microbatches
    like :meth:`pipeoffload.runtime.PipelineRunner.step`."""

    def __init__(self, schedule: Any, stages: list[MeteredStage], modules: dict[int, nn.Module],
                 meter: MemoryMeter, m: int) -> None:
        self.schedule, self.stages, self.modules, self.meter, self.m = schedule, stages, modules, meter, m
        self.has_first_stage = any(s.is_first for s in stages)
        self.has_last_stage = any(s.is_last for s in stages)

    @property
    def torch_order(self) -> dict[int, list[Any]]:
        """torch's compute-only order ``{rank: [_Action | None, ...]}``."""
        return self.schedule.pipeline_order

    def parameters(self) -> list[nn.Parameter]:
        return [p for s in sorted(self.modules) for p in self.modules[s].parameters()]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for s in sorted(self.modules) for n, p in self.modules[s].named_parameters()]

    def step(self, inputs: Sequence[torch.Tensor] | None, targets: Sequence[torch.Tensor] | None) -> TorchStepResult:
        args = (torch.cat(list(inputs)),) if self.has_first_stage else ()
        target = torch.cat(list(targets)) if self.has_last_stage else None
        losses: list[torch.Tensor] = []
        self.meter.start_step()
        t0 = time.perf_counter()
        self.schedule.step(*args, target=target, losses=losses if self.has_last_stage else None,
                           return_outputs=False)
        dt = time.perf_counter() - t0
        vals = [float(x.detach()) for x in losses] if self.has_last_stage else None
        return TorchStepResult(sum(vals) / len(vals) if vals else None, vals, self.meter.peak(), dt,
                               sum(st.compute_s for st in self.stages))


def _make_stages(modules: Mapping[int, nn.Module], num_stages: int, device: torch.device,
                 meter: MemoryMeter, group: Any) -> list[MeteredStage]:
    m = meter if isinstance(meter, SavedTensorMeter) else None
    stages = []
    for s in sorted(modules):
        modules[s].to(device)
        stages.append(MeteredStage(modules[s], s, num_stages, device, group=group, meter=m))
    return stages


def _meter(kind: str | MemoryMeter, modules: Mapping[int, nn.Module]) -> MemoryMeter:
    if isinstance(kind, MemoryMeter):
        meter = kind
    elif kind in ("saved", "auto"):
        meter = SavedTensorMeter()
    elif kind == "none":
        meter = MemoryMeter()
    else:
        raise ParameterError("meter", f"unknown meter {kind!r}; valid: saved, none")
    if isinstance(meter, SavedTensorMeter):
        meter.exclude(t for mod in modules.values() for t in list(mod.parameters()) + list(mod.buffers()))
    return meter


def metered_loss(loss_fn: Callable[..., torch.Tensor], meter: MemoryMeter,
                 stages: Sequence[MeteredStage] = ()) -> Callable[..., torch.Tensor]:
    """``loss_fn`` with its saved tensors counted by ``meter`` and its time added to the
    last stage's ``compute_s`` (torch computes the loss outside the stage forward; our
    runtime counts it in the last stage's F)."""
    last = next((st for st in stages if st.is_last), None)
    hooks = meter.saved_tensor_hooks() if isinstance(meter, SavedTensorMeter) else None

    def loss(output: torch.Tensor, target: Any) -> torch.Tensor:
        t0 = time.perf_counter()
        if hooks is None:
            val = loss_fn(output, target)
        else:
            with saved_tensors_hooks(*hooks):
                val = loss_fn(output, target)
        if last is not None:
            last.compute_s += time.perf_counter() - t0
        return val

    return loss


def torch_pipeline(
    class_name: str,
    modules: Mapping[int, nn.Module],
    num_microbatches: int,
    loss_fn: Callable[..., torch.Tensor],
    *,
    device: torch.device | str = "cpu",
    meter: str | MemoryMeter = "saved",
    group: Any = None,
) -> TorchPipeline:
    """torch's schedule ``class_name`` (a key of :data:`TORCH_CLASSES`) over this rank's
    ``modules`` ``{stage: module}`` (the stages :func:`stages_of` gives for the class's
    placement). Call on every rank of an initialised process group."""
    if class_name not in TORCH_CLASSES:
        raise ParameterError("schedule", f"unknown torch schedule {class_name!r}; valid: {', '.join(TORCH_CLASSES)}")
    placement, v = TORCH_CLASSES[class_name]
    p = dist.get_world_size(group)
    mods = dict(modules)
    want = stages_of(placement, p, v, dist.get_rank(group))
    if sorted(mods) != want:
        raise ParameterError("stage_modules", f"{class_name} on rank {dist.get_rank(group)} of {p} runs stages "
                             f"{want}, got modules for {sorted(mods)}")
    meter_obj = _meter(meter, mods)
    stages = _make_stages(mods, p * v, torch.device(device), meter_obj, group)
    cls = getattr(torch_schedules, class_name)
    loss = metered_loss(loss_fn, meter_obj, stages)
    sched = cls(stages[0], num_microbatches, loss_fn=loss) if v == 1 else cls(stages, num_microbatches, loss_fn=loss)
    return TorchPipeline(sched, stages, mods, meter_obj, num_microbatches)


def torch_runtime_for(
    schedule: Schedule,
    modules: Mapping[int, nn.Module],
    loss_fn: Callable[..., torch.Tensor],
    csv_path: str | Path,
    *,
    device: torch.device | str = "cpu",
    meter: str | MemoryMeter = "saved",
    group: Any = None,
) -> TorchPipeline:
    """Our ``schedule`` on torch's ``_PipelineScheduleRuntime``: exported to torch's CSV at
    ``csv_path`` (offload ops dropped), loaded with ``_load_csv(format="compute_only")``
    so torch inserts its own sends/receives and infers the stage→rank mapping (loop, V
    or custom). ``modules`` are this rank's layer groups ``{stage: module}``."""
    from ..interop.torch_csv import write_csv

    rank = dist.get_rank(group)
    mods = dict(modules)
    want = list(schedule.placement.stages_of(rank))
    if sorted(mods) != sorted(want):
        raise ParameterError("stage_modules", f"rank {rank} holds layer groups {want}, got modules for {sorted(mods)}")
    path = Path(csv_path)
    if rank == 0:
        write_csv(schedule.compute_only(), path)
    dist.barrier(group=group)
    meter_obj = _meter(meter, mods)
    stages = _make_stages(mods, schedule.num_stages, torch.device(device), meter_obj, group)
    runtime = torch_schedules._PipelineScheduleRuntime(stages, schedule.num_microbatches,
                                                        loss_fn=metered_loss(loss_fn, meter_obj, stages))
    runtime._load_csv(str(path), format="compute_only")
    return TorchPipeline(runtime, stages, mods, meter_obj, schedule.num_microbatches)


def imported_order(pipe: TorchPipeline, name: str) -> Schedule:
    """torch's generated order of ``pipe`` as our :class:`Schedule` (idle steps and
    bookkeeping actions dropped), to run the very same order on our runtime."""
    from ..interop.torch_actions import from_torch_actions

    return from_torch_actions(pipe.torch_order, num_microbatches=pipe.m, name=name)
