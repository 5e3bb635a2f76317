"""pipeoffload: memory-efficient pipeline parallelism (PipeOffload, zero-bubble and
controllable-memory schedules), a simulator and planner, and a torch.distributed runtime.

One import gives the main API::

    import pipeoffload as po

    sched = po.generate("group-interleaved", p=8, m=32, v=2, g=4)  # a validated Schedule
    tl = po.simulate(sched, po.Costs(F=1, B=1, W=1))               # a Timeline
    off = po.plan_offload(sched, offload_chunks=1, offload_time=0.25)
    low = po.lower(sched, offload=po.OffloadOptions(auto=True), comm=True)  # what a rank runs

- schedules: :func:`generate` (by name; :data:`SCHEDULES` lists them), :class:`ScheduleSpec`,
  :class:`Schedule`, :class:`Placement`;
- costs: :class:`Costs` (op durations), :class:`MemoryDeltas` (activation memory per op);
- passes: :func:`simulate` (timing, deadlock proof) → :class:`Timeline`; :func:`plan_offload`
  (PipeOffload's selective activation offload) with :class:`OffloadOptions` →
  :class:`OffloadResult`; :func:`lower` (validate → time → offload → communication);
- errors: :class:`PipeoffloadError`, :class:`ParameterError` (names the parameter),
  :class:`ScheduleError`;
- the runtime (needs torch, imported on first use): :class:`PipelineRunner`, :func:`launch`,
  :class:`OffloadStore`.

Vocabulary (the papers'): ``p`` pipeline ranks, ``m`` microbatches per iteration, ``v``
chunks per rank (a *chunk* is one layer group placed on a rank), ``g`` the group size of
group-interleaved 1F1B; ``offload_chunks`` (C) is how many of a rank's chunks are offloaded.

Pure parts (schedules, passes, simulator, planner, drawing) never import torch:
``import pipeoffload`` does not.
"""

__version__ = "0.1.0"

from .costs import Costs, MemoryDeltas
from .errors import ParameterError, PipeoffloadError, ScheduleError
from .ir import Placement, Schedule
from .passes import OffloadOptions, OffloadResult, lower, plan_offload
from .passes.timing import simulate
from .schedules import SCHEDULES, ScheduleSpec, generate
from .timeline import Timeline

#: Runtime names, imported from ``pipeoffload.runtime`` (and torch) on first use.
_RUNTIME = ("PipelineRunner", "launch", "OffloadStore")

__all__ = [
    "generate", "SCHEDULES", "ScheduleSpec", "Schedule", "Placement",
    "Costs", "MemoryDeltas",
    "simulate", "Timeline", "plan_offload", "OffloadOptions", "OffloadResult", "lower",
    "PipeoffloadError", "ParameterError", "ScheduleError",
    *_RUNTIME,
]


def __getattr__(name: str):
    if name in _RUNTIME:
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'pipeoffload' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_RUNTIME))
