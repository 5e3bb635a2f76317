"""The planner's search space: PP·TP·DP splits of the GPUs, schedule families, the search
options, and the :class:`Problem` one search solves. Pure Python.

``enumerate_splits(model, gpus, global_batch)``: every ``(split, m)`` worth simulating and
the splits rejected outright. ``schedule_families(p, schedules, chunks, layers)``: every schedule
setting (family, v, g, memory limit) on ``p`` pipeline ranks — the one enumeration that both the
planner (``families(p, layers, options)``) and ``pipeoffload best``
(:func:`pipeoffload.studies.best.settings`) search. ``offload_tries(schedule)``: the order in which
both try offload on a setting that does not fit. ``PlanOptions.check()`` raises
:class:`~pipeoffload.errors.ParameterError` naming the option (a field of
:class:`PlanOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..costmodel.hardware import Hardware
from ..costmodel.model import ModelSpec
from ..errors import ParameterError
from ..recompute import RECOMPUTE_LEVELS, Recompute
from ..ir import OpKind, Placement, Schedule
from ..schedules import SCHEDULES
from .refusals import Rejection
from .sharding import NodeProfile

__all__ = [
    "NODE_GPUS", "TP_CHOICES", "FIXED_ORDER", "DEFAULT_SCHEDULES", "BUDGET", "Split", "Family", "PlanOptions",
    "Problem", "families", "schedule_families", "offload_tries", "enumerate_splits", "placement_of",
]

#: GPUs per node: TP never crosses a node.
NODE_GPUS = 8
TP_CHOICES = (1, 2, 4, 8)
#: Schedules whose op order depends only on (p, m, v, g): generated once, shared across costs.
FIXED_ORDER = frozenset({"gpipe", "1f1b", "interleaved-1f1b", "group-interleaved", "zb-h1", "zb-h2", "dualpipev"})
_REPORT_ORDER = ("1f1b", "gpipe", "zb-h1", "zb-h2", "zb-auto", "interleaved-1f1b", "group-interleaved",
                 "zb-v", "v-half", "v-min", "v-zb", "v-auto", "dualpipev")
#: Everything the planner may search, in the order it reports them: every registered schedule
#: (``pipeoffload best`` searches them all, and so does the planner unless told otherwise).
DEFAULT_SCHEDULES = tuple(n for n in _REPORT_ORDER if n in SCHEDULES) + tuple(n for n in SCHEDULES
                                                                              if n not in _REPORT_ORDER)
#: A memory-limited generator's limit "at the budget": what the budget leaves for activations.
BUDGET = "budget"


@dataclass(frozen=True)
class Split:
    """``tp · pp · dp`` GPUs: tensor, pipeline and data parallel degrees."""

    tp: int
    pp: int
    dp: int
    sp: bool = True  #: sequence parallelism with TP (Megatron's); False: the norms' tensors stay whole

    def __str__(self) -> str:
        return f"TP={self.tp}{'' if self.sp or self.tp == 1 else ' (no SP)'} PP={self.pp} DP={self.dp}"


@dataclass(frozen=True)
class Family:
    """One schedule setting: registry ``schedule`` with ``v`` chunks; ``group`` for
    group-interleaved: "half" (⌈p/2⌉), "full" (p) or the group size itself when strictly between;
    ``limit`` for the memory-limited generators zb-auto and zb-v: a multiple of 1F1B's memory
    (zb-auto 1 or 2; zb-v None = 1) or :data:`BUDGET` (what the budget leaves for activations).
    A configuration's family has ``BUDGET`` replaced by the multiple it came to
    (:func:`~pipeoffload.planner.config.assemble`)."""

    schedule: str
    v: int = 1
    group: str | int | None = None
    limit: float | str | None = None

    @property
    def label(self) -> str:
        if self.schedule == "zb-auto":
            return "zb-auto at budget" if self.limit == BUDGET else f"zb-{self.limit:.3g}p"
        if self.schedule == "zb-v" and self.limit is not None:
            return "zb-v at budget" if self.limit == BUDGET else f"zb-v {self.limit:.3g}p"
        if self.schedule == "group-interleaved":
            if isinstance(self.group, int):  # one label for every g strictly between (p-independent)
                return f"group-interleaved v={self.v} p/2<g<p"
            return f"group-interleaved v={self.v} g={'p/2' if self.group == 'half' else 'p'}"
        if self.schedule == "interleaved-1f1b":
            return f"interleaved-1f1b v={self.v}"
        return self.schedule

    def g(self, p: int) -> int | None:
        """The group size on ``p`` ranks (None for a schedule without groups)."""
        if self.group is None:
            return None
        if isinstance(self.group, int):
            return self.group
        return (p + 1) // 2 if self.group == "half" else p


def _recompute_or_self(value: object) -> object:
    """``value`` as a :class:`Recompute`, or unchanged when it is none (for check() to report)."""
    try:
        return Recompute.of(value)
    except ParameterError:
        return value


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of the search (defaults in brackets).

    ``schedules``: registry names to search [all, as ``pipeoffload best``: zb-auto runs as "zb-1p",
    "zb-2p" and at the budget, zb-v at 1F1B's memory and at the budget, group-interleaved with every
    g in ⌈p/2⌉..p, v-auto within V-Half's peak];
    ``chunks``: v values for loop-placed multi-chunk schedules [(2, 3, 4), as ``best --max-v 4``]; ``recompute``: recompute settings
    to try (:class:`~pipeoffload.recompute.Recompute`; names and the old bools accepted, False =
    none, True = elementwise), from most memory to least: none, elementwise (cheap elementwise ops),
    selective (those and the core attention), full (the whole layer) [all four; offload is tried
    with none and elementwise only]; ``offload``: try activation offload [True];
    ``top``: configurations kept — a family slower than the top ones even before its offload is
    evaluated is pruned [10]; ``po_runtime``: apply PipeOffload's runtime setting (flash attention,
    no dropout) to the model [False]; ``trim_edges``: "auto" (the split with the lower heaviest
    group), True or False; ``link_group``: pipeline ranks per host link [None: from the hardware's
    topology and TP, :mod:`~pipeoffload.planner.hostlink`]; ``solo_factor``: the offload pass' speed-up of a
    transfer whose link's other direction is idle [0.7];
    ``tp_bw``/``hbm_bw``/``peak_rate``: override :func:`~pipeoffload.planner.sharding.node_profile`;
    ``dp_sharding``: "optimizer" (Megatron's distributed optimizer, ZeRO-1: 6 + 12/d B/param),
    "none" (18 B/param on every replica) or "full" (ZeRO-3/FSDP) ["optimizer"]; ``host_bw``:
    override the profile's host link (bytes/s, one GPU alone); ``sequence_parallel``: TP with (True)
    and/or without (False) sequence parallelism [(True,); the runtime's TP has none yet, so plans
    meant for it use (False,)].
    """

    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    chunks: tuple[int, ...] = (2, 3, 4)
    recompute: tuple[Recompute, ...] = RECOMPUTE_LEVELS
    offload: bool = True
    top: int = 10
    po_runtime: bool = False
    trim_edges: bool | str = "auto"
    link_group: int | None = None
    solo_factor: float = 0.7
    tp_bw: float | None = None
    hbm_bw: float | None = None
    peak_rate: float | None = None
    dp_sharding: str = "optimizer"
    host_bw: float | None = None
    sequence_parallel: tuple[bool, ...] = (True,)

    def __post_init__(self) -> None:
        # One recompute enum (docs/glossary.md): bools and names become Recompute members here; a
        # value that is neither is left for check() to name.
        if isinstance(self.recompute, (tuple, list)):
            norm = tuple(_recompute_or_self(rc) for rc in self.recompute)
            object.__setattr__(self, "recompute", norm)

    def check(self) -> None:
        """Raise :class:`ParameterError` naming the first invalid field."""
        unknown = [s for s in self.schedules if s not in SCHEDULES]
        if unknown or not self.schedules:
            raise ParameterError("schedules", f"unknown schedule(s) {', '.join(unknown) or '(none given)'}; "
                                 f"valid: {', '.join(SCHEDULES)}")
        if not self.chunks or any(not isinstance(v, int) or v < 2 for v in self.chunks):
            raise ParameterError("chunks", f"chunk counts must be integers >= 2, got {list(self.chunks)}")
        if not isinstance(self.recompute, tuple) or not self.recompute:
            raise ParameterError("recompute", f"needs at least one of {', '.join(RECOMPUTE_LEVELS)}, "
                                              f"got {self.recompute!r}")
        for rc in self.recompute:
            Recompute.of(rc, "recompute")
        if not isinstance(self.top, int) or self.top < 1:
            raise ParameterError("top", f"must be an integer >= 1, got {self.top!r}")
        from ..costmodel.model import DP_SHARDING

        if self.dp_sharding not in DP_SHARDING:
            raise ParameterError("dp_sharding", f"must be one of {', '.join(DP_SHARDING)}, got {self.dp_sharding!r}")
        if self.host_bw is not None and not (isinstance(self.host_bw, (int, float)) and self.host_bw > 0):
            raise ParameterError("host_bw", f"must be a positive number, got {self.host_bw!r}")
        if not self.sequence_parallel or any(x not in (True, False) for x in self.sequence_parallel):
            raise ParameterError("sequence_parallel", f"needs True and/or False, got {self.sequence_parallel!r}")
        if self.trim_edges not in ("auto", True, False):
            raise ParameterError("trim_edges", f"must be 'auto', True or False, got {self.trim_edges!r}")


