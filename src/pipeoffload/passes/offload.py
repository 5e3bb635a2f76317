"""Offload pass: add activation offload/reload transfers to a timed schedule (PipeOffload).

Input: a :class:`~pipeoffload.ir.Schedule` and its :class:`~pipeoffload.timeline.Timeline`
from :func:`pipeoffload.passes.timing.simulate` (the compute ops carry their memory
deltas). Output: a new Schedule whose per-rank lists also hold OFFLOAD_START/END and
RELOAD_START/END ops, and a new Timeline whose transfer events run on the "d2h"/"h2d"
streams and carry memory deltas, so ``Timeline.memory_curve``/``peak_memory`` show
the effect directly (docs/algorithms.md#63-the-offload-pass).

What is offloaded (selective offload)
    Chunk ``c`` of every rank for ``c < C``: the earliest layer groups, which live
    longest. One transfer moves the whole activation a chunk's F keeps for one
    microbatch (the F event's memory delta, ``a``).

Memory accounting
    F still allocates ``a`` at its start. OFFLOAD_END (copy done) frees ``a``;
    RELOAD_START allocates the device buffer (``+a``) when the host→device copy
    begins; B/W then free exactly what they freed before (B the part it frees, W the
    rest). The deltas sum to zero per (chunk, microbatch) with no change to the
    compute ops, and the device-resident intervals are a subset of the
    no-offload ones, so the peak never rises. With instantaneous transfers a reload
    lands exactly at its B's start: the activation is resident from F start to F end
    and from B start to W end only.

Host link model (documented choice; the reference cuts time into fixed slots instead)
    Ranks are grouped ``link_group`` at a time onto one host link (default pairs
    ``2r, 2r+1``; an odd last rank has a link of its own). A link carries at most one
    transfer per direction (d2h, h2d) at a time; the ranks sharing a link queue for
    it. One one-way transfer of chunk ``c`` takes ``d_c = offload_time × (F+B+W of
    c)`` (or an absolute time per layer group) while the link's other direction is
    busy, and ``solo_factor × d_c`` (0.7 in the reference) when it is idle for the
    whole transfer. Transfers are *planned* at the shared rate ``d_c`` (an upper
    bound); afterwards each one whose other direction stays idle throughout is
    shortened in place (an offload ends earlier, a reload starts later), which keeps
    every planned ordering and deadline valid and only lowers memory.

Placement rules
    Two heuristics plan every candidate's copies; the better plan is kept (complete
    first, then shorter makespan, lower highest peak, lower summed peaks):
    *value* takes candidates by chunk (earliest first), then lifespan (longest
    first), giving each offload the earliest free d2h time after its F and each
    reload the latest free h2d time that ends by its B and starts after the offload,
    so the plan for C chunks is the plan for C−1 plus transfers fitted into its gaps;
    *deadline* serves each direction of a link by non-preemptive earliest deadline
    first (offloads forwards from the F ends, reloads backwards from the B starts),
    which packs a busy link better. An offload that saves nothing (F end → B start no
    longer than its round trip ``2 d_c``, or a zero memory share) is skipped and
    counted. A reload that cannot finish before its B makes the request infeasible:
    by default :class:`ParameterError` names the largest feasible ``C``;
    ``on_infeasible="skip"`` drops those offloads instead (counted as "link_busy");
    ``"delay"`` lets the B wait for the reload and re-times the compute ops (the
    makespan may grow), re-planning until no reload is late.

Auto
    ``auto=True`` plans every C from 0 to the number of chunks (in "skip" mode unless
    told otherwise) and keeps, among the plans whose makespan is within
    ``tolerance`` of the no-offload makespan, the one with the lowest highest peak
    (then lowest summed peaks, then fewer chunks). Offloading more is not always
    better on a busy link: short-lived chunks take link time the long-lived ones
    needed.

Limit mode
    ``mem_limit=L`` asks for every rank's peak ≤ L instead of the lowest peak at the
    schedule's own times: where a copy cannot free memory in time, the op that
    allocates waits (a forward until its rank's next offload copy ends, a backward as
    long as its reload needs), the compute ops are re-timed with those waits and the
    copies planned again, per placement heuristic, until no rank is above L; the plan
    with the shortest makespan is kept (ParameterError naming ``mem_limit`` when no
    heuristic gets there). Each rank's order is unchanged; the makespan may grow. It is
    the heuristic the exact scheduler (:mod:`pipeoffload.solver`) starts from and is
    compared with (docs/solver.md).

In "skip" mode the plan for C chunks is never worse than the plan for fewer (the best
of C, C−1, …, 1 is kept; the pairs left on the device counted as "no_gain").

Optional: ``postpone_warmup`` moves every warm-up forward (one before its rank's first
backward) as late as the next op on its rank and its consumers allow, shortening
lifespans; the makespan and every rank's order are unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from itertools import accumulate
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple, Sequence

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError
from ..ir import ALL_KINDS, WINDOW_KINDS, Op, OpKind, RankOps, Schedule
from ..timeline import _TIME_ORDER, ALLOC, FREE, Change, EventColumns, TimedOp, Timeline, _clean, memory_sweep
from .timing import completion_key, dependents, run_list_schedule, simulate

__all__ = [
    "LinkModel", "Transfer", "OffloadOptions", "OffloadResult", "OffloadSession", "plan_offload",
    "largest_feasible_chunks",
    "host_memory_curve", "host_memory_curves", "offload_from_slots", "offload_peak_floor", "offload_bounds",
]

_EPS = 1e-9
_MAX_RETIMES = 100
_MAX_LIMIT_WAITS = 200  #: the limit mode's rounds of waits per placement heuristic
_LIMIT_STRETCH = 2.0  #: the limit mode gives a heuristic up once its makespan passes this × the original
_INFEASIBLE_MODES = ("error", "skip", "delay")
#: Skip reasons reported in ``OffloadResult.skipped``.
SKIP_SHORT = "short_lifespan"  #: F end → B start no longer than the round trip: saves nothing
SKIP_EMPTY = "no_memory"  #: the chunk's F keeps nothing
SKIP_LINK = "link_busy"  #: on_infeasible="skip": the reload could not finish before its B
#: on_infeasible="skip": left on the device because the plan without its chunk had a lower peak
SKIP_GAIN = "no_gain"



@dataclass(frozen=True)
class LinkModel:
    """Ranks ``[k·group, (k+1)·group)`` share host link ``k`` (the last link may hold fewer).

    ``solo_factor``: duration multiplier of a transfer while the link's other
    direction is idle (0 < solo_factor ≤ 1; 1 = no speed-up).
    """

    group: int = 2
    solo_factor: float = 0.7

    def __post_init__(self) -> None:
        if not isinstance(self.group, int) or isinstance(self.group, bool) or self.group < 1:
            raise ParameterError("link_group", f"ranks per host link must be an integer >= 1, got {self.group!r}")
        if not (math.isfinite(self.solo_factor) and 0 < self.solo_factor <= 1):
            raise ParameterError("solo_factor", f"must be in (0, 1], got {self.solo_factor!r}")

    def link_of(self, rank: int) -> int:
        return rank // self.group

    def ranks_of(self, link: int, num_ranks: int) -> range:
        return range(link * self.group, min((link + 1) * self.group, num_ranks))


@dataclass
class Transfer:
    """One offloaded (layer group, microbatch): its D2H copy and its H2D copy."""

    rank: int
    stage: int
    chunk: int
    microbatch: int
    amount: float  #: activation memory moved (the F's delta)
    offload_start: float
    offload_end: float
    reload_start: float
    reload_end: float
    backward_start: float  #: start of the B (or BW) that needs the activation; of the W, for a stash
    link: int
    #: "activation" (the activation window, F→B) or "stash" (the stash window, B→W: what only W needs).
    window: str = "activation"


@dataclass(frozen=True)
class OffloadOptions:
    """The offload pass's settings (the keyword arguments of :func:`plan_offload` after
    the timeline), as one value a caller can build, store and pass on."""

    offload_chunks: int | None = None
    auto: bool = False
    offload_time: float = 0.0
    transfer_times: tuple[float, ...] | None = None
    link_group: int = 2
    solo_factor: float = 0.7
    tolerance: float = 0.01
    on_infeasible: str | None = None
    postpone_warmup: bool | None = None
    stash: bool = False
    mem_limit: float | None = None

    def kwargs(self) -> dict:
        """As keyword arguments of :func:`plan_offload`."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if out["transfer_times"] is not None:
            out["transfer_times"] = list(out["transfer_times"])
        return out

    def summary(self, on_infeasible: str) -> dict:
        """What a result reports of these settings (``OffloadResult.settings``):
        ``on_infeasible`` as resolved, ``offload_time`` None where ``transfer_times``
        overrides it; ``offload_chunks`` is the result's own ``offloaded_chunks``."""
        out = self.kwargs()
        del out["offload_chunks"]
        out["auto"], out["stash"], out["on_infeasible"] = bool(self.auto), bool(self.stash), on_infeasible
        if self.mem_limit is None:  # reported only when the limit mode was asked for
            del out["mem_limit"]
        if self.transfer_times is not None:
            out["offload_time"] = None
        return out


