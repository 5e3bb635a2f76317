"""Loop orders with a window per rank: the orders the offload search picks from. Pure Python.

A *rank window* order (loop placement, one layer group per rank, split backward) gives each
rank ``r`` its own warm-up ``warmup[r]`` (forwards before its first B) and W deferral
``defer[r]`` (its k-th B is followed by the W of microbatch k − defer[r]); in the steady
state the rank alternates F, B, W, and the deferred W's end the rank's list
(:func:`pipeoffload.schedules.zero_bubble._handcrafted`, the family of 1F1B, ZB-H1 and
ZB-H2). With unit memory a rank then holds at most ``warmup[r] + 1 + defer[r]`` forwards.

Why per rank: below 1F1B's memory the exact scheduler (docs/solver.md) runs rank 0 as 1F1B
with one forward in flight more than the limit, that one on the host, while the later
ranks run zero-bubble orders within the limit. No generator takes a per-rank limit, so
this family spans those orders; :func:`pipeoffload.passes.offload_search.best_limited_plan`
searches it with the offload pass's limit mode.

:func:`seeds` are the structured starting points, :func:`neighbours` the one-step
changes a local search tries. Every pair they return is *deadlock-free*: ``warmup`` does
not increase with the rank (rank r+1's B(k) needs F(k + warmup[r+1]) of rank r, which rank
r runs before its own B(k)).
"""

from __future__ import annotations

from ..errors import ParameterError
from ..ir import Placement, Schedule, build_schedule
from .zero_bubble import _handcrafted

Windows = tuple[tuple[int, ...], tuple[int, ...]]  #: (warmup per rank, defer per rank)


def window_order(p: int, m: int, warmup: tuple[int, ...], defer: tuple[int, ...]) -> Schedule:
    """The rank window order (module docstring) as a schedule named ``rank-windows``.

    Args:
        p: ranks (= layer groups, loop placement); m: microbatches.
        warmup: per rank, the forwards before its first B (0 ≤ · < m, not increasing).
        defer: per rank, how many microbatches its W's trail its B's (0 ≤ · ≤ m).

    Returns:
        The schedule; its params record ``warmup`` and ``defer``.

    Raises:
        ParameterError: naming ``warmup`` or ``defer`` when a vector has the wrong length,
            a value out of range, or ``warmup`` increases (the order could deadlock).

    Guarantees:
        Deadlock-free; every F, B and W of every (layer group, microbatch) exactly once,
        microbatches in order per (kind, layer group).
    """
    for name, vec, most in (("warmup", warmup, m - 1), ("defer", defer, m)):
        if len(vec) != p or any(not 0 <= x <= most for x in vec):
            raise ParameterError(name, f"must be {p} integers in 0..{most}, got {list(vec)}")
    if any(warmup[r] < warmup[r + 1] for r in range(p - 1)):
        raise ParameterError("warmup", f"must not increase with the rank (deadlock), got {list(warmup)}")
    order = _handcrafted(p, m, list(warmup), list(defer))
    return build_schedule("rank-windows", m, Placement.loop(p, 1), order, p=p, m=m, v=1,
                          warmup=list(warmup), defer=list(defer))


def seeds(p: int, m: int, in_flight: int) -> list[Windows]:
    """Structured starting points for a limit of ``in_flight`` forwards per rank.

    For every cap ``a`` of the warm-up (0..p−1) and shift ``s`` (0 or 1): rank r warms up
    ``min(p−1−r−s, a)`` forwards (at least 0), and defers its W's so that it holds up to
    ``in_flight + e`` forwards (``e`` = 0 or 1; the deferral only fills what the warm-up
    leaves). Rank 0 with the most warm-up runs as 1F1B above the limit (what the offload
    copies then bring back within it), later ranks as ZB-H1-like orders within it.

    Returns:
        Distinct (warmup, defer) pairs, deadlock-free, in a fixed order.
    """
    out: dict[Windows, None] = {}
    for e in (0, 1):
        for s in (0, 1):
            for a in range(p - 1, -1, -1):
                warm = tuple(min(max(p - 1 - r - s, 0), a, m - 1) for r in range(p))
                defer = tuple(min(max(in_flight + e - 1 - w, 0), m) for w in warm)
                out[(warm, defer)] = None
    return list(out)


def neighbours(windows: Windows, m: int) -> list[Windows]:
    """Every pair one step from ``windows``: one rank's warm-up or deferral ±1, kept
    within range and deadlock-free (warm-up not increasing)."""
    warm, defer = windows
    p = len(warm)
    out = []
    for r in range(p):
        for d in (-1, 1):
            w = warm[r] + d
            if 0 <= w <= m - 1 and (r == 0 or w <= warm[r - 1]) and (r == p - 1 or w >= warm[r + 1]):
                out.append((warm[:r] + (w,) + warm[r + 1:], defer))
            x = defer[r] + d
            if 0 <= x <= m:
                out.append((warm, defer[:r] + (x,) + defer[r + 1:]))
    return out
