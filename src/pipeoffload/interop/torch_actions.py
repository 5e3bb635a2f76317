"""Convert schedules to and from torch's in-memory ``_Action`` lists.

Unlike :mod:`pipeoffload.interop.torch_csv` this needs torch, which it imports only when a
function is called, so importing this module stays cheap. Use it from code that already
runs torch (the runtime, tests, benchmarks against ``torch.distributed.pipelining``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from ..ir import Placement, Schedule
from .torch_csv import from_actions, to_actions

if TYPE_CHECKING:  # pragma: no cover
    from torch.distributed.pipelining.schedules import _Action

__all__ = ["to_torch_actions", "from_torch_actions"]


def to_torch_actions(schedule: Schedule, strict: bool = False) -> dict[int, list["_Action"]]:
    """``{rank: [_Action, ...]}`` as torch's ``pipeline_order`` holds it.

    Same mapping and skipping rules as :func:`~pipeoffload.interop.torch_csv.to_actions`;
    the result passes ``torch.distributed.pipelining.schedules._validate_schedule``."""
    from torch.distributed.pipelining.schedules import _Action

    return {r: [_Action.from_str(a) for a in row] for r, row in enumerate(to_actions(schedule, strict))}


def from_torch_actions(
    actions: Mapping[int, Sequence["_Action | None"]],
    placement: str | Placement | None = None,
    num_microbatches: int | None = None,
    name: str = "imported",
    keep_comm: bool = False,
) -> Schedule:
    """A validated :class:`Schedule` from torch's ``{rank: [_Action | None, ...]}``
    (e.g. a schedule object's ``pipeline_order``); ranks must be 0..p-1.
    Reads as :func:`~pipeoffload.interop.torch_csv.from_actions` (``None`` = idle step)."""
    from ..errors import ParameterError

    ranks = sorted(actions)
    if ranks != list(range(len(ranks))):
        raise ParameterError("actions", f"ranks must be 0..{len(ranks) - 1}, got {ranks}")
    rows = [["" if a is None else str(a) for a in actions[r]] for r in ranks]
    return from_actions(rows, placement, num_microbatches, name, keep_comm, source="torch actions", param="actions")
