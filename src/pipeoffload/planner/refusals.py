"""Why the planner rejected a candidate: the leaf types every planner module shares. Pure Python.

:class:`Refused` is raised inside the search when a candidate cannot be evaluated;
:class:`Rejection` is what a result reports per family (or split). They live apart from
the rendering in :mod:`pipeoffload.planner.report`, which reads whole results, so that
the modules a result is built from never import the module that prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..costmodel.hardware import GiB

__all__ = ["Rejection", "Refused"]


@dataclass
class Rejection:
    """Why a family (or a split) produced no configuration. ``kind``: "split", "oom", "m",
    "generator", "offload", "pruned" or "same" (the same schedule as another setting); ``over``:
    bytes above the budget for "oom"."""

    family: str
    kind: str
    reason: str
    over: float | None = None
    config: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "kind": self.kind, "reason": self.reason,
                "over_gib": None if self.over is None else self.over / GiB, "config": self.config}


class Refused(Exception):
    """A candidate that could not be evaluated (``kind`` as in :class:`Rejection`; ``config``
    names the candidate once known)."""

    def __init__(self, kind: str, reason: str, over: float | None = None, config: str | None = None) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.over, self.config = kind, reason, over, config

    def __reduce__(self) -> tuple:
        # pickled whole (a helper process sends refusals, :mod:`~.workers`): Exception's own
        # reduce would call ``Refused(reason)`` alone
        return (Refused, (self.kind, self.reason, self.over, self.config))

    def again(self) -> "Refused":
        """The same refusal as a new exception, to raise a kept one: raising the kept one itself
        would hang the raising frames on it (its ``__traceback__``), and with them whatever they
        hold."""
        return Refused(self.kind, self.reason, self.over, self.config)

    def naming(self, config: str) -> "Refused":
        """The same refusal, naming ``config``."""
        return Refused(self.kind, self.reason, self.over, config)
