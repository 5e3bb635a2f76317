"""Classic schedules: GPipe, 1F1B, interleaved 1F1B (Megatron), group-interleaved 1F1B."""

from __future__ import annotations

from array import array
from itertools import compress

from ..errors import ParameterError
from ..ir import ALL_KINDS, CompactOrders, OpKind, Placement, Schedule, build_schedule, compact_schedule
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

    Rank i's ops, by slot (the reference's sort; tests/test_group_interleaved_slots.py keeps it): the block's
    ``u``-th forward (``u = rep·gv + c·g + jj``: repeat, chunk, microbatch in the group) at
    slot ``3u + i``, its backward and weight gradient at ``3(u + Δ) + i + 1`` and ``+ 2``
    with ``Δ = g(v−1) + p − 1 − i``: every slot is distinct, so the order is forward ``x``,
    then backward and W ``x − Δ``, for x = 0, 1, …, each where its microbatch is below m.
    :func:`_gis_rank` writes those three streams into the compact arrays by slices.

    Cost: O(p·v·m), a few C-level passes over each rank's ops (no sort, no op tuples, no empty slot).
    """
    p, m = spec.p, spec.m
    v = spec.resolve_v(2)
    gmin = (p + 1) // 2
    g = spec.g if spec.g is not None else gmin
    if not gmin <= g <= p:
        raise ParameterError("g", f"group size must satisfy ceil(p/2) <= g <= p, i.e. {gmin}..{p} for p={p}; got {g}")
    pl = Placement.loop(p, v)
    # Per block index u (= rep·gv + c·g + jj, every repeat): the microbatch (-1 past m) and
    # the chunks' first layer groups of its forward and of its backward (rank 0's).
    n = -(-m // g) * g * v
    mb_of = [-1 if j >= m else j for j in (u // (g * v) * g + u % g for u in range(n))]
    f_stage = [(u % (g * v)) // g * p for u in range(n)]
    b_stage = [(v - 1) * p - s for s in f_stage]
    kinds, stages, mbs = [], [], []
    # The block positions past m (microbatch −1): in the last repeat, from its first chunk's
    # microbatch m mod g on, when g does not divide m.
    first_gap = n - g * v + m % g if m % g else None
    for i in range(p):
        k, s, j = _gis_rank(i, g * (v - 1) + p - 1 - i, mb_of, f_stage, b_stage, first_gap)
        kinds.append(k)
        stages.append(s)
        mbs.append(j)
    return compact_schedule("group-interleaved", m, pl, CompactOrders(kinds, stages, mbs), p=p, m=m, v=v, g=g)


_F_CODE, _B_CODE, _W_CODE = (ALL_KINDS.index(k) for k in (F, B, W))


def _gis_rank(i: int, delta: int, mb_of: list[int], f_stage: list[int], b_stage: list[int],
              first_gap: int | None) -> tuple[array, array, array]:
    """Rank ``i``'s compact arrays (kind codes, layer groups, microbatches) of
    :func:`group_interleaved`: in slot order (position ``3x`` forward ``x``, ``3x + 1`` and
    ``3x + 2`` backward and W ``x − delta``), the slots without an op left out. Written by
    slices: forwards ``0..a−1`` alone (``a = min(delta, n)``), then forward ``x`` with backward
    and W ``x − delta`` for ``x = delta..n−1``, then the last ``a`` backwards and W's. The block
    positions past m (microbatch −1) are ``first_gap`` and some after it (None: none); they are
    dropped from the first op they can touch on (forward ``first_gap``; backwards come later)."""
    n = len(mb_of)
    a = min(delta, n)
    mid = n - a
    tail = a + 3 * mid  # where the last backwards begin
    kd = array("b", (_F_CODE,)) * a + array("b", (_F_CODE, _B_CODE, _W_CODE)) * mid + \
        array("b", (_B_CODE, _W_CODE)) * a
    room = array("l", (0,)) * (3 * mid + 2 * a)
    mb = array("l", mb_of[:a]) + room
    st = array("l", map(i.__add__, f_stage[:a])) + room
    fw, bw = array("l", mb_of[a:]), array("l", mb_of[:mid])
    mb[a:tail:3], mb[a + 1:tail:3], mb[a + 2:tail:3] = fw, bw, bw
    mb[tail::2] = mb[tail + 1::2] = array("l", mb_of[mid:])
    fs, bs = array("l", map(i.__add__, f_stage[a:])), array("l", map(i.__add__, b_stage[:mid]))
    st[a:tail:3], st[a + 1:tail:3], st[a + 2:tail:3] = fs, bs, bs
    st[tail::2] = st[tail + 1::2] = array("l", map(i.__add__, b_stage[mid:]))
    if first_gap is None:
        return kd, st, mb
    cut = first_gap if first_gap < a else a + 3 * (first_gap - a)
    after = mb[cut:].tolist()  # (compress runs fastest on lists)
    keep = list(map((-1).__ne__, after))
    kd[cut:] = array("b", list(compress(kd[cut:].tolist(), keep)))
    st[cut:] = array("l", list(compress(st[cut:].tolist(), keep)))
    mb[cut:] = array("l", list(compress(after, keep)))
    return kd, st, mb
