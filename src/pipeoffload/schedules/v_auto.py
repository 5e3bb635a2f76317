"""V-auto: a controllable-memory V schedule found by a building-block search
(docs/algorithms.md#210-v-auto-a-building-block-search).

V-Min, V-Half and V-ZB (:mod:`.vshape`) are three fixed building blocks. Between and
around them lie many more blocks of the same shape, each with its own memory and its
own bubble under given costs. V-auto enumerates a family of them, keeps those whose
repeated grid fits the memory limit, lowers each with the same pipelines the fixed
blocks use, times every lowering with the real costs and returns the best one that
keeps every rank within the limit.

**The family.** A block is described by *phases* (slot modulo the period 6) of rank
0's four F/B ops — chunk-0 forward ``F`` at phase 0, chunk-1 forward ``f``, chunk-1
backward ``B`` and chunk-0 backward ``b`` at three distinct phases in 1..5 — and by
how the phases move from rank ``i`` to rank ``i+1``: ``F`` and ``B`` (which travel
down the ranks) move ``+d``, ``f`` and ``b`` (which travel up) move ``−1``. The step
``d`` in 1..5 is ``d0`` for the first ``k`` rank steps and ``d1 ≤ d0`` after (``k`` in
1..p−1); a rank whose four phases collide is no block. Each W takes the first free
phase after its B (chunk 1's first). This is the family of uniform-offset blocks of
the controllable-memory paper (Qi et al., 2024); V-Min, V-Half and V-ZB's rhythms
are members or close to them.

**From phases to a block.** One microbatch's round trip (F down, f up, B down, b up)
is walked in dependency order, each op in the first slot after its predecessor that
has its phase; each W in the first slot after its B with its phase. That gives the
absolute slots of a :class:`.building_block.BuildingBlock`, whose repeated grid's
per-rank peak is :func:`.building_block.steady_peak`. The search needs only each
member's peak, which is closed-form (the hops are ``d`` or one slot, the phases repeat
every 6 ranks: :func:`_peak`); a block is built only when it is lowered.

**Search.** Blocks whose steady peak exceeds the limit (in chunk activations) are
dropped unless ``m`` is too small to reach it. Each kept block can be lowered three ways:

* the reference reorder (:func:`.v_reorder_periods.reorder_orders`): the :data:`SCAN` blocks
  nearest the limit are lowered so and timed (the blocks with the most memory leave the
  least idle time); the best few (:data:`REFINE`) are lowered again by every pipeline of
  :func:`.vshape` (the repeat-reorder-compress pipeline, and each with its W's re-placed
  into idle time under the limit, :func:`.w_refill.refill_weights`);
* the grid rules of the authors' reference scheduler (:mod:`.v_grid_lowering`: rebuilt
  warm-up and cool-down on unit slots, then greedy hole filling). Which block suits given
  costs best is not visible from its peak when B ≠ F, so the kept blocks (as many as
  :data:`PROXY_CELLS` allows, nearest the limit first) are ranked by the real-cost span of
  their plain repeated grid (those whose repeated grid fits the limit first), and the
  :data:`GRID_SCAN` best (as many as :data:`GRID_WORK` allows) are lowered by the grid
  rules — with and without releasing warm-up W's when ``m ≤ p`` — and timed with the
  real costs; the fastest that fits the limit is a candidate.
  Lowerings are cached per (p, m, block): they depend on neither costs nor limit.

V-Min's, V-Half's and V-ZB's own schedules join as candidates, so V-auto is never worse
than any of them whose peak fits the limit. The winner has the shortest longest rank
span, then makespan, then peak; every candidate's figures are :func:`simulate`'s before it wins
(timed, or for a W refill its tracker's: the timing pass's engine, :func:`_tracked_peak`).

Against the authors' own V-auto (their search lowers every block of the same family by
the grid rules and keeps the fastest under the real costs): on every configuration of
tests/data/authors_reference.json (p = 3..7, m = p, 2p, 3p, limits at V-Min's, V-Half's
and 1F1B's memory, four cost mixes, with and without comm) ours is at least as good —
bubble within 0.003 and peak no higher (docs/schedules.md). This is measured, not proved:
the grid candidates are the budgeted top of a ranking, not the whole family.

Guarantees: a valid V schedule (v = 2) with every rank's peak, under ``spec.memory``,
at most ``spec.mem_limit`` (default V-Half's published peak); its longest rank span is no
longer than V-Min's, V-Half's or V-ZB's whenever their peak fits the limit, nor than the
grid lowering of any block it ranks among its :data:`GRID_SCAN` best. Raises
:class:`~pipeoffload.errors.ParameterError` (``mem_limit``) when no candidate fits.
The lowerings' per-op loops (reorders, squeezes, W refills, timings, the grid rules' sweeps, the
family's peaks) run in C where :mod:`pipeoffload._engine` is built (the same orders and floats,
tests/test_engine_c_loops.py), else in Python; no torch.
"""

