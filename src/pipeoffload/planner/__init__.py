"""The planner: the best pipeline configuration for a model, hardware and memory budget.

Searches schedule × v × g × offloaded chunks × recompute × PP/TP/DP splits, simulates
each candidate with the cost model's costs, and ranks those that fit. Pure Python (no
torch). See ``docs/planner.md``.

API
---
``plan(model, hardware, gpus, *, memory_budget=None, global_batch=None, microbatch=None, seq=None,
options=None, workers=None) -> PlanResult`` (:mod:`.search`; ``workers``: processes, the same result
for every value, :mod:`.workers`); ``PlanOptions`` (:mod:`.space`): search-space and
model knobs; ``PlanResult`` (:mod:`.result`): ``configs`` (ranked :class:`Config`), ``rejected``
(per family :class:`Rejection`), ``rejected_splits``, ``best`` (raises :class:`NoConfigurationFits`
when empty), ``to_dict()``, ``table()``, ``timeline(config)``; ``node_profile(hardware)``
(:mod:`.sharding`): the constants the cost model lacks (TP link, HBM bandwidth, peak FLOP/s).

Modules, one job each
---------------------
``space``: splits, schedule families, options, the problem. ``sharding``: per-GPU costs under TP
and their value-keyed cache. ``bounds``: time and memory lower bounds that skip simulations.
``simulate``: generating and timing candidates through the pass pipeline, microbatch
extrapolation, offload. ``dp``: the overlapped data-parallel all-reduce. ``step``: the step after
the pipeline (optimizer step, tied-embedding gradient all-reduce). ``config``: assembling a
configuration's memory breakdown, time (makespan + exposed DP + that step), MFU and bubble. ``search``: ``plan()``. ``result``:
``PlanResult``. ``report``: rejection reasons and the text table. ``workers``: helper processes
that time candidates ahead and make the shown configurations' offload plans alongside the search.

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

from .config import Config, MemoryBreakdown
from .refusals import Rejection
from .report import format_table
from .result import NoConfigurationFits, PlanResult
from .search import plan
from .sharding import NodeProfile, ShardedCosts, node_profile, shard_costs, tp_slowdown
from .space import DEFAULT_SCHEDULES, Family, PlanOptions, Split, enumerate_splits, families

__all__ = [
    "DEFAULT_SCHEDULES", "Config", "Family", "MemoryBreakdown", "NodeProfile", "NoConfigurationFits",
    "PlanOptions", "PlanResult", "Rejection", "ShardedCosts", "Split", "enumerate_splits", "families",
    "format_table", "node_profile", "plan", "shard_costs", "tp_slowdown",
]
