"""The search: ``plan()``, over splits × schedule families × recompute × offload. Pure Python.

API
---
``plan(model, hardware, gpus, *, memory_budget=None, global_batch=None, microbatch=None, seq=None,
options=None, workers=None) -> PlanResult``
    ``model``: a preset name, a model file or a :class:`~pipeoffload.costmodel.model.ModelSpec`;
    ``hardware``: a profile name, file or :class:`~pipeoffload.costmodel.hardware.Hardware`;
    ``memory_budget``: bytes per device (default: the hardware's HBM minus its reserve,
    :attr:`~pipeoffload.costmodel.hardware.Hardware.default_budget`); ``global_batch``: sequences
    per iteration (default ``4 · gpus · microbatch``); ``microbatch``/``seq`` override the model's.

How (docs/planner.md §4): splits whose states alone exceed the budget are rejected; every
(split, family) candidate gets a lower bound of its time and is simulated in that order, plain
then with recompute, the first variant that fits accepted — unless ``top`` configurations
already fit faster than its bound; then, fastest first, the candidates that did not fit try
offload of ``C = 1..v`` chunks (with recompute first), again only while they could enter the
top ``options.top``. A candidate whose untimed peaks show that no light recompute setting fits
is timed only when that phase reaches it at its bound, or at the end for a family without a
configuration (:attr:`_Candidate.untimed`): the same order, ranking and result as timing it at once.
An offload try that the pass's ceiling proves to fit ranks at its exact time without its plan
(:func:`_proved_fit`); the plan is made at the end only where the configuration can be among those
shown (:func:`_complete_provisional`): the same result with fewer offload plans.

With helper processes (``workers``, :mod:`~.workers`), the candidates left untimed are timed by a
helper as soon as the plain phase leaves them so, and the offload phase takes what has come back
(it never waits for a helper); the shown configurations' offload plans are shared among the
processes. The search is the same: every decision reads the same floats, wherever they were made.

The schedule settings of a split (:func:`~.space.families`) and the order of the offload tries
(:func:`~.space.offload_tries`) are those of ``pipeoffload best`` (:mod:`pipeoffload.studies.best`):
one enumeration, one order (the planner stops before ``best``'s B→W stash tries, see
:func:`_offload_variants`), so the two never disagree on what exists or what was tried.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..costmodel.hardware import GiB, Hardware, get_hardware
from ..costmodel.model import ModelSpec, state_bytes_per_param
from ..costmodel.presets import PO_RUNTIME, get_model
from ..errors import ParameterError
from ..passes.issue_policy import paused_gc
from .bounds import check_memory_bound, time_bound
from .config import Config, assemble, assemble_offloaded
from .refusals import Refused, Rejection
from .report import family_rejections
from .result import PlanResult
from ..recompute import Recompute
from .hostlink import check_pinned_host
from .sharding import RECOMPUTE_ORDER, node_profile
from .workers import Prefetcher, forked_map, resolve_workers
from .simulate import Simulator
from .space import FIXED_ORDER, Family, PlanOptions, Problem, Split, enumerate_splits, families, offload_tries

#: The recompute settings tried before offload (cheap: no matmul repeated).
_LIGHT = (Recompute.NONE, Recompute.ELEMENTWISE)

__all__ = ["plan"]

_MICROBATCH_RULE = ("each schedule is simulated at m, or at two m past its warm-up (same m modulo its period) "
                    "with the iteration time extrapolated linearly")


@dataclass
class _Candidate:
    """One (split, family) of the search, with ``m`` microbatches, and what became of it."""

    split: Split
    family: Family
    m: int
    attempts: list[Config] = field(default_factory=list)  #: every variant evaluated
    refusals: list[Refused] = field(default_factory=list)
    fit: Config | None = None  #: the accepted variant
    pruned: str | None = None  #: why it was not (fully) evaluated
    bound: float = 0.0  #: lower bound of its iteration time, ms
    #: Offload tries proved unable to fit and not made: (index into attempts, into refusals,
    #: recompute, C or None for all, or −C for a try proved to be refused for its pinned host
    #: memory, :func:`_proved_refused`) where they belong; made only if the family ends without
    #: a configuration.
    deferred: list[tuple[int, int, Any, int | None]] = field(default_factory=list)
    #: Light recompute settings proved not to fit by their untimed peaks and not timed yet
    #: (:func:`_untimed_misses`): their attempts are made when something reads them
    #: (:func:`_time_untimed`), else only if the family ends without a configuration.
    untimed: list[Any] = field(default_factory=list)
    #: Prunings decided while ``untimed`` was pending, in order; the last applies once the timings
    #: are made and give attempts ("offload" stands for the offload phase's, which quotes them).
    pending_pruned: list[str] = field(default_factory=list)
    #: ``(recompute, C)`` when ``fit`` is provisional (:func:`_proved_fit`): proved to fit
    #: with its exact iteration time, its offload plan not made; :func:`_complete_provisional`
    #: makes it where the configuration can be among those shown.
    provisional: tuple[Any, int] | None = None

    @property
    def where(self) -> str:
        return f"{self.family.label} {self.split} m={self.m}"


class _Ranking:
    """Iteration times of the configurations that fit so far, sorted; decides pruning."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.times: list[float] = []

    def beaten(self, bound: float) -> bool:
        """Whether ``top`` configurations already fit with a time no worse than ``bound``."""
        return len(self.times) >= self.top and bound >= self.times[self.top - 1]

    def keep(self, cand: _Candidate, cfg: Config) -> bool:
        """Record ``cfg`` as an attempt of ``cand``; if it fits the budget, make it the candidate's
        configuration and rank its time. True if it fits."""
        cand.attempts.append(cfg)
        if not cfg.fits:
            return False
        cand.fit = cfg
        self.times.append(cfg.iteration_ms)
        self.times.sort()
        return True


