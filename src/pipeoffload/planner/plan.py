"""The planner: search pipeline schedules × chunks × group size × recompute × activation
offload × the PP·TP·DP splits of N GPUs under a per-device memory budget. Pure Python.

API
---
``plan(model, hardware, gpus, *, memory_budget=None, global_batch=None, microbatch=None, seq=None,
options=None) -> PlanResult``
    ``model``: a preset name, a model file or a :class:`~pipeoffload.costmodel.model.ModelSpec`;
    ``hardware``: a profile name, file or :class:`~pipeoffload.costmodel.hardware.Hardware`;
    ``memory_budget``: bytes per device (default: the hardware's HBM); ``global_batch``: sequences
    per iteration (default ``4 · gpus · microbatch``); ``microbatch``/``seq`` override the model's.
    Guarantees: every configuration in ``PlanResult.configs`` has a predicted device peak
    (parameters + gradients and optimizer states + resident activations) ≤ the budget, and they are
    sorted by predicted iteration time; every family of schedules that produced no configuration has
    an entry in ``PlanResult.rejected`` saying why (OOM by how much, m too small, generator refused,
    offload infeasible, or pruned as slower than the shown ones). Raises ParameterError for bad inputs.
``PlanOptions(...)``: search-space and model knobs (schedules, chunk counts, recompute and offload
    on/off, top-K, link constants); see its docstring.
``PlanResult``: ``configs`` (ranked :class:`Config`), ``rejected`` (per family :class:`Rejection`),
    ``rejected_splits``, ``best`` (raises :class:`NoConfigurationFits` when empty), ``to_dict()``,
    ``table()`` (text), ``timeline(config)`` (the simulated timeline of a configuration, with offload
    transfers, for drawing).
``node_profile(hardware) -> NodeProfile``: the constants the cost model lacks (TP link, HBM
    bandwidth, nominal peak FLOP/s).

Model (docs/planner.md has the long version)
--------------------------------------------
* Splits: ``N = TP · PP · DP``; TP ∈ {1, 2, 4, 8} dividing min(N, 8) (TP stays inside a node of 8),
  TP divides the heads and the FFN; PP ≤ layers; ``m = global_batch / (DP · microbatch)`` integral.
* TP is Megatron tensor parallelism *with sequence parallelism*: FLOPs, saved activations, the
  B→W bytes, parameters/gradients/optimizer states, the stage-boundary activation and the offloaded
  bytes are all divided by TP. Each layer adds 2 collectives to F and 2 to B (all-reduce, or the
  equal-volume all-gather + reduce-scatter pair of SP), each ``2(t−1)/t · b·s·h·d`` bytes over the
  node's TP link, not overlapped; the embedding adds one to F, the head one to F and one to B.
* DP: a ring all-reduce of each rank's fp32 gradients (``2(d−1)/d`` of them) per iteration, in one
  bucket per layer, each launched when its layer's last backward finishes (Megatron's overlapped
  gradient reduce) and queued on one link; only the part that runs past the end of the pipeline
  counts. DP inside a node (TP·DP ≤ 8) uses the TP link, otherwise the profile's inter-stage link.
* Recompute (cheap elementwise ops: norms, activation, dropout) drops those tensors from the saved
  bytes and adds ``2 × their bytes / HBM bandwidth`` to B (memory-bound re-execution).
* Offload: the offload pass in "skip" mode (a reload that cannot finish before its B is dropped and
  that activation stays resident; the makespan never grows), warm-up forwards postponed, ranks
  paired on one host link, transfer times from the cost model's ``offload_ms`` (divided by TP).
* Memory per device = parameters + gradients + optimizer states (18 B/param, no ZeRO) + the peak of
  resident activations (saved for B, and held from B until W); host memory reported apart.
* Microbatches: a schedule is simulated with at most a few periods beyond its warm-up; the
  iteration time is extrapolated linearly from two simulated m (exact for a periodic steady
  state), peak memory taken from the larger one (GPipe's peak, which grows with m, is scaled).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..costmodel.model import ModelSpec, PipelineCosts, layer_split, pipeline_costs
from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError, PipeoffloadError
from ..costmodel.hardware import GiB, Hardware, get_hardware
from ..ir import Placement, Schedule
from ..costmodel.presets import PO_RUNTIME, get_model
from ..timeline import Timeline

__all__ = [
    "NodeProfile", "node_profile", "PlanOptions", "Split", "Family", "MemoryBreakdown", "Config",
    "Rejection", "PlanResult", "NoConfigurationFits", "plan", "families", "enumerate_splits",
    "shard_costs", "ShardedCosts",
]

#: GPUs per node: TP never crosses a node.
NODE_GPUS = 8
TP_CHOICES = (1, 2, 4, 8)

#: Per built-in profile: nominal dense 16-bit peak (FLOP/s, for MFU), the intra-node TP link
#: (achieved one-direction NVLink bandwidth, bytes/s) and HBM bandwidth (bytes/s). The cost model's
#: Hardware has none of these, so they live here (see NodeProfile).
_NODE_CONSTANTS: dict[str, tuple[float, float, float]] = {
    "a100-80g": (312e12, 300e9, 2.0e12),  # NVLink 3: 600 GB/s bidirectional
    "h100-80g": (989e12, 450e9, 3.35e12),  # NVLink 4: 900 GB/s bidirectional
    "h200": (989e12, 450e9, 4.8e12),
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
    """The built-in constants for a known profile; for another profile, A100's scaled by its
    achieved compute rate over A100's 220 TFLOP/s (stated in ``source``). Overrides win."""
    known = _NODE_CONSTANTS.get(hw.name.lower())
    if known is not None:
        pk, tb, hb = known
        src = f"built-in constants for {hw.name}"
    else:
        f = hw.compute_rate / 220e12
        pk, tb, hb = 312e12 * f, 300e9 * f, 2.0e12 * f
        src = f"A100 constants scaled by {f:.3g} (achieved rate relative to a100-80g)"
    for name, x in (("--peak-tflops", peak_rate), ("--tp-link-gbs", tp_bw), ("--hbm-gbs", hbm_bw)):
        if x is not None and not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ParameterError(name, f"must be a positive number, got {x!r}")
    return NodeProfile(peak_rate or pk, tp_bw or tb, hbm_bw or hb, 10e-6, src)


