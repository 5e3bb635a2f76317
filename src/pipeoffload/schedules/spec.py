"""ScheduleSpec: the parameters a generator receives, with shared checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..costs import Costs, MemoryDeltas
from ..errors import ParameterError, require


@dataclass
class ScheduleSpec:
    """What to generate. ``v``/``g`` default per schedule when None.

    ``costs``/``memory`` are used by generators that plan with them (zb-auto, zb-v)
    and ignored by fixed-order ones. ``mem_limit`` is in the units of ``memory``.
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
        for attr, flag in (("p", "-p"), ("m", "-m")):
            val = getattr(self, attr)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ParameterError(flag, f"must be an integer >= 1, got {val!r}")
        if self.v is not None and (not isinstance(self.v, int) or self.v < 1):
            raise ParameterError("-v", f"must be an integer >= 1, got {self.v!r}")
        if self.g is not None and (not isinstance(self.g, int) or self.g < 1):
            raise ParameterError("-g", f"must be an integer >= 1, got {self.g!r}")

    def chunks(self, default: int, allowed: tuple[int, ...] | None = None) -> int:
        v = self.v if self.v is not None else default
        if allowed is not None and v not in allowed:
            raise ParameterError(
                "-v", f"schedule {self.name} needs v in {{{', '.join(map(str, allowed))}}}, got {v}"
            )
        return v

    def need_m_at_least(self, minimum: int, why: str) -> None:
        require(self.m >= minimum, "-m", f"schedule {self.name} needs m >= {minimum} ({why}), got {self.m}")

    def no_group(self) -> None:
        if self.g is not None:
            raise ParameterError("-g", f"schedule {self.name} has no group size; -g applies to group-interleaved")
