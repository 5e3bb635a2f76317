"""`pipeoffload bench`: configuration checks, statistics, report, the CLI's parameter
errors, and a real (tiny) side-by-side run against torch.distributed.pipelining."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeoffload.bench.side_by_side import PAIRS, BenchConfig, markdown, summarize
from pipeoffload.errors import ParameterError
from pipeoffload.models.config import ModelConfig
from pipeoffload.schedules import generate

from helpers import ALL_SCHEDULES, import_torch

TINY = ModelConfig(layers=4, hidden=32, heads=4, kv_heads=2, seq_len=16)


def test_pairs_name_real_schedules_with_the_same_placement():
    schedules = import_torch("torch.distributed.pipelining.schedules")
    from pipeoffload.bench.torch_baseline import TORCH_CLASSES

    for pr in PAIRS.values():
        assert hasattr(schedules, pr.torch_class), pr.torch_class
        assert pr.ours in ALL_SCHEDULES, pr.ours
        placement, v = TORCH_CLASSES[pr.torch_class]
        for p in (2, 4):
            ours = generate(pr.ours, p=p, m=8, **pr.ours_kwargs(p))
            assert ours.placement.kind == placement and ours.chunks == v, pr.key


def test_summarize_takes_per_pair_ratios():
    s = summarize({"ours": [1.0, 2.0, 3.0], "torch": [2.0, 2.0, 2.0]})
    assert s["ratios"] == [0.5, 1.0, 1.5]
    assert (s["ratio_median"], s["ratio_min"], s["ratio_max"]) == (1.0, 0.5, 1.5)
    assert (s["ours_s"], s["torch_s"]) == (2.0, 2.0)


@pytest.mark.parametrize("change, param", [  # the library names its fields; the CLI maps them to flags
    ({"schedules": ["nope"]}, "schedules"),
    ({"pairs": 0}, "pairs"),
    ({"warmup": 0}, "warmup"),
    ({"stages": [1]}, "stages"),
    ({"stages": [4], "microbatches": 3}, "microbatches"),
    ({"stages": [4], "microbatches": 9, "schedules": ["interleaved-1f1b"]}, "microbatches"),  # 9 % (9//4)
    ({"stages": [4], "model": ModelConfig(layers=6)}, "model.layers"),  # interleaved needs 8 groups
])
def test_config_errors_name_the_parameter(change, param):
    cfg = BenchConfig(**{"model": TINY, **change})
    with pytest.raises(ParameterError) as e:
        cfg.check()
    assert e.value.param == param


def test_markdown_has_a_row_per_result():
    row = {"p": 2, "torch_class": "Schedule1F1B", "ours_label": "1f1b", "loss_diff": 0.0, "grad_rel_diff": 1e-7,
           "summary": summarize({"ours": [0.9, 1.0], "torch": [1.0, 1.0]}),
           "peak_ours": [2**20, 2**19], "peak_torch": [2**21, 2**19]}
    text = markdown({"rows": [row]})
    assert text.count("\n") == 2 and "Schedule1F1B ↔ 1f1b" in text
    assert "**0.950** (0.900–1.000)" in text and "1.00 / 0.50" in text and "2.00 / 0.50" in text


@pytest.mark.parametrize("args, flag", [(["--schedules", "nope"], "--schedules"), (["-p", "2,x"], "--ranks"),
                                        (["--pairs", "0"], "--pairs")])
def test_cli_parameter_errors_are_one_line(args, flag):
    r = subprocess.run([sys.executable, "-m", "pipeoffload", "bench", *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and flag in r.stderr, r.stderr


@pytest.mark.multiproc
def test_smoke_side_by_side_run(tmp_path):
    """One tiny pair at p = 2 on interleaved 1F1B (multi-stage: exercises the order
    import too): files written, identical loss and gradients, both meters measured and
    ours no higher than torch's on every rank (torch also keeps each stage's output)."""
    import_torch("torch.distributed.pipelining")
    from pipeoffload.bench.side_by_side import run_bench

    cfg = BenchConfig(stages=[2], schedules=["interleaved-1f1b"], pairs=1, microbatches=4, microbatch_size=2,
                      model=TINY, output=str(tmp_path), timeout_s=60)
    res = run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert "ScheduleInterleaved1F1B" in (tmp_path / "bench.md").read_text()
    [row] = saved["rows"] == res["rows"] and saved["rows"]
    assert row["same_order"]  # torch's interleaved 1F1B order is ours: no third contender
    assert row["loss_diff"] <= 1e-6 and row["grad_rel_diff"] <= 1e-5 and row["grad_norm"] > 0
    assert len(row["times_s"]["ours"]) == len(row["times_s"]["torch"]) == 1
    assert row["summary"]["ratio_median"] > 0
    assert all(x > 0 for x in row["peak_ours"] + row["peak_torch"])
    assert all(o <= t for o, t in zip(row["peak_ours"], row["peak_torch"]))


@pytest.mark.bench
def test_full_bench_meets_the_goal(tmp_path):
    """The documented benchmark (docs/bench.md): on every shared schedule at p = 2 and 4,
    not slower (median ratio, with 10% allowance for a shared machine's noise), activation
    memory no higher, same losses and gradients."""
    from pipeoffload.bench.side_by_side import run_bench

    res = run_bench(BenchConfig(pairs=11, output=str(tmp_path)), progress=False)
    for row in res["rows"]:
        assert row["summary"]["ratio_median"] <= 1.10, row
        assert max(row["peak_ours"]) <= max(row["peak_torch"]), row
        assert row["loss_diff"] <= 1e-5 and row["grad_rel_diff"] <= 1e-5, row
