"""Measured vs predicted: turn per-rank step results into Timelines and compare them
with the simulator fed the *measured* per-op costs.

- :func:`gather_results` collects every rank's :class:`StepResult` on rank 0.
- :func:`measured_timeline` merges them into one :class:`~pipeoffload.timeline.Timeline`
  (seconds, bytes; ``meta["time_unit"] = "s"``).
- :func:`group_medians` → per layer group ``(F, B, W)`` median durations and memory
  deltas, fed to ``Costs(group_costs=…)`` / ``MemoryDeltas(group_deltas=…)``.
- :func:`predict` runs :func:`pipeoffload.passes.timing.simulate` with them.
- :func:`compare` gives the per-rank report rows.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch.distributed as dist

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Schedule
from ..passes.comm import message_key
from ..passes.timing import simulate
from ..timeline import TimedOp, Timeline
from .executor import OpSample, StepResult

_MIN_COST = 1e-9


def gather_results(result: Any, group: Any = None) -> list[Any] | None:
    """Every rank's object on rank 0 (None elsewhere)."""
    if not dist.is_initialized():
        return [result]
    world = dist.get_world_size(group)
    out: list[Any] | None = [None] * world if dist.get_rank(group) == 0 else None
    dist.gather_object(result, out, dst=0, group=group)
    return out


def measured_timeline(results: Sequence[StepResult], schedule: Schedule, name: str | None = None) -> Timeline:
    events: list[TimedOp] = []
    for r in results:
        events.extend(r.events)
    peaks = [0.0] * schedule.num_ranks
    for r in results:
        peaks[r.rank] = r.peak_memory
    return Timeline(
        num_ranks=schedule.num_ranks,
        events=events,
        name=name or f"{schedule.name} (measured)",
        num_microbatches=schedule.num_microbatches,
        chunks=schedule.chunks,
        memory_unit="bytes",
        meta={"time_unit": "s", "measured": True, "params": dict(schedule.params),
              "measured_peak_memory": peaks,
              "step_time": [r.step_time for r in sorted(results, key=lambda r: r.rank)]},
    )


def group_medians(samples: Sequence[OpSample], num_stages: int) -> tuple[list[tuple[float, float, float]],
                                                                          list[tuple[float, float, float]]]:
    """Per layer group: median ``(F, B, W)`` durations (s) and memory deltas (bytes).

    A group with no W sample (never happens with the runtime) gets W = 0 time/memory."""
    dur: dict[tuple[int, str], list[float]] = {}
    mem: dict[tuple[int, str], list[float]] = {}
    for s in samples:
        dur.setdefault((s.stage, s.kind), []).append(s.duration)
        mem.setdefault((s.stage, s.kind), []).append(s.mem)
    costs, deltas = [], []
    for g in range(num_stages):
        c, d = [], []
        for k in "FBW":
            c.append(max(_MIN_COST, statistics.median(dur[(g, k)])) if (g, k) in dur else _MIN_COST)
            d.append(statistics.median(mem[(g, k)]) if (g, k) in mem else 0.0)
        costs.append(tuple(c))
        deltas.append(tuple(d))
    return costs, deltas  # type: ignore[return-value]


def estimate_comm(tl: Timeline) -> float:
    """Median latency of a message whose receiver was already waiting: receive end −
    send start (clocks aligned by the step barrier). 0 when no such message."""
    sends: dict[tuple, float] = {}
    recvs: list[tuple[tuple, float, float]] = []
    for e in tl.events:
        if e.stream != "comm":
            continue
        if e.op.kind in (OpKind.SEND_F, OpKind.SEND_B):
            sends[message_key(e.op)] = e.start
        elif e.op.kind in (OpKind.RECV_F, OpKind.RECV_B):
            recvs.append((message_key(e.op), e.start, e.end))
    lat = [end - sends[k] for k, start, end in recvs if k in sends and start <= sends[k] < end]
    return max(0.0, statistics.median(lat)) if lat else 0.0


def predict(schedule: Schedule, costs: Sequence[tuple[float, float, float]],
            deltas: Sequence[tuple[float, float, float]], comm: float = 0.0) -> Timeline:
    """The simulator's timeline with measured per-group costs (s) and memory deltas (bytes)."""
    tl = simulate(schedule.compute_only(), Costs(comm=comm, group_costs=tuple(costs)),
                  MemoryDeltas(group_deltas=tuple(deltas)), memory_unit="bytes")
    tl.name = f"{schedule.name} (predicted)"
    tl.meta["time_unit"] = "s"
    return tl


def compare(measured: Timeline, predicted: Timeline) -> dict[str, Any]:
    """Per-rank and overall measured-vs-predicted numbers (JSON-ready)."""
    mpeak = measured.meta.get("measured_peak_memory") or measured.peak_memory()
    ppeak = predicted.peak_memory()
    mb, pb = measured.rank_bubble_rates(), predicted.rank_bubble_rates()
    busy = measured.busy()
    steps = measured.meta.get("step_time") or [measured.makespan] * measured.num_ranks
    rows = []
    for r in range(measured.num_ranks):
        rows.append({
            "rank": r,
            "step_time_s": steps[r],
            "busy_s": busy[r],
            "bubble_measured": mb[r],
            "bubble_predicted": pb[r],
            "peak_memory_measured": mpeak[r],
            "peak_memory_predicted": ppeak[r],
            "peak_memory_error": (mpeak[r] - ppeak[r]) / ppeak[r] if ppeak[r] else 0.0,
        })
    return {
        "makespan_measured_s": measured.makespan,
        "makespan_predicted_s": predicted.makespan,
        "bubble_measured": measured.bubble_rate,
        "bubble_predicted": predicted.bubble_rate,
        "ranks": rows,
    }
