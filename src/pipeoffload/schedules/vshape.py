"""Controllable-memory V schedules: V-Min, V-Half, V-ZB (docs/algorithms.md#29-v-min-v-half-and-v-zb).

All three run on the V placement (v = 2: rank ``i`` holds layer groups ``i``, chunk 0,
and ``2p−1−i``, chunk 1; the loss is on rank 0, the turn at rank ``p−1`` is local) and
are built by the building-block method (:mod:`.building_block`) from a block of unit
slots, period 6 (F, B, W of two chunks). In the reference notation, on rank ``i``:
``F`` chunk-0 forward, ``f`` chunk-1 forward, ``B`` chunk-1 backward, ``b`` chunk-0
backward; each W goes to the first free slot after its B.

==========  ===========================  ===========================
op          V-Min                        V-Half
==========  ===========================  ===========================
X           2 if p%3 == 0 else 0         3 if p%2 == 0 else 0
F           ``i``                        ``2i``
f           ``2p−i−1``                   ``3p−i−2``
B           ``2p+X+i``                   ``3p+X+2i−1``
b           ``4p+X−i−1``                 ``6p+X−i−2``
==========  ===========================  ===========================

**V-ZB** (1F1B's memory, ``p`` units) is built from the same round trip with slack:
every hop to another rank starts half a period (3 slots) after its predecessor, the
local turns (rank ``p−1``'s F→f, the loss on rank 0) one slot after, each op in the
first slot free modulo 6 (:func:`.building_block.chain_slots`), W's as above. The
half-period hops lengthen the lifespans to exactly ``2p`` chunk units per rank in the
steady state (checked for every p up to 40), which is 1F1B's ``p`` units; that memory
lets the reorder pull the warm-up forwards together, and since no chunk op takes more
than half of a rank's per-microbatch time, the steady state never waits on a
neighbour whatever the costs: with ``T_comm = 0`` its bubble stays below 1F1B's
(tested on random costs), and with unit chunk costs it is 0 once ``m ≥ 2p``.

Guarantees (unit accounting F +½, W −½ unit per chunk, any costs): peak per rank at
most ``(p+4)//3`` (V-Min), ``(p+2)//2`` (V-Half), ``p`` (V-ZB) units, for every
``p ≥ 1`` and ``m ≥ 1`` (no minimum m: the block is cut to the microbatches that
exist). The busiest rank reaches the formula exactly from ``m = p`` on (tested for
p = 2..32; the blocks' steady states for p = 1..40); V-Min leaves every third rank one
unit lower when ``p % 3 == 2``, and V-ZB's early ranks fill up only once ``m ≥ 2p``. With unit chunk costs, bubbles are about ⅔ (V-Min) and ½
(V-Half) of 1F1B's, and V-ZB's is 0 for ``m ≥ 2p`` (bubble rate as in
:class:`~pipeoffload.timeline.Timeline`: per-rank span).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from typing import Callable, Sequence

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement, Schedule, build_schedule
from .hole_fill import BUDGET as HOLE_BUDGET, fill_holes
from .building_block import BuildingBlock, OpTable, chain_slots, op_table, periodic_from_block, place_weight_grads
from .spec import ScheduleSpec
from ..passes.steady_timing import PeriodicOrders, exact_costs, periodic_figures, steady_figures
from .v_reorder_periods import reorder_periodic
from .w_refill import refill_periodic
from .zb_auto import Tracker, lower_bounds

__all__ = ["v_min", "v_half", "v_zb", "v_min_block", "v_half_block", "v_zb_block", "PERIOD", "unit_peak_bound",
           "base_lowering"]

F, B = OpKind.F, OpKind.B
#: Slots per microbatch per rank: F, B, W of two chunks.
PERIOD = 6


def unit_peak_bound(name: str, p: int) -> int:
    """The published peak of a V schedule, in units (whole-stage activations)."""
    return {"v-min": (p + 4) // 3, "v-half": (p + 2) // 2, "v-zb": p}[name]


def _block(p: int, offsets: list[tuple[int, int, int, int]]) -> BuildingBlock:
    """Block from per-rank (F, f, B, b) slots; W's placed by :func:`place_weight_grads`."""
    pl = Placement.vshape(p)
    slots: dict[tuple[OpKind, int], int] = {}
    for i, (f0, f1, b1, b0) in enumerate(offsets):
        c0, c1 = i, 2 * p - 1 - i
        slots[(F, c0)], slots[(F, c1)], slots[(B, c1)], slots[(B, c0)] = f0, f1, b1, b0
    return BuildingBlock(pl, PERIOD, place_weight_grads(pl, PERIOD, slots))


