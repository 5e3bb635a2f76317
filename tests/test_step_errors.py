"""An error inside a step names where it happened: the rank, the op (kind, layer group,
microbatch), its position in the rank's program and the ops around it — in the raising
rank's exception and in the launcher's one-line summary (runtime/op_errors.py)."""

from __future__ import annotations

import pytest

from helpers import import_torch

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.ir import Op, OpKind  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_stage, lm_loss  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.runtime.launcher import LaunchError, launch  # noqa: E402
from pipeoffload.runtime.op_errors import StepError, describe_place  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

CFG = ModelConfig(layers=4, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=3)
M = 4


class _RaisesOnCall(torch.nn.Module):
    """A layer group that raises ValueError at its ``n``-th forward call."""

    def __init__(self, inner: torch.nn.Module, n: int) -> None:
        super().__init__()
        self.inner, self.n, self.calls = inner, n, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.n:
            raise ValueError("a bad batch on purpose")
        return self.inner(x)


def _data():
    return ByteCorpus(load_corpus(), CFG.seq_len, seed=1).microbatches(0, M, 2)


def _stages(num_stages: int, bad_stage: int, n: int):
    def build(s):
        mod = build_stage(CFG, s, num_stages)
        return _RaisesOnCall(mod, n) if s == bad_stage else mod
    return build


def test_describe_place_names_the_op_its_position_and_neighbours():
    ops = [Op(k, s, j, 0, 0) for k, s, j in [(OpKind.F, 0, 0), (OpKind.F, 0, 1), (OpKind.F, 0, 2),
                                              (OpKind.B, 0, 0), (OpKind.W, 0, 0), (OpKind.B, 0, 1)]]
    text = describe_place(0, ops, 2)
    assert text.startswith("rank 0, F of layer group 0, microbatch 2 (op 3 of 6 of its program)"), text
    assert "F(s0,mb0) F(s0,mb1) [F(s0,mb2)] B(s0,mb0) W(s0,mb0) ..." in text, text
    assert "before the first op" in describe_place(0, ops, -1)
    assert "after the last op" in describe_place(0, ops, 6)


def test_a_user_error_in_a_forward_becomes_a_step_error_naming_the_op():
    sched = generate("1f1b", p=1, m=M)
    runner = PipelineRunner(_stages(1, 0, 3), lm_loss, sched, rank=0)
    xs, ys = _data()
    with pytest.raises(StepError) as got:
        runner.step(xs, ys)
    e = got.value
    assert isinstance(e.original, ValueError) and e.__cause__ is e.original
    assert e.op is not None and (e.op.kind, e.op.stage, e.op.microbatch) == (OpKind.F, 0, 2)
    assert e.rank == 0 and runner.ops[e.position] == e.op
    msg = str(e)
    assert msg.startswith("ValueError: a bad batch on purpose — raised at rank 0, F of layer group 0, "
                          "microbatch 2 (op "), msg
    assert "ops around it:" in msg and "[F(s0,mb2)]" in msg, msg


def test_a_library_error_keeps_its_type_and_gains_the_place():
    class _ReturnsObject(torch.nn.Module):
        def forward(self, x):
            return object()

    sched = generate("zb-v", p=1, m=2, v=2)
    runner = PipelineRunner([_ReturnsObject(), _ReturnsObject()], lm_loss, sched, rank=0)
    with pytest.raises(ParameterError, match=r"^stage_modules: the output of layer group 0") as got:
        runner.step([torch.ones(2, 3)] * 2, [torch.ones(2, 3)] * 2)
    assert got.value.where.startswith("rank 0, F of layer group 0, microbatch 0 (op 1 of"), got.value.where
    assert any("raised at rank 0, F of layer group 0" in note for note in got.value.__notes__)


def _raising_world(ctx):
    sched = generate("1f1b", p=2, m=M)
    runner = PipelineRunner(_stages(2, 1, 3), lm_loss, sched, timeout_s=60)
    xs, ys = _data()
    runner.step(xs, ys)


def test_the_launcher_summary_names_the_raising_rank_and_op():
    with pytest.raises(LaunchError) as got:
        launch(_raising_world, 2, backend="gloo", init_timeout_s=60)
    line = str(got.value).splitlines()[0]
    assert got.value.rank == 1, line
    assert line.startswith("rank 1 failed: StepError: ValueError: a bad batch on purpose — raised at "
                           "rank 1, F of layer group 1, microbatch 2 (op "), line
    assert "[F(s1,mb2)]" in line, line
