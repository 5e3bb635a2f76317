"""Pictures of a :class:`~pipeoffload.timeline.Timeline`: PNG, Chrome/Perfetto trace, text grid.

Every view works for simulated and measured timelines alike. This package and its
``trace``/``text`` modules are pure Python (no torch, no matplotlib); ``png`` imports
matplotlib only inside :func:`~pipeoffload.viz.png.draw_timeline`.

Shared here: how events become *boxes* on lanes. A compute op is one box on its
rank's "compute" lane. A transfer (offload / reload, of either offload window: the activation
window F→B, or the stash window B→W) may arrive as one event with a duration or as a
START/END pair of instants (or both); either way all events of one (rank, window,
direction, layer group, microbatch) merge into one box from the earliest start to the
latest end, on the "d2h" (offload) or "h2d" (reload) lane. Sends and receives go on
the "comm" lane, one box per event.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import OpKind
from ..timeline import TimedOp, Timeline

__all__ = ["Box", "LANE_ORDER", "KIND_COLORS", "COMM_COLOR", "KIND_NAMES", "CHUNK_MIX", "boxes", "lanes_of",
           "time_scale_us", "time_label", "format_memory", "default_title"]

#: Lane order within one rank, top to bottom.
LANE_ORDER = ("compute", "d2h", "h2d", "comm")

#: Base colour per box kind (chunk 0), shared by every picture (PNG, HTML). Later
#: chunks of compute kinds are mixed towards white by ``CHUNK_MIX * chunk / (chunks - 1)``.
KIND_COLORS = {
    "F": "#3f6fb5",
    "B": "#e8832a",
    "W": "#4f9d48",
    "BW": "#c9474b",
    "OFFLOAD": "#8a62b8",
    "RELOAD": "#2a9d9a",
    "STASH_OFFLOAD": "#c0569f",
    "STASH_RELOAD": "#8c7a1e",
}
#: Colour of sends and receives (the "comm" lane).
COMM_COLOR = "#9a9a9a"
#: Legend names of the box kinds.
KIND_NAMES = {"F": "F forward", "B": "B input grad", "W": "W weight grad", "BW": "BW full backward",
              "OFFLOAD": "offload (d2h)", "RELOAD": "reload (h2d)",
              "STASH_OFFLOAD": "stash offload (d2h, B→W)", "STASH_RELOAD": "stash reload (h2d, B→W)"}
#: How far the last chunk's colour is mixed towards white.
CHUNK_MIX = 0.55

#: The box kind of each transfer op kind: its window (the activation window F→B or the stash window B→W)
#: and direction.
_FAMILY = {
    OpKind.OFFLOAD_START: "OFFLOAD", OpKind.OFFLOAD_END: "OFFLOAD",
    OpKind.RELOAD_START: "RELOAD", OpKind.RELOAD_END: "RELOAD",
    OpKind.STASH_OFFLOAD_START: "STASH_OFFLOAD", OpKind.STASH_OFFLOAD_END: "STASH_OFFLOAD",
    OpKind.STASH_RELOAD_START: "STASH_RELOAD", OpKind.STASH_RELOAD_END: "STASH_RELOAD",
}


@dataclass(frozen=True)
class Box:
    """One drawable interval on one lane of one rank.

    ``kind`` is the op kind's value for compute and comm ops ("F", "B", "W", "BW",
    "SEND_F", ...) and "OFFLOAD" / "RELOAD" ("STASH_OFFLOAD" / "STASH_RELOAD" in the
    stash window, B→W) for merged transfers. ``mem`` is the
    summed memory delta of the events merged into the box.
    """

    rank: int
    lane: str
    kind: str
    start: float
    end: float
    stage: int
    chunk: int
    microbatch: int
    mem: float = 0.0
    #: The other rank of a send or receive (None for every other box).
    peer: int | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


def _lane(e: TimedOp) -> str:
    """The lane an event is drawn on: its stream, or one derived from its kind."""
    k = e.op.kind
    if k.is_compute:
        return "compute"
    if e.stream in ("d2h", "h2d", "comm"):
        return e.stream
    fam = _FAMILY.get(k)
    if fam is not None:
        return "d2h" if fam.endswith("OFFLOAD") else "h2d"
    return "comm"


def boxes(tl: Timeline) -> list[Box]:
    """All boxes of ``tl``, sorted by (rank, lane order, start).

    Guarantees: exactly one box per compute event (same start/end); one box per
    (rank, transfer kind, stage, microbatch); one box per comm event.
    """
    out: list[Box] = []
    merged: dict[tuple, list[TimedOp]] = {}
    for e in tl.events:
        lane = _lane(e)
        o = e.op
        fam = _FAMILY.get(o.kind)
        if fam is not None:
            merged.setdefault((o.rank, lane, fam, o.stage, o.microbatch), []).append(e)
            continue
        out.append(Box(o.rank, lane, o.kind.value, e.start, e.end, o.stage, o.chunk, o.microbatch, e.mem, o.peer))
    for (rank, lane, fam, stage, mb), evs in merged.items():
        out.append(
            Box(rank, lane, fam, min(e.start for e in evs), max(e.end for e in evs),
                stage, evs[0].op.chunk, mb, sum(e.mem for e in evs))
        )
    order = {name: i for i, name in enumerate(LANE_ORDER)}
    out.sort(key=lambda b: (b.rank, order[b.lane], b.start, b.end))
    return out


def lanes_of(bxs: list[Box]) -> list[str]:
    """The lanes that hold at least one box, in :data:`LANE_ORDER` ("compute" always)."""
    used = {b.lane for b in bxs}
    return [ln for ln in LANE_ORDER if ln == "compute" or ln in used]


def time_scale_us(tl: Timeline) -> float:
    """Microseconds per timeline time unit: 1e6 when ``meta["time_unit"] == "s"``
    (measured), else 1000 (a simulated unit is drawn as one millisecond)."""
    return 1e6 if tl.meta.get("time_unit") == "s" else 1000.0


def time_label(tl: Timeline) -> str:
    unit = tl.meta.get("time_unit")
    if unit == "s":
        return "time (s)"
    return f"time ({unit})" if unit else "time (cost units)"


def format_memory(amount: float, unit: str) -> str:
    """A short memory figure: bytes as KiB/MiB/GiB, other units as a plain number."""
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(amount) >= scale:
                return f"{amount / scale:.3g} {name}"
        return f"{amount:.0f} B"
    return f"{amount:.4g}"


def default_title(tl: Timeline) -> str:
    """The pictures' title line: schedule name, p, m, v (and g when the schedule has one)."""
    parts = [tl.name or "timeline", f"p={tl.num_ranks}", f"m={tl.num_microbatches}", f"v={tl.chunks}"]
    g = (tl.meta.get("params") or {}).get("g")
    if g is not None:
        parts.append(f"g={g}")
    return "   ".join(parts)