def plan(
    model: str | ModelSpec,
    hardware: str | Hardware,
    gpus: int,
    *,
    memory_budget: float | None = None,
    global_batch: int | None = None,
    microbatch: int | None = None,
    seq: int | None = None,
    options: PlanOptions | None = None,
    workers: int | None = None,
) -> PlanResult:
    """Search the configurations of ``model`` on ``gpus`` × ``hardware`` (see the module docstring).

    Guarantees: every configuration in ``PlanResult.configs`` has a predicted device peak
    (parameters + gradients and optimizer states + resident activations) ≤ the budget, and they are
    sorted by predicted iteration time; every family of schedules that produced no configuration has
    an entry in ``PlanResult.rejected`` saying why (OOM by how much, m too small, generator refused,
    offload infeasible, or pruned as slower than the shown ones). Raises ParameterError naming the
    argument (``gpus``, ``memory_budget``, ``global_batch``, ``seq``, ``microbatch``, ``workers``,
    or the field of ``options``) for bad inputs.

    ``workers``: processes the search may use [None: 2 on Linux with two CPUs free and no other
    thread running, else 1, :func:`~.workers.resolve_workers`]; the helpers time candidates ahead
    (:mod:`~.workers`). The result is the same for every value, apart from ``stats``' seconds
    and counters.
    """
    t_start = time.perf_counter()
    problem = _problem(model, hardware, gpus, memory_budget, global_batch, microbatch, seq, options or PlanOptions())
    processes = resolve_workers(workers)
    simulator = Simulator(problem)
    if processes > 1:
        simulator.prefetch = Prefetcher(simulator, processes - 1)
    with paused_gc():  # the search's caches grow to millions of objects, all live to the end:
        try:  # collections would only rescan them
            return _search(problem, simulator, gpus, t_start, processes)
        finally:
            if simulator.prefetch is not None:
                simulator.prefetch.close()
                simulator.prefetch = None
            # Freed now, by their counts, while the collector is still paused: the first collection
            # after the pause scans every object made inside it that is still alive (≈ 1.9 s for a
            # 16k-GPU search when the caches were freed after it), and a later full one would too.
            simulator.clear()


def _search(problem: Problem, simulator: Simulator, gpus: int, t_start: float, processes: int) -> PlanResult:
    """:func:`plan`'s search, its inputs checked."""
    splits, rejected_splits = enumerate_splits(problem.model, gpus, problem.global_batch)
    splits = [(dataclasses.replace(s, sp=sp), m) for s, m in splits
              for sp in (problem.options.sequence_parallel if s.tp > 1 else (True,))]
    candidates, labels = _candidates(problem, splits, rejected_splits)
    ranking = _Ranking(problem.options.top)
    # V-auto last: it costs more than every other V schedule together, and by then the ranking is
    # full (the bound prunes more) and V-ZB's fits are known (where V-ZB fits, V-auto is skipped).
    rest = [c for c in candidates if c.family.schedule != "v-auto"]
    last = [c for c in candidates if c.family.schedule == "v-auto"]
    for group in (rest, last):
        _plain_phase(problem, simulator, group, ranking, light=True, everyone=candidates)
        if problem.options.offload:
            _offload_phase(problem, simulator, group, ranking)
        _plain_phase(problem, simulator, [c for c in group if c.fit is None and (c.attempts or c.untimed)],
                     ranking, light=False, everyone=candidates)
    _complete_untimed(problem, simulator, candidates, ranking)
    _complete_deferred(problem, simulator, candidates)
    if simulator.prefetch is not None:  # nothing reads a simulation ahead after this: free its core
        simulator.prefetch.close()
    _complete_provisional(problem, simulator, candidates, processes)
    configs = sorted((c.fit for c in candidates if c.fit), key=lambda x: (x.iteration_ms, x.memory.device))
    stats: dict[str, Any] = dict(simulator.stats)
    stats.update(splits=len(splits), splits_rejected=len(rejected_splits), candidates=len(candidates),
                 families=labels, fitting=len(configs), seconds=round(time.perf_counter() - t_start, 3),
                 microbatch_rule=_MICROBATCH_RULE, processes=processes,
                 simulations_ahead=simulator.prefetch.used if simulator.prefetch is not None else 0)
    return PlanResult(problem.model, problem.hardware, problem.node, gpus, problem.budget, problem.global_batch,
                      problem.options, configs[: problem.options.top], family_rejections(candidates, labels),
                      rejected_splits, stats)


def _problem(model: Any, hardware: Any, gpus: int, memory_budget: float | None, global_batch: int | None,
             microbatch: int | None, seq: int | None, opts: PlanOptions) -> Problem:
    """The checked inputs of one search (raises ParameterError naming the first bad one)."""
    opts.check()
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ParameterError("gpus", f"must be a positive integer, got {gpus!r}")
    spec = _resolve_model(model, seq, microbatch, opts.po_runtime)
    hw = get_hardware(hardware)
    node = node_profile(hw, opts.peak_rate, opts.tp_bw, opts.hbm_bw)
    if opts.host_bw is not None:
        hw = dataclasses.replace(hw, host_bw=opts.host_bw)
    budget = hw.default_budget if memory_budget is None else memory_budget
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
        raise ParameterError("memory_budget", f"must be a positive number, got {memory_budget!r}")
    gb = global_batch if global_batch is not None else 4 * gpus * spec.microbatch
    if not isinstance(gb, int) or isinstance(gb, bool) or gb < 1:
        raise ParameterError("global_batch", f"must be a positive integer, got {global_batch!r}")
    if gb % spec.microbatch:
        raise ParameterError("global_batch",
                             f"{gb} sequences are not a whole number of microbatches of {spec.microbatch}")
    return Problem(spec, hw, node, budget, gb, gpus, opts)


