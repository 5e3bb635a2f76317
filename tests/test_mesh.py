"""Pipeline × data × tensor parallelism on real processes (gloo, CPU): losses and every
gradient (gathered to full tensors) equal plain single-process training on the global
batch, for 1F1B, ZB-H1, ZB-V and group-interleaved, with activation offload.

One 4-rank world runs every 4-rank layout (pipelines on sub-groups, PP2×DP2
replicated — also on a mesh in a shuffled rank order — PP2×DP2 FSDP2, with and without
tied weights, PP2×TP2);
PP2×DP2×TP2 runs in an 8-process world (about 16 s here, so not marked slow).
"""

from __future__ import annotations

import time

import pytest

from helpers import import_torch

torch = import_torch()

import torch.distributed as dist  # noqa: E402

from pipeoffload.errors import ParameterError  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_reference, build_stage, lm_loss  # noqa: E402
from pipeoffload.passes.offload import plan_offload  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.runtime.launcher import launch  # noqa: E402
from pipeoffload.training.measure import gather_results  # noqa: E402
from pipeoffload.runtime.mesh import build_mesh, coords  # noqa: E402
from pipeoffload.runtime.offload_store import OffloadStore  # noqa: E402
from pipeoffload.runtime.tensor_parallel import parallelize_stage  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

pytestmark = pytest.mark.multiproc

CFG = ModelConfig(layers=4, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=5)
M, MB, T = 4, 2, 120.0  # microbatches per pipeline, microbatch size, timeout (s)
SCHEDULES = ("1f1b", "zb-h1", "zb-v", "group-interleaved")


def _global_batch(dp):
    """The step's ``dp·M`` microbatches; replica ``d`` trains on the ``d``-th ``M`` of them."""
    return ByteCorpus(load_corpus(), CFG.seq_len, seed=2).microbatches(0, dp * M, MB)


def _full(t):
    """A gradient as a full tensor (a DTensor gathered: a collective over its mesh)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


TIE = [("embed.weight", "head.weight")]


def _run(name, mesh=None, group=None, dp=1, replica=0, tp_mesh=None, tied=False, recompute=False, **kw):
    """One offloaded training step of ``name`` on this rank; (loss, {name: full gradient}).

    ``tied``: True declares the embedding and the head one parameter (``tie=``), the head
    built equal; "list" gives all layer groups as a list whose head *is* the embedding
    tensor (detected); "differs" declares the tie but the head's last row differs."""
    sched = generate(name, p=2, m=M)
    plan = plan_offload(sched, offload_chunks=sched.chunks, on_infeasible="skip").schedule
    S = sched.num_stages

    def stage(s):
        mod = build_stage(CFG, s, S)
        if tied and mod.head is not None:  # the output head starts as the embedding (declared tied)
            with torch.no_grad():
                mod.head.weight.copy_(build_stage(CFG, 0, S).embed.weight)
                if tied == "differs":
                    mod.head.weight[-1] += 1.0
        return parallelize_stage(mod, tp_mesh) if tp_mesh is not None else mod

    stages = stage
    if tied == "list":
        stages = [build_stage(CFG, s, S) for s in range(S)]
        stages[-1].head.weight = stages[0].embed.weight
    runner = PipelineRunner(stages, lm_loss, plan, mesh=mesh, group=group, timeout_s=T,
                            activation_store=OffloadStore(recompute=recompute),
                            tie=TIE if tied and tied != "list" else None, **kw)
    xs, ys = _global_batch(dp)
    r = runner.step(xs[replica * M:(replica + 1) * M], ys[replica * M:(replica + 1) * M])
    grads = {n: _full(p.grad) for n, p in runner.named_parameters()}
    runner.close()
    return {"loss": r.loss, "grads": grads, "dp_comm_s": r.dp_comm_s, "tp_comm_s": r.tp_comm_s, "coords": runner.coords,
            "offloaded": bool(r.meta.get("offload")), "step_time": r.step_time,
            "dp_started": r.meta.get("dp_started_s", {}), "w_share": max(r.meta["w_share"].values(), default=0.0)}


