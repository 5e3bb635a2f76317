"""Every HuggingFace family :func:`pipeoffload.models.hf.split_causal_lm` knows, on the runtime
(gloo, real processes, NCCL's point-to-point rules emulated), against the unsplit model.

The models are tests/hf_models.py's tiny random-weight configs (no downloads), each with its
family's features on: Mistral's window shorter than the sequence, Gemma2/3's soft-capping and
alternating sliding layers (Gemma2 under eager attention, its additive mask), GPT-2's learned
positions, ties from the model's own tied-weight list (Gemma, GPT-2), the MoE router
auxiliary loss (Qwen2-MoE, Qwen3-MoE, Mixtral at coefficient 0.1).

The stages are handed to the runner *per rank* (a callable): no rank sees another rank's
stage objects, so a head tied to the embedding on another rank is known only from what the
stages declare (``tied_parameters``, from the model's ``_tied_weights_keys``).

Checks, for a loop (1F1B) and a V schedule (ZB-V), both with the offload pass, one step of
4 microbatches of right-padded sequences:

- every family at p = 2 (4 layers), and Qwen2-MoE and Gemma2 at p = 4 (8 layers): the
  pipeline's mean loss equals the mean of HF's own ``loss`` (``labels=``: the next-token
  cross-entropy plus ``router_aux_loss_coef`` × the load-balancing loss HF adds) within 1e-6,
  and every parameter's gradient equals single-process training's within 1e-5 (relative to
  its largest element); the tied head is listed once, under the embedding's name;
- in one process: the stages run in sequence give HF's loss bit for bit, padded or not, and
  for packed sequences (position ids restarting, no mask) the loss of each sequence alone.

One 4-rank world runs every multi-process case (one launch: each rank's start, torch and
transformers imported, is most of the cost): the p = 4 cases on the world, the p = 2 cases on
two pipelines at once, on process groups [0, 1] and [2, 3].
"""

from __future__ import annotations

import pytest

from helpers import import_torch, missing, require, run_world

torch = import_torch()
dist = import_torch("torch.distributed")
transformers = require("transformers")

from hf_models import FAMILIES, RUNTIME_FAMILIES, batch, build, sequential  # noqa: E402
from pipeoffload.models.hf import causal_lm_loss, split_causal_lm  # noqa: E402

F = torch.nn.functional

pytestmark = []
if transformers is None:  # CI must run these: fail, do not skip (conftest.py)
    pytestmark.append(missing("transformers", "the hf extra: pip install -e '.[hf]'"))

M = 4
SCHEDULES = ("1f1b", "zb-v")
AT_P4 = ("qwen2_moe", "gemma2")
TIED = {"gemma": "model.embed_tokens.weight", "gemma2": "model.embed_tokens.weight",
        "gemma3": "model.embed_tokens.weight", "gpt2": "transformer.wte.weight"}


def _layers(p: int) -> int:
    return 2 * p  # ZB-V: 2p layer groups


def _micro(x, y):
    from pipeoffload.runtime.boundary import split_batch

    return list(zip(split_batch(x, M, "inputs"), split_batch(y, M, "targets")))


def reference(family: str, p: int) -> dict:
    """Single-process training of the unsplit model: HF's own loss per microbatch (mean)
    and the gradients of the mean, by name."""
    model = build(family, _layers(p))
    x, _, labels = batch(0)
    total = 0.0
    for xm, lm in _micro(x, labels):
        loss = model(**xm, labels=lm).loss / M
        loss.backward()
        total += loss.item()
    return {"loss": total, "grads": {n: q.grad.clone() for n, q in model.named_parameters()}}


def _run(family: str, name: str, p: int, group=None) -> dict:
    """One step of ``family`` on ``name`` with the offload pass, on this rank of a ``p``-rank
    pipeline (``group``: its process group; None: the world): this rank's loss (None where
    it does not hold the last layer group) and gradients by name."""
    from pipeoffload.passes.offload import plan_offload
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.offload_store import OffloadStore
    from pipeoffload.schedules import generate

    sched = generate(name, p=p, m=M)
    sched = plan_offload(sched, offload_chunks=sched.chunks).schedule
    stages = split_causal_lm(build(family, _layers(p)), sched.num_stages)
    runner = PipelineRunner(lambda s: stages[s], causal_lm_loss, sched, timeout_s=120, group=group,
                            activation_store=OffloadStore())
    x, y, _ = batch(0)
    res = runner.step(x, y)
    return {"loss": res.loss, "grads": {n: q.grad.clone() for n, q in runner.named_parameters() if q.grad is not None}}


