"""The slot reorder on fewer microbatches (docs/algorithms.md#92-v-min-and-v-half-in-periods).

:func:`reorder_orders` on ``m`` microbatches from its run on ``m' < m``: the
five passes run on the ``m'``-grid, each with a check that proves its result for ``m``
is its result for ``m'`` with ``Δ = m − m'`` periods inserted, and the final orders are
the ``m'`` ones with the period repeated ``Δ`` more times. Where a check fails the
caller runs the full path; the orders are the same either way.

The insertion. A slot list ``L`` (one per rank and op type: the slot of each
microbatch, increasing; ``c`` entries per period: 2 for the W list of both chunks, else
1) with ``Δ`` periods inserted at index ``a`` is ``L[:a]``, then ``L[a−c:a]`` ``i·T``
slots later for ``i = 1..Δ``, then ``L[a:]`` ``Δ·T`` later (``ins(L, a)``). When
``L[i] = L[i−c] + T`` on ``[s+c, e)`` (a *stretch*), ``ins(L, a)`` is the same list for
every ``a`` in ``[s+c, e]``. A *band* ``[lo, hi)`` of a grid, from its lists' stretches
(``lo`` the latest first slot of a stretch, ``hi`` one past the earliest last), is a
window where every list is the same one period on; inserting at slot ``τ`` (index
``bisect_left(L, τ)`` in each list) for any ``τ`` in ``[lo+T, hi]`` is then inserting
inside every stretch: one grid for ``m``. Each pass's check takes its input's band and
yields the cut (``a`` per list) at which its output for ``m`` is its output for ``m'``
with the periods inserted:

- *W placement* (:func:`.v_reorder._with_weights`, a scan per rank whose state is the
  W's waiting and the last event's slot): when the state on reaching ``τ`` and
  ``τ + T`` is the same (one period on), the inserted periods are scanned from the same
  state, emit the same W's a period on each, and leave the same state: the W lists are
  cut at one past the last event before ``τ + T``, the others at ``τ + T``.
- *Reorder* (:func:`.v_reorder._reorder`): it moves only warm-up ops (before ``t1``)
  and cool-down ops; the grids for ``m`` and ``m'`` are the same below ``hi`` and one
  ``Δ·T`` later than the other from ``lo + T`` on. When ``t1 ≤ lo``, every rank's last
  forward (the cool-down's start is the first of them after ``t1``) is at or after
  ``lo + T``, and every cool-down visit reads (inputs, free slots,
  the level before a tried slot) only slots from ``lo + T`` on, both runs make the same
  moves, ``Δ·T`` apart; the level a forward's fit counts from the rank's start moves by
  the period's net change (0 with W's listed), and without W's listed (their levels a
  scan) the check asks for the same level and pending W's on reaching ``lo`` and
  ``lo + T``, which also keeps the cap (the highest peak) the same. Cut at ``lo + T``.
- *Squeeze* (:func:`.v_reorder._squeeze`: each op at the latest of its rank's clock and
  its inputs + 1, in slot order): when every op from ``hi − T`` on reads (its inputs,
  its rank's previous op) only ops from ``lo + T`` on, and the squeezed slot of every op
  in ``[lo + T, hi)`` is its copy's a period back plus ``T``, the inserted ops (copies of
  those in ``[hi − T, hi)``) and by induction every later op get their copy's slot plus
  ``T``: cut at ``hi``.
- The final lowering sorts each rank's slots: its order for ``m`` is the one for ``m'``
  with the ops of one period repeated (:func:`_lower_stretched`).

The checks read only the reduced run, so a run that proves on ``m''`` microbatches
gives the orders for every larger count: :func:`reorder_periodic` runs the passes on
``m'' < m'`` (:func:`shortest_count`) first and inserts ``m' − m''`` periods to hand on
orders on ``m'``, the count the steady timing and the W refill prove their periods on.

Cost: the five passes on ``m''`` microbatches (O(p²) for the V blocks), the checks
(O(p) bisections and one C scan per list), and O(p·m) tuples written in C.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import chain, compress, count, repeat
from operator import ne, sub

from ..ir import OpKind, Placement
from ..passes.steady_timing import PeriodicOrders, insert_periods
from ..native import c_engine
from .building_block import BuildingBlock, OpTable
from .v_reorder import (_B0, _B1, _F0, _F1, Times, _RankLevels, _reorder, _repeated, _squeeze,
                        _with_weights, full_orders)

Cuts = list[list[int]]  #: per rank, per list: the index where the periods go in


def reorder_orders(block: BuildingBlock, m: int, ops: OpTable | None = None) -> list[list[tuple[OpKind, int, int]]]:
    """Per-rank ``(kind, layer group, microbatch)`` orders of ``block`` repeated ``m``
    times, by the three passes of :mod:`.v_reorder`'s docstring (holding ``ops``' tuples when
    given: :func:`.building_block.op_table`).

    Guarantees: every op of every (layer group, microbatch) once; each order respects
    the dependencies (it is a squeezed slot grid's order); the highest per-rank peak in
    chunk units (F +1, W −1) is at most the repeated block's.

    When ``m ≥ 2m'`` (``m'`` = :func:`reduced_count`, O(p) for the V
    blocks) the passes run on ``m'`` microbatches — first on fewer still
    (:func:`shortest_count`, its periods then inserted up to ``m'``: :func:`rebased`) —
    and the orders for ``m`` are theirs with the missing periods inserted, where each
    pass's check proves that equal (this module): O(p²) Python steps and O(p·m) tuples
    written in C;
    otherwise, or when a check fails, on all ``m`` (same orders).

    Cost on all ``m``: O(p·m log m) for the sorts, O(p·m) Python steps for the W placements and the
    final lowering; the two squeezes step through the warm-up and the cool-down (O(p²)
    ops for the V blocks) and write the periods they prove by slices (:class:`_SqueezeSkip`),
    the cool-down's levels likewise (:class:`_RankLevels`); plus per moved op (O(p²) of
    them) its window: the free slots between its inputs and its slot (O(m) at worst), and
    for the cool-down's implicit-W check the events from its new slot until the rank's
    levels meet the old ones (O(m) at worst, a few in practice)."""
    return reorder_periodic(block, m, ops).expand(ops)


def reorder_periodic(block: BuildingBlock, m: int, ops: OpTable | None = None) -> PeriodicOrders:
    """:func:`reorder_orders` as the reduced run's orders and where the missing periods go
    in (:class:`~pipeoffload.passes.steady_timing.PeriodicOrders`; nothing inserted when
    the full path ran). Cost: :func:`reorder_orders`' without the O(p·m) tuples written."""
    small = reduced_count(block, m)
    if 2 * small <= m:  # (closer to m the reduced run and its checks cost about the full one)
        # First on fewer still (the passes' own proofs hold from about 1.6·span/T on), then
        # the periods up to m' inserted: the orders on m' the timings and refills prove on.
        fewer = shortest_count(block, small)
        orders = reduced_periodic(block, fewer, m, ops) if fewer < small else None
        if orders is not None:
            return rebased(orders, m - small, ops)
        orders = reduced_periodic(block, small, m, ops)
        if orders is not None:
            return orders
    return PeriodicOrders.plain(full_orders(block, m, ops))


