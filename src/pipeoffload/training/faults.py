"""Fault injection: make one rank fail on purpose, to test that failures are survivable.

A fault is given as ``"op=ACTION,rank=R,step=N[,at=OPKIND]"`` — in the training
configuration (``[runtime] fault_injection = "..."``, ``--fault-injection``) or in the
environment variable ``PIPEOFFLOAD_FAULT`` (which wins, so a fault reaches ranks started
by ``torchrun`` too). Steps are numbered from 1 (the N-th optimizer step). Actions:

- ``kill``: ``os.kill(os.getpid(), SIGKILL)`` on rank R when, during step N, it is about
  to run its first op of kind ``at`` (F, B, W, BW, SEND_F, RECV_F, SEND_B, RECV_B;
  default ``B``, which also matches a fused ``BW``: mid-step, after it has sent
  activations its peers are now waiting to turn into gradients);
- ``raise``: raise :class:`InjectedFault` at the same point (an ordinary Python error);
- ``hang``: sleep forever at the same point (its peers' waits must time out);
- ``nan_loss``: multiply the loss of every microbatch of step N by NaN on the rank
  holding the last layer group (``rank`` is ignored), so the loss and every gradient
  become non-finite;
- ``nan_grad``: after step N's backward, set one gradient element of rank R to NaN.

This module is the only place that knows about faults; the training loop calls
:meth:`FaultInjector.begin_step`, passes :meth:`FaultInjector.wrap_loss` as the loss,
installs :meth:`FaultInjector.before_op` as the runner's per-op hook, and calls
:meth:`FaultInjector.after_backward`. Parsing is pure Python (no torch).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ParameterError

#: Environment variable that overrides the configured fault.
ENV_VAR = "PIPEOFFLOAD_FAULT"
ACTIONS = ("kill", "raise", "hang", "nan_loss", "nan_grad")
_AT_KINDS = ("F", "B", "W", "BW", "SEND_F", "RECV_F", "SEND_B", "RECV_B")


def _matches(kind: str, at: str) -> bool:
    """``at=B`` means "the backward": a split B or a fused BW."""
    return kind == at or (at == "B" and kind == "BW")


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault raises."""


@dataclass(frozen=True)
class FaultSpec:
    op: str  #: one of ACTIONS
    rank: int | None  #: None only for nan_loss
    step: int  #: 1-based optimizer step
    at: str = "B"  #: op kind before which kill/raise/hang fires
    source: str = field(default="runtime.fault_injection", compare=False)  #: for error messages

    @classmethod
    def parse(cls, text: str, param: str = "runtime.fault_injection") -> "FaultSpec":
        """Parse ``"op=kill,rank=1,step=2,at=B"``; ParameterError naming ``param`` otherwise."""
        fields: dict[str, str] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            key, eq, val = part.partition("=")
            if not eq:
                raise ParameterError(param, f"expected key=value pairs (op, rank, step, at), got {part.strip()!r}")
            fields[key.strip()] = val.strip()
        unknown = sorted(set(fields) - {"op", "rank", "step", "at"})
        if unknown:
            raise ParameterError(param, f"unknown key {unknown[0]!r}; valid: op, rank, step, at")
        op = fields.get("op")
        if op not in ACTIONS:
            raise ParameterError(param, f"op must be one of {', '.join(ACTIONS)}, got {op!r}")
        try:
            step = int(fields["step"])
            rank = int(fields["rank"]) if "rank" in fields else None
        except KeyError:
            raise ParameterError(param, "needs step=N (1-based optimizer step)") from None
        except ValueError:
            raise ParameterError(param, f"rank and step must be integers, got {text!r}") from None
        if step < 1:
            raise ParameterError(param, f"step must be >= 1 (steps count from 1), got {step}")
        if rank is None and op != "nan_loss":
            raise ParameterError(param, f"op={op} needs rank=R")
        at = fields.get("at", "B")
        if at not in _AT_KINDS:
            raise ParameterError(param, f"at must be one of {', '.join(_AT_KINDS)}, got {at!r}")
        return cls(op, rank, step, at, param)

    def check(self, world_size: int, program: Any = None) -> None:
        """Check the rank, and with ``program`` (the schedule after the comm pass)
        that the rank runs an op the fault can fire at."""
        param = self.source
        if self.rank is not None and not 0 <= self.rank < world_size:
            raise ParameterError(param, f"rank must be in 0..{world_size - 1}, got {self.rank}")
        if program is not None and self.op in ("kill", "raise", "hang"):
            kinds = sorted({o.kind.value for o in program.ranks[self.rank]})
            if not any(_matches(k, self.at) for k in kinds):
                raise ParameterError(param, f"rank {self.rank} never runs at={self.at} in this schedule; "
                                     f"its ops: {', '.join(kinds)}")

    def __str__(self) -> str:
        rank = "" if self.rank is None else f",rank={self.rank}"
        return f"op={self.op}{rank},step={self.step},at={self.at}"


def resolve(configured: str | None) -> FaultSpec | None:
    """The fault in force: ``$PIPEOFFLOAD_FAULT`` if set (non-empty), else ``configured``."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return FaultSpec.parse(env, ENV_VAR)
    return FaultSpec.parse(configured) if configured else None


class FaultInjector:
    """Fires ``spec`` on this rank (see the module docstring). With ``spec=None`` every
    method is a no-op, so the training loop calls them unconditionally."""

    def __init__(self, spec: FaultSpec | None, rank: int, holds_loss: bool) -> None:
        self.spec = spec
        self.rank = rank
        self.holds_loss = holds_loss
        self.step = 0
        self._fired = False

    @property
    def active(self) -> bool:
        return self.spec is not None

    def begin_step(self, step: int) -> None:
        """Call before step ``step`` (1-based) runs."""
        self.step = step

    def _now(self, op: str) -> bool:
        s = self.spec
        if s is None or s.op != op or self.step != s.step:
            return False
        if op == "nan_loss":
            return self.holds_loss
        return s.rank == self.rank

    def before_op(self, op: Any) -> None:
        """The runner's per-op hook: kill, raise or hang at the first matching op."""
        s = self.spec
        if s is None or self._fired or s.op not in ("kill", "raise", "hang") or not self._now(s.op):
            return
        if not _matches(op.kind.value, s.at):
            return
        self._fired = True
        where = f"rank {self.rank} at step {self.step}, before {op}"
        # Announced (with the time) so a test can measure how fast the others stop.
        print(f"pipeoffload: injected fault {s.op}: {where} (t={time.time():.3f})", file=sys.stderr, flush=True)
        if s.op == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # not reached: SIGKILL cannot be caught
        if s.op == "raise":
            raise InjectedFault(f"injected fault ({ENV_VAR} / runtime.fault_injection): {where}")
        while True:  # hang
            time.sleep(3600)

    def wrap_loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``loss_fn`` whose result is multiplied by NaN during the ``nan_loss`` step."""
        if self.spec is None or self.spec.op != "nan_loss":
            return loss_fn

        def loss(*args: Any, **kwargs: Any) -> Any:
            out = loss_fn(*args, **kwargs)
            return out * float("nan") if self._now("nan_loss") else out

        return loss

    def after_backward(self, params: list) -> None:
        """For ``nan_grad``: poison one gradient element of this rank."""
        if not self._now("nan_grad"):
            return
        for p in params:
            if p.grad is not None and p.grad.numel() > 0:
                p.grad.view(-1)[0] = float("nan")
                return
