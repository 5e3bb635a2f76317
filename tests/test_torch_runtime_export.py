"""Our schedules that PyTorch lacks run on PyTorch's own runtime.

Each schedule is exported to torch's CSV (``interop.torch_csv.write_csv``), loaded by
``torch.distributed.pipelining``'s ``_PipelineScheduleRuntime._load_csv(path,
format="compute_only")`` over ``PipelineStage``s wrapping our layer groups, and one
``step`` is run on real gloo processes. The gradients (and the loss) must equal those
of our own runtime for the same schedule, weights and data to 1e-5 relative: proof that
the exported orders are valid for the ecosystem's runtime. For V placements torch
infers the stage→rank mapping (stage i and 2p−1−i on rank i) from the CSV rows; the
test checks it took that mapping.

One 4-rank world, spawned once: p = 4 runs every schedule on it; p = 2 one of each class
among them (``P2_SAMPLE``: loop with one layer group per rank, loop with several, V), where
the exported orders are the same generators' at a smaller size, on two pipelines at once
(process groups [0, 1] and [2, 3]).
"""

from __future__ import annotations

import pytest

from helpers import import_torch

torch = import_torch()
dist = import_torch("torch.distributed")
import_torch("torch.distributed.pipelining")

from pipeoffload.interop.torch_csv import to_actions  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_stage, lm_loss  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.runtime.launcher import launch  # noqa: E402
from pipeoffload.training.measure import gather_results  # noqa: E402
from pipeoffload.bench.torch_baseline import torch_runtime_for  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

pytestmark = [
    pytest.mark.multiproc,
    # torch 2.11's _PipelineScheduleRuntime fails over gloo at its stage initialisation
    # ("Pair is not connected" on its first send), CUDA visible or hidden, on the GPU
    # machine (docs/gpu.md); our own runtime passes there. Checked on the pinned 2.13.
    pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
                       reason=f"torch {torch.__version__} < 2.13: torch's _PipelineScheduleRuntime fails over "
                              "gloo at stage initialisation ('Pair is not connected', torch 2.11; docs/gpu.md)"),
]

CFG = ModelConfig(layers=8, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=5)
M, MB = 8, 2
#: Ours only (torch has GPipe, 1F1B, interleaved 1F1B, ZB-1p interleaved, ZB-V, DualPipeV).
NAMES = [("zb-h1", {}), ("zb-h2", {}), ("zb-auto", {}), ("v-min", {}), ("v-half", {}), ("v-zb", {}),
         ("group-interleaved", {}), ("group-interleaved", {"g": "p"})]


#: The p = 2 world's sample: one exported schedule of each class (ZB-H2: loop, one layer
#: group per rank; group-interleaved with g = p: loop, several; V-Min: V placement).
P2_SAMPLE = [("zb-h2", {}), ("group-interleaved", {"g": "p"}), ("v-min", {})]


def _names(p):
    return NAMES if p != 2 else P2_SAMPLE


def _label(name, kw):
    return name + "".join(f" {k}={v}" for k, v in kw.items())


def _resolved(kw: dict, p: int) -> dict:
    """``kw`` with "p" replaced by the pipeline size."""
    return {k: (p if v == "p" else v) for k, v in kw.items()}


def _case(name, kw, p, tmp, group=None, tag=""):
    """One step of ``name`` on our runtime and on torch's (its CSV written under ``tmp``),
    on this rank of the ``p``-rank pipeline ``group`` (None: the world): this rank's share,
    with torch's loaded order and stage mapping on pipeline rank 0."""
    xs, ys = ByteCorpus(load_corpus(), CFG.seq_len, seed=2).microbatches(0, M, MB)
    kw = _resolved(kw, p)
    sched = generate(name, p=p, m=M, **kw)
    S = sched.num_stages
    runner = PipelineRunner(lambda s: build_stage(CFG, s, S), lm_loss, sched, timeout_s=60, group=group)
    ours = runner.step(xs, ys)
    g_ours = {n: q.grad.clone() for n, q in runner.named_parameters()}

    mods = {s: build_stage(CFG, s, S) for s in sched.placement.stages_of(runner.rank)}
    pipe = torch_runtime_for(sched, mods, lm_loss, f"{tmp}/{name}-{len(kw)}-p{p}{tag}.csv", group=group)
    theirs = pipe.step(xs, ys)
    g_torch = {n: q.grad.clone() for n, q in pipe.named_parameters()}
    rel = max(float((g_ours[n] - g).norm() / g.norm()) for n, g in g_torch.items())
    share = {"rank": runner.rank, "rel": rel, "norm": min(float(g.norm()) for g in g_torch.values()),
             "live": (runner.meter.live_bytes(), pipe.meter.live_bytes()),
             "loss": (ours.loss, theirs.loss), "names": sorted(g_ours) == sorted(g_torch)}
    if runner.rank == 0:
        loaded = {r: [str(a) for a in row if a is not None] for r, row in pipe.torch_order.items()}
        share.update(loaded=[loaded[r] for r in range(p)], exported=to_actions(sched.compute_only()),
                     mapping=dict(pipe.schedule.stage_index_to_group_rank),
                     placement=[sched.placement.rank_of(s) for s in range(S)], kind=sched.placement.kind)
    return share