from __future__ import annotations

from functools import lru_cache

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError
from ..native import c_engine
from ..ir import OpKind, Placement, Schedule, build_schedule
from .building_block import BuildingBlock, OpTable, op_table, periodic_from_block
from .spec import ScheduleSpec
from ..passes.steady_timing import PeriodicOrders, exact_costs, periodic_figures
from .v_grid_lowering import Cell, grid_orders, lower_grid, repeated_grid, time_grid
from .hole_fill import lex_better
from .v_reorder_periods import reorder_periodic
from .vshape import PERIOD, base_lowering, fixed_lowering, unit_peak_bound
from .w_refill import refill_periodic
from ..timeline import _clean

__all__ = ["v_auto", "block_family", "REFINE", "SCAN", "GRID_SCAN", "PROXY_CELLS", "GRID_WORK"]

F, B, W = OpKind.F, OpKind.B, OpKind.W
#: How many of the best blocks (after the first, cheap lowering) get every lowering.
REFINE = 2
#: How many blocks (those whose steady peak is nearest the limit) get the first lowering.
SCAN = 4
#: How many blocks, the best by their repeated grid's real-cost span, get the grid lowering.
GRID_SCAN = 48
#: Work budgets. Timing a repeated grid costs about its cells, ``6pm``; the grid lowering
#: about ``p² (max(m, 2p) + 4p)`` (its hole filling looks ahead along rows of that length),
#: twice when ``m ≤ p`` (with and without the W release). Both budgets cover every block for
#: p ≤ 7 and m ≤ 3p (the grid of tests/data/authors_reference.json); at larger p·m fewer
#: blocks are timed (nearest the limit first) and lowered (the best ranked first).
PROXY_CELLS = 260_000
GRID_WORK = 200_000


@lru_cache(maxsize=None)
def _w_phases(ph: tuple[int, int, int, int]) -> tuple[int, int] | None:
    """W phases for one rank's (F, f, B, b) phases: each the first free phase after its
    B (chunk 1's W first). Remembered: at most 6⁴ inputs, asked for every rank counted by
    :func:`_peak` and walked by :func:`_rows`."""
    used = set(ph)
    out = []
    for b in (ph[2], ph[3]):
        for j in range(1, PERIOD):
            q = (b + j) % PERIOD
            if q not in used:
                used.add(q)
                out.append(q)
                break
        else:
            return None
    return out[0], out[1]


def _block_from_phases(p: int, phases: list[list[int]]) -> BuildingBlock:
    """Absolute slots from per-rank phases (F, f, B, b, W1, W0): the round trip walked
    in dependency order, each op in the first later slot with its phase."""
    pl = Placement.vshape(p)
    slots: dict[tuple[OpKind, int], int] = {}
    chain = ([(F, s, s, 0) for s in range(p)] + [(F, 2 * p - 1 - r, r, 1) for r in reversed(range(p))]
             + [(B, 2 * p - 1 - r, r, 2) for r in range(p)] + [(B, r, r, 3) for r in reversed(range(p))])
    t = -1
    for kind, stage, rank, col in chain:
        t += 1
        t += (phases[rank][col] - t) % PERIOD  # the first slot from t with that phase
        slots[(kind, stage)] = t
    for r in range(p):
        for stage, col in ((2 * p - 1 - r, 4), (r, 5)):
            u = slots[(B, stage)] + 1
            slots[(W, stage)] = u + (phases[r][col] - u) % PERIOD
    return BuildingBlock(pl, PERIOD, slots)


