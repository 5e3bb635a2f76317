"""End-to-end CLI: verbs, JSON shape, one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeoffload.cli import main

from helpers import ALL_SCHEDULES, assert_imports_no_torch, import_torch


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeoffload", *args], capture_output=True, text=True)


def test_help_lists_verbs():
    r = run_cli("--help")
    assert r.returncode == 0
    for verb in ("schedules", "simulate"):
        assert verb in r.stdout


def test_a_named_verb_builds_its_parser_alone(monkeypatch, capsys):
    """The lazy path fires (only the named verb's module is asked for) and parses as the full parser."""
    import importlib

    from pipeoffload import cli

    asked: list[str] = []
    real = importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: asked.append(name) or real(name))
    assert main(["schedules", "--json"]) == 0
    assert asked == ["pipeoffload.commands.schedules"]
    capsys.readouterr()
    for argv in (["plan", "--model", "98.5B", "--gpus", "64", "--json"], ["simulate", "zb-auto", "-p", "4", "-m", "8"],
                 ["scale", "--model", "14.6B"], ["schedules"]):
        assert cli.build_parser([argv[0]]).parse_args(argv) == cli.build_parser().parse_args(argv)
    asked.clear()
    with pytest.raises(SystemExit):  # an option before the verb: every verb, as before
        main(["--version", "plan"])
    assert len(asked) == len(cli.VERBS)


