"""Tensor parallelism inside a layer group with DTensor (Megatron's split).

:func:`parallelize_stage` applies, to every transformer layer of a reference-model
layer group (``models/transformer.py``):

- attention: ``wq``/``wk``/``wv`` column-parallel (each TP rank holds ``heads/tp``
  query heads and ``kv_heads/tp`` key/value heads), ``wo`` row-parallel (its output
  all-reduced);
- MLP (SwiGLU): ``w1``/``w3`` column-parallel, ``w2`` row-parallel.

The embedding, norms and output head stay replicated: every TP rank computes them on
the same (replicated) input and gets the same gradient, so they need no reduction.
Each layer's input and output are plain (local, replicated) tensors, so the pipeline's
boundaries carry ordinary tensors. Sequence parallelism (norms on sequence shards) is
not implemented yet: ``sequence_parallel=True`` is a ParameterError.

The W split works unchanged: the weights are DTensor parameters, ``F.linear`` on them
is deferred like any other (``runtime/weight_grad.py``) and the weight gradient
computed in W is a DTensor with the weight's placement.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import ParameterError


def parallelize_stage(module: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False) -> nn.Module:
    """Apply ColwiseParallel/RowwiseParallel (module docstring) to the layers of the
    reference-model layer group ``module`` on the 1-D mesh ``tp_mesh``; returns it
    (changed in place). A collective over ``tp_mesh``: its ranks call it together,
    with equal weights. ParameterError when ``tp`` does not divide the heads,
    key/value heads or MLP width."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if sequence_parallel:
        raise ParameterError("sequence_parallel", "sequence parallelism is not implemented yet; use False")
    tp = tp_mesh.size()
    cfg = getattr(module, "cfg", None)
    layers = getattr(module, "layers", None)
    if cfg is None or layers is None:
        raise ParameterError("stage_modules", "parallelize_stage expects a reference-model layer group "
                             "(pipeoffload.models.transformer.LayerGroup)")
    bad = [f"{n}={v}" for n, v in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn", cfg.ffn_dim))
           if v % tp]
    if bad:
        raise ParameterError("tp", f"tp={tp} must divide the model's {', '.join(bad)}")
    if tp == 1:
        return module
    plan: dict[str, Any] = {
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(), "mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(),
        "mlp.w2": RowwiseParallel(),
    }
    for block in layers.values():
        parallelize_module(block, tp_mesh, plan)
    return module


def collective_timer() -> Any:
    """A dispatch mode that adds up the wall time of the functional collectives
    (``_c10d_functional``: all-reduce, all-gather, reduce-scatter and their waits) that
    DTensor issues inside F, B and W; ``.seconds`` after use. It is how the runner
    measures ``StepResult.tp_comm_s``: on gloo a collective blocks until its peers
    arrive, so the figure includes the time waiting for the slowest TP rank."""
    import time

    from torch.utils._python_dispatch import TorchDispatchMode

    class _CollectiveTimer(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seconds = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if getattr(func, "namespace", "") not in ("_c10d_functional", "c10d_functional"):
                return func(*args, **(kwargs or {}))
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            self.seconds += time.perf_counter() - t0
            return out

    return _CollectiveTimer()
