"""The data-parallel gradient all-reduce, overlapped with the pipeline's last backwards. Pure Python.

Model (docs/planner.md §3): each rank all-reduces its fp32 gradients over the ``dp`` replicas
with a ring (``2(d−1)/d`` of the bytes), one bucket per layer, each launched when its layer's
gradient is final — the layer group's last W (or BW), the group's layers finishing in reverse
order through it — and queued on one link (Megatron's overlapped gradient reduce). DP inside a
node (``TP·DP ≤ 8``) uses the TP link, otherwise the hardware's inter-stage link. Only what runs
past the end of the pipeline adds to the iteration.
"""

from __future__ import annotations

import math

from ..costmodel.hardware import Hardware
from ..ir import OpKind, Placement
from ..timeline import Timeline
from .sharding import NodeProfile, ShardedCosts
from .space import Split
from .step import dp_bandwidth

__all__ = ["dp_exposed"]

#: The op kinds after whose last one a layer group's gradients are final.
_GRADIENT_FINAL = frozenset((OpKind.W, OpKind.BW))


def dp_exposed(timeline: Timeline, sharded: ShardedCosts, split: Split, placement: Placement, node: NodeProfile,
               hardware: Hardware) -> float:
    """ms of the DP gradient all-reduce that runs past the pipeline's end (worst rank).

    Guarantees: 0 when ``split.dp == 1``; never negative.
    """
    d = split.dp
    if d == 1:
        return 0.0
    bw = dp_bandwidth(hardware, node, intra=split.tp * d <= hardware.gpus_per_node)
    last = timeline.last_ops(_GRADIENT_FINAL)  # after its last W or BW a group's gradients are final
    end = timeline.end
    worst = 0.0
    for r in range(placement.num_ranks):
        t = -math.inf
        for ready, duration in sorted(_buckets(sharded, placement.stages_of(r), last, end, d, bw, node)):
            t = max(t, ready) + duration
        worst = max(worst, t - end)
    return max(0.0, worst)


def _buckets(sharded: ShardedCosts, stages: tuple[int, ...], last: dict[int, tuple[float, float]], end: float,
             d: int, bw: float, node: NodeProfile) -> list[tuple[float, float]]:
    """(ready ms, all-reduce ms) of every layer's bucket of the groups ``stages``: layer k of a
    group of L is final at fraction (k+1)/L through the group's last gradient op."""
    out: list[tuple[float, float]] = []
    for s in stages:
        layers = max(sharded.layers[s], 1)  # an edge chunk with only the embedding/head: one bucket
        nbytes = sharded.state[s][1] / layers
        t_ar = 2 * (d - 1) / d * nbytes / bw * 1e3 + node.collective_latency * 1e3
        st, en = last.get(s, (end, end))
        out += [(st + (k + 1) / layers * (en - st), t_ar) for k in range(layers)]
    return out
