"""The one recompute setting (docs/glossary.md): what a layer drops in F and recomputes in B.
Pure Python.

:class:`Recompute` is the single enum the cost model (:class:`~pipeoffload.costmodel.model.ModelSpec`),
the planner (:class:`~pipeoffload.planner.PlanOptions`, its configurations) and the training
configuration (``offload.recompute``) use. Each level recomputes what the one before it does and
more, so the order is also "most memory to least":

- ``none``: nothing is recomputed;
- ``elementwise``: the cheap memory-bound outputs (norms, the FFN activation, dropout masks);
  what PipeOffload's runtime does (``OffloadStore(recompute=True)``);
- ``selective``: those and the core attention's s×s tensors (Megatron's selective recompute);
- ``full``: only the layer's input is kept; B re-runs the whole forward.

At the boundaries (library arguments, configuration files, the command line) the older spellings
are accepted and normalised by :meth:`Recompute.of`: ``False`` is ``none``, ``True`` is
``elementwise``, and names in any letter case. Anything else is a
:class:`~pipeoffload.errors.ParameterError` naming the parameter and the valid values.

>>> Recompute.of(True)
<Recompute.ELEMENTWISE: 'elementwise'>
>>> Recompute.of("Full", "offload.recompute")
<Recompute.FULL: 'full'>
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from .errors import ParameterError

__all__ = ["Recompute", "RECOMPUTE_LEVELS"]


class Recompute(str, Enum):
    """A recompute level; a ``str`` (``Recompute.FULL == "full"``) whose truth value says
    whether anything is recomputed (``bool(Recompute.NONE)`` is False, as the old ``False`` was)."""

    NONE = "none"
    ELEMENTWISE = "elementwise"
    SELECTIVE = "selective"
    FULL = "full"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __bool__(self) -> bool:
        return self is not Recompute.NONE

    @property
    def elementwise(self) -> bool:
        """Whether the elementwise outputs are recomputed (every level but ``none``; ``full``
        recomputes them as part of the whole layer)."""
        return self is not Recompute.NONE

    @classmethod
    def of(cls, value: Any, param: str = "recompute") -> "Recompute":
        """``value`` as a :class:`Recompute`: a member, a name (any case) or a bool
        (``False`` = none, ``True`` = elementwise).

        Raises:
            ParameterError: naming ``param`` and the valid values, for anything else.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            return cls.ELEMENTWISE if value else cls.NONE
        if isinstance(value, str):
            for member in cls:
                if member.value == value.strip().lower():
                    return member
        raise ParameterError(param, f"must be one of {', '.join(m.value for m in cls)} "
                                    f"(or true = elementwise, false = none), got {value!r}")


#: Every level, from most memory to least.
RECOMPUTE_LEVELS: tuple[Recompute, ...] = tuple(Recompute)
