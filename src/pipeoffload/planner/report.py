"""The text of a plan, and why the planner rejected what it rejected. Pure Python.

:func:`family_rejections` turns a search's candidates into one rejection per family that
produced no configuration (:class:`~pipeoffload.planner.refusals.Rejection`);
:func:`format_table` is the ``pipeoffload plan`` text. The arguments are the search's
candidates and a ``PlanResult`` (``planner/result.py``), read by attribute: this module
imports neither, so the modules that build a result never import the one that prints it.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ..costmodel.hardware import GiB, Hardware
from ..recompute import Recompute
from .refusals import Refused, Rejection

__all__ = ["Rejection", "Refused", "family_rejections", "format_table"]


class _Searched(Protocol):
    """What :func:`family_rejections` reads of a search candidate."""

    family: Any
    attempts: list[Any]
    refusals: list[Refused]
    fit: Any
    pruned: str | None


#: The table's recompute column: off, on (elementwise), sel (selective), ful (full).
_RC_SHORT = {Recompute.NONE: "off", Recompute.ELEMENTWISE: "on", Recompute.SELECTIVE: "sel", Recompute.FULL: "ful"}
_KIND_WORDS = {"m": "m too small", "generator": "generator refused", "offload": "offload infeasible",
               "same": "not searched"}


def family_rejections(candidates: Sequence[_Searched], labels: Sequence[str]) -> list[Rejection]:
    """One rejection per family (by label, in ``labels``' order) whose candidates produced no
    fitting configuration: the closest OOM (a lower bound or a simulated configuration,
    whichever missed by less), else the generator's or the m rule's refusal, else the pruning.

    Guarantees: a family with a fitting candidate gets no entry; every other label gets exactly one.
    """
    out = []
    for label in labels:
        mine = [c for c in candidates if c.family.label == label]
        if not any(c.fit for c in mine):
            out.append(_family_rejection(label, mine))
    return out


def _family_rejection(label: str, mine: Sequence[_Searched]) -> Rejection:
    tried = [a for c in mine for a in c.attempts]
    refusals = [r for c in mine for r in c.refusals]
    pruned = [c for c in mine if c.pruned]
    extra = [f"{len(pruned)} split(s) pruned: {pruned[0].pruned}"] if pruned else []
    bounds = [r for r in refusals if r.kind == "oom"]
    if bounds and (not tried or min(r.over for r in bounds) < min(a.over for a in tried)):  # type: ignore[type-var]
        r = min(bounds, key=lambda r: r.over)  # type: ignore[arg-type,return-value]
        reason = f"OOM by ≥ {r.over / GiB:.2f} GiB at best ({r.config}: {r.reason})"  # type: ignore[operator]
        return Rejection(label, "oom", "; ".join([reason] + extra), over=r.over, config=r.config)
    if tried:
        return _closest_oom(label, tried, refusals, extra)
    if refusals:
        r = refusals[0]
        return Rejection(label, r.kind, "; ".join([f"{_KIND_WORDS[r.kind]}: {r.reason}"] + extra), config=r.config)
    return Rejection(label, "pruned", "; ".join(extra) or "not evaluated")


def _closest_oom(label: str, tried: Sequence[Any], refusals: Sequence[Refused], extra: list[str]) -> Rejection:
    """The simulated configuration of the family that missed the budget by the least."""
    best = min(tried, key=lambda a: a.over)
    reason = f"OOM by {best.over / GiB:.2f} GiB at best ({best.describe()}: " \
             f"{best.memory.device / GiB:.1f} GiB of which activations {best.memory.activations / GiB:.1f})"
    if best.dropped_offloads:
        reason += (f"; offload infeasible in part: {best.dropped_offloads} reloads could not finish before "
                   "their backward (host link too slow), those activations stayed on the device")
    offload = [r for r in refusals if r.kind == "offload"]
    if offload:  # why offload could not rescue it (e.g. pinned host memory over the node's)
        extra = extra + [f"offload refused: {offload[0].reason}"]
    kinds = sorted({r.kind for r in refusals if r.kind not in ("offload", "oom")})
    if kinds:
        extra = extra + ["other splits: " + ", ".join(kinds)]
    return Rejection(label, "oom", "; ".join([reason] + extra), over=best.over, config=best.describe())


# ---------------------------------------------------------------------------------------------
# Text


def format_table(res: Any) -> str:
    """The ``pipeoffload plan`` text: what was searched, the fitting configurations ranked (or
    that none fits), the best one in a sentence, and the rejections."""
    m = res.model
    lines = [
        f"plan: {m.name} ({m.params() / 1e9:.1f}B params, seq {m.seq}, microbatch {m.microbatch}) on "
        f"{res.gpus} × {res.hardware.name}; budget {res.budget / GiB:.3g} GiB per device; "
        f"global batch {res.global_batch} sequences",
        f"searched {res.stats['candidates']} (split, schedule) candidates over {res.stats['splits']} splits: "
        f"{res.stats['simulations']} simulations, {res.stats['offload_plans']} offload plans, "
        f"{res.stats['seconds']:.1f} s",
    ]
    if res.configs:
        lines += _config_rows(res.configs) + ["", _best_sentence(res.configs[0]), _step_line(res.configs[0]),
                                              _prediction_line(res)]
    else:
        lines += ["", f"no configuration fits {res.budget / GiB:.3g} GiB per device"]
    if res.rejected or res.rejected_splits:
        lines += ["", "rejected:"] + _rejection_lines(res)
    return "\n".join(lines)


def _config_rows(configs: Sequence[Any]) -> list[str]:
    hdr = (f"{'#':>2} {'schedule':<30} {'TP':>2} {'PP':>3} {'DP':>3} {'m':>5} {'rc':>3} {'off':>3} "
           f"{'params':>7} {'grad+opt':>8} {'act':>6} {'device':>7} {'host':>6} {'iter s':>8} "
           f"{'MFU':>6} {'bubble':>6}")
    lines = ["", "configurations that fit (GiB per device; host = pinned host memory of offloaded activations):",
             hdr, "-" * len(hdr)]
    for i, c in enumerate(configs, 1):
        mem = c.memory
        off = f"{c.offload_chunks}{'+s' if c.offload_stash else ''}" if c.offload_chunks else "-"  # +s: B→W stash
        lines.append(
            f"{i:>2} {c.name:<30} {c.split.tp:>2} {c.split.pp:>3} {c.split.dp:>3} {c.m:>5} "
            f"{_RC_SHORT.get(c.recompute, 'off'):>3} {off:>3} {mem.params / GiB:>7.1f} "
            f"{mem.grads_optimizer / GiB:>8.1f} {mem.activations / GiB:>6.1f} {mem.device / GiB:>7.1f} "
            f"{mem.host_max / GiB:>6.1f} {c.iteration_ms / 1e3:>8.3f} {c.mfu:>6.1%} {c.bubble_rate:>6.1%}"
        )
    return lines


def _best_sentence(b: Any) -> str:
    return (f"best: {b.describe()}: {b.iteration_ms / 1e3:.3f} s per iteration "
            f"({b.tokens_per_s:,.0f} tokens/s), MFU {b.mfu:.1%}, bubble {b.bubble_rate:.1%}, "
            f"device peak {b.memory.device / GiB:.1f} GiB on rank {b.memory.rank}"
            + (f"; DP all-reduce exposed {b.dp_exposed_ms:.1f} ms" if b.dp_exposed_ms else "")
            + (f"; simulated at m={b.simulated_m}, extrapolated" if b.extrapolated else "")
            + (f"; {'; '.join(b.notes)}" if b.notes else ""))


def _step_line(b: Any) -> str:
    """The best plan's step after the pipeline (planner/step.py), part of its iteration."""
    share = f", {b.step_ms / b.iteration_ms:.1%} of the iteration" if b.iteration_ms > 0 else ""
    return f"step after the pipeline: {b.step.describe()}{share}"


def calibration_note(hardware: "Hardware") -> str:
    """How far the profile's predictions were from measurements: its ``calibration`` text, or that
    it was not checked against any."""
    return hardware.calibration or "not checked against measurements (uncalibrated profile)"


def _prediction_line(res: Any) -> str:
    """The best plan's predicted iteration time, MFU and peak memory with the profile's calibration
    error beside them."""
    b, hw = res.configs[0], res.hardware
    parts = f"pipeline {b.makespan_ms / 1e3:.3f} s" + (f" + DP exposed {b.dp_exposed_ms / 1e3:.3f} s"
                                                      if b.dp_exposed_ms else "") + f" + step {b.step_ms / 1e3:.3f} s"
    return (f"predicted on {hw.name}: iteration {b.iteration_ms / 1e3:.3f} s ({parts}), MFU {b.mfu:.1%}, peak "
            f"{b.memory.device / GiB:.1f} GiB allocated ({hw.reserved(b.memory.device) / GiB:.1f} GiB reserved "
            f"by the caching allocator); calibration: {calibration_note(hw)}")


def _rejection_lines(res: Any) -> list[str]:
    """Per family, then the splits rejected for a rule, then those whose states alone exceed
    the budget (on one line)."""
    lines = [f"  {r.family}: {r.reason}" for r in res.rejected]
    lines += [f"  {r.family}: {r.reason}" for r in res.rejected_splits if r.over is None]
    state = [r for r in res.rejected_splits if r.over is not None]
    if state:
        lines.append("  splits whose parameters, gradients and optimizer states alone exceed the budget "
                     "(average per device): " + ", ".join(
                         f"{r.family} ({(r.over + res.budget) / GiB:.1f} GiB)" for r in state))  # type: ignore[operator]
    return lines
