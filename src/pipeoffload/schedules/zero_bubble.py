"""Zero-bubble schedules (ZB paper, docs/algorithms.md#25-zero-bubble-zb-h1-and-zb-h2): ZB-H1, ZB-H2, the
memory-limited automatic scheduler (ZB-1p / ZB-2p) and ZB-V. All split the
backward into B (input gradient) and W (weight gradient). Pure Python.

Bubble figures in the docstrings are *iteration* bubbles, the ZB paper's metric:
``1 − busiest rank's compute / longest rank span`` where a rank's span runs from its
first op's start to its last op's end (what one iteration costs when iterations
follow each other with the optimizer step unsynchronised, docs/algorithms.md#32-iteration-time-and-the-optimizer-step). The searching
generators (zb-auto, zb-v) minimise the longest span, then the makespan.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import ParameterError
from ..ir import OpKind, Placement, Schedule, build_schedule
from .spec import ScheduleSpec
from .zb_auto import _EPS, Infeasible, Tracker, auto_candidates, default_limit, lower_bounds, replay
from .zb_v import v_candidates

F, B, W = OpKind.F, OpKind.B, OpKind.W
Order = list[list[tuple[OpKind, int, int]]]


def _handcrafted(p: int, m: int, warmup: Sequence[int], defer: Sequence[int]) -> Order:
    """Rank r: ``warmup[r]`` forwards, then per microbatch k: F (while any remain),
    B(k), and W(k − defer[r]) once k ≥ defer[r]; the deferred W's at the end.

    Deadlock-free whenever ``warmup`` does not increase with r: rank r+1's B(k)
    needs F(k + warmup[r+1]) from rank r, which rank r runs before its own B(k).
    ``defer = 0`` everywhere is 1F1B with the backward split into B then W.
    """
    per_rank = []
    for r in range(p):
        a, d = warmup[r], defer[r]
        ops = [(F, r, j) for j in range(a)]
        nf, nw = a, 0
        for k in range(m):
            if nf < m:
                ops.append((F, r, nf))
                nf += 1
            ops.append((B, r, k))
            if k >= d:
                ops.append((W, r, nw))
                nw += 1
        ops.extend((W, r, j) for j in range(nw, m))
        per_rank.append(ops)
    return per_rank


def _h1_shape(p: int, m: int) -> tuple[list[int], list[int]]:
    """ZB-H1's (warm-up, defer) per rank for :func:`_handcrafted`."""
    return [min(p - r - 1, m) for r in range(p)], list(range(p))


def _h2_shape(p: int, m: int) -> tuple[list[int], list[int]]:
    """ZB-H2's (warm-up, defer) per rank for :func:`_handcrafted`."""
    return [min(2 * (p - r - 1), m) for r in range(p)], [2 * r for r in range(p)]


def _h1_order(p: int, m: int) -> Order:
    return _handcrafted(p, m, *_h1_shape(p, m))


def _h2_order(p: int, m: int) -> Order:
    return _handcrafted(p, m, *_h2_shape(p, m))


def _over(m: int, warmup: Sequence[int], defer: Sequence[int], mem: Sequence[tuple[float, float, float]],
          cap: float) -> bool:
    """Whether replaying ``_handcrafted(p, m, warmup, defer)`` (loop placement, per layer
    group (F, B, W) deltas ``mem``) with a tracker of cap ``cap`` (limit + tol) is refused
    for memory: some op with a positive delta takes its rank above ``cap``. A rank's level
    is the running sum of its deltas in its own order whatever the times, so this reads
    the orders alone, rank by rank, and stops at the first such op (a window too wide for
    the limit shows on rank 0 within its warm-up); the replay's test, the same floats.
    (True also means refused when the order would deadlock first.) Cost: O(p·m) at most."""
    for r, (a, d) in enumerate(zip(warmup, defer)):
        f, b, w = mem[r]
        level, nf, nw = 0.0, a, 0
        for _ in range(a):
            if f > 0 and not level + f <= cap:
                return True
            level += f
        for k in range(m):
            steps = ((f, b, w) if k >= d else (f, b)) if nf < m else ((b, w) if k >= d else (b,))
            nf += nf < m
            nw += k >= d
            for x in steps:
                if x > 0 and not level + x <= cap:
                    return True
                level += x
        for _ in range(m - nw):
            if w > 0 and not level + w <= cap:
                return True
            level += w
    return False


