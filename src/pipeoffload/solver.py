"""The exact scheduler: F/B/W ordering under a memory limit as a constraint program (OR-Tools CP-SAT).

``solve(p, m, …)`` returns the schedule with the lowest bubble rate (the ZB paper's
metric, :attr:`~pipeoffload.timeline.Timeline.bubble_rate`) that exists for the given
placement, costs, comm latency and memory limit, or — when the time limit ends first —
the best one found with a proven lower bound. docs/solver.md describes the model.

The model (times and memory scaled to integers, exactly when the numbers are simple
fractions):

- one interval per op (F, B, W of every layer group and microbatch; the backward is
  always split), its duration from ``costs``; the ops of one rank never overlap;
- dependencies as in the timing pass (docs/algorithms.md#12-ops-and-dependencies),
  with ``comm`` across ranks; each (kind, layer group) takes its microbatches in order
  (as every schedule of the papers does);
- each rank's first op, the forward of its first layer group for microbatch 0, starts
  as soon as its input can arrive (as the timing pass would start it), so that timing
  the solver's order with :func:`~pipeoffload.passes.timing.simulate` never lengthens a
  rank's span;
- a reservoir per rank: an op's positive memory delta is taken at its start, a negative
  one given back at its end, the level never above ``mem_limit``;
- objective: the longest per-rank span (first op's start to last op's end).

With ``offload``, every (layer group, microbatch) of the first ``offload_chunks``
chunks may also be moved to the host between its F and its B: an optional device→host
and host→device copy of fixed duration on its rank's host link (ranks grouped
``link_group`` at a time, one copy per direction at a time), the F's memory given back
when the first copy ends and taken again when the second starts, the second ending
before the B starts. CP-SAT starts from the offload pass's limit mode on the placement's
generators (``plan_offload(..., mem_limit=...)``, the same link, no solo speed-up) and, on
the loop placement, on the rank window orders (:mod:`.passes.offload_search`), and
returns that plan with its bound when it finds nothing better in time, so the result is
never worse than the heuristic's.

Pure Python apart from ``ortools`` (the optional ``pipeoffload[solver]`` extra), imported
on first use; never imports torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

from .costs import Costs, MemoryDeltas
from .errors import ParameterError, require
from .ir import Op, OpKind, Placement, Schedule, build_schedule
from .passes.timing import dependencies, simulate
from .timeline import TimedOp, Timeline

__all__ = ["SolveResult", "SolverOffload", "solve", "available"]

_KINDS = (OpKind.F, OpKind.B, OpKind.W)
#: Largest common denominator accepted for exact integer scaling of times or memory.
_MAX_DENOMINATOR = 10_000


@dataclass(frozen=True)
class SolverOffload:
    """Offload decisions for the solver: chunks ``c < offload_chunks`` may be moved to the
    host between F and B; one copy takes ``offload_time`` × that chunk's F+B+W (the
    offload pass's convention); ``link_group`` ranks share a host link."""

    offload_chunks: int = 1
    offload_time: float = 0.0
    link_group: int = 2


@dataclass
class SolveResult:
    """What :func:`solve` found.

    ``schedule`` is a normal validated schedule (compute ops in the solver's order) and
    ``timeline`` its timing by the timing pass (with offload: the solver's own timing,
    which the transfers were planned against). ``status`` is "optimal" (proven) or
    "feasible" (time limit reached); ``span``/``span_bound`` are the solver's longest
    rank span and its proven lower bound, ``bubble_bound`` the bubble rate that bound
    allows (no schedule of the model has a lower one) and ``gap`` the relative gap
    between the two spans (0 when optimal)."""

    schedule: Schedule
    timeline: Timeline
    status: str
    span: float
    span_bound: float
    bubble_bound: float
    gap: float
    wall_s: float
    exact_scaling: bool
    offload: object | None = None  #: an OffloadResult when offload decisions were modelled
    params: dict = field(default_factory=dict)

    @property
    def optimal(self) -> bool:
        return self.status == "optimal"

    def summary(self) -> dict:
        """JSON-ready description (the CLI's ``solver`` block)."""
        return {"status": self.status, "optimal": self.optimal, "gap": round(self.gap, 6),
                "span": round(self.span, 9), "span_bound": round(self.span_bound, 9),
                "bubble_rate": round(self.timeline.bubble_rate, 9), "bubble_bound": round(self.bubble_bound, 9),
                "wall_s": round(self.wall_s, 3), "exact_scaling": self.exact_scaling, **self.params}


