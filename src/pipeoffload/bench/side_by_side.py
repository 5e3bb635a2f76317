"""Side by side with ``torch.distributed.pipelining``: the same model, data,
microbatches and schedule through this project's runtime and through PyTorch's.

For every schedule both offer (:data:`PAIRS`) and every pipeline size ``p``, one
launch of ``p`` ranks builds, on each rank, our :class:`~pipeoffload.runtime.PipelineRunner`
and torch's schedule over *separate copies* of the same layer groups (same seed, so the
same initial weights), then alternates them step by step on the same microbatches
after ``warmup`` steps each: each timed pair runs both on one batch, and who goes first
alternates (ours, torch's; torch's, ours; …) so slow drifts of the machine cancel. A pair's ratio is
(our step time) / (torch's step time), each the slowest rank's wall time of one
``step`` after a barrier. Reported per schedule: the median ratio over the pairs with
its min–max, each side's peak activation memory per rank (both measured by
:class:`~pipeoffload.runtime.meter.SavedTensorMeter`, see
:mod:`pipeoffload.bench.torch_baseline`), the largest loss difference over the pairs
and the largest relative gradient difference of the first step.

Where torch's generated order differs from our generator's (``same_order``; checked for
torch's multi-stage classes, whose listed order is what they execute), a third
contender runs *torch's* order on *our* runtime (imported through
:mod:`pipeoffload.interop.torch_actions`): the runtime-for-runtime comparison.

This module is importable without torch; :func:`run_bench` imports it when called.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ParameterError, require
from ..models.config import ModelConfig


@dataclass(frozen=True)
class Pair:
    """One shared schedule: torch's class and our closest equivalent."""

    key: str
    torch_class: str
    ours: str
    note: str = ""
    ours_g_is_p: bool = False  #: group-interleaved with g = p

    def ours_kwargs(self, p: int) -> dict[str, int]:
        return {"g": p} if self.ours_g_is_p else {}


#: The schedules both runtimes offer, in report order.
PAIRS: dict[str, Pair] = {pr.key: pr for pr in [
    Pair("gpipe", "ScheduleGPipe", "gpipe"),
    Pair("1f1b", "Schedule1F1B", "1f1b"),
    Pair("interleaved-1f1b", "ScheduleInterleaved1F1B", "interleaved-1f1b", "v=2, identical order"),
    Pair("zb-1p-interleaved", "ScheduleInterleavedZeroBubble", "group-interleaved", ours_g_is_p=True,
         note="ours: group-interleaved g=p, v=2 — same F/B order, W placed right after its B where torch "
              "delays it by up to the rank index"),
    Pair("zb-v", "ScheduleZBVZeroBubble", "zb-v", "V placement; orders differ only in the cool-down Ws"),
]}


