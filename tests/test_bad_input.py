"""Bad input: exit status 2 and one line naming the parameter (and, where there is a
list, the valid values) — never a traceback, never a process started first.

Most cases call :func:`pipeoffload.cli.main` in this process (every one of them fails
before any rank could start); the world-size case runs the real command with the
environment ``torchrun`` would set, and must fail before waiting on a rendezvous.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from pipeoffload.cli import main


@pytest.fixture
def files(tmp_path):
    """Bad files, by name (the ``{name}`` placeholders in CASES)."""
    texts = {
        "bad_csv": "0F0,0F1,0Q0\n1F0,1F1\n",  # not an action
        "split_csv": "0F0,0B0\n0F1,1F0\n",  # layer group 0 on two ranks
        "empty_csv": "",
        "syntax": "[training\nsteps = 3\n",
        "unknown": "[training]\nstepz = 3\n",
        "section": "[trainer]\nsteps = 3\n",
        "wrong_type": '[schedule]\nranks = "four"\n',
        "wrong_type_old_key": '[schedule]\nstages = "four"\n',  # the old name of schedule.ranks
        "wrong_type_flag_key": '[training]\nsteps = "five"\n',  # a key a flag also sets
        "a_file": "",
    }
    out = {}
    for name, text in texts.items():
        f = tmp_path / name
        f.write_text(text)
        out[name] = str(f)
    # A checkpoint directory written by 2 ranks (the default run has 4).
    ck = tmp_path / "ck"
    (ck / "step-00000003").mkdir(parents=True)
    (ck / "step-00000003" / "manifest.json").write_text(json.dumps(
        {"format": 1, "step": 3, "world_size": 2, "files": {}, "meta": {"fingerprint": {}}}))
    out["ck"] = str(ck)
    out["tmp"] = str(tmp_path)
    return out


CASES = [
    # more layer groups than layers
    (["train", "--ranks", "16"], "model.layers", "8 layers cannot fill 32 layer groups"),
    (["train", "-p", "4", "-v", "4"], "model.layers", "cannot fill 16 layer groups"),
    # m below what the schedule needs
    (["simulate", "interleaved-1f1b", "-m", "2", "-p", "4"], "-m", "needs m >= 4"),
    (["train", "--schedule", "interleaved-1f1b", "-m", "2", "-p", "4"], "-m", "needs m >= 4"),
    # a V schedule whose layers do not split evenly into 2p groups
    (["train", "--schedule", "v-half", "-p", "4", "--layers", "12"], "model.layers",
     "multiple of 2p = 8, e.g. 8 or 16"),
    (["train", "--schedule", "zb-v", "-p", "2", "--layers", "6"], "model.layers", "multiple of 2p = 4, e.g. 4 or 8"),
    # g outside [ceil(p/2), p]
    (["simulate", "group-interleaved", "-p", "4", "-g", "1"], "-g", "2..4"),
    (["simulate", "group-interleaved", "-p", "4", "-g", "5"], "-g", "2..4"),
    (["train", "-p", "4", "-g", "5"], "-g", "2..4"),
    (["simulate", "1f1b", "-g", "2"], "-g", "applies to group-interleaved"),
    # an infeasible offload request
    (["simulate", "1f1b", "--offload-chunks", "1", "--offload-time", "1.2"], "--offload-chunks",
     "largest feasible C for these settings is 0"),
    (["simulate", "1f1b", "--offload-chunks", "3"], "--offload-chunks", None),
    # unknown names
    (["simulate", "nope"], "schedule", "valid: gpipe, 1f1b"),
    (["train", "--schedule", "nope"], "schedule", "valid: gpipe, 1f1b"),
    (["plan", "--model", "nope", "--gpus", "8"], "--model", "valid names are"),
    (["plan", "--model", "llama-7b", "--hardware", "nope", "--gpus", "8"], "--hardware", "valid names are"),
    (["models", "--k", "--hardware", "nope"], "--hardware", "valid names are"),
    (["simulate", "1f1b", "--model", "nope"], "--model", "valid names are"),
    (["simulate"], "schedule", "--from-csv"),
    # negative or zero costs
    (["simulate", "1f1b", "--costs", "F=-1"], "--costs", "positive"),
    (["simulate", "1f1b", "--costs", "B=0"], "--costs", "positive"),
    (["simulate", "1f1b", "--costs", "comm=-1"], "--costs", ">= 0"),
    # malformed CSV (import path: simulate --from-csv)
    (["simulate", "--from-csv", "{bad_csv}"], "--from-csv", "row 1 (rank 0), column 3"),
    (["simulate", "--from-csv", "{split_csv}"], "--from-csv", "a layer group lives on one rank"),
    (["simulate", "--from-csv", "{empty_csv}"], "--from-csv", "no actions"),
    (["simulate", "--from-csv", "/nonexistent.csv"], "--from-csv", "no such file"),
    (["simulate", "1f1b", "--from-csv", "{bad_csv}"], "--from-csv", "not both"),
    # malformed config files
    (["train", "--config", "{syntax}"], "--config", "not valid TOML"),
    (["train", "--config", "{unknown}"], "training.stepz", "valid keys of [training]"),
    (["train", "--config", "{section}"], "--config", "valid: model, schedule"),
    (["train", "--config", "{wrong_type}"], "schedule.ranks", "must be int"),
    (["train", "--config", "{wrong_type_old_key}"], "schedule.stages", "must be int"),  # the key the file has
    (["train", "--config", "{wrong_type_flag_key}"], "training.steps: must be int", None),  # the file's key
    (["train", "--config", "{tmp}"], "--config", "cannot read"),
    (["train", "--config", "/nonexistent.toml"], "--config", "file not found"),
    # other training parameters
    (["train", "--steps", "0"], "--steps", ">= 1"),
    (["train", "--threads", "0"], "--threads", ">= 1"),
    (["train", "--resume"], "--resume", "needs --checkpoint-dir"),
    (["train", "--checkpoint-dir", "{a_file}"], "--checkpoint-dir", "not a directory"),
    (["train", "--checkpoint-dir", "{ck}", "--resume"], "--checkpoint-dir", "written by 2 ranks; this run has 4"),
    (["train", "--checkpoint-every", "-1"], "--checkpoint-every", ">= 0"),
    (["train", "--on-nonfinite", "ignore"], "--on-nonfinite", "'stop', 'skip'"),
    (["train", "--fault-injection", "op=explode,rank=0,step=1"], "runtime.fault_injection", "kill, raise"),
    (["train", "--fault-injection", "op=kill,rank=9,step=1"], "runtime.fault_injection", "0..3"),
    # unreadable input files
    (["simulate", "1f1b", "--rank-costs", "{tmp}"], "--rank-costs", "cannot read"),
]


@pytest.mark.parametrize("argv,param,valid", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_exits_2_with_one_line(argv, param, valid, files, capsys, monkeypatch):
    monkeypatch.delenv("PIPEOFFLOAD_FAULT", raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    argv = [a.format(**files) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors (choices, types)
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    verb = argv[0]
    assert lines[0].startswith(f"pipeoffload {verb}: error: ") or lines[0].startswith("pipeoffload: error:"), err
    assert param in lines[0], err
    if valid:
        assert valid in lines[0], err


def _run(args, env_extra, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT", "PIPEOFFLOAD_FAULT")}
    env.update(env_extra)
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pipeoffload"] + args, capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r, time.time() - t


@pytest.mark.parametrize("env,param,needle", [
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     "--ranks", "started 2 processes (WORLD_SIZE=2) but the schedule needs 4"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"},
     "--ranks", "torchrun --nproc-per-node 4"),
    ({"RANK": "0", "WORLD_SIZE": "four"}, "WORLD_SIZE", "must be an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK", "0..3"),
    ({"RANK": "0", "WORLD_SIZE": "4"}, "MASTER_ADDR", "MASTER_PORT"),
])
def test_a_world_size_that_does_not_fit_fails_before_any_rendezvous(env, param, needle, capsys, monkeypatch):
    # No other rank exists: waiting on the rendezvous would hang until its timeout.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PIPEOFFLOAD_FAULT"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t = time.time()
    rc = main(["train", "-p", "4", "--steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pipeoffload train: error: {param}") and needle in lines[0], err
    assert time.time() - t < 30


def test_the_world_size_check_in_a_real_process():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    r, took = _run(["train", "-p", "4", "--steps", "1", "--no-progress"], env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--ranks:" in r.stderr, r.stderr[-2000:]
    assert took < 30


def test_bad_input_on_the_command_line_of_a_real_process():
    r, _ = _run(["simulate", "interleaved-1f1b", "-m", "2", "-p", "4"], {})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "-m:" in r.stderr


# --- output files that cannot be written ----------------------------------------------------

#: Every verb that writes files, with the flag naming each (``{out}``: the path to write).
OUTPUTS = [
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--png", "{out}"], "--png"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--trace", "{out}"], "--trace"),
    (["simulate", "1f1b", "-p", "4", "-m", "8", "--csv", "{out}"], "--csv"),
    (["compare", "-p", "4", "-m", "8", "--png", "{out}"], "--png"),
    (["plan", "--model", "1.5B", "--gpus", "8", "--png", "{out}"], "--png"),
    (["scale", "--model", "1.5B", "--ranks", "4", "--png", "{out}"], "--png"),
    (["train", "--steps", "1", "--output", "{out}"], "--output"),
    (["bench", "--output", "{out}"], "--output"),
]


#: Where an output cannot be written. An existing directory is a valid --output folder, so
#: that case applies to file outputs only.
UNWRITABLE = [(argv, flag, where) for argv, flag in OUTPUTS for where in ("under_a_file", "a_directory", "proc")
              if not (where == "a_directory" and flag == "--output")]


@pytest.mark.parametrize("argv,flag,where", UNWRITABLE,
                         ids=[f"{' '.join(a[:2])} {f} {w}" for a, f, w in UNWRITABLE])
def test_an_output_that_cannot_be_written_is_one_line_naming_flag_and_path(argv, flag, where, files, capsys,
                                                                           monkeypatch):
    """Never a traceback, never a process started first: exit status 2 and one line with the
    flag and the path (`simulate --png /proc/x/y.png` printed a 30-line traceback)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PIPEOFFLOAD_FAULT"):
        monkeypatch.delenv(var, raising=False)
    if where == "proc":
        assert os.path.isdir("/proc"), "these tests need Linux's /proc"
    out = {"under_a_file": os.path.join(files["a_file"], "sub", "x.png"), "a_directory": files["tmp"],
           "proc": "/proc/x/y.png"}[where]
    rc = main([a.format(out=out) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"pipeoffload {argv[0]}: error: {flag}: cannot write {out}"), err


def test_a_write_that_fails_late_is_one_line_too(tmp_path):
    """What only writing can tell (here: a full disk) names the flag and the path as well."""
    from pipeoffload.commands.common import write_output
    from pipeoffload.errors import ParameterError

    def full(path):
        raise OSError(28, "No space left on device", path)

    with pytest.raises(ParameterError) as e:
        write_output("--png", str(tmp_path / "t.png"), full)
    assert str(e.value) == f"--png: cannot write {tmp_path / 't.png'}: No space left on device"
