"""The runtime on real processes (gloo, CPU): every schedule in the registry gives
the same losses, gradients and updated parameters as plain single-process training,
its measured activation memory matches the simulator's prediction, and a rank that
never sends makes its peer fail within the timeout, naming rank, op and peer.

To keep CI fast one 4-rank world is spawned once and runs every case: every schedule at
p = 4 on the world, then at p = 2 on two pipelines at once (process groups [0, 1] and [2, 3]).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers import ALL_SCHEDULES, import_torch, torch_dualpipev_csv, train_steps

torch = import_torch()
dist = import_torch("torch.distributed")

from pipeoffload.interop.torch_csv import read_csv  # noqa: E402
from pipeoffload.ir import OVERLAP  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_reference, build_stage, lm_loss  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.runtime.launcher import LaunchError, launch  # noqa: E402
from pipeoffload.training.checkpoint import _candidates_of_rank0  # noqa: E402
from pipeoffload.training.measure import gather_results, group_medians, predict  # noqa: E402
from pipeoffload.runtime.p2p import CommError, CommTimeout  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

pytestmark = pytest.mark.multiproc

CFG = ModelConfig(layers=8, hidden=32, heads=4, kv_heads=2, seq_len=16, seed=3)
M, MB, STEPS, LR = 8, 2, 3, 0.5
TORCH_CSV = "torch-csv:DualPipeV"  #: the world's result key of torch's own DualPipeV CSV, read and run


def _data(step):
    return ByteCorpus(load_corpus(), CFG.seq_len, seed=1).microbatches(step, M, MB)


def _schedule_share(sched, group=None, **kw) -> dict:
    """STEPS SGD steps of ``sched`` on this rank of the pipeline ``group`` (None: the world):
    what this rank saw, merged with its pipeline's other ranks by :func:`_merged`."""
    t = train_steps(sched, CFG, _data, steps=STEPS, lr=LR, group=group, **kw)
    return {"rank": t.runner.rank, "losses": [r.loss for r in t.results], "grads": t.first_grads,
            "params": t.params(), "result": t.first, "live": t.runner.meter.live_bytes(),
            "pending": t.runner.wg.pending(), "pairs": len(sched.params.get(OVERLAP, ())),
            "one_op": len(t.runner._plan.overlapped)}


def _torch_csv_share(ctx, path, p, group=None) -> dict:
    """torch's own DualPipeV, lowered and dumped by torch (every action of its grammar),
    read back and run with each pair as one op."""
    csv_path = Path(path).parent / f"torch-dualpipev-{ctx.rank}.csv"
    sched = read_csv(torch_dualpipev_csv(p, M, csv_path))
    return _schedule_share(sched, group, overlap_pairs=True)


def _merged(name: str, p: int, parts: list[dict]) -> dict:
    """A pipeline's shares of one case (in pipeline-rank order) as one result; a registry
    schedule's also with the simulator's peak, fed the measured per-op times and bytes."""
    out = {"losses": next(g["losses"] for g in parts if g["losses"][0] is not None),
           "grads": {k: v for g in parts for k, v in g["grads"].items()},
           "params": {k: v for g in parts for k, v in g["params"].items()}}
    if name == TORCH_CSV:
        return {**out, "pairs": parts[0]["pairs"], "one_op": sum(g["one_op"] for g in parts)}
    sched = generate(name, p=p, m=M)
    costs, deltas = group_medians([x for g in parts for x in g["result"].samples], sched.num_stages)
    return {**out, "peak": [g["result"].peak_memory for g in parts],
            "predicted_peak": predict(sched, costs, deltas).peak_memory(),
            "live": [g["live"] for g in parts], "pending": [g["pending"] for g in parts]}