def _resolve_model(model: Any, seq: int | None, microbatch: int | None, po_runtime: bool) -> ModelSpec:
    over: dict[str, Any] = {}
    for name, x in (("seq", seq), ("microbatch", microbatch)):
        if x is not None:
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise ParameterError(name, f"must be a positive integer, got {x!r}")
            over[name] = x
    if po_runtime:
        over.update({k: v for k, v in PO_RUNTIME.items() if k != "recompute_elementwise"})
    return get_model(model, **over)


def _candidates(problem: Problem, splits: list[tuple[Split, int]],
                rejected_splits: list[Rejection]) -> tuple[list[_Candidate], list[str]]:
    """Every (split, family) to evaluate, and the family labels in order of first appearance.
    Splits whose parameters, gradients and optimizer states alone average more than the budget
    per device are appended to ``rejected_splits`` instead."""
    spec, budget = problem.model, problem.budget
    candidates: list[_Candidate] = []
    labels: list[str] = []
    for split, m in splits:
        per_param = sum(state_bytes_per_param(spec.dtype, split.dp, problem.options.dp_sharding))
        avg = spec.params() * per_param / (split.tp * split.pp)
        if avg > budget:
            rejected_splits.append(Rejection(
                str(split), "split", f"parameters, gradients and optimizer states alone average {avg / GiB:.1f} GiB "
                f"per device (over the {budget / GiB:.3g} GiB budget by {(avg - budget) / GiB:.1f} GiB)",
                over=avg - budget, config=str(split)))
            continue
        for fam in families(split.pp, spec.layers, problem.options):
            candidates.append(_Candidate(split, fam, m))
            if fam.label not in labels:
                labels.append(fam.label)
    return candidates, labels


def _plain_phase(problem: Problem, simulator: Simulator, candidates: list[_Candidate], ranking: _Ranking,
                 light: bool = True, everyone: list[_Candidate] | None = None) -> None:
    """Plain and recompute-only simulations (cheap); the first variant that fits is accepted.
    ``light``: no recompute and elementwise recompute (before offload is tried); else selective
    and full recompute (after: they cost matmul time offload usually hides).
    Candidates go by a lower bound of their iteration time (:func:`~.bounds.pipeline_bound`: each
    rank's compute between the forward chain that reaches it and the backward chain after it),
    so once ``top`` configurations fit, a candidate whose bound is no better is not
    simulated at all. V-auto is not simulated on a split where V-ZB fits (among ``everyone``, the
    whole search; with or without offload, which never lengthens the iteration)."""
    order = [rc for rc in RECOMPUTE_ORDER if rc in problem.options.recompute and (rc in _LIGHT) == light]
    if problem.model.flash_attention and Recompute.ELEMENTWISE in problem.options.recompute and \
            Recompute.SELECTIVE in order:
        order.remove(Recompute.SELECTIVE)  # under flash attention the core attention saves no s×s tensor: = elementwise
    if not order:
        return
    for c in candidates:
        c.bound = max(c.bound, min(time_bound(simulator.costs, c.split, c.family, c.m, rc,
                                              problem.options.dp_sharding) for rc in order))
    fits_v_zb = {(c.split, c.m) for c in (everyone or candidates) if c.family.schedule == "v-zb" and c.fit}
    for c in sorted(candidates, key=lambda c: c.bound):
        why = _not_simulated(problem, c, ranking, fits_v_zb)
        if c.untimed:  # (selective/full) in this phase only if its pending timings give attempts
            if why:
                c.pending_pruned.append(why)
                continue
            _time_untimed(problem, simulator, c, ranking)
            if not c.attempts:
                continue
        if why:
            c.pruned = why
            continue
        try:
            check_memory_bound(problem, simulator.costs, c.split, c.family, c.m)
        except Refused as e:
            c.refusals.append(e.with_traceback(None))
            continue
        fits = _fits_untimed(problem, simulator, c, order, ranking)
        if fits is False and light and c.family.schedule != "gpipe":
            c.untimed = list(order)  # none fits: timed only when read (_time_untimed)
            keys = [(c.split, c.family, c.m, rc) for rc in order]
            # meanwhile, where helped, and the offload phase's first question about it, both by the
            # candidate's bound: the phase reaches candidates in that order (their fastest attempts,
            # ≥ it, once timed), and a helper takes its tasks by it
            simulator.simulate_ahead(keys, c.bound)
            for key in keys:
                if key[3] in _OFFLOAD_RECOMPUTE:
                    simulator.call_ahead(_hopeless_tag(c, key[3]), _hopeless_ahead, key, near=key, rank=c.bound)
        elif not fits:
            _variants(problem, simulator, c, order, ranking)


def _not_simulated(problem: Problem, c: _Candidate, ranking: _Ranking, fits_v_zb: set) -> str | None:
    """Why :func:`_plain_phase` does not simulate ``c`` (its ``pruned`` text), or None."""
    if c.family.schedule == "v-auto" and (c.split, c.m) in fits_v_zb:
        # V-auto searches V schedules within V-Half's memory; where V-ZB fits with 1F1B's (its
        # bubble near zero) it has not been faster, and it costs more than every other V
        # schedule together: a dominance rule, not a bound.
        return "not simulated: V-ZB fits on this split (1F1B's memory, bubble near zero; V-auto's limit is V-Half's)"
    if ranking.beaten(c.bound):
        return (f"not simulated: idle only while the pipeline fills and drains, an iteration takes "
                f"≥ {c.bound / 1e3:.3g} s, slower than the {problem.options.top} configurations shown")
    return None


