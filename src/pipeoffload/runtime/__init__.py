"""The torch.distributed runtime: execute any schedule for real.

Modules (one job each):

- ``executor``: :class:`PipelineRunner` / :func:`run_pipeline` interpret one rank's
  program (F, B, W, BW, sends/receives, offload hook ops);
- ``p2p``: non-blocking sends, receives posted ahead, every wait with a timeout
  (:class:`CommTimeout` names rank, op and peer);
- ``op_errors``: an error inside a step names the rank, the op and its place
  (:class:`StepError`);
- ``weight_grad``: deferred linear weight gradients (the B/W split);
- ``meter``: activation-memory meters (saved tensors on CPU, allocator on CUDA);
- ``activations``: the activation store, hook point for offload;
- ``offload_store``: :class:`OffloadStore`, PipeOffload's activation offload;
- ``launcher``: :func:`launch` spawns local ranks or joins ``torchrun``;
- ``config``: :class:`TrainConfig` dataclasses (pure, no torch);
- ``measure``: measured vs predicted timelines;
- ``train``: the training job behind ``pipeoffload train``;
- ``checkpoint``: atomic per-rank checkpoints with a verified manifest, resume;
- ``faults``: fault injection (kill, hang, raise, NaN) for reliability tests.

See ``docs/runtime.md``. Names are imported lazily: ``pipeoffload.runtime.config``
works without torch.
"""

from __future__ import annotations

_LAZY = {
    "PipelineRunner": "executor", "run_pipeline": "executor", "StepResult": "executor", "OpSample": "executor",
    "CommTimeout": "p2p", "CommError": "p2p", "StepError": "op_errors",
    "WeightGradStore": "weight_grad", "DeferredLinear": "weight_grad", "convert_linears": "weight_grad",
    "ActivationStore": "activations", "KeepActivations": "activations", "recomputable": "activations",
    "OffloadStore": "offload_store", "OffloadError": "offload_store",
    "SavedTensorMeter": "meter", "CudaAllocatorMeter": "meter", "MemoryMeter": "meter",
    "launch": "launcher", "DistContext": "launcher", "LaunchError": "launcher",
    "TrainConfig": "config", "ScheduleConfig": "config", "TrainingConfig": "config", "RuntimeConfig": "config",
    "CheckpointConfig": "config",
    "save_checkpoint": "checkpoint", "load_latest": "checkpoint", "CheckpointError": "checkpoint",
    "FaultSpec": "faults", "FaultInjector": "faults",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
