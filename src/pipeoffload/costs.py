"""Per-op time costs and memory deltas used by the timing pass. Pure Python.

Costs and memory deltas are given *per rank* (a whole rank's share of the model, all
its chunks); a rank holding ``n`` chunks gives each chunk ``1/n`` of them, unless a
per-layer-group override is supplied. ``BW`` costs ``B + W`` and frees ``B + W``.
Words as in docs/glossary.md (``rank_costs``: one triple per rank; ``stage_costs``, its
old name, still works for one release with a DeprecationWarning).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from .errors import ParameterError, read_input
from .ir import OpKind, Placement

Triple = tuple[float, float, float]


def _check_triple(param: str, t: Sequence[float], positive: bool) -> Triple:
    if len(t) != 3:
        raise ParameterError(param, f"needs three numbers F, B, W, got {list(t)!r}")
    out = tuple(float(x) for x in t)
    for name, x in zip("FBW", out):
        if not math.isfinite(x) or (positive and x <= 0):
            what = "a positive finite number" if positive else "a finite number"
            raise ParameterError(param, f"{name} must be {what}, got {x!r}")
    return out  # type: ignore[return-value]


@dataclass(frozen=True, init=False)
class Costs:
    """Op durations. ``F``, ``B``, ``W`` per rank (all its chunks); ``comm`` per cross-rank hop.

    ``rank_costs``: optional per-rank ``(F, B, W)`` overriding the uniform values
    (e.g. heavier first/last ranks that carry embedding and head).
    ``group_costs``: optional per-layer-group (stage) ``(F, B, W)``, taken as-is (no 1/v).
    ``stage_costs=``: the old keyword for ``rank_costs`` (deprecated, warns).
    """

    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    comm: float = 0.0
    rank_costs: tuple[Triple, ...] | None = None
    group_costs: tuple[Triple, ...] | None = None

    def __init__(self, F: float = 1.0, B: float = 1.0, W: float = 1.0, comm: float = 0.0,
                 rank_costs: Sequence[Sequence[float]] | None = None,
                 group_costs: Sequence[Sequence[float]] | None = None, *,
                 stage_costs: Sequence[Sequence[float]] | None = None) -> None:
        if stage_costs is not None:
            warnings.warn("Costs(stage_costs=...) is deprecated; call it rank_costs (one (F, B, W) per rank)",
                          DeprecationWarning, stacklevel=2)
            if rank_costs is not None:
                raise ParameterError("rank_costs", "given twice: as rank_costs and as its old name stage_costs")
            rank_costs = stage_costs
        for name, val in (("F", F), ("B", B), ("W", W), ("comm", comm),
                          ("rank_costs", rank_costs), ("group_costs", group_costs)):
            object.__setattr__(self, name, val)
        self.__post_init__()

    def __post_init__(self) -> None:
        _check_triple("costs", (self.F, self.B, self.W), positive=True)
        if not math.isfinite(self.comm) or self.comm < 0:
            raise ParameterError("costs", f"comm must be a finite number >= 0, got {self.comm!r}")
        if self.rank_costs is not None:
            object.__setattr__(
                self,
                "rank_costs",
                tuple(_check_triple("rank_costs", t, True) for t in self.rank_costs),
            )
        if self.group_costs is not None:
            object.__setattr__(
                self,
                "group_costs",
                tuple(_check_triple("group_costs", t, True) for t in self.group_costs),
            )

    @property
    def stage_costs(self) -> tuple[Triple, ...] | None:
        """Deprecated name of :attr:`rank_costs` (warns)."""
        warnings.warn("Costs.stage_costs is deprecated; use Costs.rank_costs", DeprecationWarning, stacklevel=2)
        return self.rank_costs

    def check_fits(self, placement: Placement) -> None:
        if self.rank_costs is not None and len(self.rank_costs) != placement.num_ranks:
            raise ParameterError(
                "rank_costs",
                f"gives {len(self.rank_costs)} ranks' costs but the schedule has {placement.num_ranks} ranks",
            )
        if self.group_costs is not None and len(self.group_costs) != placement.num_stages:
            raise ParameterError(
                "group_costs",
                f"gives {len(self.group_costs)} layer groups but the schedule has {placement.num_stages}",
            )

    def chunk_costs(self, placement: Placement, stage: int) -> Triple:
        """``(F, B, W)`` of one layer group on its rank."""
        if self.group_costs is not None:
            return self.group_costs[stage]
        r = placement.rank_of(stage)
        n = placement.chunks_on(r)
        f, b, w = self.rank_costs[r] if self.rank_costs is not None else (self.F, self.B, self.W)
        return (f / n, b / n, w / n)

    def duration_table(self, placement: Placement) -> list[dict[OpKind, float]]:
        """Per layer group, the duration of each compute op kind."""
        self.check_fits(placement)
        out = []
        for s in range(placement.num_stages):
            f, b, w = self.chunk_costs(placement, s)
            out.append({OpKind.F: f, OpKind.B: b, OpKind.W: w, OpKind.BW: b + w})
        return out

    def rank_compute(self, placement: Placement, m: int) -> list[float]:
        """Total compute time of each rank for ``m`` microbatches."""
        tot = [0.0] * placement.num_ranks
        for s in range(placement.num_stages):
            tot[placement.rank_of(s)] += m * sum(self.chunk_costs(placement, s))
        return tot


@dataclass(frozen=True)
class MemoryDeltas:
    """Activation memory change of each op kind, per rank (all its chunks; units or bytes).

    Defaults are the papers' unit accounting: F +1, B 0, W −1 (BW = B + W = −1).
    ``group_deltas`` optionally gives per-layer-group ``(F, B, W)`` taken as-is.
    """

    F: float = 1.0
    B: float = 0.0
    W: float = -1.0
    group_deltas: tuple[Triple, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        _check_triple("memory", (self.F, self.B, self.W), positive=False)
        if self.F < 0:
            raise ParameterError("memory", f"F must be >= 0 (a forward keeps activations), got {self.F}")
        if abs(self.F + self.B + self.W) > 1e-9 * max(1.0, abs(self.F)):
            raise ParameterError(
                "memory",
                f"F + B + W must be 0 (what F keeps, B and W free), got {self.F}+{self.B}+{self.W}",
            )

    def chunk_deltas(self, placement: Placement, stage: int) -> Triple:
        if self.group_deltas is not None:
            return self.group_deltas[stage]
        n = placement.chunks_on(placement.rank_of(stage))
        return (self.F / n, self.B / n, self.W / n)

    def delta_table(self, placement: Placement) -> list[dict[OpKind, float]]:
        out = []
        for s in range(placement.num_stages):
            f, b, w = self.chunk_deltas(placement, s)
            out.append({OpKind.F: f, OpKind.B: b, OpKind.W: w, OpKind.BW: b + w})
        return out


def parse_kv(text: str, param: str, allowed: Sequence[str]) -> dict[str, float]:
    """Parse ``"F=1,B=2,W=0.5"``; unknown keys or bad numbers raise ParameterError."""
    out: dict[str, float] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in part:
            raise ParameterError(param, f"expected KEY=VALUE pairs with keys {', '.join(allowed)}, got {part!r}")
        k, val = (x.strip() for x in part.split("=", 1))
        match = {a.lower(): a for a in allowed}.get(k.lower())
        if match is None:
            raise ParameterError(param, f"unknown key {k!r}; valid keys are {', '.join(allowed)}")
        try:
            out[match] = float(val)
        except ValueError:
            raise ParameterError(param, f"{k} must be a number, got {val!r}") from None
    return out


def parse_costs(text: str | None, rank_costs: Mapping | Sequence | None = None, *,
                stage_costs: Mapping | Sequence | None = None) -> Costs:
    """:class:`Costs` from ``"F=1,B=1,W=1,comm=0"`` and optional per-rank or per-layer-group
    overrides (:func:`load_rank_costs`'s JSON). Errors name ``costs``, ``rank_costs``
    or ``group_costs``. ``stage_costs=`` is the old keyword for ``rank_costs`` (deprecated)."""
    if stage_costs is not None:
        warnings.warn("parse_costs(stage_costs=...) is deprecated; call it rank_costs", DeprecationWarning,
                      stacklevel=2)
        rank_costs = stage_costs if rank_costs is None else rank_costs
    vals = parse_kv(text or "", "costs", ["F", "B", "W", "comm"])
    kwargs: dict = dict(vals)
    if rank_costs is not None:
        kwargs.update(_parse_rank_costs(rank_costs))
    return Costs(**kwargs)


def parse_memory(text: str | None) -> MemoryDeltas:
    """:class:`MemoryDeltas` from ``"F=1,B=0,W=-1"`` (W defaults to what F and B leave).
    Errors name ``memory``."""
    vals = parse_kv(text or "", "memory", ["F", "B", "W"])
    if vals and "W" not in vals:
        # Let users give F and B only: W frees the rest.
        vals["W"] = -(vals.get("F", 1.0) + vals.get("B", 0.0))
    return MemoryDeltas(**vals)


def _triples(rows: object, param: str) -> tuple[Triple, ...]:
    if not isinstance(rows, list) or not rows:
        raise ParameterError(param, "expected a non-empty list of {F, B, W} objects or [F, B, W] lists")
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            try:
                out.append((float(row["F"]), float(row["B"]), float(row["W"])))
            except (KeyError, TypeError, ValueError):
                raise ParameterError(param, f"entry {i} needs numeric F, B and W, got {row!r}") from None
        elif isinstance(row, (list, tuple)) and len(row) == 3:
            out.append(tuple(float(x) for x in row))  # type: ignore[arg-type]
        else:
            raise ParameterError(param, f"entry {i} must be {{F, B, W}} or [F, B, W], got {row!r}")
    return tuple(out)


def _parse_rank_costs(data: Mapping | Sequence) -> dict:
    """``[{F,B,W}, …]`` per rank, or ``{"ranks": […]}`` / ``{"layer_groups": […]}``
    (``{"stages": […]}``, the old key for ``ranks``, still read with a DeprecationWarning)."""
    if isinstance(data, Mapping):
        if "layer_groups" in data:
            return {"group_costs": _triples(data["layer_groups"], "rank_costs")}
        if "stages" in data and "ranks" not in data:
            warnings.warn("a rank-costs file's 'stages' key is deprecated; call it 'ranks'", DeprecationWarning,
                          stacklevel=3)
            return {"rank_costs": _triples(data["stages"], "rank_costs")}
        if "ranks" in data:
            return {"rank_costs": _triples(data["ranks"], "rank_costs")}
        raise ParameterError("rank_costs", "a JSON object needs a 'ranks' or 'layer_groups' list")
    return {"rank_costs": _triples(list(data), "rank_costs")}


def load_rank_costs(path: str | Path) -> Mapping | Sequence:
    """The JSON of a rank-costs file (for :func:`parse_costs`); errors name ``rank_costs``."""
    text = read_input(path, "rank_costs")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ParameterError("rank_costs", f"{Path(path)} is not valid JSON: {e}") from None


def load_stage_costs(path: str | Path) -> Mapping | Sequence:
    """Deprecated name of :func:`load_rank_costs` (warns)."""
    warnings.warn("load_stage_costs is deprecated; use load_rank_costs", DeprecationWarning, stacklevel=2)
    return load_rank_costs(path)
