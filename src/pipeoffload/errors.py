"""Error types. Every error a user can cause derives from :class:`PipeoffloadError`.

The CLI turns these into one line on stderr and exit status 2; library users can
catch them (they are also ``ValueError`` so generic handlers keep working).

A :class:`ParameterError` names the parameter as the code that raised it knows it:
a function's argument (``p``, ``mem_limit``, ``offload_chunks``), a field of the
value being built (``costs``, ``memory``) or a key of a configuration file
(``offload.offload_chunks``, ``model.layers``) — never a command-line flag. The command line
maps those names to its flags (``pipeoffload.commands.common.CLI_FLAGS``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping


class PipeoffloadError(ValueError):
    """Base class for errors caused by input (parameters, files, schedules)."""


#: A parameter named inside a message, in backquotes, perhaps with a value:
#: `` `mem_limit` ``, `` `on_infeasible`="skip" ``.
_MENTION = re.compile(r"""`([A-Za-z_][A-Za-z0-9_.]*)`(?:=("[^"]*"|'[^']*'|[^\s,;)]+))?""")


class ParameterError(PipeoffloadError):
    """A parameter is out of its valid range.

    ``param`` names it; ``message`` says what is wrong and what would be valid. A
    message may name other parameters in backquotes, with a value if it advises one
    (``"needs `checkpoint.dir`"``, ``"use `on_infeasible`=\"skip\""``), so that a front
    end with its own names for them can rename those too (:meth:`render`). ``source``:
    set when ``param`` is a key read from that file (a front end shows such a key as it
    is: the fix is in the file). ``str(error)`` is ``"param: message"``.
    """

    def __init__(self, param: str, message: str, *, source: str | None = None) -> None:
        self.param = param
        self.message = message
        self.source = source
        super().__init__(f"{param}: {message}")

    def __reduce__(self):  # picklable with its fields (e.g. across processes)
        return (_rebuild, (self.param, self.message, self.source))

    def render(self, names: Mapping[str, str]) -> str:
        """``"param: message"`` with ``param`` and every backquoted parameter in the
        message renamed by ``names`` (unknown ones and file keys kept as they are)."""
        param = self.param if self.source is not None else names.get(self.param, self.param)
        return f"{param}: {rename_mentions(self.message, names)}"


def _rebuild(param: str, message: str, source: str | None) -> ParameterError:
    return ParameterError(param, message, source=source)


def rename_mentions(text: str, names: Mapping[str, str]) -> str:
    """``text`` with every backquoted parameter that ``names`` knows replaced by its new
    name, without the backquotes (`` `on_infeasible`="skip" `` becomes
    ``--offload-infeasible skip`` for a command line); others are left as they are."""

    def rename(found: re.Match) -> str:
        new = names.get(found.group(1))
        if new is None:
            return found.group(0)
        value = found.group(2)
        return new if value is None else f"{new} {value.strip(chr(34) + chr(39))}"

    return _MENTION.sub(rename, text)


class ScheduleError(PipeoffloadError):
    """A schedule breaks a rule (malformed, wrong placement, order, or deadlock)."""


def require(cond: bool, param: str, message: str) -> None:
    """Raise :class:`ParameterError` for ``param`` unless ``cond`` holds."""
    if not cond:
        raise ParameterError(param, message)


def read_input(path: str | Path, param: str, binary: bool = False) -> str | bytes:
    """The text (or bytes) of a file the user named through ``param``.

    Raises:
        ParameterError: naming ``param``, for a missing file or one that cannot be read.
    """
    p = Path(path)
    try:
        return p.read_bytes() if binary else p.read_text()
    except FileNotFoundError:
        raise ParameterError(param, f"file not found: {p}") from None
    except OSError as e:
        raise ParameterError(param, f"cannot read {p}: {e.strerror or e}") from None