@lru_cache(maxsize=128)
def v_min_block(p: int) -> BuildingBlock:
    """V-Min's block: the forward goes down and back up, then the backward, with no gap."""
    x = 2 if p % 3 == 0 else 0
    return _block(p, [(i, 2 * p - i - 1, 2 * p + x + i, 4 * p + x - i - 1) for i in range(p)])


@lru_cache(maxsize=128)
def v_half_block(p: int) -> BuildingBlock:
    """V-Half's block: forwards and backwards of chunk 0 two slots apart per rank."""
    x = 3 if p % 2 == 0 else 0
    return _block(p, [(2 * i, 3 * p - i - 2, 3 * p + x + 2 * i - 1, 6 * p + x - i - 2) for i in range(p)])


@lru_cache(maxsize=128)
def v_zb_block(p: int) -> BuildingBlock:
    """V-ZB's block: the round trip with half a period (3 slots) per hop between ranks."""
    pl = Placement.vshape(p)
    slots = chain_slots(pl, PERIOD, hop=PERIOD // 2, turn=1)
    return BuildingBlock(pl, PERIOD, place_weight_grads(pl, PERIOD, slots))


#: What V-Min, V-Half and V-ZB cost in p and m (their docstrings point here).
LOWERING_COST = (
    "the lowering (_lower_block, memoised by its inputs) repeats the block m times and builds up to six "
    "candidate orders over O(p·m) ops. The building-block pipeline runs on m' = O(p) microbatches (a few "
    "periods past twice the block's span) when that run proves its steady state, and its orders for m are "
    "those with the m − m' missing periods inserted: O(p²) slots scanned (the reorder's memory levels between "
    "an op's inputs and its slot in C) plus O(p·m) tuples made in list comprehensions; otherwise it runs on m "
    "(the proved periods written by shifting). The slot reorder likewise runs its five passes on m' = O(p) "
    "microbatches when m ≥ 2m' and each pass's check proves its result for m is the short one with the "
    "periods inserted (v_reorder_periods): O(p²) steps (its warm-up and cool-down visits, each "
    "re-counting its rank's levels until they meet the old ones) plus O(p·m) tuples written in C; otherwise "
    "it runs on m (O(p·m log m) sorts, O(p·m) W-placement steps, the squeezes' proved periods by slices). "
    "When the first lowering's "
    "longest span and makespan are at their lower bounds (V-ZB at equal costs, m ≥ 2p) it wins and nothing "
    "else is built. Otherwise the W refills (the rerun without partial gaps is skipped when it would be the "
    "same run, e.g. at unit costs) and the timings of the two base candidates and of any other that could win "
    "go through the periodic steady state when the costs are binary fractions (unit costs, halves: "
    ":mod:`~pipeoffload.passes.steady_timing`, :func:`.w_refill.refill_both`): the warm-up and cool-down, O(p²) ops, are placed "
    "and the proved periods written by slices; with other costs each is O(p·m) ops. The candidates are held "
    "as their orders on m' microbatches plus where the missing periods go in (PeriodicOrders): their timings "
    "and refills run on m' when that run proves the result for m is the short one with the periods inserted "
    "(periodic_figures, refill_periodic: O(p²) steps and O(p·m') list work each), and only the winner's "
    "O(p·m) tuples are written (in C); otherwise on the expanded orders, as above. "
    "Hole filling runs only while its budget can time a trial (6·p·m ≤ 25 000 ops): O(p·m) in all, with the "
    "constant of about six timings (about two with binary-fraction costs). The per-op loops (reorders, "
    "squeezes, W refills, timings) run in C where pipeoffload._engine is built (docs/algorithms.md §9.16)")


#: How many base lowerings :func:`base_lowering` remembers (least recently used dropped first).
BASES_KEPT = 64
_BASES: "OrderedDict[tuple, PeriodicOrders]" = OrderedDict()


def base_lowering(lower: Callable[[BuildingBlock, int, OpTable | None], PeriodicOrders], block: BuildingBlock,
                  m: int, ops: OpTable | None = None) -> PeriodicOrders:
    """``lower(block, m, ops)`` — the slot reorder (:func:`.v_reorder_periods.reorder_periodic`)
    or the building-block pipeline (:func:`.building_block.periodic_from_block`) — remembered
    by its inputs.

    Both read only the block's slots and ``m``, never the costs, memory deltas or limit,
    while the lowerings that call them (V-Min's, V-Half's, V-ZB's, V-auto's scan) are
    asked again under other costs: the planner lowers the same blocks at the same ``m`` for
    each recompute, TP and SP setting (46 slot reorders of 20 distinct inputs at
    ``plan --model 98.5B --gpus 64``). The key is the function itself (a stand-in a test
    patches in is another key), the block's placement, period and slots, and ``m``; ``ops``
    only lends its tuples (equal values whichever table made them).

    Guarantees: the same orders as calling ``lower`` (a fresh :class:`PeriodicOrders`
    with fresh row lists each call, so a caller may change them; the ops are immutable
    tuples). Holds at most :data:`BASES_KEPT` results: each its orders on ``m'``
    microbatches where the run proved its period (O(p²) ops), else on ``m``."""
    key = (lower, block.placement, block.period, frozenset(block.slots.items()), m)
    got = _BASES.get(key)
    if got is None:
        got = _BASES[key] = lower(block, m, ops)
        if len(_BASES) > BASES_KEPT:
            _BASES.popitem(last=False)
    else:
        _BASES.move_to_end(key)
    return PeriodicOrders([list(r) for r in got.orders], list(got.at), list(got.per), got.extra)


def _check(spec: ScheduleSpec) -> None:
    spec.no_group()
    spec.resolve_v(2, allowed=(2,))


def _from_block(name: str, spec: ScheduleSpec, holes: bool = False) -> Schedule:
    """:func:`_lower_block` of the named block, remembered: V-auto, ZB-V below p units and
    the planner ask for the same V-Min/V-Half/V-ZB lowering many times with the same
    inputs, and the lowering (W refill, hole filling) is the costly part. Each call gets
    a fresh Schedule."""
    orders, _ = _lowered(name, spec.p, spec.m, spec.costs, spec.memory, holes)
    return build_schedule(name, spec.m, Placement.vshape(spec.p), [list(r) for r in orders], p=spec.p, m=spec.m,
                          v=2)


Figures = tuple[float, float, float]  #: highest peak, longest span, makespan (:func:`steady_figures`)


@lru_cache(maxsize=256)
def _lowered(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas,
             holes: bool) -> tuple[tuple[tuple[tuple[OpKind, int, int], ...], ...], Figures]:
    block = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}[name](p)
    orders, figures = _lower_block_timed(name, block, ScheduleSpec(name, p, m, costs=costs, memory=memory), holes)
    return tuple(tuple(r) for r in orders), figures