@dataclass(frozen=True)
class Problem:
    """What one search solves: ``model`` (already in the searched setting, e.g. PipeOffload's
    runtime) on ``gpus`` × ``hardware`` with ``node``'s constants, at most ``budget`` bytes per
    device, ``global_batch`` sequences per iteration, searched with ``options``. Checked inputs."""

    model: ModelSpec
    hardware: Hardware
    node: NodeProfile
    budget: float
    global_batch: int
    gpus: int
    options: PlanOptions


def schedule_families(p: int, schedules: Sequence[str] | None = None, chunks: Iterable[int] = (2, 3, 4),
                      layers: int | None = None) -> list[Family]:
    """Every schedule setting on ``p`` pipeline ranks, in the order of ``schedules`` (default: the
    registry's): the one enumeration the planner and ``pipeoffload best`` search.

    Per schedule: zb-auto at 1× and 2× 1F1B's memory and at the budget; zb-v at 1F1B's memory and at
    the budget; interleaved-1f1b at every v of ``chunks``; group-interleaved at every v of ``chunks``
    and every group size g in ⌈p/2⌉..p; every other schedule once (V schedules with v = 2).
    With ``layers`` (a model to split), only settings that can hold it: p·v ≤ layers + 2 for the
    loop-placed multi-chunk schedules (the edge chunks may hold only the embedding or the head),
    2p ≤ layers for the V-placed ones. At p = 1 there is no pipeline and every schedule is the same
    sequence of forwards and backwards: 1F1B alone (when among ``schedules``). Raises
    ParameterError (``schedules``) for a name the registry lacks."""
    names = tuple(SCHEDULES) if schedules is None else tuple(schedules)
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown:
        raise ParameterError("schedules", f"unknown schedule(s) {', '.join(unknown)}; valid: {', '.join(SCHEDULES)}")
    if p == 1:
        return [Family("1f1b")] if "1f1b" in names else []
    out: list[Family] = []
    for name in names:
        info = SCHEDULES[name]
        if name == "zb-auto":
            out += [Family(name, 1, limit=1), Family(name, 1, limit=2), Family(name, 1, limit=BUDGET)]
        elif info.placement == "v":
            if layers is None or 2 * p <= layers:
                out += [Family(name, 2)] + ([Family(name, 2, limit=BUDGET)] if name == "zb-v" else [])
        elif info.default_v == 1:
            out.append(Family(name, 1))
        else:
            out += _multi_chunk_families(name, p, layers, chunks)
    return out


