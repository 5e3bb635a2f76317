"""Classic schedules: GPipe, 1F1B, interleaved 1F1B (Megatron), group-interleaved 1F1B."""

from __future__ import annotations

from math import gcd

from ..errors import ParameterError
from ..ir import OpKind, Placement, Schedule, build_schedule
from .spec import ScheduleSpec

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW


def gpipe(spec: ScheduleSpec) -> Schedule:
    """All forwards (chunk by chunk), then all fused backwards in reverse. Peak m units.

    Cost: O(p·v·m), one step per op."""
    spec.no_group()
    p, m = spec.p, spec.m
    v = spec.resolve_v(1)
    pl = Placement.loop(p, v)
    per_rank = []
    for i in range(p):
        fw = [(F, c * p + i, j) for c in range(v) for j in range(m)]
        bw = [(BW, c * p + i, j) for c in reversed(range(v)) for j in range(m)]
        per_rank.append(fw + bw)
    return build_schedule("gpipe", m, pl, per_rank, p=p, m=m, v=v)


def one_f_one_b(spec: ScheduleSpec) -> Schedule:
    """1F1B: rank i warms up with p−i−1 forwards, then alternates F and BW.

    Cost: O(p·m), one step per op."""
    spec.no_group()
    spec.resolve_v(1, allowed=(1,))
    p, m = spec.p, spec.m
    pl = Placement.loop(p, 1)
    per_rank = []
    for i in range(p):
        warm = min(p - i - 1, m)
        ops = [(F, i, j) for j in range(warm)]
        nf, nb = warm, 0
        while nb < m:
            if nf < m:
                ops.append((F, i, nf))
                nf += 1
            ops.append((BW, i, nb))
            nb += 1
        per_rank.append(ops)
    return build_schedule("1f1b", m, pl, per_rank, p=p, m=m, v=1)


def microbatch_groups(p: int, m: int) -> list[range]:
    """Split m >= p microbatches into ⌊m/p⌋ consecutive groups of sizes as equal as
    possible (each >= p). Megatron's fixed groups of p with a partial last group
    deadlock for some m (e.g. p=9, m=37, v=3); these never do (checked over
    p ≤ 12, v ≤ 4, m ≤ 5p+1 in the tests) and keep the bubble (p−1)/(vm+p−1)."""
    rounds = max(1, m // p)
    base, extra = divmod(m, rounds)
    out, start = [], 0
    for k in range(rounds):
        size = base + (1 if k < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def _megatron_order(p: int, m: int, v: int, i: int, backward: bool) -> list[tuple[int, int]]:
    """(stage, microbatch) order of rank i: each microbatch group goes through every
    chunk (reversed for backward) before the next group starts."""
    order = []
    for grp in microbatch_groups(p, m):
        chunks = reversed(range(v)) if backward else range(v)
        for c in chunks:
            order.extend((c * p + i, j) for j in grp)
    return order


def interleaved_1f1b(spec: ScheduleSpec) -> Schedule:
    """Megatron interleaved 1F1B (loop placement, v chunks), any m >= p.

    Microbatches advance through the chunks in groups (:func:`microbatch_groups`);
    rank i warms up with 2(p−i−1) + (v−1)·G forwards (G the first group's size),
    then alternates F and BW. Bubble (p−1)(T_F+T_B+T_W)/v; peak (v+1)p−1 chunk
    units when p divides m (a little more when groups are larger than p).

    Cost: O(p·v·m), one step per op.
    """
    spec.no_group()
    p, m = spec.p, spec.m
    v = spec.resolve_v(2)
    spec.need_m_at_least(p, "forwards advance through the chunks in groups of at least p microbatches")
    pl = Placement.loop(p, v)
    g0 = len(microbatch_groups(p, m)[0])
    per_rank = []
    for i in range(p):
        fo = _megatron_order(p, m, v, i, backward=False)
        bo = _megatron_order(p, m, v, i, backward=True)
        total = len(fo)
        warm = min(2 * (p - i - 1) + (v - 1) * g0, total)
        ops = [(F, s, j) for s, j in fo[:warm]]
        nf, nb = warm, 0
        while nb < total:
            if nf < total:
                ops.append((F, *fo[nf]))
                nf += 1
            ops.append((BW, *bo[nb]))
            nb += 1
        per_rank.append(ops)
    return build_schedule("interleaved-1f1b", m, pl, per_rank, p=p, m=m, v=v)


def group_interleaved(spec: ScheduleSpec) -> Schedule:
    """Group-interleaved 1F1B (PipeOffload's GIS), B/W split, group size g.

    Built from the reference code's cyclic block of 3gv unit slots per rank
    (docs/algorithms.md#24-group-interleaved-1f1b), repeated ⌈m/g⌉ times, microbatches past m dropped; the
    timing pass then squeezes it. Unit-cost peak: g·v + p − g chunk units.

    Cost: O(p·v·m), one step per op.
    """
    p, m = spec.p, spec.m
    v = spec.resolve_v(2)
    gmin = (p + 1) // 2
    g = spec.g if spec.g is not None else gmin
    if not gmin <= g <= p:
        raise ParameterError("g", f"group size must satisfy ceil(p/2) <= g <= p, i.e. {gmin}..{p} for p={p}; got {g}")
    pl = Placement.loop(p, v)
    k = -(-gmin // g)  # ⌈g_min/g⌉ (= 1 over the valid range)
    period = 3 * g * v
    shift_every = v // gcd(v, k)
    per_rank = []
    for i in range(p):
        first_b = 3 * k * g * (v - 1) + 3 * g * ((v - 1) // shift_every) + i + 3 * (p - 1 - i) + 1
        slots: list[tuple[int, int, OpKind, int, int]] = []
        for rep in range(-(-m // g)):
            base = rep * period
            for c in range(v):
                off = 3 * k * g * c + 3 * g * (c // shift_every)
                for jj in range(g):
                    j = rep * g + jj
                    if j >= m:
                        continue
                    f_slot = base + off + 3 * jj + i
                    b_slot = base + first_b + off + 3 * jj
                    slots.append((f_slot, 0, F, c * p + i, j))
                    bs = (v - 1 - c) * p + i
                    slots.append((b_slot, 1, B, bs, j))
                    slots.append((b_slot + 1, 2, W, bs, j))
        slots.sort()
        per_rank.append([(kind, s, j) for _, _, kind, s, j in slots])
    return build_schedule("group-interleaved", m, pl, per_rank, p=p, m=m, v=v, g=g)
