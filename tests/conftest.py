"""Shared test parametrization; the plain helpers live in helpers.py (importable by name,
also from the ranks that ``launch`` spawns).

A test that takes a ``schedule_name`` argument runs once per registry schedule
(``helpers.ALL_SCHEDULES``, ids = the names); tests that loop over the registry inside
one process or world iterate ``helpers.ALL_SCHEDULES`` itself. Where running every
schedule is not the check itself, a test iterates ``helpers.REPRESENTATIVES`` (one
schedule per class of ``helpers.SCHEDULE_CLASSES``; ``tests/test_schedule_classes.py``
checks that every registry schedule falls in a declared class).

Every multi-process test runs its point-to-point traffic under NCCL's rules, emulated
on gloo (``runtime/transport.py``: in-order streams, sends that wait for their
receive, matching by order, groups): a pipeline that would hang on NCCL hangs here and
fails with a timeout naming rank, op and peer. Spawned ranks and CLI subprocesses
inherit the setting; ``tests/test_transport.py`` and a plain-gloo case in
``tests/test_runtime.py`` cover torch's own transport. ``PIPEOFFLOAD_P2P=torch`` in the
environment runs the suite on plain gloo instead.

Parallel runs (``make test`` runs ``pytest -n 2 --dist loadscope``, each module whole on one worker;
the groups below are for ``--dist loadgroup``, whose marks pytest 9 with xdist 3.8 does not apply): every module
with a multi-process test goes to one group, ``worlds``, so one worker runs the spawned worlds one
after another (a world of four ranks already fills the machine's two cores, and the timeout tests
need their peers scheduled) while the other workers run the single-process modules, each module
whole on one worker (its module-scoped fixtures are built once).

Hypothesis: the ``ci`` profile (few examples, no deadline) is the default; ``thorough``
(many more) is selected by ``-m bench`` (``make bench``) or ``HYPOTHESIS_PROFILE=thorough``.
Tests give no example counts of their own; a property that is costly per example scales
the profile's count with ``helpers.examples(fraction)``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("PIPEOFFLOAD_P2P", "nccl-rules")

from helpers import ALL_SCHEDULES  # noqa: E402

_QUIET = [HealthCheck.too_slow, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=20, deadline=None, suppress_health_check=_QUIET, print_blob=True)
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=_QUIET,
                          print_blob=True)


def pytest_configure(config: pytest.Config) -> None:
    # Before the test modules are imported: their @settings read the loaded profile.
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if not name:
        markexpr = (config.getoption("markexpr", "") or "").replace(" ", "")
        name = "thorough" if "bench" in markexpr and "notbench" not in markexpr else "ci"
    settings.load_profile(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "schedule_name" in metafunc.fixturenames:
        # An empty parameter set would be reported as one skip, not as the failure it is.
        assert ALL_SCHEDULES, "pipeoffload.schedules.SCHEDULES is empty"
        metafunc.parametrize("schedule_name", ALL_SCHEDULES, ids=ALL_SCHEDULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The xdist groups of the module docstring; without xdist the marks are inert.
    worlds = {item.module.__name__ for item in items
              if item.get_closest_marker("multiproc") is not None and getattr(item, "module", None) is not None}
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__ if module is not None else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group("worlds" if name in worlds else name))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # helpers.missing: a dependency CI must have is not installed. Fail (before any
    # fixture runs), or skip where PIPEOFFLOAD_ALLOW_MISSING=1 says that is wanted.
    mark = item.get_closest_marker("requires")
    if mark is not None:
        if os.environ.get("PIPEOFFLOAD_ALLOW_MISSING") == "1":
            pytest.skip(mark.args[0])
        pytest.fail(mark.args[0], pytrace=False)


@pytest.fixture(autouse=True)
def _planner_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan()``'s default here is the search alone (as where one CPU is free): the planner tests
    spy on the search's own calls and counters, which a helper process's share would hide.
    ``tests/test_plan_workers.py`` runs the helpers by asking for them (``workers=2``) and tests
    the default itself; ``pipeoffload plan`` in a subprocess keeps the real default."""
    from pipeoffload.planner import workers

    monkeypatch.setattr(workers, "_cpus", lambda: 1)
