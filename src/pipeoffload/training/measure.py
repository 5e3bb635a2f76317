"""Measured vs predicted: turn per-rank step results into Timelines and compare them
with the simulator fed the *measured* per-op costs.

- :func:`gather_results` collects every rank's :class:`StepResult` on rank 0.
- :func:`measured_timeline` merges them into one :class:`~pipeoffload.timeline.Timeline`
  (seconds, bytes; ``meta["time_unit"] = "s"``).
- :func:`group_medians` → per layer group ``(F, B, W)`` median durations and memory
  deltas, fed to ``Costs(group_costs=…)`` / ``MemoryDeltas(group_deltas=…)``.
- :func:`predict` lowers the schedule with them (:func:`pipeoffload.passes.lower`:
  validate, then time); :func:`predict_offload` lowers it with the offload pass and
  the run's settings, or places the transfers of the program that ran.
- :func:`compare` gives the per-rank report rows.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from typing import Any, Sequence

import torch.distributed as dist

from ..costs import Costs, MemoryDeltas
from ..ir import OpKind, Schedule
from ..passes.comm import message_key
from ..passes.lower import Lowered, lower
from ..passes.offload import OffloadOptions, OffloadResult
from ..timeline import ALLOC, TimedOp, Timeline
from ..runtime.executor import OpSample, StepResult

_MIN_COST = 1e-9


def gather_results(result: Any, group: Any = None) -> list[Any] | None:
    """Every rank's object, in ``group`` order, on the group's first rank (None elsewhere);
    ``group`` None is the world."""
    if not dist.is_initialized():
        return [result]
    world = dist.get_world_size(group)
    out: list[Any] | None = [None] * world if dist.get_rank(group) == 0 else None
    # gather_object's dst is a global rank: the group's first member, not global rank 0
    dst = 0 if group is None else dist.get_global_rank(group, 0)
    dist.gather_object(result, out, dst=dst, group=group)
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

    A group with no W sample (never happens with the runtime) gets W = 0 time/memory. A
    group that runs both BW and split B/W ops (DualPipeV) is measured by its split ops
    (:func:`_split_first`): a BW's B part frees what a split B keeps for its W."""
    dur: dict[tuple[int, str], list[float]] = {}
    mem: dict[tuple[int, str], list[float]] = {}
    for s in _split_first(samples):
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


def _split_first(samples: Sequence[OpSample]) -> list[OpSample]:
    """``samples`` without the halves of BW ops of the layer groups that also have samples
    of split B/W ops (the model's B and W are those of a split backward; BW = B + W)."""
    split = {s.stage for s in samples if s.kind != "F" and not getattr(s, "from_bw", False)}
    return [s for s in samples if not (getattr(s, "from_bw", False) and s.stage in split)]


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
            deltas: Sequence[tuple[float, float, float]], comm: float = 0.0,
            peaks: Sequence[tuple[float, float, float]] | None = None) -> Timeline:
    """The simulator's timeline with measured per-group costs (s) and memory deltas (bytes).

    ``peaks`` (:func:`group_peaks`): measured in-op peaks; then ``meta["peak_memory_in_op"]``
    holds each rank's peak including them (:func:`in_op_peaks`), which :func:`compare` uses."""
    tl = _labelled(_lower_measured(schedule, costs, deltas, comm).timeline, schedule)
    if peaks is not None:
        tl.meta["peak_memory_in_op"] = in_op_peaks(tl, peaks, deltas)
    return tl


def _lower_measured(schedule: Schedule, costs: Sequence[tuple[float, float, float]],
                    deltas: Sequence[tuple[float, float, float]], comm: float,
                    offload: OffloadOptions | None = None) -> Lowered:
    """``schedule`` through the pass pipeline with the measured per-group costs (s),
    memory deltas (bytes) and comm latency (s), and the offload pass when ``offload``."""
    return lower(schedule, Costs(comm=comm, group_costs=tuple(costs)), MemoryDeltas(group_deltas=tuple(deltas)),
                 memory_unit="bytes", offload=offload)


def _labelled(tl: Timeline, schedule: Schedule) -> Timeline:
    """``tl`` named as ``schedule``'s prediction, its time unit seconds."""
    tl.name = f"{schedule.name} (predicted)"
    tl.meta["time_unit"] = "s"
    return tl


