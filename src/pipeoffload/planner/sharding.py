"""One GPU's costs under tensor parallelism, and the node constants they need. Pure Python.

``node_profile(hardware)``: the constants the cost model's :class:`Hardware` lacks (TP link,
HBM bandwidth, nominal peak FLOP/s). ``shard_costs(pc, tp, node)``: a pipeline's per-group
costs divided over ``tp`` GPUs (Megatron TP with sequence parallelism) plus the TP
collectives. :class:`CostTable`: those per-GPU costs for every (recompute, p, v, TP) a search
asks for, each computed once. ``rank_states``/``rank_compute``: per-rank sums over a
placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..costmodel.hardware import Hardware
from ..costmodel.model import ModelSpec, PipelineCosts, layer_split, pipeline_costs, shard_factors
from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError
from ..ir import Placement

from ..recompute import RECOMPUTE_LEVELS, Recompute  # the search's recompute settings (docs/glossary.md)

__all__ = ["RECOMPUTE_ORDER", "NodeProfile", "node_profile", "gemm_efficiency", "tp_slowdown", "ShardedCosts", "shard_costs", "CostTable", "rank_states",
           "rank_compute"]

#: Per built-in profile: nominal dense 16-bit peak (FLOP/s, for MFU), the intra-node TP link
#: (achieved one-direction NVLink bandwidth, bytes/s) and HBM bandwidth (bytes/s). The cost model's
#: Hardware has none of these, so they live here (see NodeProfile).
_NODE_CONSTANTS: dict[str, tuple[float, float, float]] = {
    "a100-80g": (312e12, 230e9, 2.0e12),  # NVLink 3: ~230 GB/s all-reduce bus bandwidth
    "h100-80g": (989e12, 360e9, 3.35e12),  # NVLink 4: ~360 GB/s all-reduce bus bandwidth
    "h200": (989e12, 360e9, 4.8e12),
}


@dataclass(frozen=True)
class NodeProfile:
    """Constants of one node that the cost model's :class:`Hardware` lacks.

    ``peak_rate``: nominal dense peak FLOP/s, the MFU denominator; ``tp_bw``: achieved
    one-direction bytes/s of the intra-node link TP (and DP inside a node) use; ``hbm_bw``: HBM
    bytes/s (prices recomputation); ``collective_latency``: seconds per TP collective.
    """

    peak_rate: float
    tp_bw: float
    hbm_bw: float
    collective_latency: float = 10e-6
    source: str = ""


def node_profile(hw: Hardware, peak_rate: float | None = None, tp_bw: float | None = None,
                 hbm_bw: float | None = None) -> NodeProfile:
    """The profile's own figures where it has them, else the built-in constants for a known name,
    else A100's scaled by the achieved compute rate over A100's 220 TFLOP/s (stated in
    ``source``). Overrides win; an override that is not a positive number raises ParameterError
    naming it."""
    known = _NODE_CONSTANTS.get(hw.name.lower())
    if known is not None:
        peak, tp_link, hbm = known
        source = f"built-in constants for {hw.name}"
    else:
        f = hw.compute_rate / 220e12
        peak, tp_link, hbm = 312e12 * f, 230e9 * f, 2.0e12 * f
        source = f"A100 constants scaled by {f:.3g} (achieved rate relative to a100-80g)"
    if hw.peak_rate or hw.tp_bw or hw.hbm_bw:
        peak, tp_link, hbm = hw.peak_rate or peak, hw.tp_bw or tp_link, hw.hbm_bw or hbm
        source = f"profile {hw.name}"
    for name, x in (("peak_rate", peak_rate), ("tp_bw", tp_bw), ("hbm_bw", hbm_bw)):
        if x is not None and not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ParameterError(name, f"must be a positive number, got {x!r}")
    return NodeProfile(peak_rate or peak, tp_bw or tp_link, hbm_bw or hbm, 10e-6, source)


def gemm_efficiency(width: float, half_width: float) -> float:
    """Relative rate of a GEMM whose sharded width is ``width``: ``w / (w + half_width)`` (1 when
    ``half_width`` is 0). Small shards fill fewer tiles per SM wave (docs/cost-model.md)."""
    return 1.0 if half_width <= 0 else width / (width + half_width)


def tp_slowdown(model: ModelSpec, tp: int, hw: Hardware) -> float:
    """How much slower a TP-``tp`` shard's matmuls run than ``1/tp`` of the whole layer's: the GEMM
    efficiency at the unsharded hidden width over the one at ``hidden/tp`` (1 for ``tp == 1``)."""
    if tp == 1:
        return 1.0
    h = model.hidden
    return gemm_efficiency(h, hw.gemm_half_width) / gemm_efficiency(h / tp, hw.gemm_half_width)


@dataclass(frozen=True)
class ShardedCosts:
    """One GPU's share of a ``p·v``-group split under TP (times ms, memory bytes, per microbatch).

    ``costs``/``memory``: per layer group (``group_costs``/``group_deltas``); ``transfer_ms``: one-way
    offload time per group; ``state``: (param, grad, optimizer) bytes per group; ``layers``: layers per
    group; ``flops``: model FLOPs of one microbatch through the whole model (all GPUs; for MFU).
    """

    pc: PipelineCosts
    tp: int
    costs: Costs
    memory: MemoryDeltas
    transfer_ms: tuple[float, ...]
    state: tuple[tuple[float, float, float], ...]
    layers: tuple[int, ...]
    flops: float
    tp_ms_per_collective: float
    recompute_ms_per_layer: float

    @property
    def comm(self) -> float:
        return self.costs.comm


def shard_costs(pc: PipelineCosts, tp: int, node: NodeProfile, recompute_ms_per_layer: float = 0.0,
                crosses_nodes: bool = False, sequence_parallel: bool = True) -> ShardedCosts:
    """Divide ``pc`` by ``tp`` (sequence-parallel TP: compute, bytes, states, boundary and offload all
    /tp) and add the TP collectives to F and B and ``recompute_ms_per_layer`` (whole layer, before
    /tp) to B. With ``tp == 1`` and no recompute time the costs are ``pc``'s."""
    model, hw = pc.model, pc.hardware
    coll = 0.0
    if tp > 1:
        nbytes = model.tokens * model.hidden * model.dtype_bytes
        coll = (2 * (tp - 1) / tp * nbytes / node.tp_bw + node.collective_latency) * 1e3
    slow = tp_slowdown(model, tp, hw)
    hidden_b = hw.tp_overlap  # Megatron overlaps the backward's collectives with weight-gradient GEMMs
    # Without sequence parallelism the tensors outside the TP region stay whole on every TP rank.
    rep_s, rep_w = (0, 0) if sequence_parallel or tp == 1 else model.layer_replicated_bytes()
    keep = 1.0 - 1.0 / tp
    # The simulator has one hop cost: the slowest hop (inter-node when the pipeline spans nodes).
    hop_bw = (hw.internode_bw or hw.link_bw) if crosses_nodes else hw.link_bw
    hop_bytes = model.boundary_bytes() / (tp if sequence_parallel else 1)  # SP sends sequence shards
    comm = (hop_bytes / hop_bw + hw.link_latency) * 1e3
    # Megatron's blocking P2P: an F or B holds its stage's compute for part of its hop (docs/cost-model.md).
    held = hw.p2p_exposed * comm
    triples, deltas, transfer = [], [], []
    for g in pc.groups:
        nf = 2 * g.layers + int(g.has_embedding) + int(g.has_head)
        nb = 2 * g.layers + int(g.has_head)
        b_coll = nb * coll * (1.0 - hidden_b)
        triples.append((g.F_ms / tp * slow + nf * coll + held,
                        g.B_ms / tp * slow + b_coll + g.layers * recompute_ms_per_layer / tp + held,
                        g.W_ms / tp * slow))
        f, b, w = g.deltas
        fd, wd = f / tp + g.layers * rep_s * keep, w / tp - g.layers * rep_w * keep
        deltas.append((fd, -fd - wd, wd))
        transfer.append(g.offload_ms * fd / f if f else g.offload_ms / tp)
    costs = Costs(F=sum(t[0] for t in triples) / pc.p, B=sum(t[1] for t in triples) / pc.p,
                  W=sum(t[2] for t in triples) / pc.p, comm=comm, group_costs=tuple(triples))
    df = sum(d[0] for d in deltas) / pc.p
    db = sum(d[1] for d in deltas) / pc.p
    memory = MemoryDeltas(F=df, B=db, W=-(df + db), group_deltas=tuple(deltas))
    return ShardedCosts(
        pc=pc, tp=tp, costs=costs, memory=memory,
        transfer_ms=tuple(transfer),
        state=tuple((g.param_bytes / tp, g.grad_bytes / tp, g.optimizer_bytes / tp) for g in pc.groups),
        layers=tuple(g.layers for g in pc.groups),
        flops=float(sum(g.block.flops for g in pc.groups)),
        tp_ms_per_collective=coll, recompute_ms_per_layer=recompute_ms_per_layer,
    )