def _world(ctx, path: str) -> None:
    """One 4-rank world: the p = 4 cases on the whole world, then the p = 2 cases on two
    pipelines at once (process groups [0, 1] and [2, 3], each a share of the families; the
    packed case on the second). One gather at the end: (p, family, schedule) -> this rank's
    share, merged on rank 0."""
    from pipeoffload.runtime.executor import PipelineRunner
    from pipeoffload.runtime.measure import gather_results
    from pipeoffload.schedules import generate

    assert ctx.world_size == 4, ctx.world_size
    mine: dict = {}
    for family in AT_P4:
        for name in SCHEDULES:
            mine[(4, family, name)] = _run(family, name, 4)
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    k = ctx.rank // 2
    for family in RUNTIME_FAMILIES[k::2]:
        for name in SCHEDULES:
            mine[(2, family, name)] = _run(family, name, 2, groups[k])
    if k == 1:  # packed sequences: position ids restart, no mask (HF's mask functions keep them apart)
        sched = generate("zb-v", p=2, m=M)
        stages = split_causal_lm(build("llama", _layers(2)), sched.num_stages)
        runner = PipelineRunner(lambda s: stages[s], causal_lm_loss, sched, timeout_s=120, group=groups[k])
        x, y, _ = packed_batch()
        mine["packed"] = runner.step(x, y).loss
    got = gather_results(mine)
    if ctx.rank == 0:
        out: dict = {2: {}, 4: {}}
        for key in {key for g in got for key in g}:
            if key == "packed":
                out[2]["packed"] = next(g["packed"] for g in got if g.get("packed") is not None)
                continue
            p, family, name = key
            parts = [g[key] for g in got if key in g]
            assert len(parts) == p, (key, len(parts))
            out[p][(family, name)] = {"loss": next(r["loss"] for r in parts if r["loss"] is not None),
                                      "grads": {n: v for r in parts for n, v in r["grads"].items()}}
        torch.save(out, path)


def packed_batch():
    """Rows of two sequences (4 and 6 tokens) packed: position ids restart at each."""
    x, y, labels = batch(5, padded=False)
    x["position_ids"] = torch.cat([torch.arange(4), torch.arange(6)]).expand(x["input_ids"].shape)
    return x, y, labels


_WORLDS: dict = {}


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    if not _WORLDS:
        _WORLDS.update(run_world(_world, 4, tmp_path_factory.mktemp("hf") / "out.pt"))
    return _WORLDS


def _check(got: dict, want: dict, what: str) -> None:
    assert abs(got["loss"] - want["loss"]) <= 1e-6 * max(1.0, abs(want["loss"])), \
        f"{what}: loss {got['loss']!r} vs HF's {want['loss']!r}"
    names = set(want["grads"])
    tied = {n for n in names if n.endswith("lm_head.weight") and what.split()[0] in TIED}
    assert set(got["grads"]) == names - tied, f"{what}: names differ: {sorted(set(got['grads']) ^ (names - tied))}"
    for n in names - tied:
        w, g = want["grads"][n].float(), got["grads"][n].float()
        err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
        assert err <= 1e-5, f"{what}: gradient of {n} off by {err:.2e} (relative to its largest element)"


@pytest.mark.multiproc
@pytest.mark.parametrize("p, family", [(2, f) for f in RUNTIME_FAMILIES] + [(4, f) for f in AT_P4])
def test_each_family_loop_and_v_with_offload_gives_hf_loss_and_gradients(worlds, p, family):
    """Every runtime family at p = 2, two of them also at p = 4: 1F1B and ZB-V with offload."""
    want = reference(family, p)
    for name in SCHEDULES:
        _check(worlds[p][(family, name)], want, f"{family} {name} p={p}")


@pytest.mark.multiproc
def test_packed_sequences_on_the_runtime_give_hf_loss(worlds):
    model = build("llama", _layers(2))
    x, _, labels = packed_batch()
    with torch.no_grad():
        # use_cache=False: with a cache, HF's mask functions do not look for packed sequences
        want = sum(model(**xm, labels=lm, use_cache=False).loss.item() for xm, lm in _micro(x, labels)) / M
    assert abs(worlds[2]["packed"] - want) <= 1e-6 * want, (worlds[2]["packed"], want)


@pytest.mark.parametrize("family", FAMILIES)
def test_stages_in_sequence_give_hf_loss_exactly_padded_or_not(family):
    for padded in (True, False):
        model = build(family, 4)
        x, y, labels = batch(1, padded=padded)
        with torch.no_grad():
            want = model(**x, labels=labels).loss
            got = causal_lm_loss(sequential(split_causal_lm(model, 3), x), y)
        assert torch.equal(got, want), f"{family} padded={padded}: {got.item()} vs HF's {want.item()}"


