"""Keyed random streams (runtime/rng.py): which modules reseed, and that nothing stays on
the user's modules between forwards."""

from __future__ import annotations

from helpers import import_torch

torch = import_torch()
from torch import nn  # noqa: E402

from pipeoffload.runtime.rng import DETERMINISTIC, KeyedRNG, module_names  # noqa: E402


class _Noisy(nn.Module):
    """Draws in its own forward after calling a deterministic child."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x) + torch.rand(x.shape)


class _LinearSub(nn.Linear):
    """A subclass may draw: it reseeds."""


def _rng(mod: nn.Module) -> KeyedRNG:
    mods = {0: mod}
    return KeyedRNG(3, module_names(mods, {}), torch.device("cpu"), mods)


def test_torch_deterministic_layers_do_not_reseed_and_everything_else_does():
    stage = nn.Sequential(_Noisy(), nn.Dropout(0.5), _LinearSub(4, 4), nn.GELU())
    hooked = {type(m) for m in _rng(stage)._hooked[0]}
    assert hooked == {nn.Sequential, _Noisy, nn.Dropout, _LinearSub}
    assert nn.Linear in DETERMINISTIC and nn.Dropout not in DETERMINISTIC


def test_a_draw_depends_on_its_module_key_step_and_microbatch_only():
    def draw(mod, step, mb):
        rng = _rng(mod)
        with rng.step(), rng.forward(step, mb, 0):
            return mod(torch.zeros(2, 4)) - mod.proj(torch.zeros(2, 4))

    torch.manual_seed(0)
    a = draw(_Noisy(), 1, 2)
    torch.manual_seed(123)  # the ambient stream does not matter
    assert torch.equal(a, draw(_Noisy(), 1, 2))
    assert not torch.equal(a, draw(_Noisy(), 1, 3))
    assert not torch.equal(a, draw(_Noisy(), 2, 2))


def test_no_hook_stays_on_the_modules_and_the_ambient_stream_is_restored():
    stage = nn.Sequential(_Noisy(), nn.Dropout(0.5))
    rng = _rng(stage)
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    with rng.step():
        with rng.forward(0, 0, 0):
            assert all(len(m._forward_pre_hooks) == 1 for m in rng._hooked[0])
            stage(torch.ones(2, 4))
    assert all(len(m._forward_pre_hooks) == 0 for m in stage.modules())
    assert torch.equal(torch.rand(3), want)