def _rows(p: int, params: tuple[int, ...]) -> list[list[int]]:
    """Per-rank phases (F, f, B, b, W1, W0) of the family member ``params`` =
    ``(f1, b1, b0, d0, d1, k)`` (module docstring), walked rank by rank."""
    f1, b1, b0, d0, d1, k = params
    ph = (0, f1, b1, b0)
    rows = []
    for i in range(p):
        if i:
            d = d0 if i <= k else d1
            ph = ((ph[0] + d) % PERIOD, (ph[1] - 1) % PERIOD, (ph[2] + d) % PERIOD, (ph[3] - 1) % PERIOD)
        w = _w_phases(ph)
        if len(set(ph)) < 4 or w is None:
            raise ParameterError("params", f"{params} is no block of the family for p = {p}")
        rows.append(list(ph) + list(w))
    return rows


def _collides(ph: tuple[int, int, int, int], d: int, n: int) -> int:
    """The first of the next ``n`` ranks (1-based) whose four phases collide when ``F``
    and ``B`` move ``+d`` and ``f`` and ``b`` move ``−1`` per rank from ``ph``, or 0.
    The phases repeat every 6 ranks, so only the first 6 are looked at. (Four distinct
    phases always leave a W phase free: only the collision can end a rank walk.)"""
    a, f, b, c = ph
    for j in range(1, min(n, PERIOD) + 1):
        if len({(a + j * d) % PERIOD, (f - j) % PERIOD, (b + j * d) % PERIOD, (c - j) % PERIOD}) < 4:
            return j
    return 0


def _peak(p: int, params: tuple[int, ...]) -> int:
    """:func:`.building_block.steady_peak`'s highest rank for the family member
    ``params``, without building the block.

    The slots are closed-form: ``F`` and ``B`` hop ``d`` slots a rank (``d0`` up to rank
    ``k``, ``d1`` after), ``f`` and ``b`` one slot; the three turns (``F→f`` on the last
    rank, ``f→B`` on rank 0, ``B→b`` on the last rank) and each W's distance to its B
    follow from the phases. Within a stretch of one step ``d`` the phases repeat every
    6 ranks, and 6 ranks on a chunk-0 lifespan is ``6(d+1)`` slots shorter and the
    chunk-1 one as much longer: every phase's count moves by ``d+1`` down and up, so the
    rank's peak is the same. Only the first 6 ranks of each stretch are counted. In C where
    built (the same count)."""
    loop = getattr(c_engine(), "family_peak", None)
    if loop is not None:
        return loop(p, params, PERIOD)
    f1, b1, b0, d0, d1, k = params
    n0 = min(k, p - 1)  # ranks reached with step d0

    def phases(r: int) -> tuple[int, int, int, int, int]:
        s = d0 * min(r, n0) + d1 * max(0, r - n0)  # F(r)'s slot
        return s % PERIOD, (f1 - r) % PERIOD, (b1 + s) % PERIOD, (b0 - r) % PERIOD, s

    pF, pf, pB, pb, last = phases(p - 1)
    f_last = last + 1 + (pf - pF - 1) % PERIOD  # f on the last rank
    b_first = f_last + p - 1 + 1 + (b1 - f1 - 1) % PERIOD  # B on rank 0
    b0_last = b_first + last + 1 + (pb - pB - 1) % PERIOD  # b on the last rank
    best = 0
    for r in set(range(min(n0, 5) + 1)) | set(range(n0, min(p - 1, n0 + 5) + 1)):
        a, fph, bph, cph, s = phases(r)
        w1, w0 = _w_phases((a, fph, bph, cph))
        f_r, big_b, b_r = f_last + p - 1 - r, b_first + s, b0_last + p - 1 - r
        e1 = big_b + 1 + (w1 - big_b - 1) % PERIOD
        e0 = b_r + 1 + (w0 - b_r - 1) % PERIOD
        # Copies alive at phase t: (t−s)//T − (t−e0)//T + (t−f_r)//T − (t−e1)//T; with
        # x = T·q + ρ, (t − x)//T = −q − [t < ρ] for t in 0..T−1 (_phase_excess).
        (qs, rs), (q0, r0), (qf, rf), (q1, r1) = divmod(s, PERIOD), divmod(e0, PERIOD), divmod(f_r, PERIOD), \
            divmod(e1, PERIOD)
        n = q0 - qs + q1 - qf + _phase_excess(rs, r0, rf, r1)
        if n > best:
            best = n
    return best


@lru_cache(maxsize=None)
def _phase_excess(rs: int, r0: int, rf: int, r1: int) -> int:
    """``max over t in 0..T−1`` of ``[t < r0] + [t < r1] − [t < rs] − [t < rf]``: the part of
    :func:`_peak`'s count of one rank that depends on the phases of its four ends
    (residues mod ``T``); at most ``T⁴`` inputs."""
    return max((t < r0) + (t < r1) - (t < rs) - (t < rf) for t in range(PERIOD))


