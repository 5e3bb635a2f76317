"""What a search returns: the ranked configurations, the rejections and the search's counts.
Pure Python.

A :class:`PlanResult` holds results only, no search state: :meth:`PlanResult.timeline` and
:meth:`PlanResult.costs_of` recompute what they need from the problem (deterministically, so
the same numbers the search saw).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..costmodel.hardware import GiB, Hardware
from ..costmodel.model import ModelSpec
from ..errors import ParameterError
from ..timeline import Timeline
from .config import Config
from .refusals import Rejection
from .report import format_table
from .sharding import NodeProfile, ShardedCosts
from .space import PlanOptions, Problem
from .step import optimizer_bytes_per_param

__all__ = ["NoConfigurationFits", "PlanResult"]


class NoConfigurationFits(ParameterError):
    """No configuration fits the memory budget (a ParameterError on ``memory_budget``); the
    message lists why each family failed."""

    def __init__(self, result: "PlanResult") -> None:
        self.result = result
        reasons = [f"{r.family}: {r.reason}" for r in result.rejected + result.rejected_splits]
        super().__init__(
            "memory_budget",
            f"no configuration of {result.model.name} on {result.gpus} × {result.hardware.name} fits "
            f"{result.budget / GiB:.3g} GiB per device ({len(reasons)} reasons: " + "; ".join(reasons[:40])
            + ("; …" if len(reasons) > 40 else "") + ")",
        )


@dataclass
class PlanResult:
    """The outcome of :func:`~pipeoffload.planner.plan`: ``configs`` (fitting, fastest first, at
    most ``options.top``), ``rejected`` (one per family without a fitting configuration),
    ``rejected_splits`` and ``stats`` (the search's counts and seconds)."""

    model: ModelSpec
    hardware: Hardware
    node: NodeProfile
    gpus: int
    budget: float
    global_batch: int
    options: PlanOptions
    configs: list[Config]
    rejected: list[Rejection]
    rejected_splits: list[Rejection]
    stats: dict[str, Any]

    @property
    def problem(self) -> Problem:
        return Problem(self.model, self.hardware, self.node, self.budget, self.global_batch, self.gpus,
                       self.options)

    @property
    def best(self) -> Config:
        if not self.configs:
            raise NoConfigurationFits(self)
        return self.configs[0]

    def timeline(self, config: Config) -> Timeline:
        """The simulated timeline behind ``config`` (at its simulated m; with the offload transfers
        when it offloads), memory in bytes per GPU; ``meta["plan"]`` is ``config.to_dict()``."""
        from .simulate import Simulator

        simulator = Simulator(self.problem)
        if config.offload_chunks:
            _, res = simulator.offload(config.split, config.family, config.m, config.recompute,
                                       config.offload_chunks, config.offload_stash)
            tl = res.timeline
        else:
            tl = simulator.simulate(config.split, config.family, config.m, config.recompute).timeline
        tl.meta["plan"] = config.to_dict()
        return tl

    def costs_of(self, config: Config) -> ShardedCosts:
        """The per-GPU costs ``config`` was evaluated with."""
        from .sharding import CostTable

        table = CostTable(self.model, self.hardware, self.node, self.options.trim_edges,
                          crosses_nodes=self.gpus > self.hardware.gpus_per_node)
        return table.sharded(config.recompute, config.split.pp, config.family.v, config.split.tp, config.split.sp)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.summary(), "hardware": self.hardware.to_dict(), "gpus": self.gpus,
            "memory_budget_gib": self.budget / GiB, "global_batch": self.global_batch,
            "microbatch_size": self.model.microbatch, "seq": self.model.seq,
            "configs": [c.to_dict() for c in self.configs],
            "best": self.configs[0].to_dict() if self.configs else None,
            "rejected": [r.to_dict() for r in self.rejected],
            "rejected_splits": [r.to_dict() for r in self.rejected_splits],
            "search": dict(self.stats),
            "prediction": self._prediction(),
            "assumptions": {
                "tp": "Megatron TP with sequence parallelism: FLOPs, activations, states /TP; GEMMs slowed by "
                      "the profile's efficiency curve; 2 collectives per layer in F and in B, the backward's "
                      f"overlapped {self.hardware.tp_overlap:.0%}",
                "tp_link_gbs": self.node.tp_bw / 1e9, "hbm_gbs": self.node.hbm_bw / 1e9,
                "peak_tflops": self.node.peak_rate / 1e12, "node_constants": self.node.source,
                "dp": "fp32 gradient ring all-reduce per layer bucket, overlapped with the last backward",
                "step": "after the pipeline and the exposed DP reduction: the optimizer step at "
                        f"{optimizer_bytes_per_param(self.model.dtype, 1, 'none'):g} B of HBM traffic per parameter "
                        "of the rank with the most (ZeRO-1: all but the gradient zeroing on the 1/DP shard; FSDP: "
                        "all of it), and the tied embedding's fp32 gradient all-reduced between the first and "
                        "last rank when they differ",
                "state_bytes_per_param": {
                    "none": "2 weights + 4 fp32 grads + 12 Adam/master (16-bit training) on every replica",
                    "optimizer": "Megatron's distributed optimizer (ZeRO-1): 6 + 12/DP",
                    "full": "ZeRO-3/FSDP: 18/DP"}[self.options.dp_sharding],
                "dp_sharding": self.options.dp_sharding,
                "memory_reserve_gib": self.hardware.reserve / GiB,
                "offload": f"offload pass, skip mode, postponed warm-up, {self.hardware.host_link_gpus} GPU(s) per "
                           "host link paired by topology (TP partners share when TP >= that), pinned host memory "
                           "checked per node",
            },
        }

    def _prediction(self) -> dict[str, Any]:
        """The best plan's predicted figures with the profile's calibration error (or None fields
        when nothing fits)."""
        from .report import calibration_note

        b = self.configs[0] if self.configs else None
        return {
            "iteration_s": b.iteration_ms / 1e3 if b else None, "mfu": b.mfu if b else None,
            "pipeline_s": b.makespan_ms / 1e3 if b else None, "dp_exposed_s": b.dp_exposed_ms / 1e3 if b else None,
            "step_s": b.step_ms / 1e3 if b else None,
            "peak_allocated_gib": b.memory.device / GiB if b else None,
            "peak_reserved_gib": self.hardware.reserved(b.memory.device) / GiB if b else None,
            "calibration": calibration_note(self.hardware), "calibrated": bool(self.hardware.calibration),
            "calibration_source": "benchmarks/reproduce_measured.py, docs/planner.md#calibration",
        }

    def table(self) -> str:
        return format_table(self)