def _loop_v1(spec: ScheduleSpec) -> None:
    spec.no_group()
    spec.resolve_v(1, allowed=(1,))


def zb_h1(spec: ScheduleSpec) -> Schedule:
    """ZB-H1: 1F1B's warm-up (p−r−1 forwards on rank r), rank r's W's delayed by r.

    Guarantees: peak p units with the default deltas (1F1B's). With ``comm = 0``
    and m ≥ p the iteration bubble is (p−1)(T_F+T_B−T_W) whenever T_W ≤ T_F, and
    (p−1)·T_B otherwise (rank 0 waits (p−1)·T_B for its first B with nothing to do).

    Cost: O(p·m), one step per op.
    """
    _loop_v1(spec)
    p, m = spec.p, spec.m
    return build_schedule("zb-h1", m, Placement.loop(p, 1), _h1_order(p, m), p=p, m=m, v=1)


def zb_h2(spec: ScheduleSpec) -> Schedule:
    """ZB-H2: 2(p−r−1) warm-up forwards on rank r (capped by m), its W's delayed by 2r.

    Guarantees: peak ≤ 2p−1 units with the default deltas (exactly 2p−1 once
    m ≥ 2p−1). With ``comm = 0`` and m ≥ 2p−1 the iteration bubble is
    (p−1)·max(0, T_F+T_B−2T_W, T_B−T_F): the paper's (p−1)(T_F+T_B−2T_W) floored
    at 0, for T_B ≤ T_F. Worth its memory only with the unsynchronised optimizer
    step (docs/algorithms.md#32-iteration-time-and-the-optimizer-step).

    Cost: O(p·m), one step per op.
    """
    _loop_v1(spec)
    p, m = spec.p, spec.m
    return build_schedule("zb-h2", m, Placement.loop(p, 1), _h2_order(p, m), p=p, m=m, v=1)


def _best(cands: list[Tracker]) -> Tracker:
    return min(cands, key=lambda t: (t.max_span(), t.makespan()))


def _replays(make: Callable[[], Tracker], orders: list[Order]) -> list[Tracker]:
    """Time fixed orders with the tracker; drop those that break the memory limit."""
    out = []
    for order in orders:
        try:
            out.append(replay(make(), order))
        except Infeasible:
            continue
    return out


def _unbeatable(best: Tracker, pl: Placement, m: int) -> bool:
    """Whether no order of ``m`` microbatches on ``pl`` can beat ``best`` by :func:`_best`'s
    key (longest span, then makespan): both are at :func:`lower_bounds`. Candidates ahead of
    ``best`` win ties."""
    span, makespan = lower_bounds(best, pl, m)
    return best.max_span() <= span and best.makespan() <= makespan


def _check_limit(limit: float, placement: Placement, spec: ScheduleSpec) -> None:
    need = max(d[OpKind.F] for d in spec.memory.delta_table(placement))
    if not limit >= need:
        raise ParameterError(
            "mem_limit",
            f"must hold at least one forward's activation ({need:g} in the units of `memory`), got {limit:g}",
        )