def _time_untimed(problem: Problem, simulator: Simulator, c: _Candidate, ranking: _Ranking) -> None:
    """Make ``c``'s pending timings (``c.untimed``): :func:`_variants` as the plain phase would
    have, their attempts and refusals put first (nothing was recorded for ``c`` before them), and
    the last pruning decided meanwhile applied if they give attempts. None of them fits (their
    untimed peaks, the timing's floats, said so), so the ranking does not change."""
    order, c.untimed = c.untimed, []
    later = (c.attempts, c.refusals)
    c.attempts, c.refusals = [], []
    _variants(problem, simulator, c, order, ranking)
    if c.fit is not None:
        raise AssertionError(f"{c.where}: a setting proved not to fit by its untimed peaks fits")
    c.attempts += later[0]
    c.refusals += later[1]
    if c.attempts and c.pending_pruned:
        last = c.pending_pruned[-1]
        c.pruned = _offload_pruned(c, problem.options.top) if last == _OFFLOAD_PRUNED else last
    c.pending_pruned = []


#: :attr:`_Candidate.pending_pruned`'s mark for the offload phase's pruning (its text quotes the
#: candidate's fastest attempt, known once it is timed).
_OFFLOAD_PRUNED = "offload"


def _offload_pruned(c: _Candidate, top: int) -> str:
    """The offload phase's ``pruned`` text for ``c`` (its fastest attempt is no faster than the
    ``top`` shown)."""
    fastest = min(a.iteration_ms for a in c.attempts)
    return (f"offload not evaluated: even without its cost the iteration takes ≥ {fastest / 1e3:.3g} s, "
            f"slower than the {top} configurations shown")


def _variants(problem: Problem, simulator: Simulator, c: _Candidate, order: list[Recompute],
              ranking: _Ranking) -> None:
    """Simulate ``c`` with each recompute setting of ``order`` until one fits (recording every
    attempt and refusal)."""
    for rc in order:
        try:
            sim = simulator.simulate(c.split, c.family, c.m, rc)
        except Refused as e:
            c.refusals.append(e.naming(c.where))
            if e.kind in ("m", "same") or c.family.schedule in FIXED_ORDER:
                break
            continue
        if ranking.keep(c, assemble(problem, sim)):
            break


def _fits_untimed(problem: Problem, simulator: Simulator, c: _Candidate, order: list[Recompute],
                  ranking: _Ranking) -> bool | None:
    """:func:`_variants` without timing the settings that cannot fit: a setting's memory comes
    from its schedules' op orders (:meth:`~.simulate.Simulator.peaks`, the same floats as the
    timing's), so the first setting whose memory fits is simulated and accepted without timing
    those before it, whose times nobody reads once a later one fits (a family's rejection quotes
    the attempts' memory, and only when none of its candidates fits). With ``c`` unchanged:
    False when every setting's peaks are known and none fits — or its first simulated m's peaks
    alone miss (:meth:`~.simulate.Simulator.peaks_low`, which its peaks are at least: its second
    m is then not generated; if that would be refused, :func:`_variants` records it when the
    timings are made, as it would have now) —, None when a peak needs the timing or a schedule
    is refused; then :func:`_variants` decides, as before (or, for False, later:
    :attr:`_Candidate.untimed`)."""
    for rc in order:
        state = simulator.state(c.split, c.family, rc)
        try:
            low = simulator.peaks_low(c.split, c.family, c.m, rc)
            if low is not None and _misses(problem, state, low):
                continue  # its peaks are at least these: it does not fit, and its second m is not made
            act = simulator.peaks(c.split, c.family, c.m, rc)
        except Refused:
            return None
        if act is None:
            return None
        if not _misses(problem, state, act):
            try:
                sim = simulator.simulate(c.split, c.family, c.m, rc)
            except Refused:
                return None
            fits = ranking.keep(c, assemble(problem, sim))
            assert fits, "the untimed peaks are the timing's"
            return True
    return False


def _misses(problem: Problem, state: list[tuple[float, float]], act: list[float]) -> bool:
    """Whether the fullest rank's states plus activations ``act`` exceed the budget, summed as
    :func:`~.config.assemble` sums a configuration's device memory."""
    return max(a + b + x for (a, b), x in zip(state, act)) > problem.budget


def _offload_phase(problem: Problem, simulator: Simulator, candidates: list[_Candidate], ranking: _Ranking) -> None:
    """Offload for the candidates that were simulated but did not fit, fastest first; those that
    cannot enter the top ``top`` even without offload's cost are pruned. Per candidate: with
    recompute first, the offload tries of :func:`~.space.offload_tries`, the first that fits accepted.

    A candidate whose timings are pending (:attr:`_Candidate.untimed`) enters the queue at its
    time bound (≤ its fastest attempt, which is ≥ its ``pipeline_bound`` plus the step): when it
    comes first it is timed and goes back at its fastest attempt, unless the bound is already
    beaten — then so is its fastest attempt, and every later one (the ranking changes only by
    fits), and it is pruned untimed (:attr:`_Candidate.pending_pruned`). So the candidates are
    taken in the order of their fastest attempts (ties by their order in ``candidates``), with
    the same ranking at each, as when all were timed first."""
    need = [c for c in candidates if c.fit is None and (c.attempts or c.untimed)]
    queue = [(c.bound if c.untimed else _fastest(c), i) for i, c in enumerate(need)]
    heapq.heapify(queue)
    order = [rc for rc in _OFFLOAD_RECOMPUTE if rc in problem.options.recompute]
    while queue:
        key, i = heapq.heappop(queue)
        c = need[i]
        if c.untimed:  # never GPipe (:func:`_plain_phase` times it): its refusal below needs no ranking
            if ranking.beaten(key):
                c.pending_pruned.append(_OFFLOAD_PRUNED)
            else:
                _time_untimed(problem, simulator, c, ranking)
                if c.attempts:
                    heapq.heappush(queue, (_fastest(c), i))
            continue
        if c.family.schedule == "gpipe":
            c.refusals.append(Refused("offload", "not offloaded: GPipe keeps every microbatch (peak grows with m)"))
            continue
        if ranking.beaten(key):
            c.pruned = _offload_pruned(c, problem.options.top)
            continue
        for rc in order:
            if c.fit:
                break
            _offload_variants(problem, simulator, c, rc, ranking)


