"""Which per-op loops run: the C ones of :mod:`pipeoffload._engine` or their Python twins.

``PIPEOFFLOAD_ENGINE``: ``auto`` (default: C when built), ``c`` (C, or an error saying it is not
built) or ``python``. Both give the same results (tests/test_engine_c.py,
tests/test_engine_c_loops.py). Read once, when a loop first asks (:func:`c_engine`), so that a bad
value is reported where the command reports its errors, not at import. Imports nothing of the
package but its errors: every module may ask.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any

from .errors import ParameterError

__all__ = ["c_engine"]


def _load_engine() -> Any:
    """The engine's C loops (:mod:`pipeoffload._engine`), or None for the Python ones.

    ``PIPEOFFLOAD_ENGINE``: ``auto`` (default: C when built), ``c`` (C, or an error saying
    it is not built) or ``python``. Both give the same floats (tests/test_engine_c.py)."""
    choice = os.environ.get("PIPEOFFLOAD_ENGINE", "auto").strip().lower() or "auto"
    if choice not in ("auto", "c", "python"):
        raise ParameterError("PIPEOFFLOAD_ENGINE", f"must be auto, c or python, got {choice!r}")
    if choice == "python":
        return None
    try:
        engine = import_module("pipeoffload._engine")
    except ImportError:
        if choice == "c":
            raise ParameterError("PIPEOFFLOAD_ENGINE", "is c, but the C engine (pipeoffload._engine) is not built: "
                                 "reinstall with a C compiler (pip install -e .), or set it to auto or python") from None
        return None
    return engine


_UNSET: Any = object()
_engine: Any = _UNSET  #: :func:`_load_engine`'s answer, once a timing has asked (:func:`c_engine`)


def c_engine() -> Any:
    """The C loops' module or None, chosen when first asked (a bad ``PIPEOFFLOAD_ENGINE`` is then
    reported where the command reports its errors, not at import)."""
    global _engine
    if _engine is _UNSET:
        _engine = _load_engine()
    return _engine