@dataclass
class BenchConfig:
    stages: list[int] = field(default_factory=lambda: [2, 4])  #: pipeline sizes p, one launch each
    schedules: list[str] = field(default_factory=lambda: list(PAIRS))
    pairs: int = 5  #: timed (ours, torch) pairs per schedule
    warmup: int = 1  #: untimed steps of each contender first (the first includes setup)
    microbatches: int = 8
    microbatch_size: int = 2
    model: ModelConfig = field(default_factory=lambda: ModelConfig(layers=8, hidden=128, seq_len=128))
    same_order: bool = True  #: also run torch's order on our runtime where it differs from ours
    threads: int | None = None  #: torch threads per rank (default cores / p)
    timeout_s: float = 120.0
    output: str | None = None  #: folder for bench.json / bench.md (None: don't write)

    def check(self) -> None:
        """Raise ParameterError for a bad configuration (before any process starts),
        naming the field (``pairs``, ``stages``, ...; the command line maps them to its flags)."""
        from ..schedules import generate

        require(self.pairs >= 1, "pairs", f"must be >= 1, got {self.pairs}")
        require(self.warmup >= 1, "warmup", f"must be >= 1 (the first step sets up), got {self.warmup}")
        require(self.microbatch_size >= 1, "microbatch_size", f"must be >= 1, got {self.microbatch_size}")
        require(bool(self.stages), "stages", "needs at least one pipeline size")
        require(bool(self.schedules), "schedules", "needs at least one schedule")
        for key in self.schedules:
            if key not in PAIRS:
                raise ParameterError("schedules", f"unknown {key!r}; valid: {', '.join(PAIRS)}")
        for p in self.stages:
            require(isinstance(p, int) and p >= 2, "stages", f"pipeline sizes must be >= 2, got {p}")
            m = self.microbatches
            require(m >= p, "microbatches", f"must be >= p = {p} (torch's 1F1B needs it), got {m}")
            for key in self.schedules:
                pr = PAIRS[key]
                if pr.torch_class.startswith("ScheduleInterleaved"):
                    rounds = max(1, m // p)
                    require(m % rounds == 0, "microbatches", f"torch's {pr.torch_class} needs m to be a "
                            f"multiple of m // p = {rounds} at p = {p}, got {m}")
                sched = generate(pr.ours, p=p, m=m, **pr.ours_kwargs(p))
                self.model.check_split(sched.num_stages)


# ----------------------------------------------------------------------------- statistics & report


def summarize(times: dict[str, list[float]], ours: str = "ours", theirs: str = "torch") -> dict[str, float]:
    """Per-pair ratios ``ours/theirs`` → median, min, max; plus median step times (s)."""
    ratios = [a / b for a, b in zip(times[ours], times[theirs])]
    return {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ours_s": statistics.median(times[ours]), "torch_s": statistics.median(times[theirs]),
            "ratios": ratios}


def _mib(x: float) -> float:
    return x / 2**20


def _mib_per_rank(vals: list[float]) -> str:
    return " / ".join(f"{_mib(v):.2f}" for v in vals)


def markdown(results: dict[str, Any]) -> str:
    """The report table (one row per p and schedule, plus a same-order row where run)."""
    lines = [
        "| p | schedule (torch ↔ ours) | ours ms | torch ms | ratio ours/torch, median (min–max) | "
        "peak act MiB per rank, ours | torch | loss Δ | grad rel Δ |",
        "|---|---|---:|---:|---|---|---|---:|---:|",
    ]
    for row in results["rows"]:
        s = row["summary"]
        lines.append(
            f"| {row['p']} | {row['torch_class']} ↔ {row['ours_label']} | {1000 * s['ours_s']:.1f} | "
            f"{1000 * s['torch_s']:.1f} | **{s['ratio_median']:.3f}** ({s['ratio_min']:.3f}–{s['ratio_max']:.3f}) | "
            f"{_mib_per_rank(row['peak_ours'])} | {_mib_per_rank(row['peak_torch'])} | {row['loss_diff']:.1e} | "
            f"{row['grad_rel_diff']:.1e} |")
    return "\n".join(lines)


def breakdown_markdown(results: dict[str, Any]) -> str:
    """Where the time goes: per row, the busiest rank's median compute time (its F/B/W
    work incl. the loss) of each runtime, and the rest of the step (communication waits,
    bubbles, runtime overhead)."""
    lines = ["| p | schedule (torch ↔ ours) | compute ms, ours | torch | rest of step ms, ours | torch |",
             "|---|---|---:|---:|---:|---:|"]
    for row in results["rows"]:
        if "compute_s" not in row:
            continue
        s = row["summary"]
        co, ct = max(row["compute_s"]["ours"]), max(row["compute_s"]["torch"])
        lines.append(f"| {row['p']} | {row['torch_class']} ↔ {row['ours_label']} | {1000 * co:.1f} | "
                     f"{1000 * ct:.1f} | {1000 * (s['ours_s'] - co):.1f} | {1000 * (s['torch_s'] - ct):.1f} |")
    return "\n".join(lines)


def text_report(results: dict[str, Any]) -> str:
    """What ``pipeoffload bench`` prints: one header line, both tables, the pairing notes."""
    cfg = results["config"]
    mdl = cfg["model"]
    head = (f"pipeoffload bench: ours vs torch.distributed.pipelining {results['torch_version']}, "
            f"{results['backend']} on {results['device']} ({results['cpu_count']} cores); model {mdl['layers']} "
            f"layers, hidden {mdl['hidden']}, seq {mdl['seq_len']}; m={cfg['microbatches']} microbatches of "
            f"{cfg['microbatch_size']}; {cfg['pairs']} timed pairs after {cfg['warmup']} warm-up step(s); "
            f"wall {results['wall_s']:.0f} s")
    notes = [f"- {pr.key}: {pr.note}" for pr in PAIRS.values() if pr.note and pr.key in cfg["schedules"]]
    return "\n".join([head, "", markdown(results), "", breakdown_markdown(results), ""]
                     + (["notes:"] + notes if notes else []))


# ----------------------------------------------------------------------------- running


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict[str, Any]:
    """Run the benchmark (one launch per pipeline size); return the results and write
    ``bench.json`` / ``bench.md`` to ``cfg.output`` when set."""
    cfg.check()
    import torch

    from ..runtime.launcher import launch

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pipeoffload-bench-") as tmp:
        for p in cfg.stages:
            out = Path(tmp) / f"p{p}.json"
            launch(bench_worker, p, (cfg, str(out), progress), backend="gloo", init_timeout_s=cfg.timeout_s,
                   threads=cfg.threads)
            got = json.loads(out.read_text())
            rows.extend(got["rows"])
            meta = got["meta"]
    results = {"config": asdict(cfg), "rows": rows, "torch_version": torch.__version__,
               "backend": "gloo", "device": meta.get("device", "cpu"), "cpu_count": os.cpu_count(),
               "threads_per_rank": meta.get("threads"), "wall_s": time.perf_counter() - t0}
    if cfg.output:
        outdir = Path(cfg.output)
        outdir.mkdir(parents=True, exist_ok=True)
        (outdir / "bench.json").write_text(json.dumps(results, indent=2))
        (outdir / "bench.md").write_text(text_report(results) + "\n")
        results["files"] = [str(outdir / "bench.json"), str(outdir / "bench.md")]
    return results


def bench_worker(ctx: Any, cfg: BenchConfig, out_path: str, progress: bool = True) -> None:
    """One rank of one launch: every schedule of ``cfg`` at p = world size; rank 0
    writes the rows to ``out_path``."""
    import torch
    import torch.distributed as dist

    from ..models.data import ByteCorpus, load_corpus

    corpus = ByteCorpus(load_corpus(), cfg.model.seq_len, seed=0)
    rows = []
    for key in cfg.schedules:
        rows.extend(_bench_schedule(ctx, cfg, PAIRS[key], corpus, progress))
    if ctx.rank == 0:
        Path(out_path).write_text(json.dumps({"rows": rows, "meta": {"device": str(ctx.device),
                                                                      "threads": torch.get_num_threads()}}))
    dist.barrier()  # no rank tears the process group down while another still uses it


@dataclass
class _Measured:
    """One rank's measurements of every contender of one schedule."""

    times: dict[str, list[float]]  #: slowest rank's step time of each timed step
    compute: dict[str, list[float]]  #: this rank's compute time of each timed step
    peaks: dict[str, float]  #: this rank's peak activation memory
    losses: dict[str, list[float]]  #: every step's loss (rank holding the loss)
    grads: dict[str, dict[str, Any]]  #: this rank's gradients after the first step


def _bench_schedule(ctx: Any, cfg: BenchConfig, pr: Pair, corpus: Any, progress: bool) -> list[dict[str, Any]]:
    """Build the contenders of ``pr`` at p = world size, alternate them, and return the
    report rows (rank 0; an empty list elsewhere). A collective: every rank calls it."""
    import torch.distributed as dist

    from ..schedules import generate

    p, m = ctx.world_size, cfg.microbatches
    t_sched = time.perf_counter()
    ours_sched = generate(pr.ours, p=p, m=m, **pr.ours_kwargs(p))
    contenders, same = _contenders(ctx, cfg, pr, ours_sched)
    names = list(contenders)
    got = _alternate(contenders, cfg, corpus)
    grad_diff = {n: _grad_rel_diff(got.grads[n], got.grads["torch"]) for n in names if n != "torch"}
    grad_norm = sum(float(g.norm()) ** 2 for g in got.grads["torch"].values())
    ranks: list[Any] = [None] * p
    dist.all_gather_object(ranks, {"peaks": got.peaks, "losses": got.losses, "grad_diff": grad_diff,
                                   "grad_norm": grad_norm,
                                   "compute": {n: statistics.median(v) for n, v in got.compute.items()}})
    if ctx.rank != 0:
        return []
    rows = []
    for name in names[0:1] + names[2:]:
        row = _row(pr, name, p, m, ours_sched.num_stages, same, got.times, ranks)
        rows.append(row)
        if progress:
            _print_row(row, p, pr.key, name, time.perf_counter() - t_sched)
    return rows


def _contenders(ctx: Any, cfg: BenchConfig, pr: Pair, ours_sched: Any) -> tuple[dict[str, Any], bool]:
    """``{"ours": runner, "torch": torch's schedule}`` over separate module copies with
    the same initial weights, plus ``"ours@torch-order"`` (torch's order on our runtime)
    where the orders differ; and whether they are the same."""
    from ..interop.torch_csv import to_actions
    from ..models.transformer import build_stage, lm_loss
    from ..runtime.executor import PipelineRunner
    from .torch_baseline import TORCH_CLASSES, imported_order, stages_of, torch_pipeline

    p, num_stages = ctx.world_size, ours_sched.num_stages
    placement, v = TORCH_CLASSES[pr.torch_class]
    # Separate module copies per runtime; same seed, so the same initial weights.
    torch_modules = {s: build_stage(cfg.model, s, p * v) for s in stages_of(placement, p, v, ctx.rank)}
    torch_sched = torch_pipeline(pr.torch_class, torch_modules, cfg.microbatches, lm_loss, device=ctx.device)
    contenders: dict[str, Any] = {
        "ours": PipelineRunner(lambda s: build_stage(cfg.model, s, num_stages), lm_loss, ours_sched,
                               device=ctx.device, timeout_s=cfg.timeout_s),
        "torch": torch_sched,
    }
    same = True
    if cfg.same_order and v > 1:  # single-stage classes run a hand-written loop, not their listed order
        torch_order = imported_order(torch_sched, f"{pr.torch_class} order")
        same = to_actions(torch_order) == to_actions(ours_sched)
        if not same:
            contenders["ours@torch-order"] = PipelineRunner(lambda s: build_stage(cfg.model, s, num_stages), lm_loss,
                                                            torch_order, device=ctx.device, timeout_s=cfg.timeout_s)
    return contenders, same


def _alternate(contenders: dict[str, Any], cfg: BenchConfig, corpus: Any) -> _Measured:
    """``warmup`` untimed then ``pairs`` timed steps of every contender on the same
    microbatches, who goes first alternating."""
    import torch
    import torch.distributed as dist

    names = list(contenders)
    got = _Measured({n: [] for n in names}, {n: [] for n in names}, {n: 0.0 for n in names},
                    {n: [] for n in names}, {})
    for it in range(cfg.warmup + cfg.pairs):
        xs, ys = corpus.microbatches(it, cfg.microbatches, cfg.microbatch_size)
        # Alternate who goes first (A B, B A, ...): slow drifts of the machine cancel.
        order = names if (it - cfg.warmup) % 2 == 0 else names[::-1]
        for name in order:
            contender = contenders[name]
            dist.barrier()
            t0 = time.perf_counter()
            res = contender.step(xs, ys)
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
            if it == 0:
                got.grads[name] = {n: (q.grad.detach().clone() if q.grad is not None else torch.zeros_like(q))
                                   for n, q in contender.named_parameters()}
            for q in contender.parameters():
                q.grad = None
            got.peaks[name] = max(got.peaks[name], float(res.peak_memory))
            if res.loss is not None:
                got.losses[name].append(float(res.loss))
            if it >= cfg.warmup:
                got.times[name].append(float(elapsed.item()))
                got.compute[name].append(_compute_time(res))
    return got


def _row(pr: Pair, name: str, p: int, m: int, num_stages: int, same: bool, times: dict[str, list[float]],
         ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The report row of contender ``name`` against torch's schedule, from every rank's
    gathered measurements ``ranks``."""
    loss_rank = next(g for g in ranks if g["losses"]["torch"])
    return {
        "p": p, "key": pr.key, "torch_class": pr.torch_class, "contender": name,
        "ours_label": (f"{pr.ours}" + (" g=p" if pr.ours_g_is_p else "")) if name == "ours"
        else "torch's order on our runtime",
        "same_order": same, "m": m, "layer_groups": num_stages,
        "times_s": {"ours": times[name], "torch": times["torch"]},
        "summary": summarize({"ours": times[name], "torch": times["torch"]}),
        "compute_s": {"ours": [g["compute"][name] for g in ranks],
                      "torch": [g["compute"]["torch"] for g in ranks]},
        "peak_ours": [g["peaks"][name] for g in ranks],
        "peak_torch": [g["peaks"]["torch"] for g in ranks],
        "loss_diff": max(abs(a - b) for a, b in zip(loss_rank["losses"][name], loss_rank["losses"]["torch"])),
        "losses": {"ours": loss_rank["losses"][name], "torch": loss_rank["losses"]["torch"]},
        "grad_rel_diff": max(g["grad_diff"][name] for g in ranks),
        "grad_norm": sum(g["grad_norm"] for g in ranks) ** 0.5,
    }


def _print_row(row: dict[str, Any], p: int, key: str, name: str, elapsed_s: float) -> None:
    sm = row["summary"]
    print(f"p={p} {key:<18} {name:<16} ours {1000 * sm['ours_s']:7.1f} ms  torch "
          f"{1000 * sm['torch_s']:7.1f} ms  ratio {sm['ratio_median']:.3f} "
          f"({sm['ratio_min']:.3f}-{sm['ratio_max']:.3f})  peak MiB ours "
          f"{max(row['peak_ours']) / 2**20:.2f} torch {max(row['peak_torch']) / 2**20:.2f}  "
          f"[{elapsed_s:.0f} s]", flush=True)


def _compute_time(res: Any) -> float:
    """Seconds this rank spent computing in the step (ours: its F/B/W/BW ops; torch's:
    the stages' forward/backward/weight calls and the loss)."""
    if hasattr(res, "compute_time"):
        return float(res.compute_time)
    return float(sum(e.end - e.start for e in res.events if e.stream == "compute"))


def _grad_rel_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """max over parameters of ‖a − b‖ / ‖b‖ (0 for an all-zero b equal to a)."""
    worst = 0.0
    for n, gb in b.items():
        ga = a[n]
        den = float(gb.norm())
        num = float((ga - gb).norm())
        worst = max(worst, num / den if den > 0 else num)
    return worst
