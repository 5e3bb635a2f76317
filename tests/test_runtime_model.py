"""Your own model on the runtime (gloo, CPU, real processes, no mocks): what crosses a
boundary (dicts, tensors without gradients, plain values, shapes that change between
steps, a smaller last microbatch), parameters shared across stages (declared with
``tie=`` on a loop and a V placement), the weight-gradient split for parameters that
are not ``nn.Linear`` (a ``Conv1D`` ``addmm``, expert weights, a bare parameter, an
embedding) and its report, autocast bf16 and bf16 parameters with split schedules and
offload, ``eval_step`` and ``infer``, and dropout keyed so that every schedule and
pipeline size gives the same losses. Every gradient is compared with single-process
training of the same modules.

One world (p = 2) is spawned once and runs every case; the single-process references
run in the test process.
"""

from __future__ import annotations

import copy
import time
import warnings

import pytest

from helpers import import_torch, run_world

torch = import_torch()
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.passes.offload import plan_offload  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.training.measure import gather_results  # noqa: E402
from pipeoffload.runtime.offload_store import OffloadStore  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

pytestmark = pytest.mark.multiproc

D, VOCAB, M = 16, 40, 4


# ----------------------------------------------------------------------------- the model
class Conv1D(nn.Module):
    """transformers' GPT-2 Conv1D: ``addmm(bias, x, weight)`` with a (in, out) weight."""

    def __init__(self, nx: int, nf: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], self.nf)


class Block(nn.Module):
    """No ``nn.Linear`` at all: a Conv1D, a transposed bare parameter, two expert
    weights (bmm-style matmul), a norm's scale, dropout."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.conv = Conv1D(D, D)
        self.proj = nn.Parameter(torch.randn(D, D) * 0.2)
        self.experts = nn.Parameter(torch.randn(2, D, D) * 0.2)
        self.scale = nn.Parameter(torch.ones(D))
        self.drop = nn.Dropout(dropout)

    def forward(self, h, mask):
        h = h + self.drop(self.conv(self.norm(h))) * self.scale
        h = h + torch.tanh(h @ self.proj.t())
        h = h + (h @ self.experts[0] + h @ self.experts[1]) / 2
        return h * mask.unsqueeze(-1).to(h.dtype)


class Stage(nn.Module):
    """First: ``{"ids", "mask", "note"}`` in; middle: ``{"h", "mask", "n", "note"}`` in and
    out (``mask`` and ``n`` need no gradient, ``note`` is a plain string); last: logits."""

    def __init__(self, first: bool, last: bool, dropout: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.first, self.last = first, last
        self.embed = nn.Embedding(VOCAB, D) if first else None
        self.block = Block(dropout)
        self.head = nn.Embedding(VOCAB, D) if last else None  # weight used as F.linear(h, head.weight)

    def forward(self, x):
        if self.first:
            h, mask, n = self.embed(x["ids"]), x["mask"], x["ids"].shape[1]
        else:
            h, mask, n = x["h"], x["mask"], x["n"]
        assert x["note"] == "plain values cross too"
        h = self.block(h, mask)
        if self.last:
            return F.linear(h, self.head.weight)
        return {"h": h, "mask": mask, "n": n, "note": x["note"]}


def build(num_stages: int, *, tied: bool = False, dropout: float = 0.0, equal: bool = False) -> list[nn.Module]:
    """The model as ``num_stages`` stages (1, 2 or 4), the same weights and the same
    names for every split: four parts, seeded each, kept under their global index
    (``parts.2.block.proj``) as a model should be for split-invariant names, hence
    split-invariant checkpoints and dropout streams. ``tied``: the head is the
    embedding; ``equal``: the head is another tensor with the embedding's values."""
    base = [Stage(s == 0, s == 3, dropout, seed=10 + s) for s in range(4)]
    if tied:
        base[3].head.weight = base[0].embed.weight
    if equal:
        with torch.no_grad():
            base[3].head.weight.copy_(base[0].embed.weight)
    per = 4 // num_stages
    return [_Parts({k: base[k] for k in range(s * per, (s + 1) * per)}) for s in range(num_stages)]