# ---------------------------------------------------------------------------------------------
# The search space


@dataclass(frozen=True)
class Split:
    """``tp · pp · dp`` GPUs: tensor, pipeline and data parallel degrees."""

    tp: int
    pp: int
    dp: int

    def __str__(self) -> str:
        return f"TP={self.tp} PP={self.pp} DP={self.dp}"


@dataclass(frozen=True)
class Family:
    """A schedule family: registry ``schedule`` with ``v`` chunks; ``group`` "half" (⌈p/2⌉) or
    "full" (p) for group-interleaved; ``limit`` 1 or 2 (× 1F1B's memory) for zb-auto."""

    schedule: str
    v: int = 1
    group: str | None = None
    limit: int | None = None

    @property
    def label(self) -> str:
        if self.schedule == "zb-auto":
            return f"zb-{self.limit}p"
        if self.schedule == "group-interleaved":
            return f"group-interleaved v={self.v} g={'p/2' if self.group == 'half' else 'p'}"
        if self.schedule == "interleaved-1f1b":
            return f"interleaved-1f1b v={self.v}"
        return self.schedule

    def g(self, p: int) -> int | None:
        if self.group is None:
            return None
        return (p + 1) // 2 if self.group == "half" else p


#: Schedules whose op order depends only on (p, m, v, g): generated once, shared across costs.
FIXED_ORDER = frozenset({"gpipe", "1f1b", "interleaved-1f1b", "group-interleaved", "zb-h1", "zb-h2"})
#: Steady-state rule per schedule: (warm-up microbatches in multiples of p, period) where period
#: "p"/"g" means p / the group size. Simulating m ≥ factor·p reaches the steady state.
_STEADY: dict[str, tuple[int, str | int]] = {
    "gpipe": (1, 1), "1f1b": (2, 1), "zb-h1": (2, 1), "zb-h2": (2, 1), "zb-auto": (2, 1),
    "interleaved-1f1b": (2, "p"), "group-interleaved": (1, "g"),
}
_DEFAULT_STEADY = (2, 1)
#: Everything the planner may search, in the order it reports them.
DEFAULT_SCHEDULES = ("1f1b", "gpipe", "zb-h1", "zb-h2", "zb-auto", "interleaved-1f1b", "group-interleaved",
                     "zb-v", "v-half", "v-min", "v-zb")


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of the search (defaults in brackets).

    ``schedules``: registry names to search [all; zb-auto runs as "zb-1p" and "zb-2p"];
    ``chunks``: v values for loop-placed multi-chunk schedules [(2, 4)]; ``recompute``: values of
    recompute_elementwise to try [(False, True)]; ``offload``: try activation offload [True];
    ``top``: configurations kept — a family slower than the top ones even before its offload is
    evaluated is pruned [10]; ``po_runtime``: apply PipeOffload's runtime setting (flash attention,
    no dropout) to the model [False]; ``trim_edges``: "auto" (the split with the lower heaviest
    group), True or False; ``link_group``/``solo_factor``: the offload pass' host-link model [2, 0.7];
    ``tp_bw``/``hbm_bw``/``peak_rate``: override :func:`node_profile`.
    """

    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    chunks: tuple[int, ...] = (2, 4)
    recompute: tuple[bool, ...] = (False, True)
    offload: bool = True
    top: int = 10
    po_runtime: bool = False
    trim_edges: bool | str = "auto"
    link_group: int = 2
    solo_factor: float = 0.7
    tp_bw: float | None = None
    hbm_bw: float | None = None
    peak_rate: float | None = None

    def check(self) -> None:
        from ..schedules import SCHEDULES

        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if unknown or not self.schedules:
            raise ParameterError("--schedules", f"unknown schedule(s) {', '.join(unknown) or '(none given)'}; "
                                 f"valid: {', '.join(SCHEDULES)}")
        if not self.chunks or any(not isinstance(v, int) or v < 2 for v in self.chunks):
            raise ParameterError("--chunks", f"chunk counts must be integers >= 2, got {list(self.chunks)}")
        if not self.recompute:
            raise ParameterError("--recompute", "needs at least one of on/off")
        if not isinstance(self.top, int) or self.top < 1:
            raise ParameterError("--top", f"must be an integer >= 1, got {self.top!r}")
        if self.trim_edges not in ("auto", True, False):
            raise ParameterError("trim_edges", f"must be 'auto', True or False, got {self.trim_edges!r}")


def families(p: int, layers: int, options: PlanOptions = PlanOptions()) -> list[Family]:
    """Schedule families worth trying with ``p`` pipeline ranks (p·v ≤ layers; multi-chunk
    families need p ≥ 2)."""
    from ..schedules import SCHEDULES

    out: list[Family] = []
    if p == 1:  # no pipeline: every one-chunk schedule is the same F, BW sequence
        first = next((n for n in options.schedules if n == "1f1b"), None)
        return [Family(first)] if first else []
    for name in options.schedules:
        info = SCHEDULES[name]
        if name == "zb-auto":
            out += [Family(name, 1, limit=1), Family(name, 1, limit=2)]
        elif info.placement == "v":
            if p >= 2 and 2 * p <= layers:
                out.append(Family(name, 2))
        elif info.default_v == 1:
            out.append(Family(name, 1))
        elif p >= 2:
            for v in sorted(set(options.chunks)):
                if p * v > layers:
                    continue
                if name == "group-interleaved":
                    out.append(Family(name, v, group="half"))
                    if p > (p + 1) // 2:
                        out.append(Family(name, v, group="full"))
                else:
                    out.append(Family(name, v))
    return out


def enumerate_splits(model: ModelSpec, gpus: int, global_batch: int) -> tuple[list[tuple[Split, int]], list["Rejection"]]:
    """Every ``(split, m)`` worth simulating, and the splits rejected before any simulation."""
    ok: list[tuple[Split, int]] = []
    bad: list[Rejection] = []
    b = model.microbatch
    for tp in TP_CHOICES:
        if gpus % tp or min(gpus, NODE_GPUS) % tp:
            continue
        rest = gpus // tp
        for pp in range(1, rest + 1):
            if rest % pp:
                continue
            sp = Split(tp, pp, rest // pp)
            why = None
            if model.heads % tp or model.ffn % tp or model.kv_groups % tp:  # type: ignore[operator]
                why = (f"TP={tp} does not divide the {model.heads} heads, {model.kv_groups} KV groups "
                       f"and FFN {model.ffn}")
            elif pp > model.layers:
                why = f"PP={pp} exceeds the model's {model.layers} layers"
            elif global_batch % (sp.dp * b):
                why = f"global batch {global_batch} is not divisible by DP·microbatch = {sp.dp}·{b}"
            if why:
                bad.append(Rejection(str(sp), "split", why, config=str(sp)))
                continue
            ok.append((sp, global_batch // (sp.dp * b)))
    return ok, bad


# ---------------------------------------------------------------------------------------------
# Per-GPU costs under TP


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


def shard_costs(pc: PipelineCosts, tp: int, node: NodeProfile, recompute_ms_per_layer: float = 0.0) -> ShardedCosts:
    """Divide ``pc`` by ``tp`` (sequence-parallel TP: compute, bytes, states, boundary and offload all
    /tp) and add the TP collectives to F and B and ``recompute_ms_per_layer`` (whole layer, before
    /tp) to B. With ``tp == 1`` and no recompute time the costs are ``pc``'s."""
    model, hw = pc.model, pc.hardware
    coll = 0.0
    if tp > 1:
        nbytes = model.tokens * model.hidden * model.dtype_bytes
        coll = (2 * (tp - 1) / tp * nbytes / node.tp_bw + node.collective_latency) * 1e3
    triples, deltas = [], []
    for g in pc.groups:
        nf = 2 * g.layers + int(g.has_embedding) + int(g.has_head)
        nb = 2 * g.layers + int(g.has_head)
        triples.append((g.F_ms / tp + nf * coll, g.B_ms / tp + nb * coll + g.layers * recompute_ms_per_layer / tp,
                        g.W_ms / tp))
        f, b, w = g.deltas
        deltas.append((f / tp, b / tp, w / tp))
    comm = (model.boundary_bytes() / tp / hw.link_bw + hw.link_latency) * 1e3
    costs = Costs(F=sum(t[0] for t in triples) / pc.p, B=sum(t[1] for t in triples) / pc.p,
                  W=sum(t[2] for t in triples) / pc.p, comm=comm, group_costs=tuple(triples))
    df = sum(d[0] for d in deltas) / pc.p
    db = sum(d[1] for d in deltas) / pc.p
    memory = MemoryDeltas(F=df, B=db, W=-(df + db), group_deltas=tuple(deltas))
    return ShardedCosts(
        pc=pc, tp=tp, costs=costs, memory=memory,
        transfer_ms=tuple(g.offload_ms / tp for g in pc.groups),
        state=tuple((g.param_bytes / tp, g.grad_bytes / tp, g.optimizer_bytes / tp) for g in pc.groups),
        layers=tuple(g.layers for g in pc.groups),
        flops=float(sum(g.block.flops for g in pc.groups)),
        tp_ms_per_collective=coll, recompute_ms_per_layer=recompute_ms_per_layer,
    )