def group_peaks(samples: Sequence[OpSample], num_stages: int) -> list[tuple[float, float, float]]:
    """Per layer group: the median in-op peak of F, B and W — the highest activation
    level during the op above its start level (≥ the op's delta; e.g. inside a B the
    first weight-gradient stash appears before saved tensors are freed)."""
    vals: dict[tuple[int, str], list[float]] = {}
    for s in _split_first(samples):
        vals.setdefault((s.stage, s.kind), []).append(max(getattr(s, "peak", 0.0), s.mem, 0.0))
    return [tuple(statistics.median(vals[(g, k)]) if (g, k) in vals else 0.0 for k in "FBW")  # type: ignore[misc]
            for g in range(num_stages)]


def in_op_peaks(tl: Timeline, peaks: Sequence[tuple[float, float, float]],
                deltas: Sequence[tuple[float, float, float]]) -> list[float]:
    """Per rank: the highest of ``tl``'s memory curve and, for every compute op, the
    level just before it plus its in-op peak (a BW: B's, or B's delta plus W's)."""
    sweeps = tl.memory_sweeps()
    compute: list[list[TimedOp]] = [[] for _ in range(tl.num_ranks)]
    for e in tl.events:
        if e.stream == "compute" and e.op.kind.is_compute:
            compute[e.rank].append(e)
    out = []
    for r in range(tl.num_ranks):
        keys = [(t, o) for t, o, _ in sweeps[r]]
        levels = [level for _, _, level in sweeps[r]]
        best = max([0.0] + levels)
        for e in compute[r]:
            i = bisect_right(keys, (e.start, ALLOC))
            before = (levels[i - 1] if i else 0.0) - (e.mem if e.mem > 0 else 0.0)
            pf, pb, pw = peaks[e.op.stage]
            k = e.op.kind
            inner = pf if k is OpKind.F else pb if k is OpKind.B else pw if k is OpKind.W else \
                max(pb, deltas[e.op.stage][1] + pw)
            best = max(best, before + inner)
        out.append(best)
    return out


def predict_offload(schedule: Schedule, costs: Sequence[tuple[float, float, float]],
                    deltas: Sequence[tuple[float, float, float]], comm: float = 0.0, *, offload_chunks: int | None = None,
                    moved: dict[int, float] | None = None, program: Schedule | None = None,
                    peaks: Sequence[tuple[float, float, float]] | None = None,
                    **options: Any) -> tuple[Timeline, OffloadResult | None]:
    """The simulator's timeline with measured per-group costs and memory deltas, plus
    the offload transfers. Returns ``(timeline, pass result or None)``.

    Without ``program``: the schedule lowered with the offload pass
    (:func:`~pipeoffload.passes.lower` with
    :class:`~pipeoffload.passes.offload.OffloadOptions`) and the run's settings —
    ``offload_chunks`` (the C the run used) and ``options`` (``offload_time``,
    ``link_group``, ...; ``on_infeasible`` defaults to "skip").

    With ``program`` (the schedule that ran, transfer ops included): its transfer ops as
    the runtime issues them — each at the end of the compute op before it in its rank's
    program — on that timeline. With ``offload_time = 0`` both give the same memory
    (the runtime reloads right after the op before the B, the pass plans it at the B's
    start; they differ when a rank idles before a B); with planned transfer times the
    pass re-planned with measured costs may place or skip transfers differently from
    the plan that ran, so ``program`` is the faithful prediction of a run.

    ``moved``: measured bytes one transfer of a layer group moves (the store's
    ``moved_by_stage``). The pass assumes a transfer moves the F's whole memory delta;
    with ``moved`` each transfer moves the measured amount, so what the store leaves
    resident (tiny tensors, storages referenced elsewhere) is predicted resident.
    ``peaks``: as for :func:`predict` (in-op peaks of the compute ops)."""
    if program is None:
        if offload_chunks is None:
            raise TypeError("predict_offload needs offload_chunks= or program=")
        base, events, meta, res = _replanned_transfers(schedule, costs, deltas, comm, offload_chunks, options)
        label = f"C={res.offloaded_chunks}"
    else:
        base = predict(schedule, costs, deltas, comm)
        events = base.events + _transfers_in_program_order(program, base, deltas)
        meta, res = dict(base.meta), None
        label = f"C={program.params.get('offload_chunks', '?')}"
    if moved:
        events = _with_measured_amounts(events, moved)
    tl = Timeline(num_ranks=base.num_ranks, events=events, name=f"{schedule.name} + offload {label} (predicted)",
                  num_microbatches=base.num_microbatches, chunks=base.chunks, memory_unit=base.memory_unit, meta=meta)
    tl.meta["time_unit"] = "s"
    tl.meta.pop("peak_memory_in_op", None)
    if peaks is not None:
        tl.meta["peak_memory_in_op"] = in_op_peaks(tl, peaks, deltas)
    return tl, res


