"""The building-block method of controllable-memory schedules (docs/algorithms.md#28-the-building-block-method).

A *building block* gives the unit-slot offset of every op of one microbatch on every
rank (one slot per F, B or W of one chunk). The schedule is built in four steps:

1. **repeat** the block ``m`` times, microbatch ``j`` shifted by ``j * period`` slots;
   slots modulo the period never collide, so the steady state is dense;
2. **reorder**: scan the ops in time order and move each to its earliest free slot
   after its dependencies when that does not raise its rank's peak (F +1, W −1 chunk
   units; B and W never raise it);
3. **compress the cool-down**: after a rank's last forward no op can raise its
   memory, so its remaining ops are re-slotted as early as their dependencies allow,
   backward-for-input (B) before weight-gradient (W) ops — the zero-bubble rule that
   W waits while the critical B chain moves. (The reference scheduler reorganises its
   cool-down as well; this simpler rule reproduces its published V-Half numbers,
   leaves V-Min's bubble unchanged and takes V-ZB's to 0 at unit costs);
4. **lower** to per-rank op orders, which the timing pass times with the real costs.

A block's *lifespan* on a rank (a chunk's F to the end of its W) bounds memory: the
steady-state peak of a rank is the number of chunk activations alive at once,
:func:`steady_peak`. Steps 2–3 never raise a rank's peak above the repeated grid's,
so the generated schedule's per-rank peak (in chunk units, any costs) is at most
:func:`steady_peak` of its block.

The method is generic over the placement: dependencies are the timing pass's
(``F(s)`` after ``F(s−1)``, ``B(s)`` after ``B(s+1)`` and ``F(s)``, ``W(s)`` after
``B(s)``). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from ..errors import ScheduleError
from ..ir import Op, OpKind, Placement, Schedule, build_schedule
from ..passes.timing import dependencies

#: An op of the block: (kind, layer group). Kinds are F, B and W.
BlockOp = tuple[OpKind, int]
#: One cell of a slot grid: (kind, layer group, microbatch).
Cell = tuple[OpKind, int, int]

_F, _B, _W = OpKind.F, OpKind.B, OpKind.W


@dataclass(frozen=True)
class BuildingBlock:
    """Slot offsets of one microbatch's F, B and W ops on every rank.

    ``slots[(kind, stage)]`` is the unit slot of that op (on the rank that holds
    ``stage``). Guarantees after construction: every layer group has one F, B and W;
    each op sits after its dependencies; no two ops of one rank share a slot modulo
    ``period``, so repeating the block every ``period`` slots never collides.
    """

    placement: Placement
    period: int
    slots: Mapping[BlockOp, int]

    def __post_init__(self) -> None:
        pl, S = self.placement, self.placement.num_stages
        for s in range(S):
            for k in (_F, _B, _W):
                if (k, s) not in self.slots:
                    raise ScheduleError(f"building block lacks {k.value}(stage={s})")
        for (k, s), t in self.slots.items():
            for dep in _dep_kinds(k, s, S):
                if self.slots[dep] >= t:
                    raise ScheduleError(
                        f"building block: {k.value}(stage={s}) at slot {t} is not after its "
                        f"dependency {dep[0].value}(stage={dep[1]}) at slot {self.slots[dep]}"
                    )
        for r in range(pl.num_ranks):
            seen: dict[int, BlockOp] = {}
            for s in pl.stages_of(r):
                for k in (_F, _B, _W):
                    phase = self.slots[(k, s)] % self.period
                    if phase in seen:
                        o = seen[phase]
                        raise ScheduleError(
                            f"building block: on rank {r}, {k.value}(stage={s}) and {o[0].value}(stage={o[1]}) "
                            f"share slot {phase} modulo the period {self.period}"
                        )
                    seen[phase] = (k, s)

    def lifespan(self, stage: int) -> int:
        """Slots from the F of ``stage`` to the end of its W."""
        return self.slots[(_W, stage)] + 1 - self.slots[(_F, stage)]


def chain_slots(placement: Placement, period: int, hop: int, turn: int = 1) -> dict[BlockOp, int]:
    """F and B slots of one microbatch's round trip, each op as early as allowed.

    The round trip is every F in layer-group order, then every B in reverse order.
    Each op goes to the first slot free modulo ``period`` on its rank that is at least
    ``hop`` slots after its predecessor when that ran on another rank, ``turn`` slots
    when on the same rank (the first op is at slot 0). W's are not placed.
    """
    if hop < 1 or turn < 1:
        raise ScheduleError(f"chain_slots: hop and turn must be >= 1, got {hop}, {turn}")
    S = placement.num_stages
    used: list[set[int]] = [set() for _ in range(placement.num_ranks)]
    slots: dict[BlockOp, int] = {}
    prev: tuple[int, int] | None = None  # (slot, rank) of the previous op
    chain = [(_F, s) for s in range(S)] + [(_B, s) for s in reversed(range(S))]
    for k, s in chain:
        r = placement.rank_of(s)
        t = 0 if prev is None else prev[0] + (turn if prev[1] == r else hop)
        if len(used[r]) >= period:
            raise ScheduleError(f"chain_slots: rank {r} has more ops than the period {period} holds")
        while t % period in used[r]:
            t += 1
        slots[(k, s)] = t
        used[r].add(t % period)
        prev = (t, r)
    return slots


def place_weight_grads(
    placement: Placement,
    period: int,
    slots: Mapping[BlockOp, int],
    delay: Mapping[int, int] | None = None,
) -> dict[BlockOp, int]:
    """Add each layer group's W to a block that has only F and B.

    Each W goes to the first slot, at least ``delay[stage]`` (default 0) slots after
    the slot following its B, that is free modulo ``period`` on its rank. Per rank the
    W's are placed in the order of their B's.
    """
    out = dict(slots)
    delay = delay or {}
    for r in range(placement.num_ranks):
        stages = placement.stages_of(r)
        used = {out[(k, s)] % period for s in stages for k in (_F, _B)}
        for s in sorted(stages, key=lambda s: out[(_B, s)]):
            t = out[(_B, s)] + 1 + delay.get(s, 0)
            while t % period in used:
                t += 1
            out[(_W, s)] = t
            used.add(t % period)
    return out


def steady_peak(block: BuildingBlock) -> list[int]:
    """Per rank, the most chunk activations alive at once when the block repeats forever.

    A chunk's activation lives from its F's slot up to (not including) its W's slot;
    with period ``T`` and lifespan ``l`` that is ``⌊l/T⌋`` or ``⌈l/T⌉`` copies at a time,
    depending on the phase. The repeated grid of any ``m`` never exceeds this.
    """
    pl, T = block.placement, block.period
    out = []
    for r in range(pl.num_ranks):
        best = 0
        for t in range(T):
            n = 0
            for s in pl.stages_of(r):
                a, e = block.slots[(_F, s)], block.slots[(_W, s)]
                n += (t - a) // T - (t - e) // T
            best = max(best, n)
        out.append(best)
    return out


class SlotGrid:
    """Per-rank unit slots, each empty or holding one op of one microbatch."""

    def __init__(self, placement: Placement, num_microbatches: int, length: int) -> None:
        self.placement = placement
        self.m = num_microbatches
        self.cells: list[list[Cell | None]] = [[None] * length for _ in range(placement.num_ranks)]
        self.pos: dict[Cell, int] = {}

    @property
    def length(self) -> int:
        return len(self.cells[0])

    def put(self, cell: Cell, slot: int) -> None:
        """Place ``cell`` at ``slot`` of its rank (the grid grows as needed)."""
        r = self.placement.rank_of(cell[1])
        row = self.cells[r]
        if slot >= len(row):
            for other in self.cells:
                other.extend([None] * (slot + 1 - len(other)))
        if row[slot] is not None:
            raise ScheduleError(f"slot grid: rank {r} slot {slot} is taken by {row[slot]}, cannot place {cell}")
        row[slot] = cell
        self.pos[cell] = slot

    def take(self, cell: Cell) -> int:
        """Remove ``cell``; return the slot it held."""
        slot = self.pos.pop(cell)
        self.cells[self.placement.rank_of(cell[1])][slot] = None
        return slot

    def memory(self, rank: int) -> list[int]:
        """Level after each slot: chunk activations alive (F +1, W −1)."""
        level, out = 0, []
        for c in self.cells[rank]:
            if c is not None:
                level += _delta(c[0])
            out.append(level)
        return out

    def peaks(self) -> list[int]:
        return [max([0] + self.memory(r)) for r in range(self.placement.num_ranks)]

    def orders(self) -> list[list[Cell]]:
        return [[c for c in row if c is not None] for row in self.cells]


def _delta(kind: OpKind) -> int:
    return 1 if kind is _F else (-1 if kind is _W else 0)


def _dep_cells(cell: Cell, num_stages: int) -> list[Cell]:
    k, s, j = cell
    out = [(dk, ds, j) for dk, ds in _dep_kinds(k, s, num_stages)]
    if j > 0:
        out.append((k, s, j - 1))  # keep each (kind, layer group)'s microbatches in order
    return out


@lru_cache(maxsize=4096)
def _dep_kinds(kind: OpKind, stage: int, num_stages: int) -> tuple[tuple[OpKind, int], ...]:
    """(kind, layer group) of each input of op ``(kind, stage, ·)``: the same for every
    microbatch, so :func:`dependencies` is asked once per op kind and layer group."""
    # dependencies() reads only kind, stage and microbatch of the op it is given.
    return tuple((OpKind(dk[0]), dk[1]) for dk in dependencies(Op(kind, stage, 0, 0, 0), num_stages))


def repeat(block: BuildingBlock, m: int) -> SlotGrid:
    """Step 1: the block repeated ``m`` times, microbatch ``j`` shifted by ``j·period``."""
    base = min(block.slots.values())
    last = max(block.slots.values())
    grid = SlotGrid(block.placement, m, last - base + 1 + block.period * max(m - 1, 0))
    for j in range(m):
        for (k, s), t in block.slots.items():
            grid.put((k, s, j), t - base + block.period * j)
    return grid


def reorder(grid: SlotGrid, peaks: Sequence[int] | None = None) -> SlotGrid:
    """Step 2, in place: each op, in time order, to its earliest free slot after its
    dependencies, unless moving an F there would take its rank above ``peaks``
    (default: the grid's own per-rank peaks). Never raises a rank's peak.

    Cost: O(p·v·m) ops, each moved with a scan of its rank's memory levels between its
    inputs and its slot, O(m) in the worst case: O(p·v·m²) byte operations, done in C
    (the levels are a bytearray per rank, searched with ``rfind`` and shifted with
    ``translate``) when every level fits a byte; in Python otherwise."""
    pl = grid.placement
    S = pl.num_stages
    peaks = list(peaks) if peaks is not None else grid.peaks()
    mem = [grid.memory(r) for r in range(pl.num_ranks)]
    if max(peaks, default=0) < 255 and all(0 <= min(lvl, default=0) and max(lvl, default=0) < 255 for lvl in mem):
        return _reorder_bytes(grid, peaks, [bytearray(lvl) for lvl in mem])
    for t in range(grid.length):
        for r in range(pl.num_ranks):
            cell = grid.cells[r][t]
            if cell is None:
                continue
            row = grid.cells[r]
            lb = 0
            for d in _dep_cells(cell, S):
                lb = max(lb, grid.pos[d] + 1)
            q = t
            if cell[0] is _F:
                # Earliest start of the stretch just before t where memory stays below the peak.
                while q > lb and mem[r][q - 1] < peaks[r]:
                    q -= 1
            else:
                q = min(lb, t)
            while q < t and row[q] is not None:
                q += 1
            if q < t:
                grid.take(cell)
                grid.put(cell, q)
                d = _delta(cell[0])
                if d:
                    lvl = mem[r]
                    for u in range(q, t):
                        lvl[u] += d
    return grid


#: Byte maps for :func:`_reorder_bytes`: each level one up / one down.
_UP = bytes((b + 1) & 255 for b in range(256))
_DOWN = bytes((b - 1) & 255 for b in range(256))


def _reorder_bytes(grid: SlotGrid, peaks: list[int], mem: list[bytearray]) -> SlotGrid:
    """:func:`reorder`'s loop with each rank's levels as bytes (all in 0..254): the
    stretch below the peak is found with one ``rfind`` over a map of "at or above the
    peak", a move's level change is one ``translate`` of the slots it crosses. The
    moves never raise a level above its rank's peak nor lower it below 0 (a W follows its
    F), so the levels stay bytes; the decisions are :func:`reorder`'s."""
    pl = grid.placement
    S, p = pl.num_stages, pl.num_ranks
    at_peak = [bytes(1 if b >= min(max(pk, 0), 256) else 0 for b in range(256)) for pk in peaks]
    cells, pos = grid.cells, grid.pos
    for t in range(grid.length):
        for r in range(p):
            row = cells[r]
            cell = row[t]
            if cell is None:
                continue
            lb = 0
            for d in _dep_cells(cell, S):
                u = pos[d] + 1
                if u > lb:
                    lb = u
            kind = cell[0]
            if kind is _F:
                q = t
                if lb < t:
                    # Earliest start of the stretch just before t where memory stays below the peak.
                    high = mem[r][lb:t].translate(at_peak[r]).rfind(1)
                    q = lb + high + 1 if high >= 0 else lb
            else:
                q = lb if lb < t else t
            while q < t and row[q] is not None:
                q += 1
            if q < t:
                grid.take(cell)
                grid.put(cell, q)
                if kind is _F:
                    mem[r][q:t] = mem[r][q:t].translate(_UP)
                elif kind is _W:
                    mem[r][q:t] = mem[r][q:t].translate(_DOWN)
    return grid


