"""Speed at the scale of the largest jobs (issue 24), under ``-m bench`` only: every
registry family at p = 64, m = 512 in <= 2 s, and 1F1B, ZB-V and V-Half at p = 128,
m = 4096 in <= 10 s within 1 GiB, each a whole ``pipeoffload simulate NAME -p P -m M
--json`` process (benchmarks/bench_schedules.py prints the same runs as a table).

The seconds checked are the child's CPU seconds (user + system): on a quiet machine they
are its wall time, and on a shared one they are not inflated by other people's jobs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_schedules as bs  # noqa: E402

from pipeoffload.schedules import names  # noqa: E402


@pytest.mark.bench
@pytest.mark.parametrize("name", names())
def test_every_family_at_64_ranks_and_512_microbatches_within_2_s(name):
    run = bs.run_one(name, 64, 512)
    assert run.rc == 0
    assert run.cpu_s <= bs.TARGETS[(64, 512)][0], f"{name}: {run.cpu_s:.2f} s CPU ({run.wall_s:.2f} s wall)"


@pytest.mark.bench
@pytest.mark.parametrize("name", bs.LARGE)
def test_large_families_at_128_ranks_and_4096_microbatches_within_10_s_and_1_gib(name):
    run = bs.run_one(name, 128, 4096)
    secs, mib = bs.TARGETS[(128, 4096)]
    assert run.rc == 0
    assert run.cpu_s <= secs, f"{name}: {run.cpu_s:.2f} s CPU ({run.wall_s:.2f} s wall)"
    assert run.rss_mib <= mib, f"{name}: peak RSS {run.rss_mib:.0f} MiB"
