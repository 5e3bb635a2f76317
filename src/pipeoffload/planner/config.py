"""An evaluated configuration: its memory breakdown, time, MFU and bubble. Pure Python.

:func:`assemble` turns a simulated candidate (:class:`~.simulate.Simulated`) into a
:class:`Config`; :func:`assemble_offloaded` does the same with the offload pass's plan on top.
A configuration's iteration is its pipeline makespan, the exposed DP gradient reduction and the
step after the pipeline (:mod:`.step`: optimizer step, tied-embedding gradient all-reduce).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from ..costmodel.hardware import GiB
from ..recompute import Recompute
from .hostlink import check_pinned_host, effective_k, host_links
from .refusals import Refused
from .sharding import rank_states
from .space import BUDGET, Family, Problem, Split
from .step import NO_STEP, StepAfterPipeline, step_after_pipeline

if TYPE_CHECKING:  # pragma: no cover
    from ..passes.offload import OffloadResult
    from .simulate import Simulated

__all__ = ["MemoryBreakdown", "Config", "assemble", "assemble_offloaded"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted peak of the binding device (bytes). ``device = params + grads_optimizer +
    activations`` exactly; ``host`` (pinned host memory of the offloaded activations, that device)
    and ``host_max`` (any device) are not device memory."""

    params: float
    grads_optimizer: float
    activations: float
    host: float = 0.0
    host_max: float = 0.0
    rank: int = 0

    @property
    def device(self) -> float:
        return self.params + self.grads_optimizer + self.activations

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "params_gib": self.params / GiB, "grads_optimizer_gib": self.grads_optimizer / GiB,
            "activations_gib": self.activations / GiB, "device_gib": self.device / GiB,
            "host_gib": self.host / GiB, "host_max_gib": self.host_max / GiB,
        }


@dataclass
class Config:
    """One evaluated configuration (fitting or not)."""

    family: Family
    split: Split
    m: int
    g: int | None
    recompute: Recompute  #: none, elementwise, selective or full (docs/glossary.md)
    offload_chunks: int  #: 0 = no offload
    memory: MemoryBreakdown
    budget: float
    makespan_ms: float
    dp_exposed_ms: float
    bubble_rate: float
    mfu: float
    tokens_per_s: float
    simulated_m: int
    extrapolated: bool
    dropped_offloads: int = 0
    notes: list[str] = field(default_factory=list)
    effective_k: float | None = None  #: offloaded plans: k with the host-link sharing (hostlink)
    offload_stash: bool = False  #: the B→W stash window offloaded too (offload_chunks > 0)
    step: StepAfterPipeline = NO_STEP  #: the step after the pipeline (optimizer, tied embedding)

    @property
    def step_ms(self) -> float:
        """ms of the step after the pipeline (:mod:`.step`)."""
        return self.step.ms

    @property
    def iteration_ms(self) -> float:
        """Pipeline makespan + exposed DP gradient reduction + the step after the pipeline."""
        return self.makespan_ms + self.dp_exposed_ms + self.step.ms

    @property
    def fits(self) -> bool:
        return self.memory.device <= self.budget

    @property
    def over(self) -> float:
        """Bytes above the budget (≤ 0 when it fits)."""
        return self.memory.device - self.budget

    @property
    def name(self) -> str:
        """The schedule with its concrete v and g, e.g. "group-interleaved v=2 g=4"."""
        f = self.family
        if f.group:
            return f"{f.schedule} v={f.v} g={self.g}"
        return f.label

    def describe(self) -> str:
        off = f", offload C={self.offload_chunks}" + (" +stash" if self.offload_stash else "") \
            if self.offload_chunks else ""
        rc = {Recompute.NONE: "", Recompute.ELEMENTWISE: ", recompute"}.get(self.recompute,
                                                                          f", {self.recompute} recompute")
        return f"{self.name} {self.split} m={self.m}{rc}{off}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family.label, "schedule": self.family.schedule, "v": self.family.v, "g": self.g,
            "tp": self.split.tp, "pp": self.split.pp, "dp": self.split.dp, "microbatches": self.m,
            "sequence_parallel": self.split.sp,
            "recompute": bool(self.recompute),  # JSON as before: anything recomputed, and the level
            "recompute_mode": Recompute.of(self.recompute).value,
            "offload_chunks": self.offload_chunks, "offload_stash": self.offload_stash,
            "memory": self.memory.to_dict(), "fits": self.fits,
            "iteration_s": self.iteration_ms / 1e3, "pipeline_s": self.makespan_ms / 1e3,
            "dp_exposed_s": self.dp_exposed_ms / 1e3, "step_s": self.step.ms / 1e3,
            "step_after_pipeline": self.step.to_dict(), "bubble_rate": self.bubble_rate, "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s, "simulated_microbatches": self.simulated_m,
            "extrapolated": self.extrapolated, "dropped_offloads": self.dropped_offloads, "notes": list(self.notes),
            "effective_k": self.effective_k,
        }


