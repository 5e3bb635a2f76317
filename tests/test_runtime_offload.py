"""Activation offload in the runtime (OffloadStore driven by the offload pass's ops).

One gloo world (p = 2, spawned once) runs every registry schedule twice — without
and with offload of every chunk — and checks, on each rank, that losses and
gradients are bitwise identical (fp32, CPU); that the measured resident activation
peak matches the simulator + offload pass fed the measured per-op bytes within 10%;
that the peak falls as more chunks are offloaded; and that recompute moves fewer
bytes with identical bits. Local (p = 1) tests cover the store itself: aliases,
pass-through, real release of device storage, the host pool, and the errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from helpers import ALL_SCHEDULES, import_torch, load_benchmark, train_steps

torch = import_torch()

from pipeoffload.ir import Op, OpKind  # noqa: E402
from pipeoffload.models import ModelConfig  # noqa: E402
from pipeoffload.models.data import ByteCorpus, load_corpus  # noqa: E402
from pipeoffload.models.transformer import build_stage, lm_loss  # noqa: E402
from pipeoffload.passes.offload import plan_offload  # noqa: E402
from pipeoffload.training.config import TrainConfig  # noqa: E402
from pipeoffload.runtime.executor import PipelineRunner  # noqa: E402
from pipeoffload.runtime.launcher import launch  # noqa: E402
from pipeoffload.training.measure import gather_results, group_medians, group_peaks, predict_offload  # noqa: E402
from pipeoffload.runtime.offload_store import OffloadError, OffloadStore  # noqa: E402
from pipeoffload.schedules import generate  # noqa: E402

CFG = ModelConfig(layers=4, hidden=32, heads=4, kv_heads=2, seq_len=32, seed=11)
M, MB, STEPS, LR = 4, 2, 2, 0.5


def _data(step, m=M):
    return ByteCorpus(load_corpus(), CFG.seq_len, seed=4).microbatches(step, m, MB)


# ----------------------------------------------------------------------------- the gloo world


def _train(sched, store):
    """STEPS SGD steps on this rank (helpers.train_steps with this module's model and data)."""
    return train_steps(sched, CFG, _data, steps=STEPS, lr=LR, store=store)


def _outcome(t):
    """(per-microbatch losses of every step, first-step gradients) of a helpers.Trained run."""
    return [r.losses for r in t.results], t.first_grads


def _bitwise(a, b):
    la, ga = a[0], a[1]
    lb, gb = b[0], b[1]
    return la == lb and ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


def _run_world(ctx, path):
    out = {}
    for name in ALL_SCHEDULES:
        sched = generate(name, p=ctx.world_size, m=M)
        plain = _train(sched, None)
        C = sched.chunks
        plan = plan_offload(sched, offload_chunks=C, on_infeasible="skip")
        store = OffloadStore()
        off = _train(plan.schedule, store)
        res, runner = off.last, off.runner
        got = gather_results({"bitwise": _bitwise(_outcome(plain), _outcome(off)), "peak": res.peak_memory,
                              "peak_plain": plain.last.peak_memory, "samples": res.samples,
                              "stats": res.meta["offload"], "live": runner.meter.live_bytes(),
                              "kept": res.meta["offload"]["kept_bytes"],
                              "in_use": store.pool.in_use})
        if ctx.rank == 0:
            costs, deltas = group_medians([x for g in got for x in g["samples"]], sched.num_stages)
            moved = {st: b for g in got for st, b in g["stats"]["moved_by_stage"].items()}
            tl, _ = predict_offload(sched, costs, deltas, offload_chunks=C, moved=moved)  # the pass, re-planned
            ran, _ = predict_offload(sched, costs, deltas, moved=moved, program=plan.schedule,  # as issued
                                     peaks=group_peaks([x for g in got for x in g["samples"]], sched.num_stages))
            out[name] = {"bitwise": [g["bitwise"] for g in got], "peak": [g["peak"] for g in got],
                         "peak_plain": [g["peak_plain"] for g in got], "predicted": tl.peak_memory(),
                         "predicted_program": ran.peak_memory(),
                         "predicted_in_op": ran.meta["peak_memory_in_op"],
                         "moved": [g["stats"]["moved_bytes"] for g in got],
                         "host_peak": [g["stats"]["host_peak_bytes"] for g in got],
                         "live": [g["live"] for g in got], "in_use": [g["in_use"] for g in got],
                         "kept": [g["kept"] for g in got]}
    # The peak falls as more chunks are offloaded (each C planned and run for real).
    sweep = {}
    for name in ("interleaved-1f1b", "group-interleaved"):
        sched = generate(name, p=ctx.world_size, m=M, v=2)
        peaks = []
        for C in range(sched.chunks + 1):
            plan = plan_offload(sched, offload_chunks=C, on_infeasible="skip")
            peaks.append(_train(plan.schedule, OffloadStore()).last.peak_memory)
        got = gather_results(peaks)
        if ctx.rank == 0:
            sweep[name] = got
    # Recompute: fewer bytes moved, same bits.
    sched = generate("group-interleaved", p=ctx.world_size, m=M, v=2)
    plan = plan_offload(sched, offload_chunks=2, on_infeasible="skip")
    plain = _train(sched, None)
    rc = _train(plan.schedule, OffloadStore(recompute=True))
    nrc = _train(plan.schedule, OffloadStore())
    got = gather_results({"bitwise": _bitwise(_outcome(plain), _outcome(rc)),
                          "moved": rc.last.meta["offload"]["moved_bytes"],
                          "moved_plain": nrc.last.meta["offload"]["moved_bytes"],
                          "recomputed": rc.last.meta["offload"]["recomputed_bytes"],
                          "samples": rc.last.samples, "peak": rc.last.peak_memory,
                          "by_stage": rc.last.meta["offload"]["moved_by_stage"]})
    if ctx.rank == 0:
        samples = [x for g in got for x in g["samples"]]
        costs, deltas = group_medians(samples, sched.num_stages)
        moved = {st: b for g in got for st, b in g["by_stage"].items()}
        tl, _ = predict_offload(sched, costs, deltas, moved=moved, program=plan.schedule,
                                peaks=group_peaks(samples, sched.num_stages))
        for g, want in zip(got, tl.meta["peak_memory_in_op"]):
            g["predicted"] = want
            del g["samples"]
        torch.save({"schedules": out, "sweep": sweep, "recompute": got, "stash": _stash_cases(ctx)}, path)
    else:
        _stash_cases(ctx)


def _stash_cases(ctx) -> dict:
    """The stash window, B→W (offload pass ``stash=True``): the W stash goes to host after B and
    back before W, on top of the activation window. Per schedule and rank: bitwise
    equality with no offload, and the peaks without offload, with the activation window
    only, and with both."""
    res = {}
    for name in ("zb-h1", "zb-v", "v-half"):
        sched = generate(name, p=ctx.world_size, m=M)
        C = sched.chunks
        act = plan_offload(sched, offload_chunks=C, on_infeasible="skip").schedule
        both = plan_offload(sched, offload_chunks=C, on_infeasible="skip", stash=True).schedule
        plain, a, b = _train(sched, None), _train(act, OffloadStore()), _train(both, OffloadStore())
        got = gather_results({"bitwise": _bitwise(_outcome(plain), _outcome(b)),
                              "stash_ops": sum(op.kind.window == "stash" for op in both.ranks[ctx.rank]),
                              "peaks": (plain.last.peak_memory, a.last.peak_memory, b.last.peak_memory),
                              "moved": b.last.meta["offload"]["stash_moved_bytes"],
                              "pending": b.runner.wg.pending(), "in_use": b.runner.store.pool.in_use})
        if ctx.rank == 0:
            res[name] = got
    return res


_WORLD: dict = {}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not _WORLD:
        path = tmp_path_factory.mktemp("offload") / "out.pt"
        t = time.perf_counter()
        launch(_run_world, 2, (str(path),), backend="gloo", init_timeout_s=120)
        _WORLD.update(torch.load(path))
        print(f"offload world p=2: {time.perf_counter() - t:.1f} s")
    return _WORLD


@pytest.mark.multiproc
def test_offload_gives_bitwise_identical_losses_and_gradients_for_every_schedule(world):
    res = world["schedules"]
    assert set(res) == set(ALL_SCHEDULES)
    for name, r in res.items():
        assert r["bitwise"] == [True, True], f"{name}: offload changed losses or gradients"
        assert sum(r["moved"]) > 0, f"{name}: nothing was offloaded"
        assert r["live"] == [0, 0] and r["in_use"] == [0, 0], f"{name}: memory left after the step"
        # Everything captured moved, the stage input included (nothing else references it).
        assert r["kept"] == [0, 0], f"{name}: bytes left resident {r['kept']}"


@pytest.mark.multiproc
def test_the_w_stash_window_moves_the_stash_with_identical_bits_and_a_lower_peak(world):
    res = world["stash"]
    assert set(res) == {"zb-h1", "zb-v", "v-half"}
    for name, ranks in res.items():
        assert sum(g["stash_ops"] for g in ranks) > 0, f"{name}: the pass planned no stash transfer"
        for r, g in enumerate(ranks):
            assert g["bitwise"], f"{name} rank {r}: losses or gradients differ with the W stash offloaded"
            assert g["pending"] == 0, f"{name} rank {r}: W stash left after the step"
            plain, act, both = g["peaks"]
            assert both <= act <= plain, f"{name} rank {r}: peaks plain/activation/+stash {g['peaks']}"
        # the stash window lowers the pipeline's peak below the activation window alone
        assert max(g["peaks"][2] for g in ranks) < max(g["peaks"][1] for g in ranks), (name, ranks)
        assert sum(g["moved"] for g in ranks) > 0, name


@pytest.mark.multiproc
def test_measured_resident_peak_matches_the_offload_prediction(world):
    for name, r in world["schedules"].items():
        for rank, got in enumerate(r["peak"]):
            for how, tol in (("predicted", 0.10), ("predicted_program", 0.10), ("predicted_in_op", 0.01)):
                want = r[how][rank]
                assert abs(got - want) <= tol * want, f"{name} rank {rank}: measured {got:.0f} vs {how} {want:.0f}"
        # Offload never raises the peak; the host holds what left the device.
        assert all(a <= b for a, b in zip(r["peak"], r["peak_plain"])), name
        assert max(r["host_peak"]) > 0, name


@pytest.mark.multiproc
def test_resident_peak_falls_as_more_chunks_are_offloaded(world):
    for name, per_rank in world["sweep"].items():
        highest = [max(rank_peaks[c] for rank_peaks in per_rank) for c in range(len(per_rank[0]))]
        assert all(a > b for a, b in zip(highest, highest[1:])), f"{name}: peaks by C {highest}"


@pytest.mark.multiproc
def test_recompute_moves_fewer_bytes_with_identical_bits(world):
    for rank, r in enumerate(world["recompute"]):
        assert r["bitwise"], f"rank {rank}: recompute changed the bits"
        assert r["recomputed"] > 0 and r["moved"] < 0.75 * r["moved_plain"], r
        assert abs(r["peak"] - r["predicted"]) <= 0.01 * r["predicted"], r


# ----------------------------------------------------------------------------- one process


@pytest.fixture
def one_thread():
    """In-process runs share 2 cores with whatever else runs: one torch thread avoids
    oversubscription (the spawned worlds set their own)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _local(name="gpipe", v=2, m=3, C=1, store=None, ops=None):
    sched = generate(name, p=1, m=m, v=v)
    if ops is not None:
        sched = sched.with_ranks([ops(sched.ranks[0])])
    elif C is not None:
        sched = plan_offload(sched, offload_chunks=C, on_infeasible="skip").schedule
    store = store if store is not None else OffloadStore()
    runner = PipelineRunner(lambda s: build_stage(CFG, s, sched.num_stages), lm_loss, sched, rank=0,
                            activation_store=store)
    return runner, store


def test_views_reload_as_views_of_the_reloaded_base_and_device_memory_is_really_freed():
    store = OffloadStore()
    store.bind(device=torch.device("cpu"), meter=None, exclude=[], offloaded=[(0, 0)])
    base = torch.randn(64, 64)
    with store.capture(0, 0):
        a = store.pack(0, 0, base)
        b = store.pack(0, 0, base.t()[3:, ::2])  # a strided view of the same storage: an alias
        tiny = torch.randn(8)
        c = store.pack(0, 0, tiny)  # tiny: passes through
        w = torch.nn.Parameter(torch.randn(64, 64))
        d = store.pack(0, 0, w)  # parameter: passes through
    want = base.clone()
    st = base.untyped_storage()
    del base  # only the store holds the storage now
    store.offload_start(0, 0)
    store.offload_end(0, 0)
    assert st.nbytes() == 0, "device storage not released"
    with pytest.raises(OffloadError, match="on the host"):
        store.unpack(0, 0, a)
    store.reload_start(0, 0)
    store.reload_end(0, 0)
    ra, rb = store.unpack(0, 0, a), store.unpack(0, 0, b)
    assert torch.equal(ra, want) and torch.equal(rb, want.t()[3:, ::2])
    assert rb.untyped_storage()._cdata == ra.untyped_storage()._cdata  # a view of the reloaded base
    assert store.unpack(0, 0, c) is not None and torch.equal(store.unpack(0, 0, c), tiny)
    assert store.unpack(0, 0, d).data_ptr() == w.data_ptr()
    store.release(0, 0)
    store.end_step()
    s = store.stats()
    assert s["moved_bytes"] == 64 * 64 * 4 and s["groups"] == 1


def test_a_storage_referenced_elsewhere_stays_resident():
    store = OffloadStore()
    store.bind(device=torch.device("cpu"), meter=None, exclude=[], offloaded=[(0, 0)])
    held = torch.randn(64, 64)  # e.g. a send in flight or the caller's data
    with store.capture(0, 0):
        p = store.pack(0, 0, held * 1)
        q = store.pack(0, 0, held)
    store.offload_start(0, 0)
    store.offload_end(0, 0)
    assert held.untyped_storage().nbytes() == 64 * 64 * 4
    store.reload_start(0, 0)
    store.reload_end(0, 0)
    assert torch.equal(store.unpack(0, 0, q), held) and torch.equal(store.unpack(0, 0, p), held)
    store.release(0, 0)
    store.end_step()
    assert store.stats()["kept_bytes"] == 64 * 64 * 4 and store.stats()["moved_bytes"] == 64 * 64 * 4


def test_host_buffers_are_reused_across_steps_and_the_meter_sees_the_release(one_thread):
    runner, store = _local("gpipe", v=2, m=3, C=2)
    xs, ys = _data(0, 3)
    runner.step(xs, ys)
    misses = store.stats()["pool_misses"]
    assert misses > 0
    res = runner.step(xs, ys)
    s = store.stats()
    assert s["pool_misses"] == misses and s["pool_hits"] >= s["groups"]  # no new host buffer
    assert s["host_reserved_bytes"] >= s["host_peak_bytes"] > 0 and store.pool.in_use == 0
    moved = {e.op.stage: -e.mem for e in res.events if e.op.kind is OpKind.OFFLOAD_END}
    assert moved and all(v > 0 for v in moved.values())
    for e in res.events:  # the meter level drops by exactly the bytes moved, and comes back
        if e.op.kind is OpKind.OFFLOAD_END:
            assert -e.mem == s["moved_by_stage"][e.op.stage]
        if e.op.kind is OpKind.RELOAD_START:
            assert e.mem == s["moved_by_stage"][e.op.stage]
    assert runner.meter.live_bytes() == 0


def _reload_twice(ops):
    out = []
    for op in ops:
        out.append(op)
        if op.kind is OpKind.RELOAD_END:
            out += [Op(OpKind.RELOAD_START, op.stage, op.microbatch, 0, op.chunk),
                    Op(OpKind.RELOAD_END, op.stage, op.microbatch, 0, op.chunk)]
    return out


def _never_reloaded(ops):
    return [op for op in ops if not (op.kind in (OpKind.RELOAD_START, OpKind.RELOAD_END) and op.microbatch == 1)]


def _with_offload(transform):
    def ops(base):
        plan = plan_offload(generate("gpipe", p=1, m=3, v=2), offload_chunks=1, on_infeasible="skip")
        return transform(plan.schedule.ranks[0])
    return ops


@pytest.mark.parametrize("transform,match", [(_reload_twice, "reloaded twice"),
                                             (_never_reloaded, "on the host|never reloaded")])
def test_reloading_twice_or_never_is_an_error(transform, match, one_thread):
    runner, _ = _local(ops=_with_offload(transform))
    xs, ys = _data(0, 3)
    with pytest.raises(OffloadError, match=match):
        runner.step(xs, ys)


def test_an_offload_left_on_the_host_at_the_end_of_the_step_is_an_error():
    store = OffloadStore()
    store.bind(device=torch.device("cpu"), meter=None, exclude=[], offloaded=[(0, 0)])
    with store.capture(0, 0):
        store.pack(0, 0, torch.randn(64, 64))
    store.offload_start(0, 0)
    store.offload_end(0, 0)
    with pytest.raises(OffloadError, match="never reloaded"):
        store.end_step()
    with pytest.raises(OffloadError, match="never offloaded"):
        store.bind(device=torch.device("cpu"), meter=None, exclude=[], offloaded=[(0, 0)])
        with store.capture(0, 0):
            store.pack(0, 0, torch.randn(64, 64))
        store.reload_start(0, 0)


def test_recompute_recomputes_declared_tensors_bitwise_in_one_process(one_thread):
    xs, ys = _data(0, 3)
    grads = []
    moved = []
    for store in (None, OffloadStore(), OffloadStore(recompute=True)):
        runner, st = _local("gpipe", v=2, m=3, C=2 if store is not None else 0, store=store)
        res = runner.step(xs, ys)
        grads.append((res.losses, {n: p.grad for n, p in runner.named_parameters()}))
        moved.append(st.stats()["moved_bytes"])
    assert _bitwise(grads[0], grads[1]) and _bitwise(grads[0], grads[2])
    assert moved[0] == 0 and 0 < moved[2] < 0.75 * moved[1]


# ----------------------------------------------------------------------------- CLI and benchmark


def test_offload_settings_are_checked_before_anything_runs():
    from pipeoffload.errors import ParameterError

    cfg = TrainConfig.load(None, {"offload.offload_chunks": "none"})
    assert cfg.plan_offload(cfg.check()) is None
    plan = TrainConfig().plan_offload(TrainConfig().check())  # the default run offloads (auto)
    assert plan is not None and plan.offloaded_chunks >= 1 and max(plan.peak) < max(plan.peak_no_offload)
    # The library names its own parameters (the CLI maps them to flags: tests/test_bad_input.py).
    for over, param in [({"offload.offload_chunks": 3}, "^offload_chunks:"),
                        ({"offload.offload_chunks": "most"}, "^offload.offload_chunks:"),
                        ({"offload.offload_time": -1.0}, "^offload.offload_time:"), ({"offload.on_infeasible": "x"}, "infeasible")]:
        with pytest.raises(ParameterError, match=param):
            TrainConfig.load(None, over).check()


@pytest.mark.multiproc
def test_train_with_offload_chunks_and_recompute_end_to_end(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--schedule", "zb-v", "-p", "2", "-m", "4", "--steps", "2", "--offload-chunks", "1",
            "--recompute", "--layers", "4", "--hidden", "32", "--seq-len", "32", "--microbatch-size", "2",
            "--no-progress", "--timeout", "60", "-o", str(out)]
    r = subprocess.run([sys.executable, "-m", "pipeoffload"] + args, capture_output=True, text=True, timeout=240,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    off = s["offload"]
    assert off["chunks"] == 1 and off["recompute"] and sum(off["moved_bytes"]) > 0 and sum(off["recomputed_bytes"]) > 0
    for row in s["ranks"]:
        assert abs(row["peak_memory_error"]) < 0.10
    assert "host MiB" in r.stdout and "without recompute" in r.stdout


def test_gpu_offload_benchmark_runs_on_cpu_at_tiny_sizes(capsys, one_thread):
    mod = load_benchmark("bench_offload_gpu")
    res = mod.run(["--device", "cpu", "--tiny", "-p", "2", "-m", "4", "--steps", "1"])
    assert res["bitwise_equal_grads"] and res["max_rel_grad_diff"] == 0.0
    assert res["plan"]["offload_time"] > 0  # planned from the measured op times and copy bandwidth
    plain, off = res["runs"]["no offload"], res["runs"]["offload"]
    assert off["moved_bytes"] > 0 and off["activation_peak_bytes"] < plain["activation_peak_bytes"]
    assert "GB/s" in capsys.readouterr().out
