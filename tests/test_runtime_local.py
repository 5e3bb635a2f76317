"""The executor in one process (p = 1, no process group): local hand-off between
layer groups on the same rank, user-supplied modules, and the activation-store hook
point that offload (OffloadStore) plugs into."""

from __future__ import annotations

import copy
import functools

import pytest

from helpers import import_torch

torch = import_torch()

from pipeoffload.ir import Op, OpKind  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_reference, build_stage, lm_loss  # noqa: E402
from pipeoffload.runtime.activations import ActivationStore  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner, run_pipeline  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

CFG = ModelConfig(layers=4, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=5)
M = 4


def _data():
    return ByteCorpus(load_corpus(), CFG.seq_len, 2).microbatches(0, M, 2)


@functools.lru_cache(maxsize=1)
def _reference_grads():
    ref = build_reference(CFG)
    xs, ys = _data()
    loss = sum(lm_loss(ref(x), y) for x, y in zip(xs, ys)) / M
    loss.backward()
    return loss.item(), {n: p.grad for n, p in ref.named_parameters()}


def _check(runner, res, want_loss, want):
    assert abs(res.loss - want_loss) <= 1e-5 * want_loss
    got = dict(runner.named_parameters())
    assert set(got) == set(want)
    for n, g in want.items():
        torch.testing.assert_close(got[n].grad, g, rtol=1e-5, atol=1e-5 * g.abs().max().item())


@pytest.mark.parametrize("name,v", [("gpipe", 2), ("1f1b", 1), ("interleaved-1f1b", 2), ("group-interleaved", 2),
                                    ("group-interleaved", 4)])
def test_one_rank_many_layer_groups_hand_off_locally(name, v):
    sched = generate(name, p=1, m=M, v=v)
    runner = PipelineRunner(lambda s: build_stage(CFG, s, sched.num_stages), lm_loss, sched, rank=0)
    assert not any(o.kind.is_comm for o in runner.ops)
    xs, ys = _data()
    res = runner.step(xs, ys)
    _check(runner, res, *_reference_grads())
    assert runner.meter.live_bytes() == 0
    kinds = {e.op.kind for e in res.events}
    assert kinds <= {OpKind.F, OpKind.B, OpKind.W, OpKind.BW}
    assert all(e.stream == "compute" and e.end >= e.start >= 0 for e in res.events)
    assert res.peak_memory > 0


def test_user_supplied_modules_and_loss():
    torch.manual_seed(0)
    full = [torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh()),
            torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.GELU()),
            torch.nn.Linear(8, 1)]
    ref = torch.nn.Sequential(*copy.deepcopy(full))
    xs = [torch.randn(5, 6) for _ in range(3)]
    ys = [torch.randn(5, 1) for _ in range(3)]
    loss_fn = torch.nn.functional.mse_loss
    (sum(loss_fn(ref(x), y) for x, y in zip(xs, ys)) / 3).backward()
    sched = generate("gpipe", p=1, m=3, v=3)
    res = run_pipeline(full, loss_fn, sched, xs, ys, rank=0)
    want = sum(loss_fn(torch.nn.Sequential(*full)(x), y) for x, y in zip(xs, ys)).item() / 3
    assert abs(res.loss - want) < 1e-6
    for a, b in zip(torch.nn.Sequential(*full).parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


class MoveToSideStore(ActivationStore):
    """A CPU stand-in for offload: at OFFLOAD_END each saved tensor of the
    (stage, microbatch) is replaced by a copy kept 'elsewhere' and the original is
    dropped; at RELOAD_END the copy comes back. Records every call."""

    def __init__(self):
        self.calls = []
        self.saved = {}

    def pack(self, stage, microbatch, tensor):
        box = [tensor.detach()]
        self.saved.setdefault((stage, microbatch), []).append(box)
        return box

    def unpack(self, stage, microbatch, box):
        assert not isinstance(box[0], tuple), "unpacked while offloaded"
        return box[0]

    def offload_start(self, stage, microbatch):
        self.calls.append(("offload_start", stage, microbatch))

    def offload_end(self, stage, microbatch):
        self.calls.append(("offload_end", stage, microbatch))
        for box in self.saved.get((stage, microbatch), []):
            box[0] = ("host", box[0].clone())

    def reload_start(self, stage, microbatch):
        self.calls.append(("reload_start", stage, microbatch))

    def reload_end(self, stage, microbatch):
        self.calls.append(("reload_end", stage, microbatch))
        for box in self.saved.get((stage, microbatch), []):
            box[0] = box[0][1]

    def release(self, stage, microbatch):
        self.calls.append(("release", stage, microbatch))
        self.saved.pop((stage, microbatch), None)


def test_offload_ops_are_dispatched_to_the_activation_store():
    sched = generate("1f1b", p=1, m=M)
    ops = []
    for op in sched.ranks[0]:
        if op.kind.is_backward:
            ops += [Op(OpKind.RELOAD_START, op.stage, op.microbatch, 0, 0),
                    Op(OpKind.RELOAD_END, op.stage, op.microbatch, 0, 0)]
        ops.append(op)
        if op.kind is OpKind.F:
            ops += [Op(OpKind.OFFLOAD_START, op.stage, op.microbatch, 0, 0),
                    Op(OpKind.OFFLOAD_END, op.stage, op.microbatch, 0, 0)]
    sched = sched.with_ranks([ops])
    store = MoveToSideStore()
    runner = PipelineRunner(lambda s: build_stage(CFG, s, 1), lm_loss, sched, rank=0, activation_store=store)
    xs, ys = _data()
    res = runner.step(xs, ys)
    _check(runner, res, *_reference_grads())
    want = []
    for j in range(M):
        want += [("offload_start", 0, j), ("offload_end", 0, j), ("reload_start", 0, j), ("reload_end", 0, j),
                 ("release", 0, j)]
    assert store.calls == want
    lanes = {e.op.kind: e.stream for e in res.events}
    assert lanes[OpKind.OFFLOAD_END] == "d2h" and lanes[OpKind.RELOAD_START] == "h2d"


def test_runner_errors_name_the_parameter():
    from pipeoffload.errors import ParameterError

    with pytest.raises(ParameterError, match="stage_modules"):
        PipelineRunner([torch.nn.Linear(2, 2)] * 2, lm_loss, generate("1f1b", p=1, m=2))  # 1 layer group
    with pytest.raises(ParameterError, match="process group"):
        PipelineRunner(lambda s: build_stage(CFG, s, 2), lm_loss, generate("1f1b", p=2, m=2), rank=0)
    runner = PipelineRunner(lambda s: build_stage(CFG, s, 1), lm_loss, generate("1f1b", p=1, m=2))
    xs, ys = _data()
    with pytest.raises(ParameterError, match="inputs"):
        runner.step(xs[:1], ys[:2])
