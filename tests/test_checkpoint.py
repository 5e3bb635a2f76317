"""Checkpoints: ``torch.distributed.checkpoint`` files with a manifest written last;
verified on load, falling back past a corrupt, truncated, incomplete or unreadable one;
and ``pipeoffload train --resume`` continuing with exactly the losses of an
uninterrupted run (fp32, CPU), also after a rank was SIGKILLed mid-step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import import_torch

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.training.checkpoint import (  # noqa: E402
    MANIFEST,
    CheckpointError,
    atomic_write,
    capture_rng,
    list_checkpoints,
    load_latest,
    precheck,
    read_all,
    restore_rng,
    save_checkpoint,
    sha256_file,
    step_dir,
)

FP = {"model": {"layers": 4}, "layer_groups": 1}


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"model.w": torch.randn(64, 64, generator=g), "train.losses": [1.0] * step, "note": f"step {step}"}


def _template() -> dict:
    return {"model.w": torch.zeros(64, 64), "train.losses": None, "note": None}


def _save(root, step, keep=10):
    return save_checkpoint(root, step, _state(step), meta={"fingerprint": FP}, keep=keep)


# ----------------------------------------------------------------- single rank, no processes
def test_layout_manifest_and_checksums(tmp_path):
    d = _save(tmp_path, 3)
    assert d == step_dir(tmp_path, 3) and d.name == "step-00000003"
    man = json.loads((d / MANIFEST).read_text())
    assert man["format"] == 2 and man["step"] == 3 and man["world_size"] == 1 and man["meta"]["fingerprint"] == FP
    assert set(man["files"]) == {".metadata", "__0_0.distcp"}
    for name, ent in man["files"].items():
        assert ent["sha256"] == sha256_file(d / name) and ent["bytes"] == (d / name).stat().st_size
    assert sorted(p.name for p in d.iterdir()) == [".metadata", "__0_0.distcp", MANIFEST]  # no temporary files
    state = _template()
    ck = load_latest(tmp_path, state, expect=FP)
    assert ck.step == 3 and ck.rejected == [] and ck.state is state
    torch.testing.assert_close(state["model.w"], _state(3)["model.w"], rtol=0, atol=0)
    assert state["train.losses"] == [1.0] * 3 and state["note"] == "step 3"
    assert read_all(d)["note"] == "step 3"  # every key, without a template


def test_atomic_write_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "x.bin"
    atomic_write(target, lambda f: f.write(b"old"))

    def fail(f):
        f.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, fail)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def _corrupt_flip(d):
    f = d / "__0_0.distcp"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))


def _corrupt_truncate(d):
    f = d / "__0_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])


def _corrupt_manifest(d):
    (d / MANIFEST).write_text('{"format": 2, "step": ')


def _incomplete(d):
    (d / MANIFEST).unlink()


def _missing_file(d):
    (d / "__0_0.distcp").unlink()


@pytest.mark.parametrize("damage,why", [
    (_corrupt_flip, "sha256"),
    (_corrupt_truncate, "truncated"),
    (_corrupt_manifest, "unreadable"),
    (_incomplete, "incomplete"),
    (_missing_file, "missing"),
])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, why):
    for s in (1, 2, 3):
        _save(tmp_path, s)
    damage(step_dir(tmp_path, 3))
    warnings: list[str] = []
    state = _template()
    ck = load_latest(tmp_path, state, expect=FP, warn=warnings.append)
    assert ck.step == 2 and state["note"] == "step 2"
    assert len(warnings) == 1 and "step-00000003" in warnings[0] and why in warnings[0], warnings
    assert ck.rejected and why in ck.rejected[0]


def test_a_file_that_matches_its_checksum_but_does_not_load_is_rejected(tmp_path):
    _save(tmp_path, 1)
    d = _save(tmp_path, 2)
    f = d / "__0_0.distcp"
    f.write_bytes(b"not a checkpoint file")
    man = json.loads((d / MANIFEST).read_text())
    man["files"][f.name].update(sha256=sha256_file(f), bytes=f.stat().st_size)
    (d / MANIFEST).write_text(json.dumps(man))
    warnings: list[str] = []
    state = _template()
    assert load_latest(tmp_path, state, expect=FP, warn=warnings.append).step == 1
    assert "cannot be read" in warnings[0] and state["note"] == "step 1"


def test_an_old_format_checkpoint_is_named_as_such(tmp_path):
    d = tmp_path / "step-00000001"
    d.mkdir()
    (d / MANIFEST).write_text(json.dumps({"format": 1, "step": 1, "world_size": 1, "files": {},
                                          "meta": {"fingerprint": FP}}))
    with pytest.raises(ParameterError, match="older pipeoffload .format 1"):
        precheck(tmp_path, 1, FP)
    with pytest.raises(CheckpointError, match="format 1"):
        load_latest(tmp_path, _template(), expect=FP)


def test_no_usable_checkpoint_is_a_clear_error_and_none_is_none(tmp_path):
    assert load_latest(tmp_path / "empty", _template()) is None
    for s in (1, 2):
        _save(tmp_path, s)
    _corrupt_flip(step_dir(tmp_path, 1))
    _corrupt_truncate(step_dir(tmp_path, 2))
    with pytest.raises(CheckpointError, match="no usable checkpoint") as e:
        load_latest(tmp_path, _template(), expect=FP)
    assert "step-00000001" in str(e.value) and "step-00000002" in str(e.value)


def test_a_checkpoint_of_another_model_is_an_error_not_a_fallback(tmp_path):
    _save(tmp_path, 1)
    other = {"model": {"layers": 6}, "layer_groups": 1}
    with pytest.raises(CheckpointError, match="model.layers 4 there, 6 here"):
        load_latest(tmp_path, _template(), expect=other)
    with pytest.raises(ParameterError, match="^root: .*different model"):  # the library's name; the CLI maps it
        precheck(tmp_path, 1, other)
    with pytest.raises(ParameterError, match="written by 1 ranks; this run has 2"):
        precheck(tmp_path, 2, FP)
    precheck(tmp_path, 1, FP)  # fine


def test_retention_keeps_the_newest(tmp_path):
    for s in range(1, 6):
        _save(tmp_path, s, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [5, 4]


def test_rng_state_round_trip():
    import random

    state = capture_rng()
    a = (random.random(), torch.rand(3))
    restore_rng(state)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])


# ----------------------------------------------------------------- real training runs
TINY = ["--schedule", "zb-v", "-p", "2", "-m", "4", "--layers", "4", "--hidden", "32", "--seq-len", "16",
        "--microbatch-size", "2", "--no-progress", "--timeout", "60", "--steps", "4", "--eval-every", "2"]


def _train(args, cwd, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "PIPEOFFLOAD_FAULT"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "pipeoffload", "train"] + TINY + args, capture_output=True,
                          text=True, timeout=180, cwd=cwd, env=env)


def _losses(out: Path) -> list[float]:
    return json.loads((out / "summary.json").read_text())["losses"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """4 steps uninterrupted, a checkpoint after every step."""
    root = tmp_path_factory.mktemp("straight")
    r = _train(["--checkpoint-dir", str(root / "ck"), "--checkpoint-every", "1", "-o", str(root / "out")], root)
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Rank 1 SIGKILLed in the middle of step 3 (checkpoints 1 and 2 complete); then the
    latest, step 2, damaged (rank 1's shard truncated, as by a crash during a copy) and the
    run resumed, a checkpoint after every step. Two runs: (root, the killed run, the
    checkpoints it left, the resumed run)."""
    root = tmp_path_factory.mktemp("killed")
    ck = root / "ck"
    killed = _train(["--checkpoint-dir", str(ck), "--checkpoint-every", "1", "-o", str(root / "a")], root,
                    {"PIPEOFFLOAD_FAULT": "op=kill,rank=1,step=3"})
    left = [s for s, _ in list_checkpoints(ck)]
    f = step_dir(ck, 2) / "__1_0.distcp"
    if f.is_file():  # (a missing file fails the test on the kill's own outcome first)
        f.write_bytes(f.read_bytes()[:1000])
    resumed = _train(["--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--resume", "-o", str(root / "b")],
                     root)
    return root, killed, left, resumed


