"""Where in a step an error happened: the rank, the op and its place in the program.

An exception raised while a rank runs its program (a user's stage, the loss, the
activation store, a transfer) would otherwise reach the user as "rank 1 failed:
ValueError: ..." with nothing saying which layer group, microbatch or op raised it.
:func:`locate` attaches that:

- an error of this library (its class is defined in ``pipeoffload``: a
  :class:`~pipeoffload.errors.ParameterError`, a ``CommError``, an ``OffloadError``)
  keeps its type, so ``except`` clauses keep working; the place is added as a note
  (shown with its traceback) and as its ``where`` attribute (the launcher's one-line
  summary appends it);
- any other error (the user's code, torch) becomes a :class:`StepError` whose message
  gives the original type and text, then the place; the original is its
  ``__cause__`` and its ``original`` attribute.
"""

from __future__ import annotations

from typing import Sequence

from ..ir import Op

#: Ops shown on each side of the failing one.
AROUND = 2


class StepError(RuntimeError):
    """An error raised inside a step, with where it happened (module docstring).

    Attributes: ``rank`` (pipeline rank), ``op`` (the op that raised, or None outside
    any op), ``position`` (its 0-based index in the rank's program, -1 before the first
    op, ``len(program)`` after the last), ``where`` (the place as text), ``original``."""

    def __init__(self, message: str, rank: int, op: Op | None, position: int, where: str,
                 original: BaseException) -> None:
        super().__init__(message)
        self.rank, self.op, self.position, self.where, self.original = rank, op, position, where, original


def _brief(op: Op) -> str:
    return f"{op.kind.value}(s{op.stage},mb{op.microbatch})"


def describe_place(rank: int, ops: Sequence[Op], pos: int) -> str:
    """``pos`` in rank ``rank``'s program ``ops`` as text: the op (kind, layer group,
    microbatch), its position and the :data:`AROUND` ops on each side."""
    n = len(ops)
    if pos < 0:
        head = f"rank {rank}, before the first op of its program ({n} ops)"
    elif pos >= n:
        head = f"rank {rank}, after the last op of its program ({n} ops): completing sends, reducing gradients"
    else:
        op = ops[pos]
        head = (f"rank {rank}, {op.kind.value} of layer group {op.stage}, microbatch {op.microbatch} "
                f"(op {pos + 1} of {n} of its program)")
    lo, hi = max(0, pos - AROUND), min(n, pos + AROUND + 1)
    if lo >= hi:
        return head
    around = " ".join(f"[{_brief(ops[i])}]" if i == pos else _brief(ops[i]) for i in range(lo, hi))
    return f"{head}; ops around it: {'... ' if lo > 0 else ''}{around}{' ...' if hi < n else ''}"


def locate(error: BaseException, rank: int, ops: Sequence[Op], pos: int) -> BaseException:
    """``error`` with its place in the step attached (module docstring): the same
    object (a library error, annotated, or one already located) or a new
    :class:`StepError` to raise ``from error``."""
    if getattr(error, "where", None) is not None:
        return error  # located already (a nested run)
    where = describe_place(rank, ops, pos)
    if type(error).__module__.startswith("pipeoffload."):
        error.where = where  # type: ignore[attr-defined]
        error.add_note(f"raised at {where}")
        return error
    text = str(error).strip() or "(no message)"
    op = ops[pos] if 0 <= pos < len(ops) else None
    return StepError(f"{type(error).__name__}: {text} — raised at {where}", rank, op, pos, where,
                     error)