def _world(ctx, path):
    """One 4-rank world: every registry schedule and torch's DualPipeV CSV at p = 4 on the
    world, then at p = 2 on two pipelines at once (process groups [0, 1] and [2, 3], the
    schedules shared between them); the user's modules on the first, last the rank that
    never sends on the second (its transport is spent after the timeout). Each rank keeps
    its share of every case, (p, case) -> share; one gather at the end, merged on rank 0."""
    assert ctx.world_size == 4, ctx.world_size
    mine: dict = {}
    for name in ALL_SCHEDULES:
        mine[(4, name)] = _schedule_share(generate(name, p=4, m=M))
    mine[(4, TORCH_CSV)] = _torch_csv_share(ctx, path, 4)
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    k = ctx.rank // 2
    for name in ALL_SCHEDULES[k::2]:
        mine[(2, name)] = _schedule_share(generate(name, p=2, m=M), groups[k])
    if k == 0:
        mine[(2, "user-modules")] = _user_modules_share(groups[k])
    else:
        # gather_results on a group without global rank 0: its first member collects
        mine["group_gather"] = gather_results(ctx.rank, groups[k])
        # and a checkpoint listing broadcast from it (load_latest's first collective)
        own = Path(path).parent / f"ckpt-rank{ctx.rank}"  # global rank 2 has step 7, rank 3 nothing
        (own / ("step-7" if ctx.rank == 2 else "")).mkdir(parents=True, exist_ok=True)
        mine["group_broadcast"] = [s for s, _ in _candidates_of_rank0(own, 2, groups[k])]
        mine[(2, TORCH_CSV)] = _torch_csv_share(ctx, path, 2, groups[k])
        mine["timeout"] = _timeout_share(groups[k])
    got = gather_results(mine)
    if ctx.rank == 0:
        out: dict = {2: {}, 4: {}, "timeout": next(g["timeout"] for g in got if g.get("timeout") is not None),
                     "group_gather": [g["group_gather"] for g in got if "group_gather" in g],
                     "group_broadcast": [g["group_broadcast"] for g in got if "group_broadcast" in g]}
        for key in {key for g in got for key in g if key not in ("timeout", "group_gather", "group_broadcast")}:
            p, name = key
            parts = sorted((g[key] for g in got if key in g), key=lambda share: share["rank"])
            assert [share["rank"] for share in parts] == list(range(p)), (key, [share["rank"] for share in parts])
            out[p][name] = _user_modules_merged(parts) if name == "user-modules" else _merged(name, p, parts)
        torch.save(out, path)


WIDTHS = [5, 9, 3, 7, 1]  # boundary shapes differ per layer group


def _mlp_stages():
    """Four float64 layer groups of different widths, deterministic."""
    mods = []
    for s in range(4):
        torch.manual_seed(100 + s)
        mods.append(torch.nn.Sequential(torch.nn.Linear(WIDTHS[s], WIDTHS[s + 1]), torch.nn.Tanh()).double())
    return mods


def _mlp_data():
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(3, WIDTHS[0], generator=g, dtype=torch.float64) for _ in range(4)]
    ys = [torch.randn(3, WIDTHS[-1], generator=g, dtype=torch.float64) for _ in range(4)]
    return xs, ys


def _user_modules_share(group) -> dict:
    """A user's module list (all four given; each rank picks its own), loop and V
    placements; under the suite's NCCL-rules emulation and on torch's own transport
    (plain gloo), which the rest of the suite does not use. This rank's share."""
    res = {}
    for name in ("interleaved-1f1b", "zb-v"):
        for transport in (None, "torch"):
            sched = generate(name, p=2, m=4)
            mods = _mlp_stages()
            runner = PipelineRunner(mods, torch.nn.functional.mse_loss, sched, timeout_s=60, transport=transport,
                                    group=group)
            assert runner.p2p.transport.name == (transport or "nccl-rules")
            held, sent, issue = [0], [0], runner.p2p.issue  # send buffers held after each group; all sent

            def watched(items, keys=None):
                works = issue(items, keys)
                held.append(len(runner.p2p._sends))
                sent[0] += sum(send for send, *_ in items)
                return works

            runner.p2p.issue = watched
            xs, ys = _mlp_data()
            r = runner.step(xs, ys)
            res[f"{name}/{transport or 'nccl-rules'}"] = {
                "loss": r.loss, "grads": {f"{s}.{n}": p.grad.clone() for s in runner.my_stages
                                          for n, p in mods[s].named_parameters()},
                "held": (max(held), sent[0], len(runner.p2p._sends))}
    return {"rank": runner.rank, "cases": res}


def _user_modules_merged(parts: list[dict]) -> dict:
    """The pipeline's shares of the user-module cases, by case: the loss, every gradient,
    and per rank (send buffers held at most, sends, left after the step)."""
    return {case: {"loss": next(g["cases"][case]["loss"] for g in parts if g["cases"][case]["loss"] is not None),
                   "grads": {k: v for g in parts for k, v in g["cases"][case]["grads"].items()},
                   "held": [g["cases"][case]["held"] for g in parts]}
            for case in parts[0]["cases"]}


