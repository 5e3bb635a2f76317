"""`pipeoffload train` end to end (real processes), its configuration precedence,
its parameter errors, and a torchrun launch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeoffload.errors import ParameterError
from pipeoffload.training.config import TrainConfig

from helpers import requires_torchrun

TINY = ["--layers", "4", "--hidden", "32", "--seq-len", "16", "--microbatch-size", "2", "--no-progress",
        "--timeout", "60"]
BIN = Path(sys.executable).parent


def _train(args, tmp_path, launcher=None, timeout=240):
    cmd = (launcher or [sys.executable, "-m", "pipeoffload"]) + ["train"] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_config_precedence_defaults_toml_flags(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[schedule]\nname = "zb-h1"\nstages = 2\n[training]\nsteps = 7\n[model]\nhidden = 64\n')
    cfg = TrainConfig.load(f, {"schedule.ranks": 3, "training.lr": None})
    assert cfg.schedule.name == "zb-h1" and cfg.schedule.ranks == 3  # flag beats TOML
    assert cfg.training.steps == 7 and cfg.model.hidden == 64  # TOML beats defaults
    assert cfg.training.lr == TrainConfig().training.lr  # None = flag not given
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    bad = tmp_path / "bad.toml"
    bad.write_text("[training]\nstepz = 3\n")
    with pytest.raises(ParameterError, match="training.stepz"):
        TrainConfig.load(bad)
    bad.write_text("[trainin]\nsteps = 3\n")
    with pytest.raises(ParameterError, match="unknown section"):
        TrainConfig.load(bad)
    with pytest.raises(ParameterError, match="^config: file not found"):  # the library's name; the CLI maps it
        TrainConfig.load(tmp_path / "missing.toml")
    bad.write_text('[training]\nsteps = "5"\n')
    with pytest.raises(ParameterError, match="training.steps"):
        TrainConfig.load(bad)
    bad.write_text("[runtime]\ntimeout_s = 5\n")  # an int where a float is expected is fine
    assert TrainConfig.load(bad).runtime.timeout_s == 5


def test_default_config_is_valid():
    sched = TrainConfig().check()
    assert sched.name == "group-interleaved" and sched.num_ranks == 4


@pytest.mark.parametrize("args,param", [
    (["--schedule", "nope"], "schedule"),
    (["-p", "4", "--layers", "3"], "model.layers"),
    (["--steps", "0"], "--steps"),
    (["--corpus", "/nonexistent/file.txt"], "--corpus"),
    (["-p", "4", "-g", "1"], "-g"),
])
def test_parameter_errors_exit_2_before_spawning(args, param, tmp_path):
    r = _train(args, tmp_path, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and param in lines[0], r.stderr


@pytest.mark.multiproc
def test_train_end_to_end(tmp_path):
    out = tmp_path / "run"
    with_bar = [a for a in TINY if a != "--no-progress"]  # the progress bar's lock is a named semaphore
    r = _train(["--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "4", "-o", str(out)] + with_bar, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "leaked semaphore" not in r.stderr, r.stderr[-3000:]  # a clean run ends cleanly
    s = json.loads((out / "summary.json").read_text())
    assert len(s["losses"]) == 4 and s["losses"][-1] < s["losses"][0]
    assert s["schedule"]["name"] == "1f1b" and s["world_size"] == 2
    assert len(s["ranks"]) == 2
    for row in s["ranks"]:
        assert 0 <= row["bubble_measured"] < 1 and 0 <= row["bubble_predicted"] < 1
        assert row["peak_memory_measured"] > 0
        assert abs(row["peak_memory_error"]) < 0.10
    assert (out / "trace.json").is_file() and (out / "timeline.json").is_file()
    trace = json.loads((out / "trace.json").read_text())
    assert trace  # the trace tool wrote something for the measured run
    assert not s["files"]["timeline_png"].startswith("not "), s["files"]  # matplotlib is a dependency: always drawn
    assert (out / "timeline.png").stat().st_size > 1000 and (out / "predicted.png").stat().st_size > 1000
    assert "rank" in r.stdout and "peak act" in r.stdout and "loss" in r.stdout
    # The explorer page: listed in the report, self-contained (nothing fetched over the network).
    page = (out / "timeline.html").read_text()
    assert s["files"]["timeline_html"] == str(out / "timeline.html") and "timeline.html" in r.stdout
    assert re.search(r"https?://", page) is None, re.search(r".{60}https?://.{60}", page)
    assert 'data-page="measured"' in page and re.search(r"<(script|link|img)[^>]*\s(src|href)=", page) is None


@pytest.mark.multiproc
@requires_torchrun(BIN)
def test_train_under_torchrun(tmp_path):
    out = tmp_path / "run"
    launcher = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "pipeoffload"]
    r = _train(["--schedule", "zb-h1", "-p", "2", "-m", "4", "--steps", "2", "-o", str(out)] + TINY, tmp_path,
               launcher=launcher)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["world_size"] == 2 and len(s["losses"]) == 2


SMALL_MODEL = """name = "small"
layers = 4
hidden = 32
heads = 4
kv_groups = 2
ffn = 96
vocab = 256
seq = 16
microbatch = 2
dtype = "fp32"
activation = "swiglu"
flash_attention = false
dropout = false
tie_embeddings = false
"""


@pytest.mark.multiproc
def test_plan_emit_config_trains_on_a_mesh(tmp_path):
    """plan (cpu profile, a small model) --emit-config → train --config on 4 processes
    (PP2 × DP2): the report has every rank's mesh coordinates, the DP communication time
    and the planner's prediction beside the measured figures. The same global batch on
    PP2 × TP2 (flags over the file) gives the same losses (each DP replica trains its own
    half of the batch; the loss is the replicas' mean)."""
    (tmp_path / "small.toml").write_text(SMALL_MODEL)
    plan = subprocess.run([sys.executable, "-m", "pipeoffload", "plan", "--model", "small.toml", "--hardware", "cpu",
                           "--gpus", "4", "--global-batch", "16", "--schedules", "zb-h1", "--emit-config", "run.toml"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    cfg = TrainConfig.load(tmp_path / "run.toml")
    assert (cfg.schedule.name, cfg.schedule.ranks, cfg.parallel.dp, cfg.parallel.tp) == ("zb-h1", 2, 2, 1)
    assert cfg.plan.step_time_s > 0 and len(cfg.plan.peak_activation_bytes) == 2
    common = ["--steps", "2", "--eval-every", "0", "--no-progress", "--timeout", "60", "--config", "run.toml"]
    r = _train(common + ["-o", "mesh"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "mesh" / "summary.json").read_text())
    mesh = s["mesh"]
    assert (mesh["pp"], mesh["dp"], mesh["tp"], mesh["world_size"]) == (2, 2, 1, 4)
    assert sorted((row["pp"], row["dp"], row["tp"]) for row in mesh["ranks"]) == [(0, 0, 0), (0, 1, 0), (1, 0, 0),
                                                                                  (1, 1, 0)]
    assert mesh["dp_comm_s_max"] > 0 and mesh["tp_comm_s_max"] == 0 and mesh["peak_memory_max"] > 0
    assert s["plan"]["prediction"]["step_time_s"] == cfg.plan.step_time_s and s["plan"]["measured"]["step_time_s"] > 0
    assert "mesh pp=2 dp=2 tp=1" in r.stdout and "planner (zb-h1" in r.stdout, r.stdout
    assert (tmp_path / "mesh" / "timeline.html").is_file()
    # The same global batch on PP2 × TP2: dp=1 with twice the microbatches, each stage split in two.
    tp = _train(common + ["--dp", "1", "--tp", "2", "-m", str(2 * cfg.schedule.microbatches), "-o", "tp"], tmp_path)
    assert tp.returncode == 0, tp.stderr[-3000:]
    assert "prediction is for" in tp.stderr  # flags changed the planned configuration: no [plan] comparison
    t = json.loads((tmp_path / "tp" / "summary.json").read_text())
    assert sorted((row["pp"], row["tp"]) for row in t["mesh"]["ranks"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert t["plan"] is None and "mesh pp=2 dp=1 tp=2" in tp.stdout
    assert s["losses"] == pytest.approx(t["losses"], rel=1e-5)  # DP replicas' mean = TP on the whole batch
