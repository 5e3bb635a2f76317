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
``B(s)``). The reorder's scan and the op table's rows run in C where :mod:`pipeoffload._engine`
is built (the same moves, tests/test_engine_c_loops.py), else in Python; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from functools import lru_cache
from heapq import heappop, heappush
import weakref
from typing import Mapping, Sequence

from ..errors import ScheduleError
from ..ir import Op, OpKind, Placement, Schedule, build_schedule
from ..passes.steady_timing import PeriodicOrders
from ..native import c_engine
from ..passes.timing import dependencies

#: An op of the block: (kind, layer group). Kinds are F, B and W.
BlockOp = tuple[OpKind, int]
#: One cell of a slot grid: (kind, layer group, microbatch).
Cell = tuple[OpKind, int, int]
#: ``(period, lo, hi)``: the grid holds, at slot ``u + period`` of every rank, what it
#: holds at ``u`` with the microbatch one higher, for ``lo <= u`` and ``u + period < hi``.
Steady = tuple[int, int, int]

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
        #: Slots :func:`reorder` wrote by shifting a period it proved to repeat.
        self.skipped = 0
        #: The periodic scan of the last :func:`reorder` with ``steady`` (None without).
        self.skip: _PeriodSkip | None = None
        #: The op tuples the cells are (:func:`repeat` with ``ops``), for the cells it writes.
        self.ops: OpTable | None = None

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
        return list(accumulate(0 if c is None else _DELTA[c[0]] for c in self.cells[rank]))

    def peaks(self) -> list[int]:
        return [max([0] + self.memory(r)) for r in range(self.placement.num_ranks)]

    def orders(self) -> list[list[Cell]]:
        return [[c for c in row if c is not None] for row in self.cells]


#: Chunk activations each kind adds.
_DELTA = {_F: 1, _B: 0, _W: -1}


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


#: For each (kind, layer group), its cells ``(kind, layer group, j)`` by microbatch ``j``:
#: the op tuples that orders built with it share (:func:`op_table`).
OpTable = Mapping[BlockOp, Sequence[Cell]]


class _OpTable(dict):
    """:func:`op_table`'s dict (a subclass only so that :data:`_TABLES` can refer to it weakly)."""


#: The op tables alive now, by (layer groups, m): while a caller holds one, :func:`op_table`
#: hands out the same (V-auto holds its table across V-Min's and V-Half's lowerings).
_TABLES: weakref.WeakValueDictionary[tuple[int, int], _OpTable] = weakref.WeakValueDictionary()


def op_table(placement: Placement, m: int) -> dict[BlockOp, list[Cell]]:
    """Every op's cell of ``m`` microbatches on ``placement``, one tuple per op, by (kind,
    layer group) and microbatch: orders built from it (:func:`orders_from_block`,
    :func:`.v_reorder_periods.reorder_orders`) hold these tuples instead of each making its own
    (at p = 128, m = 4096, 3.1 M tuples, about 225 MB per order).

    The table is read, never written, by its users: while one for the same layer groups
    and ``m`` is still alive (someone holds it), that one is returned instead of a new
    one — equal tuples, so the same orders; 0.06 s a table at p = 64, m = 512. Nothing
    keeps a table alive but its holders."""
    key = (placement.num_stages, m)
    table = _TABLES.get(key)
    if table is None:
        row = getattr(c_engine(), "op_row", None)  # in C where built: the same tuples
        table = _OpTable(((k, s), row(k, s, m) if row is not None else [(k, s, j) for j in range(m)])
                         for k in (_F, _B, _W) for s in range(placement.num_stages))
        _TABLES[key] = table
    return table


def repeat(block: BuildingBlock, m: int, ops: OpTable | None = None) -> SlotGrid:
    """Step 1: the block repeated ``m`` times, microbatch ``j`` shifted by ``j·period``
    (the cells ``ops``' tuples when given)."""
    base = min(block.slots.values())
    last = max(block.slots.values())
    T = block.period
    grid = SlotGrid(block.placement, m, last - base + 1 + T * max(m - 1, 0))
    grid.ops = ops
    pos = grid.pos
    for (k, s), t in block.slots.items():
        # One op's copies at once: slots t−base, +T, +2T, ... (unique modulo T per rank).
        o = t - base
        copies = list(ops[k, s][:m]) if ops is not None else [(k, s, j) for j in range(m)]
        grid.cells[block.placement.rank_of(s)][o:o + T * m:T] = copies
        pos.update(zip(copies, range(o, o + T * m, T)))
    return grid