def assemble(problem: Problem, sim: "Simulated", offload_chunks: int = 0, act: list[float] | None = None,
             host: list[float] | None = None, extra_ms: float = 0.0, dropped: int = 0,
             notes: Sequence[str] = ()) -> Config:
    """``sim`` as a configuration of ``problem``: per-rank activation peaks ``act`` (default the
    simulation's) and pinned host memory ``host`` (default none), ``extra_ms`` added to the makespan.

    Guarantees: the breakdown is the rank where parameters + gradients/optimizer + activations is
    highest, and its three parts add up to ``memory.device``; iteration = makespan + exposed DP time
    + the step after the pipeline (:func:`~.step.step_after_pipeline`), and MFU and tokens/s are of
    that iteration;
    a family limited "at the budget" comes back with the multiple of 1F1B's memory that limit was
    (:func:`resolved_family`), which generates the same schedule.
    """
    split = sim.split
    act = act if act is not None else sim.act
    host = host if host is not None else [0.0] * split.pp
    state = rank_states(sim.sharded, sim.placement, split.dp, problem.options.dp_sharding)
    totals = [state[r][0] + state[r][1] + act[r] for r in range(split.pp)]
    r = max(range(split.pp), key=lambda i: totals[i])
    mem = MemoryBreakdown(state[r][0], state[r][1], act[r], host[r], max(host), r)
    makespan = sim.makespan + extra_ms
    step = step_after_pipeline(problem.model, problem.hardware, problem.node, sim.sharded.state, sim.placement,
                               split.tp, split.dp, problem.options.dp_sharding, problem.gpus)
    it_ms = makespan + sim.dp_exposed + step.ms
    flops = sim.sharded.flops * sim.m * split.dp
    mfu = flops / (it_ms / 1e3 * problem.gpus * problem.node.peak_rate) if it_ms > 0 else 0.0
    tokens = problem.global_batch * problem.model.seq / (it_ms / 1e3) if it_ms > 0 else 0.0
    bubble = 1.0 - max(sim.busy) / makespan if makespan > 0 else 0.0
    return Config(resolved_family(problem, sim), split, sim.m, sim.family.g(split.pp), sim.recompute, offload_chunks, mem,
                  problem.budget, makespan, sim.dp_exposed, bubble, mfu, tokens, sim.simulated_m, sim.extrapolated,
                  dropped, list(notes), step=step)


def resolved_family(problem: Problem, sim: "Simulated") -> Family:
    """``sim``'s family with a :data:`~.space.BUDGET` limit replaced by the multiple ``L`` of 1F1B's
    memory it came to (the simulator gives ``L`` × 1F1B's peak + the largest B delta, so the same
    bytes): what a configuration reports and ``pipeoffload train --config`` takes (zb-auto's
    ``mem_limit`` = L·p). Other families unchanged."""
    fam = sim.family
    if fam.limit != BUDGET:
        return fam
    from .simulate import generator_limit

    room = generator_limit(problem, fam, sim.split.pp, sim.sharded, sim.split.dp)
    one = generator_limit(problem, dataclasses.replace(fam, limit=1), sim.split.pp, sim.sharded)
    b_plus = max(0.0, max(d[1] for d in sim.sharded.memory.group_deltas))  # type: ignore[union-attr]
    return dataclasses.replace(fam, limit=(room - b_plus) / (one - b_plus))  # type: ignore[operator]


def assemble_offloaded(problem: Problem, sim: "Simulated", offload: "OffloadResult", chunks: int,
                       stash: bool = False) -> Config:
    """``sim`` with the offload pass's plan of ``chunks`` chunks per rank (made on the ``m1``
    timeline; with the B→W stash window when ``stash``): peaks are the plan's plus whatever the plain peak grew by between ``m1`` and the real
    m (conservative); dropped offloads are counted and noted."""
    act = [a + max(0.0, b - c) for a, b, c in zip(offload.peak, sim.act, offload.peak_no_offload)]
    dropped = offload.skipped.get("link_busy", 0)
    links = host_links(problem.hardware, sim.split.tp, problem.options.link_group)
    host = list(offload.host_memory)
    why = check_pinned_host(problem.hardware, host, problem.gpus)
    if why:
        raise Refused("offload", why, config=f"{sim.family.label} {sim.split} m={sim.m} C={chunks}")
    k = effective_k(sim.sharded, links)
    notes = [f"effective k = {k:.2f} ({links.describe})"]
    notes += [f"{dropped} offloads dropped (host link busy)"] if dropped else []
    cfg = assemble(problem, sim, chunks, act, host, offload.makespan - offload.makespan_no_offload, dropped, notes)
    cfg.effective_k, cfg.offload_stash = k, stash
    return cfg
