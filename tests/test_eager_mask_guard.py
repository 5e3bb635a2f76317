"""The eager-attention mask guard (``runtime/guards.py``, :class:`EagerMaskCheck`): a
layer group whose HF config asks for eager attention and that receives a boolean 4-D
tensor gets a one-time warning naming it (eager attention adds its mask to the scores:
a boolean one is added as 0/1); the additive float form passes silently."""

from __future__ import annotations

import types
import warnings

import pytest

from helpers import import_torch

torch = import_torch()

from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402


class _EagerStage(torch.nn.Module):
    """Stands for a hand-written HF stage: a config asking for eager attention, and the
    mask added to the scores as eager attention does."""

    def __init__(self, impl: str) -> None:
        super().__init__()
        self.config = types.SimpleNamespace(_attn_implementation=impl)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, batch):
        x, mask = batch
        scores = self.lin(x).sum(-1)[:, None, :, None] + mask  # (b, 1, s, 1) + the (b, 1, s, s) mask
        return scores.mean(dim=(1, 3))


def _loss(y, t):
    return ((y - t) ** 2).mean()


def _step(impl: str, mask: torch.Tensor) -> list:
    runner = PipelineRunner([_EagerStage(impl)], _loss, generate("1f1b", p=1, m=2), rank=0)
    x = torch.randn(2, 3, 4)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        runner.step([(x, mask), (x, mask)], [torch.zeros(2, 3)] * 2)
        runner.step([(x, mask), (x, mask)], [torch.zeros(2, 3)] * 2)
    return [w for w in got if "attention" in str(w.message)]


def test_a_boolean_4d_mask_into_an_eager_stage_is_named_once():
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    got = _step("eager", mask)
    assert len(got) == 1, [str(w.message) for w in got]
    assert str(got[0].message).startswith('layer group 0: its model computes attention "eager"')
    assert "(2, 1, 3, 3)" in str(got[0].message)


@pytest.mark.parametrize("impl, mask", [
    ("eager", torch.zeros(2, 1, 3, 3)),  # the additive form
    ("sdpa", torch.ones(2, 1, 3, 3, dtype=torch.bool)),  # sdpa takes the boolean form
])
def test_the_right_form_passes_silently(impl, mask):
    assert _step(impl, mask) == []
