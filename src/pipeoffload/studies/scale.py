"""Scalability of per-device activation memory with the number of pipeline ranks p. Pure Python.

PipeOffload's claim (docs/algorithms.md#5-activation-offload): with offload, the activation memory each device holds stays
flat or falls as ranks are added, because the model's layers are spread over more ranks while the
number of microbatches in flight per device is capped by the offload, not by p. Without offload,
1F1B holds p microbatches of L/p layers (flat in bytes, ≈ L layers' worth), interleaved 1F1B a bit
more than (1 + 1/v)·L layers' worth, rising with p, and V-Half / V-Min about ½ and ⅓ of 1F1B's.

API
---
``SERIES``: the compared schedules (:class:`Series`), keys ``1f1b``, ``interleaved``, ``v-half``,
``v-min``, ``gis``, ``po-half``, ``po-full``.
``scale(model, hardware, ranks=(4, 8, 16, 32), m=None, series=None, *, po_runtime=True,
link_group=2, solo_factor=0.7) -> ScaleResult``
    (``stages=``, the old name of ``ranks``, still works with a DeprecationWarning; ``to_dict``'s
    keys stay ``stages``.) For every series and rank count p: split the model into p·v layer
    groups (TP = 1), generate the
    schedule with ``m`` microbatches (default 2·max(ranks): a fixed global batch), lower it through
    the pass pipeline (:func:`pipeoffload.passes.lower`: validated, timed with the cost model in ms
    and bytes) and offload when the series says so (the offload pass with the hardware's
    real transfer times, ranks paired on a host link, warm-up postponed, a reload that cannot finish
    before its backward is dropped and counted), and record the highest per-device activation peak.
    A point that cannot be built (p·v > layers, m too small, generator unavailable) carries the
    reason instead of numbers. Guarantees: ``points[key][i]`` is for ``ranks[i]``; bytes are per
    device (one GPU), TP = 1.
``ScaleResult.to_dict()``, ``.table()``.

"Half offload" is PipeOffload's selective offload of the first of two chunks: group-interleaved 1F1B,
v = 2, g = ⌈p/2⌉ (the PO base schedule), chunk 0 of every rank offloaded — half the chunks, the
long-lived ones (docs/algorithms.md#53-selective-offload-po-half-and-po-full). "Full offload" offloads both chunks of the same schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..costmodel.hardware import GiB, Hardware, get_hardware
from ..costmodel.model import ModelSpec, PipelineCosts, pipeline_costs
from ..costmodel.presets import PO_RUNTIME, get_model
from ..errors import ParameterError, PipeoffloadError
from ..ir import Schedule
from ..passes.lower import lower
from ..passes.offload import OffloadOptions
from .defaults import STUDY_OFFLOAD, study_offload
from ..timeline import Timeline

__all__ = ["Series", "SERIES", "ScalePoint", "ScaleResult", "scale"]


@dataclass(frozen=True)
class Series:
    """One line of the comparison: ``schedule`` with ``v`` chunks (``group`` "half" = g ⌈p/2⌉),
    offloading chunks ``0..offload-1`` of every rank."""

    key: str
    label: str
    schedule: str
    v: int = 1
    group: str | None = None
    offload: int = 0


SERIES: tuple[Series, ...] = (
    Series("1f1b", "1F1B", "1f1b"),
    Series("interleaved", "interleaved 1F1B v=2", "interleaved-1f1b", 2),
    Series("v-half", "V-Half", "v-half", 2),
    Series("v-min", "V-Min", "v-min", 2),
    Series("gis", "group-interleaved v=2 g=p/2", "group-interleaved", 2, "half"),
    Series("po-half", "PipeOffload half (GIS, chunk 0 offloaded)", "group-interleaved", 2, "half", 1),
    Series("po-full", "PipeOffload full (GIS, both chunks offloaded)", "group-interleaved", 2, "half", 2),
    Series("po-sel", "PipeOffload selective (GIS v=4, C=2 of 4 chunks offloaded)", "group-interleaved", 4, "half", 2),
)


@dataclass
class ScalePoint:
    """One (series, p). ``activation``: the highest per-device activation peak (bytes), or None with
    ``error`` saying why. ``layers``: the most layers one device holds. ``ranks``: p."""

    ranks: int
    activation: float | None = None
    per_rank: list[float] = field(default_factory=list)
    layers: int = 0
    bubble_rate: float | None = None
    makespan_ms: float | None = None
    makespan_increase: float | None = None  #: offload: relative to the same schedule without offload
    host: float | None = None  #: offload: highest per-device pinned host memory (bytes)
    dropped: int = 0  #: offloads dropped because the reload could not finish before its backward
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": self.ranks, "layers_per_device": self.layers,  # the JSON key stays
            "activation_gib": None if self.activation is None else self.activation / GiB,
            "per_rank_gib": [x / GiB for x in self.per_rank],
            "bubble_rate": self.bubble_rate, "makespan_ms": self.makespan_ms,
            "makespan_increase": self.makespan_increase,
            "host_gib": None if self.host is None else self.host / GiB,
            "dropped_offloads": self.dropped, "error": self.error,
        }

    @property
    def stages(self) -> int:
        """Deprecated name of :attr:`ranks` (warns)."""
        _deprecated("ScalePoint.stages", "ScalePoint.ranks")
        return self.ranks


@dataclass
class ScaleResult:
    model: ModelSpec
    hardware: Hardware
    ranks: tuple[int, ...]  #: the rank counts p studied
    m: int
    series: tuple[Series, ...]
    points: dict[str, list[ScalePoint]]

    @property
    def stages(self) -> tuple[int, ...]:
        """Deprecated name of :attr:`ranks` (warns)."""
        _deprecated("ScaleResult.stages", "ScaleResult.ranks")
        return self.ranks

    def activation_gib(self, key: str) -> list[float | None]:
        return [None if p.activation is None else p.activation / GiB for p in self.points[key]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.summary(), "hardware": self.hardware.to_dict(), "microbatches": self.m,
            "stages": list(self.ranks), "memory_unit": "GiB per device (activations only, TP=1)",
            "series": [{"key": s.key, "label": s.label, "schedule": s.schedule, "v": s.v, "group": s.group,
                        "offload_chunks": s.offload, "points": [p.to_dict() for p in self.points[s.key]]}
                       for s in self.series],
        }

    def table(self) -> str:
        w = max(len(s.label) for s in self.series)
        lines = [
            f"per-device activation memory (GiB, highest rank, TP=1) of {self.model.name} on {self.hardware.name}; "
            f"m={self.m} microbatches of {self.model.microbatch}×{self.model.seq} tokens at every p",
            f"{'stages':<{w}} " + " ".join(f"{p:>8}" for p in self.ranks),
            f"{'layers/device (max)':<{w}} " + " ".join(
                f"{max(self.points[s.key][i].layers for s in self.series):>8}" for i in range(len(self.ranks))),
        ]
        notes = []
        for s in self.series:
            cells = []
            for pt in self.points[s.key]:
                if pt.activation is None:
                    cells.append(f"{'n/a':>8}")
                    notes.append(f"  {s.label}, p={pt.ranks}: {pt.error}")
                else:
                    mark = "*" if pt.dropped else ""
                    cells.append(f"{pt.activation / GiB:>7.2f}{mark or ' '}")
            lines.append(f"{s.label:<{w}} " + " ".join(cells))
        dropped = [(s, pt) for s in self.series for pt in self.points[s.key] if pt.dropped]
        if dropped:
            lines.append("* some offloads dropped (the host link could not bring them back in time): "
                         + ", ".join(f"{s.key} p={pt.ranks}: {pt.dropped}" for s, pt in dropped))
        off = [(s, pt) for s in self.series if s.offload for pt in self.points[s.key] if pt.makespan_increase is not None]
        if off and all(abs(pt.makespan_increase) < 1e-4 for _, pt in off):  # type: ignore[arg-type]
            lines.append("offload makespan increase: none at any point (transfers hidden behind compute)")
        elif off:
            lines.append("offload makespan increase: " + ", ".join(
                f"{s.key} p={pt.ranks}: {pt.makespan_increase:+.2%}" for s, pt in off))
        if notes:
            lines.append("not available:")
            lines += notes
        return "\n".join(lines)


def _check_ranks(ranks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(ranks)
    if not out or any(not isinstance(p, int) or isinstance(p, bool) or p < 2 for p in out):
        raise ParameterError("ranks", f"needs rank counts >= 2, got {list(ranks)}")
    if list(out) != sorted(set(out)):
        raise ParameterError("ranks", f"rank counts must be increasing without repeats, got {list(out)}")
    return out


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)


def _check_series(series: Sequence[str] | None) -> tuple[Series, ...]:
    by_key = {s.key: s for s in SERIES}
    keys = list(series) if series is not None else [s.key for s in SERIES]
    unknown = [k for k in keys if k not in by_key]
    if unknown or not keys:
        raise ParameterError("series", f"unknown series {', '.join(unknown) or '(none)'}; valid: {', '.join(by_key)}")
    return tuple(by_key[k] for k in keys)


def scale(
    model: str | ModelSpec,
    hardware: str | Hardware,
    ranks: Sequence[int] = (4, 8, 16, 32),
    m: int | None = None,
    series: Sequence[str] | None = None,
    *,
    po_runtime: bool = True,
    link_group: int = STUDY_OFFLOAD.link_group,
    solo_factor: float = STUDY_OFFLOAD.solo_factor,
    stages: Sequence[int] | None = None,
) -> ScaleResult:
    """Per-device activation memory of each series at each stage count (see the module docstring).

    ``po_runtime``: apply PipeOffload's runtime setting (flash attention, no dropout, elementwise
    recompute) to the model, as the paper measures; ``series``: keys of :data:`SERIES` (default all).
    ``stages``: the old name of ``ranks`` (deprecated, warns).
    Raises ParameterError naming ``ranks``, ``m`` or ``series`` (or the model's or hardware's
    parameter) for bad inputs.
    """
    if stages is not None:
        _deprecated("scale(stages=...)", "scale(ranks=...)")
        ranks = stages
    counts = _check_ranks(ranks)
    spec = get_model(model, **(PO_RUNTIME if po_runtime else {}))
    hw = get_hardware(hardware)
    microbatches = 2 * max(counts) if m is None else m
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise ParameterError("m", f"must be a positive integer, got {m!r}")
    chosen = _check_series(series)
    study = _Study(spec, hw, microbatches, study_offload(STUDY_OFFLOAD, link_group=link_group,
                                                         solo_factor=solo_factor))
    points = {s.key: [study.point(s, p) for p in counts] for s in chosen}
    return ScaleResult(spec, hw, counts, microbatches, chosen, points)


class _Study:
    """The points of one :func:`scale` call: ``model`` on ``hardware`` with ``m`` microbatches,
    offloading with ``offload``'s host-link settings. Schedules and their timelines without
    offload are kept per (schedule, v, g, p), shared by the series that differ only in offload."""

    def __init__(self, model: ModelSpec, hardware: Hardware, m: int, offload: OffloadOptions) -> None:
        self.model, self.hardware, self.m, self.offload = model, hardware, m, offload
        self._bases: dict[tuple[str, int, int | None, int], tuple[Schedule, Timeline]] = {}

    def point(self, s: Series, p: int) -> ScalePoint:
        """Series ``s`` at ``p`` ranks; a point that cannot be built carries the reason."""
        from ..ir import Placement
        from ..schedules import SCHEDULES

        pt = ScalePoint(p)
        if p * s.v > self.model.layers:
            pt.error = f"p·v = {p * s.v} layer groups exceed the model's {self.model.layers} layers"
            return pt
        try:
            pc = pipeline_costs(self.model, self.hardware, p, s.v)
            pl = Placement.vshape(p) if SCHEDULES[s.schedule].placement == "v" else Placement.loop(p, s.v)
            pt.layers = max(sum(pc.split[g] for g in pl.stages_of(r)) for r in range(p))
            sched, tl = self._base(s, p, pc)
        except (PipeoffloadError, ImportError, AttributeError) as e:
            pt.error = f"{type(e).__name__ if isinstance(e, ImportError) else 'refused'}: {e}"
            return pt
        pt.bubble_rate = tl.bubble_rate
        pt.makespan_ms = tl.makespan
        if s.offload:
            self._offload(pt, s, sched, pc)
        else:
            pt.per_rank = tl.peak_memory()
        if pt.error is None:
            pt.activation = max(pt.per_rank)
        return pt

    def _base(self, s: Series, p: int, pc: PipelineCosts) -> tuple[Schedule, Timeline]:
        """The series' schedule at ``p`` and its timeline without offload (ms, bytes)."""
        from ..schedules import ScheduleSpec, build

        g = None if s.group is None else (p + 1) // 2
        key = (s.schedule, s.v, g, p)
        if key not in self._bases:
            sched = build(ScheduleSpec(s.schedule, p, self.m, v=s.v, g=g, costs=pc.costs, memory=pc.memory),
                          check=False)
            self._bases[key] = (sched, lower(sched, pc.costs, pc.memory, memory_unit="bytes").timeline)
        return self._bases[key]

    def _offload(self, pt: ScalePoint, s: Series, sched: Schedule, pc: PipelineCosts) -> None:
        """Fill ``pt`` from the offload pass's plan of ``s.offload`` chunks per rank with the
        hardware's real transfer times (or set ``pt.error`` when the pass refuses)."""
        settings = replace(self.offload, offload_chunks=min(s.offload, s.v),
                           transfer_times=tuple(x.offload_ms for x in pc.groups))
        try:
            res = lower(sched, pc.costs, pc.memory, memory_unit="bytes", offload=settings).offload
        except PipeoffloadError as e:
            pt.error = f"offload refused: {e}"
            return
        assert res is not None
        pt.per_rank = list(res.peak)
        pt.host = max(res.host_memory)
        pt.dropped = res.skipped.get("link_busy", 0)
        pt.makespan_ms = res.makespan
        pt.makespan_increase = res.makespan / res.makespan_no_offload - 1.0
        pt.bubble_rate = res.timeline.bubble_rate