def families(p: int, layers: int, options: PlanOptions = PlanOptions()) -> list[Family]:
    """The planner's schedule settings for ``p`` pipeline ranks and a model of ``layers`` layers:
    :func:`schedule_families` restricted to ``options.schedules`` and ``options.chunks``."""
    return schedule_families(p, options.schedules, options.chunks, layers)


def _multi_chunk_families(name: str, p: int, layers: int | None, chunks: Iterable[int]) -> list[Family]:
    """A loop-placed multi-chunk schedule at every v of ``chunks`` (with p·v ≤ layers + 2 when
    ``layers`` is given); group-interleaved at every g in ⌈p/2⌉..p."""
    out: list[Family] = []
    for v in sorted(set(chunks)):
        if layers is not None and p * v > layers + 2:  # edge chunks may hold only the embedding / head
            continue
        if name == "group-interleaved":
            half = (p + 1) // 2
            out += [Family(name, v, group="half" if g == half else "full" if g == p else g)
                    for g in range(half, p + 1)]
        else:
            out.append(Family(name, v))
    return out


def offload_tries(schedule: Schedule, stash: bool = True) -> list[tuple[int, bool]]:
    """The offload settings ``(C, stash)`` to try, in order, on a schedule that does not fit:
    chunks ``0..C−1`` for C = 1..v, then — with ``stash`` and a schedule with separate W ops — the
    same with the B→W stash window. The first that fits is kept (``pipeoffload best`` and the
    planner alike): the earlier a setting, the less it moves over the host link."""
    tries = [(c, False) for c in range(1, schedule.chunks + 1)]
    if stash and any(o.kind is OpKind.W for o in schedule.ops()):
        tries += [(c, True) for c in range(1, schedule.chunks + 1)]
    return tries


