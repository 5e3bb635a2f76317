"""Generating and timing candidates, with microbatch extrapolation and offload. Pure Python.

A candidate (split, family, m, recompute) is generated and timed (the timing pass) with its
per-GPU costs (:class:`~.sharding.CostTable`); offload is the offload step of the pass pipeline
(:func:`pipeoffload.passes.lower`), :func:`~pipeoffload.passes.offload.plan_offload` with
:class:`~pipeoffload.passes.offload.OffloadOptions`, on the timeline already simulated. Per-rank
activation peaks come from the schedules' op orders (:func:`order_peaks`, the timing's floats), so
the search can tell that a recompute setting does not fit before timing it.
Microbatches: a schedule is simulated with ``m`` only when ``m`` is within one period of its
warm-up (:func:`simulated_microbatches`); beyond that at ``m1`` and ``m2 = m1 + period`` with
``m1 ≡ m`` modulo the period, and the makespan is extrapolated linearly (exact for a periodic
steady state); per-rank peaks are the larger of the two runs' (GPipe's, which grow with m, are
scaled by ``m/m2``). Offload is planned on the ``m1`` timeline.

:class:`Simulator` keeps every generated schedule and every simulation, keyed by value: the
schedules of fixed-order generators by ``(schedule, p, m, v, g, limit)`` (shared across splits
and recompute settings), those of cost-aware generators by ``(schedule, p, m, v, g, recompute, tp,
sp)`` and the memory limit in bytes they were given (:func:`generator_limit`), the simulations by
``(split, family, m, recompute)``; a refusal is kept like a result.

Each simulation and offload plan runs with the cyclic garbage collector paused
(:func:`~pipeoffload.passes.issue_policy.paused_gc`): a generator and a timing allocate a few
objects per op and free few until they return, and every collection the allocations triggered
rescanned the caches' schedules and timelines (≈ 20 % of the planner's time). :func:`~.search.plan`
pauses it for the whole search too (the caches stay live to its end); refusals are kept without
their tracebacks (whose frames would hold the simulator in a cycle) and :meth:`Simulator.clear`
frees the caches when the search returns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import getitem
from typing import Any, Iterable

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError, PipeoffloadError, ScheduleError
from ..ir import ALL_KINDS, OVERLAP, CompactOrders, OpKind, Placement, Schedule
from ..passes.issue_policy import paused_gc
from ..passes.timing import OrderTimer
from ..passes.offload import OffloadOptions, OffloadResult, OffloadSession, serial_floors, serial_host_floor_within
from ..timeline import Timeline, _clean, running_peak
from .bounds import pipeline_bound
from .dp import dp_exposed
from .hostlink import host_links
from .workers import Prefetcher
from .refusals import Refused
from .sharding import CostTable, ShardedCosts, rank_states
from .space import BUDGET, FIXED_ORDER, Family, Problem, Split, placement_of

__all__ = ["Simulated", "Simulator", "generator_limit", "order_peaks", "simulated_microbatches"]

_COMPUTE = frozenset((OpKind.F, OpKind.B, OpKind.W, OpKind.BW))
#: The compute kinds are the first codes of a compact order (:data:`~pipeoffload.ir.ALL_KINDS`).
_N_COMPUTE = len(_COMPUTE)
assert frozenset(ALL_KINDS[:_N_COMPUTE]) == _COMPUTE

#: Steady-state rule per schedule: (warm-up microbatches in multiples of p, period) where period
#: "p"/"g" means p / the group size. Simulating m ≥ factor·p reaches the steady state. zb-auto
#: needs 3p: its memory-limited warm-up still changes from 2p to 2p + 3 on the calibrated A100
#: costs (ZB-1p of the 1.5B model: T(2p+1) − T(2p) = 1.2× the steady slope, extrapolated +16% at
#: m = 64; from 3p it is within 2.5% of an exact simulation at m = 8..128, docs/planner.md §4).
_STEADY: dict[str, tuple[int, str | int]] = {
    "gpipe": (1, 1), "1f1b": (2, 1), "zb-h1": (2, 1), "zb-h2": (2, 1), "zb-auto": (3, 1),
    "interleaved-1f1b": (2, "p"), "group-interleaved": (1, "g"),
}
_DEFAULT_STEADY = (2, 1)


def simulated_microbatches(m: int, p: int, schedule: str, g: int | None) -> tuple[int, int | None]:
    """``(m1, m2)``: simulate m1 and m2 = m1 + period, extrapolating linearly, or ``(m, None)``:
    simulate m itself.

    Guarantees: with ``m2``, ``m1`` is past ``schedule``'s warm-up on ``p`` ranks, ``m2 ≤ m`` and
    ``m − m1`` is a multiple of the period.
    """
    factor, period = _STEADY.get(schedule, _DEFAULT_STEADY)
    per = p if period == "p" else (g or 1) if period == "g" else int(period)
    lo = factor * p
    if m <= lo + per:
        return m, None
    m1 = lo + (m - lo) % per
    return m1, m1 + per


def order_peaks(schedule: Schedule, costs: Costs, memory: MemoryDeltas) -> list[float] | None:
    """Per-rank activation peaks of ``schedule`` timed with ``costs`` and ``memory``, from each rank's op
    order alone, without timing it; None when that is not exact (an op of 0 ms, or overlapped
    F&B pairs), and the timeline must say.

    Args:
        schedule: a generated schedule (compute ops per rank).
        costs, memory: the durations and memory deltas it is timed with.

    Returns:
        ``simulate(schedule, costs, memory).peak_memory()`` (the plain timing pass), float for
        float, or None.

    Guarantees: a rank's ops never overlap and each lasts > 0 ms, so its memory changes
    (an op's positive delta at its start, a negative one at its end, frees first at equal
    times) come in the rank's order in the timeline's sweep: the same sums in the same order.
    """
    if OVERLAP in schedule.params:
        return None
    pl = schedule.placement
    dur, mem = costs.duration_table(pl), memory.delta_table(pl)
    if any(d[k] <= 0 for d in dur for k in _COMPUTE):
        return None
    compact = schedule.compact
    if compact is not None:  # the arrays, without making the Op lists
        return _compact_peaks(compact, mem)
    return [_clean(running_peak(mem[o.stage][o.kind] for o in lst if o.kind in _COMPUTE)) for lst in schedule.ranks]


def _compact_peaks(compact: CompactOrders, mem: list[dict[OpKind, float]]) -> list[float]:
    """:func:`order_peaks`' loop over a schedule's compact orders: the same deltas added in
    the same order (the compute kinds are the codes below :data:`_N_COMPUTE` of
    :data:`~pipeoffload.ir.ALL_KINDS`; other ops change no memory)."""
    by_code = [tuple(row[k] for k in ALL_KINDS[:_N_COMPUTE]) for row in mem]
    peaks = []
    for kinds, stages in zip(compact.kinds, compact.stages):
        if kinds and max(kinds) >= _N_COMPUTE:
            deltas: Iterable[float] = (by_code[s][k] for k, s in zip(kinds, stages) if k < _N_COMPUTE)
        else:  # compute ops only (the planner's schedules): the same lookups, in C
            deltas = map(getitem, map(by_code.__getitem__, stages), kinds)
        peaks.append(_clean(running_peak(deltas)))
    return peaks


@dataclass
class Simulated:
    """A candidate simulated at one or two m, extrapolated to its own ``m``."""

    split: Split
    family: Family
    m: int
    recompute: bool
    schedule: Schedule  #: at the smaller simulated m (m1): offload and drawing use it
    timeline: Timeline  #: ``schedule`` timed (ms, bytes)
    sharded: ShardedCosts
    placement: Placement
    makespan: float  #: ms at the real m
    busy: list[float]  #: per rank, ms at the real m
    act: list[float]  #: per-rank activation peak, bytes at the real m
    dp_exposed: float
    simulated_m: int  #: the larger simulated m
    extrapolated: bool


class Simulator:
    """Generates, times and offloads the candidates of one :class:`~.space.Problem`.

    ``stats`` counts "simulations" (timed schedules), "offload_plans" and "generator_calls".
    """

    def __init__(self, problem: Problem, costs: CostTable | None = None) -> None:
        self.problem = problem
        self.costs = costs or CostTable(problem.model, problem.hardware, problem.node, problem.options.trim_edges,
                                        crosses_nodes=problem.gpus > problem.hardware.gpus_per_node)
        self._schedules: dict[tuple, Schedule | Refused] = {}
        self._simulations: dict[tuple[Split, Family, int, bool], Simulated | Refused] = {}
        self._peaks: dict[tuple[Split, Family, int, bool], list[float] | None] = {}
        #: :meth:`peaks_low`'s first-m peaks, until :meth:`peaks` takes them.
        self._first_peaks: dict[tuple[Split, Family, int, bool], list[float] | None] = {}
        self._bounds: dict[tuple[Split, Family, int, bool], dict | None] = {}
        self._floor_lows: dict[tuple[Split, Family, int, bool], dict | None] = {}
        #: Per schedule timed (by identity; the schedule is held with it): its order timer.
        self._timers: dict[int, tuple[Schedule, OrderTimer]] = {}
        #: The offload session of the last candidate offloaded (:meth:`offload`), by its inputs.
        self._session: tuple[tuple, OffloadSession] | None = None
        self.stats = {"simulations": 0, "offload_plans": 0, "generator_calls": 0}
        #: Helper processes simulating ahead (:mod:`~.workers`), while :func:`~.search.plan` runs.
        self.prefetch: Prefetcher | None = None

    def clear(self) -> None:
        """Drop every schedule, simulation and offload session kept (:func:`~.search.plan` does
        when it returns: its result holds none of them)."""
        for cache in (self._schedules, self._simulations, self._peaks, self._first_peaks, self._bounds,
                      self._floor_lows, self._timers):
            cache.clear()
        self._session = None

    # -- schedules ------------------------------------------------------------------------------
    def schedule(self, family: Family, p: int, m: int, recompute: bool, tp: int, sp: bool = True,
                 dp: int = 1) -> Schedule:
        """``family``'s schedule on ``p`` ranks with ``m`` microbatches (cost-aware generators get
        the per-GPU costs of ``recompute``, ``tp``, ``sp`` and the limit of :meth:`mem_limit`, which
        depends on ``dp`` only at the budget); raises :class:`Refused` ("m" or "generator")."""
        key, sh, limit = self._schedule_key(family, p, m, recompute, tp, sp, dp)
        hit = self._schedules.get(key)
        if hit is None:
            hit = self._generate(family, p, m, sh, limit)
            self._schedules[key] = hit
        if isinstance(hit, Refused):
            raise hit.again()
        return hit

    def _schedule_key(self, family: Family, p: int, m: int, recompute: bool, tp: int, sp: bool,
                      dp: int) -> tuple[tuple, ShardedCosts | None, float | None]:
        """:meth:`schedule`'s cache key (the generator's inputs), with the per-GPU costs and the
        limit a cost-aware generator gets; raises :class:`Refused` ("same") where zb-auto at the
        budget would be zb-2p's schedule."""
        key: tuple = (family.schedule, p, m, family.v, family.g(p))
        sh, limit = None, None
        if family.schedule in FIXED_ORDER:
            key += (family.limit,)
        else:  # the generator's inputs: costs and the limit in bytes (not how the limit was named)
            sh = self.costs.sharded(recompute, p, family.v, tp, sp)
            limit = self.mem_limit(family, p, sh, dp)
            key += (recompute, tp, sp, limit)
            if family.limit == BUDGET and family.schedule == "zb-auto" and \
                    limit == self.mem_limit(dataclasses.replace(family, limit=2), p, sh, dp):
                raise Refused("same", "the budget leaves at least twice 1F1B's memory: the same schedule as zb-2p")
        return key, sh, limit

    def made_schedules(self, keys: list[tuple[Split, Family, int, bool]]) -> dict[tuple, Schedule | Refused]:
        """The schedules (or refusals) :meth:`simulate` of ``keys`` reads that this simulator has
        made already, by their cache keys: a helper handed ``keys`` takes them on
        (:meth:`adopt_schedules`) instead of generating them again."""
        made = {}
        for split, family, m, recompute in keys:
            for mm in _runs(split, family, m):
                try:
                    key = self._schedule_key(family, split.pp, mm, recompute, split.tp, split.sp, split.dp)[0]
                except Refused:
                    continue
                if key in self._schedules:
                    made[key] = self._schedules[key]
        return made

    def adopt_schedules(self, made: dict[tuple, Schedule | Refused]) -> None:
        """Keep ``made`` (another simulator's :meth:`made_schedules`) where this one has none."""
        for key, hit in made.items():
            self._schedules.setdefault(key, hit)

    def mem_limit(self, family: Family, p: int, sh: ShardedCosts, dp: int = 1) -> float | None:
        """:func:`generator_limit` for this simulator's problem."""
        return generator_limit(self.problem, family, p, sh, dp)

    def _generate(self, family: Family, p: int, m: int, sh: ShardedCosts | None,
                  limit: float | None) -> Schedule | Refused:
        from ..schedules import ScheduleSpec, build

        kw: dict[str, Any] = {"v": family.v, "g": family.g(p)}
        if sh is not None:
            kw.update(costs=sh.costs, memory=sh.memory)
        if limit is not None:
            if limit <= 0:
                return Refused("oom", "the budget leaves no memory for activations", over=-limit)
            kw["mem_limit"] = limit
        self.stats["generator_calls"] += 1
        try:
            return build(ScheduleSpec(family.schedule, p, m, **kw), check=False)
        except ParameterError as e:
            return Refused("m" if e.param in ("m", "-m") and "needs m" in str(e) else "generator", str(e))
        except Exception as e:  # noqa: BLE001 - a generator is a plug-in: its failure rejects the candidate
            return Refused("generator", f"{type(e).__name__}: {e}")

    # -- simulation -----------------------------------------------------------------------------
    def simulate(self, split: Split, family: Family, m: int, recompute: bool) -> Simulated:
        """The candidate simulated (cached); raises :class:`Refused` when it cannot be."""
        key = (split, family, m, recompute)
        hit = self._simulations.get(key)
        if hit is None:
            got = self.prefetch.take(key) if self.prefetch is not None else None
            if got is not None:  # a helper's result, the same floats (the search never waits for one)
                hit = got[0]
            else:
                try:
                    with paused_gc():  # see the module docstring
                        hit = self._simulate(split, family, m, recompute)
                except Refused as e:
                    hit = e.with_traceback(None)  # kept: its frames would hold this simulator in a cycle
            self._simulations[key] = hit
        if isinstance(hit, Refused):
            raise hit.again()
        return hit

    def simulate_ahead(self, keys: list[tuple[Split, Family, int, bool]], rank: float = 0.0) -> None:
        """Have a helper process make :meth:`simulate` of ``keys`` (one candidate's settings)
        before they are asked for, lowest ``rank`` first (:meth:`~.workers.Prefetcher.submit`),
        where :attr:`prefetch` is set; else nothing."""
        if self.prefetch is not None:
            self.prefetch.submit(keys, self.made_schedules(keys), rank)

    def call_ahead(self, tag: tuple, fn: Any, args: tuple, near: tuple, rank: float) -> None:
        """Have the helper that simulated the key ``near`` make ``fn(self, *args)`` (a function of
        the key's simulation and this simulator's state alone) before :meth:`take_ahead` asks for
        ``tag``, by ``rank`` among its tasks (:meth:`~.workers.Prefetcher.submit`), where
        :attr:`prefetch` is set; else nothing."""
        if self.prefetch is not None:
            self.prefetch.submit_call(tag, fn, args, near, rank)

    def take_ahead(self, tag: tuple) -> tuple[Any] | None:
        """``(result,)`` of a :meth:`call_ahead` a helper has sent back, else None (the caller
        makes it)."""
        return self.prefetch.take(tag) if self.prefetch is not None else None

    def peaks(self, split: Split, family: Family, m: int, recompute: bool) -> list[float] | None:
        """The candidate's per-rank activation peaks (bytes, at the real ``m``, as
        :meth:`simulate` gives them in ``Simulated.act``) from its schedules' op orders, without
        timing them (:func:`order_peaks`; cached); None where only a timing can say. Raises
        :class:`Refused` as :meth:`simulate` does when the schedule cannot be generated."""
        key = (split, family, m, recompute)
        if key not in self._peaks:
            p = split.pp
            sh = self.costs.sharded(recompute, p, family.v, split.tp, split.sp)
            with paused_gc():
                runs = [(mm, self.schedule(family, p, mm, recompute, split.tp, split.sp, split.dp))
                        for mm in _runs(split, family, m)]
            first = self._first_peaks.pop(key, _NOT_MADE)  # peaks_low's, when it made them
            per_run = [first if i == 0 and first is not _NOT_MADE else order_peaks(sched, sh.costs, sh.memory)
                       for i, (_, sched) in enumerate(runs)]
            self._peaks[key] = None if any(x is None for x in per_run) else \
                _extrapolated_peaks(m, [(mm, x) for (mm, _), x in zip(runs, per_run)], family.schedule)  # type: ignore[misc]
        return self._peaks[key]

    def peaks_low(self, split: Split, family: Family, m: int, recompute: bool) -> list[float] | None:
        """Per rank, activation bytes that :meth:`peaks` is at least, from the first simulated
        m's op orders alone (its second m is not generated): :meth:`peaks` takes, rank by rank,
        the larger of the two m's peaks (:func:`_extrapolated_peaks`), so each is at least the
        first's, float for float; where ``m`` itself is simulated they are :meth:`peaks`. None
        for GPipe over two m (its peaks are scaled), for zb-auto (its second m resumes the
        first's greedy runs when made right after it: made later, they run again) and where only
        a timing can say. Raises
        :class:`Refused` as :meth:`simulate` does when that schedule cannot be generated."""
        key = (split, family, m, recompute)
        if key in self._peaks:
            return self._peaks[key]
        m1, m2 = simulated_microbatches(m, split.pp, family.schedule, family.g(split.pp))
        if m2 is None:
            return self.peaks(split, family, m, recompute)
        if family.schedule in ("gpipe", "zb-auto"):
            return None  # GPipe's peaks are scaled; zb-auto's m2 resumes its m1 runs if made right after
        if key not in self._first_peaks:
            sh = self.costs.sharded(recompute, split.pp, family.v, split.tp, split.sp)
            with paused_gc():
                sched = self.schedule(family, split.pp, m1, recompute, split.tp, split.sp, split.dp)
            self._first_peaks[key] = order_peaks(sched, sh.costs, sh.memory)  # :meth:`peaks` takes them on
        return self._first_peaks[key]

    def state(self, split: Split, family: Family, recompute: bool) -> list[tuple[float, float]]:
        """Per rank: (parameter bytes, gradient + optimizer bytes) per GPU, as a configuration
        of the candidate counts them (:func:`~.sharding.rank_states`)."""
        sh = self.costs.sharded(recompute, split.pp, family.v, split.tp, split.sp)
        return rank_states(sh, placement_of(family, split.pp), split.dp, self.problem.options.dp_sharding)

    def _simulate(self, split: Split, family: Family, m: int, recompute: bool) -> Simulated:
        p = split.pp
        sh = self.costs.sharded(recompute, p, family.v, split.tp, split.sp)
        placement = placement_of(family, p)
        runs = []
        for mm in _runs(split, family, m):
            sched = self.schedule(family, p, mm, recompute, split.tp, split.sp, split.dp)
            runs.append((mm, sched, self._time(sched, sh)))
        floor = pipeline_bound(sh.costs.group_costs, placement, m)  # type: ignore[arg-type]
        known = self.peaks(split, family, m, recompute)
        makespan, busy, peaks = _extrapolate(m, [(mm, tl) for mm, _, tl in runs], family.schedule, floor, known)
        (_, first_schedule, first_timeline), (last_m, _, last_timeline) = runs[0], runs[-1]
        exposed = dp_exposed(last_timeline, sh, split, placement, self.problem.node, self.problem.hardware)
        return Simulated(split, family, m, recompute, first_schedule, first_timeline, sh, placement, makespan,
                         busy, peaks, exposed, last_m, len(runs) == 2 or last_m != m)

    def _time(self, schedule: Schedule, sh: ShardedCosts) -> Timeline:
        """``schedule`` timed with ``sh`` (memory in bytes): ``lower(schedule, sh.costs, sh.memory,
        memory_unit="bytes", validated=True).timeline``; a schedule the timing pass rejects
        (deadlock) is refused as the generator's fault. Generated schedules are validated by
        their generator, so they are not checked again (the second check cost about as much
        as the timing). Each schedule's timings go through one
        :class:`~pipeoffload.passes.timing.OrderTimer`, which replays its first timing's event
        order for the others (a fixed-order schedule is timed once per split and recompute
        setting that share it): the same timeline, float for float."""
        self.stats["simulations"] += 1
        hit = self._timers.get(id(schedule))
        if hit is None or hit[0] is not schedule:  # the schedule is held, so its id is not reused
            hit = self._timers[id(schedule)] = (schedule, OrderTimer(schedule))
        try:
            return hit[1].simulate(sh.costs, sh.memory, memory_unit="bytes")
        except ScheduleError as e:
            raise Refused("generator", f"schedule deadlocks: {e}") from None

    # -- offload --------------------------------------------------------------------------------
    def _offload_options(self, split: Split, sim: Simulated, chunks: int, stash: bool) -> OffloadOptions:
        opts = self.problem.options
        links = host_links(self.problem.hardware, split.tp, opts.link_group)
        return OffloadOptions(offload_chunks=chunks,
                              transfer_times=tuple(t * links.slowdown for t in sim.sharded.transfer_ms),
                              link_group=links.link_group, solo_factor=opts.solo_factor,
                              on_infeasible="skip", postpone_warmup=True, stash=stash)

    def offload_bounds(self, split: Split, family: Family, m: int, recompute: bool
                       ) -> dict[int, tuple[list[float], list[float]]] | None:
        """Per C = 1..v: per rank, activation bytes that no offload plan of :meth:`offload`
        with C chunks (without the stash window) goes below, as the configuration counts them
        (the pass's floor, :func:`~pipeoffload.passes.offload.offload_bounds`, plus what the
        plain peak grew by between ``m1`` and ``m``), and host bytes no such plan exceeds;
        None where the pass cannot say (cached). Raises :class:`Refused` as :meth:`simulate`."""
        key = (split, family, m, recompute)
        if key not in self._bounds:
            # In the session the plans use (they share its postponed warm-up); what it makes (the
            # timeline's events, the context's tables) lives as long as the session, so it goes
            # to the collector's oldest generation unscanned (a young collection would scan it,
            # and its promotion set off full collections of the whole search: 14 s of the 405B plan).
            with paused_gc(promote=True):
                sim, session = self._offload_session(split, family, m, recompute, False)
                got = session.bounds(range(1, sim.schedule.chunks + 1))
            peak0 = sim.timeline.peak_memory()
            self._bounds[key] = None if got is None else {
                C: ([a + max(0.0, b - c) for a, b, c in zip(floor, sim.act, peak0)], host)
                for C, (floor, host) in got.items()}
        return self._bounds[key]

    def offload_floor_lows(self, split: Split, family: Family, m: int,
                           recompute: bool) -> dict[int, list[float]] | None:
        """Per C, per rank, activation bytes that :meth:`offload_bounds`' floor is at least, up
        to the rounding of sums taken in another order (cached): the floors read in each rank's
        order from the ``m1`` timeline's serial columns
        (:func:`~pipeoffload.passes.offload.serial_floors`), as the configuration counts them,
        without an offload session; None where the timeline holds none (a session read it)."""
        key = (split, family, m, recompute)
        if key not in self._floor_lows:
            sim = self.simulate(split, family, m, recompute)
            lows = serial_floors(sim.timeline, range(1, sim.schedule.chunks + 1))
            if lows is not None:
                peak0 = sim.timeline.peak_memory()
                lows = {C: [a + max(0.0, b - c) for a, b, c in zip(floor, sim.act, peak0)] for C, floor in lows.items()}
            self._floor_lows[key] = lows
        return self._floor_lows[key]

    def offload_ceiling(self, split: Split, family: Family, m: int, recompute: bool,
                        chunks: int) -> tuple[float, float] | None:
        """:meth:`~pipeoffload.passes.offload.OffloadSession.peak_ceiling` of :meth:`offload`'s
        plan for ``chunks`` (no stash window), in the candidate's session, without making the
        plan: (a highest activation peak on the ``m1`` timeline it does not exceed, its
        makespan change), or None where the pass cannot say."""
        with paused_gc():
            return self._offload_session(split, family, m, recompute, False)[1].peak_ceiling(chunks)

    def offload_host_floor(self, split: Split, family: Family, m: int, recompute: bool,
                           chunks: int) -> list[float] | None:
        """:meth:`~pipeoffload.passes.offload.OffloadSession.host_floor` of :meth:`offload`'s
        plan for ``chunks`` (no stash window), in the candidate's session, without making the
        plan: per rank, pinned host bytes the plan holds at least; None where the pass cannot say."""
        with paused_gc():
            return self._offload_session(split, family, m, recompute, False)[1].host_floor(chunks)

    def offload_host_floor_within(self, split: Split, family: Family, m: int, recompute: bool,
                                  chunks: int, room: list[float]) -> list[float] | None:
        """:meth:`~pipeoffload.passes.offload.OffloadSession.host_floor_within`: per rank, pinned
        host bytes :meth:`offload`'s plan for ``chunks`` holds at least if no rank's activation
        peak on the ``m1`` timeline exceeds its ``room``; no draft is made, nor a session while
        the timeline's columns are serial (:func:`~pipeoffload.passes.offload.serial_host_floor_within`).
        None where the pass cannot say."""
        got = serial_host_floor_within(self.simulate(split, family, m, recompute).timeline, room)
        if got is not None:
            return got
        with paused_gc():
            return self._offload_session(split, family, m, recompute, False)[1].host_floor_within(chunks, room)

    def offload_host_floor_cap(self, split: Split, family: Family, m: int, recompute: bool,
                               chunks: int) -> float | None:
        """:meth:`~pipeoffload.passes.offload.OffloadSession.host_floor_cap`: a number that no
        rank's :meth:`offload_host_floor` exceeds, without its draft; None where that is None."""
        with paused_gc():
            return self._offload_session(split, family, m, recompute, False)[1].host_floor_cap(chunks)

    def offload(self, split: Split, family: Family, m: int, recompute: bool, chunks: int,
                stash: bool = False) -> tuple[Simulated, OffloadResult]:
        """The candidate simulated, and the offload pass's plan for chunks ``0..chunks−1`` of every
        rank on its ``m1`` timeline (skip mode: a reload that cannot finish before its backward is
        dropped; warm-up forwards postponed; the problem's host-link model and the groups'
        transfer times), with the B→W stash window too when ``stash``. Raises :class:`Refused`
        ("offload") when the pass refuses."""
        sim = self.simulate(split, family, m, recompute)
        self.stats["offload_plans"] += 1
        try:  # the offload step of passes.lower on the timeline already made (lower would time it again)
            with paused_gc():
                result = self._offload_session(split, family, m, recompute, stash)[1].plan(chunks)
        except PipeoffloadError as e:
            raise Refused("offload", f"offload pass refused C={chunks}{' +stash' if stash else ''}: {e}") from None
        return sim, result

    def _offload_session(self, split: Split, family: Family, m: int, recompute: bool,
                         stash: bool) -> tuple[Simulated, OffloadSession]:
        """The candidate simulated and its offload session (:class:`~pipeoffload.passes.offload.
        OffloadSession`), kept for the last candidate asked for: one candidate's bounds and tries
        C = 1, 2, … share it."""
        sim = self.simulate(split, family, m, recompute)
        settings = self._offload_options(split, sim, 1, stash)
        key = (split, family, m, recompute, settings)
        if self._session is None or self._session[0] != key:
            self._session = (key, OffloadSession(sim.schedule.compute_only(), sim.timeline,  # the timing pass's:
                                                 comm=sim.sharded.costs.comm, options=settings, timed=True))
        return sim, self._session[1]