#: The recompute settings the offload phase tries, in order (those of the problem's options).
_OFFLOAD_RECOMPUTE = (Recompute.ELEMENTWISE, Recompute.NONE)


def _fastest(c: _Candidate) -> float:
    """The shortest iteration among ``c``'s attempts (ms)."""
    return min(a.iteration_ms for a in c.attempts)


def _complete_untimed(problem: Problem, simulator: Simulator, candidates: list[_Candidate],
                      ranking: _Ranking) -> None:
    """The pending timings (:attr:`_Candidate.untimed`) of the families without a configuration,
    whose rejections quote their attempts (none of them fits, so no family gains one)."""
    fitted = {c.family.label for c in candidates if c.fit}
    for c in candidates:
        if c.untimed and c.family.label not in fitted:
            _time_untimed(problem, simulator, c, ranking)


def _offload_variants(problem: Problem, simulator: Simulator, c: _Candidate, rc: bool, ranking: _Ranking,
                      prove: bool = True) -> None:
    """Offload ``c`` with recompute ``rc`` in the order ``pipeoffload best`` uses
    (:func:`~.space.offload_tries`: C = 1..v) until one fits or the offload pass (or the
    simulation) refuses; the refusal is recorded and ends this recompute setting only.

    With ``prove``, first the floor of the plans with every chunk offloaded
    (:meth:`~.simulate.Simulator.offload_bounds`): when even that exceeds the budget, no try
    can fit, so none is made here and ``c.deferred`` says where their attempts and refusals
    belong (:func:`_complete_deferred` makes them if ``c``'s family ends without a
    configuration, the one output that reads them). Else each try whose own floor exceeds the
    budget and whose host ceiling cannot be refused is left out the same way, and the next C
    is tried. Nothing else reads a try that does not fit: it changes neither the ranking nor
    what is searched next.

    Without the B→W stash window that ``best`` tries after C = v: the extra offload plans doubled
    the search where nothing fits (98.5B on 64 GPUs at 28 GiB). A configuration that does use it
    (``Config.offload_stash``) reaches the runtime through ``--emit-config`` as ``offload.stash``."""
    try:
        tries = offload_tries(simulator.simulate(c.split, c.family, c.m, rc).schedule, stash=False)
    except Refused as e:
        c.refusals.append(e.naming(c.where))
        return
    if prove and _hopeless_here_or_ahead(problem, simulator, c, rc, tries):
        c.deferred.append((len(c.attempts), len(c.refusals), rc, None))
        return
    for chunks, stash in tries:
        if prove and not stash and _offload_cannot_fit(problem, simulator, c, rc, chunks, host=True):
            c.deferred.append((len(c.attempts), len(c.refusals), rc, chunks))  # the next C is tried as before
            continue
        if prove and not stash:
            cfg = _proved_fit(problem, simulator, c, rc, chunks)
            if cfg is not None:  # fits, at its exact time: the plan is made only if it can be shown
                c.provisional = (rc, chunks)
                ranking.keep(c, cfg)
                return
            if _proved_refused(problem, simulator, c, rc, chunks):  # ends ``rc``'s tries, as the refusal would
                c.deferred.append((len(c.attempts), len(c.refusals), rc, -chunks))
                return
        try:
            sim, res = simulator.offload(c.split, c.family, c.m, rc, chunks, stash)
            cfg = assemble_offloaded(problem, sim, res, chunks, stash)  # refuses pinned host memory over the node's
        except Refused as e:
            c.refusals.append(e.naming(c.where))
            return
        if ranking.keep(c, cfg):
            return


def _hopeless(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, tries: list[tuple[int, bool]]) -> bool:
    """Whether none of ``tries`` (without the stash window) can give ``c`` a configuration with
    ``rc`` (:func:`_every_try_hopeless`), or even its largest C cannot fit (:func:`_offload_cannot_fit`)."""
    return not any(stash for _, stash in tries) and \
        (_every_try_hopeless(problem, simulator, c, rc, [chunks for chunks, _ in tries]) or
         _offload_cannot_fit(problem, simulator, c, rc, max(chunks for chunks, _ in tries)))


def _hopeless_here_or_ahead(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any,
                            tries: list[tuple[int, bool]]) -> bool:
    """:func:`_hopeless`, as a helper made it ahead (:func:`_hopeless_ahead`) where it has, else
    made here. The same bool either way: it is a function of the candidate's key alone."""
    got = simulator.take_ahead(_hopeless_tag(c, rc))
    if got is not None and isinstance(got[0], bool):
        return got[0]
    return _hopeless(problem, simulator, c, rc, tries)


def _hopeless_tag(c: _Candidate, rc: Any) -> tuple:
    return ("hopeless", c.split, c.family, c.m, rc)