@lru_cache(maxsize=64)
def _family(p: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``(steady peak, params)`` of every distinct block of the family for ``p`` ranks, in
    :func:`block_family`'s order (lowest peak first, then the order the loops meet them),
    without building one: a member is valid when no rank's phases collide, which within a
    stretch of one step depends on its first 6 ranks only (:func:`_collides`); members
    are told apart by their step sequence (``k ≥ p − 1`` is one step throughout, whatever
    ``d1``); the peak is :func:`_peak`. O(p) members, O(1) each."""
    seen: set[tuple[int, ...]] = set()
    out = []
    steps = range(1, PERIOD)
    for f1 in steps:
        for b1 in steps:
            for b0 in steps:
                if len({f1, b1, b0}) < 3:
                    continue
                for d0 in steps:
                    fail0 = _collides((0, f1, b1, b0), d0, p - 1)
                    for d1 in range(1, d0 + 1):
                        for k in range(1, p) if d1 < d0 else [p]:
                            n0 = min(k, p - 1)
                            if fail0 and fail0 <= n0:
                                continue
                            s = d0 * n0
                            at_k = (s % PERIOD, (f1 - n0) % PERIOD, (b1 + s) % PERIOD, (b0 - n0) % PERIOD)
                            if n0 < p - 1 and _collides(at_k, d1, p - 1 - n0):
                                continue
                            steps_seq = (f1, b1, b0, n0, d0 if n0 else 0, d1 if n0 < p - 1 else 0)
                            if steps_seq not in seen:
                                seen.add(steps_seq)
                                params = (f1, b1, b0, d0, d1, k)
                                out.append((_peak(p, params), params))
    return tuple(sorted(out, key=lambda x: x[0]))


@lru_cache(maxsize=4096)
def _family_block(p: int, params: tuple[int, ...]) -> BuildingBlock:
    """The block of the family member ``params`` (:func:`_rows`, :func:`_block_from_phases`)."""
    return _block_from_phases(p, _rows(p, params))


@lru_cache(maxsize=64)
def block_family(p: int) -> tuple[tuple[BuildingBlock, int], ...]:
    """Every distinct block of the uniform-offset family for ``p`` ranks, with its
    steady-state peak (chunk activations, highest rank), lowest peak first.

    Args:
        p: pipeline ranks.

    Returns:
        ``(block, peak)`` pairs: the members of :func:`_family`, each block built.

    Guarantees: the same blocks, peaks and order as walking every member rank by rank
    and deduplicating by slots (tests/test_v_auto_family.py keeps that walk). V-auto
    itself builds only the blocks it lowers."""
    return tuple((_family_block(p, params), peak) for peak, params in _family(p))


Orders = list[list[Cell]]  #: per rank, (kind, layer group, microbatch)


def _key(pl: Placement, m: int, cand: PeriodicOrders, costs: Costs, memory: MemoryDeltas) -> tuple[float, float, float]:
    """Longest rank span (what the bubble rate measures), then makespan, then peak, of
    ``cand.expand()`` timed as :func:`~pipeoffload.passes.timing.simulate` times them
    (:func:`~pipeoffload.passes.steady_timing.periodic_figures`: no timeline is built, the
    orders are timed on ``m − cand.extra`` microbatches and the periodic steady state shifted
    where that is exact — the same floats)."""
    peak, span, makespan = periodic_figures(pl, m, cand, costs, memory)
    return (span, makespan, peak)


def _loses(a: tuple, b: tuple) -> bool:
    """Whether :func:`lex_better` of ``a`` over ``b`` is already False on their span and
    makespan (``a``'s peak may be unknown: None)."""
    for x, y in zip(a[:2], b[:2]):
        eps = 1e-9 * max(1.0, abs(y))
        if x < y - eps:
            return False
        if x > y + eps:
            return True
    return False


def v_auto(spec: ScheduleSpec) -> Schedule:
    """V-auto: the best V schedule of the block search (module docstring) within
    ``spec.mem_limit`` (units of ``spec.memory``; default V-Half's published peak).

    Args:
        spec: p, m, costs, memory deltas and ``mem_limit``; v must be 2 (or unset), no group.

    Returns:
        The winning per-rank orders as a Schedule (params p, m, v = 2, mem_limit).

    Raises:
        ParameterError: ``mem_limit`` ≤ 0, or no candidate fits it (the message quotes
            V-Min's peak); ``v`` or ``g`` as :class:`.spec.ScheduleSpec` checks them.

    Guarantees: see the module docstring; the same orders whatever the family's members
    cost to find (tests/test_v_auto_family.py).

    Cost in p and m: the family in closed form, O(p) members at O(1) each (3.6 k at
    p = 64; :func:`_family`), none built but the ones lowered. Then a constant number
    of lowerings: V-Min and V-Half (and V-ZB when its bound may fit), taken with the
    figures their lowering timed them by (:func:`.vshape.fixed_lowering`), :data:`SCAN`
    slot reorders and timings, :data:`REFINE` building-block pipelines with their W
    refills, each held, timed and refilled on O(p) microbatches where the lowerings prove
    it (:func:`_scan_blocks`): O(p²) steps each, only the winner expanded (O(p·m) in C). The grid rules lower ``max(1, min(GRID_SCAN, GRID_WORK / (p²·(max(m, 2p) +
    4p))))`` blocks at O(p²·(max(m, 2p) + 4p)) each (the hole filling writes the
    periods it proves repeated by slices, :mod:`.v_grid_lowering`), after timing ``min(family, PROXY_CELLS / 6pm)`` repeated grids,
    O(p·m) each (none when only one would be timed). At p = 64, m = 512 the whole search
    is ≈ 1.7 s of CPU with the C loops, ≈ 4.1 s with ``PIPEOFFLOAD_ENGINE=python``
    (docs/algorithms.md §9.16)."""
    spec.no_group()
    spec.resolve_v(2, allowed=(2,))
    p, m, costs, memory = spec.p, spec.m, spec.costs, spec.memory
    pl = Placement.vshape(p)
    chunk = max(memory.chunk_deltas(pl, s)[0] for s in range(pl.num_stages))
    if spec.mem_limit is None:
        limit = unit_peak_bound("v-half", p) * memory.F
    else:
        limit = float(spec.mem_limit)
        if limit <= 0:
            raise ParameterError("mem_limit", f"must be > 0, got {spec.mem_limit!r}")
    # One op table for every lowering's orders: held here, V-Min's and V-Half's lowerings
    # (vshape) get the same one from op_table instead of each making its own.
    ops = op_table(pl, m)
    fixed = _fixed(spec, pl, limit)
    tol = limit * 1e-9 + 1e-12

    def fits(key: tuple[float, float, float]) -> bool:
        return key[2] <= limit + tol

    best: tuple[PeriodicOrders, tuple[float, float, float]] | None = None
    for s, key in fixed:
        if fits(key) and (best is None or lex_better(key, best[1])):
            best = (PeriodicOrders.plain(s), key)

    # Chunk activations the limit holds; with few microbatches a block's steady peak is
    # not reached (at most 2m chunks are ever alive), so larger blocks may still fit.
    units = limit / chunk if chunk > 0 else float("inf")
    cap = units if m >= 2 * p else max(units, 2 * m)
    # The blocks nearest the limit leave the least idle time: lower those first, at most
    # SCAN; with few microbatches, the blocks that fit in the steady state come first.
    fam = _family(p)
    fitting = sorted((pp for pp in fam if pp[0] <= cap + 1e-9), key=lambda pp: (pp[0] > units + 1e-9, -pp[0]))
    best = _scan_blocks(pl, m, [_family_block(p, params) for _, params in fitting[:SCAN]], costs, memory,
                        limit, best, ops)
    del ops
    found = _grid_candidate(p, m, costs, memory, units, limit + tol)
    # time_grid's span is the timing pass's (tests/test_v_auto_family.py): a grid whose
    # span is clearly longer than the best's cannot win, and is not made into orders.
    if found is not None and (best is None or found[1][0] <= best[1][0] * (1 + 1e-6) + 1e-12):
        grid = grid_orders(found[0])
        key = _key(pl, m, PeriodicOrders.plain(grid), costs, memory)
        if fits(key) and lex_better(key, None if best is None else best[1]):
            best = (grid, key)
    if best is None:
        raise ParameterError("mem_limit", f"no V-auto schedule keeps every rank within {limit:g}; "
                             f"V-Min's peak is {fixed[0][1][2]:g}")
    return build_schedule(spec.name, m, pl, best[0], p=p, m=m, v=2, mem_limit=limit)


Key = tuple[float, float, float]  #: longest rank span, makespan, peak (:func:`_key`)


def _scan_blocks(pl: Placement, m: int, blocks: list[BuildingBlock], costs: Costs, memory: MemoryDeltas,
                 limit: float, best: tuple[PeriodicOrders, Key] | None,
                 ops: OpTable) -> tuple[Orders, Key] | None:
    """The slot reorder of each of ``blocks``, timed; the :data:`REFINE` best of them
    also by the building-block pipeline and each base with its W's refilled under
    ``limit``. Returns the best of ``best`` and those candidates whose peak fits
    ``limit`` (shortest span, then makespan, then peak; ties keep the earlier).
    ``ops``: :func:`.building_block.op_table` for ``m`` (every lowering's orders hold its tuples).

    Every candidate is held as :class:`~pipeoffload.passes.steady_timing.PeriodicOrders`
    (its orders on ``m'`` microbatches and where the missing periods go in, as the
    lowerings prove them), timed (:func:`_key`) and refilled
    (:func:`.w_refill.refill_periodic`) on those: the figures and orders of the expanded
    orders, float for float; only the winner is expanded (returned as orders). Under costs
    the short runs cannot shift (not binary fractions: :func:`exact_costs`) each candidate is
    expanded once, when made, as V-Min's and V-Half's lowerings do."""
    tol = limit * 1e-9 + 1e-12
    positive = all(d > 0 for row in costs.duration_table(pl) for d in row.values())
    plain = not exact_costs(pl, costs, memory, 6 * pl.num_ranks * m)  # (6pm: every op for m)

    def held(cand: PeriodicOrders) -> PeriodicOrders:
        return PeriodicOrders.plain(cand.expand(ops)) if plain else cand

    ranked = []
    for blk in blocks:
        s = held(base_lowering(reorder_periodic, blk, m, ops))
        ranked.append((_key(pl, m, s, costs, memory), len(ranked), blk, s))
    ranked.sort(key=lambda x: (x[0], x[1]))
    for key, _, blk, s in ranked[:REFINE]:
        cands: list[tuple[PeriodicOrders, tuple]] = [(s, key)]
        s2 = held(base_lowering(periodic_from_block, blk, m, ops))
        cands.append((s2, _key(pl, m, s2, costs, memory)))
        for base, _k in list(cands):
            # A run refill_periodic leaves out would repeat the one before it (never better).
            # Its tracker timed it (the timing pass's engine): span and makespan are known,
            # and with positive durations its peak too (_tracked_peak); otherwise the peak
            # is timed below only if they do not already lose.
            for c, span, makespan, peak in refill_periodic(pl, m, base, costs, memory, [limit] * pl.num_ranks):
                cands.append((c, (span, makespan, _tracked_peak(peak, positive))))
        for c, ckey in cands:
            if best is not None and _loses(ckey, best[1]):
                continue
            if ckey[2] is None:
                ckey = _key(pl, m, c, costs, memory)
            if ckey[2] <= limit + tol and (best is None or lex_better(ckey, best[1])):
                best = (c, ckey)
    return None if best is None else (best[0].expand(ops), best[1])


def _tracked_peak(peak: float, positive: bool) -> float | None:
    """The highest peak of a refill's order as :func:`_key` times it, from ``peak``, the
    highest level of the refill's tracker (:func:`.w_refill.refill_periodic`), or None
    (then it is timed) when some duration is not positive.

    Why it is the timed peak: the tracker's level on a rank is the running sum of its
    ops' deltas (the same delta table) in the order it made, from 0.0, and its peak the
    highest level (at least 0.0). With positive durations the timeline's sweep (an
    allocation at the op's start, a free at its end, frees first at equal times) meets a
    rank's changes in op order, so it adds the same floats in the same order
    (:func:`~pipeoffload.passes.timing.order_figures`), and so does the steady timing
    (:func:`~pipeoffload.passes.steady_timing.steady_figures`: the running sum in op
    order). Periods the refill shifted instead of placing repeat the levels of the period
    before them (its state check compares the levels), so they add no new peak. Both
    round by :func:`~pipeoffload.timeline._clean`, which is monotone. A refill run on
    ``m'`` microbatches has the levels of the one on ``m`` (:func:`.w_refill.refill_periodic`)."""
    return _clean(peak) if positive else None


def _fixed(spec: ScheduleSpec, pl: Placement, limit: float) -> list[tuple[Orders, Key]]:
    """V-Min's, V-Half's and V-ZB's orders and keys, those whose peak may fit ``limit``:
    their published bound is reached exactly from m = p on under unit accounting (B frees
    nothing), so only then can a bound above the limit skip one. V-Min always runs (first):
    it names the lowest peak in the error."""
    p, m, costs, memory = spec.p, spec.m, spec.costs, spec.memory
    exact = m >= p and memory.B == 0 and memory.group_deltas is None
    fixed = []
    for name in ("v-min", "v-half", "v-zb"):
        if name == "v-min" or not exact or unit_peak_bound(name, p) * memory.F <= limit * (1 + 1e-9):
            # The generator's orders and the figures its lowering timed them by (_key's).
            s, (peak, span, makespan) = fixed_lowering(name, ScheduleSpec(spec.name, p, m, costs=costs, memory=memory))
            fixed.append((s, (span, makespan, peak)))
    return fixed


@lru_cache(maxsize=4096)
def _lowered(p: int, m: int, params: tuple[int, ...], release: bool) -> tuple[str, ...] | None:
    """The grid lowering of the family member ``params`` (rows as strings), or None.

    Cached: it depends on neither the costs nor the limit."""
    grid = lower_grid(_family_block(p, params), m, release)
    return None if grid is None else tuple("".join(row) for row in grid)


@lru_cache(maxsize=4096)
def _repeated(p: int, m: int, params: tuple[int, ...]) -> tuple[str, ...]:
    """The family member ``params`` repeated ``m`` times (rows as strings): its per-rank
    orders are what the block's steady state runs, so its real-cost span ranks blocks."""
    return tuple("".join(row) for row in repeated_grid(_family_block(p, params), m))


def _grid_candidate(p: int, m: int, costs: Costs, memory: MemoryDeltas, units: float,
                    limit: float) -> tuple[tuple[str, ...], tuple[float, float, float]] | None:
    """The best grid lowering (:mod:`.v_grid_lowering`) within ``limit`` (rows of labels,
    :func:`.v_grid_lowering.grid_orders` makes them orders) and its time_grid figures
    (longest span, makespan, peak), or None.

    Admissible blocks: steady peak at most ``2p`` (the rules refuse more) and, when
    ``m ≥ 2p`` (the steady state is reached), at most ``units``. Nearest the limit first,
    as many as :data:`PROXY_CELLS` allows are timed as repeated grids (real costs); the
    :data:`GRID_SCAN` best — those whose repeated grid fits ``limit`` first, fastest first —
    (as many as :data:`GRID_WORK` allows) are lowered, with and
    without the warm-up W release when ``m ≤ p``, and timed; the one with the shortest
    longest rank span (then makespan, then peak) whose peak fits ``limit`` wins."""
    pl = Placement.vshape(p)
    dur, delta = costs.duration_table(pl), memory.delta_table(pl)
    cap = min(2 * p, units) if m >= 2 * p else 2 * p
    fam = _family(p)
    order = sorted((i for i, (pk, _) in enumerate(fam) if pk <= cap + 1e-9), key=lambda i: (-fam[i][0], i))
    n_proxy = max(1, PROXY_CELLS // (p * PERIOD * m))
    if len(order[:n_proxy]) > 1:
        proxy = {i: time_grid(_repeated(p, m, fam[i][1]), dur, costs.comm, delta) for i in order[:n_proxy]}
        # Blocks whose plain repeated grid fits the limit first (the lowering rarely lowers a
        # peak much), each group fastest first.
        ranked = sorted(proxy, key=lambda i: (proxy[i][2] > limit, proxy[i][0], i))
    else:
        ranked = order[:n_proxy]  # one block: nothing to rank, its repeated grid is not timed
    releases = (True, False) if m <= p else (True,)
    n_grid = max(1, min(GRID_SCAN, GRID_WORK // (p * p * (max(m, 2 * p) + 4 * p) * len(releases))))
    best = None
    for i in ranked[:n_grid]:
        for release in releases:
            grid = _lowered(p, m, fam[i][1], release)
            if grid is None:
                continue
            span, makespan, peak = time_grid(grid, dur, costs.comm, delta)
            key = (span, makespan, peak)
            if peak <= limit and lex_better(key, None if best is None else best[0]):
                best = (key, grid)
    return None if best is None else (best[1], best[0])