def _runs(split: Split, family: Family, m: int) -> list[int]:
    """The microbatch counts a candidate is simulated at (:func:`simulated_microbatches`, the
    second left out where ``m`` itself is simulated)."""
    return [mm for mm in simulated_microbatches(m, split.pp, family.schedule, family.g(split.pp)) if mm is not None]


_NOT_MADE = object()  #: :meth:`Simulator.peaks`' mark for first-m peaks not made by :meth:`Simulator.peaks_low`


def generator_limit(problem: Problem, family: Family, p: int, sh: ShardedCosts, dp: int = 1) -> float | None:
    """The activation limit (bytes per rank) a memory-limited generator gets, as ``pipeoffload
    best`` gives it in its units: zb-auto and zb-v ``limit`` × 1F1B's peak (``p`` whole-stage
    forwards) plus the largest B delta (what a B holds on top, which the unit model lacks);
    at :data:`~.space.BUDGET` what the budget leaves for activations on the fullest rank
    (budget − parameters − gradients and optimizer states, ``dp`` replicas), at most the 2×
    limit (``best`` caps it alike); v-auto V-Half's
    published peak in whole-stage forwards plus the largest B delta. None for the others."""
    from ..schedules.vshape import unit_peak_bound
    from ..schedules.zb_auto import default_limit

    name = family.schedule
    if name not in ("zb-auto", "zb-v", "v-auto"):
        return None
    placement = placement_of(family, p)
    b_plus = max(0.0, max(d[1] for d in sh.memory.group_deltas))  # type: ignore[union-attr]
    if family.limit == BUDGET:  # capped at ZB-2p's: the ZB generators gain nothing beyond it
        states = rank_states(sh, placement, dp, problem.options.dp_sharding)
        return min(problem.budget - max(a + b for a, b in states), 2 * default_limit(placement, sh.memory) + b_plus)
    if name == "v-auto":
        per_rank = [0.0] * p
        for s, d in enumerate(sh.memory.delta_table(placement)):
            per_rank[placement.rank_of(s)] += d[OpKind.F]
        return unit_peak_bound("v-half", p) * max(per_rank) + b_plus
    return float(family.limit or 1) * default_limit(placement, sh.memory) + b_plus


