"""`pipeoffload train`'s configuration file: [parallel] checks naming their keys, dump/load
round trips, and the planner's configuration emitted in the train format (pure, no processes)."""

from __future__ import annotations

import math

import pytest

from pipeoffload.errors import ParameterError
from pipeoffload.recompute import Recompute
from pipeoffload.training.config import ParallelConfig, TrainConfig, config_from_plan


def test_dump_load_round_trip(tmp_path):
    cfg = TrainConfig()
    assert TrainConfig.load(cfg.dump(tmp_path / "default.toml")) == cfg
    cfg.schedule.name, cfg.schedule.v, cfg.schedule.mem_limit = "zb-auto", 2, 6.5
    cfg.parallel = ParallelConfig(dp=2, tp=2, fsdp=True, sequence_parallel=True)
    cfg.offload.offload_chunks, cfg.offload.recompute = 3, True
    cfg.training.corpus = 'a "quoted" path\\with é\n'
    cfg.runtime.threads, cfg.runtime.timeout_s = 1, 5  # an int in a float field stays an int
    cfg.plan.step_time_s, cfg.plan.peak_activation_bytes = float("inf"), [1.5, 2.0, 3e9]
    path = cfg.dump(tmp_path / "run.toml", header="made by a test\nsecond line")
    assert path.read_text().startswith("# made by a test\n# second line\n")
    back = TrainConfig.load(path)
    assert back == cfg and math.isinf(back.plan.step_time_s)
    assert TrainConfig.load(path, {"parallel.dp": 4}).parallel.dp == 4  # flags still win


@pytest.mark.parametrize("parallel,model,key,words", [
    ({"tp": 3}, {}, "parallel.tp", "heads (4)"),
    ({"tp": 4}, {"heads": 4, "kv_heads": 2}, "parallel.tp", "kv_heads (2)"),
    ({"tp": 2}, {"ffn": 99}, "parallel.tp", "ffn (99)"),
    ({"dp": 0}, {}, "parallel.dp", ">= 1"),
    ({"fsdp": True}, {}, "parallel.fsdp", "dp"),
    ({"sequence_parallel": True}, {}, "parallel.sequence_parallel", "tp"),
])
def test_parallel_checks_name_the_key(parallel, model, key, words):
    cfg = TrainConfig.from_dict({"parallel": parallel, "model": model})
    with pytest.raises(ParameterError) as e:
        cfg.check()
    assert e.value.param == key and words in str(e.value), str(e.value)


def test_parallel_world_size():
    cfg = TrainConfig.from_dict({"schedule": {"name": "1f1b", "ranks": 2}, "parallel": {"dp": 2, "tp": 2}})
    cfg.check()
    assert cfg.world_size == 8
    with pytest.raises(ParameterError, match="parallel.tp"):
        TrainConfig.load(None, {"parallel.tp": "2"})  # wrong type from a file names the key


def test_plan_emits_a_runnable_train_config(tmp_path):
    from pipeoffload.planner import plan

    res = plan("tiny", "cpu", 4)
    for c in res.configs[:4]:
        cfg = config_from_plan(res, c, steps=2)
        back = TrainConfig.load(cfg.dump(tmp_path / "plan.toml"))
        assert back == cfg
        sched = back.check()  # the runtime accepts the planner's schedule, split and model
        assert (sched.num_ranks, back.parallel.dp, back.parallel.tp) == (c.split.pp, c.split.dp, c.split.tp)
        assert back.world_size == 4 and back.schedule.microbatches == c.m and back.training.steps == 2
        assert back.model.layers == res.model.layers and back.training.microbatch_size == res.model.microbatch
        p = back.plan
        assert p.step_time_s == pytest.approx((c.iteration_ms - c.step_ms) / 1e3) and p.bubble == pytest.approx(c.bubble_rate)
        assert len(p.peak_activation_bytes) == c.split.pp and p.peak_memory_bytes == c.memory.device
        assert p.configuration == c.describe() and "--hardware cpu" in p.source
        if c.family.schedule in ("zb-auto", "zb-v"):  # the planner's memory limit reaches the runtime's generator
            assert sched.params["mem_limit"] == pytest.approx((c.family.limit or 1) * c.split.pp)


def test_sequence_parallel_is_refused_until_the_runtime_has_it():
    cfg = TrainConfig.from_dict({"schedule": {"name": "1f1b", "ranks": 2}, "parallel": {"tp": 2, "sequence_parallel": True}})
    with pytest.raises(ParameterError, match="not implemented") as e:
        cfg.check()
    assert e.value.param == "parallel.sequence_parallel"


def test_emit_config_writes_the_best_plan_the_runtime_can_run(tmp_path, capsys):
    """A plan whose best configuration needs sequence parallelism or selective recompute
    (which the runtime lacks) emits the best one the runtime runs, and says so."""
    from pipeoffload.commands.train import emit_config, runtime_can_run
    from pipeoffload.planner import plan

    res = plan("tiny", "cpu", 4)
    cfg = emit_config(res, str(tmp_path / "run.toml"), quiet=True)
    chosen = next(c for c in res.configs if runtime_can_run(c))
    assert cfg.plan.configuration == chosen.describe()
    assert TrainConfig.load(tmp_path / "run.toml") == cfg
    for c in res.configs:
        ok = c.recompute in (Recompute.NONE, Recompute.ELEMENTWISE) and (c.split.tp == 1 or not c.split.sp)
        assert runtime_can_run(c) == ok


def test_the_old_key_schedule_stages_still_reads_with_a_warning():
    with pytest.warns(DeprecationWarning, match="schedule.stages is deprecated; call it schedule.ranks"):
        cfg = TrainConfig.from_dict({"schedule": {"name": "1f1b", "stages": 2}})
    assert cfg.schedule.ranks == 2
    with pytest.raises(ParameterError, match="^schedule.stages: is the old name of schedule.ranks"):
        TrainConfig.from_dict({"schedule": {"stages": 2, "ranks": 2}})
    assert "ranks = 2" in TrainConfig.from_dict({"schedule": {"ranks": 2}}).to_toml()