#: Whether each fixed block's generator runs the hole-filling pass (:func:`_lower_block`).
HOLES = {"v-min": True, "v-half": True, "v-zb": False}


def fixed_lowering(name: str, spec: ScheduleSpec) -> tuple[list[list[tuple[OpKind, int, int]]], Figures]:
    """The orders :func:`v_min`, :func:`v_half` or :func:`v_zb` (``name``) make for
    ``spec``, and their figures as :func:`~pipeoffload.passes.steady_timing.steady_figures`
    gives them under ``spec.costs`` and ``spec.memory``, without making a Schedule or
    timing the orders again (V-auto's candidates: the lowering timed its winner).

    Args:
        name: ``"v-min"``, ``"v-half"`` or ``"v-zb"``.
        spec: p, m, costs and memory deltas (v and group as the generators check them).

    Returns:
        Per-rank ``(kind, layer group, microbatch)`` orders (fresh lists) and
        ``(highest peak, longest span, makespan)``.

    Raises:
        KeyError: ``name`` is not one of the three.

    Guarantees: the orders are the generator's Schedule's, the figures
    ``steady_figures(Placement.vshape(p), m, orders, spec.costs, spec.memory)``, the same
    floats (tests/test_v_auto_fixed.py)."""
    orders, figures = _lowered(name, spec.p, spec.m, spec.costs, spec.memory, HOLES[name])
    return [list(r) for r in orders], figures


