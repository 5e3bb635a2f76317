"""The best schedule for a memory budget: every family, v, g and offload setting, lowest bubble first.

:func:`search` generates every registered schedule with every ``v`` (up to ``max_v``) and
group size ``g`` it accepts (zb-auto and zb-v at the budget and at their usual limits),
times it, and keeps it when its highest per-rank peak fits ``mem_limit``. One that does
not fit is offloaded (the offload pass, :mod:`pipeoffload.passes.offload`): chunks
``0..C−1`` for C = 1, 2, … and then with the stash window (B→W) too, the first setting that fits
is kept. Offload is planned in "skip" mode, so it never lengthens the iteration and a
candidate's bubble rate is its schedule's. Candidates are ranked by bubble rate, then
peak, then the simpler setting (no offload, fewer chunks, no stash).

The planner (``pipeoffload plan``) runs the same search per PP·TP·DP split, in bytes and ms:
both take their settings from one enumeration,
:func:`pipeoffload.planner.space.schedule_families` (:func:`settings` turns each into this
module's units: "1F1B's memory" is ``p`` whole-stage forwards, "at the budget" is
``mem_limit``), and both try offload in one order,
:func:`pipeoffload.planner.space.offload_tries`. What the planner adds is its own: recompute
settings, the budget counting parameters and optimizer states, ranking by iteration time
(with DP), pruning by bounds. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..costs import Costs, MemoryDeltas
from ..errors import PipeoffloadError, require
from ..ir import OpKind, Placement
from ..passes.offload import plan_offload
from .defaults import BEST_OFFLOAD, study_offload
from ..passes.timing import simulate
from ..planner.space import BUDGET, Family, offload_tries, schedule_families
from ..schedules import SCHEDULES, generate

__all__ = ["Setting", "Entry", "BestResult", "setting_of", "settings", "evaluate", "search"]

_EPS = 1e-9


@dataclass(frozen=True)
class Setting:
    """One schedule to try: registry name and generator keyword arguments."""

    schedule: str
    v: int | None = None
    g: int | None = None
    mem_limit: float | None = None

    @property
    def label(self) -> str:
        parts = [self.schedule] + [f"{k}={val:g}" for k, val in (("v", self.v), ("g", self.g)) if val is not None]
        if self.mem_limit is not None:
            parts.append(f"limit={self.mem_limit:g}")
        return " ".join(parts)

    def kwargs(self) -> dict:
        return {k: val for k, val in (("v", self.v), ("g", self.g), ("mem_limit", self.mem_limit)) if val is not None}


@dataclass
class Entry:
    """One evaluated setting. ``offload`` describes the offload that made it fit (None: none
    needed or none fits); ``fits`` says whether ``peak`` is within the budget."""

    setting: Setting
    bubble_rate: float | None = None
    makespan: float | None = None
    peak: float | None = None
    peak_no_offload: float | None = None
    fits: bool = False
    offload: dict | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        off = ""
        if self.offload:
            off = f" + offload C={self.offload['chunks']}" + (" +stash" if self.offload["stash"] else "")
        return self.setting.label + off

    def key(self) -> tuple:
        """Ranking: fitting first, then bubble rate, peak, no offload, fewer chunks, no stash."""
        off = self.offload or {"chunks": 0, "stash": False}
        return (not self.fits, self.error is not None, round(self.bubble_rate or 0.0, 9), self.peak or 0.0,
                off["chunks"], off["stash"], self.label)

    def to_json(self) -> dict:
        return {"label": self.label, "setting": asdict(self.setting), "fits": self.fits,
                "bubble_rate": self.bubble_rate, "makespan": self.makespan, "peak_memory": self.peak,
                "peak_memory_no_offload": self.peak_no_offload, "offload": self.offload, "error": self.error}


@dataclass
class BestResult:
    """Every evaluated setting, best first; ``best`` is the first that fits (or None)."""

    p: int
    m: int
    mem_limit: float
    entries: list[Entry] = field(default_factory=list)

    @property
    def best(self) -> Entry | None:
        return self.entries[0] if self.entries and self.entries[0].fits else None

    def to_json(self, top: int | None = None) -> dict:
        shown = self.entries if top is None else self.entries[:top]
        return {"p": self.p, "m": self.m, "mem_limit": self.mem_limit,
                "best": self.best.to_json() if self.best else None,
                "fitting": sum(e.fits for e in self.entries), "evaluated": len(self.entries),
                "entries": [e.to_json() for e in shown]}


def setting_of(family: Family, p: int, mem_limit: float, one_f: float) -> Setting:
    """``family`` (of :func:`~pipeoffload.planner.space.schedule_families`) on ``p`` ranks in this
    module's units: ``v`` for the loop-placed multi-chunk schedules (V schedules take their own),
    ``g``, and for zb-auto / zb-v the limit — a multiple of 1F1B's peak (``p · one_f``) or, at the
    budget, ``mem_limit`` capped at twice that peak (the planner caps it alike: beyond ZB-2p's
    memory the ZB generators find nothing better). v-auto keeps its generator's default (V-Half's
    published peak)."""
    info = SCHEDULES[family.schedule]
    v = family.v if info.placement == "loop" and family.v > 1 else None
    limit = None
    if family.schedule in ("zb-auto", "zb-v"):
        limit = min(float(mem_limit), 2 * p * one_f) if family.limit == BUDGET else float(family.limit or 1) * p * one_f
    return Setting(family.schedule, v=v, g=family.g(p), mem_limit=limit)


def settings(p: int, m: int, mem_limit: float, memory: MemoryDeltas, max_v: int = 4,
             schedules: Sequence[str] | None = None) -> list[Setting]:
    """Every (schedule, v, g, limit) the search tries at ``p``, ``m``, in registry order (or that of
    ``schedules``): :func:`~pipeoffload.planner.space.schedule_families` with v in 2..``max_v``, as
    :func:`setting_of`; a schedule's limits that coincide are tried once, those below one
    whole-stage forward (which no schedule meets) not at all."""
    one_f = max(memory.delta_table(Placement.loop(p))[s][OpKind.F] for s in range(p))
    by_schedule: dict[str, list[Setting]] = {}  # insertion order = the enumeration's schedule order
    for fam in schedule_families(p, schedules, range(2, max_v + 1)):
        st = setting_of(fam, p, mem_limit, one_f)
        mine = by_schedule.setdefault(st.schedule, [])
        if st not in mine and (st.mem_limit is None or st.mem_limit >= one_f - _EPS):
            mine.append(st)
    # A limited generator's settings by increasing limit (the rest keep the enumeration's order: sort is stable).
    return [st for mine in by_schedule.values() for st in sorted(mine, key=lambda x: x.mem_limit or 0.0)]


def evaluate(setting: Setting, p: int, m: int, costs: Costs, memory: MemoryDeltas, mem_limit: float, *,
             offload_time: float = BEST_OFFLOAD.offload_time, link_group: int = BEST_OFFLOAD.link_group,
             offload: bool = True) -> Entry:
    """Generate, time and (when it does not fit and ``offload``) offload one setting.

    Guarantees: ``fits`` is True exactly when ``peak`` ≤ ``mem_limit``; with offload the
    plan never lengthens the makespan ("skip" mode) and is the first of
    :func:`~pipeoffload.planner.space.offload_tries` (C = 1…v without, then with, the stash
    window, B→W) that fits; when none fits, ``offload`` is None and ``peak`` the plain one."""
    entry = Entry(setting)
    try:
        sched = generate(setting.schedule, p=p, m=m, costs=costs, memory=memory, **setting.kwargs())
    except PipeoffloadError as e:
        entry.error = str(e)
        return entry
    tl = simulate(sched, costs, memory)
    entry.bubble_rate, entry.makespan = tl.bubble_rate, tl.makespan
    entry.peak = entry.peak_no_offload = max(tl.peak_memory())
    entry.fits = entry.peak <= mem_limit * (1 + _EPS) + _EPS
    if entry.fits or not offload:
        return entry
    for c, stash in offload_tries(sched):
        opts = study_offload(BEST_OFFLOAD, offload_chunks=c, offload_time=offload_time, link_group=link_group,
                             stash=stash)
        res = plan_offload(sched, tl, comm=costs.comm, options=opts)
        peak = max(res.peak)
        if entry.offload is None or peak < entry.peak:
            entry.peak = peak
            entry.offload = {"chunks": c, "stash": stash, "transfers": len(res.transfers),
                             "offload_time": offload_time}
        if peak <= mem_limit * (1 + _EPS) + _EPS:
            entry.fits = True
            break
    if not entry.fits:
        entry.peak, entry.offload = entry.peak_no_offload, None
    return entry


def search(p: int, m: int, *, costs: Costs | None = None, memory: MemoryDeltas | None = None,
           mem_limit: float | None = None, offload_time: float = BEST_OFFLOAD.offload_time,
           link_group: int = BEST_OFFLOAD.link_group,
           offload: bool = True, max_v: int = 4, schedules: Sequence[str] | None = None) -> BestResult:
    """Every setting (:func:`settings`) evaluated (:func:`evaluate`) and ranked: the
    lowest bubble rate among those that fit ``mem_limit`` first (default: 1F1B's peak,
    ``p`` whole-stage forwards).

    Guarantees: ``best`` fits the budget and no evaluated setting that fits has a lower
    bubble rate; entries that refuse the parameters carry the reason. ``schedules`` restricts
    the registry names searched (default all). Raises ParameterError naming ``p``, ``m``,
    ``mem_limit``, ``max_v`` or ``schedules`` for bad input."""
    costs, memory = costs or Costs(), memory or MemoryDeltas()
    for name, val in (("p", p), ("m", m), ("max_v", max_v)):
        require(isinstance(val, int) and not isinstance(val, bool) and val >= 1, name,
                f"must be an integer >= 1, got {val!r}")
    one_f = max(memory.delta_table(Placement.loop(p))[s][OpKind.F] for s in range(p))
    limit = p * one_f if mem_limit is None else float(mem_limit)
    require(limit > 0, "mem_limit", f"must be positive, got {mem_limit!r}")
    entries = [evaluate(s, p, m, costs, memory, limit, offload_time=offload_time, link_group=link_group,
                        offload=offload) for s in settings(p, m, limit, memory, max_v, schedules)]
    entries.sort(key=Entry.key)
    return BestResult(p, m, limit, entries)