# ---------------------------------------------------------------------------------------------
# Results


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
    recompute: bool
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

    @property
    def iteration_ms(self) -> float:
        return self.makespan_ms + self.dp_exposed_ms

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
        off = f", offload C={self.offload_chunks}" if self.offload_chunks else ""
        rc = ", recompute" if self.recompute else ""
        return f"{self.name} {self.split} m={self.m}{rc}{off}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family.label, "schedule": self.family.schedule, "v": self.family.v, "g": self.g,
            "tp": self.split.tp, "pp": self.split.pp, "dp": self.split.dp, "microbatches": self.m,
            "recompute": self.recompute, "offload_chunks": self.offload_chunks,
            "memory": self.memory.to_dict(), "fits": self.fits,
            "iteration_s": self.iteration_ms / 1e3, "pipeline_s": self.makespan_ms / 1e3,
            "dp_exposed_s": self.dp_exposed_ms / 1e3, "bubble_rate": self.bubble_rate, "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s, "simulated_microbatches": self.simulated_m,
            "extrapolated": self.extrapolated, "dropped_offloads": self.dropped_offloads, "notes": list(self.notes),
        }


@dataclass
class Rejection:
    """Why a family (or a split) produced no configuration. ``kind``: "split", "oom", "m",
    "generator", "offload" or "pruned"; ``over``: bytes above the budget for "oom"."""

    family: str
    kind: str
    reason: str
    over: float | None = None
    config: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "kind": self.kind, "reason": self.reason,
                "over_gib": None if self.over is None else self.over / GiB, "config": self.config}