def zb_auto(spec: ScheduleSpec) -> Schedule:
    """Automatic zero bubble under ``spec.mem_limit`` (default p forwards: "ZB-1p").

    Runs the ZB heuristic's variants and, as safety nets, ZB-H1, ZB-H2 and 1F1B
    (B/W split, its warm-up narrowed until it fits), keeping the candidate with
    the shortest longest-rank span among those within the limit.

    Guarantees: every rank's peak ≤ the limit (in the units of ``spec.memory``);
    any m ≥ 1; the longest rank span is no longer than ZB-H1's or 1F1B's with the
    same costs whenever those fit the limit (at p·F they do when B frees ≥ 0);
    at 2p·F it reaches ZB-2p's near-zero bubble (docs/algorithms.md#82-unit-cost-grid-for-four-stages).

    Cost: 8 greedy variants (those whose runs cannot differ share one run, and a run
    stops once its longest span is sure to end above the best candidate's so far,
    :func:`.zb_auto.auto_candidates`), ZB-H1, ZB-H2 and up to p narrowed 1F1B replays, each
    O(p·m) ops timed incrementally as they are placed: O(p·m) per candidate, O(p²·m) in
    the worst case (every 1F1B window tried).
    """
    _loop_v1(spec)
    p, m = spec.p, spec.m
    pl = Placement.loop(p, 1)
    limit = float(spec.mem_limit) if spec.mem_limit is not None else default_limit(pl, spec.memory)
    _check_limit(limit, pl, spec)

    def fresh() -> Tracker:
        return Tracker(pl, m, spec.costs, spec.memory, limit)

    # An order the levels alone show over the limit is refused without being built (_over)
    cap = limit + _EPS * max(1.0, abs(limit))  # the tracker's limit + tol: the same floats
    mem = [(d[F], d[B], d[W]) for d in spec.memory.delta_table(pl)]
    fixed = _replays(fresh, [_handcrafted(p, m, a, d) for a, d in (_h1_shape(p, m), _h2_shape(p, m))
                             if not _over(m, a, d, mem, cap)])
    for window in range(p, 0, -1):  # 1F1B with at most `window` forwards in flight
        warmup = [min(p - r - 1, window - 1, m) for r in range(p)]
        got = [] if _over(m, warmup, [0] * p, mem, cap) else _replays(fresh, [_handcrafted(p, m, warmup, [0] * p)])
        if got:
            fixed += got
            break
    # The fixed orders are timed first: the greedy runs stop once they cannot beat the best of
    # them (auto_candidates' bound); the list keeps its order (greedy variants first: ties go to them).
    bound = min((t.max_span() for t in fixed), default=math.inf)  # inf: from the first greedy run on
    cands = auto_candidates(p, m, spec.costs, spec.memory, limit, bound) + fixed
    if not cands:
        raise ParameterError("mem_limit", f"no schedule keeps every rank within {limit:g}")
    best = _best(cands)
    return build_schedule("zb-auto", m, pl, best.order, p=p, m=m, v=1, mem_limit=limit)


def _zbv_handcrafted(p: int, m: int) -> Order:
    """The fixed ZB-V order for T_F = T_B = T_W (as in PyTorch's ScheduleZBVZeroBubble),
    written for max(m, 2p−1) microbatches and cut back to m."""
    n = max(2 * p - 1, m)
    out = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        f0 = f1 = b0 = b1 = 0
        ops: list[tuple[OpKind, int, int]] = []
        for _ in range(2 * (p - r) - 1):
            ops.append((F, s0, f0))
            f0 += 1
        for _ in range(r):
            ops += [(F, s1, f1), (F, s0, f0)]
            f1 += 1
            f0 += 1
        for _ in range(p - r):
            ops += [(F, s1, f1), (B, s1, b1), (W, s1, b1)]
            f1 += 1
            b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                ops.append((F, s0, f0))
                f0 += 1
            ops += [(B, s0, b0), (W, s0, b0), (F, s1, f1), (B, s1, b1), (W, s1, b1)]
            b0 += 1
            f1 += 1
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):
            ops += [(B, s0, b0), (B, s1, b1)]
            b0 += 1
            b1 += 1
        for _ in range(p - r):
            ops += [(B, s0, b0), (W, s0, w0)]
            b0 += 1
            w0 += 1
        ops += [(W, s1, j) for j in range(w1, b1)] + [(W, s0, j) for j in range(w0, b0)]
        out.append([o for o in ops if o[2] < m])
    return out


