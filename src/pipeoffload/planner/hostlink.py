"""Host links by topology: which GPUs share one, what the offload pass is told, and the pinned
host memory a node must hold. Pure Python.

A node's ``host_link_gpus`` GPUs with consecutive device ids sit under one PCIe switch and share its
uplink to the CPU. Ranks are laid out TP first, then PP, then DP (the authors' PipeOffload scripts
use Megatron's ``--use-tp-pp-dp-mapping``), so:

* ``tp ≥ host_link_gpus``: the GPUs sharing a link are TP partners of one stage. They offload
  their shards of the same activation *at the same moment*, so every transfer runs at
  ``1/host_link_gpus`` of the link: transfer times × ``host_link_gpus``, one pipeline rank per
  link in the offload pass (nothing to arbitrate between ranks).
* ``tp < host_link_gpus``: ``host_link_gpus / tp`` consecutive pipeline ranks share a link; the
  offload pass queues their transfers on it (``link_group``) at the full link rate.

``effective k`` = (offload + reload time) / (F + B + W) of one GPU's share of a layer group, with
the sharing above: the ratio that decides whether offload hides behind compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costmodel.hardware import GiB, Hardware
from .sharding import ShardedCosts

__all__ = ["HostLinks", "host_links", "effective_k", "check_pinned_host"]


@dataclass(frozen=True)
class HostLinks:
    """How one pipeline rank's GPUs use the host links: ``link_group`` pipeline ranks per link (the
    offload pass's option), ``slowdown`` multiplies every transfer time, ``describe`` says why."""

    link_group: int
    slowdown: float
    describe: str


def host_links(hw: Hardware, tp: int, link_group: int | None = None) -> HostLinks:
    """The sharing of ``hw``'s host links by a TP-``tp`` pipeline (see the module docstring).
    ``link_group`` given: the caller's explicit pairing of pipeline ranks, no TP sharing."""
    share = hw.host_link_gpus
    if link_group is not None:
        return HostLinks(link_group, 1.0, f"{link_group} pipeline ranks per host link (given)")
    if share == 1:
        return HostLinks(1, 1.0, "one GPU per host link")
    if tp >= share:
        return HostLinks(1, float(share), f"host link shared by {share} TP partners of one stage (×{share} time)")
    per = share // tp if share % tp == 0 else 1
    return HostLinks(max(per, 1), float(share // per) if per > 0 else 1.0,
                     f"{per} consecutive pipeline ranks share a host link" if per > 1 else "one rank per host link")


def effective_k(sharded: ShardedCosts, links: HostLinks) -> float:
    """The largest per-group (D2H + H2D) / (F + B + W) of one GPU, transfers slowed by ``links``."""
    best = 0.0
    for t, (f, b, w) in zip(sharded.transfer_ms, sharded.costs.group_costs):  # type: ignore[arg-type]
        best = max(best, 2 * t * links.slowdown / (f + b + w))
    return best


def check_pinned_host(hw: Hardware, per_gpu_host: list[float], gpus: int) -> str | None:
    """Why the pinned host memory does not fit one node (None when it does, or when the profile
    gives no limit): the fullest GPU's host bytes times the GPUs per node against
    ``hw.pinned_host_bytes``."""
    if hw.pinned_host_bytes is None or not per_gpu_host:
        return None
    per_node = max(per_gpu_host) * min(gpus, hw.gpus_per_node)
    if per_node <= hw.pinned_host_bytes:
        return None
    return (f"pinned host memory {max(per_gpu_host) / GiB:.1f} GiB per GPU, {per_node / GiB:.0f} GiB per node, "
            f"exceeds the node's {hw.pinned_host_bytes / GiB:.0f} GiB")