def reorder(grid: SlotGrid, peaks: Sequence[int] | None = None, steady: Steady | None = None) -> SlotGrid:
    """Step 2, in place: each op, in time order, to its earliest free slot after its
    dependencies, unless moving an F there would take its rank above ``peaks``
    (default: the grid's own per-rank peaks). Never raises a rank's peak.

    ``steady`` (:func:`steady_range`, given by :func:`orders_from_block` for a grid just
    built by :func:`repeat`) promises that the grid as given is periodic there; the
    scan then skips the periods it proves repeat (:class:`_PeriodSkip`), with the same
    result as without it.

    Cost: O(p·v·m) ops, each moved with a scan of its rank's memory levels between its
    inputs and its slot, O(m) in the worst case: O(p·v·m²) byte operations, done in C
    (the levels are a bytearray per rank, searched with ``rfind`` and shifted with
    ``translate``) when every level fits a byte; in Python otherwise. With ``steady`` (and
    byte levels) the scan stops once the steady state repeats — after the warm-up, about a
    block's length per rank, O(p·v·L) slots for a block of L slots — and the rest costs
    O(p·v·m) list and dict writes, plus the cool-down's scan."""
    pl = grid.placement
    S = pl.num_stages
    mem = [grid.memory(r) for r in range(pl.num_ranks)]
    peaks = list(peaks) if peaks is not None else [max([0] + lvl) for lvl in mem]
    if max(peaks, default=0) < 255 and all(0 <= min(lvl, default=0) and max(lvl, default=0) < 255 for lvl in mem):
        return _reorder_bytes(grid, peaks, [bytearray(lvl) for lvl in mem], steady)
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


def _reorder_bytes(grid: SlotGrid, peaks: list[int], mem: list[bytearray], steady: Steady | None = None) -> SlotGrid:
    """:func:`reorder`'s loop with each rank's levels as bytes (all in 0..254): the
    stretch below the peak is found with one ``rfind`` over a map of "at or above the
    peak", a move's level change is one ``translate`` of the slots it crosses. The
    moves never raise a level above its rank's peak nor lower it below 0 (a W follows its
    F), so the levels stay bytes; the decisions are :func:`reorder`'s. With ``steady``,
    the periods proved to repeat are skipped (:class:`_PeriodSkip`). The scan runs in C
    where :mod:`pipeoffload._engine` is built (``reorder_bytes``: the same moves, levels and
    skip, tests/test_engine_c_loops.py), else in Python (:func:`_reorder_bytes_py`)."""
    pl = grid.placement
    S = pl.num_stages
    skip = _PeriodSkip(grid, mem, steady) if steady is not None else None
    loop = getattr(c_engine(), "reorder_bytes", None)
    kinds = (_F, _B, _W)
    if loop is None or loop(grid.cells, grid.pos, mem, [min(max(pk, 0), 256) for pk in peaks],
                            [tuple(kinds.index(dk) * S + ds for dk, ds in _dep_kinds(k, s, S))
                             for k in kinds for s in range(S)], kinds, S, grid.m, skip) is None:
        _reorder_bytes_py(grid, peaks, mem, skip)
    if skip is not None:
        grid.skipped = skip.skipped
        grid.skip = skip  # its outcome (at, window, after_lb) for reduced_grid
        skip.grid, skip.mem = None, None  # type: ignore[assignment]  # done with them: no grid ↔ skip cycle left for the collector
    return grid