Orders = list[list[tuple[OpKind, int, int]]]  #: per rank, (kind, layer group, microbatch)


def _lower_block(name: str, block: BuildingBlock, spec: ScheduleSpec, holes: bool = False) -> Orders:
    """:func:`_lower_block_timed`'s orders."""
    return _lower_block_timed(name, block, spec, holes)[0]


def _lower_block_timed(name: str, block: BuildingBlock, spec: ScheduleSpec,
                       holes: bool = False) -> tuple[Orders, Figures]:
    """The best lowering of ``block`` for ``spec.costs``, by longest rank span, then
    makespan (ties keep the earlier): the building-block pipeline
    (:func:`.building_block.schedule_from_block`), the reference runtime's slot reorder
    (:func:`.v_reorder_periods.reorder_orders`), and each with its W's re-placed to fill idle
    time (:func:`.w_refill.refill_weights`) under the unit peak bound, kept only when its
    peak under ``spec.memory`` is no higher than the first two's; with ``holes``, the
    winner then goes through the hole-filling pass (:func:`.hole_fill.fill_holes`, under
    the unit peak bound), kept on the same terms. Returns the per-rank orders and their
    :func:`~pipeoffload.passes.steady_timing.steady_figures` under ``spec.costs`` and
    ``spec.memory`` (every winner was timed so before it won).

    Each candidate is compared by three figures of its timing
    (:func:`~pipeoffload.passes.steady_timing.steady_figures`: those of ``simulate``'s timeline, without
    building it, the periodic steady state shifted where that is exact), and only the
    winner becomes a Schedule (for hole filling). The candidates are
    :class:`~pipeoffload.passes.steady_timing.PeriodicOrders` (orders on fewer microbatches
    and where the missing periods go in), timed
    (:func:`~pipeoffload.passes.steady_timing.periodic_figures`) and refilled
    (:func:`.w_refill.refill_periodic`) on the short orders where that is proved the same;
    only the winner is expanded.

    Guarantees: per-rank peak at most :func:`unit_peak_bound` units (unit accounting,
    any costs); the longest span is no longer than either of the first two lowerings'."""
    p, m = spec.p, spec.m
    pl = block.placement
    caps = [unit_peak_bound(name, p)] * p
    ops = op_table(pl, m)  # one tuple per op, shared by every candidate's orders
    # Each candidate is held as its orders on fewer microbatches and where the missing
    # periods go in (PeriodicOrders), timed and refilled there; only the winner is expanded.
    first = base_lowering(periodic_from_block, block, m, ops)
    # Costs the short runs cannot shift under: each candidate expanded once, as it is timed on m
    plain = not exact_costs(pl, spec.costs, spec.memory, first.n_ops())
    if plain:
        first = PeriodicOrders.plain(first.expand(ops))
    figures = list(periodic_figures(pl, m, first, spec.costs, spec.memory))
    if _at_bounds(figures, pl, m, spec):
        return first.expand(ops), tuple(figures)  # no candidate could be strictly better, and ties keep the earlier
    second = base_lowering(reorder_periodic, block, m, ops)
    if plain:
        second = PeriodicOrders.plain(second.expand(ops))
    figures2 = list(periodic_figures(pl, m, second, spec.costs, spec.memory))
    best = _Best(first, figures, max(figures[0], figures2[0]))
    best.offer(second, figures2[1], figures2[2], lambda: figures2)
    inputs = [first, second]
    del first, second  # from here only ``best`` and the refills' next input stay alive
    while inputs:
        # A run refill_periodic leaves out would repeat the one before it: equal figures
        # never win (ties keep the earlier). Its tracker timed it with the timing pass's
        # engine: span and makespan are known; the peak (under spec.memory) is found only
        # if it could win.
        for cand, span, makespan, _ in refill_periodic(pl, m, inputs.pop(0), spec.costs, MemoryDeltas(), caps):
            best.offer(cand, span, makespan, lambda o=cand: periodic_figures(pl, m, o, spec.costs, spec.memory))
    # fill_holes times the whole order once, then each trial move: when its budget cannot
    # time one trial (6·p·m ops, e.g. p = 64, m = 512), it returns the winner unchanged.
    if holes and 2 * best.orders.n_ops() <= HOLE_BUDGET:
        # The pass only keeps strictly better orders, so the winner can only improve.
        winner = build_schedule(name, m, pl, best.orders.expand(ops), p=p, m=m, v=2)
        filled = fill_holes(winner, spec.costs, MemoryDeltas(), caps)
        if filled is not winner:
            orders = [[(o.kind, o.stage, o.microbatch) for o in r] for r in filled.ranks]
            fig = steady_figures(pl, m, orders, spec.costs, spec.memory)
            best.offer(PeriodicOrders.plain(orders), fig[1], fig[2], lambda: fig)
    return best.orders.expand(ops), best.figures