def _hopeless_ahead(simulator: Simulator, split: Split, family: Family, m: int, rc: Any) -> bool | None:
    """:func:`_hopeless` for the candidate ``(split, family, m)`` with ``rc``, made by a helper
    process on its copy of the search's simulator (:meth:`~.workers.Prefetcher.submit_call`);
    None where its simulation is refused (the search records that refusal itself)."""
    try:
        tries = offload_tries(simulator.simulate(split, family, m, rc).schedule, stash=False)
    except Refused:
        return None
    return _hopeless(simulator.problem, simulator, _Candidate(split, family, m), rc, tries)


def _every_try_hopeless(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: list[int]) -> bool:
    """Whether every try of ``chunks`` is proved unable to give ``c`` a configuration with
    ``rc``: its device floor is over the budget (:func:`_offload_cannot_fit`), or it either
    does not fit or is refused (:func:`_unfit_or_refused`, no draft), or its pinned host
    memory is proved over the node's (:func:`_proved_refused`). Then whichever try is
    refused first (ending ``rc``'s tries) or none, no try fits: the ranking and what is
    searched next are those of making them, and only a family without a configuration reads
    their attempts and refusals (:func:`_complete_deferred` makes them all then, in order).
    The host floors within the budget's room are read first (no session while the timeline is
    serial), then the device floors, then the host floors' caps (no draft), then the floors."""
    left = [C for C in chunks if not _unfit_or_refused(problem, simulator, c, rc, C, 0.0)]
    left = [C for C in left if not _offload_cannot_fit(problem, simulator, c, rc, C)]
    for C in left:
        cap = simulator.offload_host_floor_cap(c.split, c.family, c.m, rc, C)
        if cap is None or check_pinned_host(problem.hardware, [cap * (1.0 - _FLOOR_SLACK)], problem.gpus) is None:
            return False  # its host floor cannot be over the node's either
    return all(_proved_refused(problem, simulator, c, rc, C) for C in left)


#: Relative slack of the offload floor's test: the floor's sums run in another order than the
#: plan's, so a floor over the budget by less than this proves nothing.
_FLOOR_SLACK = 1e-9


def _offload_cannot_fit(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int,
                        host: bool = False) -> bool:
    """Whether no offload plan of ``c`` with ``rc`` and ``chunks`` chunks can fit the budget:
    its floor (every offload instantaneous, none dropped; fewer chunks only keep more on the
    device, so it holds for them too) plus the fullest rank's states already exceeds it. With
    ``host``, also that the plan cannot be refused for its pinned host memory (its ceiling fits
    the node), so the tries after it are made as they would have been. The floor first: it
    often needs no offload session (:func:`_floor_misses_more`)."""
    if not _floor_misses_more(problem, simulator, c, rc, chunks, 0.0):
        return False
    if host:
        bounds = simulator.offload_bounds(c.split, c.family, c.m, rc)
        if bounds is None or chunks not in bounds or \
                check_pinned_host(problem.hardware, [x * (1.0 + _FLOOR_SLACK) for x in bounds[chunks][1]], problem.gpus):
            return False
    return True


def _proved_fit(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int) -> Config | None:
    """A provisional configuration for ``c``'s offload try of ``chunks`` chunks with ``rc``
    when that try is proved to fit without its plan, else None (the plan decides).

    Proved: the plan's highest activation peak is at most the pass's ceiling
    (:meth:`~.simulate.Simulator.offload_ceiling`), so every rank's activations, counted as
    :func:`~.config.assemble_offloaded` counts them, are at most the ceiling plus what that
    rank's plain peak grew by between ``m1`` and ``m`` — the same float operations with a
    larger operand, so no smaller (rounding is monotone) — and with its states within the
    budget; and its pinned host memory is at most the bounds' ceiling, which the node holds
    (so the try is not refused). Its iteration time is exact: the plan's makespan change is
    the ceiling's. So the configuration fits and ranks as the plan would, and only its
    memory figures (upper bounds here) wait for the plan (:func:`_complete_provisional`)."""
    bounds = simulator.offload_bounds(c.split, c.family, c.m, rc)
    if bounds is None or chunks not in bounds:
        return None
    host = [x * (1.0 + _FLOOR_SLACK) for x in bounds[chunks][1]]
    if check_pinned_host(problem.hardware, host, problem.gpus):
        return None
    got = simulator.offload_ceiling(c.split, c.family, c.m, rc, chunks)
    if got is None:
        return None
    ceiling, extra = got
    sim = simulator.simulate(c.split, c.family, c.m, rc)
    act = [ceiling + max(0.0, b - p0) for b, p0 in zip(sim.act, sim.timeline.peak_memory())]
    cfg = assemble(problem, sim, chunks, act, host, extra, notes=["provisional: memory figures are upper bounds"])
    return cfg if cfg.fits else None


def _proved_refused(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int) -> bool:
    """Whether ``c``'s offload try of ``chunks`` chunks with ``rc`` is proved to be refused for its
    pinned host memory without its plan: the pass's host floor
    (:meth:`~.simulate.Simulator.offload_host_floor`, less a relative :data:`_FLOOR_SLACK` for
    the rounding of its sums) is already over what the node holds
    (:func:`~.hostlink.check_pinned_host`, monotone in every rank's bytes). The refusal ends
    ``rc``'s tries, as :func:`_offload_variants` ends them; its text (which quotes the plan's
    host memory) is read only if the family ends without a configuration, and is made then
    (:func:`_complete_deferred`). When even the floor's cap
    (:meth:`~.simulate.Simulator.offload_host_floor_cap`, made without the ceiling's draft)
    fits the node, the floor cannot prove it (the test is monotone): the draft is not made."""
    cap = simulator.offload_host_floor_cap(c.split, c.family, c.m, rc, chunks)
    if cap is None or check_pinned_host(problem.hardware, [cap * (1.0 - _FLOOR_SLACK)], problem.gpus) is None:
        return False
    floor = simulator.offload_host_floor(c.split, c.family, c.m, rc, chunks)
    if floor is None:
        return False
    return check_pinned_host(problem.hardware, [x * (1.0 - _FLOOR_SLACK) for x in floor], problem.gpus) is not None


