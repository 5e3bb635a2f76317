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
    assert hooked == {_Noisy, nn.Dropout, _LinearSub}  # a Sequential only calls its children
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


def test_declared_classes_and_containers_do_not_reseed_but_their_random_children_do():
    from pipeoffload.runtime.rng import never_draws, reseeds

    class Quiet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj, self.drop = nn.Linear(4, 4), nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.proj(x))

    assert reseeds(Quiet())
    never_draws(Quiet)
    hooked = {type(m) for m in _rng(nn.Sequential(Quiet(), nn.ModuleList([nn.ReLU()])))._hooked[0]}
    assert hooked == {nn.Dropout}
    assert not reseeds(Quiet()) and reseeds(type("Sub", (Quiet,), {})())  # exact type only


def test_never_draws_names_the_parameter_for_a_non_module():
    import pytest

    from pipeoffload.errors import ParameterError
    from pipeoffload.runtime.rng import never_draws

    with pytest.raises(ParameterError, match="cls"):
        never_draws(int)


def test_reference_model_has_no_reseeding_hook_and_its_gradients_are_bit_identical_with_hooks(monkeypatch):
    """The declaration changes no number: one training step of the reference model with
    its classes declared (no hook) and with every module hooked as before (the registry
    emptied) gives bit-identical losses and gradients."""
    from pipeoffload.models.config import ModelConfig
    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime import PipelineRunner, rng as rng_mod
    from pipeoffload.schedules import generate

    cfg = ModelConfig(layers=2, hidden=32, heads=2, kv_heads=1, seq_len=16)
    sched = generate("1f1b", p=1, m=2)
    torch.manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))
    y = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))

    def step():
        runner = PipelineRunner(lambda s: build_stage(cfg, s, 1), lm_loss, sched, seed=7)
        hooked = sum(len(v) for v in runner.rng._hooked.values())
        res = runner.step(x, y)
        return hooked, res.losses, [p.grad.clone() for p in runner.parameters()]

    n0, loss0, g0 = step()
    monkeypatch.setattr(rng_mod, "_DECLARED", set())
    n1, loss1, g1 = step()
    assert n0 == 0 and n1 > 0
    assert loss0 == loss1 and all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_loss_draws_are_keyed_by_step_and_microbatch_whatever_ran_before():
    rng = _rng(nn.Sequential(_Noisy()))
    with rng.step():
        rng.before_loss(3, 1)
        a = torch.rand(4)
        torch.rand(100)  # a module drew in between: the loss's key does not depend on it
        rng.before_loss(3, 1)
        assert torch.equal(a, torch.rand(4))
        rng.before_loss(3, 2)
        assert not torch.equal(a, torch.rand(4))