def _reorder_bytes_py(grid: SlotGrid, peaks: list[int], mem: list[bytearray], skip: "_PeriodSkip | None") -> None:
    """:func:`_reorder_bytes`'s scan in Python (where the C one is not built or declines)."""
    pl = grid.placement
    S, p = pl.num_stages, pl.num_ranks
    at_peak = [bytes(1 if b >= min(max(pk, 0), 256) else 0 for b in range(256)) for pk in peaks]
    cells, pos = grid.cells, grid.pos
    # Each (kind, layer group)'s inputs (:func:`_dep_cells`, without a list per op).
    inputs = {(k, s): _dep_kinds(k, s, S) for k in (_F, _B, _W) for s in range(S)}
    t, length = 0, grid.length
    while t < length:
        if skip is not None and t % skip.period == 0:
            t = skip.boundary(t)
            done = skip.done  # a new list at each boundary
        for r in range(p):
            row = cells[r]
            cell = row[t]
            if cell is None:
                continue
            kind, stage, j = cell
            lb = pos[(kind, stage, j - 1)] + 1 if j > 0 else 0
            for dk, ds in inputs[kind, stage]:
                u = pos[(dk, ds, j)] + 1
                if u > lb:
                    lb = u
            if skip is not None:  # record the scanned op and the earliest slot its decision reads
                done.append((r, cell))
                if lb < skip.min_lb:
                    skip.min_lb = lb
                if lb < skip.after_lb:
                    skip.after_lb = lb
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
                row[t] = None  # grid.take and grid.put, inline: slot q is free and in the row
                row[q] = cell
                pos[cell] = q
                if kind is _F:
                    mem[r][q:t] = mem[r][q:t].translate(_UP)
                elif kind is _W:
                    mem[r][q:t] = mem[r][q:t].translate(_DOWN)
        t += 1


def steady_range(block: BuildingBlock, m: int) -> Steady:
    """Where :func:`repeat`'s grid of ``block`` repeated ``m`` times is periodic
    (:data:`Steady`): from the block's last slot (every op of the block has started) up
    to the first slot of the last copy (none has run out of microbatches)."""
    base = min(block.slots.values())
    return block.period, max(block.slots.values()) - base, block.period * (m - 1) + 1


class _PeriodSkip:
    """The periodic steady state of :func:`_reorder_bytes` on a repeated block.

    The scan's decision for the op at slot ``t`` reads only its inputs' slots, and the
    levels and cells of its rank from ``lb`` (after its latest input) to ``t``; cells at
    ``t`` and later are still the repeated grid's. So if, at period boundaries ``a − T``
    and ``a``, the last ``L`` slots of every rank hold the same cells (microbatches one
    higher, slots ``T`` later) and the same levels, every ``lb`` of the period between
    was at least ``a − T − L``, and the grid from ``a − T`` on is periodic, then the
    period from ``a`` makes the same moves shifted by ``T`` and ends in the same state
    shifted again: by induction every period up to the end of the periodic range does.
    Those periods are written at once (each op of the proved period shifted ``k``
    periods goes where it went, ``k·T`` later) and the scan resumes after them. When the
    check fails at a boundary the scan just goes on; the result is the plain scan's."""

    def __init__(self, grid: SlotGrid, mem: list[bytearray], steady: Steady) -> None:
        self.grid, self.mem = grid, mem
        self.period, self.lo, self.hi = steady
        # The window: a block's length and two periods, as far back as an input is looked for.
        self.window = steady[1] + 1 + 2 * steady[0]
        self.snap: tuple[int, list[list[Cell | None]], list[bytes]] | None = None
        self.done: list[tuple[int, Cell]] = []  # (rank, cell) scanned since the last boundary
        self.min_lb = 0
        self.skipped = 0  # slots written by shifting (for the tests)
        #: The boundary of the skip (at most one: it runs to the end of the periodic range)
        #: and the earliest slot an op scanned after it read (:func:`_orders_reduced`).
        self.at: int | None = None
        self.after_lb = 0

    def boundary(self, a: int) -> int:
        """At period boundary ``a`` (slots before it scanned): the slot to go on from."""
        T, L = self.period, self.window
        prev, done, min_lb = self.snap, self.done, self.min_lb
        self.snap, self.done, self.min_lb = None, [], a
        if a < L or a - T < self.lo or a + 2 * T > self.hi:
            return a
        self.snap = (a, [row[a - L:a] for row in self.grid.cells], [bytes(lv[a - L:a]) for lv in self.mem])
        if prev is None or prev[0] != a - T or min_lb <= a - T - L or not self._same(prev, self.snap):
            return a
        periods = (self.hi - T - a) // T + 1  # the periods from a whose grid repeats the one before
        self.snap, self.min_lb = None, a + periods * T
        self.at, self.after_lb = a, a + periods * T
        return self._shift(a, periods, done)

    def _same(self, old: tuple, new: tuple) -> bool:
        """Whether window ``new`` is window ``old`` one period on."""
        if old[2] != new[2]:
            return False
        for ro, rn in zip(old[1], new[1]):
            for co, cn in zip(ro, rn):
                if co is None or cn is None:
                    if co is not cn:
                        return False
                elif co[0] is not cn[0] or co[1] != cn[1] or co[2] + 1 != cn[2]:
                    return False
        return True

    def _shift(self, a: int, periods: int, done: list[tuple[int, Cell]]) -> int:
        """Write the ``periods`` periods from ``a`` as the proved one shifted; the levels
        are recounted from the cells. Returns the slot after them."""
        grid, T, L = self.grid, self.period, self.window
        cells, pos = grid.cells, grid.pos
        end = a + periods * T
        for row in cells:
            row[a:end] = [None] * (end - a)
        for r, (k, s, j) in done:
            row, q = cells[r], pos[(k, s, j)]
            # The op's copies j+1 .. j+periods, each period later than the one before.
            targets = slice(q + T, q + T * periods + 1, T)
            if row[targets].count(None) != periods:
                raise ScheduleError(f"building block: periodic reorder collides after slot {q} (internal error)")
            copies = (list(grid.ops[k, s][j + 1:j + periods + 1]) if grid.ops is not None
                      else [(k, s, j + n) for n in range(1, periods + 1)])
            row[targets] = copies
            pos.update(zip(copies, range(q + T, q + T * periods + 1, T)))
        for r, lv in enumerate(self.mem):
            before = lv[end - 1]
            level = lv[a - L - 1] if a - L > 0 else 0
            lv[a - L:end] = bytes(accumulate((0 if c is None else _DELTA[c[0]] for c in cells[r][a - L:end]),
                                             initial=level))[1:]
            if lv[end - 1] != before:
                raise ScheduleError("building block: periodic reorder changed a level (internal error)")
        self.skipped += end - a
        return end