def _complete_provisional(problem: Problem, simulator: Simulator, candidates: list[_Candidate],
                          processes: int = 1) -> None:
    """Replace each provisional configuration (:func:`_proved_fit`) that can be among the
    ``top`` shown — its time at most the ``top``-th fastest of all that fit, ties included,
    so that the ties' order by memory is the planned one — by the planned one, where it
    stood among its candidate's attempts. The others are counted as fitting only; no output
    reads their memory (their families have a configuration)."""
    times = sorted(c.fit.iteration_ms for c in candidates if c.fit)
    top = problem.options.top
    cut = times[top - 1] if len(times) >= top else math.inf
    shown = [c for c in candidates if c.provisional is not None and c.fit is not None and c.fit.iteration_ms <= cut]

    def planned(c: _Candidate) -> tuple[Config, dict[str, int], int]:
        """The plan's configuration, the counters it moved and the process that made it."""
        rc, chunks = c.provisional  # type: ignore[misc]
        before = dict(simulator.stats)
        sim, res = simulator.offload(c.split, c.family, c.m, rc, chunks, False)
        return assemble_offloaded(problem, sim, res, chunks, False), \
            {k: n - before.get(k, 0) for k, n in simulator.stats.items() if n != before.get(k, 0)}, os.getpid()

    for c, (cfg, work, pid) in zip(shown, forked_map(planned, shown, processes)):  # the plans, ~1 s each
        if pid != os.getpid():  # a helper's: count its work here
            for k, n in work.items():
                simulator.stats[k] = simulator.stats.get(k, 0) + n
        old = c.fit
        if not cfg.fits or cfg.iteration_ms != old.iteration_ms:  # type: ignore[union-attr]
            raise AssertionError(f"{c.where}: a fit proved without its offload plan differs from the plan")
        c.attempts[next(i for i, a in enumerate(c.attempts) if a is old)] = cfg
        c.fit, c.provisional = cfg, None


def _complete_deferred(problem: Problem, simulator: Simulator, candidates: list[_Candidate]) -> None:
    """The offload tries :func:`_offload_variants` proved unable to fit and left out, made
    for the candidates of every family without a configuration (whose rejection quotes
    them), each put where it would have been among the candidate's attempts and refusals.

    A family's rejection quotes only its first offload refusal (or its first refusal), in the
    order of its candidates (:func:`~.report.family_rejections`); so once an earlier candidate
    of the family holds one, a try proved to be refused (:func:`_proved_refused`) gets a
    stand-in refusal of the same kind, named alike, without its plan (:func:`_complete_one`)."""
    fitted = {c.family.label for c in candidates if c.fit}
    unread = _unread_deferred(problem, simulator, [c for c in candidates if c.family.label not in fitted])
    quoted: set[str] = set()  # families whose earlier candidate holds an offload refusal
    for c in candidates:
        if c.family.label in fitted:
            continue
        if c.deferred:
            for at, ref, rc, chunks in reversed(c.deferred):  # the later first: the earlier indices stay valid
                if (id(c), at, ref, rc, chunks) in unread:
                    continue
                alone = _complete_one(problem, simulator, c, rc, chunks, c.family.label in quoted)
                c.attempts[at:at] = alone.attempts
                c.refusals[ref:ref] = alone.refusals
            c.deferred = []
        if any(r.kind == "offload" for r in c.refusals):
            quoted.add(c.family.label)


def _unread_deferred(problem: Problem, simulator: Simulator, candidates: list[_Candidate]) -> set[tuple]:
    """The deferred entries (``(id(c), *entry)``) of ``candidates`` (families without a
    configuration) whose tries no rejection reads: :func:`_complete_deferred` leaves them out.

    A family's rejection (:func:`~.report.family_rejections`) quotes its closest lower-bound
    OOM when that missed by less than every attempt, else its closest attempt (the first of
    the least ``over``) with its first offload refusal and the other refusals' kinds. An
    offload try's attempt misses by at least its floor (:meth:`~.simulate.Simulator.
    offload_bounds`, as the configuration counts its activations; :data:`_FLOOR_SLACK` for the
    sums' order) less the budget. So:

    * a one-try entry (attempt only: its host ceiling fits, it cannot be refused) whose floor
      misses by more than the family's least known miss (bound or attempt) is never quoted and
      changes neither the least attempt nor the choice of the bound;
    * when the bound is quoted already (it missed by less than every known attempt) and every
      attempt any entry of the family could make misses by more than the bound (each try of an
      entry either floored so or proved refused for its pinned host memory, which makes no
      attempt), the bound stays quoted, and it reads nothing else: all the entries are unread.

    Guarantees: the rejections, configurations and ranking are those of making every entry
    (tests/test_plan.py compares them)."""
    families: dict[str, list[_Candidate]] = {}
    for c in candidates:
        families.setdefault(c.family.label, []).append(c)
    unread: set[tuple] = set()
    for mine in families.values():
        entries = [(c, e) for c in mine for e in c.deferred]
        if not entries:
            continue
        bound = min((r.over for c in mine for r in c.refusals if r.kind == "oom"), default=math.inf)
        tried = min((a.over for c in mine for a in c.attempts), default=math.inf)
        known = min(bound, tried)
        if known == math.inf:
            continue  # no miss known: the first refusal or the attempts made decide
        if bound < tried and all(_tries_miss_more(problem, simulator, c, rc, chunks, bound)
                                 for c, (_, _, rc, chunks) in entries):
            unread.update((id(c), *e) for c, e in entries)
            continue
        unread.update((id(c), *e) for c, e in entries
                      if e[3] is not None and e[3] > 0 and _floor_misses_more(problem, simulator, c, e[2], e[3], known))
    return unread


