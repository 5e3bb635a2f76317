"""Error types. Every error a user can cause derives from :class:`PipeoffloadError`.

The CLI turns these into one line on stderr and exit status 2; library users can
catch them (they are also ``ValueError`` so generic handlers keep working).
"""

from __future__ import annotations


class PipeoffloadError(ValueError):
    """Base class for errors caused by input (parameters, files, schedules)."""


class ParameterError(PipeoffloadError):
    """A parameter is out of its valid range. ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(f"{param}: {message}")


class ScheduleError(PipeoffloadError):
    """A schedule breaks a rule (malformed, wrong placement, order, or deadlock)."""


def require(cond: bool, param: str, message: str) -> None:
    """Raise :class:`ParameterError` for ``param`` unless ``cond`` holds."""
    if not cond:
        raise ParameterError(param, message)
