"""``models.split.split_by_name`` on examples/torchtitan_llama.py's torchtitan-style Llama
(``tok_embeddings``, ``layers`` as an ``nn.ModuleDict``, ``norm``, ``output``).

- In one process: the stages are views sharing the model's tensors under its fully
  qualified names, every parameter in exactly one stage, and run in sequence they give
  the model's output; bad lists are refused naming the culprit.
- On two gloo ranks (1F1B and ZB-V, stages handed per rank): the loss and every gradient
  equal single-process training (1e-5), under the model's own names; a checkpoint of the
  4-stage split (ZB-V) loads by name into the 2-stage split (1F1B).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from helpers import import_torch, run_world

torch = import_torch()

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.models.split import split_by_name  # noqa: E402

EXAMPLES = str(pathlib.Path(__file__).resolve().parent.parent / "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)
import torchtitan_llama as tt  # noqa: E402

M = 4


def _data():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tt.VOCAB, (8, 13), generator=g)
    return ids[:, :-1], ids[:, 1:]


def test_views_share_the_models_tensors_and_names_and_compute_its_output():
    model = tt.build(4)
    stages = split_by_name(model, tt.stage_names(4, 3))
    own = dict(model.named_parameters())
    seen = [n for s in stages for n, _ in s.named_parameters()]
    assert sorted(seen) == sorted(own)  # each once, by its own name
    assert all(q is own[n] for s in stages for n, q in s.named_parameters())
    assert stages[1].tok_embeddings is None and list(stages[1].layers) == ["1", "2"]
    x, _ = _data()
    h = x
    for s in stages:
        h = s(h)
    assert torch.equal(h, model(x))


def test_bad_lists_are_refused_naming_the_culprit():
    model = tt.build(2)
    with pytest.raises(ParameterError, match="stage 1: Transformer has no submodule or parameter 'layers.7'"):
        split_by_name(model, [["tok_embeddings", "layers.0"], ["layers.7"]])
    with pytest.raises(ParameterError, match="'layers.0' is listed in stages 0 and 1"):
        split_by_name(model, [["tok_embeddings", "layers.0"], ["layers.0", "layers.1", "norm", "output"]])
    with pytest.raises(ParameterError, match="parameters no stage keeps: norm.weight"):
        split_by_name(model, [["tok_embeddings", "layers.0"], ["layers.1", "output"]])
    seq = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    with pytest.raises(ParameterError, match="'0' is an nn.ModuleList split between stages; make it an nn.ModuleDict"):
        split_by_name(seq, [["0.0"], ["0.1"]])


def _world(ctx, path: str, ckpt: str) -> None:
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.measure import gather_results
    from pipeoffload.schedules import generate

    out = {}
    for name in ("1f1b", "zb-v"):
        sched = generate(name, p=ctx.world_size, m=M)
        stages = split_by_name(tt.build(4), tt.stage_names(4, sched.num_stages))
        runner = PipelineRunner(lambda s: stages[s], tt.loss_fn, sched, timeout_s=120)
        res = runner.step(*_data())
        got = gather_results({"loss": res.loss, "grads": {n: q.grad.clone() for n, q in runner.named_parameters()}})
        if ctx.rank == 0:
            out[name] = {"loss": next(g["loss"] for g in got if g["loss"] is not None),
                         "grads": {k: v for g in got for k, v in g["grads"].items()}}
        if name == "zb-v":  # a checkpoint of the 4-stage split, after one SGD step
            with torch.no_grad():
                for q in runner.parameters():
                    q -= 0.1 * q.grad
            runner.save(ckpt)
    # ... loads into the 2-stage split by name
    sched = generate("1f1b", p=ctx.world_size, m=M)
    runner = PipelineRunner(split_by_name(tt.build(4), tt.stage_names(4, 2)), tt.loss_fn, sched, timeout_s=120)
    runner.load(ckpt)
    got = gather_results({n: q.detach().clone() for n, q in runner.named_parameters()})
    if ctx.rank == 0:
        out["loaded"] = {k: v for g in got for k, v in g.items()}
        torch.save(out, path)


@pytest.mark.multiproc
def test_by_name_stages_on_two_ranks_train_as_the_whole_model(tmp_path):
    out = run_world(_world, 2, tmp_path / "out.pt", str(tmp_path / "ckpt"))
    model = tt.build(4)
    x, y = _data()
    total = 0.0
    for xm, ym in zip(x.chunk(M), y.chunk(M)):
        loss = tt.loss_fn(model(xm), ym) / M
        loss.backward()
        total += loss.item()
    loaded = out.pop("loaded")
    for n, q in model.named_parameters():  # the checkpoint of the 4-stage split, read by the 2-stage one
        # the step used the pipeline's gradients (within 1e-5 of these): the same values within 1e-6
        torch.testing.assert_close(loaded[n], q.detach() - 0.1 * q.grad, rtol=0, atol=1e-6, msg=n)
    for name, r in out.items():
        assert abs(r["loss"] - total) <= 1e-6 * abs(total), f"{name}: {r['loss']} vs {total}"
        assert set(r["grads"]) == {n for n, _ in model.named_parameters()}, name
        for n, q in model.named_parameters():
            err = ((r["grads"][n] - q.grad).abs().max() / q.grad.abs().max()).item()
            assert err <= 1e-5, f"{name}: {n} off by {err:.2e}"