def compress_cooldown(grid: SlotGrid) -> SlotGrid:
    """Step 3: re-slot every rank's ops after its last forward, in place.

    Slot by slot, a rank runs its first ready B (in grid order), else its first ready
    W. No forward remains, so memory only falls: the rank's peak is unchanged.

    Cost: O(n log n) for the ``n`` tail ops (each made ready once, when its last input is
    placed, then kept in its rank's heap by grid order), plus one step per slot at which
    some rank runs an op. An op is ready at slot ``t`` when every input sits before
    ``t``; an op placed at ``t`` is visible from ``t + 1`` (ops of one slot are chosen
    before any is placed). tests/test_periodic_reorder.py keeps the slot-by-slot scan
    of every rank and compares."""
    pl = grid.placement
    p, S = pl.num_ranks, pl.num_stages
    pos = grid.pos
    tails: list[list[Cell]] = []
    start: list[int] = []
    for r in range(p):
        row = grid.cells[r]
        last_f = len(row) - 1
        while last_f >= 0 and (row[last_f] is None or row[last_f][0] is not _F):
            last_f -= 1
        tail = [c for c in row[last_f + 1:] if c is not None]
        for c in tail:
            grid.take(c)
        tails.append(tail)
        start.append(last_f + 1)
    where = {c: (r, i) for r, tail in enumerate(tails) for i, c in enumerate(tail)}
    need: dict[Cell, int] = {}  # inputs not yet placed (tail ops)
    after: dict[Cell, int] = {}  # the slot after the latest input placed
    waiters: dict[Cell, list[Cell]] = {}  # tail op -> the tail ops that wait for it
    due: dict[int, list[Cell]] = {}  # slot -> the ops that become ready (and may run) there
    for c in where:
        n = at = 0
        for d in _dep_cells(c, S):
            u = pos.get(d)
            if u is None:  # taken above: a tail op
                n += 1
                waiters.setdefault(d, []).append(c)
            elif u >= at:
                at = u + 1
        need[c], after[c] = n, at
        if not n:
            due.setdefault(max(at, start[where[c][0]]), []).append(c)
    # Per rank, its ready B's and its ready W's, each a heap by grid order.
    heaps: list[tuple[list, list]] = [([], []) for _ in range(p)]
    busy: set[int] = set()  # ranks with a ready op
    left = len(where)
    t = min(start, default=0)
    while left:
        for c in due.pop(t, ()):
            r, i = where[c]
            heappush(heaps[r][c[0] is _W], (i, c))
            busy.add(r)
        if not busy:
            if not due:
                raise ScheduleError("building block: cool-down compression made no progress (internal error)")
            t = min(due)
            continue
        placed = []
        for r in busy:
            b_ready, w_ready = heaps[r]
            placed.append(heappop(b_ready if b_ready else w_ready)[1])
        busy = {r for r in busy if heaps[r][0] or heaps[r][1]}
        for c in placed:
            grid.put(c, t)
            for w in waiters.pop(c, ()):
                need[w] -= 1
                if t >= after[w]:
                    after[w] = t + 1
                if not need[w]:
                    due.setdefault(max(after[w], start[where[w][0]]), []).append(w)
        left -= len(placed)
        t += 1
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