@pytest.mark.multiproc
def test_kill_then_resume_gives_the_losses_of_an_uninterrupted_run(straight, killed):
    root, r, left, resumed = killed
    assert r.returncode == 1 and "rank 1 was lost" in r.stderr, r.stderr[-3000:]
    assert left == [2, 1]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    want = _losses(straight / "out")
    assert _losses(root / "b") == want  # exactly: same bits, fp32 on CPU
    # ... and the same parameters and optimizer state after the last step, bit for bit.
    a, b = read_all(step_dir(straight / "ck", 4)), read_all(step_dir(root / "ck", 4))
    assert a.keys() == b.keys() and any(k.startswith("optim.state.") for k in a)
    for k, v in a.items():
        if k.startswith(("model.", "optim.state.")):
            assert torch.equal(v, b[k]), k
    assert a["train.losses"] == b["train.losses"] and a["train.val_losses"] == b["train.val_losses"]


@pytest.mark.multiproc
def test_resume_skips_a_corrupt_latest_checkpoint(killed):
    root, _, _, r = killed
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step-00000002 is unusable" in r.stderr and "__1_0.distcp" in r.stderr, r.stderr
    assert "resuming from" in r.stderr and "step-00000001" in r.stderr
    # step 2 was written again, complete
    f = step_dir(root / "ck", 2) / "__1_0.distcp"
    man = json.loads((step_dir(root / "ck", 2) / MANIFEST).read_text())
    assert sha256_file(f) == man["files"][f.name]["sha256"]


def test_loading_per_stage_names_into_model_names_says_why(tmp_path):
    """A checkpoint whose parameter names are per layer group, loaded by a runner that
    uses the model's names: a ParameterError naming keys and the naming mismatch, not the
    reader's long trace."""
    from pipeoffload.models import ModelConfig
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.schedules import generate

    cfg = ModelConfig(layers=2, hidden=16, heads=2, kv_heads=1, seq_len=8)
    sched = generate("1f1b", p=1, m=2)
    saved = PipelineRunner(lambda s: build_stage(cfg, s, 1), lm_loss, sched, rank=0, param_names="stage")
    saved.save(tmp_path / "ck")
    loader = PipelineRunner(lambda s: build_stage(cfg, s, 1), lm_loss, sched, rank=0, param_names="module")
    with pytest.raises(ParameterError, match=r"^path: the checkpoint at .* lacks \d+ of the \d+ keys this rank "
                                             r"needs, e\.g\. .*the checkpoint's parameter names are per layer group"):
        loader.load(tmp_path / "ck")
    saved.load(tmp_path / "ck")  # the same naming loads
