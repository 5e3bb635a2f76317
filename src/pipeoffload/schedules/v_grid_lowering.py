"""A third lowering of a V building block: the unit-slot grid rules of the authors' reference
scheduler (docs/algorithms.md#210-v-auto-a-building-block-search).

The controllable-memory paper (Qi et al., 2024, "Pipeline Parallelism with Controllable
Memory", Appendix A) turns a building block into a schedule by repeating it and then
rewriting the warm-up and the cool-down on a grid of unit slots. This module follows the
rules of the authors' reference scheduler (``v_auto_schedule.py`` of
sail-sg/zero-bubble-pipeline-parallelism) step by step, so that lowering the same block
yields the same per-rank order as theirs; the code and its description are our own.

**The grid.** Each rank has a row of unit slots. A cell is empty or holds one of six
labels, one per op of a microbatch on that rank of the V placement (rank ``r`` holds
layer groups ``r`` and ``2p − 1 − r``):

====== =================================== ==============================
label  op                                  travels
====== =================================== ==============================
``F``  forward of layer group ``r``        down the ranks (``r → r + 1``)
``f``  forward of layer group ``2p−1−r``   up the ranks
``B``  backward (input) of ``2p−1−r``      down the ranks
``b``  backward (input) of ``r``           up the ranks
``W``  weight gradient of ``2p−1−r``       stays on the rank
``w``  weight gradient of ``r``            stays on the rank
====== =================================== ==============================

The ``k``-th cell of a label on a rank is microbatch ``k``. Memory counts chunk
activations: ``F``/``f`` +1, ``W``/``w`` −1.

**The rules**, in order (each a function below):

1. *repeat* the block for ``m' = max(m, 2p)`` microbatches (spare copies keep the
   warm-up rules, written for ``m ≥ 2p``, meaningful), microbatch ``j`` shifted by
   ``6j`` slots; blocks whose repeated grid holds more than ``2p`` activations are refused;
2. *squeeze*: every op as early as its dependencies and its rank's order allow;
3. *rebuild the warm-up*: everything before a rank's first ``b`` is rewritten as a run
   of ``F``, then alternating ``F f``, then ``B W f`` (or ``B W F``) triples, with at
   most ``min(i + 1, peak // 2)`` ``f`` before the first ``B`` on rank ``i``; squeeze;
4. when ``m < m'``, *drop the spare microbatches* (each label's cells beyond the
   ``m``-th); with ``m ≤ p`` and enough memory, *release warm-up W's* (move a rank's
   first W's to its end until it reaches the highest rank's peak); squeeze;
5. *rebuild the cool-down*: a rank's last ``b``'s and last ``B``'s are re-placed at
   fixed distances from rank 0's last ``f``, its trailing W's are removed and re-added
   in the first free slots after its last remaining W; squeeze;
6. *fill holes greedily*: scanning slots left to right, an empty slot takes the first
   later op of its rank that may run there (its dependencies done, no peak raised); the
   periods the sweep provably repeats are written by slices, not swept (:class:`_HoleFiller`);
7. *relabel W's*: a rank's W cells take ``W``/``w`` in the order of its ``B``/``b``.

The lowering is refused (``None``) where the authors' code refuses or fails: the repeated
grid holds more than ``2p`` activations, a rule raises the peak above the repeated
grid's, a rule cannot be applied (a slot it needs is out of the row or taken), or the
result breaks a dependency or loses an op.

Guarantees of :func:`lower_block` when it returns orders: every op of every
(layer group, microbatch) exactly once; each rank's order respects the dependencies of
:func:`pipeoffload.passes.timing.dependencies`; the highest rank's peak in chunk
activations (F +1, W −1) is at most the repeated grid's for ``max(m, 2p)`` microbatches,
which is at most the block's :func:`.building_block.steady_peak`, and at most ``2p``.
The sweeps' per-column loops, the peaks and the timing run in C where :mod:`pipeoffload._engine`
is built (the same grids and floats, tests/test_engine_c_loops.py), else in Python; no torch.

Cost: rows of ``L = O(max(m, 2p) + p)`` slots on ``p`` ranks. The squeezes (rules 2–5) and
the hole filling (rule 6) sweep the warm-up and the cool-down, O(p²) columns·ranks, and write
the periods between by slices, O(p·m) in C, once their state provably repeats
(:class:`_Squeezer`, :class:`_HoleFiller`; otherwise O(p·L) steps); the rest (rules 1, 3,
5 and 7, the peaks and the final check) is O(p·L) steps. At p = 64, m = 512:
0.93 → 0.49 s CPU under load (docs/algorithms.md §9.4), ≈ 0.25 s with the C sweeps (§9.16).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from itertools import accumulate
from typing import Mapping, Optional, Sequence

from ..errors import ParameterError
from ..ir import OpKind, Placement
from ..native import c_engine
from .building_block import BuildingBlock

__all__ = ["lower_block", "lower_grid", "grid_orders", "grid_rows", "repeated_grid", "time_grid", "PERIOD", "LABELS"]

#: The block's period: one slot for each of a rank's six ops.
PERIOD = 6
#: The six labels of a rank's ops (module docstring).
LABELS = "FfBbWw"
_EMPTY = " "
_UP = frozenset("Ff")  # labels that add an activation
_DOWN = frozenset("Ww")  # labels that free one
_DOWNWARD = frozenset("FBW")  # labels placed in a slot's first (downward) sweep

Row = list[str]
Grid = list[Row]
#: One op of a per-rank order: (kind, layer group, microbatch).
Cell = tuple[OpKind, int, int]


class _Refused(Exception):
    """A rule could not be applied; the lowering returns None."""


def _refuse(cond: bool) -> None:
    if not cond:
        raise _Refused


def _label_of(kind: OpKind, stage: int, p: int) -> str:
    """The grid label of ``kind`` on layer group ``stage`` (V placement, ``p`` ranks)."""
    first_chunk = stage < p
    if kind is OpKind.F:
        return "F" if first_chunk else "f"
    if kind is OpKind.B:
        return "b" if first_chunk else "B"
    return "w" if first_chunk else "W"


def _op_of(label: str, rank: int, p: int) -> tuple[OpKind, int]:
    """Inverse of :func:`_label_of` on ``rank``."""
    kind = {"F": OpKind.F, "f": OpKind.F, "B": OpKind.B, "b": OpKind.B, "W": OpKind.W, "w": OpKind.W}[label]
    first_chunk = label in "Fbw"
    return kind, (rank if first_chunk else 2 * p - 1 - rank)


#: Chunk activations each label adds (+1) or frees (−1).
_DELTA = {"F": 1, "f": 1, "B": 0, "b": 0, "W": -1, "w": -1, _EMPTY: 0}


def _peaks(grid: Grid) -> list[int]:
    """Per rank, the most chunk activations alive at once along its row (in C where built)."""
    loop = getattr(c_engine(), "grid_peaks", None)
    if loop is not None and type(grid) is list:
        return loop(grid)
    return [max(0, max(accumulate(map(_DELTA.__getitem__, row)), default=0)) for row in grid]


def grid_rows(grid: Grid) -> list[str]:
    """The grid as one string per rank (empty slots as spaces): for reading and tests."""
    return ["".join(row) for row in grid]


# ---------------------------------------------------------------------------- rule 1
def repeated_grid(block: BuildingBlock, copies: int) -> Grid:
    """The block repeated ``copies`` times, copy ``j`` shifted by ``j · PERIOD`` slots
    (rule 1 without its checks). Every cross-rank input of an op sits in an earlier slot."""
    _check(block, max(copies, 1))
    p = block.placement.num_ranks
    base = min(block.slots.values())
    last = max(block.slots.values())
    length = last - base + 1 + PERIOD * copies
    grid: Grid = [[_EMPTY] * length for _ in range(p)]
    for (kind, stage), t in block.slots.items():
        r = block.placement.rank_of(stage)
        label = _label_of(kind, stage, p)
        for j in range(copies):
            grid[r][t - base + PERIOD * j] = label
    return grid


# ---------------------------------------------------------------------------- rule 2
def _squeeze(grid: Grid, m: int, skip: bool = True) -> Grid:
    """Every op as early as its rank's order and its cross-rank dependency allow.

    Slots are visited left to right; in each slot the downward labels (F, B, W) are
    placed rank 0 first, then the upward ones (f, b, w) rank p−1 first, so a dependency
    on the previous rank in the sweep is already placed. An op whose dependency is not
    placed yet cannot be squeezed: the lowering is refused.

    With ``skip``, periods the sweep provably repeats are written, not swept
    (:class:`_Squeezer`); the result is the same either way (tests/test_grid_fill_skip.py)."""
    sq = _Squeezer(grid, m)
    sq.run(skip)
    return [row[:max(sq.nxt)] for row in sq.out]


class _Squeezer:
    """The sweep of :func:`_squeeze` over the input columns, and its period skip.

    What the sweep does at an input column reads the column, each rank's next free output
    slot, counts compared with each other (a missing dependency is a count no higher than
    the index asked), and the output slots of dependencies placed but not yet consumed by
    the next rank. So when, at a period boundary ``t``, those (slots less ``t``, counts
    less one reference count) equal their values 6 columns earlier and the input repeats
    with period 6 over the next ``K`` periods, those periods place exactly what the last
    one did, 6 slots on, one microbatch on (induction over the periods); ``K`` keeps every
    count within ``m`` and every slot within the row."""

    def __init__(self, grid: Grid, m: int) -> None:
        self.p, self.m = len(grid), m
        self.cols = list(zip(*grid))
        self.length = len(self.cols)
        self.out: Grid = [[_EMPTY] * self.length for _ in range(self.p)]
        self.count = [dict.fromkeys(LABELS, 0) for _ in range(self.p)]
        # where[r][label][j]: the squeezed slot of microbatch j's op `label` on rank r
        self.where = [{c: [-1] * m for c in LABELS} for _ in range(self.p)]
        self.nxt = [0] * self.p
        self.order = list(range(self.p)) + list(range(self.p - 1, -1, -1))  # downward labels first
        self.skipped = 0  #: periods written by the skip

    def run(self, skip: bool) -> None:
        """Sweep every input column; with ``skip``, write the periods the class docstring proves."""
        t, snap, prev_nxt = 0, None, None
        # A state is taken at one boundary and compared at the next; after a failed
        # comparison the next try waits twice as long (up to 16 periods): the state settles
        # after the warm-up, and building it at every boundary would cost what the skip saves.
        next_try, gap = 2 * PERIOD, PERIOD
        while t < self.length:
            if skip and t % PERIOD == 0 and next_try <= t < self.length - 8 * PERIOD:
                sig = self._signature(t) if self.cols[t - PERIOD:t] == self.cols[t - 2 * PERIOD:t - PERIOD] else None
                k = self._periods(t) if sig is not None and sig == snap else 0
                if k > 0:
                    self._write(prev_nxt, k)
                    t += k * PERIOD
                    snap = None
                    continue
                if snap is not None or sig is None:
                    snap, gap = None, min(2 * gap, 16 * PERIOD)
                    next_try = t + gap
                else:
                    snap, prev_nxt = sig, self.nxt[:]
            self._column(t)
            t += 1

    def _column(self, t: int) -> None:
        """Sweep input column ``t``: each op in the first free slot after its dependency. In C
        where :mod:`pipeoffload._engine` is built (``squeeze_column``: the same slots, counts
        and refusals), else :meth:`_column_py`."""
        loop = getattr(c_engine(), "squeeze_column", None)
        if loop is None:
            return self._column_py(t)
        if not loop(self, t):
            raise _Refused

    def _column_py(self, t: int) -> None:
        """:meth:`_column` in Python."""
        p, m, length, last = self.p, self.m, self.length, self.p - 1
        count, where, nxt, out = self.count, self.where, self.nxt, self.out
        col = self.cols[t]
        for n, r in enumerate(self.order):
            c = col[r]
            if c == _EMPTY or (c in _DOWNWARD) != (n < p):
                continue
            j = count[r][c]
            if j >= m:
                raise _Refused
            slot = nxt[r]
            if c == "F" or c == "B":
                if r > 0:
                    dep = where[r - 1][c][j]
                    if dep < 0:
                        raise _Refused
                    if dep >= slot:
                        slot = dep + 1
                elif c == "B" and where[r]["f"][j] < 0:
                    raise _Refused
            elif c == "f" or c == "b":
                if r < last:
                    dep = where[r + 1][c][j]
                    if dep < 0:
                        raise _Refused
                    if dep >= slot:
                        slot = dep + 1
                elif where[r]["F" if c == "f" else "B"][j] < 0:
                    raise _Refused
            if slot >= length:
                raise _Refused
            out[r][slot] = c
            count[r][c] = j + 1
            where[r][c][j] = slot
            nxt[r] = slot + 1

    def _signature(self, t: int) -> tuple:
        """Per rank: next slot less ``t``, counts less rank 0's ``F`` count, and the slots less
        ``t`` of its ops the neighbour that depends on them has not yet placed."""
        ref, count, where, p = self.count[0]["F"], self.count, self.where, self.p
        sig = []
        for r in range(p):
            pending = []
            for c in LABELS:
                user = r + 1 if c in "FB" else r - 1 if c in "fb" else None
                if user is not None and 0 <= user < p:
                    pending.append(tuple(x - t for x in where[r][c][count[user][c]:count[r][c]]))
            sig.append((self.nxt[r] - t, tuple(n - ref for n in count[r].values()), tuple(pending)))
        return tuple(sig)

    def _periods(self, t: int) -> int:
        """How many periods from column ``t`` the skip may write (0: none)."""
        cols, end = self.cols, t
        while end < self.length and cols[end] == cols[end - PERIOD]:
            end += 1
        k = (end - t) // PERIOD
        for r in range(self.p):
            k = min(k, (self.length - self.nxt[r]) // PERIOD)
            for c, n in self.count[r].items():
                per = sum(1 for col in cols[t - PERIOD:t] if col[r] == c)
                if per:
                    k = min(k, (self.m - n) // per)
        return max(k, 0)

    def _write(self, prev_nxt: list[int], k: int) -> None:
        """Write ``k`` periods as copies of the last one (output slots ``prev_nxt[r]`` on)."""
        for r in range(self.p):
            row, a, b = self.out[r], prev_nxt[r], self.nxt[r]
            last = row[a:b]
            row[b:b + k * PERIOD] = last * k
            _record_repeats(last, b, k, self.count[r], self.where[r])
            self.nxt[r] = b + k * PERIOD
        self.skipped += k


# ---------------------------------------------------------------------------- rule 3
def _rebuild_warmup(grid: Grid, m: int) -> Grid:
    """Rewrite everything before each rank's first ``b``, in place.

    With ``P = min(peak, 2p)``, rank ``i`` keeps its counts of F, f, B and W before its
    first b and re-lays them from slot ``i``: ``2(p−1−i)`` slots of F, then ``i + 1``
    pairs (F, f), then (B, W, f-or-F) triples, never more than ``min(P − min(i+1, P//2), m)``
    F's nor ``min(i+1, P//2, m)`` f's in the first two parts. A slot the run skips keeps
    what it held; the run overwrites what lies past the first b."""
    p = len(grid)
    top = min(max(_peaks(grid)), 2 * p)
    for i in range(p):
        row = grid[i]
        want_ff = min(i + 1, top // 2, m)
        want_f = min(top - want_ff, m)
        n = dict.fromkeys("FfBW", 0)
        for t, c in enumerate(row):
            if c == "b":
                break
            _refuse(c in n or c == _EMPTY)
            if c != _EMPTY:
                n[c] += 1
            row[t] = _EMPTY
        used = dict.fromkeys("FfBW", 0)

        def put(t: int, label: str) -> None:
            _refuse(t < len(row))
            row[t] = label
            used[label] += 1

        t = i
        for _ in range(2 * (p - 1 - i)):
            if used["F"] < want_f and used["F"] < n["F"]:
                put(t, "F")
            t += 1
        for _ in range(i + 1):
            if used["F"] < want_f and used["F"] < n["F"]:
                put(t, "F")
            t += 1
            if used["f"] < want_ff and used["f"] < n["f"]:
                put(t, "f")
            t += 1
        while any(used[c] < n[c] for c in "FfBW"):
            if used["B"] < n["B"]:
                put(t, "B")
            t += 1
            if used["W"] < n["W"]:
                put(t, "W")
            t += 1
            if used["f"] < n["f"]:
                _refuse(used["f"] < used["F"])
                put(t, "f")
            elif used["F"] < n["F"]:
                put(t, "F")
            t += 1
    return grid


# ---------------------------------------------------------------------------- rule 4
def _drop_spares(grid: Grid, m: int) -> Grid:
    """Empty each label's cells beyond its ``m``-th on every rank, in place."""
    for row in grid:
        seen = dict.fromkeys(LABELS, 0)
        for t, c in enumerate(row):
            if c == _EMPTY:
                continue
            if seen[c] >= m:
                row[t] = _EMPTY
            else:
                seen[c] += 1
    return grid


def _release_warmup_weights(grid: Grid, top: int) -> Grid:
    """With few microbatches a rank's early W's free memory it does not need: move a
    rank's first W's (in order) to its end until its peak would reach ``top``. Every
    row grows by ``top − (lowest rank's peak)`` slots."""
    peaks = _peaks(grid)
    pad = top - min(peaks)
    for i, row in enumerate(grid):
        moved: list[str] = []
        for t, c in enumerate(row):
            if peaks[i] + len(moved) >= top:
                break
            if c in _DOWN:
                _refuse(len(moved) < pad)
                moved.append(c)
                row[t] = _EMPTY
        row.extend(moved + [_EMPTY] * (max(pad, 0) - len(moved)))
    return grid


# ---------------------------------------------------------------------------- rule 5
def _at(row: Row, t: int) -> int:
    """A slot index as Python reads it (a negative one counts from the end); refused
    when out of the row."""
    _refuse(-len(row) <= t < len(row))
    return t % len(row)


def _rebuild_cooldown(grid: Grid, m: int) -> Grid:
    """Re-place each rank's last backwards and trailing W's, then squeeze.

    With ``P`` the highest peak, rank ``i`` takes out its last ``min(i+1, P − nb)`` B's
    and last ``nb = min((P+1)//2, m)`` b's, then trailing W/w cells (from the end) until
    it has taken at least as many W as B, as many w as b and ``P`` in all. Anchored at
    rank 0's last ``f`` (slot ``s``), the k-th b goes to ``s − i + 2p − 2k`` (which must
    be free) and the k-th B to ``s + 1 + i − 2k``. The W's then fill, in B-then-b order
    of what is owed, the free slots after the rank's last remaining W; what is left is
    appended."""
    p = len(grid)
    top = max(_peaks(grid))
    _refuse(top <= 2 * p)
    max_bb = min((top + 1) // 2, m)
    max_b = min(top - max_bb, m)
    anchor = -1
    for i, row in enumerate(grid):
        n_b = n_bb = n_w = n_ww = 0
        last_ff = -1
        want_b = min(i + 1, max_b)
        for t in range(len(row) - 1, -1, -1):
            c = row[t]
            if last_ff >= 0 and n_b >= want_b and n_bb >= max_bb:
                break  # (from here on the walk would change nothing: the row's start is left unread)
            if c == "f" and last_ff == -1:
                last_ff = t
            if c == "B" and n_b < i + 1 and n_b < max_b:
                row[t] = _EMPTY
                n_b += 1
            if c == "b" and n_bb < max_bb:
                row[t] = _EMPTY
                n_bb += 1
        for t in range(len(row) - 1, -1, -1):
            if n_w >= n_b and n_ww >= n_bb and n_w + n_ww >= top:
                break
            if row[t] == "W":
                row[t] = _EMPTY
                n_w += 1
            elif row[t] == "w":
                row[t] = _EMPTY
                n_ww += 1
        if i == 0:
            anchor = last_ff
        for k in range(n_bb):
            t = _at(row, anchor - i + 2 * p - 2 * k)
            _refuse(row[t] == _EMPTY)
            row[t] = "b"
        for k in range(n_b):
            row[_at(row, anchor + 1 + i - 2 * k)] = "B"
    length = 0
    for row in grid:
        last_w = len(row) - 1
        while last_w >= 0 and row[last_w] not in _DOWN:
            last_w -= 1
        # What is owed after the last W: up to it nothing is written, so counted in C.
        head = row[:last_w + 1]
        owed_w, owed_ww = head.count("B") - head.count("W"), head.count("b") - head.count("w")
        for t in range(last_w + 1, len(row)):
            c = row[t]
            if c == "B":
                owed_w += 1
            elif c == "b":
                owed_ww += 1
            elif c == "W":
                owed_w -= 1
            elif c == "w":
                owed_ww -= 1
            elif c == _EMPTY:
                if owed_w > 0:
                    row[t] = "W"
                    owed_w -= 1
                elif owed_ww > 0:
                    row[t] = "w"
                    owed_ww -= 1
        row.extend(["W"] * max(owed_w, 0) + ["w"] * max(owed_ww, 0))
        length = max(length, len(row))
    for row in grid:
        row.extend([_EMPTY] * (length - len(row)))
    return _squeeze(grid, m)


# ---------------------------------------------------------------------------- rule 6
#: Slots of each rank's row ahead of the sweep that the hole filler's period skip compares
#: (:class:`_HoleFiller`): twelve periods (the look-ahead reaches about 35 slots at p = 64).
_FRONT = 12 * PERIOD


def _fill_holes(grid: Grid, m: int, skip: bool = True) -> Grid:
    """Fill empty slots greedily, in place, without raising the highest peak.

    Slots are visited left to right, ranks 0..p−1 in each. An empty slot looks ahead
    on its rank at the first later cell of each label (one that still occurs later than
    the slot in the original grid) and takes the first that may run there: its
    dependencies are in earlier slots, and a forward does not lift the rank's memory,
    over the slots it jumps, to the peak.

    With ``skip``, periods the sweep provably repeats are written, not swept
    (:class:`_HoleFiller`); the grid is the same either way (tests/test_grid_fill_skip.py)."""
    _HoleFiller(grid, m).run(skip)
    return grid


def _record_repeats(last: list, start: int, k: int, cnt: dict, wh: dict) -> None:
    """Positions of ``k`` copies of the period ``last`` written from slot ``start``: for each
    label, its ``where`` list gains them in order and its ``count`` grows by ``k`` times its
    cells in the period (extended-slice writes, O(k) in C per cell)."""
    for c in set(last) - {_EMPTY}:
        offs = [o for o, x in enumerate(last) if x == c]
        j, n = cnt[c], len(offs)
        for q, o in enumerate(offs):  # the q-th of the period's n cells c, k times
            wh[c][j + q:j + k * n:n] = range(start + o, start + o + k * PERIOD, PERIOD)
        cnt[c] = j + k * n


class _HoleFiller:
    """The sweep of :func:`_fill_holes`, one slot column at a time, and its period skip.

    What the sweep does at a column ``t`` reads: each rank's row from ``t`` on (its cell,
    the look-ahead), its level, and counts — its own and its neighbours' — compared with
    each other (a dependency ``where[r±1][c][j] < t`` holds exactly when rank ``r±1``
    had more than ``j`` cells ``c`` before column ``t``), besides constants (the peak,
    ``m``, each label's last slot in the original grid). So the state at a column
    boundary is, per rank, its level, its counts less one reference count, and its row
    ahead. If that state at ``t`` equals the one at ``t − 6`` over a front of
    :data:`_FRONT` slots, the last period's reads stayed inside its front, no move so
    far took a cell from ``t + _FRONT − 6`` on (the rest of each row is the original
    grid) and the original grid repeats with period 6 over the next ``K`` periods past
    the front, then the next ``K`` periods sweep exactly as the last one did, six slots
    on each time (by induction: the same reads give the same moves, and the front six
    slots on is the old front's first part moved as before followed by original cells
    that repeat): their columns are the last period's, their cells' positions its
    positions plus multiples of 6, and the row ahead is the front as it is now. ``K``
    also keeps every label's last slot in the original grid past the front and every
    count below ``m``, so no constant the sweep compares changes."""

    def __init__(self, grid: Grid, m: int) -> None:
        self.grid, self.m, self.p = grid, m, len(grid)
        self.top = max(_peaks(grid))
        self.length = len(grid[0])
        self.last_at = []
        for row in grid:
            # Each label's last slot (-1: none), and the last empty slot's when there is one.
            last = dict.fromkeys(LABELS, -1)
            rev = row[::-1]
            for c in LABELS + _EMPTY:
                if c in rev:
                    last[c] = len(row) - 1 - rev.index(c)
            self.last_at.append(last)
        self.last_op = [max(last[c] for c in LABELS) for last in self.last_at]
        self.level = [0] * self.p
        self.count = [dict.fromkeys(LABELS, 0) for _ in range(self.p)]
        self.where = [{c: [-1] * m for c in LABELS} for _ in range(self.p)]
        self.skipped = 0  #: periods written by the skip

    def run(self, skip: bool) -> None:
        """Sweep every column; with ``skip``, write the periods the class docstring proves."""
        t, far, reach, snap = 0, -1, -1, None  # far: the furthest slot read; reach: since the last boundary
        breaks: list[list[int]] | None = None  # made when first asked (the original rows)
        while t < self.length:
            if skip and t % PERIOD == 0 and 2 * PERIOD <= t < self.length - 4 * _FRONT:
                # (Not tried where the row left is too short to gain.) The state is built only
                # once the last two periods' columns agree (cheap).
                sig = self._signature(t) if self._repeats(t) else None
                k = 0
                if sig is not None and sig == snap and far < t - PERIOD + _FRONT:
                    breaks = breaks or self._breaks(t)
                    k = self._periods(t, breaks)
                if k > 0:
                    self._write(t, k)
                    t += k * PERIOD
                    far = max(far, reach + k * PERIOD)
                    snap, reach = None, -1
                    continue
                snap, reach = sig, -1
            r = self._column(t)
            reach, far = max(reach, r), max(far, r)
            t += 1

    def _repeats(self, t: int) -> bool:
        """Whether every row's last period (before ``t``) equals the one before it."""
        return all(row[t - PERIOD:t] == row[t - 2 * PERIOD:t - PERIOD] for row in self.grid)

    def _column(self, t: int) -> int:
        """Sweep column ``t`` on every rank; the furthest slot read. In C where
        :mod:`pipeoffload._engine` is built (``hole_column``: the same moves, counts, levels and
        refusals), else :meth:`_column_py`."""
        loop = getattr(c_engine(), "hole_column", None)
        if loop is None:
            return self._column_py(t)
        reach = loop(self, t)
        if reach is None:
            raise _Refused
        return reach

    def _column_py(self, t: int) -> int:
        """:meth:`_column` in Python."""
        grid, m, p, top = self.grid, self.m, self.p, self.top
        count, where, level, last_at = self.count, self.where, self.level, self.last_at
        length = self.length
        reach = t
        for i in range(p):
            row = grid[i]
            c = row[t]
            if c != _EMPTY:
                j = count[i][c]
                if j >= m:
                    raise _Refused
                count[i][c] = j + 1
                where[i][c][j] = t
                level[i] += _DELTA[c]
                continue
            if t >= self.last_op[i]:
                continue  # nothing of this rank lies later
            wanted = {x for x in LABELS if last_at[i][x] > t}
            delta = rise = 0
            k = t
            for k in range(t + 1, length):
                if not wanted:
                    break
                c = row[k]
                delta += _DELTA[c]
                rise_before = rise
                if delta > rise:
                    rise = delta
                if c == _EMPTY or c not in wanted:
                    continue
                wanted.discard(c)
                if c in _UP and level[i] + rise_before >= top:
                    continue
                j = count[i][c]
                _refuse(j < m)
                if c in "FB":
                    if i > 0:
                        if not 0 <= where[i - 1][c][j] < t:
                            continue
                    elif c == "B" and count[i]["f"] <= j:
                        continue
                elif c in "fb":
                    if i < p - 1:
                        if not 0 <= where[i + 1][c][j] < t:
                            continue
                    elif count[i]["F" if c == "f" else "B"] <= j:
                        continue
                elif count[i]["B" if c == "W" else "b"] <= j:
                    continue
                row[t], row[k] = c, _EMPTY
                count[i][c] = j + 1
                where[i][c][j] = t
                level[i] += _DELTA[c]
                break
            if k > reach:
                reach = k
        return reach

    def _signature(self, t: int) -> tuple:
        """Per rank: level, counts less rank 0's ``F`` count, the row's next :data:`_FRONT` slots."""
        ref = self.count[0]["F"]
        return tuple((self.level[i], tuple(n - ref for n in self.count[i].values()), "".join(row[t:t + _FRONT]))
                     for i, row in enumerate(self.grid))

    def _breaks(self, t: int) -> list[list[int]]:
        """Per rank, the original row's slots ``x ≥ t + _FRONT`` with a different cell 6 slots back,
        then the row's end (sorted). Read at the first skip: no move has yet taken a cell from
        ``t + _FRONT − 6`` on, so those slots are the original grid's."""
        lo = t + _FRONT
        return [[x for x in range(lo, len(row)) if row[x] != row[x - PERIOD]] + [len(row)] for row in self.grid]

    def _periods(self, t: int, breaks: list[list[int]]) -> int:
        """How many periods from column ``t`` the skip may write (0: none)."""
        lo = t + _FRONT
        end = min(min(last.values()) for last in self.last_at) - _FRONT  # each label's last slot past the front
        for b in breaks:
            i = bisect_left(b, lo)
            end = min(end, b[i] if i < len(b) else lo)  # the original repeats on [lo, end)
        k = (end - t - _FRONT) // PERIOD if end >= lo else 0
        for i, row in enumerate(self.grid):
            cnt = self.count[i]
            for c in LABELS:
                n = row[t - PERIOD:t].count(c)
                if n:
                    k = min(k, (self.m - 1 - cnt[c]) // n)
        return max(k, 0)

    def _write(self, t: int, k: int) -> None:
        """Write ``k`` periods from column ``t`` as copies of the last one, then the front."""
        for i, row in enumerate(self.grid):
            last = row[t - PERIOD:t]
            front = row[t:t + _FRONT]
            row[t:t + k * PERIOD] = last * k
            row[t + k * PERIOD:t + k * PERIOD + _FRONT] = front
            _record_repeats(last, t, k, self.count[i], self.where[i])
        self.skipped += k


# ---------------------------------------------------------------------------- rule 7
def _relabel_weights(grid: Grid, m: int) -> Grid:
    """Each rank's W cells, in order, take ``W`` or ``w`` in the order of its B/b cells."""
    for row in grid:
        seen = dict.fromkeys(LABELS, 0)
        for c in row:
            if c != _EMPTY:
                seen[c] += 1
        _refuse(all(seen[c] == m for c in LABELS))
        owed: deque[str] = deque()
        for t, c in enumerate(row):
            if c == "B":
                owed.append("W")
            elif c == "b":
                owed.append("w")
            elif c in _DOWN:
                _refuse(bool(owed))
                row[t] = owed.popleft()
    return grid


def _dependencies_hold(grid: Grid, m: int) -> bool:
    """Every label ``m`` times on every rank and every op after its dependencies (in C where
    built: the same answer)."""
    loop = getattr(c_engine(), "grid_dependencies_hold", None)
    if loop is not None and type(grid) is list:
        return loop(grid, m)
    p = len(grid)
    at = [{c: [-1] * m for c in LABELS} for _ in range(p)]
    for i, row in enumerate(grid):
        seen = dict.fromkeys(LABELS, 0)
        for t, c in enumerate(row):
            if c == _EMPTY:
                continue
            if seen[c] >= m:
                return False
            at[i][c][seen[c]] = t
            seen[c] += 1
        if any(seen[c] != m for c in LABELS):
            return False
    for i in range(p):
        a = at[i]
        for j in range(m):
            if a["B"][j] >= a["W"][j] or a["b"][j] >= a["w"][j]:
                return False
            if i == 0 and a["f"][j] >= a["B"][j]:
                return False
            if i == p - 1 and (a["F"][j] >= a["f"][j] or a["B"][j] >= a["b"][j]):
                return False
            if 0 < i < p - 1 and (at[i - 1]["F"][j] >= a["F"][j] or at[i - 1]["B"][j] >= a["B"][j]
                                  or at[i + 1]["f"][j] >= a["f"][j] or at[i + 1]["b"][j] >= a["b"][j]):
                return False
    return True


# ---------------------------------------------------------------------------- driver
def lower_grid(block: BuildingBlock, m: int, release_weights: Optional[bool] = None) -> Optional[Grid]:
    """Rules 1–7 on ``block`` for ``m`` microbatches: the final grid, or None when refused.

    ``release_weights`` says whether rule 4 releases warm-up W's when ``m ≤ p`` (the
    authors do so when ``2m`` chunk activations fit their memory limit); default: yes."""
    p = _check(block, m)
    spare = max(m, 2 * p)
    try:
        grid = repeated_grid(block, spare)
        first_peak = max(_peaks(grid))
        if first_peak > 2 * p:
            return None
        grid = _squeeze(grid, spare)
        grid = _squeeze(_rebuild_warmup(grid, spare), spare)
        top = max(_peaks(grid))
        if top > first_peak:
            return None
        if m < spare:
            _drop_spares(grid, m)
            if m <= p and (release_weights is None or release_weights):
                _release_warmup_weights(grid, min(2 * p, top))
            grid = _squeeze(grid, m)
            first_peak = max(_peaks(grid))
        grid = _relabel_weights(_fill_holes(_rebuild_cooldown(grid, m), m), m)
        if max(_peaks(grid)) > first_peak or not _dependencies_hold(grid, m):
            return None
    except _Refused:
        return None
    return grid


def lower_block(block: BuildingBlock, m: int, release_weights: Optional[bool] = None) -> Optional[list[list[Cell]]]:
    """Lower ``block`` for ``m`` microbatches by the grid rules (module docstring).

    Returns per-rank orders of ``(kind, layer group, microbatch)`` for
    :func:`pipeoffload.ir.build_schedule` with ``Placement.vshape(p)``, or None when the
    rules refuse the block. ``release_weights``: see :func:`lower_grid`.

    Raises :class:`~pipeoffload.errors.ParameterError` (``block``) unless the block has the
    V placement and period :data:`PERIOD`, or (``m``) unless ``m ≥ 1``."""
    grid = lower_grid(block, m, release_weights)
    return None if grid is None else grid_orders(grid)


def grid_orders(grid: Sequence[Sequence[str]]) -> list[list[Cell]]:
    """Per-rank ``(kind, layer group, microbatch)`` orders of a grid (rows of labels; the
    ``k``-th cell of a label on a rank is microbatch ``k``)."""
    p = len(grid)
    out: list[list[Cell]] = []
    for r, row in enumerate(grid):
        seen = dict.fromkeys(LABELS, 0)
        order: list[Cell] = []
        for c in row:
            if c == _EMPTY:
                continue
            kind, stage = _op_of(c, r, p)
            order.append((kind, stage, seen[c]))
            seen[c] += 1
        out.append(order)
    return out


def _check(block: BuildingBlock, m: int) -> int:
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ParameterError("m", f"must be an integer >= 1, got {m!r}")
    pl = block.placement
    p = pl.num_ranks
    if block.period != PERIOD or pl.num_stages != 2 * p or any(
            pl.stages_of(r) != Placement.vshape(p).stages_of(r) for r in range(p)):
        raise ParameterError("block", f"the grid rules need a V-placement block (2 layer groups per rank, "
                                      f"rank r holding r and 2p-1-r) with period {PERIOD}; got period "
                                      f"{block.period} on {pl.num_stages} layer groups over {p} ranks")
    return p


def time_grid(grid: Sequence[Sequence[str]], durations: Sequence[Mapping[OpKind, float]], comm: float,
              deltas: Sequence[Mapping[OpKind, float]]) -> tuple[float, float, float]:
    """Time a grid's per-rank orders (a final or a repeated grid) with real costs, as the timing pass would.

    ``durations[s][kind]`` and ``deltas[s][kind]`` are per layer group (as
    :meth:`~pipeoffload.costs.Costs.duration_table` and
    :meth:`~pipeoffload.costs.MemoryDeltas.delta_table` give them). Every op starts when
    its rank is free and its cross-rank input has arrived (``comm`` later); in such a
    grid every input sits in an earlier slot, so one sweep over the slots is a valid
    order. Returns (longest rank span, makespan, highest rank peak): the first two are
    :func:`pipeoffload.passes.timing.simulate`'s ``max(spans())`` and ``makespan``."""
    p = len(grid)
    # per rank and label: (duration, memory delta, rank of the cross-rank input or -1)
    info = []
    for r in range(p):
        row_info = {}
        for c in LABELS:
            kind, stage = _op_of(c, r, p)
            src = r - 1 if c in "FB" and r > 0 else (r + 1 if c in "fb" and r < p - 1 else -1)
            row_info[c] = (durations[stage][kind], deltas[stage][kind], src)
        info.append(row_info)
    loop = getattr(c_engine(), "time_grid", None)
    if loop is not None and isinstance(comm, float):  # in C where built: the same floats
        got = loop([row if isinstance(row, str) else "".join(row) for row in grid],
                   [info[r][c][0] for r in range(p) for c in LABELS], [info[r][c][1] for r in range(p) for c in LABELS],
                   [info[r][c][2] for r in range(p) for c in LABELS], comm)
        if got is not None:
            return got
    ends = [{c: [] for c in LABELS} for _ in range(p)]  # ends[r][label][j]: end of microbatch j
    clock = [0.0] * p
    first = [-1.0] * p
    level = [0.0] * p
    top = [0.0] * p
    for col in zip(*grid):
        for r, c in enumerate(col):
            if c == _EMPTY:
                continue
            d, dm, src = info[r][c]
            done = ends[r][c]
            start = clock[r]
            if src >= 0:
                arrive = ends[src][c][len(done)] + comm
                if arrive > start:
                    start = arrive
            if first[r] < 0:
                first[r] = start
            end = start + d
            done.append(end)
            clock[r] = end
            lv = level[r] + dm
            level[r] = lv
            if lv > top[r]:
                top[r] = lv
    spans = [clock[r] - first[r] for r in range(p)]
    return max(spans), max(clock) - min(first), max(top)