class _Best:
    """The winner so far among :func:`_lower_block`'s candidates, offered in turn: the
    shortest longest span, then makespan (ties keep the earlier), among those whose peak
    is within ``cap`` (the first two candidates' highest). A candidate's peak is asked
    only when it would beat the best so far: the others cannot win whatever their peak.
    Losers are dropped as they come (each candidate's orders are held on ``m'`` microbatches
    where the short runs prove it, else on ``m``: 3 M ops at p = 128, m = 4096).
    ``figures``: the winner's ``(peak, span, makespan)`` by ``steady_figures``."""

    def __init__(self, orders: PeriodicOrders, figures: Sequence[float], cap: float) -> None:
        self.orders, self.key, self.cap = orders, (figures[1], figures[2]), cap
        self.figures: Figures = tuple(figures)

    def offer(self, orders: PeriodicOrders, span: float, makespan: float,
              figures: Callable[[], Sequence[float]]) -> None:
        """Keep ``orders`` if it beats the winner on ``span``, then ``makespan``, and its
        peak (``figures()[0]``, asked only then) is within the cap."""
        eps = 1e-9 * max(1.0, span)
        if not (span < self.key[0] - eps or (abs(span - self.key[0]) <= eps and makespan < self.key[1] - eps)):
            return
        fig = tuple(figures())
        if fig[0] > self.cap * (1 + 1e-9) + 1e-12:
            return
        self.orders, self.key, self.figures = orders, (span, makespan), fig


def _at_bounds(figures: list, pl: Placement, m: int, spec: ScheduleSpec) -> bool:
    """Whether a candidate's ``[peak, longest span, makespan]`` is at the two lower bounds
    no order goes below (:func:`.zb_auto.lower_bounds`: the busiest rank's compute, the
    latest end of a rank's compute started as early as its inputs allow). Then no later
    candidate of :func:`_lower_block` (nor hole filling) can be strictly better, and it wins
    within any cap holding its own peak — as V-ZB's first lowering does at equal costs
    from ``m ≥ 2p`` on."""

    span, makespan = lower_bounds(Tracker(pl, m, spec.costs, spec.memory, float("inf")), pl, m)
    return figures[1] <= span and figures[2] <= makespan


def v_min(spec: ScheduleSpec) -> Schedule:
    """V-Min: peak ``(p+4)//3`` units (≈ ⅓ of 1F1B's), bubble ≈ ⅔ of 1F1B's.

    Cost: :data:`LOWERING_COST`, with hole filling (capped by its work budget)."""
    _check(spec)
    return _from_block("v-min", spec, holes=True)


def v_half(spec: ScheduleSpec) -> Schedule:
    """V-Half: peak ``(p+2)//2`` units (≈ ½ of 1F1B's), bubble ≈ ½ of 1F1B's.

    Cost: :data:`LOWERING_COST`, with hole filling (capped by its work budget)."""
    _check(spec)
    return _from_block("v-half", spec, holes=True)


def v_zb(spec: ScheduleSpec) -> Schedule:
    """V-ZB: 1F1B's peak (``p`` units), bubble ≈ 0.

    Cost: :data:`LOWERING_COST`, without hole filling."""
    _check(spec)
    return _from_block("v-zb", spec)
