"""Published measurements on real GPUs, and the planner's prediction of each. Pure Python.

API
---
``MEASURED``: the ZB paper's measured A100-80G rows (:class:`MeasuredRow`), fit rows first.
``predict(row, hardware="a100-80g") -> Prediction``: the planner's cost model and simulator on the
row's exact configuration (pure PP, TP = DP = 1, the row's schedule, m and microbatch), with the P2P of
the runtime that measured the row (``RUNTIME_OF``, ``RUNTIME_P2P_EXPOSED``); its iteration is the
planner's, the step after the pipeline (``planner.step``: optimizer step, tied-embedding gradient
all-reduce) included.
``compare(rows=MEASURED, hardware="a100-80g") -> list[Prediction]``; ``ranking_agrees(preds)``:
per setting, whether the schedules come out in the measured order.
``zb_runtime_inputs(model, costs, p, limit)``: what the ZB runtime gives its automatic scheduler
(ZB-1p, ZB-2p rows are generated from these, then timed with the planner's costs);
``row_problem(row)``: the planner's problem and schedule family of a row.
``SYNCHRONISED``: the paper's ZB-2p runs with an all-reduce synchronisation instead of its optimizer
post-validation (its ablation), the one kind of ZB-runtime row whose iteration is the planner's barrier;
kept out of ``MEASURED`` (a check of the ZB runtime's level, docs/planner.md#calibration).
``predict(..., op_overhead={"zb": f})``: the rows of a runtime with its F, B, W ``f`` longer than the
profile's (an analysis of that runtime's overhead; no overhead is part of the calibration).
``post_validation_iteration_ms(schedule, costs, optimizer_ms, embedding_ms, held_from=None, hop_ms=0)``:
the iteration of the ZB runtime's back-to-back iterations without a barrier (its optimizer
post-validation; ``predict(..., post_validation=True)``), where each rank waits for the validation and
the scalar hops' latency as parameters: an analysis, not the calibration's iteration
(docs/planner.md#calibration).

Sources (docs/planner.md#calibration): Qi et al., "Zero Bubble Pipeline Parallelism" — the ICLR 2024
version's Table 3 (settings), Table 4 (throughput and memory of 1F1B, 1F1B-I, ZB-1p, ZB-2p) and
Table 6 (profiled T_F, T_B, T_W, T_comm), and the arXiv version (2401.10241) Table 6 (ZB-V against
ZB-2p*, ZB-1p and 1F1B at equal memory; ZB-2p* runs half the microbatch size and twice the
microbatches) and Table 7 (microbatch size halved). Read from two public Markdown conversions of the
paper found with the project's search tool (their ids are in the docs); every figure below is the
paper's. Throughput is samples per GPU per second; memory the paper's "GB", read as GiB (Megatron
reports MiB; the docs explain why GiB fits).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .hardware import GiB, Hardware, get_hardware
from .presets import get_model

__all__ = ["MeasuredRow", "Prediction", "MEASURED", "PROFILED_MS", "FIT_MODELS", "SCHEDULE_FAMILIES", "RUNTIME_OF",
           "RUNTIME_P2P_EXPOSED", "RUNTIME_GENERATES", "RUNTIME_POST_VALIDATION", "MEASUREMENT_TIE", "SYNCHRONISED",
           "predict",
           "compare", "ranking_agrees", "row_problem", "zb_runtime_inputs", "post_validation_iteration_ms"]

#: The paper's schedule names → (registry schedule, chunks v, memory limit in multiples of 1F1B's).
SCHEDULE_FAMILIES: dict[str, tuple[str, int, float | None]] = {
    "1F1B": ("1f1b", 1, None), "1F1B-I": ("interleaved-1f1b", 2, None), "ZB-1p": ("zb-auto", 1, 1.0),
    "ZB-2p": ("zb-auto", 1, 2.0), "ZB-V": ("zb-v", 2, None),
}


#: Which runtime measured each schedule of the paper: its baselines ran Megatron-LM's own
#: schedules, the ZB schedules ran the authors' scheduled runtime (``zb_schedules.py`` of
#: sail-sg/zero-bubble-pipeline-parallelism, the version of the paper).
RUNTIME_OF: dict[str, str] = {"1F1B": "megatron", "1F1B-I": "megatron", "ZB-1p": "zb", "ZB-2p": "zb", "ZB-V": "zb"}
#: The fraction of a stage-to-stage hop an F or B holds its stage for, per runtime — a fact of each
#: runtime's code, not a fit. Megatron-LM's ``p2p_communication`` waits on its ``batch_isend_irecv``
#: requests before returning (``send_forward_recv_backward`` etc.): the stage is held for the hop.
#: The ZB runtime posts its batched ``isend``/``irecv`` at the schedule's communication nodes and waits
#: on a received tensor only right before the F or B that consumes it, on the sends at the end of the
#: iteration: the hop is on the dependency, not on the stage. (pipeoffload's own runtime does the
#: latter: receives posted ahead, ``isend`` waited at the end of the step; so does the planner's
#: ``a100-80g`` profile, ``p2p_exposed = 0``.)
RUNTIME_P2P_EXPOSED: dict[str, float] = {"megatron": 1.0, "zb": 0.0}
#: The ZB runtime does not run a schedule the planner would make: it runs the authors' automatic
#: scheduler once, on its own inputs (:func:`zb_runtime_inputs`), and executes that order. Our
#: ``zb-auto`` is the same heuristic (on equal inputs the same orders: docs/planner.md#calibration),
#: but the planner feeds it per-stage costs and the byte memory model; a measured ZB-1p / ZB-2p row is
#: a measurement of the order the runtime's inputs give. Every row of these schedules is therefore
#: generated from the runtime's inputs and timed with the planner's per-stage costs (a rule for the
#: rows, not a factor; the planner's own zb-auto is unchanged).
RUNTIME_GENERATES: frozenset[str] = frozenset({"ZB-1p", "ZB-2p"})
#: The runtimes that replace the optimizer's synchronisation over all ranks with a validation after
#: the update ("optimizer post-validation", ``--enable-optimizer-post-validation``, on in the paper's
#: runs): the ZB runtime's ``pre_step`` (``megatron/optimizer/optimizer.py``, branch ``arxiv``) reduces
#: the grad norm and inf flag along the pipeline, rank r waiting only for rank r − 1, and steps at
#: once; the next iteration's warm-up forwards run up to a ``POST_VALIDATION`` node before the first
#: B (``auto_schedule.py``), where the fully reduced result comes back up the pipeline. No rank waits
#: for all ranks to finish: an iteration's warm-up overlaps the previous one's tail
#: (:func:`post_validation_iteration_ms`). Megatron's own optimizer step all-reduces the grad norm: a
#: barrier, which the planner's iteration (makespan + step) is.
RUNTIME_POST_VALIDATION: frozenset[str] = frozenset({"zb"})
#: Two measured throughputs closer than this are a tie: the paper prints 2–3 significant digits
#: (1.84 against 1.85 is half a unit of the last digit apart, 0.5%, from rounding alone), and its own
#: repeated settings move by more: ZB-2p* at 14.6B/24 GPUs reads 1.84, 1.84, 1.85 while m doubles.
MEASUREMENT_TIE = 0.02


@dataclass(frozen=True)
class MeasuredRow:
    """One measured run: ``model`` (a preset) with ``microbatch`` sequences per microbatch, ``m``
    microbatches, pure PP over ``gpus`` A100-80G; ``throughput`` samples/GPU/s; ``memory_gib`` the peak
    per GPU (None: not published for that row); ``fit``: the calibration used this setting;
    ``synchronised``: the run replaced the runtime's optimizer post-validation with an all-reduce
    synchronisation (the paper's ablation), so its iteration is a barrier whatever the runtime."""

    source: str
    model: str
    gpus: int
    microbatch: int
    m: int
    schedule: str
    throughput: float
    memory_gib: float | None = None
    fit: bool = False
    note: str = ""
    group_m: int | None = None  #: the m of the setting the row is compared within (ZB-2p*: half its own)
    synchronised: bool = False

    @property
    def setting(self) -> str:
        return f"{self.source}: {self.model}, {self.gpus} GPUs, m={self.group_m or self.m}"

    @property
    def runtime(self) -> str:
        """"megatron" or "zb": the runtime that measured this row (:data:`RUNTIME_OF`)."""
        return RUNTIME_OF[self.schedule]


#: ZB (ICLR) Table 4: model -> (GPUs, microbatch size, m values, {schedule: throughputs}, {schedule: GB}).
_TABLE4: dict[str, tuple[int, int, tuple[int, ...], dict[str, tuple[float, ...]], dict[str, float]]] = {
    "1.5B": (8, 6, (24, 32, 64), {"ZB-2p": (14.5, 14.8, 14.9), "ZB-1p": (12.9, 13.4, 14.2),
                                  "1F1B": (11.8, 12.5, 13.6), "1F1B-I": (13.1, 13.4, 13.9)},
             {"ZB-2p": 59, "ZB-1p": 32, "1F1B": 30, "1F1B-I": 40}),
    "6.2B": (8, 3, (24, 32, 64), {"ZB-2p": (4.32, 4.35, 4.39), "ZB-1p": (3.88, 4.00, 4.20),
                                  "1F1B": (3.50, 3.70, 4.03), "1F1B-I": (4.01, 4.08, 4.19)},
             {"ZB-2p": 70, "ZB-1p": 42, "1F1B": 39, "1F1B-I": 48}),
    "14.6B": (16, 1, (48, 64, 128), {"ZB-2p": (1.81, 1.83, 1.85), "ZB-1p": (1.61, 1.67, 1.76),
                                     "1F1B": (1.40, 1.49, 1.64), "1F1B-I": (1.54, 1.59, 1.66)},
              {"ZB-2p": 51, "ZB-1p": 33, "1F1B": 32, "1F1B-I": 39}),
    "28.3B": (32, 1, (96, 128, 256), {"ZB-2p": (0.99, 1.00, 1.00), "ZB-1p": (0.87, 0.90, 0.96),
                                      "1F1B": (0.76, 0.80, 0.88), "1F1B-I": (0.82, 0.85, 0.90)},
              {"ZB-2p": 74, "ZB-1p": 44, "1F1B": 43, "1F1B-I": 58}),
}
#: ZB (arXiv) Table 6, equal memory: ZB-2p* runs microbatch b/2 and 2m.
_TABLE6: dict[str, tuple[int, int, tuple[int, ...], dict[str, tuple[float, ...]], dict[str, float]]] = {
    "6.2B": (16, 6, (48, 64, 128), {"ZB-V": (4.15, 4.21, 4.35), "ZB-2p*": (4.36, 4.37, 4.45),
                                    "ZB-1p": (3.87, 4.00, 4.29), "1F1B": (3.38, 3.57, 3.91)},
             {"ZB-V": 64, "ZB-2p*": 64, "ZB-1p": 62, "1F1B": 61}),
    "14.6B": (24, 2, (72, 96, 192), {"ZB-V": (1.85, 1.88, 1.93), "ZB-2p*": (1.84, 1.84, 1.85),
                                     "ZB-1p": (1.72, 1.78, 1.89), "1F1B": (1.52, 1.61, 1.76)},
              {"ZB-V": 45, "ZB-2p*": 46, "ZB-1p": 46, "1F1B": 44}),
    "28.3B": (32, 2, (96, 128, 256), {"ZB-V": (1.01, 1.02, 1.06), "ZB-2p*": (1.00, 1.00, 1.01),
                                      "ZB-1p": (0.94, 0.97, 1.03), "1F1B": (0.82, 0.87, 0.95)},
              {"ZB-V": 71, "ZB-2p*": 72, "ZB-1p": 73, "1F1B": 69}),
}
#: ZB-2p*'s ZB-2p memory (Table 6 of 6.2B: 63 / 64 / 65 GB over the three m; the others are constant).
_TABLE6_ZB2P_MEMORY = {"6.2B": (63, 64, 65)}
#: ZB (arXiv) Table 7: the smaller microbatch of Table 6's middle m.
_TABLE7: dict[str, tuple[int, int, int, dict[str, float]]] = {
    "6.2B": (16, 3, 64, {"ZB-V": 4.13, "ZB-1p": 3.91, "1F1B": 3.48}),
    "14.6B": (24, 1, 96, {"ZB-V": 1.75, "ZB-1p": 1.65, "1F1B": 1.47}),
    "28.3B": (32, 1, 128, {"ZB-V": 0.95, "ZB-1p": 0.90, "1F1B": 0.80}),
}
#: ZB (ICLR) Table 6: profiled T_F, T_B, T_W, T_comm (ms) of one stage in the ZB-2p runs, first m.
PROFILED_MS: dict[str, tuple[int, float, float, float, float]] = {
    "1.5B": (8, 18.522, 18.086, 9.337, 0.601), "6.2B": (8, 29.718, 29.444, 19.927, 0.527),
    "14.6B": (16, 11.347, 11.248, 8.132, 0.377), "28.3B": (32, 10.419, 10.207, 7.715, 0.408),
}
#: The models whose profiled stages (8 GPUs, Table 4's settings) fixed the profile's three fitted
#: constants by least squares on their T_F, T_B, T_W; the other two profiled stages (14.6B, 28.3B)
#: are held-out op-time checks, and so is every row outside these two Table 4 settings.
FIT_MODELS: tuple[str, ...] = ("1.5B", "6.2B")


def _rows() -> tuple[MeasuredRow, ...]:
    rows: list[MeasuredRow] = []
    for model, (gpus, b, ms, thr, mem) in _TABLE4.items():
        for i, m in enumerate(ms):
            for name, vals in thr.items():
                rows.append(MeasuredRow("ZB Table 4", model, gpus, b, m, name, vals[i], float(mem[name]),
                                        fit=model in FIT_MODELS))
    for model, (gpus, b, ms, thr, mem) in _TABLE6.items():
        for i, m in enumerate(ms):
            for name, vals in thr.items():
                gib = float(_TABLE6_ZB2P_MEMORY[model][i]) if name == "ZB-2p*" and model in _TABLE6_ZB2P_MEMORY \
                    else float(mem[name])
                if name == "ZB-2p*":  # half the microbatch, twice the microbatches
                    rows.append(MeasuredRow("ZB Table 6", model, gpus, b // 2, 2 * m, "ZB-2p", vals[i], gib,
                                            note=f"ZB-2p*, setting m={m}, b={b}", group_m=m))
                else:
                    rows.append(MeasuredRow("ZB Table 6", model, gpus, b, m, name, vals[i], gib))
    for model, (gpus, b, m, thr) in _TABLE7.items():
        for name, val in thr.items():
            rows.append(MeasuredRow("ZB Table 7", model, gpus, b, m, name, val))
    return tuple(rows)


MEASURED: tuple[MeasuredRow, ...] = _rows()

#: ZB (ICLR) Appendix E, Table 7: ZB-2p with an all-reduce synchronisation instead of optimizer
#: post-validation (model -> GPUs, microbatch, m, throughput). With post-validation the same runs are
#: Table 4's ZB-2p at that m (14.5, 4.32, 1.81, 0.99): the paper's "approximately 8%".
_SYNCHRONISED: dict[str, tuple[int, int, int, float]] = {
    "1.5B": (8, 6, 24, 13.11), "6.2B": (8, 3, 24, 4.00), "14.6B": (16, 1, 48, 1.68), "28.3B": (32, 1, 96, 0.91),
}
#: The synchronised ZB-2p runs: the ZB runtime timed with a barrier between iterations, as the planner
#: times every iteration. Not in :data:`MEASURED` (a check of the ZB runtime's level; the 1.5B and
#: 6.2B ones are of the fit settings): docs/planner.md#calibration.
SYNCHRONISED: tuple[MeasuredRow, ...] = tuple(
    MeasuredRow("ZB App. E", model, gpus, b, m, "ZB-2p", thr, fit=model in FIT_MODELS,
                note="all-reduce synchronisation, no post-validation", synchronised=True)
    for model, (gpus, b, m, thr) in _SYNCHRONISED.items())


@dataclass(frozen=True)
class Prediction:
    """The planner's figures for one :class:`MeasuredRow`: throughput (samples/GPU/s), iteration
    (s), MFU, allocated and reserved peak (GiB, the rank with the highest sum), and the relative
    errors against the row (None where the row has no figure)."""

    row: MeasuredRow
    throughput: float
    iteration_s: float
    mfu: float
    allocated_gib: float
    reserved_gib: float
    fits: bool
    step_s: float = 0.0  #: of ``iteration_s``: the step after the pipeline (``planner.step``)

    @property
    def throughput_error(self) -> float | None:
        t = self.row.throughput
        return None if t != t else self.throughput / t - 1.0

    @property
    def memory_error(self) -> float | None:
        m = self.row.memory_gib
        return None if m is None else self.reserved_gib / m - 1.0

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {"source": r.source, "model": r.model, "gpus": r.gpus, "microbatch": r.microbatch, "m": r.m,
                "schedule": r.schedule, "fit": r.fit, "measured_throughput": None if r.throughput != r.throughput
                else r.throughput, "predicted_throughput": self.throughput,
                "throughput_error": self.throughput_error, "measured_memory_gib": r.memory_gib,
                "predicted_reserved_gib": self.reserved_gib, "predicted_allocated_gib": self.allocated_gib,
                "memory_error": self.memory_error, "iteration_s": self.iteration_s, "step_s": self.step_s,
                "mfu": self.mfu, "runtime": r.runtime,
                "order_from": "zb runtime's inputs" if r.schedule in RUNTIME_GENERATES else "planner's inputs",
                "fits": self.fits, "note": r.note}


def predict(row: MeasuredRow, hardware: str | Hardware = "a100-80g", post_validation: bool = False,
            op_overhead: Mapping[str, float] | None = None) -> Prediction:
    """The planner's prediction of one measured configuration.

    Args:
        row: the measured run: model preset, GPUs (all pipeline stages), microbatch size, m, schedule.
        hardware: a profile name, file or :class:`Hardware`.
        post_validation: for the rows of a runtime in :data:`RUNTIME_POST_VALIDATION`, the iteration
            is the steady one of back-to-back iterations without the barrier
            (:func:`post_validation_iteration_ms`) instead of the planner's makespan + step. Off by
            default: the calibration's figures are the planner's iteration (docs/planner.md#calibration).
            A :attr:`~MeasuredRow.synchronised` row keeps the barrier.
        op_overhead: runtime (:data:`RUNTIME_OF`'s values) -> fraction by which that runtime's F, B
            and W run longer than the profile's; the row's order is still the one generated from the
            undelayed inputs. An analysis of a runtime's overhead (docs/planner.md#calibration: none is
            part of the calibration). Default none.

    Returns:
        A :class:`Prediction`: throughput in samples per GPU per second, iteration, MFU, the
        allocated and the reserved (:meth:`Hardware.reserved`) peak of the fullest rank.

    Raises:
        ParameterError: an unknown model, schedule or hardware; an ``op_overhead`` runtime that is
            not one, or a fraction that is not a finite number > -1.

    Guarantees: the configuration is the paper's — pure PP (TP = DP = 1), the first and last stage
    one layer shorter, 1F1B-I with one layer per chunk, no recompute, no offload — simulated at its
    own m (no extrapolation), with the P2P of the runtime that measured it
    (:data:`RUNTIME_P2P_EXPOSED`; the profile's ``p2p_exposed`` is replaced) and, for the schedules
    the ZB runtime generates itself (:data:`RUNTIME_GENERATES`), the order its inputs give
    (:func:`zb_runtime_inputs`), timed with the planner's per-stage costs; the iteration, MFU and
    throughput are the planner's configuration's, the step after the pipeline included
    (:func:`pipeoffload.planner.step.step_after_pipeline`, the one implementation of it) — with
    ``post_validation``, the ZB runtime's rows' iteration (and MFU, throughput) are the back-to-back
    one instead; memory is the same either way (a rank starts the next iteration after its own last op).
    """
    from ..planner.config import assemble
    from ..planner.space import Split

    problem, family = row_problem(row, hardware)
    scale = 1.0 + _op_overhead(op_overhead, row.runtime)
    sim = simulate_exactly(problem, Split(1, row.gpus, 1), family, row.m, zb_runtime=row.schedule in RUNTIME_GENERATES,
                           op_scale=scale)
    cfg = assemble(problem, sim)
    it_s, mfu = cfg.iteration_ms / 1e3, cfg.mfu
    if post_validation and row.runtime in RUNTIME_POST_VALIDATION and not row.synchronised:
        step = cfg.step
        it_s = post_validation_iteration_ms(sim.schedule, sim.sharded.costs, step.optimizer_ms, step.embedding_ms) / 1e3
        mfu = cfg.mfu * cfg.iteration_ms / 1e3 / it_s
    return Prediction(row, row.m * row.microbatch / (it_s * row.gpus), it_s, mfu, cfg.memory.device / GiB,
                      problem.hardware.reserved(cfg.memory.device) / GiB, cfg.fits, cfg.step_ms / 1e3)


def _op_overhead(op_overhead: Mapping[str, float] | None, runtime: str) -> float:
    """``runtime``'s entry of :func:`predict`'s ``op_overhead`` (0 without one), checked."""
    from ..errors import ParameterError

    for name, f in (op_overhead or {}).items():
        if name not in RUNTIME_P2P_EXPOSED:
            raise ParameterError("op_overhead", f"unknown runtime {name!r}; valid: {', '.join(RUNTIME_P2P_EXPOSED)}")
        if not (isinstance(f, (int, float)) and -1.0 < f < float("inf")):
            raise ParameterError("op_overhead", f"{name}: must be a finite fraction > -1, got {f!r}")
    return float((op_overhead or {}).get(runtime, 0.0))


def row_problem(row: MeasuredRow, hardware: str | Hardware = "a100-80g") -> tuple[Any, Any]:
    """The planner's :class:`~pipeoffload.planner.space.Problem` and
    :class:`~pipeoffload.planner.space.Family` of one measured row (see :func:`predict`).

    Raises:
        ParameterError: an unknown model, schedule or hardware.
    """
    from ..errors import ParameterError
    from ..planner.sharding import node_profile
    from ..planner.space import Family, PlanOptions, Problem

    if row.schedule not in SCHEDULE_FAMILIES:
        raise ParameterError("schedule", f"unknown schedule {row.schedule!r}; valid: {', '.join(SCHEDULE_FAMILIES)}")
    hw = dataclasses.replace(get_hardware(hardware), p2p_exposed=RUNTIME_P2P_EXPOSED[row.runtime])
    model = get_model(row.model, microbatch=row.microbatch)
    name, v, limit = SCHEDULE_FAMILIES[row.schedule]
    if row.schedule == "1F1B-I":  # the paper: "each transformer layer serves as a chunk"
        v = (model.layers + 2) // row.gpus
    # The paper's split: the first and last stage (chunk) one layer shorter (embedding, loss).
    problem = Problem(model, hw, node_profile(hw), hw.default_budget, row.m * row.microbatch, row.gpus,
                      PlanOptions(dp_sharding="none", trim_edges=True))
    return problem, Family(name, v, limit=limit)


def zb_runtime_inputs(model: Any, costs: Any, p: int, limit: float) -> dict[str, Any]:
    """What the ZB runtime gives its automatic scheduler for a ``p``-rank loop pipeline.

    Read from the authors' code of the paper's version (sail-sg/zero-bubble-pipeline-parallelism,
    branch ``arxiv``, ``megatron/core/pipeline_parallel/zb_schedules.py``): ``update_schedule``
    gathers every rank's profiled mean F, B, W (ms), takes each one's upper median over the ranks
    and passes them with the measured hop as whole microseconds (``max(int(t * 1000), 1)``), the
    same on every stage; ``get_zero_bubble_forward_backward_func`` gives the memory model
    F +(34h + 5as), W −32h, B the rest per stage and ``max_mem`` = ``--zero-bubble-max-pending-backward``
    (p for ZB-1p, 2p for ZB-2p) forwards.

    Args:
        model: the :class:`~.model.ModelSpec` (``hidden``, ``heads``, ``seq``).
        costs: the per-stage :class:`~pipeoffload.costs.Costs` the ranks would profile (ms).
        p: pipeline ranks (one stage each).
        limit: the memory limit in multiples of ``p`` forwards (1.0: ZB-1p, 2.0: ZB-2p).

    Returns:
        ``costs``, ``memory`` and ``mem_limit`` keyword arguments for ``ScheduleSpec("zb-auto", ...)``
        (times in microseconds, memory in the runtime's units).

    Raises:
        ParameterError: ``p`` < 1 or ``limit`` ≤ 0.

    Guarantees: whole microseconds as the runtime's: the heuristic compares sums of durations, and
    its ties are then exact (fed the same medians in float milliseconds, the 1.5B model's ZB-1p at
    m = 64 comes out with 149 ms of bubble instead of the runtime order's 173).
    """
    from ..costs import Costs, MemoryDeltas
    from ..errors import ParameterError
    from ..ir import OpKind, Placement

    if p < 1:
        raise ParameterError("p", f"needs at least one rank, got {p}")
    if not limit > 0:
        raise ParameterError("limit", f"must be a positive multiple of p forwards, got {limit}")
    table = costs.duration_table(Placement.loop(p))
    med = [sorted(d[k] for d in table)[p // 2] for k in (OpKind.F, OpKind.B, OpKind.W)]
    f, b, w, c = (max(int(t * 1000), 1) for t in (*med, costs.comm))
    f_mem = 34 * model.hidden + 5 * model.heads * model.seq
    w_mem = -32 * model.hidden
    return {"costs": Costs(F=f, B=b, W=w, comm=c), "memory": MemoryDeltas(f_mem, -f_mem - w_mem, w_mem),
            "mem_limit": limit * p * f_mem}


def simulate_exactly(problem: Any, split: Any, family: Any, m: int, zb_runtime: bool = False,
                     op_scale: float = 1.0) -> Any:
    """The candidate simulated at its own m (the planner's search extrapolates from two smaller m;
    a calibration must not carry that approximation's error); with ``zb_runtime`` (zb-auto only) the
    order is generated from :func:`zb_runtime_inputs` instead of the planner's inputs. ``op_scale``
    multiplies every F, B, W for the timing (not the hop, not the order's inputs); the result's
    ``sharded.costs`` are the scaled ones."""
    from ..costs import Costs
    from ..passes.lower import lower
    from ..planner.simulate import Simulated, Simulator
    from ..planner.space import placement_of
    from ..schedules import ScheduleSpec, build

    if zb_runtime and family.schedule != "zb-auto":
        from ..errors import ParameterError

        raise ParameterError("zb_runtime", f"the ZB runtime generates zb-auto orders only, not {family.schedule!r}")
    simulator = Simulator(problem)
    sh = simulator.costs.sharded(False, split.pp, family.v, split.tp, split.sp)
    if zb_runtime:
        inputs = zb_runtime_inputs(problem.model, sh.costs, split.pp, float(family.limit))
        schedule = build(ScheduleSpec(family.schedule, split.pp, m, **inputs), check=False)
    else:
        schedule = simulator.schedule(family, split.pp, m, False, split.tp, split.sp, split.dp)
    if op_scale != 1.0:  # the ops run longer than profiled; the runtime generated its order from the profile
        c = sh.costs
        gc = [(f * op_scale, b * op_scale, w * op_scale) for f, b, w in c.group_costs]
        sh = dataclasses.replace(sh, costs=Costs(c.F * op_scale, c.B * op_scale, c.W * op_scale, c.comm,
                                                 group_costs=gc))
    tl = lower(schedule, sh.costs, sh.memory, memory_unit="bytes", validated=True).timeline
    return Simulated(split, family, m, False, schedule, tl, sh, placement_of(family, split.pp), tl.makespan,
                     list(tl.busy()), list(tl.peak_memory()), 0.0, m, False)


def post_validation_iteration_ms(schedule: Any, costs: Any, optimizer_ms: float, embedding_ms: float = 0.0,
                                 iterations: int = 3, held_from: Sequence[int] | None = None,
                                 hop_ms: float = 0.0) -> float:
    """The steady iteration (ms) of ``schedule`` run back to back under optimizer post-validation
    (:data:`RUNTIME_POST_VALIDATION`): no barrier between iterations.

    Each rank steps its optimizer (``optimizer_ms``) once its own last op has ended and rank r − 1 has
    started its step (the reduction along the pipeline, ``hop_ms`` later), then runs the next
    iteration's ops; from index ``held_from[r]`` of its compute ops on, rank r waits for the validation
    coming back up the pipeline: the last rank's step start plus ``hop_ms`` per rank between them. By
    default the hold starts at each rank's first B or W (the runtime's ``run_until_post_validation``
    runs only forwards before its ``POST_VALIDATION`` node); the node's own place (``auto_schedule.py``:
    before the last warm-up F, or after all of them) can be passed instead. With a tied embedding on two
    ranks (``embedding_ms`` > 0 and the first and last stage on different ranks), both launch its
    gradient all-reduce when their weight-gradient store is cleared (the first W after which only W
    remain, or microbatch m − 1's: ``WeightGradStore.clear``) and wait for it before their step. Hops
    are on the dependency (``costs.comm``; ``p2p_exposed = 0``, the ZB runtime's P2P). One iteration
    alone without a tied embedding is the planner's makespan + step.

    Args:
        schedule: a compute-only schedule (F, B, W or BW per rank).
        costs: its per-stage :class:`~pipeoffload.costs.Costs` (ms).
        optimizer_ms: the optimizer step (every rank).
        embedding_ms: the tied embedding's gradient all-reduce (0: none).
        iterations: iterations simulated (at least 2).
        held_from: per rank, the index (in its compute ops) of the first op that waits for the
            validation; None: each rank's first op that is not an F.
        hop_ms: the latency of one scalar hop of the reduction down and of the validation up the
            pipeline (the runtime's gloo ``isend``/``irecv`` of CPU scalars); an analysis, 0 by default.

    Returns:
        The distance between the last two iterations' ends, ms.

    Raises:
        ParameterError: ``iterations`` < 2; ``optimizer_ms``, ``embedding_ms`` or ``hop_ms`` < 0;
            ``held_from`` not one index per rank.
        ScheduleError: the order deadlocks.

    Guarantees: never longer than the makespan + ``optimizer_ms`` + ``embedding_ms`` with ``hop_ms`` = 0
    (the planner's iteration, a barrier: it only adds waits); the default hold gives the same floats as
    holding only B and W (an F after a rank's first B starts after it, so after the validation).
    """
    from ..errors import ParameterError
    from ..ir import OpKind

    if iterations < 2:
        raise ParameterError("iterations", f"needs at least 2 to measure a spacing, got {iterations}")
    for name, v in (("optimizer_ms", optimizer_ms), ("embedding_ms", embedding_ms), ("hop_ms", hop_ms)):
        if not v >= 0:
            raise ParameterError(name, f"must be >= 0, got {v}")
    p, pl = schedule.num_ranks, schedule.placement
    if held_from is None:
        held_from = [next((i for i, o in enumerate(c for c in ops if c.kind.is_compute) if o.kind is not OpKind.F),
                          len(ops)) for ops in schedule.ranks]
    elif len(held_from) != p:
        raise ParameterError("held_from", f"needs one index per rank ({p}), got {len(held_from)}")
    tied = (pl.rank_of(0), pl.rank_of(pl.num_stages - 1)) if embedding_ms > 0 else (0, 0)
    free, ends, barrier = [0.0] * p, [], [0.0] * p
    for k in range(iterations):
        last, clear = _timed_iteration(schedule, costs, k, free, barrier, held_from)
        if tied[0] != tied[1]:  # both ranks wait for the all-reduce both launched
            done = max(clear[tied[0]], clear[tied[1]]) + embedding_ms
            last[tied[0]], last[tied[1]] = max(last[tied[0]], done), max(last[tied[1]], done)
        starts: list[float] = []
        for r in range(p):  # the grad-norm / inf reduction runs down the pipeline, then each rank steps
            starts.append(max(last[r], starts[-1] + hop_ms if starts else 0.0))
            free[r] = starts[r] + optimizer_ms
        barrier = [starts[-1] + (p - 1 - r) * hop_ms for r in range(p)]  # the validation, back up
        ends.append(max(free))
    return ends[-1] - ends[-2]


def _clear_index(ops: list, m: int) -> int:
    """Where the ZB runtime clears a rank's weight-gradient store: the first W of microbatch m − 1 or
    after which only W remain (``schedule_w``)."""
    from ..ir import OpKind

    rest_all_w = len(ops)
    for i in range(len(ops) - 1, -1, -1):
        if ops[i].kind is not OpKind.W:
            break
        rest_all_w = i
    return next((i for i, o in enumerate(ops) if o.kind is OpKind.W and (o.microbatch == m - 1 or i >= rest_all_w)),
                len(ops))


def _timed_iteration(schedule: Any, costs: Any, k: int, free: list[float], barrier: Sequence[float],
                     held_from: Sequence[int]) -> tuple[list[float], list[float]]:
    """Iteration ``k`` of :func:`post_validation_iteration_ms`: every rank's ops in order from
    ``free[r]`` (updated), those from index ``held_from[r]`` on not before ``barrier[r]``; returns each
    rank's last end and the start of its weight-gradient store's clearing (:func:`_clear_index`; its
    last end if it has none)."""
    from ..errors import ScheduleError
    from ..ir import OpKind

    pl, m, comm = schedule.placement, schedule.num_microbatches, costs.comm
    dur, last_stage = costs.duration_table(pl), pl.num_stages - 1
    fwd: dict[tuple[int, int], float] = {}
    grad: dict[tuple[int, int], float] = {}
    orders = [[o for o in ops if o.kind.is_compute] for ops in schedule.ranks]
    at = [_clear_index(ops, m) for ops in orders]
    ptr, last, clear = [0] * len(orders), list(free), [0.0] * len(orders)
    moved = True
    while moved:
        moved = False
        for r, ops in enumerate(orders):
            while ptr[r] < len(ops):
                o = ops[ptr[r]]
                s, mb = o.stage, o.microbatch + k * m
                if o.kind is OpKind.F:
                    dep, table = (s - 1, mb), fwd
                elif o.kind is OpKind.W:
                    dep, table = (s, mb), grad
                else:
                    dep, table = ((s, mb), fwd) if s == last_stage else ((s + 1, mb), grad)
                if s == 0 and o.kind is OpKind.F:
                    t = free[r]
                elif dep in table:
                    t = max(free[r], table[dep] + (comm if pl.rank_of(dep[0]) != r else 0.0))
                else:
                    break
                if ptr[r] >= held_from[r]:
                    t = max(t, barrier[r])
                if ptr[r] == at[r]:
                    clear[r] = t
                free[r] = last[r] = t + dur[s][o.kind]
                if o.kind is not OpKind.W:  # W feeds nothing
                    (fwd if o.kind is OpKind.F else grad)[(s, mb)] = free[r]
                ptr[r] += 1
                moved = True
    if any(ptr[r] < len(ops) for r, ops in enumerate(orders)):
        raise ScheduleError(f"{schedule.name}: the order deadlocks when iterations run back to back")
    return last, [c if at[r] < len(orders[r]) else last[r] for r, c in enumerate(clear)]


def compare(rows: Sequence[MeasuredRow] = MEASURED, hardware: str | Hardware = "a100-80g",
            post_validation: bool = False, op_overhead: Mapping[str, float] | None = None) -> list[Prediction]:
    """:func:`predict` for every row."""
    return [predict(r, hardware, post_validation, op_overhead) for r in rows]


def ranking_agrees(preds: Sequence[Prediction], tie: float = 0.0) -> dict[str, bool]:
    """Per setting with two or more measured throughputs: whether the predicted order of its
    schedules is the measured one. With ``tie`` > 0 a pair whose measured throughputs differ by
    less than that fraction is a tie, and either predicted order agrees with it (the paper prints
    two or three digits: 1.84 against 1.85 is no ranking)."""
    by: dict[str, list[Prediction]] = {}
    for p in preds:
        if p.throughput_error is not None:
            by.setdefault(p.row.setting, []).append(p)
    out = {}
    for setting, ps in by.items():
        if len(ps) > 1:
            out[setting] = all(
                (a.throughput - b.throughput) * (a.row.throughput - b.row.throughput) > 0
                or abs(a.row.throughput / b.row.throughput - 1) < tie
                for i, a in enumerate(ps) for b in ps[i + 1:])
    return out
