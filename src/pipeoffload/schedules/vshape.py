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

from functools import lru_cache
from typing import Callable

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Placement, Schedule, build_schedule
from ..passes.timing import order_figures
from .hole_fill import fill_holes
from .building_block import BuildingBlock, chain_slots, orders_from_block, place_weight_grads
from .spec import ScheduleSpec
from .v_reorder import reorder_orders
from .w_refill import refill_both

__all__ = ["v_min", "v_half", "v_zb", "v_min_block", "v_half_block", "v_zb_block", "PERIOD", "unit_peak_bound"]

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
    "candidate orders over O(p·m) ops: the building-block reorder scans a rank's memory levels between an "
    "op's inputs and its slot (O(m) per op, O(p·m²) in the worst case, in C); the slot reorder re-counts a "
    "move's levels only until they meet the old ones (O(m) per op at worst, a few slots in practice); the W "
    "refills are O(p·m) each (the rerun without partial gaps is skipped when it would be the same run, e.g. "
    "at unit costs); the two base candidates and any other that could win are timed, O(p·m) each")


def _check(spec: ScheduleSpec) -> None:
    spec.no_group()
    spec.resolve_v(2, allowed=(2,))


def _from_block(name: str, spec: ScheduleSpec, holes: bool = False) -> Schedule:
    """:func:`_lower_block` of the named block, remembered: V-auto, ZB-V below p units and
    the planner ask for the same V-Min/V-Half/V-ZB lowering many times with the same
    inputs, and the lowering (W refill, hole filling) is the costly part. Each call gets
    a fresh Schedule."""
    orders = _lowered(name, spec.p, spec.m, spec.costs, spec.memory, holes)
    return build_schedule(name, spec.m, Placement.vshape(spec.p), [list(r) for r in orders], p=spec.p, m=spec.m,
                          v=2)


@lru_cache(maxsize=256)
def _lowered(name: str, p: int, m: int, costs: Costs, memory: MemoryDeltas,
             holes: bool) -> tuple[tuple[tuple[OpKind, int, int], ...], ...]:
    block = {"v-min": v_min_block, "v-half": v_half_block, "v-zb": v_zb_block}[name](p)
    orders = _lower_block(name, block, ScheduleSpec(name, p, m, costs=costs, memory=memory), holes)
    return tuple(tuple(r) for r in orders)


Orders = list[list[tuple[OpKind, int, int]]]  #: per rank, (kind, layer group, microbatch)


def _lower_block(name: str, block: BuildingBlock, spec: ScheduleSpec, holes: bool = False) -> Orders:
    """The best lowering of ``block`` for ``spec.costs``, by longest rank span, then
    makespan (ties keep the earlier): the building-block pipeline
    (:func:`.building_block.schedule_from_block`), the reference runtime's slot reorder
    (:func:`.v_reorder.reorder_orders`), and each with its W's re-placed to fill idle
    time (:func:`.w_refill.refill_weights`) under the unit peak bound, kept only when its
    peak under ``spec.memory`` is no higher than the first two's; with ``holes``, the
    winner then goes through the hole-filling pass (:func:`.hole_fill.fill_holes`, under
    the unit peak bound), kept on the same terms. Returns the per-rank orders.

    Each candidate is compared by three figures of its timing
    (:func:`~pipeoffload.passes.timing.order_figures`: those of ``simulate``'s timeline,
    without building it), and only the winner becomes a Schedule (for hole filling).

    Guarantees: per-rank peak at most :func:`unit_peak_bound` units (unit accounting,
    any costs); the longest span is no longer than either of the first two lowerings'."""
    p, m = spec.p, spec.m
    pl = block.placement
    caps = [unit_peak_bound(name, p)] * p
    base = [orders_from_block(block, m), reorder_orders(block, m)]
    cands: list[Orders] = list(base)
    timed: list[list[float | None]] = [list(order_figures(pl, m, s, spec.costs, spec.memory)) for s in base]
    for s in base:
        # A run refill_both leaves out would repeat the one before it: equal figures
        # never win (ties keep the earlier).
        for tr in refill_both(pl, m, s, spec.costs, MemoryDeltas(), caps):
            # Its tracker timed it with the timing pass's engine: span and makespan are
            # known; the peak (under spec.memory) is found only if it could win.
            cands.append(tr.order)
            timed.append([None, tr.max_span(), tr.makespan()])
    cap = max(peak for peak, _, _ in timed[:2])

    def peak(i: int) -> float:
        if timed[i][0] is None:
            timed[i][0] = order_figures(pl, m, cands[i], spec.costs, spec.memory)[0]
        return timed[i][0]

    best = _pick(timed, cap, peak)
    if holes:
        # The pass only keeps strictly better orders, so the winner can only improve.
        winner = build_schedule(name, m, pl, cands[best], p=p, m=m, v=2)
        filled = fill_holes(winner, spec.costs, MemoryDeltas(), caps)
        if filled is not winner:
            cands.append([[(o.kind, o.stage, o.microbatch) for o in r] for r in filled.ranks])
            timed.append(list(order_figures(pl, m, cands[-1], spec.costs, spec.memory)))
            best = _pick(timed, cap, peak)
    return cands[best]


def _pick(timed: list[list[float | None]], cap: float, peak: Callable[[int], float]) -> int:
    """Index of the candidate (``[peak, longest span, makespan]`` of its timing) with the
    shortest longest span, then makespan (ties keep the earlier), among those whose peak
    is within ``cap``. A peak is asked (``peak(i)``) only of a candidate that would beat
    the best so far: the others cannot win whatever their peak."""
    best, best_key = 0, None
    for i, (_, span, makespan) in enumerate(timed):
        key = (span, makespan)
        if best_key is not None:
            eps = 1e-9 * max(1.0, key[0])
            if not (key[0] < best_key[0] - eps or (abs(key[0] - best_key[0]) <= eps and key[1] < best_key[1] - eps)):
                continue
        if peak(i) > cap * (1 + 1e-9) + 1e-12:
            continue
        best, best_key = i, key
    return best


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