def enumerate_splits(model: ModelSpec, gpus: int, global_batch: int) -> tuple[list[tuple[Split, int]], list[Rejection]]:
    """Every ``(split, m)`` worth simulating, and the splits rejected before any simulation.

    Guarantees: ``tp · pp · dp == gpus`` for every split, in order of TP then PP; TP divides
    ``min(gpus, NODE_GPUS)`` (splits whose TP does not are neither listed nor rejected);
    ``m · dp · microbatch == global_batch`` for every accepted split.
    """
    ok: list[tuple[Split, int]] = []
    bad: list[Rejection] = []
    for tp in TP_CHOICES:
        if gpus % tp or min(gpus, NODE_GPUS) % tp:
            continue
        rest = gpus // tp
        for pp in (d for d in range(1, rest + 1) if rest % d == 0):
            split = Split(tp, pp, rest // pp)
            why = _split_refusal(model, split, global_batch)
            if why:
                bad.append(Rejection(str(split), "split", why, config=str(split)))
            else:
                ok.append((split, global_batch // (split.dp * model.microbatch)))
    return ok, bad


def _split_refusal(model: ModelSpec, split: Split, global_batch: int) -> str | None:
    """Why ``split`` cannot hold ``model`` at ``global_batch`` (None when it can)."""
    tp, b = split.tp, model.microbatch
    if model.heads % tp or model.ffn % tp or model.kv_groups % tp:  # type: ignore[operator]
        return f"TP={tp} does not divide the {model.heads} heads, {model.kv_groups} KV groups and FFN {model.ffn}"
    if split.pp > model.layers:
        return f"PP={split.pp} exceeds the model's {model.layers} layers"
    if global_batch % (split.dp * b):
        return f"global batch {global_batch} is not divisible by DP·microbatch = {split.dp}·{b}"
    return None


def placement_of(family: Family, p: int) -> Placement:
    """Where ``family``'s layer groups live on ``p`` ranks: V-shaped or looped."""
    return Placement.vshape(p) if SCHEDULES[family.schedule].placement == "v" else Placement.loop(p, family.v)
