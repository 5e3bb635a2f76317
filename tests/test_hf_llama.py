"""A HuggingFace ``transformers`` Llama on the runtime (gloo, CPU, real processes).

The model: a tiny ``LlamaConfig`` (hidden 32, 8 decoder layers so that v·p = 8 stages
fit, grouped-query attention with 4 query and 2 key/value heads, random init), cut with
:func:`pipeoffload.models.hf_llama.split_llama`; right-padded batches whose attention
mask crosses every stage boundary. The reference is single-process training of the
*unsplit* ``LlamaForCausalLM`` (its own forward and mask), microbatch by microbatch.

One 4-rank world runs every case at p = 4, then at p = 2 on two pipelines at once (process
groups [0, 1] and [2, 3]; one launch: each rank's start, torch and transformers imported, is
most of the cost):

- one schedule of each structural class (``helpers.REPRESENTATIVES``: loop or V
  placement, one or several layer groups per rank, fused or split backward), with and
  without the offload pass: the loss and every parameter's gradient equal the reference
  within 1e-5 (fp32). Every registry schedule against single-process training is
  tests/test_runtime.py's and test_runtime_offload.py's check; what this file adds is
  the HF model (dict inputs, a mask across boundaries, GQA, ties), which is orthogonal to
  the schedule's order within a class (the 1F1B, ZB-H1 and ZB-V cases below add three
  more schedules);
- AdamW steps (a loop and a V schedule, with offload) whose sequence length and
  batch size change between steps (odd steps: shorter sequences and a smaller last
  microbatch) give the reference's losses;
- the head tied to the embedding on a loop (1F1B: first and last stage on two ranks)
  and a V placement (ZB-V: both on rank 0);
- autocast bf16 with a split schedule (ZB-H1 and ZB-V) against the reference under
  the same autocast;
- ``eval_step``: the reference's loss, no gradients;
- a DCP checkpoint written at p = 4 (after 3 steps) and read at p = 2: the same
  parameters by name, and the next step's loss is the reference's.
"""

from __future__ import annotations

import time

import pytest

from helpers import REPRESENTATIVES, import_torch, missing, require, run_world

torch = import_torch()
dist = import_torch("torch.distributed")
transformers = require("transformers")

from pipeoffload.models.hf_llama import causal_lm_loss, split_llama  # noqa: E402
from pipeoffload.passes.offload import plan_offload  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.training.measure import gather_results  # noqa: E402
from pipeoffload.runtime.offload_store import OffloadStore  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

pytestmark = [pytest.mark.multiproc]
if transformers is None:  # CI must run these: fail, do not skip (conftest.py)
    pytestmark.append(missing("transformers", "the hf extra: pip install -e '.[hf]'"))

M, LAYERS, VOCAB, LR, STEPS = 4, 8, 64, 1e-2, 4
LONG = {"zb-v": "V", "1f1b": "loop"}  # the schedules of the STEPS-step runs and the tie cases