def available() -> bool:
    """Whether OR-Tools (the ``pipeoffload[solver]`` extra) is installed."""
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def _cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise ParameterError(
            "solver", "needs OR-Tools: pip install 'pipeoffload[solver]' (or pip install ortools)") from None
    return cp_model


def solve(
    p: int,
    m: int,
    *,
    v: int | None = None,
    placement: str = "loop",
    costs: Costs | None = None,
    memory: MemoryDeltas | None = None,
    mem_limit: float | None = None,
    time_limit: float = 60.0,
    offload: SolverOffload | None = None,
    workers: int | None = None,
    hint: Schedule | None = None,
) -> SolveResult:
    """The lowest-bubble schedule of ``p`` ranks and ``m`` microbatches on the ``"loop"``
    (``v`` chunks per rank, default 1) or ``"v"`` placement (v = 2) under ``mem_limit``
    (in the units of ``memory``; default 1F1B's peak, ``p`` whole-stage forwards), found
    by CP-SAT within ``time_limit`` seconds (see the module docstring).

    ``hint``: a schedule on the same placement to start from (default: the best of the
    project's generators that fits the limit; with ``offload``, the best plan of the
    offload pass's limit mode on those generators, copies included). ``workers``: CP-SAT
    search workers (default: the machine's cores, at most 8).

    Guarantees: ``schedule`` is validated and its timeline's bubble rate is at most the
    solver's (the timing pass only starts ops earlier); its per-rank peak is at most
    ``mem_limit`` (with offload: in the returned timeline); when ``status`` is
    "optimal", no schedule that takes each (kind, layer group)'s microbatches in order
    has a lower bubble rate under this limit; with ``offload`` and no ``hint``, the
    bubble rate is at most that of the offload pass's plan it started from (when
    there is one). Raises ParameterError naming the
    parameter for bad input, or ``mem_limit`` when no schedule fits.
    """
    pl = _placement(p, m, v, placement)
    costs = costs or Costs()
    memory = memory or MemoryDeltas()
    require(math.isfinite(time_limit) and time_limit > 0, "time_limit", f"must be a positive number of seconds, "
            f"got {time_limit!r}")
    limit = _limit(pl, memory, mem_limit)
    prob = _Problem.make(pl, m, costs, memory, limit, offload)
    plan = None
    if offload is not None and hint is None:
        plan = _offload_hint(pl, m, costs, memory, limit, offload)
    if hint is None and plan is None:
        hint = _default_hint(pl, m, costs, memory, limit)
    started = time.monotonic()
    sol = prob.solve(time_limit, workers, hint, plan)
    wall = time.monotonic() - started
    return prob.result(sol, wall)


def _placement(p: int, m: int, v: int | None, placement: str) -> Placement:
    for name, val in (("p", p), ("m", m)):
        require(isinstance(val, int) and not isinstance(val, bool) and val >= 1, name,
                f"must be an integer >= 1, got {val!r}")
    if placement == "v":
        require(v in (None, 2), "v", f"the V placement has v = 2, got {v}")
        return Placement.vshape(p)
    require(placement == "loop", "placement", f"must be 'loop' or 'v', got {placement!r}")
    v = 1 if v is None else v
    require(isinstance(v, int) and v >= 1, "v", f"must be an integer >= 1, got {v!r}")
    return Placement.loop(p, v)


