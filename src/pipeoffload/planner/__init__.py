"""The planner: the best pipeline configuration for a model, hardware and memory budget.

Searches schedule × v × g × offloaded chunks × recompute × PP/TP/DP splits, simulates
each candidate with the cost model's costs, and ranks those that fit. Pure Python (no
torch). See ``docs/planner.md``.
"""

from .plan import (
    DEFAULT_SCHEDULES,
    Config,
    Family,
    MemoryBreakdown,
    NodeProfile,
    NoConfigurationFits,
    PlanOptions,
    PlanResult,
    Rejection,
    ShardedCosts,
    Split,
    enumerate_splits,
    families,
    format_table,
    node_profile,
    plan,
    shard_costs,
)

__all__ = [
    "DEFAULT_SCHEDULES", "Config", "Family", "MemoryBreakdown", "NodeProfile", "NoConfigurationFits",
    "PlanOptions", "PlanResult", "Rejection", "ShardedCosts", "Split", "enumerate_splits", "families",
    "format_table", "node_profile", "plan", "shard_costs",
]