class NoConfigurationFits(ParameterError):
    """No configuration fits the memory budget; the message lists why each family failed."""

    def __init__(self, result: "PlanResult") -> None:
        self.result = result
        reasons = [f"{r.family}: {r.reason}" for r in result.rejected + result.rejected_splits]
        super().__init__(
            "--memory-budget",
            f"no configuration of {result.model.name} on {result.gpus} × {result.hardware.name} fits "
            f"{result.budget / GiB:.3g} GiB per device ({len(reasons)} reasons: " + "; ".join(reasons[:40])
            + ("; …" if len(reasons) > 40 else "") + ")",
        )


@dataclass
class PlanResult:
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
    _evaluator: Any = field(default=None, repr=False)

    @property
    def best(self) -> Config:
        if not self.configs:
            raise NoConfigurationFits(self)
        return self.configs[0]

    def timeline(self, config: Config) -> Timeline:
        """The simulated timeline behind ``config`` (at its simulated m; with the offload transfers
        when it offloads), memory in bytes per GPU."""
        return self._evaluator.timeline_of(config)

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
            "assumptions": {
                "tp": "Megatron TP with sequence parallelism: FLOPs, activations, states /TP; "
                      "2 collectives per layer in F and in B, not overlapped",
                "tp_link_gbs": self.node.tp_bw / 1e9, "hbm_gbs": self.node.hbm_bw / 1e9,
                "peak_tflops": self.node.peak_rate / 1e12, "node_constants": self.node.source,
                "dp": "fp32 gradient ring all-reduce per layer bucket, overlapped with the last backward",
                "state_bytes_per_param": "2 weights + 4 fp32 grads + 12 Adam/master (16-bit training), no ZeRO",
                "offload": "offload pass, skip mode, postponed warm-up, 2 GPUs per host link",
            },
        }

    def table(self) -> str:
        return format_table(self)


# ---------------------------------------------------------------------------------------------
# Evaluation


class _Refused(Exception):
    """A candidate that could not be evaluated (``kind`` as in :class:`Rejection`)."""

    def __init__(self, kind: str, reason: str, over: float | None = None, config: str | None = None) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.over, self.config = kind, reason, over, config


@dataclass
class _Sim:
    """A family simulated at one or two m, extrapolated to the configuration's m."""

    schedule: Schedule  #: at m_off (the smaller simulated m): offload and drawing use it
    timeline: Timeline
    sh: ShardedCosts
    placement: Placement
    makespan: float  #: ms at the real m
    busy: list[float]  #: per rank, ms at the real m
    act: list[float]  #: per-rank activation peak, bytes at the real m
    dp_exposed: float
    simulated_m: int
    extrapolated: bool


def _sim_points(m: int, p: int, name: str, g: int | None) -> tuple[int, int | None]:
    """``(m1, m2)``: simulate m1 (and m2 = m1 + period, extrapolating linearly) or just m."""
    factor, period = _STEADY.get(name, _DEFAULT_STEADY)
    per = p if period == "p" else (g or 1) if period == "g" else int(period)
    lo = factor * p
    if m <= lo + per:
        return m, None
    m1 = lo + (m - lo) % per
    return m1, m1 + per


