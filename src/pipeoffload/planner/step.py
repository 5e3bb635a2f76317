"""The step after the pipeline: what an iteration still does once its last backward is done. Pure Python.

Model (docs/planner.md §3): after the pipeline and the exposed tail of the DP gradient reduction
(:mod:`.dp`, which already carries the distributed optimizer's reduce-scatter and all-gather, so
nothing of DP is counted here):

* the **tied embedding's gradient all-reduce** — when the embedding and the output head share a
  weight held on two pipeline ranks, Megatron's ``_allreduce_embedding_grads`` sums the fp32
  gradient of the two copies (``4 · vocab · hidden / TP`` bytes, ``/DP`` under FSDP) between the
  first and the last rank, at the DP bus bandwidth of a node, or across nodes once the job spans
  more than one;
* the **optimizer step** — memory-bound, :func:`optimizer_bytes_per_param` of HBM traffic per
  parameter at the HBM bandwidth, on the rank with the most parameters (every rank waits for it:
  the gradient norm's all-reduce and the next iteration's first P2P synchronise them).

The one implementation of this step: the planner's iteration (:func:`~.config.assemble`) and the
calibration against measured runs (:func:`pipeoffload.costmodel.measured.predict`) both call
:func:`step_after_pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..costmodel.hardware import Hardware
from ..costmodel.model import ModelSpec, shard_factors
from ..ir import Placement
from .sharding import NodeProfile

__all__ = ["OPTIMIZER_BYTES_PER_PARAM", "FP32_OPTIMIZER_BYTES_PER_PARAM", "ZEROING_BYTES_PER_PARAM",
           "StepAfterPipeline", "optimizer_bytes_per_param", "dp_bandwidth", "step_after_pipeline"]

#: Bytes of HBM traffic per parameter of Megatron's 16-bit optimizer step with fp32 master weights:
#: Adam reads the gradient, master weight, m and v (16) and writes the last three (12), the master
#: weight is copied to the 16-bit model weight (4 + 2), the gradient is read once for the norm and
#: once (read + write) for unscaling (12), and the gradient buffer is zeroed (4): 50.
OPTIMIZER_BYTES_PER_PARAM = 50.0
#: The same for fp32 training: Adam (28), the norm (4), zeroing (4); no master copy, no unscaling.
FP32_OPTIMIZER_BYTES_PER_PARAM = 36.0
#: Of those, zeroing the gradient buffer: the one part on the whole gradient under ZeRO-1.
ZEROING_BYTES_PER_PARAM = 4.0
#: The tied embedding's gradient is all-reduced in fp32 (Megatron's ``main_grad``).
_GRAD_BYTES = 4.0


@dataclass(frozen=True)
class StepAfterPipeline:
    """The step after the pipeline of one configuration (ms): ``optimizer_ms`` on ``rank`` (the
    rank with the most parameters, ``params`` per GPU at ``bytes_per_param`` of HBM traffic each)
    and ``embedding_ms``, the tied embedding's gradient all-reduce (0 when there is none)."""

    optimizer_ms: float
    embedding_ms: float
    rank: int
    params: float
    bytes_per_param: float

    @property
    def ms(self) -> float:
        """The whole step after the pipeline."""
        return self.optimizer_ms + self.embedding_ms

    def describe(self) -> str:
        emb = (f"; tied-embedding gradient all-reduce {self.embedding_ms:.1f} ms" if self.embedding_ms
               else "")
        return (f"{self.ms:.1f} ms (optimizer step {self.optimizer_ms:.1f} ms: {self.params / 1e9:.3g}B parameters "
                f"on rank {self.rank} at {self.bytes_per_param:.3g} B of HBM traffic each{emb})")

    def to_dict(self) -> dict[str, Any]:
        return {"step_s": self.ms / 1e3, "optimizer_s": self.optimizer_ms / 1e3,
                "embedding_allreduce_s": self.embedding_ms / 1e3, "rank": self.rank, "params": self.params,
                "bytes_per_param": self.bytes_per_param}


#: No step (a configuration built without one).
NO_STEP = StepAfterPipeline(0.0, 0.0, 0, 0.0, 0.0)