def test_user_modules_with_changing_shapes_and_dtype(tmp_path_factory):
    res = world(2, tmp_path_factory)["user-modules"]
    mods = _mlp_stages()
    model = torch.nn.Sequential(*mods)
    xs, ys = _mlp_data()
    loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in zip(xs, ys)) / len(xs)
    loss.backward()
    assert set(res) == {f"{n}/{t}" for n in ("interleaved-1f1b", "zb-v") for t in ("nccl-rules", "torch")}
    for name, r in res.items():
        assert abs(r["loss"] - loss.item()) < 1e-12, name
        # Send buffers are freed during the step once the program says their receiver has
        # them (passes/comm.py send_retirements) -- on plain gloo too, whose works report
        # completion only when waited for -- and none is left after it.
        for held, sends, left in r["held"]:
            assert held <= sends // 2 and left == 0, (name, r["held"])
        for s, mod in enumerate(mods):
            for n, p in mod.named_parameters():
                torch.testing.assert_close(r["grads"][f"{s}.{n}"], p.grad, rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def reference():
    model = build_reference(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(STEPS):
        xs, ys = _data(step)
        loss = sum(lm_loss(model(x), y) for x, y in zip(xs, ys)) / M
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"losses": losses, "grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


_WORLDS: dict = {}


def world(p, tmp_path_factory):
    """The world's results at pipeline size ``p`` (2 or 4), or ``"timeout"``'s or ``"group_gather"``'s; launched once."""
    if not _WORLDS:
        path = tmp_path_factory.mktemp("world") / "out.pt"
        t = time.perf_counter()
        launch(_world, 4, (str(path),), backend="gloo", init_timeout_s=120)
        _WORLDS.update(torch.load(path))
        print(f"world: {len(_WORLDS[4])} + {len(_WORLDS[2])} cases in {time.perf_counter() - t:.1f} s")
    return _WORLDS[p]


def _schedule_results(res):
    return {k: v for k, v in res.items() if k not in ("user-modules", TORCH_CSV)}


@pytest.mark.parametrize("p", [2, 4])
def test_torchs_dualpipev_csv_runs_like_single_process_training(p, reference, tmp_path_factory):
    r = world(p, tmp_path_factory)[TORCH_CSV]
    assert r["one_op"] == r["pairs"] > 0  # its OVERLAP_F_B cells ran as overlapped pairs, each as one op
    for a, b in zip(r["losses"], reference["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b), f"losses {r['losses']} vs {reference['losses']}"
    for n, g in reference["grads"].items():
        _close(r["grads"][n], g, f"torch DualPipeV CSV p={p} grad of {n}")
    for n, w in reference["params"].items():
        _close(r["params"][n], w, f"torch DualPipeV CSV p={p} parameter {n} after {STEPS} SGD steps")


def _close(a, b, what):
    scale = b.abs().max().item()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("p", [2, 4])
def test_every_schedule_matches_single_process_training(p, reference, tmp_path_factory):
    res = _schedule_results(world(p, tmp_path_factory))
    assert set(res) == set(ALL_SCHEDULES)
    for name, r in res.items():
        for a, b in zip(r["losses"], reference["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), f"{name}: losses {r['losses']} vs {reference['losses']}"
        assert set(r["grads"]) == set(reference["grads"]), name
        for n, g in reference["grads"].items():
            _close(r["grads"][n], g, f"{name} p={p} grad of {n}")
        for n, w in reference["params"].items():
            _close(r["params"][n], w, f"{name} p={p} parameter {n} after {STEPS} SGD steps")
        assert r["live"] == [0] * p and r["pending"] == [0] * p, f"{name}: memory left after the step"


@pytest.mark.parametrize("p", [2, 4])
def test_measured_peak_memory_matches_the_simulator(p, tmp_path_factory):
    for name, r in _schedule_results(world(p, tmp_path_factory)).items():
        for rank, (got, want) in enumerate(zip(r["peak"], r["predicted_peak"])):
            assert want > 0
            assert abs(got - want) <= 0.10 * want, f"{name} rank {rank}: measured {got} vs predicted {want}"


def test_peak_memory_ordering_follows_theory(tmp_path_factory):
    res = _schedule_results(world(4, tmp_path_factory))
    peak = {name: max(r["peak"]) for name, r in res.items()}
    assert set(peak) == set(ALL_SCHEDULES)
    # V-Min (~1/3 of 1F1B's) < V-Half (~1/2) < 1F1B
    assert peak["v-min"] < peak["v-half"] < peak["1f1b"], peak
    # GIS (g = p/2) < 1F1B < interleaved 1F1B < GPipe (m > p)
    assert peak["group-interleaved"] < peak["1f1b"] < peak["interleaved-1f1b"] < peak["gpipe"], peak
    # ZB-H1 keeps 1F1B's memory, ZB-H2 up to 2p - 1
    assert peak["zb-h1"] < peak["zb-h2"], peak


class _HangInStep(torch.nn.Module):
    """A layer group that stalls once training starts (setup runs under no_grad)."""

    def __init__(self, inner, seconds):
        super().__init__()
        self.inner, self.seconds = inner, seconds

    def forward(self, x):
        if torch.is_grad_enabled():
            time.sleep(self.seconds)
        return self.inner(x)


def _timeout_share(group) -> dict:
    """A 1F1B step whose rank 1 stalls 3.5 s in its forward, against a 1.5 s timeout: the
    error rank 0 raised (type, text) and how long it took (None on rank 1)."""
    sched = generate("1f1b", p=2, m=2)
    xs, ys = _data(0)
    xs, ys = xs[:2], ys[:2]

    def stage(s):
        mod = build_stage(CFG, s, 2)
        return _HangInStep(mod, 3.5) if s == 1 else mod

    runner = PipelineRunner(stage, lm_loss, sched, timeout_s=1.5, group=group)
    t = time.perf_counter()
    try:
        runner.step(xs, ys)
        msg = None
    except CommError as e:
        msg = (type(e).__name__, str(e))
    return {"msg": msg, "elapsed": time.perf_counter() - t} if runner.rank == 0 else None


def test_a_rank_that_never_sends_times_out_naming_rank_op_and_peer(tmp_path_factory):
    out = world("timeout", tmp_path_factory)  # the last case of the world's second pipeline, ranks 2 and 3
    assert out["msg"] is not None, "rank 0 did not time out"
    kind, msg = out["msg"]
    assert kind == CommTimeout.__name__
    assert "rank 0" in msg and "RECV_B(stage=0, mb=0" in msg and "rank 1" in msg, msg
    assert out["elapsed"] < 1.5 + 3.0


def test_gather_results_on_a_group_without_global_rank_0(tmp_path_factory):
    """``gather_results`` over process group [2, 3]: the group's first member (global rank 2)
    gets both objects in group order, the other None (``dst`` is the group's, not global rank 0)."""
    assert world("group_gather", tmp_path_factory) == [[2, 3], None]


def test_checkpoint_listing_is_broadcast_from_a_groups_first_rank(tmp_path_factory):
    """``load_latest``'s listing over process group [2, 3]: both ranks get global rank 2's."""
    assert world("group_broadcast", tmp_path_factory) == [[7], [7]]


def _failing_world(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    sched = generate("1f1b", p=2, m=2)
    runner = PipelineRunner(lambda s: build_stage(CFG, s, 2), lm_loss, sched, timeout_s=60)
    xs, ys = _data(0)
    runner.step(xs[:2], ys[:2])


def test_a_failed_rank_does_not_leave_the_others_hanging():
    t = time.perf_counter()
    with pytest.raises(LaunchError) as e:
        launch(_failing_world, 2, backend="gloo", init_timeout_s=60)
    assert e.value.rank == 1 and "boom on purpose" in str(e.value)
    assert time.perf_counter() - t < 30  # rank 0 was stopped, not left waiting 60 s


# ----------------------------------------------------------------------------- DualPipeV's overlapped pairs: speed

BIG = ModelConfig(layers=8, hidden=256, heads=8, kv_heads=4, seq_len=128, seed=3)


def _overlap_speed_world(ctx, path, rounds):
    """DualPipeV with its pairs run as one op and as two (the runner's default),
    alternating steps; each step's time is the slowest rank's."""
    sched = generate("dualpipev", p=ctx.world_size, m=8)
    S = sched.num_stages
    runners = {k: PipelineRunner(lambda s: build_stage(BIG, s, S), lm_loss, sched, timeout_s=120,
                                 overlap_pairs=k == "one op")
               for k in ("one op", "apart")}
    times = {k: [] for k in runners}
    for i in range(rounds):
        xs, ys = ByteCorpus(load_corpus(), BIG.seq_len, seed=1).microbatches(i, 8, 2)
        for k in (("one op", "apart") if i % 2 else ("apart", "one op")):
            r = runners[k].step(xs, ys)
            if i >= 2:  # warm-up
                times[k].append(r.step_time)
    got = gather_results(times)
    if ctx.rank == 0:
        torch.save({k: [max(g[k][j] for g in got) for j in range(len(got[0][k]))] for k in times}, path)


@pytest.mark.bench
@pytest.mark.parametrize("p", [2])
def test_overlapped_pairs_by_default_no_slower_than_one_op_on_cpu(p, tmp_path):
    import statistics

    path = tmp_path / "speed.pt"
    launch(_overlap_speed_world, p, (str(path), 14), backend="gloo", init_timeout_s=120)
    t = torch.load(path)
    one, apart = statistics.median(t["one op"]), statistics.median(t["apart"])
    print(f"dualpipev p={p} m=8 CPU step: pairs as one op {one * 1e3:.1f} ms, as two (default) {apart * 1e3:.1f} ms "
          f"(medians of {len(t['apart'])})")
    assert apart <= 1.05 * one, (apart, one)