def _tries_miss_more(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int | None,
                     miss: float) -> bool:
    """Whether every attempt the deferred entry ``(rc, chunks)`` of ``c`` could make misses the
    budget by more than ``miss``: each of its tries floored so (:func:`_floor_misses_more`) or
    proved refused for its pinned host memory (no attempt)."""
    if chunks is not None and chunks < 0:
        return True  # one try proved refused: a refusal only
    if chunks is not None:
        tries = [chunks]
    else:
        tries = [C for C, _ in offload_tries(simulator.simulate(c.split, c.family, c.m, rc).schedule, stash=False)]
    return all(_floor_misses_more(problem, simulator, c, rc, C, miss) or
               _unfit_or_refused(problem, simulator, c, rc, C, miss) or _proved_refused(problem, simulator, c, rc, C)
               for C in tries)


def _unfit_or_refused(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int,
                      miss: float) -> bool:
    """Whether ``c``'s offload try of ``chunks`` chunks with ``rc`` is proved to make no attempt
    that misses the budget by ``miss`` or less, without a draft (:func:`_proved_refused` needs
    one): such an attempt would hold every rank's activations within budget + ``miss`` less its
    states (the configuration's sum, :func:`~.config.assemble`; its activations are at least the
    plan's peak), so its pinned host memory would be at least the floor of
    :meth:`~.simulate.Simulator.offload_host_floor_within` for that room — and when that is
    over the node's, the try is refused (:func:`~.config.assemble_offloaded` checks the host
    first) and makes no attempt at all. ``miss`` = 0: the try gives no configuration.
    :data:`_FLOOR_SLACK` on both sides covers the sums' rounding."""
    room = [(problem.budget + miss) * (1.0 + _FLOOR_SLACK) - (a + b)
            for a, b in simulator.state(c.split, c.family, rc)]
    floor = simulator.offload_host_floor_within(c.split, c.family, c.m, rc, chunks, room)
    if floor is None:
        return False
    return check_pinned_host(problem.hardware, [x * (1.0 - _FLOOR_SLACK) for x in floor], problem.gpus) is not None


def _floor_misses_more(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int,
                       miss: float) -> bool:
    """Whether every offload plan of ``c`` with ``rc`` and ``chunks`` chunks misses the budget by
    more than ``miss`` bytes: its floor plus the fullest rank's states exceeds budget + miss, less
    a relative :data:`_FLOOR_SLACK` (``miss`` = 0: no plan fits, :func:`_offload_cannot_fit`)."""
    state = simulator.state(c.split, c.family, rc)
    limit = (problem.budget + miss) * (1.0 + _FLOOR_SLACK)
    lows = simulator.offload_floor_lows(c.split, c.family, c.m, rc)  # no session; the floors are at least these
    if lows is not None and chunks in lows and \
            max(a + b + x for (a, b), x in zip(state, lows[chunks])) > limit * (1.0 + _FLOOR_SLACK):
        return True
    bounds = simulator.offload_bounds(c.split, c.family, c.m, rc)
    if bounds is None or chunks not in bounds:
        return False
    return max(a + b + x for (a, b), x in zip(state, bounds[chunks][0])) > limit


def _complete_one(problem: Problem, simulator: Simulator, c: _Candidate, rc: Any, chunks: int | None,
                  stand_in: bool) -> _Candidate:
    """One deferred entry of ``c`` made (:func:`_complete_deferred`): its attempts and
    refusals on a fresh candidate. With ``stand_in``, a try proved to be refused — the one
    try of a ``-C`` entry, or the first try of ``rc`` for an entry of every try, which then
    ends them — is a stand-in refusal without its plan."""
    alone = _Candidate(c.split, c.family, c.m)
    if stand_in:
        first = -chunks if chunks is not None and chunks < 0 else None
        if chunks is None:
            first = offload_tries(simulator.simulate(c.split, c.family, c.m, rc).schedule, stash=False)[0][0]
            first = first if _proved_refused(problem, simulator, c, rc, first) else None
        if first is not None:
            alone.refusals.append(Refused("offload", f"C={first} refused: its pinned host memory is proved over "
                                          "the node's (not planned: an earlier refusal is the one quoted)"
                                          ).naming(c.where))
            return alone
    if chunks is None:  # every try of ``rc``
        _offload_variants(problem, simulator, alone, rc, _Ranking(problem.options.top), prove=False)
    elif chunks < 0:  # one try proved to be refused for its pinned host memory
        try:
            sim, res = simulator.offload(c.split, c.family, c.m, rc, -chunks, False)
            assemble_offloaded(problem, sim, res, -chunks, False)
        except Refused as e:
            alone.refusals.append(e.naming(c.where))
        if not alone.refusals:
            raise AssertionError(f"{c.where}: an offload try proved refused is not")
        return alone
    else:  # one try, proved neither to fit nor to be refused
        sim, res = simulator.offload(c.split, c.family, c.m, rc, chunks, False)
        alone.attempts.append(assemble_offloaded(problem, sim, res, chunks, False))
    if alone.fit is not None or any(a.fits for a in alone.attempts) or (chunks and alone.refusals):
        raise AssertionError(f"{c.where}: an offload try proved hopeless fits or is refused")
    return alone
