"""Every registry schedule belongs to a declared class (helpers.SCHEDULE_CLASSES), so the
tests that run one representative per class (``helpers.REPRESENTATIVES``) instead of the
whole registry cannot leave a new kind of schedule unsampled."""

from __future__ import annotations

import pytest

from pipeoffload.schedules import generate

from helpers import ALL_SCHEDULES, REPRESENTATIVES, SCHEDULE_CLASSES, schedule_class


@pytest.mark.parametrize("p", [2, 4])
def test_every_schedule_belongs_to_a_declared_class(schedule_name, p):
    cls = schedule_class(generate(schedule_name, p=p, m=2 * p))
    assert cls in SCHEDULE_CLASSES, (
        f"{schedule_name} (p={p}) is of class {cls}, which tests/helpers.py does not declare: add it to "
        "SCHEDULE_CLASSES with a representative, or the tests that sample by class never run its kind")


def test_each_representative_is_a_registry_schedule_of_its_class():
    assert len(set(REPRESENTATIVES)) == len(REPRESENTATIVES)
    for cls, name in SCHEDULE_CLASSES.items():
        assert name in ALL_SCHEDULES, name
        for p in (2, 4):
            assert schedule_class(generate(name, p=p, m=2 * p)) == cls, (name, p, cls)