def _world4(ctx, path):
    out = {}
    # Two pipelines on process groups [0, 1] and [2, 3], no data parallelism.
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    out["groups"] = gather_results(_run("1f1b", group=groups[ctx.rank // 2], dp=2, replica=ctx.rank // 2))
    mesh = build_mesh(pp=2, dp=2)
    d = coords(mesh)["dp"]
    for name in SCHEDULES:
        out[("replicate", name)] = gather_results(_run(name, mesh=mesh, dp=2, replica=d, recompute=True))
    for name in ("1f1b", "zb-v"):  # tied across ranks (1f1b) and on one rank (V: stages 0 and 3)
        out[("tied", name)] = gather_results(_run(name, mesh=mesh, dp=2, replica=d, tied=True))
    # Any rank order: pipelines are global ranks (3, 0) and (1, 2).
    from torch.distributed.device_mesh import DeviceMesh

    shuffled = DeviceMesh("cpu", torch.tensor([[3, 0], [1, 2]]), mesh_dim_names=("dp", "pp"))
    out[("shuffled", "zb-v")] = gather_results(_run("zb-v", mesh=shuffled, dp=2, replica=coords(shuffled)["dp"]))
    for name in SCHEDULES:
        out[("fsdp", name)] = gather_results(_run(name, mesh=mesh, dp=2, replica=d, data_parallel="fsdp"))
    # FSDP with the embedding tied to the head: across ranks (1f1b), on one rank (V),
    # one tensor in a module list (V; FSDP shards each layer group's use apart)
    for name, tied in (("1f1b", True), ("zb-v", True), ("zb-v", "list")):
        out[("fsdp-tied", name, tied)] = gather_results(_run(name, mesh=mesh, dp=2, replica=d, tied=tied,
                                                             data_parallel="fsdp"))
    try:  # the head's last row differs: only replica 1's shard shows it, every rank must say so
        _run("1f1b", mesh=mesh, dp=2, replica=d, tied="differs", data_parallel="fsdp")
        err = None
    except ParameterError as e:
        err = str(e)
    out[("fsdp-tied", "differs")] = gather_results(err)
    for mode in ("replicate", "fsdp"):
        out[("steps", mode)] = gather_results(_train(mesh, d, mode))
    tmesh = build_mesh(pp=2, tp=2)
    for name in SCHEDULES:
        out[("tp", name)] = gather_results(_run(name, mesh=tmesh, tp_mesh=tmesh["tp"]))
    if ctx.rank == 0:
        torch.save(out, path)


def _train(mesh, d, mode):
    """Three SGD steps of ZB-V and an eval step; (losses, eval loss, warnings raised)."""
    import warnings

    sched = generate("zb-v", p=2, m=M)
    runner = PipelineRunner(lambda s: build_stage(CFG, s, 4), lm_loss, sched, mesh=mesh, data_parallel=mode,
                            timeout_s=T)
    opt = torch.optim.SGD(runner.parameters(), lr=0.5)
    xs, ys = _global_batch(2)
    mine = (xs[d * M:(d + 1) * M], ys[d * M:(d + 1) * M])
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        for _ in range(3):
            losses.append(runner.step(*mine).loss)
            opt.step()
            opt.zero_grad()
        ev = runner.eval_step(*mine).loss
    return {"losses": losses, "eval": ev, "warnings": [str(w.message) for w in caught
                                                       if issubclass(w.category, RuntimeWarning)]}


def _world8(ctx, path):
    out = {}
    mesh = build_mesh(pp=2, dp=2, tp=2)
    d = coords(mesh)["dp"]
    for name in ("1f1b", "zb-v"):
        out[("dp-tp", name)] = gather_results(_run(name, mesh=mesh, dp=2, replica=d, tp_mesh=mesh["tp"]))
    if ctx.rank == 0:
        torch.save(out, path)


_WORLDS: dict = {}


def _world(n, tmp_path_factory):
    if n not in _WORLDS:
        path = tmp_path_factory.mktemp(f"mesh{n}") / "out.pt"
        t = time.perf_counter()
        launch(_world4 if n == 4 else _world8, n, (str(path),), backend="gloo", init_timeout_s=120)
        _WORLDS[n] = torch.load(path, weights_only=False)
        print(f"mesh world of {n}: {time.perf_counter() - t:.1f} s")
    return _WORLDS[n]


def _reference(mbs, tied=False):
    """(mean loss, gradients) of plain training on the microbatches ``mbs`` = (xs, ys)."""
    model = build_reference(CFG)
    if tied:
        model.head.weight = model.embed.weight
    xs, ys = mbs
    loss = sum(lm_loss(model(x), y) for x, y in zip(xs, ys)) / len(xs)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters(remove_duplicate=False)}
    return loss.item(), grads


def _check(ranks, ref, what):
    """Every rank's loss (where it has one) and gradients equal the reference within 1e-5;
    a zero-bubble schedule's W ops carried weight gradients on every rank."""
    if "zb" in what:
        assert all(r["w_share"] > 0 for r in ranks), (what, [r["w_share"] for r in ranks])
    loss, grads = ref
    # Each replica reports the mean loss of its own microbatches (as DDP does); TP ranks
    # of one replica report the same value. The global loss is the mean over replicas.
    by_replica: dict = {}
    for r in ranks:
        if r["loss"] is not None:
            by_replica.setdefault(r["coords"]["dp"], []).append(r["loss"])
    assert by_replica, what
    for same in by_replica.values():
        assert max(same) - min(same) <= 1e-6 * abs(loss), (what, same)
    got = sum(v[0] for v in by_replica.values()) / len(by_replica)
    assert abs(got - loss) <= 1e-5 * abs(loss), (what, got, loss)
    seen = set()
    for r in ranks:
        for n, g in r["grads"].items():
            seen.add(n)
            torch.testing.assert_close(g, grads[n], rtol=1e-5, atol=1e-7, msg=lambda m: f"{what} {n}: {m}")
    assert seen == set(grads), (what, set(grads) ^ seen)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    return _world(4, tmp_path_factory)


def test_pipelines_on_process_groups(world4):
    """PipelineRunner(group=...) on pipelines [0, 1] and [2, 3] of a 4-rank world (the
    group's ranks are not global ranks): each pipeline trains its own data correctly."""
    xs, ys = _global_batch(2)
    ranks = world4["groups"]
    for k in range(2):
        _check(ranks[2 * k:2 * k + 2], _reference((xs[k * M:(k + 1) * M], ys[k * M:(k + 1) * M])), f"pipeline {k}")


@pytest.mark.parametrize("name", SCHEDULES)
def test_pp2_dp2_replicated(world4, name):
    ranks = world4[("replicate", name)]
    _check(ranks, _reference(_global_batch(2)), f"PP2×DP2 {name}")
    assert all(r["dp_comm_s"] > 0 for r in ranks)
    assert sorted((r["coords"]["pp"], r["coords"]["dp"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["offloaded"] for r in ranks)
    # Every layer group's reduction was started inside the step, after its last W.
    for r in ranks:
        assert r["dp_started"] and all(0 < t < r["step_time"] for t in r["dp_started"].values()), r
    if name == "zb-v":  # rank 0 holds layer groups 0 and 3: 3's gradients travel while 0's backward runs
        for r in ranks:
            if r["coords"]["pp"] == 0:
                assert r["dp_started"][3] < r["dp_started"][0], r["dp_started"]


@pytest.mark.parametrize("name", ("1f1b", "zb-v"))
def test_pp2_dp2_tied_weights(world4, name):
    """The tie reduction (among pipeline holders) composes with the DP reduction (across replicas)."""
    ranks = world4[("tied", name)]
    loss, grads = _reference(_global_batch(2), tied=True)
    grads = {n: g for n, g in grads.items() if n != "head.weight"}  # one name per shared parameter
    _check(ranks, (loss, grads), f"PP2×DP2 tied {name}")


def test_fsdp_trains_like_replicate(world4):
    """Three optimizer steps on the sharded parameters and an eval step: the same losses
    as replicated DP; the W split is reported as working (no 'W carried nothing' warning)."""
    rep, fs = world4[("steps", "replicate")], world4[("steps", "fsdp")]
    for a, b in zip(rep, fs):
        assert not a["warnings"] and not b["warnings"], (a["warnings"], b["warnings"])
        if a["losses"][0] is None:
            continue
        for x, y in zip(a["losses"] + [a["eval"]], b["losses"] + [b["eval"]]):
            assert abs(x - y) <= 1e-5 * abs(x), (a, b)
        assert a["losses"][2] < a["losses"][0]


def test_mesh_in_any_rank_order(world4):
    ranks = world4[("shuffled", "zb-v")]
    _check(ranks, _reference(_global_batch(2)), "shuffled mesh zb-v")
    # Global rank 3 is (dp 0, pp 0), rank 0 is (dp 0, pp 1), rank 1 (dp 1, pp 0), rank 2 (dp 1, pp 1).
    assert [(r["coords"]["dp"], r["coords"]["pp"]) for r in ranks] == [(0, 1), (1, 0), (1, 1), (0, 0)]


@pytest.mark.parametrize("name", SCHEDULES)
def test_pp2_dp2_fsdp(world4, name):
    ranks = world4[("fsdp", name)]
    _check(ranks, _reference(_global_batch(2)), f"PP2×DP2 FSDP2 {name}")
    assert all(r["dp_comm_s"] > 0 for r in ranks)


@pytest.mark.parametrize("name,tied", (("1f1b", True), ("zb-v", True), ("zb-v", "list")))
def test_pp2_dp2_fsdp_tied_weights(world4, name, tied):
    """FSDP composes with a shared parameter: the reduce-scatter over dp, then the shards
    summed among the pipeline holders (1f1b: ranks 0 and 1; V: both uses on rank 0,
    listed once, counted once per use)."""
    ranks = world4[("fsdp-tied", name, tied)]
    loss, grads = _reference(_global_batch(2), tied=True)
    grads = {n: g for n, g in grads.items() if n != "head.weight"}  # one name per shared parameter
    _check(ranks, (loss, grads), f"PP2×DP2 FSDP2 tied {name} {tied}")
    assert all(r["dp_comm_s"] > 0 for r in ranks)


def test_fsdp_tied_weights_differing_at_start(world4):
    """The start check compares sharded copies shard by shard and agrees across replicas:
    a difference only in replica 1's shard is reported on every rank, naming the tie."""
    errs = world4[("fsdp-tied", "differs")]
    assert len(errs) == 4 and all(e is not None and "tie" in e and "embed.weight" in e for e in errs), errs


@pytest.mark.parametrize("name", SCHEDULES)
def test_pp2_tp2(world4, name):
    ranks = world4[("tp", name)]
    _check(ranks, _reference(_global_batch(1)), f"PP2×TP2 {name}")
    assert all(r["dp_comm_s"] == 0 for r in ranks)
    # the TP collectives DTensor issues inside F/B/W are timed, and only they
    assert all(0 < r["tp_comm_s"] < r["step_time"] for r in ranks), [r["tp_comm_s"] for r in ranks]


@pytest.mark.parametrize("name", ("1f1b", "zb-v"))
def test_pp2_dp2_tp2(tmp_path_factory, name):
    ranks = _world(8, tmp_path_factory)[("dp-tp", name)]
    _check(ranks, _reference(_global_batch(2)), f"PP2×DP2×TP2 {name}")


def test_bad_mesh_arguments():
    """Wrong sizes and modes name the parameter (no process group needed)."""
    sched = generate("1f1b", p=1, m=2)
    with pytest.raises(ParameterError, match="data_parallel"):
        PipelineRunner(lambda s: build_stage(CFG, s, 1), lm_loss, sched, data_parallel="ddp")
    with pytest.raises(ParameterError, match="needs a `mesh`"):
        PipelineRunner(lambda s: build_stage(CFG, s, 1), lm_loss, sched, data_parallel="fsdp")
    with pytest.raises(ParameterError, match="^pp: must be a whole number"):
        build_mesh(0)
