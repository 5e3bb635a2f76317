"""The executor: interpret one rank's program (compute, send/receive, offload ops).

User API
--------
>>> runner = PipelineRunner(stage_modules, loss_fn, schedule)        # on every rank
>>> result = runner.step(inputs, targets)                             # one iteration
>>> result.loss          # mean loss over microbatches, on the rank holding the last layer group

``stage_modules`` gives the layer groups (``torch.nn.Module``) this rank runs: a
mapping ``{stage: module}`` holding at least this rank's stages, a sequence of all
``num_stages`` modules (this rank picks its own), or a callable ``stage -> module``
(called only for this rank's stages, so no rank builds the whole model). A stage
module takes one tensor and returns one tensor; the first gets the microbatch input,
the last's output goes to ``loss_fn(output, target) -> scalar``.

``inputs``/``targets`` are the ``m`` microbatches of one iteration (only the rank of
the first / last layer group reads them; others may pass ``None``). Gradients are
accumulated into each parameter's ``.grad`` scaled by ``1/m``: the result equals the
gradient of the mean loss over the microbatches. Call your optimizer afterwards.

What one step does
------------------
The schedule goes through :func:`pipeoffload.passes.lower` (``comm=True``: validated,
then :func:`pipeoffload.passes.comm.insert_comm`),
which adds sends/receives and proves the order deadlock-free before anything runs.
Then each rank walks its list:

- ``RECV_*``: wait (with a timeout) for an ``irecv`` posted ahead of time;
- ``F``: run the stage under saved-tensor hooks (activation store + memory meter);
  the last stage also computes the loss; the output goes to the next stage, by
  ``isend`` or, when the next layer group is on this rank (V turn), by local hand-off;
- ``B``: backward from the stage output for the input gradient; ``nn.Linear`` weight
  gradients are deferred to the weight-gradient store; other parameters get theirs now;
- ``W``: pop the store and accumulate the linear layers' weight gradients;
- ``BW``: ``B`` then ``W``;
- ``SEND_*``: ``isend`` (never waited on until the end of the step);
- ``OFFLOAD_*``/``RELOAD_*``: calls on the activation store (see ``activations.py``).

Each op is timed (seconds from the step start, after a barrier) and its activation
memory change measured, giving a per-rank list of :class:`~pipeoffload.timeline.TimedOp`.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks

from ..errors import ParameterError
from ..ir import Op, OpKind, Schedule
from ..passes.comm import incoming_order, message_key, message_tag
from ..passes.lower import lower
from ..timeline import TimedOp
from .activations import ActivationStore, KeepActivations
from .meter import MemoryMeter, make_meter
from .p2p import P2P, CommTimeout
from .weight_grad import WeightGradStore, convert_linears

StageModules = Mapping[int, nn.Module] | Sequence[nn.Module] | Callable[[int], nn.Module]


@dataclass(frozen=True)
class OpSample:
    """One measured compute piece: ``kind`` is "F", "B" or "W" (a BW gives a B and a W)."""

    stage: int
    kind: str
    duration: float  #: seconds
    mem: float  #: activation-memory change, bytes
    peak: float = 0.0  #: highest level during the op above its start level, bytes (the in-op transient)


@dataclass
class StepResult:
    rank: int
    loss: float | None  #: mean over microbatches (rank with the last layer group), else None
    losses: list[float] | None  #: per microbatch, unscaled
    events: list[TimedOp]  #: this rank's measured ops; times in s from the step start
    samples: list[OpSample]
    peak_memory: float  #: bytes above the step-start level (meter's definition)
    step_time: float  #: s, barrier to last send completed
    meta: dict = field(default_factory=dict)


class PipelineRunner:
    """Runs a schedule on this rank's layer groups (see module docstring).

    Parameters: ``rank`` (default ``dist.get_rank()``), ``device`` (default: where the
    first parameter lives), ``timeout_s`` for every blocking wait, ``activation_store``
    (offload hook point), ``meter`` ("auto", "saved", "cuda", "none" or a
    :class:`MemoryMeter`), ``recv_lookahead`` receives posted ahead of their consumer,
    ``sync_timing`` (synchronize the CUDA compute stream around each op for exact timings;
    default on CUDA; the offload copy streams keep running).
    """

    def __init__(
        self,
        stage_modules: StageModules,
        loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
        schedule: Schedule,
        *,
        rank: int | None = None,
        device: torch.device | str | None = None,
        timeout_s: float = 120.0,
        activation_store: ActivationStore | None = None,
        meter: str | MemoryMeter = "auto",
        recv_lookahead: int = 2,
        sync_timing: bool | None = None,
        group: Any = None,
    ) -> None:
        self.schedule = schedule
        self.program = lower(schedule, comm=True).schedule  # validated, sends/receives added
        if any(op.kind.window == "stash" for op in self.program.ops()):  # planned with stash=True
            raise ParameterError("stash", "the B→W offload window (STASH_* transfer ops: the weight-gradient "
                                 "stash moved to host between B and W) is not supported by the runtime yet; "
                                 "plan offload without `stash`")
        self.group = group
        self.rank = _pipeline_rank(schedule, group, rank)
        pl = schedule.placement
        self.placement = pl
        self.num_stages = pl.num_stages
        self.my_stages = pl.stages_of(self.rank)
        self.modules = _pick_modules(stage_modules, self.my_stages, self.num_stages)
        self.device = self._place_modules(device)
        self.loss_fn = loss_fn
        self.timeout_s = float(timeout_s)
        self.store = activation_store or KeepActivations()
        self.meter = meter if isinstance(meter, MemoryMeter) else make_meter(self.device, meter)
        if hasattr(self.meter, "exclude"):
            self.meter.exclude(self._resident_tensors())
        self.wg = WeightGradStore(hold=self.meter.hold)
        self.p2p = P2P(self.rank, self.timeout_s, self.device, group)
        self.sync_timing = self.device.type == "cuda" if sync_timing is None else sync_timing
        self.recv_lookahead = max(0, int(recv_lookahead))
        self.ops: list[Op] = self.program.ranks[self.rank]
        #: Called with each op right before it runs (fault injection, tracing); None = off.
        self.before_op: Callable[[Op], None] | None = None
        self._index_program()
        # The activation store learns the device, the meter, what never moves and
        # which (stage, microbatch) pairs this rank's program offloads.
        self.store.bind(device=self.device, meter=self.meter, exclude=self._resident_tensors(),
                        offloaded=[(op.stage, op.microbatch) for op in self.ops if op.kind is OpKind.OFFLOAD_START])
        self._in_meta: dict[int, tuple[tuple[int, ...], torch.dtype]] = {}
        self._out_meta: dict[int, tuple[tuple[int, ...], torch.dtype]] = {}
        self._ready = False
        self._dispatch, self._store_calls = self._op_handlers()

    def _place_modules(self, device: torch.device | str | None) -> torch.device:
        """Move this rank's stages to ``device`` (default: where their first parameter
        lives, else the CPU) and route their linear layers through the weight-gradient
        store; returns the device."""
        if device is None:
            device = next((p.device for mod in self.modules.values() for p in mod.parameters()), torch.device("cpu"))
        device = torch.device(device)
        for mod in self.modules.values():
            mod.to(device)
            convert_linears(mod)
        return device

    def _resident_tensors(self) -> list[torch.Tensor]:
        """Parameters and buffers of this rank's stages: never offloaded, not activations."""
        return [t for mod in self.modules.values() for t in list(mod.parameters()) + list(mod.buffers())]

    def _index_program(self) -> None:
        """Where this rank's receives are, which forwards have a split backward, and the
        order in which each peer sends to this rank."""
        self._recv_ops = [i for i, op in enumerate(self.ops) if op.kind in (OpKind.RECV_F, OpKind.RECV_B)]
        # Only forwards whose backward is split (B, later W) route linears through the
        # weight-gradient store; under a fused BW they run as plain nn.Linear (native
        # autograd: ~5-8% less compute than the deferred path on CPU).
        self._split = {(op.stage, op.microbatch) for op in self.ops if op.kind is OpKind.B}
        self._recv_rank_of_pos = {pos: k for k, pos in enumerate(self._recv_ops)}
        self._incoming = incoming_order(self.program, self.rank)

    def _op_handlers(self) -> tuple[dict[OpKind, Callable[[Op], None]], dict[OpKind, Callable[[int, int], None]]]:
        """The method that runs each op kind, and the store call of each transfer kind."""
        dispatch = {
            OpKind.F: self._op_forward, OpKind.B: self._op_backward, OpKind.W: self._op_weight,
            OpKind.BW: self._op_backward_weight,
            OpKind.SEND_F: self._op_send, OpKind.SEND_B: self._op_send,
            OpKind.RECV_F: self._op_recv, OpKind.RECV_B: self._op_recv,
            OpKind.OFFLOAD_START: self._op_transfer, OpKind.OFFLOAD_END: self._op_transfer,
            OpKind.RELOAD_START: self._op_transfer, OpKind.RELOAD_END: self._op_transfer,
        }
        store_calls = {
            OpKind.OFFLOAD_START: self.store.offload_start, OpKind.OFFLOAD_END: self.store.offload_end,
            OpKind.RELOAD_START: self.store.reload_start, OpKind.RELOAD_END: self.store.reload_end,
        }
        return dispatch, store_calls

    # ------------------------------------------------------------------ setup
    @property
    def has_first_stage(self) -> bool:
        return 0 in self.my_stages

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.my_stages

    def parameters(self) -> list[nn.Parameter]:
        return [p for s in self.my_stages for p in self.modules[s].parameters()]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for s in self.my_stages for n, p in self.modules[s].named_parameters()]

    def setup(self, sample_input: torch.Tensor | None) -> None:
        """Learn every boundary's activation shape/dtype: stage by stage, each rank runs
        a no-grad forward of its stages on zeros of the received shape (the first
        stage on ``sample_input``) and sends the output's shape on. Runs once."""
        S, pl = self.num_stages, self.placement
        for s in self.my_stages:
            if s == 0:
                if sample_input is None:
                    raise ParameterError("inputs", f"rank {self.rank} holds the first layer group and needs the inputs")
                x = sample_input.to(self.device)
            else:
                prev = pl.rank_of(s - 1)
                if prev == self.rank:
                    shape, dtype = self._out_meta[s - 1]
                else:
                    shape, dtype = self.p2p.recv_meta(prev, s, f"setup of layer group {s}")
                x = torch.zeros(shape, dtype=dtype, device=self.device)
            self._in_meta[s] = (tuple(x.shape), x.dtype)
            if s == S - 1:
                continue
            with torch.no_grad():
                y = self.modules[s](x)
            if not isinstance(y, torch.Tensor):
                raise ParameterError("stage_modules", f"layer group {s} returned {type(y).__name__}; "
                                     "a stage must return one tensor")
            self._out_meta[s] = (tuple(y.shape), y.dtype)
            nxt = pl.rank_of(s + 1)
            if nxt != self.rank:
                self.p2p.send_meta(y, nxt, s + 1, f"setup of layer group {s + 1}")
        self.p2p.finish_sends()
        self._ready = True

    # ------------------------------------------------------------------ step
    def step(self, inputs: Sequence[Any] | None = None, targets: Sequence[Any] | None = None) -> StepResult:
        """Run one iteration of the schedule (all ``m`` microbatches) on this rank."""
        m = self.schedule.num_microbatches
        if self.has_first_stage and (inputs is None or len(inputs) != m):
            raise ParameterError("inputs", f"rank {self.rank} holds the first layer group and needs {m} "
                                 f"microbatch inputs, got {0 if inputs is None else len(inputs)}")
        if self.has_last_stage and (targets is None or len(targets) != m):
            raise ParameterError("targets", f"rank {self.rank} holds the last layer group and needs {m} "
                                 f"microbatch targets, got {0 if targets is None else len(targets)}")
        if not self._ready:
            self.setup(inputs[0] if self.has_first_stage else None)
        self._inputs = [x.to(self.device) for x in inputs] if self.has_first_stage else None
        self._targets = [_to_device(t, self.device) for t in targets] if self.has_last_stage else None
        self._act_in: dict[tuple[int, int], torch.Tensor] = {}
        self._grad_in: dict[tuple[int, int], torch.Tensor] = {}
        self._to_send: dict[tuple[str, int, int], torch.Tensor] = {}
        self._keep: dict[tuple[int, int], tuple] = {}
        self._losses: dict[int, torch.Tensor] = {}
        self._posted: dict[int, int] = {peer: 0 for peer in self._incoming}
        self._events: list[TimedOp] = []
        self._samples: list[OpSample] = []

        self._sync()
        self.barrier()
        self.meter.start_step()
        self._t0 = time.perf_counter()
        hook = self.before_op
        for pos, op in enumerate(self.ops):
            self._pos = pos
            if hook is not None:
                hook(op)
            self._dispatch[op.kind](op)
        self.p2p.finish_sends()
        t_end = self._now()
        self.store.end_step()
        leftover = self.wg.pending()
        if leftover or self._keep or self.p2p.pending_recvs():
            raise RuntimeError(f"rank {self.rank}: step ended with {leftover} deferred weight gradients and "
                               f"{len(self._keep)} forwards without backward and {self.p2p.pending_recvs()} receives "
                               "not consumed (schedule incomplete?)")
        loss = None
        losses = None
        if self.has_last_stage:
            losses = [float(self._losses[j]) for j in range(m)]
            loss = sum(losses) / m
        self._inputs = self._targets = None
        return StepResult(self.rank, loss, losses, self._events, self._samples, self.meter.peak(), t_end,
                          {"meter": self.meter.name, "device": str(self.device),
                           **({"offload": self.store.stats()} if self.store.stats() is not None else {})})

    def barrier(self) -> None:
        """All ranks meet (start of every step: op times are relative to it).

        On gloo a monitored barrier with this runner's timeout, whose error names the
        ranks that did not arrive; elsewhere the process group's own barrier."""
        if not dist.is_initialized():
            return
        if dist.get_backend(self.group) == "gloo":
            try:
                dist.monitored_barrier(self.group, timeout=datetime.timedelta(seconds=self.timeout_s),
                                       wait_all_ranks=True)
            except RuntimeError as e:
                raise CommTimeout(f"rank {self.rank}: step-start barrier failed after up to {self.timeout_s:g} s "
                                  f"({str(e).splitlines()[0][:300]})") from None
        else:
            dist.barrier(group=self.group)

    # ------------------------------------------------------------------ ops
    def _op_forward(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        self._forward(op)
        self._end(op, t0, lvl0, "F")

    def _op_backward(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        self._backward(op)
        self._end(op, t0, lvl0, "B")

    def _op_weight(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        self.wg.flush(op.stage, op.microbatch)
        self._end(op, t0, lvl0, "W")

    def _op_backward_weight(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        self._backward(op)
        self._sync()
        lvl1, t1 = self.meter.level(), self._now()
        self._samples.append(OpSample(op.stage, "B", t1 - t0, lvl1 - lvl0, self.meter.peak_since_mark() - lvl0))
        self.meter.mark()
        self.wg.flush(op.stage, op.microbatch)
        self._sync()
        lvl2, t2 = self.meter.level(), self._now()
        self._samples.append(OpSample(op.stage, "W", t2 - t1, lvl2 - lvl1, self.meter.peak_since_mark() - lvl1))
        self._events.append(TimedOp(op, t0, t2, "compute", lvl2 - lvl0))

    def _forward(self, op: Op) -> None:
        s, j = op.stage, op.microbatch
        last = s == self.num_stages - 1
        if s == 0:
            x = self._inputs[j]
        else:
            x = self._act_in.pop((s, j)).requires_grad_()
        holder = self.meter.hold(x)  # the runtime keeps the stage input until B
        store, meter = self.store, self.meter

        def pack(t: torch.Tensor) -> Any:
            return meter.wrap(store.pack(s, j, t), t)

        def unpack(obj: Any) -> torch.Tensor:
            return store.unpack(s, j, meter.unwrap(obj))

        deferred = self.wg.forward(s, j) if (s, j) in self._split else contextlib.nullcontext()
        owned = (x,) if s > 0 else ()  # the received/handed-off input: the runtime's own tensor
        with saved_tensors_hooks(pack, unpack), deferred, self.store.capture(s, j, owned):
            y = self.modules[s](x)
            if last:
                loss = self.loss_fn(y, self._targets[j])
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise ParameterError("loss_fn", "must return a scalar tensor")
                self._losses[j] = loss.detach()
                root: Any = loss / self.schedule.num_microbatches
        if not last:
            if not y.requires_grad:
                raise ParameterError("stage_modules", f"output of layer group {s} does not require grad; "
                                     "nothing to backpropagate through")
            root = get_gradient_edge(y)  # keep the graph, not the output tensor
            nxt = self.placement.rank_of(s + 1)
            if nxt == self.rank:
                self._act_in[(s + 1, j)] = y.detach()
            else:
                self._to_send[("F", s, j)] = y.detach()
        del y
        self._keep[(s, j)] = (x, holder, root)

    def _backward(self, op: Op) -> None:
        s, j = op.stage, op.microbatch
        x, holder, root = self._keep.pop((s, j))
        grad = None if s == self.num_stages - 1 else self._grad_in.pop((s, j))
        with self.wg.deferring():
            torch.autograd.backward(root, grad_tensors=grad)
        del root, grad
        if s > 0:
            gx = x.grad
            if gx is None:
                gx = torch.zeros_like(x)
            prev = self.placement.rank_of(s - 1)
            if prev == self.rank:
                self._grad_in[(s - 1, j)] = gx
            else:
                self._to_send[("B", s, j)] = gx
            x.grad = None
        self.store.release(s, j)
        del x, holder

    def _op_transfer(self, op: Op) -> None:
        """An offload-pass op: a call on the activation store, recorded on the d2h/h2d lane."""
        lvl0, t0 = self.meter.level(), self._now()
        self._store_calls[op.kind](op.stage, op.microbatch)
        stream = "d2h" if op.kind in (OpKind.OFFLOAD_START, OpKind.OFFLOAD_END) else "h2d"
        self._events.append(TimedOp(op, t0, self._now(), stream, self.meter.level() - lvl0))

    def _op_send(self, op: Op) -> None:
        t0 = self._now()
        key = message_key(op)
        tensor = self._to_send.pop(key)
        self.p2p.send(op, tensor, message_tag(key, self.num_stages, self.schedule.num_microbatches))
        self.p2p.poll_sends()
        self._events.append(TimedOp(op, t0, self._now(), "comm", 0.0))

    def _op_recv(self, op: Op) -> None:
        self._post_ahead(self._recv_rank_of_pos[self._pos])
        t0 = self._now()
        buf = self.p2p.wait_recv(message_key(op), op)
        self._events.append(TimedOp(op, t0, self._now(), "comm", 0.0))
        if op.kind is OpKind.RECV_F:
            self._act_in[(op.stage, op.microbatch)] = buf
        else:
            self._grad_in[(op.stage, op.microbatch)] = buf

    def _post_ahead(self, k: int) -> None:
        """Post the receives of the k-th to (k+lookahead)-th RECV ops (and, per peer,
        every message that peer sends before them, keeping the sender's order)."""
        for kk in range(k, min(k + self.recv_lookahead + 1, len(self._recv_ops))):
            op = self.ops[self._recv_ops[kk]]
            want = message_key(op)
            if self.p2p.is_posted(want):
                continue
            order = self._incoming[op.peer]
            while True:
                i = self._posted[op.peer]
                key = order[i]
                self._post_recv(op.peer, key)
                self._posted[op.peer] = i + 1
                if key == want:
                    break

    def _post_recv(self, peer: int, key: tuple[str, int, int]) -> None:
        """Post the receive of message ``key`` (direction, sending layer group, microbatch)."""
        direction, s, _ = key
        shape, dtype = self._in_meta[s + 1] if direction == "F" else self._out_meta[s - 1]
        tag = message_tag(key, self.num_stages, self.schedule.num_microbatches)
        self.p2p.post_recv(key, shape, dtype, peer, tag)

    # ------------------------------------------------------------------ timing
    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _sync(self) -> None:
        # Only the compute stream: a device-wide synchronize would also wait for the
        # offload copies in flight on the d2h/h2d streams and serialise them with
        # compute (measured on an H100: docs/gpu.md).
        if self.sync_timing and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _begin(self) -> tuple[float, float]:
        self._sync()
        self.meter.mark()
        return self.meter.level(), self._now()

    def _end(self, op: Op, t0: float, lvl0: float, kind: str) -> None:
        self._sync()
        t1, lvl1 = self._now(), self.meter.level()
        self._samples.append(OpSample(op.stage, kind, t1 - t0, lvl1 - lvl0, self.meter.peak_since_mark() - lvl0))
        self._events.append(TimedOp(op, t0, t1, "compute", lvl1 - lvl0))


def _to_device(value: Any, device: torch.device) -> Any:
    """A tensor moved to ``device``; anything else (e.g. a target the loss reads) as is."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _pipeline_rank(schedule: Schedule, group: Any, rank: int | None) -> int:
    """This process's rank in the pipeline (``rank`` when given); ParameterError when
    the process group does not have the schedule's number of ranks."""
    if not dist.is_initialized() and schedule.num_ranks > 1:
        raise ParameterError("stages", f"schedule {schedule.name} has {schedule.num_ranks} ranks and needs an "
                             "initialised process group (use pipeoffload.runtime.launch or torchrun)")
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world != schedule.num_ranks:
        raise ParameterError("stages", f"schedule {schedule.name} needs {schedule.num_ranks} ranks, "
                             f"but the process group has {world}")
    return (dist.get_rank(group) if dist.is_initialized() else 0) if rank is None else rank


def _pick_modules(stage_modules: StageModules, mine: tuple[int, ...], num_stages: int) -> dict[int, nn.Module]:
    if callable(stage_modules) and not isinstance(stage_modules, (nn.Module, Mapping, Sequence)):
        mods = {s: stage_modules(s) for s in mine}
    elif isinstance(stage_modules, Mapping):
        missing = [s for s in mine if s not in stage_modules]
        if missing:
            raise ParameterError("stage_modules", f"no module for layer groups {missing} of this rank")
        mods = {s: stage_modules[s] for s in mine}
    elif isinstance(stage_modules, Sequence):
        if len(stage_modules) != num_stages:
            raise ParameterError("stage_modules", f"got {len(stage_modules)} modules for a schedule with "
                                 f"{num_stages} layer groups (p·v)")
        mods = {s: stage_modules[s] for s in mine}
    else:
        raise ParameterError("stage_modules", "expected a mapping stage→module, a list of all stages, "
                             "or a callable stage→module")
    for s, mod in mods.items():
        if not isinstance(mod, nn.Module):
            raise ParameterError("stage_modules", f"layer group {s} is {type(mod).__name__}, not a torch.nn.Module")
    return mods


def run_pipeline(
    stage_modules: StageModules,
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
    schedule: Schedule,
    inputs: Sequence[Any] | None,
    targets: Sequence[Any] | None,
    **kwargs: Any,
) -> StepResult:
    """One iteration of ``schedule`` on this rank: ``PipelineRunner(...).step(inputs, targets)``.

    Call on every rank of an initialised process group (see
    :func:`pipeoffload.runtime.launcher.launch`). For many steps keep a
    :class:`PipelineRunner` (it exchanges activation shapes once)."""
    return PipelineRunner(stage_modules, loss_fn, schedule, **kwargs).step(inputs, targets)