def optimizer_bytes_per_param(dtype: str, dp: int, dp_sharding: str) -> float:
    """HBM bytes the optimizer step moves per parameter of a rank, on one GPU.

    Args:
        dtype: the model's dtype (``fp32``: :data:`FP32_OPTIMIZER_BYTES_PER_PARAM`, otherwise
            16-bit with fp32 master weights: :data:`OPTIMIZER_BYTES_PER_PARAM`).
        dp: data-parallel replicas.
        dp_sharding: ``none``, ``optimizer`` (ZeRO-1: each replica steps its ``1/dp`` shard of the
            master weights, Adam moments and gradient, but zeroes its whole gradient buffer) or
            ``full`` (ZeRO-3/FSDP: everything ``1/dp``).

    Returns:
        Bytes per parameter.

    Raises:
        ParameterError: an unknown ``dp_sharding`` or a ``dp`` below 1 (``shard_factors``).
    """
    _, grad, opt = shard_factors(dp_sharding, dp)
    total = FP32_OPTIMIZER_BYTES_PER_PARAM if dtype == "fp32" else OPTIMIZER_BYTES_PER_PARAM
    return (total - ZEROING_BYTES_PER_PARAM) * opt + ZEROING_BYTES_PER_PARAM * grad


def dp_bandwidth(hardware: Hardware, node: NodeProfile, intra: bool) -> float:
    """Bytes/s of a DP-group collective: the profile's intra-node DP bus bandwidth (else the TP
    link) inside a node, its inter-node one (else the inter-node or inter-stage link) across."""
    if intra:
        return hardware.dp_intra_bw or node.tp_bw
    return hardware.dp_inter_bw or hardware.internode_bw or hardware.link_bw


def step_after_pipeline(model: ModelSpec, hardware: Hardware, node: NodeProfile,
                        state: Sequence[tuple[float, float, float]], placement: Placement, tp: int, dp: int,
                        dp_sharding: str, gpus: int) -> StepAfterPipeline:
    """The step after the pipeline of one configuration (the module's model).

    Args:
        model: the model (dtype, vocabulary, hidden size, tied embeddings).
        hardware: the profile (``gpus_per_node``, the DP bandwidths).
        node: its node constants (``hbm_bw``, ``tp_bw``, ``collective_latency``).
        state: per layer group, (parameter, gradient, optimizer) bytes per GPU after TP
            (``ShardedCosts.state``).
        placement: which rank holds each layer group.
        tp, dp: tensor- and data-parallel degrees.
        dp_sharding: ``none``, ``optimizer`` or ``full`` (:func:`optimizer_bytes_per_param`).
        gpus: GPUs of the job; more than a node's puts the first and the last rank on two nodes.

    Returns:
        A :class:`StepAfterPipeline`.

    Raises:
        ParameterError: an unknown ``dp_sharding``.

    Guarantees: non-negative; the embedding term is 0 unless the model ties its embeddings and
    the first and last layer group sit on different ranks (V-shaped placements keep both on
    rank 0); no DP gradient traffic (that is :mod:`.dp`'s).
    """
    per_rank = [0.0] * placement.num_ranks
    for s, (param_bytes, _, _) in enumerate(state):
        per_rank[placement.rank_of(s)] += param_bytes / model.dtype_bytes
    rank = max(range(placement.num_ranks), key=lambda r: per_rank[r])
    per_param = optimizer_bytes_per_param(model.dtype, dp, dp_sharding)
    optimizer = per_rank[rank] * per_param / node.hbm_bw * 1e3
    embedding = 0.0
    if model.tie_embeddings and placement.rank_of(0) != placement.rank_of(placement.num_stages - 1):
        _, grad, _ = shard_factors(dp_sharding, dp)
        nbytes = _GRAD_BYTES * model.vocab * model.hidden / tp * grad
        bw = dp_bandwidth(hardware, node, intra=gpus <= hardware.gpus_per_node)
        embedding = (nbytes / bw + node.collective_latency) * 1e3
    return StepAfterPipeline(optimizer, embedding, rank, per_rank[rank], per_param)