class _Evaluator:
    def __init__(self, model: ModelSpec, hw: Hardware, node: NodeProfile, budget: float,
                 global_batch: int, gpus: int, opts: PlanOptions) -> None:
        self.model, self.hw, self.node, self.budget = model, hw, node, budget
        self.global_batch, self.gpus, self.opts = global_batch, gpus, opts
        self._pc: dict = {}
        self._sh: dict = {}
        self._sched: dict = {}
        self._sims: dict = {}
        self._offloads: dict = {}
        self.stats = {"simulations": 0, "offload_plans": 0, "generator_calls": 0}

    # -- costs ----------------------------------------------------------------------------
    def model_for(self, rc: bool) -> ModelSpec:
        return self.model.replace(recompute_elementwise=rc)

    def recompute_ms(self, rc: bool) -> float:
        if not rc:
            return 0.0
        dropped = self.model_for(False).layer().saved_bytes - self.model_for(True).layer().saved_bytes
        return 2.0 * max(dropped, 0) / self.node.hbm_bw * 1e3

    def split_for(self, p: int, v: int) -> tuple[int, ...]:
        n, L = p * v, self.model.layers
        plain = layer_split(L, n)
        if self.opts.trim_edges is False or n < 3:
            return plain
        try:
            trimmed = layer_split(L, n, trim_edges=True)
        except ParameterError:
            return plain
        if self.opts.trim_edges is True:
            return trimmed
        # "auto": the split whose heaviest layer group (F+B+W) is lighter.
        costs = [max(g.F_ms + g.B_ms + g.W_ms for g in pipeline_costs(self.model, self.hw, p, v, split=s).groups)
                 for s in (plain, trimmed)]
        return trimmed if costs[1] < costs[0] else plain

    def sharded(self, rc: bool, p: int, v: int, tp: int) -> ShardedCosts:
        key = (rc, p, v, tp)
        if key not in self._sh:
            pkey = (rc, p, v)
            if pkey not in self._pc:
                self._pc[pkey] = pipeline_costs(self.model_for(rc), self.hw, p, v, split=self.split_for(p, v))
            self._sh[key] = shard_costs(self._pc[pkey], tp, self.node, self.recompute_ms(rc))
        return self._sh[key]

    # -- schedules -------------------------------------------------------------------------
    def schedule(self, fam: Family, p: int, m: int, sh: ShardedCosts, placement: Placement) -> Schedule:
        from ..schedules import ScheduleSpec, build

        g = fam.g(p)
        fixed = fam.schedule in FIXED_ORDER
        key = (fam.schedule, p, m, fam.v, g, fam.limit) + (() if fixed else (id(sh),))
        hit = self._sched.get(key)
        if hit is not None:
            if isinstance(hit, _Refused):
                raise hit
            return hit
        kw: dict[str, Any] = {"v": fam.v, "g": g}
        if not fixed:
            kw.update(costs=sh.costs, memory=sh.memory)
        if fam.schedule in ("zb-auto", "zb-v"):
            from ..schedules.zb_auto import default_limit

            b_plus = max(0.0, max(d[1] for d in sh.memory.group_deltas))  # type: ignore[union-attr]
            kw["mem_limit"] = (fam.limit or 1) * default_limit(placement, sh.memory) + b_plus
        self.stats["generator_calls"] += 1
        try:
            sched = build(ScheduleSpec(fam.schedule, p, m, **kw), check=False)
        except ParameterError as e:
            err = _Refused("m" if e.param == "-m" and "needs m" in str(e) else "generator", str(e))
        except Exception as e:  # noqa: BLE001 - a generator is a plug-in: its failure rejects the candidate
            err = _Refused("generator", f"{type(e).__name__}: {e}")
        else:
            if fixed:
                self._sched[key] = sched
            return sched
        self._sched[key] = err
        raise err

    # -- simulation -------------------------------------------------------------------------
    def placement(self, fam: Family, p: int) -> Placement:
        from ..schedules import SCHEDULES

        return Placement.vshape(p) if SCHEDULES[fam.schedule].placement == "v" else Placement.loop(p, fam.v)

    def simulate(self, split: Split, fam: Family, m: int, rc: bool) -> _Sim:
        key = (split, fam, m, rc)
        hit = self._sims.get(key)
        if hit is not None:
            if isinstance(hit, _Refused):
                raise hit
            return hit
        try:
            res = self._simulate(split, fam, m, rc)
        except _Refused as e:
            self._sims[key] = e
            raise
        self._sims[key] = res
        return res

    def _simulate(self, split: Split, fam: Family, m: int, rc: bool) -> _Sim:
        from ..errors import ScheduleError
        from ..passes.timing import simulate

        p = split.pp
        sh = self.sharded(rc, p, fam.v, split.tp)
        pl = self.placement(fam, p)
        m1, m2 = _sim_points(m, p, fam.schedule, fam.g(p))
        runs = []
        for mm in (m1, m2):
            if mm is None:
                continue
            sched = self.schedule(fam, p, mm, sh, pl)
            self.stats["simulations"] += 1
            try:
                tl = simulate(sched, sh.costs, sh.memory, memory_unit="bytes")
            except ScheduleError as e:
                raise _Refused("generator", f"schedule deadlocks: {e}") from None
            runs.append((mm, sched, tl))
        (ma, sa, ta), (mb, _, tb) = runs[0], runs[-1]
        peaks = tb.peak_memory()
        if len(runs) == 2:
            peaks = [max(x, y) for x, y in zip(peaks, ta.peak_memory())]
            slope = (tb.makespan - ta.makespan) / (mb - ma)
            makespan = tb.makespan + (m - mb) * slope
        else:
            makespan = tb.makespan
        busy = [b * m / mb for b in tb.busy()]
        makespan = max(makespan, max(busy))
        if fam.schedule == "gpipe" and mb != m:  # all forwards first: peak grows with m
            peaks = [x * m / mb for x in peaks]
        exposed = self.dp_exposed(tb, sh, split, pl)
        return _Sim(sa, ta, sh, pl, makespan, busy, peaks, exposed, mb, len(runs) == 2 or mb != m)

    def dp_exposed(self, tl: Timeline, sh: ShardedCosts, split: Split, pl: Placement) -> float:
        """ms of the DP gradient all-reduce that runs past the pipeline's end (worst rank)."""
        d = split.dp
        if d == 1:
            return 0.0
        bw = self.node.tp_bw if split.tp * d <= NODE_GPUS else self.hw.link_bw
        last: dict[int, tuple[float, float]] = {}
        for e in tl.events:
            if e.stream == "compute" and e.op.kind.value in ("W", "BW"):
                s = e.op.stage
                if s not in last or e.end > last[s][1]:
                    last[s] = (e.start, e.end)
        end = tl.end
        worst = 0.0
        for r in range(pl.num_ranks):
            buckets = []
            for s in pl.stages_of(r):
                L = sh.layers[s]
                nbytes = sh.state[s][1] / L
                t_ar = 2 * (d - 1) / d * nbytes / bw * 1e3 + self.node.collective_latency * 1e3
                st, en = last.get(s, (end, end))
                buckets += [(st + (k + 1) / L * (en - st), t_ar) for k in range(L)]
            t = -math.inf
            for ready, dur in sorted(buckets):
                t = max(t, ready) + dur
            worst = max(worst, t - end)
        return max(0.0, worst)

    # -- configurations ----------------------------------------------------------------------
    def state_per_rank(self, split: Split, fam: Family, rc: bool) -> list[tuple[float, float]]:
        """Per rank: (parameter bytes, gradient + optimizer bytes), per GPU."""
        sh = self.sharded(rc, split.pp, fam.v, split.tp)
        pl = self.placement(fam, split.pp)
        state = [[0.0, 0.0] for _ in range(split.pp)]
        for s, (pb, gb, ob) in enumerate(sh.state):
            r = pl.rank_of(s)
            state[r][0] += pb
            state[r][1] += gb + ob
        return [(a, b) for a, b in state]

    def time_bound(self, split: Split, fam: Family, m: int, rc: bool) -> float:
        """A lower bound of the iteration time (ms): the busiest rank's compute for m microbatches."""
        sh = self.sharded(rc, split.pp, fam.v, split.tp)
        pl = self.placement(fam, split.pp)
        busy = [0.0] * split.pp
        for s, t in enumerate(sh.costs.group_costs):  # type: ignore[arg-type]
            busy[pl.rank_of(s)] += sum(t)
        return m * max(busy)

    def check_state(self, split: Split, fam: Family, m: int) -> None:
        """Memory lower bound before simulating: the states of the fullest rank plus one
        microbatch of its largest layer group's activation (under the least-memory recompute
        setting) must fit; else an "oom" refusal."""
        rc = True in self.opts.recompute
        sh = self.sharded(rc, split.pp, fam.v, split.tp)
        pl = self.placement(fam, split.pp)
        worst, who = 0.0, 0
        for r, (a, b) in enumerate(self.state_per_rank(split, fam, rc)):
            one = max(max(sh.memory.group_deltas[s][0], sh.memory.group_deltas[s][0] + sh.memory.group_deltas[s][1])
                      for s in pl.stages_of(r))  # type: ignore[index]
            if a + b + one > worst:
                worst, who = a + b + one, r
        if worst > self.budget:
            a, b = self.state_per_rank(split, fam, rc)[who]
            raise _Refused("oom", f"parameters {a / GiB:.1f} + gradients/optimizer {b / GiB:.1f} GiB on rank {who} "
                           f"plus one microbatch's activation exceed the budget (lower bound, not simulated)",
                           over=worst - self.budget, config=f"{fam.label} {split} m={m}")

    def config(self, split: Split, fam: Family, m: int, rc: bool, sim: _Sim, C: int = 0,
               act: list[float] | None = None, host: list[float] | None = None, extra_ms: float = 0.0,
               dropped: int = 0, notes: Sequence[str] = ()) -> Config:
        sh = sim.sh
        act = act if act is not None else sim.act
        host = host if host is not None else [0.0] * split.pp
        state = self.state_per_rank(split, fam, rc)
        totals = [state[r][0] + state[r][1] + act[r] for r in range(split.pp)]
        r = max(range(split.pp), key=lambda i: totals[i])
        mem = MemoryBreakdown(state[r][0], state[r][1], act[r], host[r], max(host), r)
        makespan = sim.makespan + extra_ms
        it_ms = makespan + sim.dp_exposed
        flops = sh.flops * m * split.dp
        mfu = flops / (it_ms / 1e3 * self.gpus * self.node.peak_rate) if it_ms > 0 else 0.0
        tokens = self.global_batch * self.model.seq / (it_ms / 1e3) if it_ms > 0 else 0.0
        bubble = 1.0 - max(sim.busy) / makespan if makespan > 0 else 0.0
        return Config(fam, split, m, fam.g(split.pp), rc, C, mem, self.budget, makespan, sim.dp_exposed,
                      bubble, mfu, tokens, sim.simulated_m, sim.extrapolated, dropped, list(notes))

    def with_offload(self, split: Split, fam: Family, m: int, rc: bool, C: int) -> tuple[Config, Any]:
        from ..passes.offload import plan_offload

        sim = self.simulate(split, fam, m, rc)
        self.stats["offload_plans"] += 1
        try:
            res = plan_offload(sim.schedule, sim.timeline, offload_chunks=C, transfer_times=sim.sh.transfer_ms,
                               link_group=self.opts.link_group, solo_factor=self.opts.solo_factor,
                               on_infeasible="skip", postpone_warmup=True, comm=sim.sh.comm)
        except PipeoffloadError as e:
            raise _Refused("offload", f"offload pass refused C={C}: {e}") from None
        # Peaks at the simulated m, plus whatever the plain peak grew by at the real m (conservative).
        act = [a + max(0.0, b - c) for a, b, c in zip(res.peak, sim.act, res.peak_no_offload)]
        dropped = res.skipped.get("link_busy", 0)
        notes = [f"{dropped} offloads dropped (host link busy)"] if dropped else []
        cfg = self.config(split, fam, m, rc, sim, C, act, list(res.host_memory),
                          res.makespan - res.makespan_no_offload, dropped, notes)
        if cfg.fits:  # kept for drawing; the others are dropped to bound memory use
            self._offloads[(split, fam, m, rc, C)] = res
        return cfg, res

    def timeline_of(self, cfg: Config) -> Timeline:
        sim = self.simulate(cfg.split, cfg.family, cfg.m, cfg.recompute)
        if cfg.offload_chunks:
            key = (cfg.split, cfg.family, cfg.m, cfg.recompute, cfg.offload_chunks)
            res = self._offloads.get(key)
            if res is None:
                _, res = self.with_offload(*key)
            tl = res.timeline
        else:
            tl = sim.timeline
        tl.meta["plan"] = cfg.to_dict()
        return tl