def compress_cooldown(grid: SlotGrid) -> SlotGrid:
    """Step 3: re-slot every rank's ops after its last forward, in place.

    Slot by slot, a rank runs its first ready B (in grid order), else its first ready
    W. No forward remains, so memory only falls: the rank's peak is unchanged."""
    pl = grid.placement
    p, S = pl.num_ranks, pl.num_stages
    tails: list[list[Cell]] = []
    start: list[int] = []
    for r in range(p):
        row = grid.cells[r]
        last_f = max((t for t, c in enumerate(row) if c is not None and c[0] is _F), default=-1)
        tail = [c for c in row[last_f + 1:] if c is not None]
        for c in tail:
            grid.take(c)
        tails.append(tail)
        start.append(last_f + 1)
    t = min(start)
    limit = grid.length + 2 * sum(len(x) for x in tails) * max(1, p) + 8
    while any(tails):
        placed = []
        for r in range(p):
            if t < start[r] or not tails[r]:
                continue
            pick = None
            for want_b in (True, False):
                for c in tails[r]:
                    if (c[0] is not _W) != want_b:
                        continue
                    # A dependency not yet placed reads as "at t": not done.
                    if all(grid.pos.get(d, t) < t for d in _dep_cells(c, S)):
                        pick = c
                        break
                if pick is not None:
                    break
            if pick is not None:
                placed.append((r, pick))
        # Place after scanning all ranks, so an op placed at t is visible only from t + 1.
        for r, c in placed:
            tails[r].remove(c)
            grid.put(c, t)
        t += 1
        if t > limit:
            raise ScheduleError("building block: cool-down compression made no progress (internal error)")
    return grid


