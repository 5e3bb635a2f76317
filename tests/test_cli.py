"""End-to-end CLI: verbs, JSON shape, one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeoffload.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", *args], capture_output=True, text=True)


def test_help_lists_verbs():
    r = run_cli("--help")
    assert r.returncode == 0
    for verb in ("schedules", "simulate"):
        assert verb in r.stdout


def test_schedules_lists_registry(capsys):
    from pipeoffload.schedules import SCHEDULES

    assert main(["schedules"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SCHEDULES)
    assert main(["schedules", "--json"]) == 0
    assert {d["name"] for d in json.loads(capsys.readouterr().out)} == set(SCHEDULES)


def test_simulate_json(capsys):
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["schedule"] == "1f1b" and obj["stages"] == 4 and obj["microbatches"] == 8 and obj["chunks"] == 1
    assert obj["makespan"] == 33 and obj["bubble_rate"] == pytest.approx(9 / 33)
    assert obj["peak_memory"] == [4, 3, 2, 1]


def test_simulate_ops_and_stage_costs(tmp_path, capsys):
    f = tmp_path / "stages.json"
    f.write_text(json.dumps([{"F": 1, "B": 1, "W": 1}] * 3 + [{"F": 2, "B": 2, "W": 2}]))
    assert main(["simulate", "1f1b", "-p", "4", "-m", "4", "--stage-costs", str(f), "--json", "--ops"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["busy"] == [12, 12, 12, 24]
    assert len(obj["ops"]) == 4 * 4 * 2 and len(obj["memory_curves"]) == 4


def test_simulate_text_report(capsys):
    assert main(["simulate", "group-interleaved", "-p", "8", "-m", "32", "-v", "4", "-g", "4"]) == 0
    out = capsys.readouterr().out
    assert "bubble rate 0.06" in out and "peak memory" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["simulate", "nope"], "schedule: unknown schedule 'nope'"),
        (["simulate", "1f1b", "-m", "0"], "-m: must be an integer >= 1"),
        (["simulate", "group-interleaved", "-p", "8", "-g", "2"], "-g: group size must satisfy"),
        (["simulate", "1f1b", "--costs", "F=0"], "--costs: F must be a positive"),
        (["simulate", "1f1b", "--costs", "F=abc"], "--costs: F must be a number"),
        (["simulate", "1f1b", "--stage-costs", "/nonexistent.json"], "--stage-costs: file not found"),
        (["simulate", "1f1b", "-p", "4", "--stage-costs", "BAD"], "--stage-costs"),
        (["simulate", "1f1b", "-p", "x"], "argument -p/--stages: invalid int value"),
    ],
)
def test_errors_are_one_line_exit_2(args, needle):
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_simulate_with_cost_model(capsys):
    from pipeoffload.costmodel.model import pipeline_costs
    from pipeoffload.costmodel.hardware import get_hardware
    from pipeoffload.costmodel.presets import get_model

    args = ["simulate", "1f1b", "-p", "4", "-m", "8", "--model", "6.2B", "--hardware", "a100-80g", "--json"]
    assert main(args) == 0
    obj = json.loads(capsys.readouterr().out)
    pc = pipeline_costs(get_model("6.2B"), get_hardware("a100-80g"), 4, 1)
    assert obj["memory_unit"] == "bytes"
    # 1F1B: rank 0 holds p microbatches of its layer group's saved activations.
    assert obj["peak_memory"][0] == pytest.approx(4 * pc.groups[0].saved_bytes)
    # Offload with transfer times from the hardware's host link.
    assert main(args + ["--offload-chunks", "1", "--offload-infeasible", "skip"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["offload"]["transfer_times"] == pytest.approx([g.offload_ms for g in pc.groups])
    assert max(off["peak_memory"]) <= max(off["peak_memory_no_offload"])
