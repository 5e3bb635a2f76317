"""How much CPU each pipeline runtime spends besides the model's own compute (docs/bench.md).

For one shared schedule (the set-up of ``pipeoffload bench``: same model, data,
microbatches, one intra-op thread per rank, gloo), every rank measures, per step:

- **plain**: the same layer groups run with no pipeline runtime at all, in one loop on
  this rank: each microbatch's forward and its backward (the loss on the last layer
  group, a fixed upstream gradient elsewhere), under the same saved-tensor meter both
  runtimes carry — the compute floor;
- **ours** and **torch**: the main thread's CPU time of one ``step`` of our runtime and of
  torch's, alternated step by step (waits block without using CPU, so this is compute
  plus each runtime's own work); and the whole process's CPU time of that step
  (``proc``: the main thread plus gloo's I/O threads and any other thread of the rank).

``ours − plain`` and ``torch − plain`` are the runtimes' overheads. Their difference,
divided by torch's step time, bounds how far below 1.0 the ratio ``ours/torch`` of
``pipeoffload bench`` can go on that schedule when both run the same order: a runtime
with no overhead at all cannot beat torch by more than torch's own overhead.

    python benchmarks/bench_overhead.py -p 2 --schedule 1f1b --steps 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _plain_cpu(ctx: Any, cfg: Any, stages: list[int], num_stages: int, xs: list, ys: list) -> float:
    """Main-thread CPU (s) of the forwards and backwards of ``stages`` for every microbatch."""
    import torch

    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime.meter import SavedTensorMeter

    meter = SavedTensorMeter([])
    hooks = meter.saved_tensor_hooks()
    mods = {s: build_stage(cfg.model, s, num_stages) for s in stages}
    m = len(xs)
    c0 = time.thread_time()
    for s, mod in mods.items():
        for j in range(m):
            if s == 0:
                x = xs[j]
            else:  # a received activation: the hidden state, needing a gradient
                x = torch.randn(xs[j].shape + (cfg.model.hidden,), requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                y = mod(x)
            if s == num_stages - 1:
                (lm_loss(y, ys[j]) / m).backward()
            else:
                y.backward(torch.ones_like(y) / m)
    return time.thread_time() - c0


def _worker(ctx: Any, key: str, steps: int, out: str) -> None:
    import torch.distributed as dist

    from pipeoffload.models.data import ByteCorpus, load_corpus
    from pipeoffload.bench.side_by_side import PAIRS, BenchConfig, _contenders
    from pipeoffload.schedules import generate

    cfg = BenchConfig(stages=[ctx.world_size])
    corpus = ByteCorpus(load_corpus(), cfg.model.seq_len, seed=0)
    pr = PAIRS[key]
    sched = generate(pr.ours, p=ctx.world_size, m=cfg.microbatches, **pr.ours_kwargs(ctx.world_size))
    contenders, _ = _contenders(ctx, cfg, pr, sched)
    contenders = {n: contenders[n] for n in ("ours", "torch")}
    mine = list(sched.placement.stages_of(ctx.rank))
    got: dict[str, list[float]] = {"plain": [], "ours": [], "torch": [], "torch_wall": [], "ours_proc": [],
                                   "torch_proc": []}
    for it in range(steps + 1):
        xs, ys = corpus.microbatches(it, cfg.microbatches, cfg.microbatch_size)
        order = list(contenders) if it % 2 == 0 else list(contenders)[::-1]
        for name in order:
            dist.barrier()
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            contenders[name].step(xs, ys)
            cpu, wall, proc = time.thread_time() - c0, time.perf_counter() - t0, time.process_time() - p0
            for q in contenders[name].parameters():
                q.grad = None
            if it:
                got[name].append(cpu)
                got[name + "_proc"].append(proc)
                if name == "torch":
                    got["torch_wall"].append(wall)
        dist.barrier()
        plain = _plain_cpu(ctx, cfg, mine, sched.num_stages, xs, ys)
        if it:
            got["plain"].append(plain)
    med = {k: statistics.median(v) for k, v in got.items()}
    ranks: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(ranks, med)
    if ctx.rank == 0:
        Path(out).write_text(json.dumps(ranks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--ranks", type=int, default=2, help="pipeline ranks (default 2)")
    ap.add_argument("--schedule", default="1f1b", help="a key of `pipeoffload bench --schedules` (default 1f1b)")
    ap.add_argument("--steps", type=int, default=10, help="measured steps of each (default 10)")
    args = ap.parse_args(argv)
    from pipeoffload.bench.side_by_side import PAIRS
    from pipeoffload.runtime.launcher import launch

    if args.schedule not in PAIRS:
        ap.error(f"--schedule: expected one of {', '.join(PAIRS)}, got {args.schedule!r}")
    if args.ranks < 2 or args.steps < 1:
        ap.error("--ranks must be >= 2 and --steps >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "overhead.json")
        launch(_worker, args.ranks, (args.schedule, args.steps, out), backend="gloo", init_timeout_s=120)
        ranks = json.loads(Path(out).read_text())
    print(f"{args.schedule}, p = {args.ranks}: main-thread CPU per step, ms (median of {args.steps})")
    print("| rank | plain | ours | torch | ours overhead | torch overhead | ours proc | torch proc "
          "| torch step (wall) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r, d in enumerate(ranks):
        ms = {k: 1000 * v for k, v in d.items()}
        print(f"| {r} | {ms['plain']:.1f} | {ms['ours']:.1f} | {ms['torch']:.1f} | {ms['ours'] - ms['plain']:+.1f} "
              f"| {ms['torch'] - ms['plain']:+.1f} | {ms['ours_proc']:.1f} | {ms['torch_proc']:.1f} "
              f"| {ms['torch_wall']:.1f} |")
    worst = max(ranks, key=lambda d: d["torch_wall"])
    bound = 1 - (worst["torch"] - worst["plain"]) / worst["torch_wall"]
    print(f"\nLowest ratio ours/torch a zero-overhead runtime could reach (same order, busiest rank): {bound:.3f}")
    return 0


if __name__ == "__main__":  # the ranks are spawned: the guard keeps them from re-running this
    sys.exit(main())
