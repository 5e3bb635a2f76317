"""ScheduleSpec: the parameters a generator receives, with shared checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError, require


@dataclass
class ScheduleSpec:
    """What to generate, in the papers' letters: ``p`` ranks, ``m`` microbatches, ``v``
    chunks (layer groups) per rank, ``g`` the group size of group-interleaved.
    ``v``/``g`` default per schedule when None.

    ``costs``/``memory`` are used by generators that plan with them (zb-auto, zb-v)
    and ignored by fixed-order ones; None means the defaults (unit costs, one unit of
    memory per chunk). ``mem_limit`` is in the units of ``memory``.
    Errors are :class:`~pipeoffload.errors.ParameterError` naming these fields.
    """

    name: str
    p: int
    m: int
    v: int | None = None
    g: int | None = None
    mem_limit: float | None = None
    costs: Costs = field(default_factory=Costs)
    memory: MemoryDeltas = field(default_factory=MemoryDeltas)

    def __post_init__(self) -> None:
        if self.costs is None:  # an explicit None is the default, as for every optional argument
            self.costs = Costs()
        if self.memory is None:
            self.memory = MemoryDeltas()
        for name, want in (("costs", Costs), ("memory", MemoryDeltas)):
            got = getattr(self, name)
            if not isinstance(got, want):
                raise ParameterError(name, f"must be a pipeoffload.costs.{want.__name__} (or None for the "
                                           f"defaults), got {type(got).__name__}")
        for param in ("p", "m"):
            val = getattr(self, param)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ParameterError(param, f"must be an integer >= 1, got {val!r}")
        for param in ("v", "g"):
            val = getattr(self, param)
            if val is not None and (not isinstance(val, int) or val < 1):
                raise ParameterError(param, f"must be an integer >= 1, got {val!r}")

    def resolve_v(self, default: int, allowed: tuple[int, ...] | None = None) -> int:
        """``v``, or the schedule's ``default`` when None; one of ``allowed`` when given."""
        v = self.v if self.v is not None else default
        if allowed is not None and v not in allowed:
            raise ParameterError(
                "v", f"schedule {self.name} needs v in {{{', '.join(map(str, allowed))}}}, got {v}"
            )
        return v

    def need_m_at_least(self, minimum: int, why: str) -> None:
        require(self.m >= minimum, "m", f"schedule {self.name} needs m >= {minimum} ({why}), got {self.m}")

    def no_group(self) -> None:
        """Refuse ``g``: only group-interleaved has a group size."""
        if self.g is not None:
            raise ParameterError("g", f"schedule {self.name} has no group size; `g` applies to group-interleaved")