# ---------------------------------------------------------------------------------------------
# The search


@dataclass
class _Cand:
    split: Split
    family: Family
    m: int
    attempts: list[Config] = field(default_factory=list)
    refusals: list[_Refused] = field(default_factory=list)
    fit: Config | None = None
    pruned: str | None = None
    bound: float = 0.0


def _resolve_model(model: Any, seq: int | None, microbatch: int | None, po_runtime: bool) -> ModelSpec:
    over: dict[str, Any] = {}
    for name, flag, x in (("seq", "--seq", seq), ("microbatch", "--microbatch-size", microbatch)):
        if x is not None:
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise ParameterError(flag, f"must be a positive integer, got {x!r}")
            over[name] = x
    if po_runtime:
        over.update({k: v for k, v in PO_RUNTIME.items() if k != "recompute_elementwise"})
    return get_model(model, **over)



def _record(cand, cfg, fits: list[float]) -> bool:
    """Keep ``cfg`` as an attempt of ``cand``; if it fits the budget, make it the
    candidate's configuration and add its time to the sorted ``fits``. True if it fits."""
    cand.attempts.append(cfg)
    if not cfg.fits:
        return False
    cand.fit = cfg
    fits.append(cfg.iteration_ms)
    fits.sort()
    return True

def plan(
    model: str | ModelSpec,
    hardware: str | Hardware,
    gpus: int,
    *,
    memory_budget: float | None = None,
    global_batch: int | None = None,
    microbatch: int | None = None,
    seq: int | None = None,
    options: PlanOptions | None = None,
) -> PlanResult:
    """Search the configurations of ``model`` on ``gpus`` × ``hardware`` (see the module docstring)."""
    t_start = time.perf_counter()
    opts = options or PlanOptions()
    opts.check()
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ParameterError("--gpus", f"must be a positive integer, got {gpus!r}")
    spec = _resolve_model(model, seq, microbatch, opts.po_runtime)
    hw = get_hardware(hardware)
    node = node_profile(hw, opts.peak_rate, opts.tp_bw, opts.hbm_bw)
    budget = hw.hbm_bytes if memory_budget is None else memory_budget
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
        raise ParameterError("--memory-budget", f"must be a positive number, got {memory_budget!r}")
    gb = global_batch if global_batch is not None else 4 * gpus * spec.microbatch
    if not isinstance(gb, int) or isinstance(gb, bool) or gb < 1:
        raise ParameterError("--global-batch", f"must be a positive integer, got {global_batch!r}")
    if gb % spec.microbatch:
        raise ParameterError("--global-batch", f"{gb} sequences are not a whole number of microbatches of {spec.microbatch}")

    ev = _Evaluator(spec, hw, node, budget, gb, gpus, opts)
    splits, rejected_splits = enumerate_splits(spec, gpus, gb)
    total_state = spec.params() * sum(_state_per_param(spec))
    cands: list[_Cand] = []
    fam_labels: list[str] = []
    for sp, m in splits:
        avg = total_state / (sp.tp * sp.pp)
        if avg > budget:
            rejected_splits.append(Rejection(
                str(sp), "split", f"parameters, gradients and optimizer states alone average {avg / GiB:.1f} GiB "
                f"per device (over the {budget / GiB:.3g} GiB budget by {(avg - budget) / GiB:.1f} GiB)",
                over=avg - budget, config=str(sp)))
            continue
        for fam in families(sp.pp, spec.layers, opts):
            cands.append(_Cand(sp, fam, m))
            if fam.label not in fam_labels:
                fam_labels.append(fam.label)

    # Phase 1: plain and recompute-only simulations (cheap); accept the first that fits. Candidates
    # go by a lower bound of their iteration time (the busiest rank's compute, no bubble), so once
    # `top` configurations fit, a candidate whose bound is no better is not simulated at all.
    rc_order = [rc for rc in (False, True) if rc in opts.recompute]
    for c in cands:
        c.bound = ev.time_bound(c.split, c.family, c.m, rc_order[0])
    cands_by_bound = sorted(cands, key=lambda c: c.bound)
    fits: list[float] = []
    for c in cands_by_bound:
        if len(fits) >= opts.top and c.bound >= fits[opts.top - 1]:
            c.pruned = (f"not simulated: even with no bubble an iteration takes ≥ {c.bound / 1e3:.3g} s, "
                        f"slower than the {opts.top} configurations shown")
            continue
        try:
            ev.check_state(c.split, c.family, c.m)
        except _Refused as e:
            c.refusals.append(e)
            continue
        for rc in rc_order:
            try:
                sim = ev.simulate(c.split, c.family, c.m, rc)
            except _Refused as e:
                c.refusals.append(_Refused(e.kind, e.reason, e.over, f"{c.family.label} {c.split} m={c.m}"))
                if e.kind == "m" or c.family.schedule in FIXED_ORDER:
                    break
                continue
            if _record(c, ev.config(c.split, c.family, c.m, rc, sim), fits):
                break

    # Phase 2: offload, fastest candidates first; prune those that cannot enter the top K.
    need = [c for c in cands if c.fit is None and c.attempts]
    need.sort(key=lambda c: min(a.iteration_ms for a in c.attempts))
    off_rc = [rc for rc in (True, False) if rc in opts.recompute]
    for c in need:
        if not opts.offload:
            break
        if c.family.schedule == "gpipe":
            c.refusals.append(_Refused("offload", "not offloaded: GPipe keeps every microbatch (peak grows with m)"))
            continue
        lb = min(a.iteration_ms for a in c.attempts)
        if len(fits) >= opts.top and lb >= fits[opts.top - 1]:
            c.pruned = (f"offload not evaluated: even without its cost the iteration takes ≥ {lb / 1e3:.3g} s, "
                        f"slower than the {opts.top} configurations shown")
            continue
        for rc in off_rc:
            if c.fit:
                break
            for C in range(1, c.family.v + 1):
                try:
                    cfg, _ = ev.with_offload(c.split, c.family, c.m, rc, C)
                except _Refused as e:
                    c.refusals.append(_Refused(e.kind, e.reason, e.over, f"{c.family.label} {c.split} m={c.m}"))
                    break
                if _record(c, cfg, fits):
                    break

    configs = sorted((c.fit for c in cands if c.fit), key=lambda x: (x.iteration_ms, x.memory.device))
    rejected = _family_rejections(cands, fam_labels, budget)
    stats = dict(ev.stats)
    stats.update(
        splits=len(splits), splits_rejected=len(rejected_splits), candidates=len(cands),
        families=fam_labels, fitting=len(configs), seconds=round(time.perf_counter() - t_start, 3),
        microbatch_rule="each schedule is simulated at m, or at two m past its warm-up (same m modulo "
                        "its period) with the iteration time extrapolated linearly",
    )
    return PlanResult(spec, hw, node, gpus, budget, gb, opts, configs[: opts.top], rejected, rejected_splits,
                      stats, ev)