def _limit(pl: Placement, memory: MemoryDeltas, mem_limit: float | None) -> float:
    table = memory.delta_table(pl)
    per_rank = [sum(table[s][OpKind.F] for s in pl.stages_of(r)) for r in range(pl.num_ranks)]
    if mem_limit is None:
        return pl.num_ranks * max(per_rank)
    need = max(table[s][OpKind.F] for s in range(pl.num_stages))
    require(math.isfinite(mem_limit) and mem_limit >= need, "mem_limit",
            f"must hold at least one forward's activation ({need:g} in the units of `memory`), got {mem_limit!r}")
    return float(mem_limit)


def _scale(values: Sequence[float]) -> tuple[int, bool]:
    """A factor that makes every value an integer: exact when all are fractions with a
    small common denominator, else 1000 (values then rounded)."""
    den = 1
    for x in values:
        f = Fraction(x).limit_denominator(_MAX_DENOMINATOR)
        if abs(float(f) - x) > 1e-12 * max(1.0, abs(x)):
            return 1000, False
        den = den * f.denominator // math.gcd(den, f.denominator)
        if den > _MAX_DENOMINATOR:
            return 1000, False
    return den, True


def _default_hint(pl: Placement, m: int, costs: Costs, memory: MemoryDeltas, limit: float) -> Schedule | None:
    """The lowest-bubble generated schedule on this placement that fits ``limit``."""
    p, v = pl.num_ranks, pl.max_chunks
    if pl.kind == "v":
        cands = [("zb-v", {"mem_limit": limit}), ("v-zb", {}), ("v-half", {}), ("v-min", {})]
    elif v == 1:
        cands = [("zb-auto", {"mem_limit": limit}), ("zb-h1", {})]
    else:
        cands = [("group-interleaved", {"v": v, "g": g}) for g in range((p + 1) // 2, p + 1)]
    best = None
    for s, tl in _hint_candidates(cands, p, m, costs, memory):
        if max(tl.peak_memory()) <= limit + 1e-9 * max(1.0, abs(limit)):
            if best is None or tl.bubble_rate < best[0]:
                best = (tl.bubble_rate, s)
    return best[1] if best else None


def _hint_candidates(cands: list, p: int, m: int, costs: Costs, memory: MemoryDeltas):
    """Each generator of ``cands`` (name, keywords) that takes these parameters, as
    ``(schedule, timeline)``; one that refuses them (a ParameterError) is no hint and is
    passed over, any other error is raised."""
    from .schedules import generate

    for name, kw in cands:
        try:
            s = generate(name, p=p, m=m, costs=costs, memory=memory, **kw)
        except ParameterError:
            continue
        yield s, simulate(s, costs, memory)


def _offload_hint(pl: Placement, m: int, costs: Costs, memory: MemoryDeltas, limit: float,
                  offload: SolverOffload):
    """The heuristic's answer to the same question, as a start for CP-SAT and the result
    when it finds nothing in time: the lowest-bubble plan, within ``limit``, of the
    placement's generators, each as is when it fits and else given to the offload pass's
    limit mode (chunks c < ``offload.offload_chunks``, the same host link, no solo
    speed-up), and on the loop placement (v = 1) of the rank window search
    (:func:`~pipeoffload.passes.offload_search.best_limited_plan`). None when none fits."""
    from .passes.offload import plan_offload
    from .passes.offload_search import best_limited_plan

    p = pl.num_ranks
    if pl.kind == "v":
        cands = [("zb-v", {"mem_limit": limit}), ("zb-v", {"mem_limit": p}), ("v-zb", {}), ("v-half", {}),
                 ("v-min", {})]
    elif pl.max_chunks == 1:
        cands = [("zb-auto", {"mem_limit": limit}), ("zb-h1", {}), ("1f1b", {})]
    else:
        return None
    best = None
    for s, tl in _hint_candidates(cands, p, m, costs, memory):
        try:
            res = plan_offload(s, tl, offload_chunks=min(offload.offload_chunks, s.chunks),
                               offload_time=offload.offload_time, link_group=offload.link_group, solo_factor=1.0,
                               comm=costs.comm, mem_limit=limit)
        except ParameterError:  # no plan within the limit
            continue
        if best is None or res.timeline.bubble_rate < best.timeline.bubble_rate:
            best = res
    if pl.kind != "v" and pl.max_chunks == 1 and offload.offload_chunks >= 1:
        found = best_limited_plan(p, m, limit, costs=costs, memory=memory, offload_time=offload.offload_time,
                                  link_group=offload.link_group, solo_factor=1.0)
        if found is not None and (best is None or found.bubble_rate < best.timeline.bubble_rate):
            best = found.result
    return best


class _Problem:
    """The CP-SAT model of one instance and how to read its solution back."""

    def __init__(self) -> None:
        self.model = None

    @classmethod
    def make(cls, pl: Placement, m: int, costs: Costs, memory: MemoryDeltas, limit: float,
             offload: SolverOffload | None) -> "_Problem":
        cp = _cp_model()
        self = cls()
        self.cp, self.pl, self.m, self.costs, self.memory, self.limit = cp, pl, m, costs, memory, limit
        self.offload = offload
        dur = costs.duration_table(pl)
        mem = memory.delta_table(pl)
        S = pl.num_stages
        self.dur_f = {(k, s): dur[s][k] for s in range(S) for k in _KINDS}
        self.mem_f = {(k, s): mem[s][k] for s in range(S) for k in _KINDS}
        times = list(self.dur_f.values()) + [costs.comm] + ([offload.offload_time] if offload else [])
        self.tscale, exact_t = _scale(times)
        self.mscale, exact_m = _scale(list(self.mem_f.values()) + [limit])
        self.exact = exact_t and exact_m
        self.dur = {key: int(round(x * self.tscale)) for key, x in self.dur_f.items()}
        self.dmem = {key: int(round(x * self.mscale)) for key, x in self.mem_f.items()}
        self.comm = int(round(costs.comm * self.tscale))
        self.cap = int(math.floor(limit * self.mscale + 1e-6))
        self._build()
        return self

    # --- the model ---------------------------------------------------------------
    def _build(self) -> None:
        cp, pl, m = self.cp, self.pl, self.m
        S, p = pl.num_stages, pl.num_ranks
        self.model = model = cp.CpModel()
        horizon = sum(self.dur.values()) * m + 2 * S * m * self.comm + 1
        self.start, self.end, self.itv = {}, {}, {}
        for s in range(S):
            for k in _KINDS:
                for j in range(m):
                    d = self.dur[(k, s)]
                    st = model.NewIntVar(0, horizon, f"s_{k.value}_{s}_{j}")
                    self.start[(k, s, j)], self.end[(k, s, j)] = st, st + d
                    self.itv[(k, s, j)] = model.NewFixedSizeIntervalVar(st, d, f"i_{k.value}_{s}_{j}")
        self._precedences()
        for r in range(p):
            model.AddNoOverlap([self.itv[(k, s, j)] for s in pl.stages_of(r) for k in _KINDS for j in range(m)])
        self.first = self._first_ops()
        self.span = model.NewIntVar(0, horizon, "span")
        for r in range(p):
            f = self.first[r]
            for s in pl.stages_of(r):
                for j in range(m):
                    model.Add(self.span >= self.end[(OpKind.W, s, j)] - f)
            # Redundant, for the bound: a rank's span holds all its work.
            model.Add(self.span >= m * sum(self.dur[(k, s)] for s in pl.stages_of(r) for k in _KINDS))
        self.transfers = self._offload_vars(horizon) if self.offload else []
        self._memory()
        model.Minimize(self.span)

    def _precedences(self) -> None:
        pl, m, model = self.pl, self.m, self.model
        S = pl.num_stages
        for s in range(S):
            for k in _KINDS:
                for j in range(m):
                    op = Op(k, s, j, pl.rank_of(s), 0)
                    for dk, ds, dj in dependencies(op, S):
                        lat = self.comm if pl.rank_of(ds) != pl.rank_of(s) else 0
                        model.Add(self.start[(k, s, j)] >= self.end[(OpKind(dk), ds, dj)] + lat)
                    if j > 0:  # each (kind, layer group) takes its microbatches in order
                        model.Add(self.start[(k, s, j)] >= self.end[(k, s, j - 1)])

    def _first_ops(self) -> list[int]:
        """Each rank's first op (F of its first layer group, microbatch 0) pinned where
        the timing pass starts it; returns those start times."""
        pl = self.pl
        out, t, prev = [], 0, None
        starts = {}
        for s in range(pl.num_stages):  # the chain F(0,0) → F(1,0) → … as soon as possible
            r = pl.rank_of(s)
            if prev is not None:
                t += self.dur[(OpKind.F, prev)] + (self.comm if pl.rank_of(prev) != r else 0)
            starts[s] = t
            prev = s
        for r in range(pl.num_ranks):
            s0 = pl.stages_of(r)[0]
            self.model.Add(self.start[(OpKind.F, s0, 0)] == starts[s0])
            out.append(starts[s0])
        return out

    def _memory(self) -> None:
        """One reservoir per rank (with the offload copies' optional events)."""
        pl, m, model = self.pl, self.m, self.model
        for r in range(pl.num_ranks):
            times, demands, active = [], [], []
            for s in pl.stages_of(r):
                for k in _KINDS:
                    d = self.dmem[(k, s)]
                    for j in range(m):
                        if d:
                            times.append(self.start[(k, s, j)] if d > 0 else self.end[(k, s, j)])
                            demands.append(d)
                            active.append(True)
            for t in self.transfers:
                if t["rank"] == r:
                    times += [t["off_end"], t["rel_start"]]
                    demands += [-t["amount"], t["amount"]]
                    active += [t["use"], t["use"]]
            if times:
                low = -sum(abs(x) for x in demands)
                model.AddReservoirConstraintWithActive(times, demands, active, low, self.cap)

    def _offload_vars(self, horizon: int) -> list[dict]:
        """Optional copies of chunks c < offload_chunks and the host links' no-overlap."""
        pl, m, model, off = self.pl, self.m, self.model, self.offload
        require(isinstance(off.link_group, int) and off.link_group >= 1, "link_group",
                f"ranks per host link must be an integer >= 1, got {off.link_group!r}")
        require(math.isfinite(off.offload_time) and off.offload_time >= 0, "offload_time",
                f"must be a finite number >= 0, got {off.offload_time!r}")
        out, d2h, h2d = [], {}, {}
        for s in range(pl.num_stages):
            if pl.chunk_of(s) >= off.offload_chunks or self.dmem[(OpKind.F, s)] <= 0:
                continue
            r, link = pl.rank_of(s), pl.rank_of(s) // off.link_group
            d = int(round(off.offload_time * sum(self.dur_f[(k, s)] for k in _KINDS) * self.tscale))
            for j in range(m):
                use = model.NewBoolVar(f"o_{s}_{j}")
                a = model.NewIntVar(0, horizon, f"a_{s}_{j}")
                b = model.NewIntVar(0, horizon, f"b_{s}_{j}")
                model.Add(a >= self.end[(OpKind.F, s, j)]).OnlyEnforceIf(use)
                model.Add(b >= a + d).OnlyEnforceIf(use)
                model.Add(b + d <= self.start[(OpKind.B, s, j)]).OnlyEnforceIf(use)
                d2h.setdefault(link, []).append(model.NewOptionalFixedSizeIntervalVar(a, d, use, f"d_{s}_{j}"))
                h2d.setdefault(link, []).append(model.NewOptionalFixedSizeIntervalVar(b, d, use, f"h_{s}_{j}"))
                out.append({"rank": r, "stage": s, "mb": j, "use": use, "off_start": a, "off_end": a + d,
                            "rel_start": b, "d": d, "amount": self.dmem[(OpKind.F, s)]})
        for lists in (d2h, h2d):
            for itvs in lists.values():
                model.AddNoOverlap(itvs)
        return out

    # --- solving and reading back ------------------------------------------------
    def solve(self, time_limit: float, workers: int | None, hint: Schedule | None, plan=None) -> "_Solution":
        """Run CP-SAT. When it ends without a solution but ``hint`` is one (CP-SAT does
        not always take a hint within the time), the hint is returned with the
        solver's bound; with offload, the same for ``plan`` (an offload result)."""
        hinted = self._add_hint(hint) if hint is not None else None
        planned = self._add_plan_hint(plan) if plan is not None else None
        solver = self.cp.CpSolver()
        solver.parameters.max_time_in_seconds = float(time_limit)
        solver.parameters.num_search_workers = workers or 8  # the portfolio's bound workers need several
        status = solver.Solve(self.model)
        if status in (self.cp.OPTIMAL, self.cp.FEASIBLE):
            starts = {key: solver.Value(v) for key, v in self.start.items()}
            chosen = [t for t in self.transfers if solver.Value(t["use"])]
            slots = [(t["stage"], t["mb"], solver.Value(t["off_start"]), solver.Value(t["off_end"]),
                      solver.Value(t["rel_start"]), solver.Value(t["rel_start"]) + t["d"]) for t in chosen]
            return _Solution(starts, solver.ObjectiveValue(), solver.BestObjectiveBound(),
                             status == self.cp.OPTIMAL, slots)
        fallback = planned if self.transfers else hinted
        if fallback is not None and status != self.cp.INFEASIBLE:
            starts, slots = fallback if self.transfers else (fallback, [])
            span = max(max(starts[(OpKind.W, s, j)] + self.dur[(OpKind.W, s)] for s in self.pl.stages_of(r)
                           for j in range(self.m)) - self.first[r] for r in range(self.pl.num_ranks))
            return _Solution(starts, span, min(span, solver.BestObjectiveBound()), False, slots)
        why = "proved none exists" if status == self.cp.INFEASIBLE else "found none in the time limit"
        raise ParameterError("mem_limit", f"no schedule found within {self.limit:g} (the solver {why}); "
                             "raise `mem_limit` or `time_limit`")

    def _add_hint(self, hint: Schedule) -> dict | None:
        """Start values from ``hint`` timed with the model's integer durations; returns
        them when the hint satisfies the model (on this placement, split backward,
        within the limit), else None."""
        from .passes.timing import run_list_schedule

        if hint.placement.stage_to_rank != self.pl.stage_to_rank or hint.num_microbatches != self.m:
            return None
        try:
            events = run_list_schedule(hint.compute_only(), lambda o: self.dur[(o.kind, o.stage)], self.comm)
        except Exception:  # noqa: BLE001 - a fused-backward hint (no B/W split) gives no hint
            return None
        starts = {}
        for e in events:
            starts[(e.op.kind, e.op.stage, e.op.microbatch)] = int(round(e.start))
            self.model.AddHint(self.start[(e.op.kind, e.op.stage, e.op.microbatch)], int(round(e.start)))
        in_order = all(starts[(k, s, j)] >= starts[(k, s, j - 1)] for (k, s, j) in starts if j > 0)
        return starts if in_order else None

    def _add_plan_hint(self, plan) -> tuple[dict, list] | None:
        """Start values from an offload plan (:func:`_offload_hint`): its compute starts
        and which copies it makes, when. Returns ``(starts, slots)`` in the model's units
        when the plan is exactly a solution of the model (integer times after scaling,
        each rank's first op where the model pins it, every copy one the model allows),
        else None (still a hint)."""
        sc, exact = self.tscale, self.exact
        starts = {}
        for e in plan.timeline.compute_events():
            x = e.start * sc
            exact = exact and abs(x - round(x)) <= 1e-6
            key = (e.op.kind, e.op.stage, e.op.microbatch)
            if key not in self.start:
                return None  # a fused backward: no hint
            starts[key] = int(round(x))
            self.model.AddHint(self.start[key], starts[key])
        copies = {(t.stage, t.microbatch): t for t in plan.transfers}
        slots = []
        for t in self.transfers:
            c = copies.pop((t["stage"], t["mb"]), None)
            self.model.AddHint(t["use"], c is not None)
            if c is None:
                continue
            a, b = int(round(c.offload_start * sc)), int(round(c.reload_start * sc))
            exact = (exact and abs(c.offload_end * sc - a - t["d"]) <= 1e-6
                     and abs(c.reload_end * sc - b - t["d"]) <= 1e-6)
            self.model.AddHint(t["off_start"], a)
            self.model.AddHint(t["rel_start"], b)
            slots.append((t["stage"], t["mb"], a, a + t["d"], b, b + t["d"]))
        exact = exact and not copies and all(
            starts[(OpKind.F, self.pl.stages_of(r)[0], 0)] == self.first[r] for r in range(self.pl.num_ranks))
        return (starts, slots) if exact else None

    def result(self, sol: "_Solution", wall: float) -> SolveResult:
        pl, m = self.pl, self.m
        order = [sorted(((k, s, j) for (k, s, j) in sol.starts if pl.rank_of(s) == r),
                        key=lambda x: sol.starts[x]) for r in range(pl.num_ranks)]
        params = {"p": pl.num_ranks, "m": m, "v": pl.max_chunks, "layout": pl.kind, "mem_limit": self.limit}
        sched = build_schedule("optimal", m, pl, order, **params)
        from .passes.validate import validate

        validate(sched)
        span, bound = sol.objective / self.tscale, sol.bound / self.tscale
        if sol.optimal:
            bound = span
        busy = max(self.costs.rank_compute(pl, m))
        off = None
        if self.transfers:
            off = self._offload_result(sol, sched)
            tl, sched = off.timeline, off.schedule
        else:
            tl = simulate(sched, self.costs, self.memory)
        return SolveResult(
            schedule=sched, timeline=tl, status="optimal" if sol.optimal else "feasible", span=span,
            span_bound=bound, bubble_bound=max(0.0, 1.0 - busy / bound) if bound > 0 else 0.0,
            gap=0.0 if sol.optimal or span <= 0 else max(0.0, (span - bound) / span),
            wall_s=wall, exact_scaling=self.exact, offload=off, params=params)

    def _offload_result(self, sol: "_Solution", sched: Schedule):
        """The solver's compute times and chosen copies as an offload result."""
        from .passes.offload import offload_from_slots

        sc = float(self.tscale)
        pl = self.pl
        dtab, mtab = self.costs.duration_table(pl), self.memory.delta_table(pl)
        events = []
        for (k, s, j), st in sol.starts.items():
            op = Op(k, s, j, pl.rank_of(s), pl.chunk_of(s))
            events.append(TimedOp(op, st / sc, st / sc + dtab[s][k], "compute", mtab[s][k]))
        tl = Timeline(num_ranks=pl.num_ranks, events=events, name=sched.name, num_microbatches=self.m,
                      chunks=sched.chunks, memory_unit="units", meta={"params": dict(sched.params)})
        slots = [(s, j, a / sc, b / sc, c / sc, d / sc) for s, j, a, b, c, d in sol.slots]
        return offload_from_slots(sched, tl, slots, offload_chunks=self.offload.offload_chunks,
                                  link_group=self.offload.link_group, comm=self.costs.comm)


@dataclass
class _Solution:
    """A solution in the model's integer units: every op's start, the objective (longest
    span), the proven bound, whether optimal, and the chosen copies
    ``(stage, microbatch, offload start, offload end, reload start, reload end)``."""

    starts: dict
    objective: float
    bound: float
    optimal: bool
    slots: list
