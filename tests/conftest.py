"""Shared test parametrization; the plain helpers live in helpers.py (importable by name,
also from the ranks that ``launch`` spawns).

A test that takes a ``schedule_name`` argument runs once per registry schedule
(``helpers.ALL_SCHEDULES``, ids = the names); tests that loop over the registry inside
one process or world iterate ``helpers.ALL_SCHEDULES`` itself.

Every multi-process test runs its point-to-point traffic under NCCL's rules, emulated
on gloo (``runtime/transport.py``: in-order streams, sends that wait for their
receive, matching by order, groups): a pipeline that would hang on NCCL hangs here and
fails with a timeout naming rank, op and peer. Spawned ranks and CLI subprocesses
inherit the setting; ``tests/test_transport.py`` and a plain-gloo case in
``tests/test_runtime.py`` cover torch's own transport. ``PIPEOFFLOAD_P2P=torch`` in the
environment runs the suite on plain gloo instead.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PIPEOFFLOAD_P2P", "nccl-rules")

from helpers import ALL_SCHEDULES


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "schedule_name" in metafunc.fixturenames:
        # An empty parameter set would be reported as one skip, not as the failure it is.
        assert ALL_SCHEDULES, "pipeoffload.schedules.SCHEDULES is empty"
        metafunc.parametrize("schedule_name", ALL_SCHEDULES, ids=ALL_SCHEDULES)