def _controllable_orders(spec: ScheduleSpec, limit: float) -> list[Order]:
    """The orders of V-Half and V-Min (:mod:`.vshape`, lowered for ``spec.costs``) whose
    published peak may fit ``limit``: below 1F1B's memory the ZB-V greedy, built for a
    limit of p, leaves +17 to +29 points of bubble over the optimum (docs/solver.md),
    while these blocks are built for exactly that memory."""
    from .vshape import unit_peak_bound, v_half, v_min

    p, m, memory = spec.p, spec.m, spec.memory
    # Their bounds are exact under unit accounting from m = p on; otherwise just try them
    # (the replay drops an order that breaks the limit).
    exact = m >= p and memory.B == 0 and memory.group_deltas is None
    out = []
    for name, gen in (("v-half", v_half), ("v-min", v_min)):
        if not exact or unit_peak_bound(name, p) * memory.F <= limit * (1 + 1e-9):
            s = gen(ScheduleSpec(name, p, m, costs=spec.costs, memory=memory))
            out.append([[(o.kind, o.stage, o.microbatch) for o in ops] for ops in s.ranks])
    return out


def zb_v(spec: ScheduleSpec) -> Schedule:
    """ZB-V: V placement (rank i holds layer groups i and 2p−1−i), two chunks per rank,
    memory limit 1F1B's (p whole-stage forwards; ``spec.mem_limit`` overrides).

    Runs the ZB-V greedy's variants and the fixed equal-cost order and, below 1F1B's
    memory, V-Half's and V-Min's orders when their peak may fit; keeps the candidate
    with the shortest longest-rank span. Guarantees: every rank's peak ≤ the limit;
    any m ≥ 1; bubble 0 when T_F = T_B = T_W and comm = 0 (m ≥ 2p); below p units,
    never worse than V-Half or V-Min when their peak fits the limit.

    Cost: up to 28 greedy runs (4 variants × ≤ 7 re-runs; variants whose runs cannot
    differ share them, :func:`.zb_v.v_candidates`) of O(p·m) ops, each op
    timed incrementally and its round costing O(p) for the idle allowance (O(p²·m) per
    run at worst), the fixed order and, below p units, V-Half's and V-Min's lowerings
    (skipped when the greedy's best is at :func:`lower_bounds`: they could only tie);
    in practice 1 run and no fixed order at p = 64, m = 512 with equal costs (a run that
    never acted on its idle allowance stands for its re-run). With exact float times
    (unit costs included) a run writes its periodic steady state at once
    (:class:`.zb_v._PeriodSkip`): O(p³) for the warm-up and cool-down rounds (O(p²) ops,
    O(p) each) plus O(p·m) to write the rest; otherwise O(p²·m).
    """
    spec.no_group()
    spec.resolve_v(2, allowed=(2,))
    p, m = spec.p, spec.m
    pl = Placement.vshape(p)
    limit = float(spec.mem_limit) if spec.mem_limit is not None else default_limit(pl, spec.memory)
    _check_limit(limit, pl, spec)
    cands = v_candidates(p, m, spec.costs, spec.memory, limit)
    if not (cands and _unbeatable(_best(cands), pl, m)):  # else the fixed orders could only tie, and lose it
        fresh = lambda: Tracker(pl, m, spec.costs, spec.memory, limit)  # noqa: E731
        cands += _replays(fresh, [_zbv_handcrafted(p, m)])
        if limit < default_limit(pl, spec.memory) * (1 - 1e-9):
            cands += _replays(fresh, _controllable_orders(spec, limit))
    if not cands:
        raise ParameterError("mem_limit", f"no ZB-V schedule keeps every rank within {limit:g}")
    best = _best(cands)
    return build_schedule("zb-v", m, pl, best.order, p=p, m=m, v=2, mem_limit=limit)