def _replanned_transfers(schedule: Schedule, costs: Sequence[tuple[float, float, float]],
                         deltas: Sequence[tuple[float, float, float]], comm: float, offload_chunks: int,
                         options: dict[str, Any]) -> tuple[Timeline, list[TimedOp], dict, OffloadResult]:
    """The offload pass re-planned on the measured timeline: ``(base timeline, events
    with transfers, their meta, pass result)``."""
    options = {"on_infeasible": "skip", **options}
    if options.get("transfer_times") is not None:
        options["transfer_times"] = tuple(options["transfer_times"])
    lowered = _lower_measured(schedule, costs, deltas, comm,
                              OffloadOptions(offload_chunks=offload_chunks, **options))
    res = lowered.offload
    assert res is not None  # lower() ran the offload pass
    base = _labelled(lowered.base_timeline, schedule)
    # The pass copied the base's name and meta before they were labelled: label its timeline alike.
    res.timeline.name = base.name
    res.timeline.meta = {**base.meta, **res.timeline.meta}
    return base, list(res.timeline.events), dict(res.timeline.meta), res


def _with_measured_amounts(events: list[TimedOp], moved: dict[int, float]) -> list[TimedOp]:
    """Each OFFLOAD_END / RELOAD_START of a layer group in ``moved`` frees / allocates the
    measured bytes of one transfer (at most the planned amount) instead of the F's delta."""
    amount = {e.op.stage: -e.mem for e in events if e.op.kind is OpKind.OFFLOAD_END}
    out = []
    for e in events:
        if e.op.kind in (OpKind.OFFLOAD_END, OpKind.RELOAD_START) and e.op.stage in moved:
            sign = -1.0 if e.op.kind is OpKind.OFFLOAD_END else 1.0
            e = TimedOp(e.op, e.start, e.end, e.stream, sign * min(float(moved[e.op.stage]), amount[e.op.stage]))
        out.append(e)
    return out


def _transfers_in_program_order(program: Schedule, base: Timeline,
                                deltas: Sequence[tuple[float, float, float]]) -> list[TimedOp]:
    """``program``'s transfer ops, each at the end of the compute op before it on its
    rank (as the runtime issues them), moving the F's memory delta of its layer group."""
    when = {(e.rank, e.op.key): e for e in base.events}
    out: list[TimedOp] = []
    for r, ops in enumerate(program.ranks):
        t = None
        for op in ops:
            e = when.get((r, op.key))
            if e is not None and e.stream == "compute":
                t = e.end
                continue
            if op.kind not in (OpKind.OFFLOAD_START, OpKind.OFFLOAD_END, OpKind.RELOAD_START, OpKind.RELOAD_END):
                continue
            if t is None:  # pragma: no cover - a transfer precedes every F on its rank
                t = base.start
            a = float(deltas[op.stage][0])
            mem = {OpKind.OFFLOAD_END: -a, OpKind.RELOAD_START: a}.get(op.kind, 0.0)
            lane = "d2h" if op.kind in (OpKind.OFFLOAD_START, OpKind.OFFLOAD_END) else "h2d"
            out.append(TimedOp(op, t, t, lane, mem))
    return out


def compare(measured: Timeline, predicted: Timeline) -> dict[str, Any]:
    """Per-rank and overall measured-vs-predicted numbers (JSON-ready). The predicted
    peak includes in-op peaks when the prediction has them (``predict(..., peaks=)``)."""
    mpeak = measured.meta.get("measured_peak_memory") or measured.peak_memory()
    curve = predicted.peak_memory()  # at op boundaries only
    ppeak = predicted.meta.get("peak_memory_in_op") or curve
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
            "peak_memory_predicted_between_ops": curve[r],
        })
    return {
        "makespan_measured_s": measured.makespan,
        "makespan_predicted_s": predicted.makespan,
        "bubble_measured": measured.bubble_rate,
        "bubble_predicted": predicted.bubble_rate,
        "ranks": rows,
    }
