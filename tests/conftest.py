"""Shared test parametrization; the plain helpers live in helpers.py (importable by name,
also from the ranks that ``launch`` spawns).

A test that takes a ``schedule_name`` argument runs once per registry schedule
(``helpers.ALL_SCHEDULES``, ids = the names); tests that loop over the registry inside
one process or world iterate ``helpers.ALL_SCHEDULES`` itself.
"""

from __future__ import annotations

import pytest

from helpers import ALL_SCHEDULES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "schedule_name" in metafunc.fixturenames:
        # An empty parameter set would be reported as one skip, not as the failure it is.
        assert ALL_SCHEDULES, "pipeoffload.schedules.SCHEDULES is empty"
        metafunc.parametrize("schedule_name", ALL_SCHEDULES, ids=ALL_SCHEDULES)