@dataclass
class OffloadResult:
    """What :func:`plan_offload` produced. Peaks and host memory are per rank."""

    schedule: Schedule
    timeline: Timeline
    offloaded_chunks: int  #: C: chunks c < C of every rank were selected (docs/glossary.md)
    transfers: list[Transfer]
    skipped: dict[str, int]
    delayed: int  #: backward ops that start later than without offload
    peak_no_offload: list[float]
    peak: list[float]
    host_memory: list[float]
    makespan_no_offload: float
    makespan: float
    settings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready description (the CLI's ``offload`` block)."""
        base = self.makespan_no_offload
        return {
            "chunks": self.offloaded_chunks,  # the JSON key stays "chunks"
            **self.settings,
            "transfers": len(self.transfers),
            "skipped": dict(self.skipped),
            "delayed_backwards": self.delayed,
            "makespan_no_offload": _clean(base),
            "makespan": _clean(self.makespan),
            "makespan_increase": _clean(self.makespan / base - 1.0) if base > 0 else 0.0,
            "peak_memory_no_offload": list(self.peak_no_offload),
            "peak_memory": list(self.peak),
            "host_memory": list(self.host_memory),
        }

    @property
    def chunks(self) -> int:
        """Deprecated name of :attr:`offloaded_chunks` (C; ``Schedule.chunks`` is v). Warns."""
        import warnings

        warnings.warn("OffloadResult.chunks is deprecated; use OffloadResult.offloaded_chunks (C)",
                      DeprecationWarning, stacklevel=2)
        return self.offloaded_chunks


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


def plan_offload(
    schedule: Schedule, timeline: Timeline | None = None, *,
    costs: Costs | None = None, memory: MemoryDeltas | None = None, memory_unit: str = "units",
    offload_chunks: int | None = None, auto: bool = False, offload_time: float = 0.0,
    transfer_times: Sequence[float] | None = None, link_group: int = 2, solo_factor: float = 0.7,
    tolerance: float = 0.01, on_infeasible: str | None = None, postpone_warmup: bool | None = None,
    comm: float | None = None, stash: bool = False, mem_limit: float | None = None,
    options: OffloadOptions | None = None,
) -> OffloadResult:
    """Plan selective activation offload (PipeOffload) on a timed schedule.

    Args:
        schedule: compute ops per rank (a validated schedule).
        timeline: ``schedule`` timed by :func:`~pipeoffload.passes.timing.simulate`; when
            omitted, timed here with ``costs`` and ``memory`` (defaults: unit costs,
            +1/0/−1) in ``memory_unit``, and ``comm`` defaults to ``costs.comm``.
        offload_chunks: C, offload chunk ``c`` of every rank for ``c < C`` (default: all
            chunks; with ``auto``, the most to consider).
        auto: choose C (module docstring) within a makespan ``tolerance`` (a fraction).
        offload_time: one one-way transfer of one chunk's activations for one
            microbatch, as a multiple of that chunk's F+B+W time (0 = instantaneous).
        transfer_times: per layer group, absolute, in the timeline's time unit
            (overrides ``offload_time``).
        link_group: ranks per host link; ``solo_factor``: duration multiplier of a
            transfer whose link's other direction is idle.
        on_infeasible: "error" (default with explicit C), "skip" (default with
            ``auto``) or "delay".
        postpone_warmup: True postpones warm-up forwards, False does not, None
            (default) plans both ways and keeps the better plan (postponing only when
            re-timing with ``comm`` reproduces the timeline).
        comm: the cross-rank latency the timeline was simulated with, needed to
            re-time ("delay", ``postpone_warmup``).
        stash: also offload, between each B and its W, what only W still needs (the
            stash window, STASH_* ops; split-backward schedules only); off by default,
            and the program is then exactly as without it.
        mem_limit: the limit mode: every rank's activation peak at most this (in the
            timeline's memory unit), compute ops made to wait where the copies cannot
            free memory in time (a forward until its rank's next offload copy ends, a
            backward for its reload), so the makespan may grow; chunks as ``offload_chunks``;
            not with ``auto`` or ``on_infeasible`` (module docstring, "Limit mode").
        options: all of the settings above as one :class:`OffloadOptions` (what the
            CLI, the runtime's configuration and :func:`~pipeoffload.passes.lower.lower`
            pass); given, the individual keywords must keep their defaults.

    Returns:
        :class:`OffloadResult`: the schedule with its transfer ops, its timeline, the
        chosen C, the transfers, per-rank peaks with and without offload, host memory
        and makespans.

    Raises:
        ParameterError: naming the keyword argument (e.g. ``offload_chunks``) for bad
            settings or an infeasible C (with the largest feasible one); ``mem_limit``
            when no plan keeps every rank within it.

    Guarantees:
        The inputs are not modified; compute ops keep their times unless a B is delayed
        ("delay") or warm-up forwards are postponed (later F starts only); every
        offloaded (chunk, microbatch) has exactly one of each transfer op, with
        OFFLOAD_START ≤ OFFLOAD_END ≤ RELOAD_START ≤ RELOAD_END ≤ its B's start (strict
        when the transfer time is positive); only chunks ``c < C`` are offloaded; copies
        of one direction never overlap on one link; unless a B was delayed, every
        rank's peak ≤ its no-offload peak; with ``mem_limit``, every rank's peak ≤
        ``mem_limit`` and each (kind, layer group)'s and each rank's order unchanged.
    """
    o = _one_options(options, OffloadOptions(
        offload_chunks=offload_chunks, auto=auto, offload_time=offload_time, transfer_times=transfer_times,
        link_group=link_group, solo_factor=solo_factor, tolerance=tolerance, on_infeasible=on_infeasible,
        postpone_warmup=postpone_warmup, stash=stash, mem_limit=mem_limit))
    schedule, timeline, comm = _timed_inputs(schedule, timeline, costs, memory, memory_unit, comm)
    return _plan_in(_context(schedule, timeline, o, comm), o)


def _context(schedule: Schedule, timeline: Timeline, o: OffloadOptions, comm: float) -> "_Context":
    ctx = _Context.make(schedule, timeline, o.offload_time, o.transfer_times, o.link_group, o.solo_factor, comm)
    ctx.stash = bool(o.stash)
    return ctx


def _plan_in(ctx: "_Context", o: OffloadOptions) -> OffloadResult:
    """:func:`plan_offload`'s plan for ``o`` in the context ``ctx``."""
    res, mode = _plan_by_mode(ctx, o)
    res = _finish(res)  # only the plan kept gets its op lists and host memory
    res.settings = {**o.summary(mode), **res.settings}
    return res


class OffloadSession:
    """:func:`plan_offload` with ``options`` for several C on one timed schedule, in one
    context: what every plan shares (the postponed warm-up, the candidates, the baseline)
    is made once, and in "skip" mode so is the plan for each C, which the plan for a larger
    C compares with (:func:`_no_worse_than_fewer_chunks`) — the planner's tries C = 1, 2, …
    made the plans for C' < C again at every C.

    Args:
        schedule, timeline, comm: as :func:`plan_offload` takes them (a timed schedule).
        options: the settings; :meth:`plan`'s ``chunks`` replaces ``offload_chunks``.

        timed: the caller vouches that ``timeline`` is the timing pass's
            (:func:`~pipeoffload.passes.timing.simulate`, any of its paths, or an
            :class:`~pipeoffload.passes.timing.OrderTimer`'s) timing of ``schedule`` with a
            latency of ``comm``: re-timing then reproduces it (:meth:`_Context.check_retimable`
            says why), so that check is not made. The planner's sessions are so.

    Guarantees: ``plan(C)`` equals ``plan_offload(schedule, timeline, comm=comm,
    options=replace(options, offload_chunks=C))`` field for field, whatever was planned
    before (with ``timed`` when the timeline is as it says); the inputs are not modified."""

    def __init__(self, schedule: Schedule, timeline: Timeline, *, comm: float, options: OffloadOptions,
                 timed: bool = False) -> None:
        schedule, timeline, comm = _timed_inputs(schedule, timeline, None, None, "units", comm)
        self.options = options
        self._ctx = _context(schedule, timeline, options, comm)
        self._ctx.retimable = bool(timed)  # proved, not checked: check_retimable's docstring

    def plan(self, chunks: int) -> OffloadResult:
        """The plan for ``chunks`` (C); raises as :func:`plan_offload`."""
        return _plan_in(self._ctx, dataclasses.replace(self.options, offload_chunks=chunks))

    def bounds(self, chunks: Sequence[int]) -> dict[int, tuple[list[float], list[float]]] | None:
        """:func:`offload_bounds` with this session's options, in its context: the postponed
        warm-up and the re-timing check are made once for the bounds and the plans."""
        return _bounds_in(self._ctx, self.options, chunks)

    def peak_ceiling(self, chunks: int) -> tuple[float, float] | None:
        """``(ceiling, extra)`` for :meth:`plan` of ``chunks`` without making that plan:
        ``max(plan(chunks).peak) ≤ ceiling`` and ``plan(chunks).makespan −
        plan(chunks).makespan_no_offload == extra``, float for float. None where it cannot
        say: options other than an exact C in "skip" mode with one warm-up setting and no
        stash window or limit (:func:`offload_bounds`' cases), or warm-ups to postpone on a
        timeline that re-timing does not reproduce (:meth:`plan` then raises).

        Why: there every placement keeps the compute events (no B waits in "skip" mode), so
        every draft — and :func:`_no_worse_than_fewer_chunks`' plans for fewer chunks — has
        the same makespan, and the plan kept has the smallest (makespan, highest peak,
        summed peaks) key: its highest peak is at most any one draft's. The ceiling is the
        "deadline" draft's (the cheapest placement; 5–10 % of a plan at p = 32)."""
        o = dataclasses.replace(self.options, offload_chunks=chunks)
        if not _bounded(o):
            return None
        ctx = self._ctx
        _check_chunks(chunks, ctx.schedule.chunks)
        if ("ceiling", chunks) not in ctx.memo:
            got = None
            try:
                if o.postpone_warmup:
                    ctx.check_retimable()
            except ParameterError:
                pass
            else:
                draft = _plan_with_placement(ctx, chunks, "skip", bool(o.postpone_warmup), _place_by_deadline)
                assert draft is not None  # "skip" mode never gives up
                got = (max(draft.peak, default=0.0), draft.makespan - ctx.base_makespan)
            ctx.memo[("ceiling", chunks)] = got
        return ctx.memo[("ceiling", chunks)]

    def host_floor(self, chunks: int) -> list[float] | None:
        """Per rank, host bytes that ``plan(chunks).host_memory[r]`` is at least (up to the
        rounding of sums taken in other orders): the rank's activation peak without offload on
        the plan's compute events less :meth:`peak_ceiling`. At that moment the plan's device
        level is at most the ceiling, and what is not on the device is on the host: a copy
        holds the host from its offload's start to its reload's end and leaves the device
        only from the offload's end to the reload's start (a dropped copy stays on the
        device). None where :meth:`peak_ceiling` is."""
        got = self.peak_ceiling(chunks)
        if got is None:
            return None
        top = _top_levels(self._ctx, bool(self.options.postpone_warmup))
        return [max(0.0, x - got[0]) for x in top]

    def host_floor_within(self, chunks: int, room: Sequence[float]) -> list[float] | None:
        """Per rank, host bytes that ``plan(chunks).host_memory[r]`` is at least (up to the
        rounding of sums taken in other orders) *if* ``plan(chunks).peak[r] ≤ room[r]`` for
        every rank: the rank's activation peak without offload on the plan's compute events
        less ``room[r]``. :meth:`host_floor`'s argument with each rank's own peak bounded by
        the caller instead of by the deadline draft's ceiling, so no draft is made: at the
        moment of that peak the rank's device level is at most its plan peak, and what is not
        on the device is on the host. None where :meth:`host_floor_cap` is."""
        if self.bounds([chunks]) is None:
            return None
        top = _top_levels(self._ctx, bool(self.options.postpone_warmup))
        return [max(0.0, x - r) for x, r in zip(top, room)]

    def host_floor_cap(self, chunks: int) -> float | None:
        """A number no smaller than ``max(host_floor(chunks))``, made without
        :meth:`peak_ceiling`'s draft: the highest level without offload less the highest
        floor of :meth:`bounds` (less 10⁻⁶ of it). The ceiling is at least the plan's highest
        peak, which is at least that floor up to the rounding of sums taken in other orders
        (:func:`offload_peak_floor`), so each rank's host floor is at most this. None where
        :meth:`host_floor` is (the same cases as :meth:`bounds`)."""
        got = self.bounds([chunks])
        if got is None:
            return None
        floor = max(got[chunks][0], default=0.0)
        top = _top_levels(self._ctx, bool(self.options.postpone_warmup))
        return max(0.0, max(top, default=0.0) - floor * (1.0 - 1e-6))


def serial_host_floor_within(timeline: Timeline, room: Sequence[float]) -> list[float] | None:
    """:meth:`OffloadSession.host_floor_within` of any session on ``timeline`` that says
    anything (warm-ups postponed or not, any C), made without the session, float for float, when
    the timeline holds serial columns (:meth:`~pipeoffload.timeline.Timeline.serial_peaks`);
    None otherwise. Why equal: on a serial rank each op lasts a positive time and starts no
    earlier than the previous one ends; postponing a warm-up forward moves its start no
    earlier than it was and its end no later than the next op's start on its rank, so the rank's
    order and seriality stay, the sweep of :func:`_level_tops` meets the same deltas in the
    rank's order (frees at one op's end before the next op's allocation), and its top is the
    running peak of those deltas."""
    top = timeline.serial_peaks()
    if top is None:
        return None
    return [max(0.0, x - r) for x, r in zip(top, room)]


def serial_floors(timeline: Timeline, chunks: Sequence[int]) -> dict[int, list[float]] | None:
    """Per C of ``chunks``, per rank, the device floor of :func:`offload_bounds` read in each
    rank's order from ``timeline``'s serial columns
    (:meth:`~pipeoffload.timeline.Timeline.serial_columns`) without a session; None when it
    holds none. Equal, float for float, to the floors of a session without postponed warm-ups;
    with warm-ups postponed at most those floors up to the rounding of sums taken in another
    order.

    Why: :func:`_sweep_floors` sweeps, per rank, an offloadable F's allocation at its start and
    free at its end, its copy's return at its backward's start, and every other op's allocation
    at its start or free at its end. On a serial rank those come in the rank's order (a free
    first where one op ends as the next starts; a backward's own allocation after its copy's
    return, listed first), which is what :func:`_serial_floor` adds up. A postponed warm-up
    forward keeps its rank's order but its end, its new start plus its length, may pass the
    next op's start by a rounding: the sweep then takes that free after the next allocation,
    which only raises a level."""
    cols = timeline.serial_columns()
    if cols is None:
        return None
    out: dict[int, list[float]] = {C: [] for C in chunks}
    for r in range(timeline.num_ranks):
        rows = _serial_rows(cols, r) if r < len(cols.ops) else []
        if rows is None:
            return None
        for C in chunks:
            out[C].append(_serial_floor(rows, C))
    return out


def _serial_rows(cols: EventColumns, r: int) -> list[tuple[int, float, float, int]] | None:
    """Rank ``r``'s ops that change memory or are a backward, in its order, as ``(index,
    chunk, mem, index of its backward)``: ``chunk`` the F's where an F keeps more than
    ``_EPS`` (offloadable for C > chunk; :func:`_floor_rows`' test), else infinite, and the
    backward's index only then (else −1). None when such an F has no backward on the rank."""
    ops, mem = cols.ops[r], cols.mem[r]
    if isinstance(ops, RankOps):
        o, pl = ops.orders, ops.placement
        chunk_of = [pl.chunk_of(s) for s in range(pl.num_stages)]
        triples = zip(map(ALL_KINDS.__getitem__, o.kinds[r]), o.stages[r], o.mbs[r])
        ops_kc = [(k, s, j, chunk_of[s]) for k, s, j in triples]
    else:
        ops_kc = [(op.kind, op.stage, op.microbatch, op.chunk) for op in ops]
    back = {(s, j): i for i, (k, s, j, _) in enumerate(ops_kc) if k is OpKind.B or k is OpKind.BW}
    rows: list[tuple[int, float, float, int]] = []
    F, inf = OpKind.F, math.inf
    for i, ((k, s, j, c), d) in enumerate(zip(ops_kc, mem)):
        if k is F and d > _EPS:
            b = back.get((s, j))
            if b is None:
                return None
            rows.append((i, c, d, b))
        elif d != 0 or k is OpKind.B or k is OpKind.BW:
            rows.append((i, inf, d, -1))
    return rows


def _serial_floor(rows: list[tuple[int, float, float, int]], C: int) -> float:
    """One rank's floor for C from :func:`_serial_rows`: the running sum's top (0 at least),
    each offloadable F's copy returning just before its backward's own change."""
    level = top = 0.0
    back: dict[int, float] = {}
    for i, chunk, d, b in rows:
        returns = back.pop(i, None)
        if returns is not None:
            level += returns
            if level > top:
                top = level
        if chunk < C:
            level += d
            if level > top:
                top = level
            level += -d
            back[b] = d
        elif d != 0:
            level += d
            if level > top:
                top = level
    return top


def _top_levels(ctx: "_Context", postpone: bool) -> list[float]:
    """Per rank, the highest activation level without offload on the compute events the
    plans keep (warm-ups postponed or not; at least 0): :meth:`OffloadSession.host_floor`'s
    minuend, the same for every C, so made once per context (``ctx.memo``)."""
    key = ("top levels", postpone)
    hit = ctx.memo.get(key)
    if hit is None:
        hit = ctx.memo[key] = _level_tops(_postponed_warmup(ctx)[0] if postpone else ctx.base_events,
                                          ctx.timeline.num_ranks)
    return hit


def _level_tops(events: list[TimedOp], num_ranks: int) -> list[float]:
    """Per rank, ``max([0.0] + the levels of _rank_levels(events)[rank])``, swept without
    its lists: the same changes in the same order, so the same running levels; that list
    keeps the level after the last change at each time, and the others there are no higher
    (frees come first and only lower it, allocations only raise it), so the top is the same."""
    changes = _rank_changes(events)
    return [_swept_top(changes.get(r, [])) for r in range(num_ranks)]


def _one_options(options: OffloadOptions | None, given: OffloadOptions) -> OffloadOptions:
    """``options``, or the keywords' ``given`` when None; ParameterError naming
    ``options`` when both carry settings."""
    if options is None:
        return given
    if given != OffloadOptions():
        changed = [f for f in OffloadOptions.__dataclass_fields__ if getattr(given, f) != getattr(OffloadOptions(), f)]
        raise ParameterError("options", f"give the settings either as `options` or as keywords, not both "
                             f"(also given: {', '.join(changed)})")
    return options


def _plan_by_mode(ctx: "_Context", o: OffloadOptions) -> tuple[OffloadResult, str]:
    """The plan for ``o``'s mode (limit, auto or exact C) and the infeasibility mode used."""
    mode = _infeasible_mode(o.tolerance, o.on_infeasible, o.auto)
    if o.mem_limit is not None:
        if o.auto or o.on_infeasible is not None:
            raise ParameterError("mem_limit", "the limit mode chooses where ops wait itself: not with `auto` or "
                                 "`on_infeasible`")
        return _plan_to_limit(ctx, o.offload_chunks, o.mem_limit), "delay"
    if o.auto:
        return _plan_auto(ctx, o.offload_chunks, mode, o.postpone_warmup, o.tolerance), mode
    return _plan_exactly(ctx, o.offload_chunks, mode, o.postpone_warmup), mode


def largest_feasible_chunks(schedule: Schedule, timeline: Timeline, **kwargs) -> int:
    """The largest C that :func:`plan_offload` accepts in "error" mode with these settings."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ("offload_chunks", "auto", "on_infeasible", "tolerance")}
    postpone = kwargs.pop("postpone_warmup", None)
    stash = bool(kwargs.pop("stash", False))
    ctx = _Context.make(
        schedule, timeline, kwargs.pop("offload_time", 0.0), kwargs.pop("transfer_times", None),
        kwargs.pop("link_group", 2), kwargs.pop("solo_factor", 0.7), kwargs.pop("comm", 0.0),
    )
    ctx.stash = stash
    if kwargs:
        raise TypeError(f"unexpected arguments: {', '.join(kwargs)}")
    feasible = (c for c in range(schedule.chunks, -1, -1) if _plan_for_chunks(ctx, c, "error", postpone) is not None)
    return next(feasible)


def offload_peak_floor(schedule: Schedule, timeline: Timeline, *, comm: float,
                       options: OffloadOptions) -> list[float] | None:
    """Per rank, a peak that no plan of :func:`plan_offload` with ``options`` goes below: the
    activation level if every activation of the offloaded chunks left the device the moment
    its forward ended and came back the moment its backward started (instantaneous copies,
    none dropped), on the compute times the plan keeps (warm-up forwards postponed when
    ``options.postpone_warmup`` is True). None where it cannot say (options other than an
    exact C in "skip" mode without the stash window or a limit, or a timeline that re-timing
    does not reproduce, where :func:`plan_offload` itself refuses to postpone).

    Guarantees: ``plan_offload(schedule, timeline, comm=comm, options=options).peak[r] ≥``
    the floor's ``[r]`` (up to float rounding of the sums): a plan's copies end no earlier
    than their forward and its reloads start no later than their backward, a dropped or
    skipped copy keeps its activation resident, and every other memory change is the same,
    so its level is at least the floor's at every moment."""
    C = schedule.chunks if options.offload_chunks is None else options.offload_chunks
    got = offload_bounds(schedule, timeline, comm=comm, options=options, chunks=(C,))
    return None if got is None else got[C][0]


def offload_bounds(schedule: Schedule, timeline: Timeline, *, comm: float, options: OffloadOptions,
                   chunks: Sequence[int]) -> dict[int, tuple[list[float], list[float]]] | None:
    """Per C of ``chunks``: (:func:`offload_peak_floor` with C, a ceiling of the plan's host
    memory per rank), from one context; None where the floor cannot say.

    The ceiling: the largest sum of the offloadable activations (chunks ``< C``) whose forward
    has ended and whose backward has not started, each counted a little (10⁻⁶ of the makespan)
    before and after — a plan holds a copy on the host only between its offload's start (at or
    after the forward's end, within 10⁻⁹ of the slot period for the fixed slots) and its
    reload's end (by the backward's start, within the same), so ``host_memory[r] ≤`` it."""
    if not _bounded(options):
        return None
    return OffloadSession(schedule, timeline, comm=comm, options=options).bounds(chunks)


def _bounded(o: OffloadOptions) -> bool:
    """Whether :func:`offload_bounds` can say anything for ``o``."""
    return not (o.auto or o.stash or o.mem_limit is not None or o.on_infeasible != "skip" or o.postpone_warmup is None)


def _bounds_in(ctx: "_Context", o: OffloadOptions,
               chunks: Sequence[int]) -> dict[int, tuple[list[float], list[float]]] | None:
    """:func:`offload_bounds` in the context ``ctx`` (made with ``o``)."""
    if not _bounded(o):
        return None
    for C in chunks:
        _check_chunks(C, ctx.schedule.chunks)
    return _floors(ctx, o.postpone_warmup, chunks)


def _floors(ctx: "_Context", postpone: bool,
            chunks: Sequence[int]) -> dict[int, tuple[list[float], list[float]]] | None:
    """Per C of ``chunks``, :func:`offload_bounds`' (floor, ceiling) for the plans in "skip"
    mode without the stash window and with warm-ups postponed or not (``postpone``); None
    when they are to be postponed and re-timing does not reproduce the timeline. Each C's
    made once per context (``ctx.memo``)."""
    events = ctx.base_events
    if postpone:
        try:
            ctx.check_retimable()
        except ParameterError:
            return None
        events = _postponed_warmup(ctx)[0]
    todo = [C for C in chunks if ("bounds", postpone, C) not in ctx.memo]
    if todo:
        ctx.memo.update({("bounds", postpone, C): got for C, got in _sweep_floors(ctx, events, todo).items()})
    return {C: ctx.memo[("bounds", postpone, C)] for C in chunks}


def _sweep_floors(ctx: "_Context", events: list[TimedOp], chunks: Sequence[int]) -> dict:
    """:func:`_floors` made: the level sweeps of every C of ``chunks`` on ``events``.

    Each event's part is read once (:func:`_floor_rows`) and each C's changes are then
    made from those rows, rank by rank in event order: the same changes in the same
    order as reading the events per C, so the same sweeps, float for float."""
    widen = 1e-6 * max(1.0, abs(ctx.base_makespan))
    rows = _floor_rows(events, ctx.timeline.num_ranks)
    out = {}
    for C in chunks:
        floors, ceilings = [], []
        for lst in rows:
            pts: list = []
            held: list = []
            for chunk, start, end, mem, b in lst:
                if chunk < C:  # offloadable: leaves at its F's end, back at its backward's start
                    pts += [(start, ALLOC, mem), (end, FREE, -mem), (b, ALLOC, mem)]
                    held += [(end - widen, ALLOC, mem), (b + widen, FREE, -mem)]
                elif mem > 0:
                    pts.append((start, ALLOC, mem))
                elif mem < 0:
                    pts.append((end, FREE, mem))
            floors.append(_swept_top(pts))
            ceilings.append(_swept_top(held))
        out[C] = (floors, ceilings)
    return out


def _swept_top(changes: list) -> float:
    """``max([0.0] + the levels of memory_sweep(changes))`` without the sweep's list: the
    same additions in the same order (:func:`~pipeoffload.timeline.memory_sweep`'s sort),
    the same comparisons as ``max``."""
    level = top = 0.0
    for _, _, delta in sorted(changes, key=_TIME_ORDER):
        level += delta
        if level > top:
            top = level
    return top


def _floor_rows(events: list[TimedOp], num_ranks: int) -> list[list[tuple]]:
    """Per rank, in event order, each event that changes memory as ``(chunk, start, end,
    mem, backward start)``: ``chunk`` the F's chunk where an F keeps more than ``_EPS``
    (offloadable for C > chunk), else infinite; ``backward start`` that of its
    (layer group, microbatch)'s backward (read only for such an F)."""
    back = {(e.op.stage, e.op.microbatch): e.start for e in events if e.op.kind.is_backward}
    rows: list[list[tuple]] = [[] for _ in range(num_ranks)]
    F, inf = OpKind.F, math.inf
    for e in events:
        op, mem = e.op, e.mem
        if op.kind is F and mem > _EPS:
            rows[op.rank].append((op.chunk, e.start, e.end, mem, back[(op.stage, op.microbatch)]))
        elif mem != 0:
            rows[op.rank].append((inf, e.start, e.end, mem, 0.0))
    return rows


def offload_from_slots(schedule: Schedule, timeline: Timeline, slots: Sequence[tuple], *, offload_chunks: int,
                       link_group: int = 2, comm: float = 0.0) -> OffloadResult:
    """The offload result for copies planned elsewhere (the exact scheduler,
    :mod:`pipeoffload.solver`): ``slots`` holds ``(stage, microbatch, offload start,
    offload end, reload start, reload end)`` of activation-window (F→B) copies at ``timeline``'s
    times, which must be the compute-only ``schedule``'s. No solo speed-up is applied.

    Guarantees: the program holds exactly the given copies, inserted as
    :func:`plan_offload` inserts its own; peaks and host memory as in :class:`OffloadResult`."""
    ctx = _Context.make(schedule, timeline, 0.0, None, link_group, 1.0, comm)
    ends = {(e.op.kind, e.op.stage, e.op.microbatch): e for e in ctx.base_events}
    cands: list[_Candidate] = []
    placed: dict[int, _Slots] = {}
    for s, j, a, b, c, d in slots:
        fe = ends[(OpKind.F, s, j)]
        be = ends.get((OpKind.B, s, j)) or ends[(OpKind.BW, s, j)]
        cand = _Candidate(fe.rank, s, fe.op.chunk, j, fe.mem, fe.end, be.start, b - a, ctx.link.link_of(fe.rank))
        cands.append(cand)
        placed[id(cand)] = (a, b, c, d)
    res = _Draft(ctx, offload_chunks, ctx.base_events, cands, placed, Counter()).result()
    res = _finish(res)
    res.settings = {"auto": False, "offload_time": None, "transfer_times": None, "link_group": link_group,
                    "solo_factor": 1.0, "planned_by": "solver"}
    return res


def host_memory_curve(timeline: Timeline, rank: int) -> list[tuple[float, float]]:
    """Step curve of activation memory held on the host for ``rank``: from each
    OFFLOAD_START's start (pinned buffer in use) to its RELOAD_END's end (and the same
    for the STASH_* ops of the stash window, B→W)."""
    return host_memory_curves(timeline)[rank]


def host_memory_curves(timeline: Timeline) -> list[list[tuple[float, float]]]:
    """:func:`host_memory_curve` of every rank, in one pass over the events."""
    return _host_curves(timeline.events, timeline.num_ranks, timeline.start)


def _host_curves(events: list[TimedOp], num_ranks: int, t0: float) -> list[list[tuple[float, float]]]:
    """:func:`host_memory_curves` of a timeline with these events, ``num_ranks`` ranks and start
    ``t0``: only the transfer ops' events count, in their order (the compute events may be left
    out: :func:`_finish` passes a plan's transfer events alone)."""
    # Amounts live on OFFLOAD_END (negative) events; pair by (rank, window, stage, microbatch).
    amount = {(e.rank, e.op.kind.window, e.op.stage, e.op.microbatch): -e.mem for e in events
              if e.op.kind in (OpKind.OFFLOAD_END, OpKind.STASH_OFFLOAD_END)}
    pts: list[list] = [[] for _ in range(num_ranks)]
    for e in events:
        kind = e.op.kind
        if kind.window is None:
            continue
        a = amount.get((e.rank, kind.window, e.op.stage, e.op.microbatch), 0.0)
        if kind in (OpKind.OFFLOAD_START, OpKind.STASH_OFFLOAD_START):
            pts[e.rank].append((e.start, ALLOC, a))
        elif kind in (OpKind.RELOAD_END, OpKind.STASH_RELOAD_END):
            pts[e.rank].append((e.end, FREE, -a))
    return [[(t0, 0.0)] + [(t, level) for t, _, level in memory_sweep(rank_pts)] for rank_pts in pts]


# --------------------------------------------------------------------------------------
# Internals: settings
# --------------------------------------------------------------------------------------


def _timed_inputs(
    schedule: Schedule,
    timeline: Timeline | None,
    costs: Costs | None,
    memory: MemoryDeltas | None,
    memory_unit: str,
    comm: float | None,
) -> tuple[Schedule, Timeline, float]:
    """The schedule, its timeline (simulated here when not given) and the comm latency
    it was timed with."""
    if timeline is None:
        costs = costs or Costs()
        schedule = schedule.compute_only()
        timeline = simulate(schedule, costs, memory, memory_unit=memory_unit)
        comm = costs.comm if comm is None else comm
    elif costs is not None or memory is not None:
        raise ParameterError("timeline", "give a timeline, or costs/memory to time the schedule with, not both")
    return schedule, timeline, 0.0 if comm is None else comm


def _infeasible_mode(tolerance: float, on_infeasible: str | None, auto: bool) -> str:
    """Check ``tolerance`` and ``on_infeasible``; the mode to plan in."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ParameterError("tolerance", f"must be a finite fraction >= 0, got {tolerance!r}")
    mode = on_infeasible or ("skip" if auto else "error")
    if mode not in _INFEASIBLE_MODES:
        raise ParameterError("on_infeasible", f"must be one of {', '.join(_INFEASIBLE_MODES)}, got {mode!r}")
    return mode


def _check_chunks(chunks: object, most: int) -> None:
    if not isinstance(chunks, int) or isinstance(chunks, bool) or not 0 <= chunks <= most:
        raise ParameterError("offload_chunks", f"must be an integer in 0..{most} (chunks per rank), got {chunks!r}")


def _plan_auto(ctx: _Context, chunks: int | None, mode: str, postpone: bool, tolerance: float) -> OffloadResult:
    """``auto``: among the plans for C = 0..``chunks`` whose makespan is within
    ``tolerance``, the lowest highest peak, then lowest summed peaks, then fewer chunks."""
    if chunks is not None:
        _check_chunks(chunks, ctx.schedule.chunks)
    most = ctx.schedule.chunks if chunks is None else chunks
    limit = ctx.base_makespan * (1.0 + tolerance) + _EPS
    best: OffloadResult | None = None
    for c in range(most, -1, -1):
        res = _plan_for_chunks(ctx, c, mode, postpone)
        if res is None or res.makespan > limit:
            continue
        key = (max(res.peak, default=0.0), sum(res.peak), res.offloaded_chunks)
        if best is None or key <= (max(best.peak, default=0.0), sum(best.peak), best.offloaded_chunks):
            best = res
    assert best is not None  # C = 0 never lengthens the makespan
    return best


def _plan_exactly(ctx: _Context, chunks: int | None, mode: str, postpone: bool) -> OffloadResult:
    """The plan for ``chunks`` (default: all); ParameterError naming the largest
    feasible C when it is infeasible in "error" mode."""
    c = ctx.schedule.chunks if chunks is None else chunks
    _check_chunks(c, ctx.schedule.chunks)
    res = _plan_for_chunks(ctx, c, mode, postpone)
    if mode == "skip" and res is not None:
        res = _no_worse_than_fewer_chunks(ctx, res, mode, postpone)
    if res is None:
        best = next(k for k in range(c - 1, -1, -1) if _plan_for_chunks(ctx, k, mode, postpone) is not None)
        raise ParameterError(
            "offload_chunks",
            f"offloading {c} chunk(s) per rank is infeasible: {ctx.last_failure}; the largest feasible C for "
            f"these settings is {best} (or let backwards wait: `on_infeasible`=\"delay\", or drop those "
            f"offloads: `on_infeasible`=\"skip\")",
        )
    return res


def _no_worse_than_fewer_chunks(ctx: _Context, res: OffloadResult, mode: str, postpone: bool | None) -> OffloadResult:
    """In "skip" mode, the plan for C chunks may drop any candidate, so it is never worse
    than the plan for fewer: the plans of C' = C−1 .. 1 are tried too and the best (same
    key as :func:`_plan_for_chunks`: makespan, highest peak, summed peaks; ties keep the
    larger C') is returned as the plan for C, the candidates of chunks ≥ C' counted as
    skipped for "no_gain". Without it a placement heuristic given more candidates could
    do worse (DualPipeV p = 4, m = 16, transfers 0.5 × F+B+W: C = 2 peaked at 3.5 units,
    C = 1 at 3)."""
    def key(r: OffloadResult) -> tuple:
        return (_clean(r.makespan), max(r.peak, default=0.0), sum(r.peak))

    C, best, placed = res.offloaded_chunks, res, res.offloaded_chunks
    for fewer in range(C - 1, 0, -1):
        if _fewer_cannot_win(ctx, fewer, postpone, best):
            continue
        other = _plan_for_chunks(ctx, fewer, mode, postpone)
        if other is not None and key(other) < key(best):
            best, placed = other, fewer
    if best is res:
        return res
    best = _finish(best)
    dropped = sum(1 for e in ctx.base_events if e.op.kind is OpKind.F and placed <= e.op.chunk < C and e.mem > _EPS)
    skipped = {**best.skipped, SKIP_GAIN: best.skipped.get(SKIP_GAIN, 0) + dropped}
    best.skipped = {k: skipped[k] for k in sorted(skipped)}
    best.offloaded_chunks = C
    best.schedule.params = dict(best.schedule.params, offload_chunks=C)
    best.timeline.meta["offload"] = {"chunks": C, "transfers": len(best.transfers), "skipped": dict(best.skipped)}
    best.settings["placed_chunks"] = placed
    return best


def _fewer_cannot_win(ctx: _Context, fewer: int, postpone: bool | None, best: OffloadResult) -> bool:
    """Whether the "skip" plan for ``fewer`` chunks is proved no better than ``best`` (a plan
    of this context in "skip" mode): its makespan is ``best``'s (the compute ops keep their
    times, postponed or not alike), and its highest peak is at least the highest floor
    (:func:`_floors`, proved below every plan), which is over ``best``'s highest peak by more
    than the rounding of the two sums (:data:`_FLOOR_SLACK`). Not said (False) with the stash
    window or with both warm-up settings planned."""
    if ctx.stash or postpone is None:
        return False
    floors = _floors(ctx, postpone, (fewer,))
    if floors is None:
        return False
    top = max(best.peak, default=0.0)
    return max(floors[fewer][0], default=0.0) > top + _FLOOR_SLACK * max(1.0, abs(top))


#: Relative slack of a floor's comparison with a plan's peak: the two sum the same deltas in
#: other orders, so a floor over a peak by less than this proves nothing.
_FLOOR_SLACK = 1e-9


def _plan_to_limit(ctx: _Context, chunks: int | None, limit: float) -> OffloadResult:
    """The limit mode (``mem_limit``): plan with every placement heuristic, and where a
    rank's level still rises above ``limit``, make the op that allocates there wait —
    a forward until the rank's next offload copy ends, a reload's backward by as long —
    re-time and plan again, until every peak is within the limit
    (:func:`_limit_waits`; a heuristic whose makespan passes ``_LIMIT_STRETCH`` × the
    original is given up). The plan with the shortest makespan (then lowest bubble,
    peaks) within the limit is kept. Raises ParameterError naming ``mem_limit`` when none is."""
    C = ctx.schedule.chunks if chunks is None else chunks
    _check_chunks(C, ctx.schedule.chunks)
    if not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0):
        raise ParameterError("mem_limit", f"must be a positive number (the per-rank activation limit), got {limit!r}")
    ctx.check_retimable()
    best: OffloadResult | None = None
    for name, place in _STRATEGIES.items():
        mode = "skip" if getattr(place, "long_lived", False) or getattr(place, "needs_events", False) else "delay"
        release: dict = {}
        for _ in range(_MAX_LIMIT_WAITS):
            draft = _plan_with_placement(ctx, C, mode, False, place, release)
            res = None if draft is None else draft.result()
            if res is None or res.makespan > _LIMIT_STRETCH * ctx.base_makespan:
                res = None  # waits that keep pushing each other out: this heuristic gives up
                break
            if not _limit_waits(res, limit, release):
                break
        if res is None or max(res.peak, default=0.0) > limit + _EPS * max(1.0, abs(limit)):
            continue
        res.settings.update(placement=name, postponed=False, mem_limit=limit)
        key = (_clean(res.makespan), res.timeline.bubble_rate, max(res.peak, default=0.0), sum(res.peak))
        if best is None or key < (_clean(best.makespan), best.timeline.bubble_rate, max(best.peak, default=0.0),
                                  sum(best.peak)):
            best = res
    if best is None:
        raise ParameterError("mem_limit", f"no plan with {C} offloaded chunk(s) keeps every rank within {limit:g} "
                             f"(peak without offload {max(ctx.timeline.peak_memory()):g}); raise `mem_limit`, "
                             "`offload_chunks` or lower the transfer time")
    return best


def _limit_waits(res: OffloadResult, limit: float, release: dict) -> bool:
    """The earliest point where a rank of ``res`` rises above ``limit``: add a wait to
    ``release`` for the op that allocates there (a forward: until the rank's next
    offload copy ends; a reload: its backward by as long). False when there is none, or
    nothing to wait for (no copy ends later, or the op is the rank's first)."""
    tol = _EPS * max(1.0, abs(limit))
    over = None
    for r, sweep in enumerate(res.timeline.memory_sweeps()):
        for i, (t, order, lvl) in enumerate(sweep):
            if order == ALLOC and lvl > limit + tol and (i + 1 == len(sweep) or sweep[i + 1][0] > t + _EPS):
                if over is None or t < over[0]:
                    over = (t, r, lvl, sweep[i + 1:])
                break
    if over is None:
        return False
    t, r, lvl, _ = over
    # Only a copy ending later frees memory without depending on the op that would wait.
    falls = min((e.end for e in res.timeline.events if e.rank == r and e.mem < 0 and not e.op.kind.is_compute
                 and e.end > t + _EPS), default=None)
    if falls is None:
        return False
    wait = falls - t
    allocs = [e for e in res.timeline.events if e.rank == r and e.mem > 0 and abs(e.start - t) <= _EPS]
    first = min((e.start for e in res.timeline.events if e.rank == r and e.op.kind.is_compute), default=t)
    moved = False
    for e in allocs:
        if e.op.kind is OpKind.F and e.start > first + _EPS:
            key = e.op.key
        elif e.op.kind in (OpKind.RELOAD_START, OpKind.STASH_RELOAD_START):
            kind = OpKind.W if e.op.kind is OpKind.STASH_RELOAD_START else OpKind.B
            consumer = next((c for c in res.timeline.events if c.op.kind.is_compute and c.op.stage == e.op.stage
                             and c.op.microbatch == e.op.microbatch and (c.op.kind is kind or
                             (kind is OpKind.B and c.op.kind is OpKind.BW))), None)
            if consumer is None:
                continue
            key, t0 = consumer.op.key, consumer.start
            release[key] = max(release.get(key, -math.inf), t0 + wait)
            moved = True
            continue
        else:
            continue
        release[key] = max(release.get(key, -math.inf), falls)
        moved = True
    return moved


@dataclass
class _Candidate:
    """A (layer group, microbatch) that may be offloaded, with its compute times."""

    rank: int
    stage: int
    chunk: int
    microbatch: int
    amount: float
    forward_end: float
    backward_start: float
    transfer_time: float  #: one-way transfer time at the shared rate
    link: int
    window: str = "activation"  #: "activation": F end → B start; "stash": B end → W start


#: A candidate's planned copies: (offload start, offload end, reload start, reload end).
_Slots = tuple[float, float, float, float]


@dataclass
class _Context:
    """The checked inputs of one :func:`plan_offload` call, shared by every plan it tries."""

    schedule: Schedule
    timeline: Timeline
    link: LinkModel
    transfer_time_of_stage: list[float]  #: one-way transfer time per layer group
    comm: float
    base_makespan: float
    op_dur: dict  #: op key → duration (from the timeline)
    op_mem: dict  #: op key → memory delta
    base_events: list[TimedOp]
    last_failure: str = ""
    retimable: bool = False
    stash: bool = False  #: also plan the stash window (B→W)
    #: What every plan of this call shares, made once: the postponed warm-up
    #: (:func:`_postponed_warmup`), the candidates per (events, C) (:func:`_candidates`),
    #: the timeline's peaks and memory curves without offload.
    memo: dict = field(default_factory=dict)

    def check_retimable(self) -> None:
        """Re-timing (delay, postpone) needs the timeline's own rules: re-timing with no
        extra constraint must give back every op's start (within 10⁻⁶ of the makespan).

        It always does for the timing pass's own timelines (``retimable`` is then set when
        the context is made, :class:`OffloadSession`'s ``timed``): both place each rank's ops
        in its order with the same engine, every start the max of the origin, the rank's
        clock and the inputs' ends plus the latency across ranks — a max-plus recurrence,
        1-Lipschitz in every end. The re-timing's durations are the timeline's ``end −
        start``, within one ulp of the end of the durations it was timed with, and each of
        its additions rounds by half an ulp; so each start moves by at most its longest
        chain of inputs and rank predecessors times 2 ulps of the largest end: at most
        N · 2⁻⁵⁰ · makespan for N ops, far within the tolerance for any N below 10⁹."""
        if self.retimable:
            return
        scale = max(1.0, abs(self.base_makespan))
        again = {e.op.key: e.start for e in _retime(self, {})}
        for e in self.base_events:
            if abs(again[e.op.key] - e.start) > 1e-6 * scale:
                raise ParameterError(
                    "comm",
                    f"re-timing the schedule with comm={self.comm:g} does not reproduce the timeline "
                    f"({e.op} starts at {e.start:g}, re-timed {again[e.op.key]:g}); pass the comm latency "
                    "the timeline was simulated with (delayed backwards and postponed forwards need it)",
                )
        self.retimable = True

    @classmethod
    def make(cls, schedule, timeline, offload_time, transfer_times, link_group, solo_factor, comm) -> "_Context":
        link = LinkModel(link_group, solo_factor)
        if not (isinstance(comm, (int, float)) and math.isfinite(comm) and comm >= 0):
            raise ParameterError("comm", f"must be a finite number >= 0, got {comm!r}")
        every = timeline.events
        events = [e for e in every if e.op.kind.is_compute]
        if len(events) != len(every) or not _compute_only(schedule):
            raise ParameterError("schedule", "already holds transfer or comm ops; offload the compute-only schedule")
        keys = [e.op.key for e in events]  # each key made once for both tables
        op_dur = dict(zip(keys, [e.end - e.start for e in events]))
        op_mem = dict(zip(keys, [e.mem for e in events]))
        if len(op_dur) != _num_ops(schedule):
            raise ParameterError("timeline", "does not time every op of the schedule exactly once")
        transfer_time_of_stage = _transfer_times(schedule, events, offload_time, transfer_times)
        return cls(schedule, timeline, link, transfer_time_of_stage, float(comm), timeline.makespan,
                   op_dur, op_mem, events)


def _compute_only(schedule: Schedule) -> bool:
    """Whether every op of ``schedule`` is a compute op, read from its compact orders while
    it has them (making its :class:`Op` lists only to check costs as much as the context)."""
    compact = schedule.compact
    if compact is not None:
        return compact.compute_only()
    return all(o.kind.is_compute for o in schedule.ops())


def _num_ops(schedule: Schedule) -> int:
    """How many ops ``schedule`` holds (from its compact orders while it has them)."""
    compact = schedule.compact
    if compact is not None:
        return sum(map(len, compact.kinds))
    return sum(len(lst) for lst in schedule.ranks)


def _transfer_times(schedule: Schedule, events: list[TimedOp], offload_time: float,
                    transfer_times: Sequence[float] | None) -> list[float]:
    """One one-way transfer's time per layer group: ``transfer_times``, or
    ``offload_time`` × the group's F+B+W per microbatch."""
    S = schedule.num_stages
    if transfer_times is not None:
        times = [float(x) for x in transfer_times]
        if len(times) != S:
            raise ParameterError("transfer_times", f"needs one time per layer group ({S}), got {len(times)}")
        if any(not math.isfinite(x) or x < 0 for x in times):
            raise ParameterError("transfer_times", f"times must be finite and >= 0, got {times}")
        return times
    if not (isinstance(offload_time, (int, float)) and math.isfinite(offload_time) and offload_time >= 0):
        raise ParameterError("offload_time", f"must be a finite number >= 0, got {offload_time!r}")
    # The chunk's F+B+W per microbatch: mean over microbatches (equal when simulated).
    total = [0.0] * S
    for e in events:
        total[e.op.stage] += e.end - e.start
    m = schedule.num_microbatches
    return [offload_time * t / m for t in total]


# --------------------------------------------------------------------------------------
# Internals: one plan
# --------------------------------------------------------------------------------------


def _postpone_choices(ctx: _Context, postpone: bool | None) -> tuple[bool, ...]:
    """The warm-up settings to plan with: the one asked for, or (None) both, postponing
    only when re-timing reproduces the timeline."""
    if postpone is not None:
        return (postpone,)
    try:
        ctx.check_retimable()
    except ParameterError:
        return (False,)
    return (False, True)


def _plan_for_chunks(ctx: _Context, C: int, mode: str, postpone: bool | None) -> OffloadResult | None:
    """Plan with C chunks using each placement heuristic (and, with ``postpone`` None,
    with and without postponed warm-up forwards) and keep the best plan: in "error"
    mode only complete plans count; then the shortest makespan, the lowest highest
    peak, the lowest summed peaks (ties keep the earlier plan: not postponed, "value").
    None when no complete plan exists in "error" mode (reason in ctx.last_failure).
    In "skip" mode made once per context and arguments (every call gets its own copy of
    the draft: :func:`_finish` and the callers complete and relabel what they get), so the
    plans for fewer chunks that :func:`_no_worse_than_fewer_chunks` compares with are not
    made again by an :class:`OffloadSession`'s next C."""
    if mode != "skip":  # a failure's reason (ctx.last_failure) is read only in the other modes
        return _plan_for_chunks_once(ctx, C, mode, postpone)
    key = ("plan", C, postpone)
    if key not in ctx.memo:
        ctx.memo[key] = _plan_for_chunks_once(ctx, C, mode, postpone)
    draft = ctx.memo[key]
    return None if draft is None else _draft_copy(draft)


def _draft_copy(res: OffloadResult) -> OffloadResult:
    """A copy of a draft plan that completing and relabelling it leaves the draft alone: its
    own timeline object (with its own meta and event list), settings, skipped counts and lists."""
    new = copy.copy(res)
    new.timeline = copy.copy(res.timeline)
    new.timeline.meta = dict(res.timeline.meta)
    new.timeline.events = list(res.timeline.events)
    new.settings, new.skipped = dict(res.settings), dict(res.skipped)
    new.transfers, new.peak, new.peak_no_offload = list(res.transfers), list(res.peak), list(res.peak_no_offload)
    new.host_memory = list(res.host_memory)
    return new


def _plan_for_chunks_once(ctx: _Context, C: int, mode: str, postpone: bool | None) -> OffloadResult | None:
    """:func:`_plan_for_chunks` made (the draft the memo keeps)."""
    best: tuple | None = None  # (key, draft, placement name, postponed)
    for later in _postpone_choices(ctx, postpone):
        for name, place in _STRATEGIES.items():
            if (getattr(place, "long_lived", False) or getattr(place, "needs_events", False)) and mode != "skip":
                continue  # drops candidates: only where dropping is what was asked for
            draft = _plan_with_placement(ctx, C, mode, later, place)
            if draft is None:
                continue
            key = (_clean(draft.makespan), max(draft.peak, default=0.0), sum(draft.peak))
            if best is None or key < best[0]:
                best = (key, draft, name, later)
    if best is None:
        return None
    res = best[1].result()  # only the plan kept gets its timeline
    res.settings["placement"] = best[2]
    res.settings["postponed"] = best[3]
    return res


def _plan_with_placement(ctx: _Context, C: int, mode: str, postpone: bool, place,
                         release: dict | None = None) -> "_Draft | None":
    """Plan with C chunks and one placement heuristic (its figures: :class:`_Draft`); None
    when infeasible in "error" mode (reason in ctx.last_failure). ``release``: earliest
    starts of compute ops (op key → time) to re-time with first (the limit mode's waits).

    "delay": a late reload's B may not start before the reload ends; re-time the
    compute ops with those release times and plan again, until no reload is late.
    """
    if postpone or mode == "delay" or release:
        ctx.check_retimable()
    events, waits, release = ctx.base_events, bool(release), dict(release or {})
    if postpone:
        events, more = _postponed_warmup(ctx)
        release.update({k: max(t, release.get(k, t)) for k, t in more.items()})
    for attempt in range(_MAX_RETIMES):
        if attempt or waits:
            events = _retime(ctx, release)
        cands, skipped = _shared_candidates(ctx, events, C)
        if getattr(place, "long_lived", False):
            short = [c for c in cands if c.backward_start - c.forward_end <= 6 * c.transfer_time + _EPS]
            if short and all(c.transfer_time <= _EPS for c in short):
                short = []
            skipped[SKIP_SHORT] += len(short)
            gone = {id(c) for c in short}
            cands = [c for c in cands if id(c) not in gone]
        placed, failed = place(cands, mode, events) if getattr(place, "needs_events", False) else place(cands, mode)
        if not failed or mode == "skip":
            if failed:
                skipped[SKIP_LINK] += len(failed)
                gone = {id(c) for c in failed}
                cands = [c for c in cands if id(c) not in gone]
            return _Draft(ctx, C, events, cands, placed, skipped)
        if mode == "error":
            first = min(failed, key=lambda c: c.backward_start)
            consumer = "weight gradient (W)" if first.window == "stash" else "backward"
            ctx.last_failure = (
                f"{len(failed)} reload(s) cannot finish before their consumer on the host link "
                f"(first: rank {first.rank}, chunk {first.chunk}, microbatch {first.microbatch}, "
                f"before its {consumer})"
            )
            return None
        for c in failed:  # "delay": each late reload's consumer (B, or W for a stash) waits for it
            kind = OpKind.W if c.window == "stash" else _backward_kind(ctx, c.stage, c.microbatch)
            key = (kind, c.stage, c.microbatch)
            release[key] = max(release.get(key, -math.inf), placed[id(c)][3])
    raise ParameterError(
        "offload_chunks",
        f"offloading {C} chunk(s) per rank with delayed backwards did not settle after {_MAX_RETIMES} "
        "re-timings; lower `offload_chunks` or `offload_time`, or use `on_infeasible`=\"skip\"",
    )


def _candidates(ctx: _Context, events: list[TimedOp], C: int) -> tuple[list[_Candidate], Counter]:
    """The (layer group, microbatch) pairs of chunks c < C worth offloading, in the
    order of their forwards in ``events`` (then, with ``ctx.stash``, the stash window's
    in the order of their B's); the others counted by skip reason."""
    by_kind: dict[OpKind, dict] = {OpKind.F: {}, OpKind.B: {}, OpKind.W: {}}
    backward_start: dict = {}
    for e in events:
        k = e.op.kind
        if k in by_kind:
            by_kind[k][(e.op.stage, e.op.microbatch)] = e
        if k.is_backward:
            backward_start[(e.op.stage, e.op.microbatch)] = e.start
    skipped: Counter = Counter()
    out = []
    for (s, j), fe in by_kind[OpKind.F].items():
        if fe.op.chunk < C:
            _add_candidate(ctx, out, skipped, fe, fe.mem, backward_start[(s, j)], "activation")
    if ctx.stash:
        for (s, j), be in by_kind[OpKind.B].items():
            we = by_kind[OpKind.W][(s, j)]
            if be.op.chunk < C:
                _add_candidate(ctx, out, skipped, be, -we.mem, we.start, "stash")
    return out, skipped


def _shared_candidates(ctx: _Context, events: list[TimedOp], C: int) -> tuple[list[_Candidate], Counter]:
    """:func:`_candidates`, made once per C for every placement heuristic of this call on
    the base or the postponed events (the heuristics only read the candidates; re-timed
    events are new each time and not kept); the skip counts are a copy."""
    postponed = ctx.memo.get("postponed")
    if events is not ctx.base_events and (postponed is None or events is not postponed[0]):
        return _candidates(ctx, events, C)
    key = ("candidates", events is ctx.base_events, C)
    hit = ctx.memo.get(key)
    if hit is None:
        hit = ctx.memo[key] = _candidates(ctx, events, C)
    return list(hit[0]), Counter(hit[1])


def _add_candidate(ctx: _Context, out: list[_Candidate], skipped: Counter, producer: TimedOp, amount: float,
                   consumer_start: float, window: str) -> None:
    """Append the candidate that moves ``amount`` from ``producer``'s end to
    ``consumer_start`` (or count why not). A stash's transfer time scales with its
    amount against what the layer group's F keeps (the link moves bytes)."""
    s, j = producer.op.stage, producer.op.microbatch
    d = ctx.transfer_time_of_stage[s]
    if window == "stash":
        kept = ctx.op_mem[(OpKind.F, s, j)]
        d = d * amount / kept if kept > _EPS else d
    if amount <= _EPS:
        skipped[SKIP_EMPTY] += 1
        return
    if consumer_start - producer.end <= 2 * d + _EPS:
        skipped[SKIP_SHORT] += 1
        return
    out.append(_Candidate(producer.rank, s, producer.op.chunk, j, amount, producer.end, consumer_start, d,
                          ctx.link.link_of(producer.rank), window))


def _backward_kind(ctx: _Context, stage: int, mb: int) -> OpKind:
    return OpKind.B if (OpKind.B, stage, mb) in ctx.op_dur else OpKind.BW


def _retime(ctx: _Context, release: dict) -> list[TimedOp]:
    """The compute ops re-timed by the timing pass's engine with extra release times
    (op key → earliest start), clocks starting where the timeline starts; in the
    timeline's event order."""
    events = run_list_schedule(
        ctx.schedule,
        lambda o: ctx.op_dur[o.key],
        ctx.comm,
        lambda o: ctx.op_mem[o.key],
        release=release,
        origin=min(e.start for e in ctx.base_events),
    )
    by_key = {e.op.key: e for e in events}
    return [by_key[e.op.key] for e in ctx.base_events]


# --------------------------------------------------------------------------------------
# Internals: postponed warm-up
# --------------------------------------------------------------------------------------


def _postponed_warmup(ctx: _Context) -> tuple[list[TimedOp], dict]:
    """The base timeline with its warm-up forwards postponed, and those forwards' new
    starts as release times. Postponed once, on the undelayed timeline: later
    re-timings keep these F starts as lower bounds (postponing again after a delay
    would feed back). Made once per call (``ctx.memo``); callers copy, never change it."""
    hit = ctx.memo.get("postponed")
    if hit is None:
        events = _postpone_warmup(ctx, ctx.base_events)  # event for event the base ones, moved or not
        hit = ctx.memo["postponed"] = (events, {e.op.key: e.start for e, b in zip(events, ctx.base_events)
                                                if e.start > b.start})
    return hit


def _warmup_forwards(events: list[TimedOp]) -> list[tuple[TimedOp, TimedOp | None]]:
    """Each warm-up F (before its rank's first backward) with the next op on its rank."""
    by_rank: dict[int, list[TimedOp]] = {}
    for e in events:
        by_rank.setdefault(e.op.rank, []).append(e)
    warm: list[tuple[TimedOp, TimedOp | None]] = []
    for lst in by_rank.values():
        lst.sort(key=_START)
        for i, e in enumerate(lst):
            if e.op.kind is not OpKind.F:
                if e.op.kind.is_backward:
                    break
                continue
            warm.append((e, lst[i + 1] if i + 1 < len(lst) else None))
    return warm


_START = attrgetter("start")  #: a timed op's start, in C


def _postpone_warmup(ctx: _Context, events: list[TimedOp]) -> list[TimedOp]:
    """Move each warm-up F as late as the next op on its rank and its dependents
    (:func:`~pipeoffload.passes.timing.dependents`) allow. Order and makespan unchanged."""
    S = ctx.schedule.num_stages
    keys = [completion_key(e.op) for e in events]  # each made once: three reads below
    start_of = dict(zip(keys, [e.start for e in events]))
    rank_of = dict(zip(keys, [e.op.rank for e in events]))
    new: dict = {}  # completion key → postponed start
    for e, nxt in sorted(_warmup_forwards(events), key=lambda x: -x[0].start):
        key = completion_key(e.op)
        latest = math.inf
        if nxt is not None:
            nxt_key = completion_key(nxt.op)
            latest = new.get(nxt_key, start_of[nxt_key])
        for dk in _dependents(key, S):
            if dk in start_of:
                latest = min(latest, new.get(dk, start_of[dk]) - (ctx.comm if rank_of[dk] != e.rank else 0.0))
        if math.isinf(latest):
            continue
        st = max(e.start, latest - (e.end - e.start))
        if st > e.start + _EPS:
            new[key] = st
    if not new:
        return events
    out = []
    for e, key in zip(events, keys):
        st = new.get(key)
        out.append(e if st is None else TimedOp(e.op, st, st + e.end - e.start, e.stream, e.mem))
    return out


def _dependents(key: tuple[str, int, int], num_stages: int) -> list[tuple[str, int, int]]:
    """:func:`~pipeoffload.passes.timing.dependents` of ``key``, from its pattern per (name,
    layer group): an op's inputs are of its own microbatch, so the pattern is the same for
    every microbatch (:func:`dependents` makes and tests nine ops per call)."""
    name, s, j = key
    return [(n2, s2, j) for n2, s2 in _dependent_pattern(name, s, num_stages)]


@lru_cache(maxsize=4096)
def _dependent_pattern(name: str, stage: int, num_stages: int) -> tuple[tuple[str, int], ...]:
    """(name, layer group) of each dependent of ``(name, stage, j)``, whatever ``j``."""
    return tuple((n2, s2) for n2, s2, _ in dependents((name, stage, 0), num_stages))


# --------------------------------------------------------------------------------------
# Internals: placing the copies on the host links
# --------------------------------------------------------------------------------------


def _earliest_gap(busy: list[tuple[float, float]], t: float, d: float, end_by: float = math.inf) -> float:
    """Earliest start ≥ ``t`` of a ``d``-long interval that avoids ``busy`` (sorted,
    disjoint). The start only grows as the scan goes on, so once ``start + d`` passes
    ``end_by`` the scan stops and returns that start (not the earliest one): a caller
    that rejects every start with ``start + d > end_by`` gets the same answer sooner."""
    i = bisect_right(busy, (t, math.inf)) - 1
    if i >= 0 and busy[i][1] > t:
        t = busy[i][1]
    i += 1
    n = len(busy)
    while i < n and t + d <= end_by:
        a, b = busy[i]
        if a >= t + d - _EPS:
            break
        if b > t:
            t = b
        i += 1
    return t


def _latest_gap(busy: list[tuple[float, float]], T: float, d: float, start_after: float = -math.inf) -> float:
    """Latest end ≤ ``T`` of a ``d``-long interval that avoids ``busy``. The end only
    falls as the scan goes on, so once ``end − d`` is at or below ``start_after`` the
    scan stops and returns that end, as :func:`_earliest_gap` does with ``end_by``."""
    e = T
    j = bisect_left(busy, (T, -math.inf)) - 1
    while j >= 0 and e - d > start_after:
        a, b = busy[j]
        if b <= e - d + _EPS:
            break
        if a < e:
            e = a
        j -= 1
    return e


def _place_by_value(cands: list[_Candidate], mode: str) -> tuple[dict[int, _Slots], list[_Candidate]]:
    """Place every candidate's two copies on its link, most valuable first.

    Candidates go in order of chunk (earliest first), then lifespan (longest first):
    each offload takes the earliest free d2h time after its F, each reload the latest
    free h2d time that ends by its B and starts after the offload. So the plan for C
    chunks is the plan for C−1 plus transfers fitted into the gaps it left.

    Returns (placed: id → slots, failed). A failed candidate is not placed, except in
    "delay" mode where its reload takes the earliest free h2d time after its offload
    (ending after its B's start).
    """
    d2h: dict[int, list[tuple[float, float]]] = {}
    h2d: dict[int, list[tuple[float, float]]] = {}
    placed: dict[int, _Slots] = {}
    failed: list[_Candidate] = []
    order = sorted(cands, key=lambda c: (c.chunk, c.forward_end - c.backward_start, c.forward_end, c.rank,
                                         c.microbatch))
    for c in order:
        d = c.transfer_time
        if d <= _EPS:  # instantaneous: no link time
            placed[id(c)] = (c.forward_end, c.forward_end, c.backward_start, c.backward_start)
            continue
        up, down = d2h.setdefault(c.link, []), h2d.setdefault(c.link, [])
        off_start = _earliest_gap(up, c.forward_end, d)
        off_end = off_start + d
        rel_end = _latest_gap(down, c.backward_start, d) if off_end + d <= c.backward_start + _EPS else -math.inf
        if rel_end - d < off_end - _EPS:
            failed.append(c)
            if mode != "delay":
                continue
            rel_end = _earliest_gap(down, off_end, d) + d
        insort(up, (off_start, off_end))
        insort(down, (rel_end - d, rel_end))
        placed[id(c)] = (off_start, off_end, max(rel_end - d, off_end), rel_end)
    return placed, failed


def _by_link(cands: list[_Candidate]) -> dict[int, list[_Candidate]]:
    """Candidates grouped by the host link they use, in their given order."""
    by_link: dict[int, list[_Candidate]] = {}
    for c in cands:
        by_link.setdefault(c.link, []).append(c)
    return by_link


def _place_by_deadline(cands: list[_Candidate], mode: str) -> tuple[dict[int, _Slots], list[_Candidate]]:
    """Place copies by deadline on each link: offloads by non-preemptive
    earliest-deadline-first in time order (released at the F's end, deadline = the B's
    start minus the reload time); reloads by the mirror image, planned backwards
    (released at the B's start, most urgent = latest offload end). Packs a busy link
    better than :func:`_place_by_value`; same return value."""
    by_link = _by_link(cands)
    placed: dict[int, _Slots] = {}
    failed: list[_Candidate] = []
    for lst in by_link.values():
        offloads = _deadline_offloads(lst)
        late, reloads = _deadline_reloads(lst, offloads, placed)
        failed += late
        if mode == "delay":
            reloads.sort()
            for c in sorted(late, key=lambda c: c.backward_start):
                off_start, off_end = offloads[id(c)]
                rel_start = _earliest_gap(reloads, off_end, c.transfer_time)
                insort(reloads, (rel_start, rel_start + c.transfer_time))
                placed[id(c)] = (off_start, off_end, rel_start, rel_start + c.transfer_time)
    return placed, failed


def _deadline_offloads(cands: list[_Candidate]) -> dict[int, tuple[float, float]]:
    """One link's offloads, earliest deadline first: id → (start, end)."""
    out: dict[int, tuple[float, float]] = {}
    order = sorted(cands, key=lambda c: (-c.forward_end, -c.rank, -c.stage, -c.microbatch))  # pop() = earliest
    heap: list = []
    t = -math.inf
    while order or heap:
        if not heap:
            t = max(t, order[-1].forward_end)
        while order and order[-1].forward_end <= t + _EPS:
            c = order.pop()
            deadline = c.backward_start - c.transfer_time
            heapq.heappush(heap, (deadline, c.forward_end, c.rank, c.stage, c.microbatch, id(c), c))
        c = heapq.heappop(heap)[-1]
        start = max(t, c.forward_end)
        out[id(c)] = (start, start + c.transfer_time)
        t = start + c.transfer_time
    return out


def _deadline_reloads(cands: list[_Candidate], offloads: dict[int, tuple[float, float]],
                      placed: dict[int, _Slots]) -> tuple[list[_Candidate], list[tuple[float, float]]]:
    """One link's reloads, planned backwards from the B starts, latest offload end
    first; each placed candidate's slots go into ``placed``. Returns the candidates
    whose reload cannot follow its offload (late) and the busy h2d intervals."""
    order = sorted(cands, key=lambda c: (c.backward_start, c.rank, c.stage, c.microbatch))  # pop() = latest
    heap: list = []
    T = math.inf
    busy: list[tuple[float, float]] = []
    late: list[_Candidate] = []
    while order or heap:
        if not heap:
            T = min(T, order[-1].backward_start)
        while order and order[-1].backward_start >= T - _EPS:
            c = order.pop()
            heapq.heappush(heap, (-offloads[id(c)][1], -c.rank, -c.stage, -c.microbatch, id(c), c))
        c = heapq.heappop(heap)[-1]
        off_start, off_end = offloads[id(c)]
        end = min(T, c.backward_start)
        d = c.transfer_time
        if end - d < off_end - _EPS:
            late.append(c)
            continue
        placed[id(c)] = (off_start, off_end, max(end - d, off_end), end)
        if d > _EPS:
            busy.append((end - d, end))
        T = end - d
    return late, busy


def _place_by_slots(cands: list[_Candidate], mode: str) -> tuple[dict[int, _Slots], list[_Candidate]]:
    """The reference code's fixed slots: on a link of G ranks with one transfer time d,
    time is cut into periods of G·d from the link's first forward end; rank q of the
    link offloads in slots starting q·d into a period (each F's copy in the first free
    slot after it ends) and reloads in slots ending there (each B's copy in the last
    free slot ending by its start, planned backwards). One direction's slots of the
    ranks never overlap. A reload that cannot follow its offload fails; links whose
    candidates differ in transfer time get no plan (every candidate fails)."""
    by_link = _by_link(cands)
    placed: dict[int, _Slots] = {}
    failed: list[_Candidate] = []
    for lst in by_link.values():
        d = lst[0].transfer_time
        if d <= _EPS or any(abs(c.transfer_time - d) > _EPS for c in lst):
            failed += lst
            continue
        ranks = sorted({c.rank for c in lst})
        t0, period = min(c.forward_end for c in lst), len(ranks) * d
        for q, r in enumerate(ranks):
            mine = [c for c in lst if c.rank == r]
            base = t0 + q * d
            sends, k = {}, 0
            for c in sorted(mine, key=lambda c: c.forward_end):
                k = max(k, math.ceil((c.forward_end - base) / period - 1e-9))
                sends[id(c)] = base + k * period
                k += 1
            k = math.inf
            for c in sorted(mine, key=lambda c: -c.backward_start):
                k = min(k, math.floor((c.backward_start - base) / period + 1e-9))
                end = base + k * period
                if end - d < sends[id(c)] + d - _EPS:
                    failed.append(c)
                    continue
                placed[id(c)] = (sends[id(c)], sends[id(c)] + d, end - d, end)
                k -= 1
    return placed, failed


def _place_by_peak(cands: list[_Candidate], mode: str, events: list[TimedOp]) -> tuple[dict[int, _Slots],
                                                                                     list[_Candidate]]:
    """Place copies so that every rank's level stays under a target level, the lowest
    target the link allows.

    The other placements serve candidates in an order blind to memory: on a busy link
    shared by two ranks, the one whose candidates live longest takes the link time and
    its neighbour keeps its whole peak (ZB-H1 at p = 8, k = 1 with the stash window: ranks
    1, 3, 4 and 6 kept all 8 units). Here each link is swept in time order for a target
    level L: at every allocation point of one of its ranks above L, that rank's
    candidates whose resident interval holds the point are offloaded one by one
    (:func:`_sweep_link` says in which order), each with the earliest free d2h time
    after its producer (ending by the point) and the latest free h2d time ending by its
    consumer (starting after the point), until the point is at L or none fits. L is
    searched by bisection over the levels the link's ranks reach; the plan with the
    lowest highest level (then summed levels) is kept. Links share nothing, so each is
    planned on its own. Candidates never placed are returned as failed: "skip" mode
    only. The levels are the placement's estimate (the compute events' changes and the
    reloads' allocations); the plan's real peaks come from the built timeline, as for
    every placement. Measured gain: docs/algorithms.md#63-the-offload-pass."""
    levels = _rank_levels(events)
    placed: dict[int, _Slots] = {}
    for lst in _by_link(cands).values():
        ranks = sorted({c.rank for c in lst})
        tops = sorted({round(lvl, 9) for r in ranks for _, lvl, _ in levels.get(r, [])})
        if not tops:
            continue
        best = None
        orders = {far_first: _TryOrder(lst, ranks, levels, far_first) for far_first in (False, True)}
        lo, hi = 0, len(tops) - 1
        while lo <= hi:  # bisection: the lowest target the sweep reaches (greedy, so kept only if better)
            mid = (lo + hi) // 2
            met = False
            for far_first in (False, True):
                got = _sweep_link(lst, ranks, levels, tops[mid], far_first, math.inf if best is None else best[0][0],
                                  orders[far_first])
                if got is None:  # over the target and over the best's highest level: neither meets nor wins
                    continue
                plan, reached = got
                key = (max(reached.values()), sum(reached.values()))
                met = met or key[0] <= tops[mid] + _EPS
                if best is None or key < best[0]:
                    best = (key, plan)
            if met:
                hi = mid - 1
            else:
                lo = mid + 1
        placed.update(best[1])
    return placed, [c for c in cands if id(c) not in placed]


def _sweep_link(cands: list[_Candidate], ranks: list[int], levels: dict[int, list[tuple[float, float, bool]]],
                target: float, far_first: bool, give_up: float = math.inf, order: "_TryOrder | None" = None
                ) -> tuple[dict[int, _Slots], dict[int, float]] | None:
    """One link's plan for ``target`` (:func:`_place_by_peak`) and each rank's highest
    estimated level under it. At a point, the covering candidate whose consumer comes
    first is tried first (its reload leaves the link free sooner), or with
    ``far_first`` the one whose consumer comes last (it covers more later points);
    neither wins everywhere. A candidate that finds no link time at one point is tried
    again at later points (its offload may end by then). A reload
    allocates again when it starts, so its start joins the sweep as one more point (its
    level: the rank's level there without the savings that ended by then).

    The points are read in time order, so per rank only the candidates not placed yet
    whose producer has ended (:class:`_Covering`) are looked at, in the order above: the
    same candidates tried in the same order as a scan of all of them. Cost: O(points ·
    log + tries), a try being a candidate that covers its point. None (given up) once a
    rank's level is over both ``target`` and ``give_up`` (the best plan's highest level so
    far): the whole sweep's highest level would be too, so it could neither meet ``target``
    nor beat that plan. ``order``: :class:`_TryOrder` of these arguments, made here when not
    given (:func:`_place_by_peak` makes it once per link and order for every target)."""
    base = {r: levels.get(r, []) for r in ranks}
    if order is None:
        order = _TryOrder(cands, ranks, levels, far_first)
    up: list[tuple[float, float]] = []
    down: list[tuple[float, float]] = []
    placed: dict[int, _Slots] = {}
    saved = {r: _Savings() for r in ranks}
    covering = {r: _Covering(order.ranks[r]) for r in ranks}
    reached = {r: 0.0 for r in ranks}
    # The points in time order: the allocation points (sorted once, with their levels) merged
    # with a heap of the reload starts booked (each later than the point that books it).
    points, point_levels, nxt, n = order.points, order.levels, 0, len(order.points)
    reloads: list[tuple[float, int]] = []
    while nxt < n or reloads:
        if reloads and (nxt == n or reloads[0] < points[nxt]):
            t, r = heapq.heappop(reloads)
            lv = base[r]
            i = bisect_right(lv, (t + _EPS, math.inf, True)) - 1
            now = (lv[i][1] if i >= 0 else 0.0) - saved[r].at(t)
        else:  # of two equal (time, rank) either comes first: they read the same level
            t, r = points[nxt]
            now = point_levels[nxt] - saved[r].at(t)
            nxt += 1
        if now > target + _EPS:
            cover = covering[r]
            open_, mine, j = cover.at(t), cover.cands, 0
            # In try order, in place: placing one deletes it where it stands (the same
            # candidates in the same order as going through a copy of the list).
            while j < len(open_):
                c = mine[open_[j]]
                if not _covers(c, t):
                    j += 1
                    continue
                slots = _slots_around(c, t, up, down, order.merged)
                if slots is None:
                    j += 1
                    continue
                placed[id(c)] = slots
                del open_[j]
                saved[r].add(slots[1], slots[2], c.amount)
                heapq.heappush(reloads, (slots[2], r))
                now -= c.amount
                if now <= target + _EPS:
                    break
        if now > reached[r]:
            reached[r] = now
            if now > give_up and now > target + _EPS:
                return None
    return placed, reached


_place_by_peak.needs_events = True  # type: ignore[attr-defined]


class _RankOrder(NamedTuple):
    """One rank's candidates in :func:`_sweep_link`'s try order and what :class:`_Covering`
    reads of them: the order's keys (``sign × consumer start``, ascending) and the indices by
    producer end."""

    cands: list[_Candidate]
    far_first: bool
    ends: list[float]
    by_producer: list[int]


class _TryOrder:
    """What every sweep of one link in one order shares, whatever its target: each rank's
    :class:`_RankOrder` and the allocation points ``(time, rank)``, sorted (a heap). Made once
    per link and order by :func:`_place_by_peak` (a sweep sorted them again per target)."""

    __slots__ = ("ranks", "points", "levels", "merged")

    def __init__(self, cands: list[_Candidate], ranks: list[int],
                 levels: dict[int, list[tuple[float, float, bool]]], far_first: bool) -> None:
        sign = -1 if far_first else 1
        #: whether the sweep may keep its busy lists as blocks (:func:`_book_merged`): every copy
        #: booked lasts over 2ε plus a margin over the rounding of times this large, so that
        #: ``t + d − ε > t`` and ``e − d + ε < e`` hold in floats at every time it reads
        span = max((abs(x) for c in cands for x in (c.forward_end, c.backward_start)), default=0.0)
        span += max((c.transfer_time for c in cands), default=0.0)
        self.merged = all(c.transfer_time <= _EPS or c.transfer_time > 2 * _EPS + 8 * math.ulp(2 * span)
                          for c in cands)
        mine: dict[int, list[_Candidate]] = {r: [] for r in ranks}
        for c in sorted(cands, key=lambda c: (sign * c.backward_start, c.forward_end, c.stage, c.microbatch)):
            mine[c.rank].append(c)
        self.ranks = {r: _RankOrder(lst, far_first, [sign * c.backward_start for c in lst],
                                    sorted(range(len(lst)), key=lambda k: lst[k].forward_end))
                      for r, lst in mine.items()}
        self.points = sorted((t, r) for r in ranks for t, _, alloc in levels.get(r, []) if alloc)
        #: each point's level (the rank's after every change up to ``t + ε``), as the sweep read it
        self.levels = [_level_at(levels[r], t) for t, r in self.points]


class _Covering:
    """One rank's candidates in :func:`_sweep_link`'s try order (``cands``), as indices: those
    not placed whose producer has ended by the time read (``forward_end ≤ t + ε``, which every
    candidate covering ``t`` meets), within the slice of the try order whose consumer can still
    come after ``t``. Times are read in order, so a candidate joins once and leaves when placed
    or when its consumer has passed for good."""

    __slots__ = ("cands", "far_first", "ends", "by_producer", "joined", "open")

    def __init__(self, shared: "_RankOrder") -> None:
        self.cands, self.far_first, self.ends, self.by_producer = shared  # the same every target
        self.joined = 0  #: how many of ``by_producer`` have joined
        self.open: list[int] = []  #: sorted indices into ``cands``

    def at(self, t: float) -> list[int]:
        """The indices to try at ``t`` (no earlier than any time read before), in try order:
        a superset of the candidates covering ``t`` and not placed — the list itself, not a
        copy: the caller deletes a candidate it places from it, where it stands."""
        cands, order, n = self.cands, self.by_producer, len(self.by_producer)
        while self.joined < n and cands[order[self.joined]].forward_end <= t + _EPS:
            insort(self.open, order[self.joined])
            self.joined += 1
        if self.far_first:  # the consumer at or before t: the tail of the order, for good
            cut = bisect_left(self.open, bisect_left(self.ends, -t + _EPS))
            del self.open[cut:]
            return self.open
        cut = bisect_left(self.open, bisect_right(self.ends, t + _EPS))
        del self.open[:cut]
        return self.open


class _Savings:
    """One rank's savings in :func:`_sweep_link`: ``(from, until, amount)`` booked, read at
    times that never go back. :meth:`at` is the sum over those not over by ``t``
    (``t < until − ε``) that have begun (``from ≤ t + ε``) — a function of ``t`` and the
    savings booked, since savings over stay over. While every amount is a whole number and
    their absolute sum is at most 2⁵³ (bytes, unit memory), every partial sum in any order is
    exact, so the sum is kept as savings begin and end (O(log n) a change). Else, as before:
    summed in booking order, the list filtered only when one is over and the sum of all of
    them kept while every one has begun and none is over — the same floats in the same order."""

    __slots__ = ("items", "over_at", "last_from", "total", "exact", "magnitude", "waiting", "begun")

    def __init__(self) -> None:
        self.items: list[tuple[float, float, float]] = []  #: in booking order (the inexact path)
        self.over_at = math.inf  #: the smallest ``until − ε``: a read at or after it drops one
        self.last_from = -math.inf  #: the latest ``from``
        self.total: float | None = 0.0  #: exact: the sum begun and not over; else that of every item
        self.exact = True
        self.magnitude = 0.0  #: the sum of every amount's absolute value
        self.waiting: list[tuple[float, float, float]] = []  #: exact: heap of (from, until, amount) not begun
        self.begun: list[tuple[float, float]] = []  #: exact: heap of (until − ε, amount) begun, not over

    def add(self, start: float, until: float, amount: float) -> None:
        """Book a saving of ``amount`` from ``start`` until ``until``."""
        self.items.append((start, until, amount))
        if self.exact:
            self.magnitude += abs(amount)
            if float(amount).is_integer() and self.magnitude <= _EXACT_SUMS:
                heapq.heappush(self.waiting, (start, until, amount))
                return
            self.exact = False  # the inexact path reads ``items`` (every saving booked) from now on
            self.over_at = min(x[1] - _EPS for x in self.items)
            self.last_from = max(x[0] for x in self.items)
            self.total = None
            return
        self.over_at = min(self.over_at, until - _EPS)
        self.last_from = max(self.last_from, start)
        self.total = None

    def at(self, t: float) -> float:
        """The savings at ``t`` (no earlier than any time read before)."""
        if self.exact:
            waiting, begun = self.waiting, self.begun
            while waiting and waiting[0][0] <= t + _EPS:
                _, until, amount = heapq.heappop(waiting)
                if t < until - _EPS:
                    heapq.heappush(begun, (until - _EPS, amount))
                    self.total += amount
            while begun and not t < begun[0][0]:
                self.total -= heapq.heappop(begun)[1]
            return self.total
        if not t < self.over_at:  # the sweep's time never goes back: savings over by now go for good
            self.items = [x for x in self.items if t < x[1] - _EPS]
            self.over_at = min((x[1] - _EPS for x in self.items), default=math.inf)
            self.last_from = max((x[0] for x in self.items), default=-math.inf)
            self.total = None
        if self.last_from <= t + _EPS:  # every one has begun: the sum over the whole list
            if self.total is None:
                self.total = sum(a for _, _, a in self.items)
            return self.total
        return sum(a for s0, _, a in self.items if s0 <= t + _EPS)


#: Whole numbers up to this add exactly in floats, in any order (:class:`_Savings`).
_EXACT_SUMS = float(2 ** 53)


def _level_at(lv: list[tuple[float, float, bool]], t: float) -> float:
    """The level of one rank's :func:`_rank_levels` after every change up to ``t + ε``."""
    i = bisect_right(lv, (t + _EPS, math.inf, True)) - 1
    return lv[i][1] if i >= 0 else 0.0


def _covers(c: _Candidate, t: float) -> bool:
    """Whether ``c``'s resident interval (producer end → consumer start) holds time ``t``."""
    return c.forward_end <= t + _EPS and t < c.backward_start - _EPS


def _rank_changes(events: list[TimedOp]) -> dict[int, list[tuple[float, int, float]]]:
    """Per rank (those with any), the activation changes of ``events`` in event order: an
    allocation at its op's start, a free at its end, as :func:`~pipeoffload.timeline.memory_sweep`
    takes them (:func:`_rank_levels` and :func:`_level_tops` sweep the same changes)."""
    changes: dict[int, list] = {}
    for e in events:
        if e.mem > 0:
            changes.setdefault(e.rank, []).append((e.start, ALLOC, e.mem))
        elif e.mem < 0:
            changes.setdefault(e.rank, []).append((e.end, FREE, e.mem))
    return changes


def _rank_levels(events: list[TimedOp]) -> dict[int, list[tuple[float, float, bool]]]:
    """Per rank, ``(time, level after every change at that time, allocates)`` for each
    time where ``events`` change the activation level, in time order. Peaks can only be
    where something allocates."""
    out: dict[int, list[tuple[float, float, bool]]] = {}
    for r, ch in _rank_changes(events).items():
        sweep = memory_sweep(ch)
        lst = out[r] = []
        allocates = False
        for i, (t, order, lvl) in enumerate(sweep):
            allocates = allocates or order == ALLOC
            if i + 1 == len(sweep) or sweep[i + 1][0] > t:  # the last change at time t
                lst.append((t, lvl, allocates))
                allocates = False
    return out


def _slots_around(c: _Candidate, t_peak: float, up: list[tuple[float, float]],
                  down: list[tuple[float, float]], merged: bool = False) -> _Slots | None:
    """The candidate's copies with the offload ending by ``t_peak`` and the reload
    starting after it, booked in its link's busy d2h (``up``) and h2d (``down``)
    intervals; None when the link has no such times. ``merged``: the busy lists are kept
    as blocks (:func:`_book_merged`; the same answers)."""
    d = c.transfer_time
    if d <= _EPS:
        return (c.forward_end, c.forward_end, c.backward_start, c.backward_start)
    limit = t_peak + _EPS  # the offload must end by then and the reload start after it
    off_start = _earliest_gap(up, c.forward_end, d, limit)
    if off_start + d > limit:
        return None
    rel_end = _latest_gap(down, c.backward_start, d, limit)
    if rel_end - d <= limit:
        return None
    book = _book_merged if merged else insort
    book(up, (off_start, off_start + d))
    book(down, (rel_end - d, rel_end))
    return (off_start, off_start + d, rel_end - d, rel_end)


def _book_merged(busy: list[tuple[float, float]], iv: tuple[float, float]) -> None:
    """Book ``iv`` in ``busy`` kept as blocks: runs of booked intervals each starting at or
    before the previous one's end become one ``(first start, last end)``.

    Why exact (:func:`_sweep_link` with ``merged``): the copies booked there overlap their
    neighbours by at most ε (the gap scans' tolerance) and last longer than 2ε, so in a run
    every end is past the previous one. A scan of :func:`_earliest_gap` for a copy of length
    ``d`` that reaches a run's first interval goes on through the run to its last end (``a ≤
    t < t + d − ε`` at every touching start; :attr:`_TryOrder.merged` checks ``d`` against
    the rounding of the link's times), which the block gives in one step; one that starts in
    a run's interval also ends at the run's last end. :func:`_latest_gap` is the mirror. The
    scans differ only where they stop early (past ``end_by`` / before ``start_after``), and
    there the caller rejects both answers. A new interval never falls inside a run (no
    gap there is longer than 2ε), so it only joins the block before and/or after it."""
    s, e = iv
    i = bisect_right(busy, iv)
    if i < len(busy) and busy[i][0] <= e:  # the next block starts by the new end: one block
        e = max(e, busy[i][1])
        del busy[i]
    if i > 0 and busy[i - 1][1] >= s:  # the block before ends at or after the new start
        busy[i - 1] = (busy[i - 1][0], max(busy[i - 1][1], e))
        return
    busy.insert(i, (s, e))


#: Placement heuristics tried by :func:`_plan_for_chunks`; the better plan is kept.
def _long_lived(place):
    """``place`` restricted to candidates whose F end → B start exceeds three round trips
    (the reference code's rule): on a crowded link the short-lived ones take time the
    long-lived ones need. The others are reported as short-lived. Used in "skip" mode
    only (the other modes promise to move every candidate that is worth it)."""
    def placer(cands: list[_Candidate], mode: str) -> tuple[dict[int, _Slots], list[_Candidate]]:
        return place([c for c in cands if c.backward_start - c.forward_end > 6 * c.transfer_time + _EPS], mode)
    placer.long_lived = True  # type: ignore[attr-defined]
    return placer


_STRATEGIES = {"value": _place_by_value, "deadline": _place_by_deadline,
               "value, long-lived": _long_lived(_place_by_value), "deadline, long-lived": _long_lived(_place_by_deadline),
               "slots, long-lived": _long_lived(_place_by_slots), "peak": _place_by_peak}


# --------------------------------------------------------------------------------------
# Internals: the result
# --------------------------------------------------------------------------------------


class _Draft:
    """One placement's plan, compared by its figures before its timeline is made: the
    transfers (solo speed-up applied), the per-rank peaks and the makespan, exactly as the
    timeline :meth:`result` makes would give them (:func:`_plan_peaks`); the placements
    that lose are never built."""

    __slots__ = ("ctx", "C", "events", "skipped", "transfers", "compute", "peak", "makespan")

    def __init__(self, ctx: _Context, C: int, events: list[TimedOp], cands: list[_Candidate],
                 placed: dict[int, _Slots], skipped: Counter) -> None:
        self.ctx, self.C, self.events, self.skipped = ctx, C, events, skipped
        self.transfers = [Transfer(c.rank, c.stage, c.chunk, c.microbatch, c.amount, *placed[id(c)], c.backward_start,
                                   c.link, c.window) for c in cands]
        _apply_solo_speedup(self.transfers, [c.forward_end for c in cands], ctx.link.solo_factor)
        _reloads_after_offloads(self.transfers)
        self.compute = _compute_figures(ctx, events)
        self.peak, self.makespan = _plan_peaks(self.compute, self.transfers), self.compute.makespan

    def result(self) -> OffloadResult:
        """The draft :class:`OffloadResult` (:func:`_build_result`)."""
        return _build_result(self)


class _ComputeFigures:
    """What every plan on one list of compute events shares: the events sorted by (rank,
    start) as a plan's timeline holds them, each rank's memory changes in the order
    :func:`~pipeoffload.timeline.memory_sweep` takes them, and the makespan."""

    __slots__ = ("events", "compute", "changes", "makespan", "keys", "levels", "magnitude")

    def __init__(self, events: list[TimedOp], num_ranks: int) -> None:
        self.events = events
        self.compute = sorted(events, key=lambda e: (e.rank, e.start))
        tl = Timeline(num_ranks=num_ranks, events=self.compute)
        self.changes = [sorted(pts, key=_TIME_ORDER) for pts in tl.memory_changes()]
        self.makespan = tl.makespan
        #: per rank, each change's (time, FREE|ALLOC) and the level after it (:func:`_plan_peaks`)
        self.keys = [[(t, o) for t, o, _ in ch] for ch in self.changes]
        self.levels = [list(accumulate(d for _, _, d in ch)) for ch in self.changes]
        #: the sum of every change's absolute value, or None when one is not a whole number
        whole = all(float(d).is_integer() for ch in self.changes for _, _, d in ch)
        self.magnitude = sum(abs(d) for ch in self.changes for _, _, d in ch) if whole else None


def _compute_figures(ctx: _Context, events: list[TimedOp]) -> _ComputeFigures:
    """:class:`_ComputeFigures` of ``events``, kept for the last events asked for (every
    placement of a plan asks for the same)."""
    hit = ctx.memo.get("compute_figures")
    if hit is None or hit.events is not events:
        hit = ctx.memo["compute_figures"] = _ComputeFigures(events, ctx.timeline.num_ranks)
    return hit


def _plan_peaks(compute: _ComputeFigures, transfers: list[Transfer]) -> list[float]:
    """Per rank, the peak of the timeline of ``compute``'s events and ``transfers``' ops
    (:func:`_transfer_events`), float for float what its ``peak_memory()`` gives: that
    sorts each rank's changes — the compute events' first, then the transfers' in their
    order — by (time, free before allocate), stably, and adds them up; here the compute
    changes come sorted already and are merged with the transfers' (sorted the same way),
    the compute change first of two equal keys, so the same floats are added in the same
    order. A transfer frees its amount when its offload ends and allocates it when its
    reload starts (its two other ops change nothing)."""
    own: list[list[Change]] = [[] for _ in compute.changes]
    for t in transfers:
        a = t.amount
        if a > 0:
            own[t.rank] += [(t.offload_end, FREE, -a), (t.reload_start, ALLOC, a)]
        elif a < 0:
            own[t.rank] += [(t.offload_end, ALLOC, -a), (t.reload_end, FREE, a)]
    if _whole_sums(compute, transfers):
        return [_clean(_merged_top(keys, levels, sorted(mine, key=_TIME_ORDER)))
                for keys, levels, mine in zip(compute.keys, compute.levels, own)]
    out = []
    for base, mine in zip(compute.changes, own):
        level = top = 0.0
        if mine:
            mine.sort(key=_TIME_ORDER)
            base = heapq.merge(base, mine, key=_TIME_ORDER)
        for _, _, delta in base:
            level += delta
            if level > top:
                top = level
        out.append(_clean(top))
    return out


def _whole_sums(compute: _ComputeFigures, transfers: list[Transfer]) -> bool:
    """Whether every change of ``compute`` and ``transfers`` is a whole number and their
    absolute values sum to at most 2⁵³: then every partial sum of them, in any order, is
    exact (as :class:`_Savings` uses it)."""
    if compute.magnitude is None:
        return False
    total = compute.magnitude
    for t in transfers:
        if not float(t.amount).is_integer():
            return False
        total += 2 * abs(t.amount)
    return total <= _EXACT_SUMS


def _merged_top(keys: list[tuple[float, int]], levels: list[float], mine: list[Change]) -> float:
    """The highest level (at least 0) of one rank's compute changes (their keys and levels
    after each, in order) merged with ``mine`` (sorted; a compute change first of two equal
    keys), as :func:`_plan_peaks`' running sum gives it where every partial sum is exact
    (:func:`_whole_sums`): the level after a compute change is its own level plus the
    transfers' sum so far, so each run of compute changes between two transfer changes
    contributes its highest level (one ``max`` over a slice) plus that sum."""
    top, extra, done = 0.0, 0.0, 0
    for t, o, delta in mine:
        at = bisect_right(keys, (t, o))  # the compute changes before this one
        if at > done:
            run = max(levels[done:at]) + extra
            if run > top:
                top = run
            done = at
        extra += delta
        level = (levels[at - 1] if at else 0.0) + extra
        if level > top:
            top = level
    if len(levels) > done:
        run = max(levels[done:]) + extra
        if run > top:
            top = run
    return top


def _build_result(draft: _Draft) -> OffloadResult:
    """The offloaded timeline of ``draft``, as a draft result: everything a plan is compared
    by (timeline, transfers, peaks, makespan) but the schedule's op lists and the host
    memory, which :func:`_finish` adds (the same values, made only for the plan that is kept)."""
    ctx, C, events, skipped, transfers = draft.ctx, draft.C, draft.events, draft.skipped, draft.transfers
    tl = ctx.timeline
    t_events = _transfer_events(transfers)
    compute = draft.compute.compute
    new_tl = Timeline(
        num_ranks=tl.num_ranks,
        events=compute + t_events,
        name=tl.name,
        num_microbatches=tl.num_microbatches,
        chunks=tl.chunks,
        memory_unit=tl.memory_unit,
        meta=dict(tl.meta),
    )
    if "baseline" not in ctx.memo:
        ctx.memo["baseline"] = (tl.memory_curves(), tl.peak_memory())
    peaks = ctx.memo["baseline"][1]
    new_tl.meta["baseline_memory_curves"] = None  # a placeholder keeps the key order (set by _finish)
    base_b = {e.op.key: e.start for e in ctx.base_events if e.op.kind.is_backward}
    delayed = sum(1 for e in events if e.op.kind.is_backward and e.start > base_b[e.op.key] + _EPS)
    res = OffloadResult(
        schedule=None,  # type: ignore[arg-type]  # set by _finish
        timeline=new_tl,
        offloaded_chunks=C,
        transfers=transfers,
        skipped={k: skipped[k] for k in sorted(skipped)},
        delayed=delayed,
        peak_no_offload=list(peaks),
        peak=list(draft.peak),
        host_memory=[],
        makespan_no_offload=ctx.base_makespan,
        makespan=draft.makespan,
    )
    new_tl.meta["offload"] = {"chunks": C, "transfers": len(transfers), "skipped": dict(res.skipped)}
    # What _finish needs, not the context itself: the context's memo keeps drafts, and a draft
    # holding its context made a cycle that outlived the session as garbage for the collector
    # (2.6 M objects after a 16k-GPU plan).
    res._pending = (ctx.schedule, ctx.memo["baseline"][0], C, compute, t_events)  # type: ignore[attr-defined]
    return res


def _finish(res: OffloadResult | None) -> OffloadResult | None:
    """A draft of :func:`_build_result` completed: the schedule with its transfer ops and
    the host memory (a finished result is returned as it is)."""
    pending = getattr(res, "_pending", None)
    if pending is None:
        return res
    sched, baseline_curves, C, compute, t_events = pending
    del res._pending  # type: ignore[union-attr]
    new_sched = sched.with_ranks(_insert_ops(sched, compute, t_events))
    new_sched.params = dict(sched.params, offload_chunks=C)
    res.schedule = new_sched  # type: ignore[union-attr]
    # The timeline's events are the compute events, which hold no host memory, then these.
    res.host_memory = [_clean(max(x for _, x in curve))  # type: ignore[union-attr]
                       for curve in _host_curves(t_events, res.timeline.num_ranks, 0.0)]  # type: ignore[union-attr]
    res.timeline.meta["baseline_memory_curves"] = baseline_curves  # type: ignore[union-attr]
    return res


def _transfer_events(transfers: list[Transfer]) -> list[TimedOp]:
    """The four timed ops of each transfer (of its window's kinds), on the "d2h" and
    "h2d" streams."""
    out: list[TimedOp] = []
    for t in transfers:
        off_start, off_end, rel_start, rel_end = (
            Op(k, t.stage, t.microbatch, t.rank, t.chunk) for k in WINDOW_KINDS[t.window]
        )
        out += [
            TimedOp(off_start, t.offload_start, t.offload_end, "d2h", 0.0),
            TimedOp(off_end, t.offload_end, t.offload_end, "d2h", -t.amount),
            TimedOp(rel_start, t.reload_start, t.reload_end, "h2d", t.amount),
            TimedOp(rel_end, t.reload_end, t.reload_end, "h2d", 0.0),
        ]
    return out


def _reloads_after_offloads(transfers: list[Transfer]) -> None:
    """Start no reload before its own offload's end. The placements let a reload touch its
    offload within the gap scans' tolerance, and the two copies' times are sums on two lanes
    rounded apart: a reload could start one unit in the last place before its offload ended,
    and the program, which orders transfer ops by time, then started the reload first (the
    deadlock property test found it: interleaved-1f1b p=4, m=9, v=4). Clamped here, after every
    adjustment, so that each activation's four transfer ops come in their one legal order."""
    for t in transfers:
        if t.reload_start < t.offload_end:
            t.reload_start = t.offload_end


def _apply_solo_speedup(transfers: list[Transfer], ready: list[float], solo: float) -> None:
    """Shorten, inside its planned slot, each reload whose link's other direction is
    idle for the whole slot (it starts later); then pack each link's offloads back to
    back from their producers' ends (``ready``), each at the solo rate where no reload
    runs meanwhile (:func:`_pack_offloads`). Offloads only end earlier and reloads only
    start later than planned, so every ordering and deadline of the plan still holds
    and no memory level rises."""
    if solo >= 1.0:
        return
    d2h: dict[int, list[tuple[float, float]]] = {}
    h2d: dict[int, list[tuple[float, float]]] = {}
    for t in transfers:
        if t.offload_end > t.offload_start:
            d2h.setdefault(t.link, []).append((t.offload_start, t.offload_end))
        if t.reload_end > t.reload_start:
            h2d.setdefault(t.link, []).append((t.reload_start, t.reload_end))
    for dct in (d2h, h2d):
        for lst in dct.values():
            lst.sort()
    # What each offload would become in its planned slot (solo when the other direction
    # is idle there): the packed position must end no later.
    planned = [t.offload_start + solo * (t.offload_end - t.offload_start)
               if _idle(h2d.get(t.link), t.offload_start, t.offload_end) else t.offload_end for t in transfers]
    solo_reloads: dict[int, list[tuple[float, float]]] = {}
    for t in transfers:
        if t.reload_end > t.reload_start and _idle(d2h.get(t.link), t.reload_start, t.reload_end):
            t.reload_start = t.reload_end - solo * (t.reload_end - t.reload_start)
            solo_reloads.setdefault(t.link, []).append((t.reload_start, t.reload_end))
    # Grouped in one pass (a scan of every transfer per link was quadratic with a link per rank):
    # the same sorted lists. A reload ending after it starts did so before (its start only moved
    # towards its end), so its link is in ``h2d``.
    reloads: dict[int, list[tuple[float, float]]] = {link: [] for link in h2d}
    for t in transfers:
        if t.reload_end > t.reload_start:
            reloads[t.link].append((t.reload_start, t.reload_end))
    for lst in reloads.values():
        lst.sort()
    for lst in solo_reloads.values():
        lst.sort()
    _pack_offloads(transfers, ready, planned, reloads, solo_reloads, solo)


def _pack_offloads(transfers: list[Transfer], ready: list[float], planned: list[float],
                   reloads: dict[int, list[tuple[float, float]]],
                   solo_reloads: dict[int, list[tuple[float, float]]], solo: float) -> None:
    """Per link, in planned order, start each offload as soon as its producer has ended
    and the previous offload is done: at the solo rate when no reload overlaps it, at
    the shared rate when it overlaps no solo-rate reload; else (or when that would end
    later than ``planned``) in its planned slot, ending at ``planned``. The reference
    code's warm-up adjustment, applied to every offload."""
    order = sorted(range(len(transfers)), key=lambda i: (transfers[i].link, transfers[i].offload_start))
    prev_end: dict[int, float] = {}
    for i in order:
        t = transfers[i]
        d = t.offload_end - t.offload_start
        if d <= _EPS:
            continue
        start = max(ready[i], prev_end.get(t.link, -math.inf))
        end = planned[i]
        if start + solo * d <= end + _EPS and _idle(reloads.get(t.link), start, start + solo * d):
            t.offload_start, end = start, start + solo * d
        elif start + d <= end + _EPS and _idle(solo_reloads.get(t.link), start, start + d):
            t.offload_start, end = start, start + d
        t.offload_end = end
        prev_end[t.link] = end


def _idle(busy: list[tuple[float, float]] | None, s: float, e: float) -> bool:
    """Whether no interval of ``busy`` (sorted, disjoint) overlaps ``(s, e)``."""
    if not busy:
        return True
    i = bisect_left(busy, (s, -math.inf))
    # An interval overlaps (s, e) if it starts before e and ends after s; they are
    # disjoint, so the one before s and those starting inside (s, e) are all to check.
    if i > 0 and busy[i - 1][1] > s + _EPS:
        return False
    return not (i < len(busy) and busy[i][0] < e - _EPS and busy[i][1] > s + _EPS)


_KIND_ORDER = {k: i for kinds in WINDOW_KINDS.values() for i, k in enumerate(kinds)}


def _insert_ops(sched: Schedule, compute: list[TimedOp], t_events: list[TimedOp]) -> list[list[Op]]:
    """Per-rank op lists in the order a runtime issues them.

    OFFLOAD_START right after its producer (F; B for a STASH_ op); OFFLOAD_END (release
    the device memory once the copy's event completes) before the first compute op
    starting at or after the copy's planned end, or earlier when needed to keep it
    ahead of its RELOAD_START; RELOAD_START before the compute op running when the copy
    is planned to begin (so it is issued no later than planned); RELOAD_END (wait for
    the copy) right before its consumer (B or BW; W for a STASH_ op). Hence, per
    (chunk, microbatch), list order is F < OFFLOAD_START < OFFLOAD_END < RELOAD_START <
    RELOAD_END < B, and B < STASH_OFFLOAD_START < … < STASH_RELOAD_END < W.
    """
    out: list[list[Op]] = []
    comp_of: list[list[TimedOp]] = [[] for _ in range(sched.num_ranks)]
    transfers_of: list[list[TimedOp]] = [[] for _ in range(sched.num_ranks)]
    for e in compute:
        comp_of[e.op.rank].append(e)
    for te in t_events:
        transfers_of[te.op.rank].append(te)
    for r in range(sched.num_ranks):
        comp = sorted(comp_of[r], key=lambda e: e.start)
        mine = transfers_of[r]
        pos = _transfer_positions(comp, mine)
        keyed: list[tuple] = [((i, 1, 0.0, 0, 0, 0), e.op) for i, e in enumerate(comp)]
        times = {te.op.key: te.start for te in mine}
        for key, at in pos.items():
            o = Op(key[0], key[1], key[2], r, sched.placement.chunk_of(key[1]))
            # An OFFLOAD_START is issued first thing after its producer.
            t = -math.inf if key[0] in (OpKind.OFFLOAD_START, OpKind.STASH_OFFLOAD_START) else times[key]
            keyed.append(((at, 0, t, _KIND_ORDER[key[0]], key[1], key[2]), o))
        keyed.sort(key=lambda x: x[0])
        out.append([o for _, o in keyed])
    return out


def _transfer_positions(comp: list[TimedOp], t_events: list[TimedOp]) -> dict:
    """For each transfer op of one rank (by key), the index of the compute op (in
    ``comp``, the rank's compute events by start) it is issued before (see
    :func:`_insert_ops`)."""
    starts = [e.start for e in comp]
    ends = [e.end for e in comp]
    pos_of = {e.op.key: i for i, e in enumerate(comp)}
    pos: dict[tuple[OpKind, int, int], int] = {}
    for te in t_events:
        o = te.op
        off_start, off_end, rel_start, _ = WINDOW_KINDS[o.kind.window]
        if o.kind is off_start:
            producer = OpKind.F if o.kind is OpKind.OFFLOAD_START else OpKind.B
            pos[o.key] = pos_of[(producer, o.stage, o.microbatch)] + 1
        elif o.kind is off_end:
            pos[o.key] = bisect_left(starts, te.end - _EPS)
        elif o.kind is rel_start:
            pos[o.key] = bisect_right(ends, te.start + _EPS)
        elif o.kind is OpKind.STASH_RELOAD_END:
            pos[o.key] = pos_of[(OpKind.W, o.stage, o.microbatch)]
        else:
            b = pos_of.get((OpKind.B, o.stage, o.microbatch))
            pos[o.key] = b if b is not None else pos_of[(OpKind.BW, o.stage, o.microbatch)]
    for key, at in list(pos.items()):
        kinds = WINDOW_KINDS[key[0].window]
        if key[0] is kinds[1]:
            # Keep list order OFFLOAD_END < RELOAD_START even when both copies'
            # boundaries fall inside one compute op (release is event-driven).
            pos[key] = min(at, pos[(kinds[2], key[1], key[2])])
    return pos