def build(tie: bool = False) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   tie_word_embeddings=tie, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def batch(step: int) -> tuple[dict, torch.Tensor]:
    """Right-padded ids, their mask and next-token targets (-100 at padding); odd steps:
    shorter sequences and 7 rows (the last of the 4 microbatches is smaller)."""
    g = torch.Generator().manual_seed(step)
    rows, seq = (8, 12) if step % 2 == 0 else (7, 9)
    ids = torch.randint(0, VOCAB, (rows, seq + 1), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    y = ids[:, 1:].clone()
    y[mask == 0] = -100
    return {"input_ids": ids[:, :-1].contiguous(), "attention_mask": mask}, y


def _micro(x: dict, y: torch.Tensor) -> list[tuple[dict, torch.Tensor]]:
    from pipeoffload.runtime.boundary import split_batch

    return list(zip(split_batch(x, M, "inputs"), split_batch(y, M, "targets")))


def reference(steps: int, *, tie: bool = False, amp: bool = False, start: int = 0,
              state: dict | None = None, params_after: int | None = None) -> dict:
    """The unsplit model, microbatch by microbatch: per-step losses, the first step's
    gradients (by name), parameters after ``start + steps`` steps (and, with
    ``params_after``, after that many steps as "params_after")."""
    model = build(tie)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], {}
    for k in range(start + steps):
        total = 0.0
        for x, y in _micro(*batch(k)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                logits = model(**x).logits
            loss = causal_lm_loss(logits, y) / M
            loss.backward()
            total += loss.item()
        if k >= start:
            losses.append(total)
        if k == start:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        if params_after == k + 1:
            snap = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
    if params_after is not None:
        out["params_after"] = snap
    return out


# ----------------------------------------------------------------------------- the worlds
def _train(sched, steps: int, *, tie=False, offload=False, amp=None, runner_out=None, group=None):
    """``steps`` AdamW steps on this rank of the pipeline ``group`` (None: the world):
    (losses, first-step gradients by name)."""
    store = None
    if offload:
        sched, store = plan_offload(sched, offload_chunks=sched.chunks).schedule, OffloadStore()
    runner = PipelineRunner(split_llama(build(tie), sched.num_stages), causal_lm_loss, sched, timeout_s=120,
                            activation_store=store, autocast=amp, group=group)
    opt = torch.optim.AdamW(runner.parameters(), lr=LR)
    losses, grads = [], {}
    for k in range(steps):
        res = runner.step(*batch(k))  # whole batches: the runner splits them into M microbatches
        losses.append(res.loss)
        if k == 0:
            grads = {n: p.grad.clone() for n, p in runner.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad(set_to_none=True)
    if runner_out is not None:
        runner_out.append((runner, opt))
    return {"losses": losses, "grads": grads}


def _merge(parts: list[dict]) -> dict:
    """A case's per-rank shares as one result: the losses of the rank that has them (the
    last layer group's), every rank's gradients and parameters by name, and on whether
    any rank has a gradient left."""
    out = {"losses": next(r["losses"] for r in parts if r["losses"][0] is not None),
           "grads": {k: v for r in parts for k, v in r["grads"].items()}}
    if "params" in parts[0]:
        out["params"] = {k: v for r in parts for k, v in r["params"].items()}
    if "left" in parts[0]:
        out["no_grads"] = not any(r["left"] for r in parts)
    return out


def _eval(runner, params: bool) -> dict:
    """``eval_step`` on batch 0: this rank's loss, whether it left a gradient, and (with
    ``params``) the parameters it evaluated with."""
    ev = runner.eval_step(*batch(0))
    out = {"losses": [ev.loss], "grads": {}, "left": any(q.grad is not None for q in runner.parameters())}
    if params:
        out["params"] = {n: t.detach().clone() for n, t in runner.named_parameters()}
    return out


def _world(ctx, path: str, ckpt: str) -> None:
    """One 4-rank world: every case at p = 4 on the world (writing the checkpoint), then
    at p = 2 on two pipelines at once (process groups [0, 1] and [2, 3]): the first reads
    the checkpoint and runs one schedule of each class, the second the longer runs. Each
    rank keeps its share of every case, (p, case) -> share; one gather at the end, merged
    on rank 0."""
    assert ctx.world_size == 4, ctx.world_size
    t0, mine = time.perf_counter(), {}
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    k = ctx.rank // 2
    for p, group, part in ((4, None, (0, 1)), (2, groups[k], (k,))):
        if 0 in part:  # one schedule per class, with and without offload: one step
            for name in REPRESENTATIVES:
                for off in (False, True):
                    mine[(p, (name, off))] = _train(generate(name, p=p, m=M), 1, offload=off, group=group)
        if 1 in part:
            for name in LONG:  # STEPS steps, shapes changing between them, with offload
                mine[(p, ("long", name))] = _train(generate(name, p=p, m=M), STEPS, offload=True, group=group)
            for name in LONG:  # tied embedding and head
                mine[(p, ("tie", name))] = _train(generate(name, p=p, m=M), 3, tie=True, group=group)
            for name in ("zb-h1", "zb-v"):  # autocast bf16 with a split schedule (with offload)
                mine[(p, ("amp", name))] = _train(generate(name, p=p, m=M), 2, offload=True, amp=torch.bfloat16,
                                                  group=group)
        if 0 not in part:
            continue
        sched = generate("zb-v", p=p, m=M)  # the checkpoint, and eval_step
        if p == 4:
            runners: list = []
            _train(sched, 3, runner_out=runners)
            runner, opt = runners[0]
            runner.save(ckpt, opt)
            dist.barrier()  # written completely before the p = 2 pipeline reads it
            mine[(4, "eval")] = _eval(runner, params=True)  # the parameters after 3 steps
        else:
            runner = PipelineRunner(split_llama(build(), sched.num_stages), causal_lm_loss, sched, timeout_s=120,
                                    group=group)
            opt = torch.optim.AdamW(runner.parameters(), lr=LR)
            runner.load(ckpt, opt)
            params = {n: t.detach().clone() for n, t in runner.named_parameters()}
            res = runner.step(*batch(3))
            mine[(2, "resumed")] = {"losses": [res.loss], "grads": {}, "params": params}
            opt.zero_grad(set_to_none=True)  # eval_step below must leave none
            mine[(2, "eval")] = _eval(runner, params=False)
    got = gather_results(mine)
    if ctx.rank == 0:
        out: dict = {2: {}, 4: {}}
        for p, key in {key for g in got for key in g}:
            parts = [g[(p, key)] for g in got if (p, key) in g]
            assert len(parts) == p, (p, key, len(parts))
            out[p][key] = _merge(parts)
        for p in (2, 4):  # one loss each: the tests read "loss"
            out[p]["eval"]["loss"] = out[p]["eval"].pop("losses")[0]
        out[2]["resumed"]["loss"] = out[2]["resumed"].pop("losses")[0]
        out["seconds"] = time.perf_counter() - t0
        torch.save(out, path)


_WORLDS: dict = {}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """The world's results by pipeline size: {4: ..., 2: ...}."""
    if not _WORLDS:
        tmp = tmp_path_factory.mktemp("llama")
        _WORLDS.update(run_world(_world, 4, tmp / "out.pt", str(tmp / "ckpt")))
    return _WORLDS


@pytest.fixture(scope="module")
def ref():
    # One trajectory gives the first step, the long run, the parameters after 3 steps and
    # the 4th step's loss (the same computations as separate runs, so the same bits).
    long = reference(STEPS, params_after=3)
    assert STEPS >= 4
    return {"one": {"losses": long["losses"][:1], "grads": long["grads"]}, "long": long,
            "tie": reference(3, tie=True), "amp": reference(2, amp=True),
            "after3": {"losses": long["losses"][3:4]}, "at3": {"params": long["params_after"]}}


def _close(got: dict, want: dict, what: str, rtol: float = 1e-5) -> None:
    assert set(got) == set(want), f"{what}: names differ: {sorted(set(got) ^ set(want))}"
    for n, w in want.items():
        err = ((got[n].float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-30)).item()
        assert err <= rtol, f"{what}: {n} off by {err:.2e} (relative to its largest element)"


def _losses(got: list, want: list, what: str, rtol: float = 1e-5) -> None:
    assert len(got) == len(want), what
    for k, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= rtol * abs(b), f"{what}: step {k} loss {a} vs {b}"


# ----------------------------------------------------------------------------- checks
@pytest.mark.parametrize("p", [2, 4])
def test_each_schedule_class_with_and_without_offload_matches_the_unsplit_model(worlds, ref, p):
    for name in REPRESENTATIVES:
        for off in (False, True):
            r = worlds[p][(name, off)]
            what = f"{name} p={p} offload={off}"
            _losses(r["losses"], ref["one"]["losses"], what)
            _close(r["grads"], ref["one"]["grads"], what)


@pytest.mark.parametrize("p", [2, 4])
def test_adamw_steps_with_changing_shapes_give_the_same_losses(worlds, ref, p):
    for name in LONG:
        _losses(worlds[p][("long", name)]["losses"], ref["long"]["losses"], f"{name} p={p} {STEPS} steps")


@pytest.mark.parametrize("p", [2, 4])
def test_a_tied_head_on_loop_and_v_placements_gets_the_sum_of_both_uses(worlds, ref, p):
    for name, placement in LONG.items():
        r = worlds[p][("tie", name)]
        what = f"tied, {placement} placement ({name}) p={p}"
        assert "lm_head.weight" not in r["grads"], f"{what}: the tied head is listed apart from the embedding"
        _close(r["grads"], ref["tie"]["grads"], what)
        _losses(r["losses"], ref["tie"]["losses"], what)


@pytest.mark.parametrize("p", [2, 4])
def test_autocast_bf16_with_a_split_schedule_matches_the_unsplit_model_under_autocast(worlds, ref, p):
    for name in ("zb-h1", "zb-v"):
        r = worlds[p][("amp", name)]
        _losses(r["losses"], ref["amp"]["losses"], f"bf16 {name} p={p}", rtol=1e-2)
        _close(r["grads"], ref["amp"]["grads"], f"bf16 {name} p={p}", rtol=3e-2)


def test_eval_step_is_the_model_loss_without_gradients(worlds, ref):
    for p in (4, 2):
        ev = worlds[p]["eval"]
        assert ev["no_grads"], f"p={p}: eval_step left gradients"
    # p = 4 evaluated after its 3 steps: its parameters are the reference's after 3 steps.
    _close(worlds[4]["eval"]["params"], ref["at3"]["params"], "p=4 parameters after 3 steps")
    with torch.no_grad():
        model = build()
        model.load_state_dict(worlds[4]["eval"]["params"])
        want = sum(causal_lm_loss(model(**x).logits, y).item() for x, y in _micro(*batch(0))) / M
    _losses([worlds[4]["eval"]["loss"]], [want], "p=4 eval_step")


def test_a_checkpoint_written_at_p4_loads_at_p2_by_name_and_resumes(worlds, ref):
    r = worlds[2]["resumed"]
    # the p = 2 world read the p = 4 checkpoint (3 steps), then stepped once more
    _losses([r["loss"]], ref["after3"]["losses"], "step 4 after loading the p=4 checkpoint at p=2")
    _close(r["params"], ref["at3"]["params"], "parameters loaded at p=2", rtol=1e-5)