def orders_from_block(block: BuildingBlock, num_microbatches: int, ops: OpTable | None = None) -> list[list[Cell]]:
    """:func:`schedule_from_block`'s per-rank ``(kind, layer group, microbatch)`` orders
    (repeat, reorder, compress the cool-down, read the slots in order).

    The pipeline runs on ``m' < m`` microbatches (:func:`_reduced_count`: a few periods
    past twice the block's length) when that run proves its steady state and its cool-down
    reads only the periodic range (:func:`_orders_reduced`); the ``m − m'`` missing periods
    are then inserted into its orders. Otherwise, or when ``m' ≥ m``, it runs on ``m``.
    Same orders either way. With ``ops`` (:func:`op_table` for ``m`` or more microbatches)
    the orders hold its tuples.

    Cost: on the reduced path, O(p·v·L) slots scanned (``L`` the block's length in slots,
    O(p) for the V blocks: the warm-up, two periods and the cool-down) plus O(p·v·m) tuples
    written by list comprehensions for the orders — O(p²) Python work and O(p·m) made in C
    for the V blocks; on the full path, O(p·v·m) slots, plus :func:`reorder`'s scans (the
    warm-up's and the cool-down's, the steady state shifted) and the cool-down's
    compression (each tail op's readiness found once its inputs are placed)."""
    return periodic_from_block(block, num_microbatches, ops).expand(ops)


def periodic_from_block(block: BuildingBlock, num_microbatches: int, ops: OpTable | None = None) -> PeriodicOrders:
    """:func:`orders_from_block` as the reduced run's orders and where the missing periods
    go in (:class:`~pipeoffload.passes.steady_timing.PeriodicOrders`; nothing inserted when
    the run is on all ``m``). Cost: :func:`orders_from_block`'s without the O(p·m) tuples
    written."""
    small = _reduced_count(block, num_microbatches)
    if small < num_microbatches:
        reduced = reduced_grid(block, small, ops)
        if reduced is not None:
            return _grid_periodic(reduced[0], reduced[1], block.period, num_microbatches - small)
    return PeriodicOrders.plain(_orders_full(block, num_microbatches, ops))


def _orders_full(block: BuildingBlock, m: int, ops: OpTable | None = None) -> list[list[Cell]]:
    """:func:`orders_from_block` on all ``m`` microbatches."""
    grid = repeat(block, m, ops)
    reorder(grid, steady=steady_range(block, m))
    compress_cooldown(grid)
    return grid.orders()


