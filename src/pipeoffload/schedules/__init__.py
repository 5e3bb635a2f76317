"""Schedule registry: generate a schedule by name. Pure Python (no torch).

>>> from pipeoffload.schedules import generate
>>> s = generate("1f1b", p=4, m=8)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..errors import ParameterError
from ..ir import Schedule
from .spec import ScheduleSpec

__all__ = ["ScheduleSpec", "ScheduleInfo", "SCHEDULES", "generate", "build", "info", "names"]


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    module: str  #: module under pipeoffload.schedules
    function: str
    summary: str
    placement: str  #: "loop" or "v"
    default_v: int
    split_backward: bool  #: uses separate B and W ops

    def generator(self) -> Callable[[ScheduleSpec], Schedule]:
        mod = importlib.import_module(f"pipeoffload.schedules.{self.module}")
        return getattr(mod, self.function)


#: Every schedule, in the order `pipeoffload schedules` lists them.
SCHEDULES: dict[str, ScheduleInfo] = {
    i.name: i
    for i in [
        ScheduleInfo("gpipe", "classic", "gpipe", "GPipe: all forwards, then all backwards; peak m units", "loop", 1, False),
        ScheduleInfo("1f1b", "classic", "one_f_one_b", "1F1B: warm-up, then one forward one backward; peak p units", "loop", 1, False),
        ScheduleInfo("interleaved-1f1b", "classic", "interleaved_1f1b",
           "Megatron interleaved 1F1B, v chunks (loop placement); bubble /v, any m >= p", "loop", 2, False),
        ScheduleInfo("group-interleaved", "classic", "group_interleaved",
           "Group-interleaved 1F1B (PipeOffload's base), group g in [ceil(p/2), p]; peak g*v+p-g chunks", "loop", 2, True),
        ScheduleInfo("zb-h1", "zero_bubble", "zb_h1", "Zero bubble H1: B/W split, 1F1B's memory, bubble (p-1)(F+B-W)", "loop", 1, True),
        ScheduleInfo("zb-h2", "zero_bubble", "zb_h2", "Zero bubble H2: peak 2p-1, bubble (p-1)(F+B-2W) floored at 0", "loop", 1, True),
        ScheduleInfo("zb-auto", "zero_bubble", "zb_auto",
           "Automatic zero bubble under a memory limit (--mem-limit; p = ZB-1p, 2p = ZB-2p)", "loop", 1, True),
        ScheduleInfo("zb-v", "zero_bubble", "zb_v", "ZB-V: V placement, 1F1B's memory, bubble ~0 when F=B=W", "v", 2, True),
        ScheduleInfo("v-min", "vshape", "v_min", "V-Min: ~1/3 of 1F1B's memory, bubble ~2/3 of 1F1B's", "v", 2, True),
        ScheduleInfo("v-half", "vshape", "v_half", "V-Half: ~1/2 of 1F1B's memory, bubble ~1/2 of 1F1B's", "v", 2, True),
        ScheduleInfo("v-zb", "vshape", "v_zb", "V-ZB: 1F1B's memory, bubble ~0 (building-block method)", "v", 2, True),
        ScheduleInfo("v-auto", "v_auto", "v_auto",
           "V-auto: building-block search for the best V schedule within --mem-limit (default V-Half's peak)", "v", 2, True),
        ScheduleInfo("dualpipev", "dualpipev", "dualpipev",
           "DualPipeV (DeepSeek): V placement, overlapped F&B pairs; bubble (p-1)(F&B+B-3W), peak 2p+1 chunks; m >= 2p",
           "v", 2, True),
    ]
}


def names() -> list[str]:
    return list(SCHEDULES)


def info(name: str) -> ScheduleInfo:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ParameterError("schedule", f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}") from None


def build(spec: ScheduleSpec, check: bool = True) -> Schedule:
    """Generate the schedule ``spec`` names; validate it unless ``check`` is False."""
    sched = info(spec.name).generator()(spec)
    if check:
        from ..passes.validate import validate

        validate(sched)
    return sched


def generate(name: str, p: int, m: int, **kwargs) -> Schedule:
    """The schedule ``name`` for ``p`` ranks and ``m`` microbatches, validated.

    Args:
        name: a registry name (``pipeoffload schedules`` lists them, e.g. "zb-v").
        p: pipeline ranks.
        m: microbatches per step.
        **kwargs: as in :class:`ScheduleSpec`: ``v`` (chunks per rank), ``g`` (group
            size of group-interleaved), ``mem_limit`` (zb-auto, zb-v, v-auto), ...

    Returns:
        A :class:`~pipeoffload.ir.Schedule`: every rank's compute ops in order and the
        placement of its p·v stages.

    Raises:
        ParameterError: naming ``name``, ``p``, ``m``, ``v``, ``g`` or ``mem_limit`` and
            what the family accepts (e.g. m ≥ 2p for dualpipev).
        ScheduleError: the generated order breaks a rule (never expected; a bug).

    Guarantees:
        The result passed :func:`~pipeoffload.passes.validate.validate`: each (stage,
        microbatch) has its F, B and W (or BW) exactly once on the rank the placement
        gives, in dependency order, and the pipeline cannot deadlock.
    """
    return build(ScheduleSpec(name, p, m, **kwargs))