def test_an_unknown_model_or_feature_is_refused_naming_what_is_missing():
    from pipeoffload.errors import ParameterError

    cfg = transformers.CodeGenConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4)
    with pytest.raises(ParameterError, match=r"model: no splitting recipe for model_type 'codegen'"):
        split_causal_lm(transformers.CodeGenForCausalLM(cfg), 2)
    jet = build("jetmoe")
    jet.config.output_router_logits = True
    with pytest.raises(ParameterError, match=r"output_router_logits is set, but jetmoe's router loss is its own"):
        split_causal_lm(jet, 2)
    with pytest.raises(ParameterError, match=r"give the \.\.\.ForCausalLM"):
        split_causal_lm(build("llama").model, 2)
    gpt2 = build("gpt2")
    gpt2.config.add_cross_attention = True
    with pytest.raises(ParameterError, match="add_cross_attention"):
        split_causal_lm(gpt2, 2)
    llama = build("llama")
    llama.model.extra = torch.nn.Linear(2, 2)
    with pytest.raises(ParameterError, match="submodules the recipe does not know: extra"):
        split_causal_lm(llama, 2)
    with pytest.raises(ParameterError, match=r"layers_per_stage: expected 2 non-negative ints summing to the "
                                             r"model's 4 decoder layers, got \[1, 2\]"):
        split_causal_lm(build("llama"), 2, layers_per_stage=[1, 2])
    with pytest.raises(ParameterError, match="4 decoder layers cannot fill 5 stages"):
        split_causal_lm(build("llama"), 5)


def test_partition_counts_embedding_and_head_and_can_be_given():
    from pipeoffload.models.config import balanced_ranges
    from pipeoffload.models.hf import layer_costs, stage_costs

    model = build("llama", 8)
    costs, first, last = layer_costs(model)
    with pytest.warns(DeprecationWarning, match="stage_costs is deprecated; use layer_costs"):
        assert stage_costs(model) == (costs, first, last)  # the old name
    layer = sum(q.numel() for q in model.model.layers[0].parameters())
    assert costs == [layer] * 8 and first == 64 * 32 and last == 64 * 32 + 32  # embedding; head + final norm
    stages = split_causal_lm(model, 4)
    want = balanced_ranges(costs, 4, first, last)
    assert [list(s.model.layers) for s in stages] == [[str(i) for i in r] for r in want]
    moe = build("qwen2_moe", 2)  # experts count by the share a token uses (2 of 4)
    ex = sum(q.numel() for n, q in moe.model.layers[0].named_parameters() if ".experts." in f".{n}")
    full = sum(q.numel() for q in moe.model.layers[0].parameters())
    assert layer_costs(moe)[0][0] == full - ex / 2
    given = split_causal_lm(model, 4, layers_per_stage=[0, 4, 4, 0])
    assert [list(s.model.layers) for s in given] == [[], ["0", "1", "2", "3"], ["4", "5", "6", "7"], []]
    x, y, labels = batch(2)
    with torch.no_grad():
        assert torch.equal(causal_lm_loss(sequential(given, x), y), model(**x, labels=labels).loss)


def test_packed_sequences_cross_stages_and_stay_apart():
    """Two sequences packed in one row (position ids restart, no mask): the loss of each
    position equals the loss of its sequence run alone (the mask functions see the
    positions in every stage)."""
    model = build("mistral", 4)
    x, y, _ = batch(3, rows=2, seq=12, padded=False)
    ids = x["input_ids"]
    packed = {"input_ids": ids.reshape(1, -1), "position_ids": torch.arange(12).repeat(2)[None]}
    targets = y.reshape(1, -1)
    with torch.no_grad():
        got = F.cross_entropy(sequential(split_causal_lm(model, 2), packed)[0], targets[0], reduction="none",
                              ignore_index=-100)
        alone = F.cross_entropy(model(input_ids=ids).logits.reshape(24, -1), y.reshape(-1), reduction="none",
                                ignore_index=-100)
    torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-6)


def test_causal_mask_for_eager_attention_is_additive():
    from pipeoffload.models.hf_llama import causal_mask

    pad = torch.tensor([[1, 1, 0]])
    add = causal_mask(pad, 1, 3, torch.device("cpu"), dtype=torch.float32)
    low = torch.finfo(torch.float32).min
    assert add.dtype == torch.float32
    assert add[0, 0].tolist() == [[0.0, low, low], [0.0, 0.0, low], [0.0, 0.0, low]]
    assert causal_mask(pad, 1, 3, torch.device("cpu")).dtype == torch.bool
    # a bool 4D mask handed to a stage of an eager-attention model is refused, not added as 0/1
    from pipeoffload.errors import ParameterError

    model = build("gemma2", 2)
    x, _, _ = batch(0, rows=1, seq=3)
    x["attention_mask"] = causal_mask(pad, 1, 3, torch.device("cpu"))
    with pytest.raises(ParameterError, match="inputs: attention_mask is a boolean .* eager"):
        split_causal_lm(model, 2)[0](x)