def lower(name: str, grid: SlotGrid, **params: object) -> Schedule:
    """Step 4: per-rank op orders (slot order) as a :class:`Schedule`."""
    return build_schedule(name, grid.m, grid.placement, grid.orders(), **params)


def schedule_from_block(name: str, block: BuildingBlock, num_microbatches: int, **params: object) -> Schedule:
    """Repeat, reorder, compress the cool-down and lower ``block`` for ``num_microbatches``.

    Guarantees: every op of every (layer group, microbatch) exactly once; the order
    respects all dependencies (it comes from a dependency-respecting slot grid); each
    rank's peak in chunk units (F +1, W −1, any costs) is at most its
    :func:`steady_peak`."""
    return build_schedule(name, num_microbatches, block.placement, orders_from_block(block, num_microbatches),
                          **params)


def orders_from_block(block: BuildingBlock, num_microbatches: int) -> list[list[Cell]]:
    """:func:`schedule_from_block`'s per-rank ``(kind, layer group, microbatch)`` orders
    (repeat, reorder, compress the cool-down, read the slots in order).

    Cost: O(p·v·m) slots, plus :func:`reorder`'s scans."""
    grid = repeat(block, num_microbatches)
    reorder(grid)
    compress_cooldown(grid)
    return grid.orders()