class _Parts(nn.Module):
    def __init__(self, parts: dict[int, nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({str(k): m for k, m in parts.items()})

    def forward(self, x):
        for p in self.parts.values():
            x = p(x)
        return x


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1), ignore_index=-100)


def batch(step: int, size: int = 2 * M - 1, seq: int | None = None):
    """A whole batch (dict) and its targets; sequence length and batch size change with
    the step (the last microbatch is smaller)."""
    g = torch.Generator().manual_seed(100 + step)
    seq = seq or (6 if step % 2 else 9)
    ids = torch.randint(0, VOCAB, (size, seq), generator=g)
    mask = (torch.rand(size, seq, generator=g) > 0.2).float()
    y = torch.randint(0, VOCAB, (size, seq), generator=g)
    y[mask == 0] = -100
    return {"ids": ids, "mask": mask, "note": "plain values cross too"}, y


def split(x, y):
    from pipeoffload.runtime.boundary import split_batch

    return split_batch(x, M, "inputs"), split_batch(y, M, "targets")


def names_of(mods) -> dict[str, torch.Tensor]:
    """Parameter names of the stage modules (the same for every split), each tensor once."""
    out = {}
    for m in mods:
        for n, p in m.named_parameters():
            out.setdefault(n, p)
    return out


def reference(steps: int, *, tied=False, amp=None, dtype=None, lr=1e-2):
    """Single-process training of the same modules: losses of every step and the
    gradients of the first (by the 4-stage names)."""
    mods = build(4, tied=tied)
    if dtype is not None:
        mods = [m.to(dtype) for m in mods]
    params = list({id(p): p for m in mods for p in m.parameters()}.values())
    opt = torch.optim.AdamW(params, lr=lr)
    losses, grads = [], {}
    for k in range(steps):
        xs, ys = split(*batch(k))
        total = 0.0
        for x, y in zip(xs, ys):
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                out = x
                for m in mods:
                    out = m(out)
                loss = loss_fn(out, y) / M
            loss.backward()
            total += loss.item()
        losses.append(total)
        if k == 0:
            grads = {n: p.grad.clone() for n, p in names_of(mods).items()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads


# ----------------------------------------------------------------------------- the world
def _run(sched, mods, steps, *, store=None, amp=None, lr=1e-2, **kw):
    """``steps`` AdamW steps on this rank; (losses, first-step grads by name, runner)."""
    runner = PipelineRunner(mods, loss_fn, sched, timeout_s=60, activation_store=store, autocast=amp, **kw)
    opt = torch.optim.AdamW(runner.parameters(), lr=lr)
    losses, grads = [], {}
    for k in range(steps):
        x, y = batch(k)
        res = runner.step(x, y)  # a whole batch: the runner splits it into m microbatches
        losses.append(res.loss)
        if k == 0:
            grads = {n: p.grad.clone() for n, p in runner.named_parameters() if p.grad is not None}
            runner.first_meta = res.meta
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, grads, runner


def _collect(losses, grads, extra=None):
    got = gather_results({"losses": losses, "grads": grads, **(extra or {})})
    if got is None:
        return None
    return {"losses": next(g["losses"] for g in got if g["losses"][0] is not None),
            "grads": {k: v for g in got for k, v in g["grads"].items()},
            "extra": [{k: v for k, v in g.items() if k not in ("losses", "grads")} for g in got]}


def _plain_cases(ctx, out):
    """Boundaries, W split and its report, for a loop and a V placement; offload."""
    for name in ("zb-h1", "zb-v", "1f1b"):
        sched = generate(name, p=2, m=M, **({"v": 2} if name == "zb-v" else {}))
        for off in (False, True):
            run_sched, store = sched, None
            if off:
                run_sched, store = plan_offload(sched, offload_chunks=sched.chunks).schedule, OffloadStore()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                losses, grads, runner = _run(run_sched, _stage_list(sched), 3, store=store)
            res = _collect(losses, grads, {"split": runner.weight_split(), "w_share": runner.first_meta["w_share"],
                                           "warned": [str(w.message) for w in caught],
                                           "count": len(runner.parameters())})
            if ctx.rank == 0:
                out[(name, off)] = res


def _stage_list(sched):
    """Stage modules of ``sched`` from the 4-stage model (2 stages: merged pairs)."""
    return build(sched.num_stages)


def _tie_cases(ctx, out):
    """``tie=`` with separately built stages: loop (head on rank 1) and V (both on rank 0)."""
    for name in ("1f1b", "zb-v"):
        sched = generate(name, p=2, m=M, **({"v": 2} if name == "zb-v" else {}))
        S = sched.num_stages

        def stage(s, S=S):
            return build(S, equal=True)[s]  # separate tensors with equal values, declared tied

        tie = [("parts.0.embed.weight", "parts.3.head.weight")]
        losses, grads, runner = _run(sched, stage, 3, tie=tie)
        runner.close()  # a further copy on a rank takes the trained values (before each step, and now)
        shared = dict(runner.named_parameters()).get(tie[0][0])
        res = _collect(losses, grads, {"count": len(runner.parameters()),
                                       "shared_now": None if shared is None else shared.detach().clone(),
                                       "copies": [c.detach().clone() for g in runner.table.groups
                                                  for c in [g.param] + g.copies]})
        if ctx.rank == 0:
            out[("tie", name)] = res


def _mismatch_case(ctx, out):
    sched = generate("1f1b", p=2, m=M)

    def stage(s):
        mods = build(2, equal=True)
        if s == 1:
            with torch.no_grad():
                mods[1].parts["3"].head.weight.add_(1.0)
        return mods[s]

    try:
        PipelineRunner(stage, loss_fn, sched, timeout_s=60, tie=[("parts.0.embed.weight", "parts.3.head.weight")])
        msg = None
    except ParameterError as e:
        msg = str(e)
    if ctx.rank == 0:
        out["mismatch"] = msg


def _precision_cases(ctx, out):
    """Autocast bf16 with split schedules and offload; bf16 parameters."""
    for name in ("zb-h1", "zb-v"):
        sched = generate(name, p=2, m=M, **({"v": 2} if name == "zb-v" else {}))
        off = plan_offload(sched, offload_chunks=sched.chunks).schedule
        losses, grads, _ = _run(off, _stage_list(sched), 2, store=OffloadStore(), amp=torch.bfloat16)
        res = _collect(losses, grads)
        if ctx.rank == 0:
            out[("autocast", name)] = res
    sched = generate("zb-v", p=2, m=M, v=2)
    losses, grads, _ = _run(sched, [m.to(torch.bfloat16) for m in _stage_list(sched)], 2)
    res = _collect(losses, grads)
    if ctx.rank == 0:
        out["bf16-params"] = res


def _forward_only_cases(ctx, out):
    sched = generate("zb-v", p=2, m=M, v=2)
    runner = PipelineRunner(_stage_list(sched), loss_fn, sched, timeout_s=60)
    x, y = batch(5)
    ev = runner.eval_step(x, y)
    logits = runner.infer(x)
    micro = runner.infer(split(*batch(5))[0])
    got = gather_results({"loss": ev.loss, "logits": logits, "micro": micro,
                          "grads": [p.grad for p in runner.parameters()]})
    if ctx.rank == 0:
        out["eval"] = {"loss": next(g["loss"] for g in got if g["loss"] is not None),
                       "logits": next(g["logits"] for g in got if g["logits"] is not None),
                       "micro": next(g["micro"] for g in got if g["micro"] is not None),
                       "no_grads": all(gr is None for g in got for gr in g["grads"])}


def _dropout_cases(ctx, out):
    for name in ("1f1b", "zb-v", "interleaved-1f1b"):
        sched = generate(name, p=2, m=M)
        runner = PipelineRunner(build(sched.num_stages, dropout=0.3), loss_fn, sched, timeout_s=60, seed=7)
        losses = [runner.step(*batch(k)).loss for k in range(2)]
        got = gather_results(losses)
        if ctx.rank == 0:
            out[("dropout", name)] = next(g for g in got if g[0] is not None)


def _world(ctx, path):
    out: dict = {}
    t0 = time.perf_counter()
    for case in (_plain_cases, _tie_cases, _mismatch_case, _precision_cases, _forward_only_cases, _dropout_cases):
        case(ctx, out)
    if ctx.rank == 0:
        out["seconds"] = time.perf_counter() - t0
        torch.save(out, path)


_WORLD: dict = {}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not _WORLD:
        _WORLD.update(run_world(_world, 2, tmp_path_factory.mktemp("model") / "out.pt"))
    return _WORLD


# ----------------------------------------------------------------------------- checks
def _close(got: dict, want: dict, what: str, rtol: float = 1e-5) -> float:
    assert set(got) == set(want), f"{what}: {sorted(set(got) ^ set(want))}"
    worst = 0.0
    for n, w in want.items():
        err = ((got[n].float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
        assert err <= rtol, f"{what}: gradient of {n} off by {err:.2e} (relative to its largest element)"
    return worst


def test_boundaries_and_the_w_split_of_non_linear_parameters_match_single_process_training(world):
    want_losses, want = reference(3)
    for (name, off), r in ((k, v) for k, v in world.items() if isinstance(k, tuple) and k[0] in
                           ("zb-h1", "zb-v", "1f1b")):
        what = f"{name} offload={off}"
        assert r["losses"] == pytest.approx(want_losses, rel=1e-5), what
        _close(r["grads"], want, what)
        if name != "1f1b":  # a split schedule: every parameter's gradient is computed in W
            for rank in r["extra"]:
                for s, rep in rank["split"].items():
                    assert rep["deferred"] and not rep["in_b"], f"{what} stage {s}: {rep}"
                assert all(0.05 < share < 0.95 for share in rank["w_share"].values()), (what, rank["w_share"])
                assert not rank["warned"], rank["warned"]


def test_a_declared_tie_is_listed_once_summed_and_kept_equal_on_loop_and_v_placements(world):
    want_losses, want = reference(3, tied=True)
    want = {n: g for n, g in want.items() if n != "parts.3.head.weight"}  # the tied head is the embedding
    for name in ("1f1b", "zb-v"):
        r = world[("tie", name)]
        assert r["losses"] == pytest.approx(want_losses, rel=1e-5), name
        grads = r["grads"]
        assert "parts.3.head.weight" not in grads  # listed once, under its first name
        _close(grads, want, f"tie on {name}")
        copies = [c for rank in r["extra"] for c in rank["copies"]]
        assert len(copies) == 2 and torch.equal(copies[0], copies[1]), f"{name}: copies drifted apart"
        # listed once per rank: on the loop each of the two ranks optimizes its own copy
        counts = [rank["count"] for rank in r["extra"]]
        assert sum(counts) == len(want) + (1 if name == "1f1b" else 0), (name, counts)


def test_a_declared_tie_whose_copies_differ_is_an_error_naming_them(world):
    msg = world["mismatch"]
    assert msg is not None and msg.startswith("tie: ") and "parts.0.embed.weight" in msg
    assert "parts.3.head.weight" in msg and "differ at the start" in msg


def test_autocast_bf16_with_split_schedules_and_offload_matches_single_process_autocast(world):
    want_losses, want = reference(2, amp=torch.bfloat16)
    for name in ("zb-h1", "zb-v"):
        r = world[("autocast", name)]
        assert r["losses"] == pytest.approx(want_losses, rel=1e-2), name
        _close(r["grads"], want, f"autocast {name}", rtol=2e-2)


def test_bf16_parameters_with_a_split_schedule(world):
    want_losses, want = reference(2, dtype=torch.bfloat16)
    r = world["bf16-params"]
    assert r["losses"] == pytest.approx(want_losses, rel=2e-2)
    grads = r["grads"]
    assert all(g.dtype == torch.bfloat16 for g in grads.values())
    _close(grads, want, "bf16 parameters", rtol=5e-2)


def test_eval_step_and_infer_are_forward_only_and_match_the_model(world):
    mods = build(4)
    x, y = batch(5)
    with torch.no_grad():
        outs, losses = [], []
        for xm, ym in zip(*split(x, y)):
            o = xm
            for m in mods:
                o = m(o)
            outs.append(o)
            losses.append(loss_fn(o, ym).item())
    r = world["eval"]
    assert r["loss"] == pytest.approx(sum(losses) / M, rel=1e-5)
    # (the ranks run one thread each, this process two: matmuls may round differently)
    torch.testing.assert_close(r["logits"], torch.cat(outs), rtol=1e-5, atol=1e-5)
    assert isinstance(r["micro"], list) and len(r["micro"]) == M
    assert r["no_grads"]


def test_dropout_gives_the_same_losses_for_every_schedule_and_pipeline_size(world):
    sched = generate("1f1b", p=1, m=M)
    runner = PipelineRunner(build(1, dropout=0.3), loss_fn, sched, rank=0, seed=7)
    single = [runner.step(*batch(k)).loss for k in range(2)]
    runs = {name: world[("dropout", name)] for name in ("1f1b", "zb-v", "interleaved-1f1b")}
    for name, losses in runs.items():
        assert losses == pytest.approx(single, rel=1e-5), (name, losses, single)
    # and dropout is really on: another seed draws other masks
    other = PipelineRunner(build(1, dropout=0.3), loss_fn, sched, rank=0, seed=8).step(*batch(0)).loss
    assert other != pytest.approx(single[0], rel=1e-3)


def test_the_runner_leaves_the_user_modules_as_they_were():
    mods = build(2)
    before = [(type(m), copy.deepcopy(m.state_dict())) for mod in mods for m in mod.modules()]
    sched = generate("zb-v", p=1, m=M, v=2)
    with PipelineRunner(mods, loss_fn, sched, rank=0) as runner:
        runner.step(*batch(0))
    after = [(type(m), m.state_dict()) for mod in mods for m in mod.modules()]
    assert [t for t, _ in before] == [t for t, _ in after]  # no class swap
    assert all(not m._forward_pre_hooks and not m._forward_hooks and not m._backward_hooks
               for mod in mods for m in mod.modules())


class _OpaqueStage(nn.Module):
    """Its only parameter use is an in-place op, which the deferral leaves to autograd."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        h = x * 2.0
        h.add_(self.w)
        return h


def test_a_split_schedule_warns_when_a_stage_has_an_empty_w():
    sched = generate("zb-v", p=1, m=2, v=2)
    runner = PipelineRunner([_OpaqueStage(), _OpaqueStage()], lambda y, t: (y - t).pow(2).mean(), sched, rank=0)
    with pytest.warns(RuntimeWarning, match="no weight gradient reached W"):
        runner.step([torch.randn(4, 3), torch.randn(4, 3)], [torch.randn(4, 3), torch.randn(4, 3)])
    rep = runner.weight_split()
    assert rep[0]["in_b"] == ["0.w"] and rep[0]["deferred"] == [] and rep[0]["bypassed"] == {"in-place": 2}
    # (two stages name their parameter "w": the runner prefixes names with the stage)
    assert all(p.grad is not None for p in runner.parameters())  # correct, only not deferred


def test_bad_input_names_the_parameter():
    sched = generate("1f1b", p=1, m=M)
    runner = PipelineRunner(build(1), loss_fn, sched, rank=0)
    x, y = batch(0)
    with pytest.raises(ParameterError, match=r"^inputs: .*needs 4 microbatch inputs \(m\), got a list of 3"):
        runner.step(split(x, y)[0][:3], y)
    with pytest.raises(ParameterError, match=r"^inputs: a batch of 2 cannot be split into 4"):
        runner.step(batch(0, size=2)[0], batch(0, size=2)[1])
    with pytest.raises(ParameterError, match=r"^step: gradients are disabled"):
        with torch.no_grad():
            runner.step(x, y)
    with pytest.raises(ParameterError, match=r"^tie: no parameter is named 'nope'"):
        PipelineRunner(build(1), loss_fn, sched, rank=0, tie=[("nope", "0.parts.0.embed.weight")])
    two = generate("zb-v", p=1, m=2, v=2)
    bad = PipelineRunner([_Returns(object()), _OpaqueStage()], loss_fn, two, rank=0)
    with pytest.raises(ParameterError, match=r"^stage_modules: the output of layer group 0 holds a object"):
        bad.step([torch.ones(2, 3)] * 2, [torch.ones(2, 3)] * 2)


class _Returns(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return {"h": x * self.w, "what": self.value}