def test_schedules_lists_registry(capsys):
    assert main(["schedules"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ALL_SCHEDULES)
    assert main(["schedules", "--json"]) == 0
    assert {d["name"] for d in json.loads(capsys.readouterr().out)} == set(ALL_SCHEDULES)


def test_simulate_json(capsys):
    assert main(["simulate", "1f1b", "-p", "4", "-m", "8", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["schedule"] == "1f1b" and obj["stages"] == 4 and obj["microbatches"] == 8 and obj["chunks"] == 1
    assert obj["makespan"] == 33 and obj["bubble_rate"] == pytest.approx(9 / 33)
    assert obj["peak_memory"] == [4, 3, 2, 1]


def test_simulate_ops_and_rank_costs(tmp_path, capsys):
    f = tmp_path / "stages.json"
    f.write_text(json.dumps([{"F": 1, "B": 1, "W": 1}] * 3 + [{"F": 2, "B": 2, "W": 2}]))
    assert main(["simulate", "1f1b", "-p", "4", "-m", "4", "--rank-costs", str(f), "--json", "--ops"]) == 0
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
        (["simulate", "1f1b", "--rank-costs", "/nonexistent.json"], "--rank-costs: file not found"),
        (["simulate", "1f1b", "-p", "4", "--rank-costs", "BAD"], "--rank-costs"),
        (["simulate", "1f1b", "-p", "x"], "argument -p/--ranks: invalid int value"),
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


# --- an offload request that places nothing says why ------------------------------------------


@pytest.mark.parametrize("args, reason, helps", [
    (["1f1b", "-p", "8", "-m", "32", "--offload-chunks", "1", "--offload-time", "50"],
     "256 short_lifespan", "a shorter transfer (--offload-time)"),
    (["1f1b", "-p", "8", "-m", "32", "--offload", "auto", "--offload-time", "50"],
     "--offload auto placed no transfer", "--offload-tolerance"),
])
def test_an_offload_that_places_nothing_warns_in_one_line(args, reason, helps, capsys):
    assert main(["simulate", *args, "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["offload"]["transfers"] == 0
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeoffload simulate: warning: "), cap.err
    assert reason in lines[0] and helps in lines[0], cap.err


@pytest.mark.parametrize("args", [
    ["1f1b", "-p", "8", "-m", "32", "--offload-chunks", "1", "--offload-time", "0.5"],  # some transfers
    ["1f1b", "-p", "8", "-m", "32", "--offload-chunks", "0"],  # nothing asked for
    ["1f1b", "-p", "8", "-m", "32"],  # no offload
])
def test_no_warning_when_offload_places_transfers_or_none_was_asked(args, capsys):
    assert main(["simulate", *args]) == 0
    assert capsys.readouterr().err == ""


def test_train_warns_before_spawning_when_nothing_would_be_offloaded(capsys):
    from pipeoffload.commands.train import _warn_if_nothing_offloaded
    from pipeoffload.training.config import TrainConfig

    cfg = TrainConfig.load(None, {"schedule.name": "1f1b", "offload.offload_chunks": 1, "offload.offload_time": 50.0})
    _warn_if_nothing_offloaded(cfg, cfg.check())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pipeoffload train: warning: offloading chunk 0"), err
    assert "short_lifespan" in err[0]
    cfg = TrainConfig()  # the default run offloads (auto, free transfers)
    _warn_if_nothing_offloaded(cfg, cfg.check())
    assert capsys.readouterr().err == ""


# --- library parameters, command-line flags ------------------------------------------------------


@pytest.mark.parametrize("param, flag", [
    ("offload_chunks", "--offload-chunks"), ("offload_time", "--offload-time"), ("link_group", "--link-group"),
    ("solo_factor", "--solo-factor"), ("tolerance", "--offload-tolerance"), ("on_infeasible", "--offload-infeasible"),
    ("transfer_times", "--transfer-times"), ("mem_limit", "--mem-limit"), ("comm", "comm"),
])
def test_a_library_parameter_prints_as_its_flag(param, flag, monkeypatch, capsys):
    """Whatever layer raises it, the CLI names the flag (and the flags the message mentions);
    a parameter the table does not know prints as it is."""
    from pipeoffload.errors import ParameterError
    from pipeoffload.passes import offload

    def refuse(*args, **kwargs):
        raise ParameterError(param, "too much; lower `offload_chunks` or `offload_time`")

    monkeypatch.setattr(offload, "plan_offload", refuse)
    assert main(["simulate", "1f1b", "--offload-chunks", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"pipeoffload simulate: error: {flag}: too much; lower --offload-chunks or --offload-time\n"


def test_library_errors_name_library_parameters():
    """A Python caller reads the library's names, not the command line's."""
    from pipeoffload.costs import parse_costs
    from pipeoffload.errors import ParameterError
    from pipeoffload.training.config import TrainConfig
    from pipeoffload.schedules import generate

    with pytest.raises(ParameterError, match="^m: must be an integer >= 1"):
        generate("1f1b", p=4, m=0)
    with pytest.raises(ParameterError, match="^costs: F must be a positive"):
        parse_costs("F=0")
    with pytest.raises(ParameterError, match="^training.steps: must be >= 1"):
        TrainConfig.load(None, {"training.steps": 0}).check()
    with pytest.raises(ParameterError, match="^checkpoint.resume: needs `checkpoint.dir`"):
        TrainConfig.load(None, {"checkpoint.resume": True}).check()


def test_comma_separated_integers():
    from pipeoffload.commands.common import int_list
    from pipeoffload.errors import ParameterError

    assert int_list(" 2, 4,,8 ", "--ranks") == (2, 4, 8) and int_list("", "--chunks") == ()
    with pytest.raises(ParameterError, match="^--ranks: expected comma-separated integers, got '2,x'"):
        int_list("2,x", "--ranks")
    with pytest.raises(ParameterError, match="^--ranks: needs at least one value"):
        int_list(" , ", "--ranks", required=True)


# --- the front door: import pipeoffload ------------------------------------------------------------

#: Run after `import pipeoffload` in a fresh interpreter; neither may import torch.
FRONT_DOOR = """
import pipeoffload as po
sched = po.generate("group-interleaved", p=8, m=32, v=2, g=4)
tl = po.simulate(sched, po.Costs(F=1, B=1, W=1, comm=0), po.MemoryDeltas())
off = po.plan_offload(sched, offload_chunks=1, offload_time=0.25)
low = po.lower(sched, offload=po.OffloadOptions(offload_chunks=1), comm=True)
assert isinstance(sched, po.Schedule) and isinstance(tl, po.Timeline) and low.offload.offloaded_chunks == 1
assert issubclass(po.ParameterError, po.PipeoffloadError) and issubclass(po.ScheduleError, po.PipeoffloadError)
assert round(tl.bubble_rate, 4) == 0.0857 and off.peak[0] < off.peak_no_offload[0]
print(sorted(po.__all__))
"""


def test_import_pipeoffload_gives_the_api_without_torch():
    r = assert_imports_no_torch("pipeoffload", then=FRONT_DOOR)
    for name in ("generate", "simulate", "lower", "plan_offload", "OffloadOptions", "Costs", "MemoryDeltas",
                 "Schedule", "Timeline", "PipeoffloadError", "ParameterError", "ScheduleError",
                 "PipelineRunner", "launch", "OffloadStore"):
        assert repr(name) in r.stdout


def test_the_runtime_names_resolve_lazily():
    import_torch()
    import pipeoffload as po
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.launcher import launch
    from pipeoffload.runtime.offload_store import OffloadStore

    assert (po.PipelineRunner, po.launch, po.OffloadStore) == (PipelineRunner, launch, OffloadStore)
    assert {"PipelineRunner", "launch", "OffloadStore"} <= set(dir(po))
    with pytest.raises(AttributeError):
        po.no_such_name  # noqa: B018


def test_ranks_is_the_flag_and_stages_its_deprecated_spelling(capsys):
    assert main(["simulate", "1f1b", "--ranks", "3", "-m", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"] == 3  # --json keys stay as they were
    assert main(["simulate", "1f1b", "--stages", "3", "-m", "6", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["stages"] == 3
    assert "--stages is deprecated and will be removed; use --ranks (-p)" in out.err
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = capsys.readouterr().out
    assert "-p P, --ranks P" in help_text and "--stages" not in help_text


def test_plan_imports_no_torch():
    """``pipeoffload plan`` (the planner is pure Python) runs without importing torch: its
    start-up is the planner's own modules alone (docs/planner.md §4b)."""
    code = ("import sys\nfrom pipeoffload.cli import main\n"
            "assert main(['plan', '--model', '1.5B', '--gpus', '8', '--json']) == 0\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')), file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "[]"
