"""The best schedule for a memory budget (pipeoffload.studies.best, `pipeoffload best`)."""

from __future__ import annotations

import json

import pytest

from helpers import assert_imports_no_torch
from pipeoffload.cli import main
from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate
from pipeoffload.studies.best import Setting, evaluate, search, settings


def test_best_fits_and_no_fitting_setting_is_better():
    costs = Costs(F=1, B=2, W=1, comm=0.1)
    res = search(4, 8, costs=costs, mem_limit=3, offload=False, max_v=3)
    best = res.best
    assert best is not None and best.fits and best.peak <= 3 + 1e-9
    fitting = [e for e in res.entries if e.fits]
    assert all(best.bubble_rate <= e.bubble_rate + 1e-12 for e in fitting)
    # Independently: every generated schedule that fits has no lower bubble.
    tl = simulate(generate(best.setting.schedule, p=4, m=8, costs=costs, **best.setting.kwargs()), costs)
    assert tl.bubble_rate == pytest.approx(best.bubble_rate)
    for name in ("zb-h1", "1f1b", "v-half", "v-min"):
        t = simulate(generate(name, p=4, m=8, costs=costs), costs)
        if max(t.peak_memory()) <= 3:
            assert best.bubble_rate <= t.bubble_rate + 1e-12


def test_offload_makes_more_settings_fit():
    without = search(4, 8, mem_limit=1.5, offload=False, max_v=2)
    with_off = search(4, 8, mem_limit=1.5, offload_time=0.0, max_v=2)
    assert sum(e.fits for e in with_off.entries) > sum(e.fits for e in without.entries)
    assert with_off.best.bubble_rate <= without.best.bubble_rate
    off = [e for e in with_off.entries if e.fits and e.offload]
    assert off and all(e.peak <= 1.5 + 1e-9 < e.peak_no_offload for e in off)


def test_settings_cover_every_family_v_and_g():
    names = {s.schedule for s in settings(6, 12, 6, MemoryDeltas(), max_v=3)}
    from pipeoffload.schedules import SCHEDULES

    assert names == set(SCHEDULES)
    gis = {(s.v, s.g) for s in settings(6, 12, 6, MemoryDeltas(), max_v=3) if s.schedule == "group-interleaved"}
    assert gis == {(v, g) for v in (2, 3) for g in (3, 4, 5, 6)}


def test_a_refusing_setting_carries_its_reason():
    e = evaluate(Setting("interleaved-1f1b", v=2), 4, 2, Costs(), MemoryDeltas(), 4)
    assert e.error and not e.fits and "m" in e.error


def test_bad_input_names_the_parameter():
    with pytest.raises(ParameterError) as ei:
        search(0, 4)
    assert ei.value.param == "p"
    with pytest.raises(ParameterError) as ei:
        search(4, 4, max_v=0)
    assert ei.value.param == "max_v"


def test_cli_best_json_and_text(capsys):
    assert main(["best", "-p", "4", "-m", "8", "--mem-limit", "2", "--max-v", "2", "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["fits"] and out["best"]["peak_memory"] <= 2 and len(out["entries"]) == 3
    assert main(["best", "-p", "4", "-m", "8", "--mem-limit", "2", "--max-v", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("best: p=4 m=8") and "setting" in text
    assert main(["best", "-p", "4", "--max-v", "0"]) == 2
    assert "--max-v" in capsys.readouterr().err


def test_best_imports_no_torch():
    assert_imports_no_torch("pipeoffload.studies.best", "pipeoffload.commands.best")