#: Recompute settings from most memory to least.
RECOMPUTE_ORDER: tuple[Recompute, ...] = RECOMPUTE_LEVELS


def recompute_label(recompute: "Recompute") -> str:
    """"none", "elementwise", "selective" or "full"."""
    return Recompute.of(recompute).value


class CostTable:
    """Per-GPU costs of ``model`` on ``hardware`` for every (recompute, p, v, TP) asked for.

    Guarantees: :meth:`sharded` returns the same object for the same ``(recompute, p, v, tp)``
    (computed once, keyed by those values); the layers are split into ``p·v`` groups as
    ``trim_edges`` says ("auto": the split whose heaviest group, F+B+W of the model as given, is
    lighter), the same split for both recompute settings.
    """

    def __init__(self, model: ModelSpec, hardware: Hardware, node: NodeProfile,
                 trim_edges: bool | str = "auto", crosses_nodes: bool = False) -> None:
        self.model, self.hardware, self.node, self.trim_edges = model, hardware, node, trim_edges
        self.crosses_nodes = crosses_nodes  # some pipeline hop crosses nodes: hops at the inter-node rate
        self._pipeline: dict[tuple[bool, int, int], PipelineCosts] = {}
        self._sharded: dict[tuple, ShardedCosts] = {}
        self._splits: dict[tuple[int, int], tuple[int, ...]] = {}

    def model_for(self, recompute: "Recompute") -> ModelSpec:
        """The model with ``recompute`` (:meth:`ModelSpec.with_recompute`)."""
        return self.model.with_recompute(recompute)

    def recompute_ms(self, recompute: "Recompute") -> float:
        """ms per layer (whole layer, before TP) of re-running the cheap elementwise ops in B:
        twice the bytes they stop saving over the HBM bandwidth (memory-bound). Selective and full
        recompute's matmul work is in the layer's ``recompute_flops`` (compute-bound) instead."""
        if Recompute.of(recompute) in (Recompute.NONE, Recompute.FULL):
            return 0.0
        dropped = (self.model_for(Recompute.NONE).layer().saved_bytes
                   - self.model_for(Recompute.ELEMENTWISE).layer().saved_bytes)
        return 2.0 * max(dropped, 0) / self.node.hbm_bw * 1e3

    def layer_split(self, p: int, v: int) -> tuple[int, ...]:
        """Layers per group of a ``p·v``-group split (computed once per ``(p, v)``: every
        recompute setting asks for the same split, and "auto" costs two pipeline cost models)."""
        if (p, v) not in self._splits:
            self._splits[p, v] = self._layer_split(p, v)
        return self._splits[p, v]

    def _layer_split(self, p: int, v: int) -> tuple[int, ...]:
        n, layers = p * v, self.model.layers
        if n > layers:  # only the trimmed split exists: edge chunks with the embedding / head alone
            return layer_split(layers, n, trim_edges=True)
        plain = layer_split(layers, n)
        if self.trim_edges is False or n < 3:
            return plain
        try:
            trimmed = layer_split(layers, n, trim_edges=True)
        except ParameterError:
            return plain
        if self.trim_edges is True:
            return trimmed
        heaviest = [max(g.F_ms + g.B_ms + g.W_ms
                        for g in pipeline_costs(self.model, self.hardware, p, v, split=s).groups)
                    for s in (plain, trimmed)]
        return trimmed if heaviest[1] < heaviest[0] else plain

    def sharded(self, recompute: bool, p: int, v: int, tp: int, sp: bool = True) -> ShardedCosts:
        """One GPU's costs with ``recompute``, ``p`` ranks of ``v`` chunks, TP ``tp`` with or without
        sequence parallelism ``sp``."""
        key = (recompute, p, v, tp, sp)
        if key not in self._sharded:
            pkey = (recompute, p, v)
            if pkey not in self._pipeline:
                self._pipeline[pkey] = pipeline_costs(self.model_for(recompute), self.hardware, p, v,
                                                      split=self.layer_split(p, v))
            self._sharded[key] = shard_costs(self._pipeline[pkey], tp, self.node, self.recompute_ms(recompute),
                                             self.crosses_nodes, sp)
        return self._sharded[key]


def rank_states(sharded: ShardedCosts, placement: Placement, dp: int = 1,
                dp_sharding: str = "none") -> list[tuple[float, float]]:
    """Per rank: (parameter bytes, gradient + optimizer bytes) of the groups it holds, per GPU, with
    the state sharded over ``dp`` replicas as ``dp_sharding`` says
    (:func:`~pipeoffload.costmodel.model.shard_factors`)."""
    fp, fg, fo = shard_factors(dp_sharding, dp)
    state = [[0.0, 0.0] for _ in range(placement.num_ranks)]
    for s, (param, grad, optimizer) in enumerate(sharded.state):
        r = placement.rank_of(s)
        state[r][0] += param * fp
        state[r][1] += grad * fg + optimizer * fo
    return [(a, b) for a, b in state]


def rank_compute(sharded: ShardedCosts, placement: Placement) -> list[float]:
    """Per rank: ms of F+B+W of one microbatch through the groups it holds."""
    busy = [0.0] * placement.num_ranks
    for s, t in enumerate(sharded.costs.group_costs):  # type: ignore[arg-type]
        busy[placement.rank_of(s)] += sum(t)
    return busy
