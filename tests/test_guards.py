"""The runner's guards against silent wrong training (``runtime/guards.py``), on two real
gloo ranks under NCCL's point-to-point rules, one world for every case:

- ranks built with different microbatch counts: a ``ParameterError`` on every rank at
  construction, naming m and what each rank has (not a cross-entropy error mid-step);
- a head tied to the embedding on another rank (stages built per rank), not declared: a
  one-time warning naming both parameters; declared by the stages themselves
  (``tied_parameters``, as ``split_causal_lm``'s stages carry): no warning, one name;
- a layer group whose output is detached: a warning naming layer group 0;
- stage modules whose names collide (``nn.Linear`` per stage): a warning that names fell
  back to per-stage ones.
"""

from __future__ import annotations

import warnings

import pytest

from helpers import import_torch, run_world

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402

pytestmark = [pytest.mark.multiproc]


class _Detached(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).detach()  # the mistake: nothing before this gets a gradient


class _Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)

    def forward(self, ids):
        return self.embed(ids)


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 16, bias=False)

    def forward(self, h):
        return self.head(h)


def _ce(logits, y):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 16), y.reshape(-1))


def _mse(out, y):
    return ((out - y) ** 2).mean()


def _world(ctx, path: str) -> None:
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.schedules import generate

    out: dict = {}

    def record(key, fn):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            try:
                fn()
                out[key] = {"error": None}
            except ParameterError as e:  # asserted on below: every rank must raise it
                out[key] = {"error": str(e)}
        out[key]["warnings"] = [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]

    # different m on the two ranks
    record("m", lambda: PipelineRunner(lambda s: torch.nn.Linear(4, 4), _mse,
                                       generate("1f1b", p=2, m=4 if ctx.rank == 0 else 2)))

    def tied(declared: bool):
        torch.manual_seed(0)  # every rank builds the whole tied model, then keeps its own stage
        emb, head = _Embed(), _Head()
        head.head.weight = emb.embed.weight
        stages = [emb, head]
        for st in stages:
            st.tied_parameters = [("embed.weight", "head.weight")] if declared else []
        runner = PipelineRunner(lambda s: stages[s], _ce, generate("1f1b", p=2, m=2))
        ids = torch.randint(0, 16, (4, 5))
        runner.step(ids, ids)
        out.setdefault("names", {})[declared] = [n for n, _ in runner.named_parameters()]

    record("untied", lambda: tied(False))
    record("tied", lambda: tied(True))

    def detached():
        mods = {0: _Detached(), 1: torch.nn.Linear(4, 4)}
        runner = PipelineRunner(lambda s: mods[s], _mse, generate("1f1b", p=2, m=2))
        runner.step(torch.randn(4, 4), torch.randn(4, 4))

    record("nograd", detached)
    record("names_fallback", lambda: PipelineRunner([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)], _mse,
                                                    generate("1f1b", p=2, m=2)))
    gathered: list = [None, None]
    torch.distributed.all_gather_object(gathered, out)
    if ctx.rank == 0:
        torch.save(gathered, path)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return run_world(_world, 2, tmp_path_factory.mktemp("guards") / "out.pt")


def test_different_microbatch_counts_fail_at_construction_on_every_rank(world):
    for rank, out in enumerate(world):
        err = out["m"]["error"]
        assert err is not None and err.startswith("schedule:"), f"rank {rank}: {err}"
        assert "m (microbatches)" in err and "rank 0: 1f1b p=2 stages=2 m=4" in err and "m=2" in err, err


def test_an_undeclared_tie_across_ranks_is_named_and_a_declared_one_holds(world):
    warned = world[0]["untied"]["warnings"]
    assert any("embed.weight (rank 0)" in w and "head.weight (rank 1)" in w for w in warned), warned
    for rank, out in enumerate(world):
        assert not any("not tied" in w for w in out["tied"]["warnings"]), out["tied"]["warnings"]
        assert out["tied"]["error"] is None and out["untied"]["error"] is None
    assert world[1]["names"][True] == ["embed.weight"]  # the head is listed once, as the embedding
    assert world[1]["names"][False] == ["head.weight"]


def test_a_layer_group_without_gradients_is_named(world):
    warned = world[0]["nograd"]["warnings"]
    assert any(w.startswith("layer group 0: none of its 2 trainable parameters (lin.weight, lin.bias)")
               for w in warned), warned
    assert not any("layer group 1" in w for w in world[1]["nograd"]["warnings"])


def test_names_falling_back_to_per_stage_ones_are_reported(world):
    warned = world[0]["names_fallback"]["warnings"]
    assert any("fell back to per-stage" in w and "weight" in w for w in warned), warned
