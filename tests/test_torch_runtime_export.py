"""Our schedules that PyTorch lacks run on PyTorch's own runtime.

Each schedule is exported to torch's CSV (``interop.torch_csv.write_csv``), loaded by
``torch.distributed.pipelining``'s ``_PipelineScheduleRuntime._load_csv(path,
format="compute_only")`` over ``PipelineStage``s wrapping our layer groups, and one
``step`` is run on real gloo processes. The gradients (and the loss) must equal those
of our own runtime for the same schedule, weights and data to 1e-5 relative: proof that
the exported orders are valid for the ecosystem's runtime. For V placements torch
infers the stage→rank mapping (stage i and 2p−1−i on rank i) from the CSV rows; the
test checks it took that mapping.

One spawn per world: p = 4 runs every schedule; p = 2 one of each class among them
(``P2_SAMPLE``: loop with one layer group per rank, loop with several, V), where the
exported orders are the same generators' at a smaller size.
"""

from __future__ import annotations

import pytest

from helpers import import_torch

torch = import_torch()
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


def _world(ctx, tmp):
    xs, ys = ByteCorpus(load_corpus(), CFG.seq_len, seed=2).microbatches(0, M, MB)
    out = {}
    for name, kw in _names(ctx.world_size):
        p = ctx.world_size
        kw = {k: (p if v == "p" else v) for k, v in kw.items()}
        sched = generate(name, p=p, m=M, **kw)
        S = sched.num_stages
        runner = PipelineRunner(lambda s: build_stage(CFG, s, S), lm_loss, sched, timeout_s=60)
        ours = runner.step(xs, ys)
        g_ours = {n: q.grad.clone() for n, q in runner.named_parameters()}

        mods = {s: build_stage(CFG, s, S) for s in sched.placement.stages_of(ctx.rank)}
        pipe = torch_runtime_for(sched, mods, lm_loss, f"{tmp}/{name}-{len(kw)}-p{p}.csv")
        theirs = pipe.step(xs, ys)
        g_torch = {n: q.grad.clone() for n, q in pipe.named_parameters()}
        loaded = {r: [str(a) for a in row if a is not None] for r, row in pipe.torch_order.items()}
        mapping = dict(pipe.schedule.stage_index_to_group_rank)
        rel = max(float((g_ours[n] - g).norm() / g.norm()) for n, g in g_torch.items())
        got = gather_results({"rel": rel, "norm": min(float(g.norm()) for g in g_torch.values()),
                              "live": (runner.meter.live_bytes(), pipe.meter.live_bytes()),
                              "loss": (ours.loss, theirs.loss), "names": sorted(g_ours) == sorted(g_torch)})
        if ctx.rank == 0:
            out[_label(name, kw)] = {
                "rel": max(g["rel"] for g in got), "min_norm": min(g["norm"] for g in got),
                "loss": next(g["loss"] for g in got if g["loss"][0] is not None),
                "same_names": all(g["names"] for g in got), "live": [g["live"] for g in got],
                "loaded": [loaded[r] for r in range(p)], "exported": to_actions(sched.compute_only()),
                "mapping": mapping, "placement": [sched.placement.rank_of(s) for s in range(S)],
                "kind": sched.placement.kind,
            }
    if ctx.rank == 0:
        torch.save(out, f"{tmp}/result.pt")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda p: f"p{p}")
def world(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"export{request.param}")
    launch(_world, request.param, (str(tmp),), backend="gloo", init_timeout_s=60)
    return request.param, torch.load(tmp / "result.pt")


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