def _reduced_count(block: BuildingBlock, m: int) -> int:
    """The microbatches of :func:`orders_from_block`'s reduced run: the periodic scan first
    proves a period at a boundary ``a`` a little past twice the block's span ``s`` (the
    window it compares is ``s + 1 + 2T`` slots and starts after the block's last slot) and
    needs ``a + 2T`` inside the periodic range, ``T(m'−1)+1``: ``m' = ⌈2.25·s/T⌉ + 12``
    (measured first proofs for the V blocks at p = 4..64: ``a/T ≤ 2s/T + 4``)."""
    span = max(block.slots.values()) - min(block.slots.values())
    return min(m, -(-9 * span // (4 * block.period)) + 12)


def _orders_reduced(block: BuildingBlock, small: int, m: int, ops: OpTable | None = None) -> list[list[Cell]] | None:
    """:func:`orders_from_block` for ``m`` from the run on ``small < m`` microbatches, or
    None when that run does not prove what makes them equal.

    Why they are equal. The scan on ``small`` and on ``m`` microbatches read the same grid
    up to the boundary ``a`` where the periodic scan proves a period (:class:`_PeriodSkip`;
    the proof at ``a`` needs ``a + 2T`` inside the periodic range of ``small``, hence of
    ``m``), so both prove it there and write the period ``[a−T, a)`` shifted, ``K'`` and
    ``K' + m − small`` times. From ``a − T − L`` (``L`` the compared window) to the end of
    what it wrote each grid is periodic, and beyond that each is its repeated block's,
    which for ``m`` is the one for ``small`` ``m − small`` periods later, microbatches
    ``m − small`` higher. So if every op scanned after the skip reads (its ``lb``) no
    earlier than ``a − T − L``, and the cool-down's compression places only ops that,
    with their inputs, sit at or after it, both runs make the same decisions there, one
    ``m − small`` periods after the other: the orders for ``m`` are those for ``small``
    with the period ``[a−T, a)`` repeated ``m − small`` more times (microbatches one
    higher each) and everything after it ``m − small`` microbatches on."""
    reduced = reduced_grid(block, small, ops)
    return None if reduced is None else _stretch(reduced[0], reduced[1], block.period, m - small, ops)


def reduced_grid(block: BuildingBlock, small: int, ops: OpTable | None = None) -> tuple[SlotGrid, int] | None:
    """:func:`_orders_reduced`'s run on ``small`` microbatches: its finished grid and the
    slot ``cut`` of its proved period ``[cut, cut + T)`` (the orders for any larger ``m``
    are the grid's with that period repeated, :func:`_stretch`), or None when it does not
    prove what makes them equal."""
    grid = repeat(block, small, ops)
    reorder(grid, steady=steady_range(block, small))
    skip = grid.skip
    if skip is None or skip.at is None:
        return None
    T = block.period
    cut = skip.at - T  # the proved period is [cut, cut + T)
    zone = cut - skip.window  # each grid is periodic from here to the end of what the skip wrote
    if skip.after_lb < zone or _cooldown_reach(grid) < zone:
        return None
    compress_cooldown(grid)
    return grid, cut


def _cooldown_reach(grid: SlotGrid) -> int:
    """The earliest slot :func:`compress_cooldown` reads on ``grid``: the first slot after a
    rank's last forward, and the slot of every input of an op it re-places."""
    S = grid.placement.num_stages
    pos = grid.pos
    low = grid.length
    for row in grid.cells:
        last_f = len(row) - 1
        while last_f >= 0 and (row[last_f] is None or row[last_f][0] is not _F):
            last_f -= 1
        low = min(low, last_f + 1)
        for c in row[last_f + 1:]:
            if c is not None:
                for d in _dep_cells(c, S):
                    low = min(low, pos[d])
    return low


def _stretch(grid: SlotGrid, cut: int, T: int, extra: int, ops: OpTable | None = None) -> list[list[Cell]]:
    """Per-rank orders of ``grid`` with its period ``[cut, cut + T)`` repeated ``extra``
    more times (microbatches one higher each) and the ops from ``cut`` on moved ``extra``
    microbatches on (:func:`_orders_reduced`); ``ops``' tuples when given."""
    return _grid_periodic(grid, cut, T, extra).expand(ops)


def _grid_periodic(grid: SlotGrid, cut: int, T: int, extra: int) -> PeriodicOrders:
    """:func:`_stretch` as ``grid``'s orders and where the ``extra`` periods go in: after
    the period ``[cut, cut + T)``, a copy of its ops each."""
    at, per = [], []
    for row in grid.cells:
        head, period = row[:cut + T], row[cut:cut + T]
        at.append(len(head) - head.count(None))
        per.append(len(period) - period.count(None))
    return PeriodicOrders(grid.orders(), at, per, extra)