def shortest_count(block: BuildingBlock, small: int) -> int:
    """The microbatches of the first, shorter reduced run: ``⌈1.7·span/T⌉ + 8``, at most
    ``small`` (:func:`reduced_count`). The five passes' checks prove their period from
    about ``1.6·span/T + 4..6`` on (measured for the three V blocks at p = 4..64), but the
    steady timing and the W refill, which run on the orders this gives, need ``m'``; so
    the run on this count is taken to ``m'`` by :func:`rebased`."""
    span = max(block.slots.values()) - min(block.slots.values())
    return min(small, -(-17 * span // (10 * block.period)) + 8)


def rebased(orders: PeriodicOrders, extra: int, ops: OpTable | None = None) -> PeriodicOrders:
    """``orders`` with ``orders.extra − extra`` of its periods inserted now, ``extra`` left to
    insert: the same expansion (inserting ``d`` periods at ``at``, then the rest at
    ``at + d·per`` — after the ``d``-th copy — is inserting them all at ``at``), held on
    ``extra`` fewer microbatches than the orders for ``m``. O(p·d·per) in C."""
    d = orders.extra - extra
    if d <= 0:
        return orders
    rows = [insert_periods(row, a, per, d, ops) for row, a, per in zip(orders.orders, orders.at, orders.per)]
    return PeriodicOrders(rows, [a + d * per for a, per in zip(orders.at, orders.per)], list(orders.per), extra)


def reduced_count(block: BuildingBlock, m: int) -> int:
    """The microbatches of the reduced run.

    Args:
        block: the V building block (its span and period ``T``).
        m: the microbatches asked for.

    Returns:
        ``m' = ⌈2·span/T⌉ + 12``, at most ``m``: enough periods for the warm-up (about the
        block's span), a steady stretch every pass proves, and the cool-down's reach (the
        fewest that prove, measured for the three V blocks at p = 4..64: ``1.6·span/T + 4``
        to ``+ 6``)."""
    span = max(block.slots.values()) - min(block.slots.values())
    return min(m, -(-2 * span // block.period) + 12)


def reduced_orders(block: BuildingBlock, small: int, m: int,
                   ops: OpTable | None = None) -> list[list[tuple[OpKind, int, int]]] | None:
    """:func:`reduced_periodic`'s orders for ``m`` (None where it is None)."""
    orders = reduced_periodic(block, small, m, ops)
    return None if orders is None else orders.expand(ops)


def reduced_periodic(block: BuildingBlock, small: int, m: int, ops: OpTable | None = None) -> PeriodicOrders | None:
    """:func:`reorder_orders` for ``m`` from its passes on fewer microbatches.

    Args:
        block: the V building block.
        small: the microbatches of the reduced run (:func:`reduced_count`), below ``m``.
        m: the microbatches asked for.
        ops: :func:`.building_block.op_table` for ``m`` (its tuples are used), or None.

    Returns:
        The per-rank ``(kind, layer group, microbatch)`` orders on ``small`` microbatches
        and where the ``m − small`` periods go in, or None when a pass's check fails
        (module docstring); the caller then runs the full path.

    Raises:
        Nothing of its own.

    Guarantees: when not None, its ``expand(ops)`` is exactly the full path's orders for
    ``m`` (each pass's result for ``m`` is proved to be its result for ``small`` with the
    periods inserted). Cost: the passes on ``small`` microbatches, O(p) bisections and C
    scans per list for the checks; no O(p·m) work."""
    pl = block.placement
    T = block.period
    grid = _repeated(block, small)
    band = _band(grid, [[small] * 4 for _ in grid], T)
    steps = (lambda g, b: _weights(g, b, T, False), lambda g, b: _reordered(g, b, small, True, T),
             lambda g, b: _squeezed(g, b, T), lambda g, b: _reordered([r[:4] for r in g], b, small, False, T),
             lambda g, b: _weights(g, b, T, False), lambda g, b: _squeezed(g, b, T),
             lambda g, b: _weights([r[:4] for r in g], b, T, True))
    for step in steps:
        if band is None:
            return None
        proved = step(grid, band)
        if proved is None:
            return None
        grid, cuts = proved
        band = _band(grid, cuts, T)
    if band is None:
        return None
    short = [_lower_short(pl, i, rows, band[1], T, ops) for i, rows in enumerate(grid)]
    return PeriodicOrders([o for o, _, _ in short], [a for _, a, _ in short], [c for _, _, c in short], m - small)


def _mult(rows: Times) -> list[int]:
    """Entries per period of each list of a rank (its first list has one a period)."""
    return [len(ts) // len(rows[0]) for ts in rows]


def _stretch(ts: list[int], a: int, c: int, T: int) -> tuple[int, int]:
    """The widest ``[s, e)`` around index ``a`` with ``ts[i] = ts[i−c] + T`` for every
    ``i`` in ``[s+c, e)`` (C scans; in C where built)."""
    if a < c:
        return a, a
    loop = getattr(c_engine(), "stretch", None)
    if loop is not None and a <= len(ts) and type(ts) is list:
        return loop(ts, a, c, T)
    gaps = map(sub, ts[a:], ts[a - c:])
    e = next(compress(count(a), map(ne, gaps, [T] * (len(ts) - a))), len(ts))
    # The last i in [c, a) with ts[i] − ts[i − c] ≠ T, scanned backwards from a in C.
    back = map(ne, map(sub, reversed(ts[c:a]), reversed(ts[:a - c])), repeat(T))
    bad = next(compress(range(a - 1, c - 1, -1), back), None)
    return (0 if bad is None else bad - c + 1), e


def _band(grid: list[Times], cuts: Cuts, T: int) -> tuple[int, int] | None:
    """The band of ``grid`` from its lists' stretches around ``cuts`` (module docstring),
    None when a cut is outside its stretch or the band is under three periods wide."""
    lo, hi = -1, 1 << 62
    for rows, at in zip(grid, cuts):
        for ts, c, a in zip(rows, _mult(rows), at):
            s, e = _stretch(ts, a, c, T)
            if not (s + c <= a <= e) or e == s:
                return None
            lo, hi = max(lo, ts[s]), min(hi, ts[e - 1] + 1)
    return (lo, hi) if hi - lo >= 3 * T else None


def _cuts_at(grid: list[Times], tau: int, T: int) -> Cuts | None:
    """Each list's index at slot ``tau``, None unless one period before it holds exactly
    the list's entries of one period (the copies the insertion makes)."""
    cuts = []
    for rows in grid:
        at = []
        for ts, c in zip(rows, _mult(rows)):
            a = bisect_left(ts, tau)
            if a < c or bisect_left(ts, tau - T) != a - c:
                return None
            at.append(a)
        cuts.append(at)
    return cuts


def _weights(grid: list[Times], band: tuple[int, int], T: int, split: bool) -> tuple[list[Times], Cuts] | None:
    """:func:`.v_reorder._with_weights` on every rank, and the cut proving it (the module
    docstring's W placement), or None."""
    lo, hi = band
    probes = list(range(lo, hi + 1, T))
    states: list[list[tuple[int, int, int]]] = []
    out = []
    for rows in grid:
        st: list[tuple[int, int, int]] = []
        out.append(_with_weights(rows, split, probes, st))
        states.append(st)
    for i in range(len(probes) - 2):  # τ = probes[i]; τ + T stays below hi
        if all(s[i + 1] == (s[i][0], s[i][1], s[i][2] + T) and s[i][2] >= lo for s in states):
            break
    else:
        return None
    tau = probes[i + 1]
    cuts = _cuts_at([r[:4] for r in out], tau, T)
    if cuts is None:
        return None
    for at, rows, s in zip(cuts, out, states):
        sigma = s[i + 1][2] + 1  # one past the rank's last event before τ + T
        for ts, c in zip(rows[4:], _mult(rows)[4:]):
            a = bisect_left(ts, sigma)
            if a < c or bisect_left(ts, sigma - T) != a - c:
                return None
            at.append(a)
    return out, cuts


def _reordered(grid: list[Times], band: tuple[int, int], small: int, with_w: bool,
               T: int) -> tuple[list[Times], Cuts] | None:
    """:func:`.v_reorder._reorder` (in place) and the cut proving it (the module
    docstring's reorder), or None."""
    lo, hi = band
    lo = max(lo, grid[0][_B0][0])  # t1: the warm-up's moves stay below lo
    if with_w:
        if sum(d * c for d, c in zip((1, 1, 0, 0, -1), _mult(grid[0]))) != 0:
            return None
    levels = None
    if not with_w:
        levels = [_RankLevels(rows, T) for rows in grid]  # (the reorder's own: the grid is not changed between)
        lo = _levels_repeat(levels, lo, hi, T)
        if lo is None:
            return None
    if hi - lo < 3 * T or min(rows[_F0][-1] for rows in grid) < lo + T:
        return None  # (every rank's last forward, which sets the cool-down's start, a period on)
    reads: dict[str, int] = {}
    out = _reorder(grid, small, with_w, T, reads, levels)
    t2 = reads.get("t2")
    if t2 is None or t2 < lo + T or reads["low"] < lo + T:
        return None
    cuts = _cuts_at(out, lo + T, T)
    return (out, cuts) if cuts is not None else None


def _levels_repeat(levels: list[_RankLevels], lo: int, hi: int, T: int) -> int | None:
    """The first ``τ`` from ``lo`` on (period steps, ``τ + 3T ≤ hi``) where every rank's
    implicit-W state (``levels``: each rank's :class:`.v_reorder._RankLevels` of the
    grid; level, pending W's, last slot) on reaching ``τ + T`` is the one on reaching
    ``τ``, one period on; None if none."""
    states = []
    for lv in levels:
        at = []
        for tau in range(lo, hi - 2 * T + 1, T):
            x = bisect_left(lv.events, tau * 8) - 1
            at.append((lv.level[x], lv.pending[x], (lv.events[x] >> 3) - tau) if x >= 0 else None)
        states.append(at)
    for i, tau in enumerate(range(lo, hi - 3 * T + 1, T)):
        if all(s[i] is not None and s[i] == s[i + 1] for s in states):
            return tau
    return None


def _squeezed(grid: list[Times], band: tuple[int, int], T: int) -> tuple[list[Times], Cuts] | None:
    """:func:`.v_reorder._squeeze` and the cut proving it (the module docstring's
    squeeze), or None."""
    lo, hi = band
    out = _squeeze(grid, T)
    p = len(grid)
    low = hi
    for r, rows in enumerate(grid):  # what the ops from hi − T on read: each dep list's first entry there
        for k, ts in enumerate(rows):
            b = bisect_left(ts, hi - T)
            if b >= len(ts):
                continue
            if (k == _F0 or k == _B1) and r > 0:
                low = min(low, grid[r - 1][k][b])
            elif (k == _F1 or k == _B0) and r + 1 < p:
                low = min(low, grid[r + 1][k][b])
            if 0 < k < 4:
                low = min(low, rows[k - 1][b])
            if b > 0:
                low = min(low, ts[b - 1])
    # The latest lo' whose [lo' + T, hi) has every squeezed slot its copy's plus T.
    for rows, outs in zip(grid, out):
        for ts, us, c in zip(rows, outs, _mult(rows)):
            a, b = bisect_left(ts, lo + T), bisect_left(ts, hi)
            if a < c:
                return None
            bad = [i for i, g in zip(range(a, b), map(sub, us[a:b], us[a - c:b - c])) if g != T]
            if bad:
                lo = max(lo, ts[bad[-1]] - T + 1)
    if hi - lo < 3 * T or low < lo + T:
        return None
    cuts = [[bisect_left(ts, hi) for ts in rows] for rows in grid]
    return out, cuts


def _lower_stretched(pl: Placement, i: int, rows: Times, tau: int, T: int, extra: int,
                     ops: OpTable | None) -> list[tuple[OpKind, int, int]]:
    """:func:`.v_reorder._lower` of rank ``i``'s lists with ``extra`` periods inserted at
    slot ``tau`` (inside the band): the ops before ``tau``, those of ``[tau − T, tau)``
    ``1..extra`` microbatches on, then the rest ``extra`` on."""
    return insert_periods(*_lower_short(pl, i, rows, tau, T, ops), extra, ops)


def _lower_short(pl: Placement, i: int, rows: Times, tau: int, T: int,
                 ops: OpTable | None) -> tuple[list[tuple[OpKind, int, int]], int, int]:
    """:func:`.v_reorder._lower` of rank ``i``'s lists (the short run's order, ``ops``'
    tuples when given), the index of slot ``tau`` in it and the ops of ``[tau − T, tau)``:
    where :func:`_lower_stretched` inserts the periods."""
    p = pl.num_ranks
    c0, c1 = i, 2 * p - 1 - i
    what = [(OpKind.F, c0), (OpKind.F, c1), (OpKind.B, c1), (OpKind.B, c0), (OpKind.W, c1), (OpKind.W, c0)]
    n = 1 + max((len(ts) for ts in rows), default=0)
    if ops is None:
        ops = {w: [(w[0], w[1], j) for j in range(n)] for w in what}
    table = [ops[w] for w in what]
    loop = getattr(c_engine(), "slot_ordered", None)
    if loop is not None and type(rows) is list and len(rows) <= 8:  # in C where built: the same list
        out, (x1, x2) = loop(rows, n, table, [(tau - T) * 8 * n, tau * 8 * n])
        return out, x2, x2 - x1
    cells = sorted([(t * 8 + k) * n + j for k, ts in enumerate(rows) for j, t in enumerate(ts)])
    x1, x2 = bisect_left(cells, (tau - T) * 8 * n), bisect_left(cells, tau * 8 * n)
    return [table[e // n & 7][e % n] for e in cells], x2, x2 - x1
