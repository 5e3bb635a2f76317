"""The torch.distributed runtime (the engine): execute any schedule for real.

Modules (one job each):

- ``executor``: :class:`PipelineRunner` / :func:`run_pipeline` interpret one rank's
  program (F, B, W, BW, sends/receives, offload hook ops);
- ``p2p``, ``transport``, ``messages``, ``boundary``: point-to-point transfers issued as
  the NCCL-safe issue policy says, every wait with a timeout (:class:`CommTimeout`
  names rank, op and peer);
- ``op_errors``: an error inside a step names the rank, the op and its place (:class:`StepError`);
- ``weight_grad``: deferred weight gradients (the B/W split);
- ``activations``, ``offload_store``: the activation store, :class:`OffloadStore`
  (PipeOffload's activation offload);
- ``meter``: activation-memory meters (saved tensors on CPU, allocator on CUDA);
- ``params``, ``state``, ``rng``: parameter names and ties, state dicts, keyed random streams;
- ``mesh``, ``data_parallel``, ``tensor_parallel``: the device mesh and its other dimensions;
- ``launcher``: :func:`launch` spawns local ranks or joins ``torchrun``.

The training job built on it lives in :mod:`pipeoffload.training` (``config``, ``job``,
``report``, ``checkpoint``, ``faults``, ``measure``), the side-by-side benchmark in
:mod:`pipeoffload.bench`. Their old paths (``pipeoffload.runtime.config``,
``.train``, ``.checkpoint``, ``.faults``, ``.measure``, ``.bench``,
``.torch_baseline``) and the names below keep working, deprecated.

See ``docs/runtime.md``. Names are imported lazily: ``pipeoffload.runtime.config``
works without torch.
"""

from __future__ import annotations

_LAZY = {
    "PipelineRunner": "executor", "run_pipeline": "executor", "StepResult": "executor", "OpSample": "executor",
    "CommTimeout": "p2p", "CommError": "p2p", "StepError": "op_errors",
    "WeightGradStore": "weight_grad", "DeferredLinear": "weight_grad", "convert_linears": "weight_grad",
    "ActivationStore": "activations", "KeepActivations": "activations", "recomputable": "activations",
    "never_draws": "rng",
    "OffloadStore": "offload_store", "OffloadError": "offload_store",
    "SavedTensorMeter": "meter", "CudaAllocatorMeter": "meter", "MemoryMeter": "meter",
    "launch": "launcher", "DistContext": "launcher", "LaunchError": "launcher",
    "TrainConfig": "..training.config", "ScheduleConfig": "..training.config",
    "TrainingConfig": "..training.config", "RuntimeConfig": "..training.config",
    "CheckpointConfig": "..training.config",
    "save_checkpoint": "..training.checkpoint", "load_latest": "..training.checkpoint",
    "CheckpointError": "..training.checkpoint",
    "FaultSpec": "..training.faults", "FaultInjector": "..training.faults",
}

#: Modules that moved out of the engine: old path -> new path (deprecated aliases).
MOVED = {f"{__name__}.{old}": new for old, new in {
    "config": "pipeoffload.training.config", "train": "pipeoffload.training.job",
    "checkpoint": "pipeoffload.training.checkpoint", "faults": "pipeoffload.training.faults",
    "measure": "pipeoffload.training.measure", "bench": "pipeoffload.bench.side_by_side",
    "torch_baseline": "pipeoffload.bench.torch_baseline",
}.items()}

__all__ = list(_LAZY)


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        where = _LAZY[name]
        # "executor": a module of the engine; "..training.config": one that moved out
        return getattr(importlib.import_module(where if where.startswith("..") else f".{where}", __name__), name)
    if f"{__name__}.{name}" in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)


class _MovedFinder:
    """Imports ``pipeoffload.runtime.<old>`` as the module it moved to (:data:`MOVED`):
    the same module object under both names, with a DeprecationWarning."""

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None):  # noqa: ANN205
        if fullname not in MOVED:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, _MovedFinder)

    @staticmethod
    def create_module(spec):  # noqa: ANN205 - the moved module itself stands in
        import importlib
        import warnings

        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; the old name will be removed",
                      DeprecationWarning, stacklevel=3)
        module = importlib.import_module(MOVED[spec.name])
        _OWN_SPECS[id(module)] = module.__spec__
        return module

    @staticmethod
    def exec_module(module: object) -> None:
        """Nothing to run (the module was imported under its new name); the import
        system set its ``__spec__`` to the old name's: give it back its own."""
        module.__spec__ = _OWN_SPECS[id(module)]  # type: ignore[attr-defined]


_OWN_SPECS: dict[int, object] = {}


import sys as _sys  # noqa: E402

if not any(isinstance(f, type) and f.__name__ == "_MovedFinder" for f in _sys.meta_path):
    _sys.meta_path.append(_MovedFinder)