def _merged(parts: list) -> dict:
    """A case's per-rank shares (in pipeline-rank order) as one result."""
    first = parts[0]
    return {"rel": max(g["rel"] for g in parts), "min_norm": min(g["norm"] for g in parts),
            "loss": next(g["loss"] for g in parts if g["loss"][0] is not None),
            "same_names": all(g["names"] for g in parts), "live": [g["live"] for g in parts],
            **{k: first[k] for k in ("loaded", "exported", "mapping", "placement", "kind")}}


def _world(ctx, tmp):
    """One 4-rank world: every schedule at p = 4 on the world, then the p = 2 sample on two
    pipelines at once (process groups [0, 1] and [2, 3], the sample shared between them;
    torch's runtime on a group too). Each rank keeps its share, (p, label) -> share; one
    gather at the end, merged on rank 0 into {p: {label: result}}."""
    assert ctx.world_size == 4, ctx.world_size
    mine = {(4, _label(name, _resolved(kw, 4))): _case(name, kw, 4, tmp) for name, kw in NAMES}
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    k = ctx.rank // 2
    for name, kw in P2_SAMPLE[k::2]:
        mine[(2, _label(name, _resolved(kw, 2)))] = _case(name, kw, 2, tmp, groups[k], tag=f"-g{k}")
    got = gather_results(mine)
    if ctx.rank == 0:
        out: dict = {2: {}, 4: {}}
        for p, label in {key for g in got for key in g}:
            parts = sorted((g[(p, label)] for g in got if (p, label) in g), key=lambda share: share["rank"])
            assert [share["rank"] for share in parts] == list(range(p)), (p, label)
            out[p][label] = _merged(parts)
        torch.save(out, f"{tmp}/result.pt")


_WORLD: dict = {}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"p{p}")
def world(request, tmp_path_factory):
    """(p, {label: result}) of the one world, for p = 2 and p = 4."""
    if not _WORLD:
        tmp = tmp_path_factory.mktemp("export")
        launch(_world, 4, (str(tmp),), backend="gloo", init_timeout_s=60)
        _WORLD.update(torch.load(tmp / "result.pt"))
    return request.param, _WORLD[request.param]


def test_every_exported_schedule_runs_on_torch_runtime_with_our_gradients(world):
    p, res = world
    expected = {_label(name, {k: (p if v == "p" else v) for k, v in kw.items()}) for name, kw in _names(p)}
    assert set(res) == expected, f"schedules missing at p={p}: {expected - set(res)}"
    assert {name for name, _ in NAMES} == {"zb-h1", "zb-h2", "zb-auto", "v-min", "v-half", "v-zb",
                                           "group-interleaved"}
    for label, r in res.items():
        assert r["same_names"], label
        assert r["min_norm"] > 0, f"{label}: a parameter got no gradient on torch's runtime"
        assert all(live == (0, 0) for live in r["live"]), f"{label}: activations still counted after the step"
        assert r["rel"] <= 1e-5, f"{label} p={p}: gradients differ by {r['rel']:.2e} (relative)"
        ours, theirs = r["loss"]
        assert abs(ours - theirs) <= 1e-5 * abs(theirs), (label, ours, theirs)


def test_torch_loaded_exactly_our_order_and_placement(world):
    p, res = world
    for label, r in res.items():
        assert r["loaded"] == r["exported"], label  # _load_csv read back our rows unchanged
        assert [r["mapping"][s] for s in range(len(r["placement"]))] == r["placement"], label
    v = [r for label, r in res.items() if r["kind"] == "v"]
    assert v, "no V-placement schedule ran"
    for r in v:  # torch inferred the V mapping from the rows: stage i and 2p-1-i on rank i
        assert r["placement"] == [min(s, 2 * p - 1 - s) for s in range(2 * p)]