def _state_per_param(model: ModelSpec) -> tuple[int, int, int]:
    from ..costmodel.model import state_bytes_per_param

    return state_bytes_per_param(model.dtype)


def _family_rejections(cands: list[_Cand], labels: list[str], budget: float) -> list[Rejection]:
    """One line per family that produced no fitting configuration: the closest OOM, else the
    generator's or the m rule's refusal, else the pruning."""
    out = []
    for label in labels:
        mine = [c for c in cands if c.family.label == label]
        if any(c.fit for c in mine):
            continue
        tried = [a for c in mine for a in c.attempts]
        refusals = [r for c in mine for r in c.refusals]
        pruned = [c for c in mine if c.pruned]
        extra = []
        if pruned:
            extra.append(f"{len(pruned)} split(s) pruned: {pruned[0].pruned}")
        bound = [r for r in refusals if r.kind == "oom"]
        if bound and (not tried or min(r.over for r in bound) < min(a.over for a in tried)):  # type: ignore[type-var]
            r = min(bound, key=lambda r: r.over)  # type: ignore[arg-type,return-value]
            out.append(Rejection(label, "oom", "; ".join([f"OOM by ≥ {r.over / GiB:.2f} GiB at best ({r.config}: "
                                                          f"{r.reason})"] + extra), over=r.over, config=r.config))
        elif tried:
            best = min(tried, key=lambda a: a.over)
            reason = f"OOM by {best.over / GiB:.2f} GiB at best ({best.describe()}: " \
                     f"{best.memory.device / GiB:.1f} GiB of which activations {best.memory.activations / GiB:.1f})"
            if best.dropped_offloads:
                reason += (f"; offload infeasible in part: {best.dropped_offloads} reloads could not finish before "
                           "their backward (host link too slow), those activations stayed on the device")
            kinds = sorted({r.kind for r in refusals if r.kind not in ("offload", "oom")})
            if kinds:
                extra.append("other splits: " + ", ".join(kinds))
            out.append(Rejection(label, "oom", "; ".join([reason] + extra), over=best.over,
                                 config=best.describe()))
        elif refusals:
            r = refusals[0]
            what = {"m": "m too small", "generator": "generator refused", "offload": "offload infeasible"}[r.kind]
            out.append(Rejection(label, r.kind, "; ".join([f"{what}: {r.reason}"] + extra), config=r.config))
        else:
            out.append(Rejection(label, "pruned", "; ".join(extra) or "not evaluated"))
    return out