def _extrapolate(m: int, runs: list[tuple[int, Timeline]], schedule: str, floor: float = 0.0,
                 peaks: list[float] | None = None) -> tuple[float, list[float], list[float]]:
    """(makespan ms, per-rank busy ms, per-rank activation peak bytes) at ``m`` from timelines at
    one or two simulated m (see the module docstring). The makespan is at least the busiest
    rank's busy time and ``floor`` (:func:`~.bounds.pipeline_bound`, which a timed schedule
    always meets; an extrapolation below it would be impossible, and the planner prunes with it).
    ``peaks``: the peaks at ``m`` when already known (:meth:`Simulator.peaks`), else from the
    timelines."""
    (ma, ta), (mb, tb) = runs[0], runs[-1]
    if peaks is None:
        peaks = _extrapolated_peaks(m, [(mm, tl.peak_memory()) for mm, tl in runs], schedule)
    if len(runs) == 2:
        ta_end, tb_end = ta.makespan, tb.makespan
        makespan = tb_end + (m - mb) * ((tb_end - ta_end) / (mb - ma))
    else:
        makespan = tb.makespan
    busy = [b * m / mb for b in tb.busy()]
    makespan = max(makespan, max(busy), floor)
    return makespan, busy, peaks


def _extrapolated_peaks(m: int, runs: list[tuple[int, list[float]]], schedule: str) -> list[float]:
    """Per-rank activation peaks at ``m`` from the peaks of the one or two simulated m: the larger
    of the two (they stop growing after the warm-up), GPipe's scaled by ``m`` over the larger m
    (all forwards first: its peak grows with m)."""
    mb, peaks = runs[-1]
    if len(runs) == 2:
        peaks = [max(x, y) for x, y in zip(peaks, runs[0][1])]
    if schedule == "gpipe" and mb != m:
        peaks = [x * m / mb for x in peaks]
    return peaks