# ---------------------------------------------------------------------------------------------
# Text


def format_table(res: PlanResult) -> str:
    m = res.model
    lines = [
        f"plan: {m.name} ({m.params() / 1e9:.1f}B params, seq {m.seq}, microbatch {m.microbatch}) on "
        f"{res.gpus} × {res.hardware.name}; budget {res.budget / GiB:.3g} GiB per device; "
        f"global batch {res.global_batch} sequences",
        f"searched {res.stats['candidates']} (split, schedule) candidates over {res.stats['splits']} splits: "
        f"{res.stats['simulations']} simulations, {res.stats['offload_plans']} offload plans, "
        f"{res.stats['seconds']:.1f} s",
    ]
    if res.configs:
        hdr = (f"{'#':>2} {'schedule':<30} {'TP':>2} {'PP':>3} {'DP':>3} {'m':>5} {'rc':>3} {'off':>3} "
               f"{'params':>7} {'grad+opt':>8} {'act':>6} {'device':>7} {'host':>6} {'iter s':>8} "
               f"{'MFU':>6} {'bubble':>6}")
        lines += ["", "configurations that fit (GiB per device; host = pinned host memory of offloaded activations):",
                  hdr, "-" * len(hdr)]
        for i, c in enumerate(res.configs, 1):
            name = c.name
            mem = c.memory
            lines.append(
                f"{i:>2} {name:<30} {c.split.tp:>2} {c.split.pp:>3} {c.split.dp:>3} {c.m:>5} "
                f"{'on' if c.recompute else 'off':>3} {c.offload_chunks or '-':>3} {mem.params / GiB:>7.1f} "
                f"{mem.grads_optimizer / GiB:>8.1f} {mem.activations / GiB:>6.1f} {mem.device / GiB:>7.1f} "
                f"{mem.host_max / GiB:>6.1f} {c.iteration_ms / 1e3:>8.3f} {c.mfu:>6.1%} {c.bubble_rate:>6.1%}"
            )
        b = res.configs[0]
        lines.append("")
        lines.append(f"best: {b.describe()}: {b.iteration_ms / 1e3:.3f} s per iteration "
                     f"({b.tokens_per_s:,.0f} tokens/s), MFU {b.mfu:.1%}, bubble {b.bubble_rate:.1%}, "
                     f"device peak {b.memory.device / GiB:.1f} GiB on rank {b.memory.rank}"
                     + (f"; DP all-reduce exposed {b.dp_exposed_ms:.1f} ms" if b.dp_exposed_ms else "")
                     + (f"; simulated at m={b.simulated_m}, extrapolated" if b.extrapolated else "")
                     + (f"; {'; '.join(b.notes)}" if b.notes else ""))
    else:
        lines += ["", f"no configuration fits {res.budget / GiB:.3g} GiB per device"]
    if res.rejected or res.rejected_splits:
        lines += ["", "rejected:"]
        for r in res.rejected:
            lines.append(f"  {r.family}: {r.reason}")
        state = [r for r in res.rejected_splits if r.over is not None]
        for r in res.rejected_splits:
            if r.over is None:
                lines.append(f"  {r.family}: {r.reason}")
        if state:
            lines.append("  splits whose parameters, gradients and optimizer states alone exceed the budget "
                         "(average per device): " + ", ".join(
                             f"{r.family} ({(r.over + res.budget) / GiB:.1f} GiB)" for r in state))  # type: ignore[operator]
    return "\n".join(lines)
