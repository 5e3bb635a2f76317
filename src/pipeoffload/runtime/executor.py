"""The executor: interpret one rank's program (compute, send/receive, offload ops).

User API
--------
>>> runner = PipelineRunner(stage_modules, loss_fn, schedule)        # on every rank
>>> result = runner.step(batch, targets)                              # one iteration
>>> result.loss          # mean loss over microbatches, on the rank holding the last layer group
>>> runner.eval_step(batch, targets).loss                             # forward only
>>> runner.infer(batch)  # the last layer group's outputs (on its rank), forward only

``stage_modules`` gives the layer groups (``torch.nn.Module``) this rank runs: a
mapping ``{stage: module}`` holding at least this rank's stages, a sequence of all
``num_stages`` modules (this rank picks its own; tensors shared between modules are
found and tied), or a callable ``stage -> module`` (called only for this rank's stages,
so no rank builds the whole model). A stage module is called with one argument, the
value the previous stage returned (the first: a microbatch of the inputs), and returns
one value: a tensor, or a tuple/list/dict of tensors and plain values
(``runtime/boundary.py``); the last stage's output goes to ``loss_fn(output, target)
-> scalar``.

``inputs``/``targets``: a ``list`` of the ``m`` microbatches, or one whole batch (a
tensor, tuple or dict) split into ``m`` along dimension 0 (only the rank of the first /
last layer group reads them; others may pass ``None``). Gradients are accumulated into
each parameter's ``.grad`` scaled by ``1/m``: the gradient of the mean of the
microbatches' losses. Parameters shared by several stages get the sum over all their
uses, on every rank holding a copy (``runtime/params.py``). Call your optimizer
afterwards, on :meth:`PipelineRunner.parameters` (each shared parameter once).

What one step does
------------------
The schedule goes through :func:`pipeoffload.passes.lower` (``comm=True``: validated,
then sends/receives added and proved deadlock-free). Each rank walks its list:

- ``RECV_*``: wait (with a timeout) for a message whose receives were posted ahead;
- ``F``: run the stage under saved-tensor hooks (activation store + memory meter), the
  keyed random streams (``runtime/rng.py``) and, for a split backward, the
  weight-gradient deferral (``runtime/weight_grad.py``); the last stage also computes
  the loss; the output goes to the next stage by message or, when the next layer group
  is on this rank (V turn), by local hand-off;
- ``B``: backward from the stage output for the inputs' gradients; deferred weight work
  is stashed; ``W``: run it; ``BW``: both;
- ``SEND_*``: ``isend`` (waited for at the end of the step);
- ``OFFLOAD_*``/``RELOAD_*``: calls on the activation store (see ``activations.py``).

Then shared parameters' gradients are summed among the ranks holding them. Each op is
timed (seconds from the step start, after a barrier) and its activation memory change
measured, giving a per-rank list of :class:`~pipeoffload.timeline.TimedOp`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import get_gradient_edge, saved_tensors_hooks

from ..errors import ParameterError
from ..ir import Op, OpKind, Schedule, without_overlap
from ..passes.comm import insert_comm, message_key, send_retirements
from ..passes.issue_policy import IssuePlan, issue_plan
from ..passes.nccl_check import check_nccl
from ..passes.lower import lower
from ..passes.timing import overlapped_positions
from ..timeline import TimedOp
from . import boundary, guards
from .activations import ActivationStore, KeepActivations
from .data_parallel import BUCKET_BYTES, Replicate, Sharded, local
from .messages import Mailbox
from .mesh import coords as mesh_coords, dim_size, pipeline_ranks, sub_group, sub_mesh
from .tensor_parallel import collective_timer
from .meter import MemoryMeter, make_meter
from .op_errors import locate
from .p2p import P2P, CommTimeout, wait_collective
from .params import ParamTable, build_table
from .rng import KeyedRNG, module_names
from .weight_grad import WeightGradStore

StageModules = Mapping[int, nn.Module] | Sequence[nn.Module] | Callable[[int], nn.Module]
_COMPUTE = frozenset({OpKind.F, OpKind.B, OpKind.W, OpKind.BW})
#: Largest program (ops over all ranks) whose issue policy the runner proves before running it.
_CHECK_OPS = 20000
#: Send/receive markers: they do not advance the program's gap (passes/issue_policy.py).
_MARKERS = frozenset({OpKind.SEND_F, OpKind.SEND_B, OpKind.RECV_F, OpKind.RECV_B})


@dataclass(frozen=True)
class OpSample:
    """One measured compute piece: ``kind`` is "F", "B" or "W" (a BW gives a B and a W)."""

    stage: int
    kind: str
    duration: float  #: seconds
    mem: float  #: activation-memory change, bytes
    peak: float = 0.0  #: highest level during the op above its start level, bytes (the in-op transient)
    #: A half of a BW: a layer group that also runs split B/W ops (DualPipeV) is modelled by those
    from_bw: bool = False


@dataclass
class StepResult:
    rank: int
    loss: float | None  #: mean over microbatches (rank with the last layer group), else None
    losses: list[float] | None  #: per microbatch, unscaled
    events: list[TimedOp]  #: this rank's measured ops; times in s from the step start
    samples: list[OpSample]
    peak_memory: float  #: bytes above the step-start level (meter's definition)
    step_time: float  #: s, barrier to last send completed and gradients reduced
    meta: dict = field(default_factory=dict)
    dp_comm_s: float = 0.0  #: s this rank spent issuing and waiting for DP gradient reductions (0 when dp == 1)
    tp_comm_s: float = 0.0  #: s in the TP collectives DTensor issues inside F/B/W (0 when tp == 1)


@dataclass
class _Plan:
    """One program of this rank: its ops, the forwards whose backward is split, and the
    issue policy of its messages (``passes/issue_policy.py``) per set of microbatches
    whose forward messages carry headers."""

    program: Schedule
    rank: int
    ops: list[Op]
    split: set[tuple[int, int]]
    kind: str  #: "train" or "eval": which shape book entries its messages use
    issues: dict[frozenset, IssuePlan] = field(default_factory=dict)
    #: Positions of the F of each overlapped F&B pair (DualPipeV) run as one op with the
    #: backward right after it (passes/timing.py overlapped_positions).
    overlapped: frozenset = frozenset()
    #: Received message -> this rank's sends known received with it (their buffers are
    #: freed then: passes/comm.py send_retirements).
    retire: dict = field(default_factory=dict)

    @classmethod
    def of(cls, program: Schedule, rank: int, kind: str) -> "_Plan":
        ops = program.ranks[rank]
        split = {(op.stage, op.microbatch) for op in ops if op.kind is OpKind.B}
        pairs = frozenset(i for r, i in overlapped_positions(program, program.ranks) if r == rank)
        return cls(program, rank, ops, split, kind, overlapped=pairs,
                   retire=send_retirements(program, rank))

    def issue(self, header_mbs: frozenset, lookahead: int) -> IssuePlan:
        """The issue policy when the forward messages of ``header_mbs`` carry headers.

        Programs of up to :data:`_CHECK_OPS` ops get every rank's policy, proved free of
        deadlock under NCCL's rules (``passes/nccl_check.py``: one communicator for the
        pipeline, sends that block) before any of it is issued; larger ones place this
        rank's only (the construction's guarantee and the property tests stand)."""
        got = self.issues.get(header_mbs)
        if got is None:
            small = sum(len(lst) for lst in self.program.ranks) <= _CHECK_OPS
            got = issue_plan(self.program, headers=lambda mk: mk[2] in header_mbs, lookahead=lookahead,
                             ranks=None if small else [self.rank])
            if small:
                check_nccl(got)
            self.issues[header_mbs] = got
        return got


@dataclass
class _Run:
    """What one run of a program keeps (a step, an eval step, an inference)."""

    train: bool
    inputs: list | None
    targets: list | None
    act_in: dict = field(default_factory=dict)  #: (stage, mb) -> boundary.Flat received or handed off
    grad_in: dict = field(default_factory=dict)  #: (stage, mb) -> gradients for the stage's output
    to_send: dict = field(default_factory=dict)  #: message key -> Flat or gradient list
    keep: dict = field(default_factory=dict)  #: (stage, mb) -> (input leaves needing grad, holder, roots)
    losses: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    bw_time: dict = field(default_factory=dict)  #: stage -> [B seconds, W seconds] of split backwards
    dp_started: dict = field(default_factory=dict)  #: stage -> s from step start its DP reduction was started


class PipelineRunner:
    """Runs a schedule on this rank's layer groups (see module docstring).

    Args:
        stage_modules: this rank's layer groups: a callable ``stage -> nn.Module``, a
            list of all ``num_stages`` modules, or a dict ``{stage: module}`` holding at
            least this rank's (``schedule.placement`` says which).
        loss_fn: ``loss_fn(last_stage_output, targets) -> scalar tensor`` per microbatch.
        schedule: any registry or imported schedule; lowered and validated here.
        rank: pipeline rank (default ``dist.get_rank()`` in ``group``, or the mesh's).
        device: where the modules run (default: where their first parameter lives).
        timeout_s: limit of every blocking wait.
        activation_store: hook point for offload (:class:`OffloadStore`); default keeps.
        meter: "auto", "saved", "cuda", "none" or a :class:`MemoryMeter`.
        recv_lookahead: a receive is issued at most this many ops before its consumer,
            earlier only where NCCL's issue order forces it (``passes/issue_policy.py``).
        dynamic_shapes: send a header with every forward message instead of reusing the
            shapes an earlier step with the same input shapes had; needed only when a
            stage's output shapes depend on values (a ParameterError names it otherwise).
        transport: None (``PIPEOFFLOAD_P2P`` or torch's own), "torch", "nccl-rules"
            (NCCL's point-to-point rules emulated on gloo, for tests) or a Transport.
        sync_timing: synchronize the CUDA compute stream around each op for exact
            timings (default on CUDA).
        group: the pipeline's process group (or give ``mesh``).
        tie: groups of parameter names that are one shared parameter.
        param_names: "auto", "module", "stage" or a callable (``runtime/params.py``).
        seed, keyed_rng: random streams keyed by seed, step, microbatch and module
            (``runtime/rng.py``), the same for every schedule and pipeline size.
        autocast: a dtype: every forward under ``torch.autocast`` with it (default: the
            autocast active around :meth:`step`); backward runs outside it.
        mesh: a ``DeviceMesh`` with dimensions named from ``("dp", "pp", "tp")``: the
            pipeline runs on ``mesh["pp"]``, replicas on ``mesh["dp"]`` reduce gradients
            as ``data_parallel`` says ("auto", "replicate" with ``bucket_bytes`` buckets
            started after each layer group's last W, "fsdp", "none";
            docs/parallelism.md). Tensor parallelism is applied by the user before.
        overlap_pairs: run each overlapped F&B pair of the schedule (DualPipeV's,
            ``ir.overlap_pairs``) as one op: both inputs received first, the two halves
            back to back, both outputs sent after; False (default): as two ops (never
            slower while nothing overlaps their kernels; docs/schedules.md#dualpipev).

    Raises:
        ParameterError: naming the argument, for a schedule, module set, mesh, tie,
            autocast or option that cannot work (before any communication where
            possible).
        CommTimeout / CommError: a peer did not take part in construction in time.

    Guarantees:
        - Construction is a collective over the pipeline's ranks when a process group
          is initialised (parameter names and shared parameters are agreed): every rank
          builds its runner at the same time, with the same schedule.
        - The order in which this rank issues its point-to-point ops is proved
          deadlock-free under NCCL's rules here (programs of up to 20,000 ops).
        - The user's modules are not modified beyond moving them to ``device``; hooks
          are attached only for the duration of a forward.
    """

    def __init__(
        self,
        stage_modules: StageModules,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        schedule: Schedule,
        *,
        rank: int | None = None,
        device: torch.device | str | None = None,
        timeout_s: float = 120.0,
        activation_store: ActivationStore | None = None,
        meter: str | MemoryMeter = "auto",
        recv_lookahead: int = 2,
        dynamic_shapes: bool = False,
        transport: Any = None,
        sync_timing: bool | None = None,
        group: Any = None,
        tie: Sequence[Sequence[str]] | None = None,
        param_names: Any = "auto",
        seed: int = 0,
        keyed_rng: bool = True,
        autocast: torch.dtype | None = None,
        mesh: Any = None,
        data_parallel: str = "auto",
        bucket_bytes: int = BUCKET_BYTES,
        overlap_pairs: bool = False,
    ) -> None:
        self.schedule = schedule
        # validated, sends/receives added (around each overlapped pair, or each half alone)
        self.program = lower(schedule if overlap_pairs else without_overlap(schedule), comm=True).schedule
        self.mesh = mesh
        group, rank = _pipeline_group(mesh, group, rank)
        self.group = group
        self.rank = _pipeline_rank(schedule, group, rank)
        #: This rank's coordinates: pipeline, data-parallel and tensor-parallel index.
        self.coords = mesh_coords(mesh) if mesh is not None else {"pp": self.rank, "dp": 0, "tp": 0}
        self.coords_tp_size = dim_size(mesh, "tp") if mesh is not None else 1
        self.placement = schedule.placement
        self.num_stages = self.placement.num_stages
        self.my_stages = self.placement.stages_of(self.rank)
        self.modules = _pick_modules(stage_modules, self.my_stages, self.num_stages)
        self.device = self._place_modules(device)
        # Same schedule on every rank (one collective); ties the stages declare join `tie`.
        entries = guards.agree(schedule, self.modules, self.rank, group)
        tie = guards.declared_ties(self.modules, tie)
        self.loss_fn = loss_fn
        self.timeout_s = float(timeout_s)
        self.p2p = P2P(self.rank, self.timeout_s, self.device, group, pipeline_ranks(group, mesh), transport)
        self.dynamic_shapes = bool(dynamic_shapes)
        #: Where the step-start all-reduce's tensor lives (NCCL reduces device memory).
        self._coll_device = self.device if dist.is_initialized() and dist.get_backend(group) == "nccl" \
            else torch.device("cpu")
        kind = self._data_parallel(mesh, data_parallel)
        # FSDP wraps the modules before the parameter table names them (the optimizer
        # then gets the sharded parameters); the replicated reducer needs the table.
        self.dp: Replicate | Sharded | None = \
            Sharded(self.modules, sub_mesh(mesh, "dp"), self.timeout_s, self.rank) if kind == "fsdp" else None
        self.table: ParamTable = build_table(self.modules, self.rank, all_modules=_all_modules(stage_modules),
                                             param_names=param_names, tie=tie, group=group,
                                             p2p=self.p2p if dist.is_initialized() else None,
                                             origin=self.dp.origin if self.dp is not None else None,
                                             replicas=self.dp.group if self.dp is not None else None)
        guards.check_table(entries, self.table, self.rank, param_names)
        self._grad_check = guards.GradCheck(self.modules, self.table)
        self._mask_check = guards.EagerMaskCheck(self.modules)
        self._params = {id(p): p for mod in self.modules.values() for p in mod.parameters()}
        self._late = self._late_params()
        if kind == "replicate":
            self.dp = Replicate(self.modules, {id(p) for p in self._late}, sub_group(mesh, "dp"),
                                dim_size(mesh, "dp"), self.timeout_s, self.rank, bucket_bytes)
        self._setup_runtime(activation_store, meter, recv_lookahead, sync_timing, autocast)
        self._setup_rng(seed, keyed_rng)

    def _setup_runtime(self, activation_store, meter, recv_lookahead, sync_timing, autocast) -> None:
        """Meter, activation store, weight-gradient store, mailbox, plans."""
        self.store = activation_store or KeepActivations()
        self.meter = meter if isinstance(meter, MemoryMeter) else make_meter(self.device, meter)
        if hasattr(self.meter, "exclude"):
            self.meter.exclude(self._resident_tensors())
        hold = self.meter.hold
        # DTensor stashes (tensor parallelism) are counted by their local shards.
        self.wg = WeightGradStore(hold=lambda *ts: hold(*[local(t) for t in ts]))
        self.mail = Mailbox(self.p2p, self.num_stages, self.schedule.num_microbatches, self.device)
        self.sync_timing = self.device.type == "cuda" if sync_timing is None else sync_timing
        self.recv_lookahead = max(0, int(recv_lookahead))
        if autocast is not None and not isinstance(autocast, torch.dtype):
            raise ParameterError("autocast", f"expected a torch dtype such as torch.bfloat16, got {autocast!r}")
        self.autocast = autocast
        self.ops: list[Op] = self.program.ranks[self.rank]
        self._plan = _Plan.of(self.program, self.rank, "train")
        #: position in the training program -> layer group whose last W/BW of the step it is
        self._last_w = {max(i for i, op in enumerate(self.ops) if op.stage == s and op.kind in (OpKind.W, OpKind.BW)): s
                        for s in self.my_stages
                        if any(op.stage == s and op.kind in (OpKind.W, OpKind.BW) for op in self.ops)}
        self._eval_plan: _Plan | None = None
        #: Called with each op right before it runs (fault injection, tracing); None = off.
        self.before_op: Callable[[Op], None] | None = None
        #: The backward of the overlapped pair that ran last with its F (skipped at its own turn).
        self._ran_ahead: Op | None = None
        self._backward_ops = {OpKind.B: self._op_backward, OpKind.BW: self._op_backward_weight}
        self.store.bind(device=self.device, meter=self.meter, exclude=self._resident_tensors(),
                        offloaded=[(op.stage, op.microbatch) for op in self.ops if op.kind is OpKind.OFFLOAD_START])
        self._dispatch, self._store_calls = self._op_handlers()
        #: Saved tensors need neither the store (it keeps them as they are) nor the
        #: DTensor path (no parameter of this rank is a DTensor): pack = detach + count.
        self._plain_saves = type(self.store) is KeepActivations and \
            not any(_is_dtensor(p) for p in self._params.values())
        self.steps_done = 0  #: training steps run (keys the random streams; in the state dict)
        self._warned_empty_w = False
        self._closed = False

    def _data_parallel(self, mesh: Any, mode: str) -> str | None:
        """The reduction across replicas ``data_parallel`` asks for on ``mesh``:
        "replicate", "fsdp" or None."""
        modes = ("auto", "replicate", "fsdp", "none")
        if mode not in modes:
            raise ParameterError("data_parallel", f"unknown mode {mode!r}; valid: {', '.join(modes)}")
        dp = dim_size(mesh, "dp") if mesh is not None else 1
        if mode in ("replicate", "fsdp") and mesh is None:
            raise ParameterError("data_parallel", f"{mode!r} needs a `mesh` with a \"dp\" dimension "
                                 "(pipeoffload.runtime.mesh.build_mesh)")
        if mode == "none" or dp == 1:
            return None
        if mode == "fsdp":
            if dim_size(mesh, "tp") > 1:
                raise ParameterError("data_parallel", "\"fsdp\" with tensor parallelism (tp > 1) is not supported "
                                     "yet; use \"replicate\" with tp > 1")
            return "fsdp"
        return "replicate"

    def _late_params(self) -> list[nn.Parameter]:
        """Parameters whose gradient is final only at the end of the step: tied across
        ranks or layer groups (their canonical copy), or used by several layer groups here."""
        out, seen = [], set()
        for g in self.table.groups:
            for t in [g.param] + list(g.copies):
                seen.add(id(t))
            out.append(g.param)
        uses: dict[int, int] = {}
        for mod in self.modules.values():
            for p in {id(q): q for q in mod.parameters()}.values():
                uses[id(p)] = uses.get(id(p), 0) + 1
                if uses[id(p)] == 2 and id(p) not in seen:
                    out.append(p)
                    seen.add(id(p))
        return out

    def _setup_rng(self, seed: int, keyed: bool) -> None:
        prefix = {s: f"{s}." for s in self.my_stages} if self.table.naming == "stage" else {}
        self.rng = KeyedRNG(seed, module_names(self.modules, prefix), self.device, self.modules) if keyed else None

    def _place_modules(self, device: torch.device | str | None) -> torch.device:
        """Move this rank's stages to ``device`` (default: where their first parameter
        lives, else the CPU); returns the device."""
        if device is None:
            device = next((p.device for mod in self.modules.values() for p in mod.parameters()), torch.device("cpu"))
        device = torch.device(device)
        for mod in self.modules.values():
            mod.to(device)
        return device

    def _resident_tensors(self) -> list[torch.Tensor]:
        """Parameters and buffers of this rank's stages: never offloaded, not activations."""
        return [local(t) for mod in self.modules.values() for t in list(mod.parameters()) + list(mod.buffers())]

    def _op_handlers(self) -> tuple[dict[OpKind, Callable[[Op], None]], dict[OpKind, Callable[[int, int], None]]]:
        """The method that runs each op kind, and the store call of each transfer kind."""
        dispatch = {
            OpKind.F: self._op_forward_or_pair, OpKind.B: self._op_backward_unless_ran, OpKind.W: self._op_weight,
            OpKind.BW: self._op_backward_unless_ran,
            OpKind.SEND_F: self._op_send, OpKind.SEND_B: self._op_send,
            OpKind.RECV_F: self._op_recv, OpKind.RECV_B: self._op_recv,
            OpKind.OFFLOAD_START: self._op_transfer, OpKind.OFFLOAD_END: self._op_transfer,
            OpKind.RELOAD_START: self._op_transfer, OpKind.RELOAD_END: self._op_transfer,
            OpKind.STASH_OFFLOAD_START: self._op_transfer, OpKind.STASH_OFFLOAD_END: self._op_transfer,
            OpKind.STASH_RELOAD_START: self._op_transfer, OpKind.STASH_RELOAD_END: self._op_transfer,
        }
        st, wg = self.store, self.wg
        store_calls = {
            OpKind.OFFLOAD_START: st.offload_start, OpKind.OFFLOAD_END: st.offload_end,
            OpKind.RELOAD_START: st.reload_start, OpKind.RELOAD_END: st.reload_end,
            # The stash window (B→W; offload pass, stash=True): the W stash of weight_grad.py to host and back.
            OpKind.STASH_OFFLOAD_START: lambda s, j: st.stash_offload_start(s, j, wg),
            OpKind.STASH_OFFLOAD_END: lambda s, j: st.stash_offload_end(s, j, wg),
            OpKind.STASH_RELOAD_START: lambda s, j: st.stash_reload_start(s, j, wg),
            OpKind.STASH_RELOAD_END: lambda s, j: st.stash_reload_end(s, j, wg),
        }
        return dispatch, store_calls

    # ------------------------------------------------------------------ parameters
    @property
    def has_first_stage(self) -> bool:
        return 0 in self.my_stages

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.my_stages

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once (a shared parameter: its canonical copy)."""
        return self.table.parameters()

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` of :meth:`parameters`, by the user's names."""
        return list(self.table.named)

    # ------------------------------------------------------------------ steps
    def step(self, inputs: Any = None, targets: Any = None) -> StepResult:
        """One training iteration of the schedule (all ``m`` microbatches) on this rank.

        Args:
            inputs: on the rank holding the first layer group, a list of ``m``
                microbatches or one batch to split into ``m`` (a tensor, tuple or dict);
                ignored elsewhere.
            targets: likewise, on the rank holding the last layer group.

        Returns:
            :class:`StepResult`: the mean loss over microbatches (on the last layer
            group's rank, else None), per-op measured times and memory, peak activation
            memory above the step start.

        Raises:
            ParameterError: wrong inputs/targets for this rank, gradients disabled,
                shapes that depend on values without ``dynamic_shapes=True``.
            StepError: an error of the user's code or torch inside the step, naming the
                rank, the op and its place (``runtime/op_errors.py``); a library error
                keeps its type and gains ``.where``.
            CommTimeout / CommError: a wait ran out of time or a peer was lost (names
                rank, op and peer).

        Guarantees:
            - Gradients are accumulated into ``.grad`` exactly as single-process training
              of the same model on the whole batch (loss averaged over microbatches),
              for every schedule, with or without offload and the B/W split; shared
              parameters are summed over their holders, data-parallel replicas averaged.
            - Every rank must call it (a collective over the pipeline).
        """
        self._check_open("step")
        if not torch.is_grad_enabled():
            raise ParameterError("step", "gradients are disabled here (torch.no_grad); use runner.eval_step(...) "
                                 "for a validation loss or runner.infer(...) for outputs")
        run = _Run(True, self._microbatches(inputs, "inputs", self.has_first_stage),
                   self._microbatches(targets, "targets", self.has_last_stage))
        self.table.sync_copies()
        res = self._execute(self._plan, run)
        self.steps_done += 1
        self._warn_if_w_empty(run)
        self._grad_check.after_step()
        return res

    def eval_step(self, inputs: Any = None, targets: Any = None) -> StepResult:
        """The forward of every microbatch and its loss, pipelined in the schedule's
        forward order; no backward, no saved activations, no gradients. The stage
        modules are in eval mode (dropout off) during the call and restored after."""
        self._check_open("eval_step")
        run = _Run(False, self._microbatches(inputs, "inputs", self.has_first_stage),
                   self._microbatches(targets, "targets", self.has_last_stage))
        with self._eval_mode():
            return self._execute(self._forward_plan(), run)

    def infer(self, inputs: Any = None, *, join: bool | None = None) -> Any:
        """The last layer group's outputs for ``inputs`` (forward only, eval mode, no
        loss): on the rank holding it, the ``m`` per-microbatch outputs joined into one
        batch (``join``; default: when this rank's ``inputs`` is not a list) or as a
        list; ``None`` on other ranks."""
        self._check_open("infer")
        run = _Run(False, self._microbatches(inputs, "inputs", self.has_first_stage), None)
        with self._eval_mode():
            self._execute(self._forward_plan(), run)
        if not self.has_last_stage:
            return None
        outs = [run.outputs[j] for j in range(self.schedule.num_microbatches)]
        if join is None:
            join = not isinstance(inputs, list)
        return boundary.join_outputs(outs) if join else outs

    def _microbatches(self, value: Any, param: str, needed: bool) -> list | None:
        """The ``m`` microbatches of ``value`` (a list of them, or a whole batch to split)."""
        if not needed:
            return None
        m = self.schedule.num_microbatches
        which = "first" if param == "inputs" else "last"
        if value is None:
            raise ParameterError(param, f"rank {self.rank} holds the {which} layer group and needs the {param}")
        if boundary.is_microbatch_list(value):
            if len(value) != m:
                raise ParameterError(param, f"rank {self.rank} holds the {which} layer group and needs {m} "
                                     f"microbatch {param} (m), got a list of {len(value)}; pass a list of {m} "
                                     "or one whole batch (a tensor, tuple or dict) to split")
            return [boundary.to_device(v, self.device) for v in value]
        return [boundary.to_device(v, self.device) for v in boundary.split_batch(value, m, param)]

    def _forward_plan(self) -> _Plan:
        """The forward-only program (the schedule's F ops in its order, with messages)."""
        if self._eval_plan is None:
            ranks = [[op for op in lst if op.kind is OpKind.F] for lst in self.schedule.ranks]
            self._eval_plan = _Plan.of(insert_comm(self.schedule.with_ranks(ranks)), self.rank, "eval")
        return self._eval_plan

    @contextlib.contextmanager
    def _eval_mode(self):
        modes = {s: [(m, m.training) for m in mod.modules()] for s, mod in self.modules.items()}
        self.table.sync_copies()
        try:
            for mod in self.modules.values():
                mod.eval()
            with torch.no_grad():
                yield
        finally:
            for pairs in modes.values():
                for m, was in pairs:
                    m.training = was

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ParameterError(what, "this runner was closed; build a new PipelineRunner")

    # ------------------------------------------------------------------ running a program
    def _execute(self, plan: _Plan, run: _Run) -> StepResult:
        """Run ``plan`` once: barrier, every op, sends completed; the measured result."""
        self._run, self._cur_plan = run, plan
        self._amp = self._autocast_state()
        self._sync()
        self.barrier()
        sigs = self._agree_signatures(run, plan)
        m = self.schedule.num_microbatches
        headers = frozenset(range(m)) if self.dynamic_shapes else \
            frozenset(j for j in range(m) if not self.mail.book.knows(plan.kind, sigs[j]))
        issue = plan.issue(headers, self.recv_lookahead)
        mail = self.mail
        mail.begin(issue.ranks[self.rank], issue.headers, plan.kind, sigs, run.to_send, plan.retire)
        self.meter.start_step()
        self._t0 = time.perf_counter()
        hook = self.before_op if run.train else None
        dp = self.dp
        if dp is not None:
            dp.begin_step()
        last_w = self._last_w if run.train and plan is self._plan else {}
        tp_timer = collective_timer() if self.coords_tp_size > 1 else None
        self._pos = -1
        try:
            with self.rng.step() if self.rng is not None else contextlib.nullcontext(), \
                    tp_timer if tp_timer is not None else contextlib.nullcontext():
                gap = 0
                mail.issue_gap(0)
                for pos, op in enumerate(plan.ops):
                    self._pos = pos
                    if hook is not None:
                        hook(op)
                    if dp is not None and op.kind in _COMPUTE:
                        self._before_compute(op.stage)
                    self._dispatch[op.kind](op)
                    if pos in last_w and dp is not None:
                        run.dp_started[last_w[pos]] = self._now()
                        dp.stage_done(last_w[pos])  # started now, overlapped with the rest of the step
                    if op.kind not in _MARKERS:  # the next gap: issue its groups (passes/issue_policy.py)
                        gap += 1
                        mail.issue_gap(gap)
                self._pos = len(plan.ops)
                self.p2p.finish_sends()
                if run.train:
                    self._reduce_grads()
                elif isinstance(dp, Sharded):
                    dp.finish()  # reshard what the forward-only run gathered
        except Exception as e:  # name the rank, the op and its place (runtime/op_errors.py)
            located = locate(e, self.rank, plan.ops, self._pos)
            if located is e:
                raise
            raise located from e
        t_end = self._now()
        if run.train:
            self.store.end_step()
        self._check_finished(run)
        mail.book.commit(plan.kind, sigs)
        res = self._result(run, t_end)
        res.dp_comm_s = dp.comm_s if dp is not None else 0.0
        res.tp_comm_s = tp_timer.seconds if tp_timer is not None else 0.0
        return res

    def _before_compute(self, stage: int) -> None:
        """FSDP: gather ``stage``'s weights before its first op of the step; the W split
        and the memory accounting then see the gathered parameters."""
        whole = self.dp.before_op(stage)
        if whole:
            self._params.update((id(p), p) for p in whole)
            tensors = [local(p) for p in whole]
            if hasattr(self.meter, "exclude"):
                self.meter.exclude(tensors)
            self.store.exclude(tensors)  # the store must not offload gathered weights

    def _reduce_grads(self) -> None:
        """End of a training step: shared parameters summed among their pipeline holders,
        then (data parallel) the reductions started after each last W waited for and the
        late parameters reduced across replicas. FSDP: the reduce-scatters first (a shared
        parameter's copies are sharded parameters whose gradients exist only then), then
        the shards summed among the holders (sum of means = mean of sums)."""
        p2p = self.p2p if dist.is_initialized() else None
        if isinstance(self.dp, Sharded):
            self.dp.finish()
            self.table.reduce_grads(p2p, self.rank)
            return
        self.table.reduce_grads(p2p, self.rank)
        if self.dp is not None:
            self.dp.finish(self._late)

    def _check_finished(self, run: _Run) -> None:
        leftover = self.wg.pending()
        if leftover or run.keep or self.mail.pending():
            raise RuntimeError(f"rank {self.rank}: step ended with {leftover} deferred weight gradients and "
                               f"{len(run.keep)} forwards without backward and {self.mail.pending()} receives "
                               "not consumed (schedule incomplete?)")

    def _result(self, run: _Run, t_end: float) -> StepResult:
        m = self.schedule.num_microbatches
        losses = [float(run.losses[j]) for j in range(m)] if self.has_last_stage and run.targets is not None \
            else None
        loss = sum(losses) / m if losses is not None else None
        meta: dict[str, Any] = {"meter": self.meter.name, "device": str(self.device),
                                "mode": "train" if run.train else "eval"}
        if run.train:
            if self.store.stats() is not None:
                meta["offload"] = self.store.stats()
            meta["w_share"] = {s: (w / (b + w) if b + w > 0 else 0.0) for s, (b, w) in run.bw_time.items()}
            if run.dp_started:
                meta["dp_started_s"] = dict(run.dp_started)
        self._run = None
        return StepResult(self.rank, loss, losses, run.events, run.samples, self.meter.peak(), t_end, meta)

    def _autocast_state(self) -> tuple[bool, torch.dtype | None]:
        """(autocast for forwards?, dtype): this runner's ``autocast``, else the ambient one."""
        dev = self.device.type
        if self.autocast is not None:
            return True, self.autocast
        if torch.is_autocast_enabled(dev):
            return True, torch.get_autocast_dtype(dev)
        return False, None

    def _forward_amp(self):
        on, dtype = self._amp
        return torch.autocast(self.device.type, dtype=dtype) if on else contextlib.nullcontext()

    def _backward_amp(self):
        on, _ = self._amp
        return torch.autocast(self.device.type, enabled=False) if on else contextlib.nullcontext()

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
        if self._run.train:
            self._forward(op)
        else:
            self._forward_only(op)
        self._end(op, t0, lvl0, "F")

    def _op_backward(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        self._backward(op)
        self._end(op, t0, lvl0, "B")
        self._run.bw_time.setdefault(op.stage, [0.0, 0.0])[0] += self._run.samples[-1].duration

    def _op_weight(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        with self._backward_amp():
            self.wg.flush(op.stage, op.microbatch)
        self._end(op, t0, lvl0, "W")
        self._run.bw_time.setdefault(op.stage, [0.0, 0.0])[1] += self._run.samples[-1].duration

    def _op_forward_or_pair(self, op: Op) -> None:
        """An F; when it opens an overlapped pair (DualPipe's F&B, torch's OVERLAP_F_B),
        the pair as one op: both halves' inputs were received before it and both sends go
        out after it (passes/comm.py), so the two run back to back on the device, the
        backward's kernels queued right behind the forward's (as torch runs OVERLAP_F_B);
        each half keeps its own sample. The backward's own turn in the loop (its hook
        included, which comes after it) is skipped."""
        plan, pos = self._cur_plan, self._pos
        self._op_forward(op)
        if pos in plan.overlapped:
            b = plan.ops[pos + 1]
            self._ran_ahead = b
            self._backward_ops[b.kind](b)

    def _op_backward_unless_ran(self, op: Op) -> None:
        """A B or BW, unless it ran already with its overlapped pair's F."""
        if op is not self._ran_ahead:
            self._backward_ops[op.kind](op)

    def _op_backward_weight(self, op: Op) -> None:
        lvl0, t0 = self._begin()
        self._backward(op)
        self._sync()
        lvl1, t1 = self.meter.level(), self._now()
        self._run.samples.append(OpSample(op.stage, "B", t1 - t0, lvl1 - lvl0, self.meter.peak_since_mark() - lvl0,
                                          from_bw=True))
        self.meter.mark()
        with self._backward_amp():
            self.wg.flush(op.stage, op.microbatch)
        self._sync()
        lvl2, t2 = self.meter.level(), self._now()
        self._run.samples.append(OpSample(op.stage, "W", t2 - t1, lvl2 - lvl1, self.meter.peak_since_mark() - lvl1,
                                          from_bw=True))
        self._run.events.append(TimedOp(op, t0, t2, "compute", lvl2 - lvl0))

    def _stage_input(self, s: int, j: int) -> boundary.Flat:
        run = self._run
        if s == 0:
            return boundary.flatten(run.inputs[j], f"input microbatch {j}")
        return run.act_in.pop((s, j))

    def _forward(self, op: Op) -> None:
        """A training F: the stage under the hooks; keeps what its B needs."""
        s, j = op.stage, op.microbatch
        run, last = self._run, s == self.num_stages - 1
        flat = self._stage_input(s, j)
        leaves = flat.tensor_leaves()
        if self._mask_check.todo:
            self._mask_check.before_forward(s, leaves)
        holder = self.meter.hold(*leaves)  # the runtime keeps the stage input until B
        # The runtime's own references until B: the received/handed-off inputs that need a
        # gradient (kept in ``wants``). The others (masks, ids) are dropped after F, so they
        # must not count as held: a pass-through mask handed on to the next layer group
        # on this rank would look unreferenced and be offloaded under its feet.
        owned = tuple(t for t in leaves if t.requires_grad) if s > 0 else ()
        with self._forward_context(s, j, owned):
            y = self.modules[s](flat.rebuild())
            if last:
                root: Any = self._loss(y, j)
        if not last:
            out = boundary.flatten(y, f"the output of layer group {s}")
            needs = [t for t in out.tensor_leaves() if t.requires_grad]
            root = [get_gradient_edge(t) for t in needs]  # keep the graph, not the output tensors
            self._pass_on(s, j, boundary.hand_off(out))
        del y
        wants = [t for t in leaves if t.requires_grad] if s > 0 else []
        run.keep[(s, j)] = (wants, holder, root)

    def _forward_context(self, s: int, j: int, owned: tuple) -> contextlib.ExitStack:
        """Saved-tensor hooks (store + meter), deferral of a split backward's weight
        work, the activation store's capture, the keyed random streams, autocast."""
        store, meter = self.store, self.meter
        stack = contextlib.ExitStack()
        if self._plain_saves:  # the common case: two calls per saved tensor fewer
            stack.enter_context(saved_tensors_hooks(*meter.saved_tensor_hooks()))
        else:
            stack.enter_context(saved_tensors_hooks(*self._store_hooks(s, j)))
        if (s, j) in self._cur_plan.split:
            stack.enter_context(self.wg.defer(s, j, self._params))
        stack.enter_context(store.capture(s, j, owned))
        if self.rng is not None:
            stack.enter_context(self.rng.forward(self.steps_done, j, s))
        stack.enter_context(self._forward_amp())
        return stack

    def _store_hooks(self, s: int, j: int) -> tuple[Callable, Callable]:
        """Saved-tensor hooks through the activation store, DTensors by their local shards."""
        store, meter = self.store, self.meter

        def pack(t: torch.Tensor) -> Any:
            if _is_dtensor(t):  # tensor parallelism: store and meter see the local shard
                loc = t.to_local().detach()
                return _DTensorSaved(meter.wrap(store.pack(s, j, loc), loc), t)
            return meter.wrap(store.pack(s, j, t), t)

        def unpack(obj: Any) -> torch.Tensor:
            if isinstance(obj, _DTensorSaved):
                return obj.rebuild(store.unpack(s, j, meter.unwrap(obj.packed)))
            return store.unpack(s, j, meter.unwrap(obj))

        return pack, unpack

    def _loss(self, y: Any, j: int) -> torch.Tensor:
        """The last stage's loss for microbatch ``j``; returns the backward root (loss / m)."""
        if self.rng is not None:  # the loss's own draws keyed apart from the modules' (runtime/rng.py)
            self.rng.before_loss(self.steps_done, j)
        loss = self.loss_fn(y, self._run.targets[j])
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ParameterError("loss_fn", "must return a scalar tensor")
        self._run.losses[j] = loss.detach()
        return loss / self.schedule.num_microbatches

    def _pass_on(self, s: int, j: int, out: boundary.Flat) -> None:
        """The output of ``(s, j)`` to layer group ``s + 1``: locally or by message."""
        if self.placement.rank_of(s + 1) == self.rank:
            self._run.act_in[(s + 1, j)] = out
        else:
            self._run.to_send[("F", s, j)] = out
            if self._run.train:
                self.mail.expect_grads(("B", s + 1, j), [t for t in out.tensor_leaves() if t.requires_grad])

    def _forward_only(self, op: Op) -> None:
        """An F of an eval step or an inference: no graph, no hooks; loss or output kept."""
        s, j = op.stage, op.microbatch
        flat = self._stage_input(s, j)
        ctx = self.rng.forward(self.steps_done, j, s) if self.rng is not None else contextlib.nullcontext()
        with ctx, self._forward_amp():
            y = self.modules[s](flat.rebuild())
            if s == self.num_stages - 1:
                if self._run.targets is not None:
                    self._loss(y, j)
                else:
                    self._run.outputs[j] = y
                return
        self._pass_on(s, j, boundary.flatten(y, f"the output of layer group {s}"))

    def _backward(self, op: Op) -> None:
        s, j = op.stage, op.microbatch
        run = self._run
        wants, holder, root = run.keep.pop((s, j))
        with self.wg.deferring(), self._backward_amp():
            if s == self.num_stages - 1:
                torch.autograd.backward(root)
            else:
                grads = run.grad_in.pop((s, j))
                if root:
                    torch.autograd.backward(root, grad_tensors=grads)
                del grads
        del root
        if s > 0:
            gx = [t.grad if t.grad is not None else torch.zeros_like(t) for t in wants]
            for t in wants:
                t.grad = None
            if self.placement.rank_of(s - 1) == self.rank:
                run.grad_in[(s - 1, j)] = gx
            else:
                run.to_send[("B", s, j)] = gx
        self.store.release(s, j)
        del wants, holder

    def _op_transfer(self, op: Op) -> None:
        """An offload-pass op: a call on the activation store, recorded on the d2h/h2d lane."""
        lvl0, t0 = self.meter.level(), self._now()
        self._store_calls[op.kind](op.stage, op.microbatch)
        stream = "d2h" if op.kind in (OpKind.OFFLOAD_START, OpKind.OFFLOAD_END, OpKind.STASH_OFFLOAD_START,
                                      OpKind.STASH_OFFLOAD_END) else "h2d"
        self._run.events.append(TimedOp(op, t0, self._now(), stream, self.meter.level() - lvl0))

    def _op_send(self, op: Op) -> None:
        # Issued with its group at the producer's gap (Mailbox.issue_gap); recorded here.
        t = self._now()
        self._run.events.append(TimedOp(op, t, t, "comm", 0.0))

    def _op_recv(self, op: Op) -> None:
        t0 = self._now()
        key = message_key(op)
        got = self.mail.receive(op, key)
        self._run.events.append(TimedOp(op, t0, self._now(), "comm", 0.0))
        if op.kind is OpKind.RECV_F:
            self._run.act_in[(op.stage, op.microbatch)] = got
        else:
            self._run.grad_in[(op.stage, op.microbatch)] = got

    def _agree_signatures(self, run: _Run, plan: _Plan) -> list[int]:
        """The input signature of every microbatch (``runtime/messages.py``), agreed by
        one broadcast over the pipeline from the rank of the first layer group, which
        computes them. (A broadcast rather than an all-reduce with zeros elsewhere: the
        same values, and on gloo at p = 4 about 0.5 ms instead of 5 ms per step.)"""
        m = self.schedule.num_microbatches
        if not dist.is_initialized() or self.schedule.num_ranks == 1 or self.dynamic_shapes:
            return [0] * m
        vals = [_signature(x) for x in run.inputs] if self.has_first_stage else [0] * m
        t = torch.tensor(vals, dtype=torch.int64, device=self._coll_device)
        src = self.p2p._global(self.placement.rank_of(0))  # torch's src is a global rank, also with group=
        wait_collective(dist.broadcast(t, src=src, group=self.group, async_op=True), self.timeout_s, self.rank,
                        "the step-start agreement on the inputs' shapes (a broadcast over the pipeline's ranks)")
        return [int(v) for v in t.tolist()]

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
        self._run.samples.append(OpSample(op.stage, kind, t1 - t0, lvl1 - lvl0, self.meter.peak_since_mark() - lvl0))
        self._run.events.append(TimedOp(op, t0, t1, "compute", lvl1 - lvl0))

    # ------------------------------------------------------------------ reports
    def weight_split(self) -> dict[int, dict[str, Any]]:
        """Per layer group of this rank whose backward the schedule splits: ``deferred``
        (names of parameters whose gradient W computes), ``in_b`` (trainable ones whose
        gradient arrives in B: a path the deferral does not see), ``bypassed`` (calls
        left to autograd, by reason). The share of backward time W carries is in each
        step's ``StepResult.meta["w_share"]``."""
        names = {id(p): n for n, p in self.table.named}
        out = {}
        for s in sorted({s for s, _ in self._plan.split}):
            rep = self.wg.report(s)
            alias = getattr(self.dp, "alias", {})  # FSDP: W saw the gathered parameters
            rep["deferred"] = {alias.get(i, i) for i in rep["deferred"]}
            mine = [p for p in self.modules[s].parameters() if p.requires_grad]
            out[s] = {"deferred": sorted(names.get(i, "?") for i in rep["deferred"] if i in names),
                      "in_b": sorted({names.get(id(p), "?") for p in mine if id(p) not in rep["deferred"]}),
                      "bypassed": rep["bypassed"]}
        return out

    def _warn_if_w_empty(self, run: _Run) -> None:
        """Once: warn about a split layer group whose W carried nothing."""
        if self._warned_empty_w or not self._plan.split:
            return
        self._warned_empty_w = True
        for s, rep in self.weight_split().items():
            if not rep["deferred"] and rep["in_b"]:
                warnings.warn(f"rank {self.rank}: the schedule splits layer group {s}'s backward into B and W, but "
                              f"no weight gradient reached W ({len(rep['in_b'])} parameters get theirs in B: "
                              f"{', '.join(rep['in_b'][:3])}...; calls left to autograd: {rep['bypassed'] or 'none'}); "
                              "this stage runs as with a fused backward", RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------ state
    def state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
        """This rank's part of the pipeline's state, by the user's names (``runtime/state.py``)."""
        from .state import runner_state_dict

        self.table.sync_copies()
        return runner_state_dict(self, optimizer)

    def load_state_dict(self, state: Mapping[str, Any], optimizer: torch.optim.Optimizer | None = None) -> None:
        """Load this rank's part of ``state`` (as :meth:`state_dict` gives it, from any
        pipeline size or schedule: keys are names)."""
        from .state import load_runner_state_dict

        load_runner_state_dict(self, state, optimizer)
        self.table.sync_copies()

    def save(self, path: Any, optimizer: torch.optim.Optimizer | None = None,
             extra: Mapping[str, Any] | None = None) -> None:
        """Write :meth:`state_dict` (and ``extra``) to directory ``path`` with
        ``torch.distributed.checkpoint``; every rank calls it (``runtime/state.py``)."""
        from .state import save

        save(self, path, optimizer, extra)

    def load(self, path: Any, optimizer: torch.optim.Optimizer | None = None,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Read a :meth:`save` checkpoint written with any pipeline size or schedule;
        every rank calls it. Returns the ``extra`` keys asked for, filled in."""
        from .state import load

        return load(self, path, optimizer, extra)

    def close(self) -> None:
        """Release what the runner holds (stashes, the activation store's buffers) and
        leave the modules with the trained values in every copy of a shared parameter.
        The runner cannot step afterwards; the modules stay the user's, unchanged otherwise."""
        if self._closed:
            return
        self.table.sync_copies()
        self.wg.clear()
        close = getattr(self.store, "close", None)
        if close is not None:
            close()
        self._closed = True

    def __enter__(self) -> "PipelineRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _signature(x: Any) -> int:
    """A microbatch's input signature: a 62-bit digest of its skeleton (structure,
    shapes, dtypes, plain values); the same on every process."""
    body = boundary.header_body(boundary.flatten(x, "an input microbatch"))
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "little") >> 2


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


class _DTensorSaved:
    """A DTensor saved for backward: its local tensor as the activation store packed
    it, and what rebuilds the DTensor around it."""

    __slots__ = ("packed", "mesh", "placements", "shape", "stride")

    def __init__(self, packed: Any, t: torch.Tensor) -> None:
        self.packed, self.mesh, self.placements = packed, t.device_mesh, t.placements
        self.shape, self.stride = t.shape, t.stride()

    def rebuild(self, loc: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            return DTensor.from_local(loc, self.mesh, self.placements, run_check=False, shape=self.shape,
                                      stride=self.stride)


def _pipeline_rank(schedule: Schedule, group: Any, rank: int | None) -> int:
    """This process's rank in the pipeline (``rank`` when given); ParameterError when
    the process group does not have the schedule's number of ranks."""
    if not dist.is_initialized() and schedule.num_ranks > 1:
        raise ParameterError("ranks", f"schedule {schedule.name} has {schedule.num_ranks} ranks and needs an "
                             "initialised process group (use pipeoffload.runtime.launch or torchrun)")
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world != schedule.num_ranks:
        raise ParameterError("ranks", f"schedule {schedule.name} needs {schedule.num_ranks} ranks, "
                             f"but the process group has {world}")
    return (dist.get_rank(group) if dist.is_initialized() else 0) if rank is None else rank


def _all_modules(stage_modules: StageModules) -> dict[int, nn.Module] | None:
    """Every layer group's module when the user gave them all (list or mapping)."""
    if isinstance(stage_modules, Mapping):
        return {int(s): m for s, m in stage_modules.items() if isinstance(m, nn.Module)}
    if isinstance(stage_modules, Sequence) and not isinstance(stage_modules, (str, bytes)):
        return {s: m for s, m in enumerate(stage_modules) if isinstance(m, nn.Module)}
    return None


def _pipeline_group(mesh: Any, group: Any, rank: int | None) -> tuple[Any, int | None]:
    """The pipeline's process group and this rank's index in it: ``group`` and ``rank``
    as given, or the mesh's "pp" dimension; ParameterError for both or a mesh without it."""
    if mesh is None:
        return group, rank
    if group is not None:
        raise ParameterError("group", "give either `mesh` (its \"pp\" dimension is the pipeline) or `group`, "
                             "not both")
    if "pp" not in (mesh.mesh_dim_names or ()):
        raise ParameterError("mesh", "the mesh needs a \"pp\" dimension (of size 1 for a single-stage "
                             "pipeline); pipeoffload.runtime.mesh.build_mesh always makes one")
    group = sub_group(mesh, "pp")
    if rank is None and group is not None:
        # The mesh's order, not the group's: a process group sorts its ranks, a
        # mesh row [3, 0] makes global rank 3 pipeline rank 0.
        rank = mesh_coords(mesh)["pp"]
    return group, rank


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
    loss_fn: Callable[[Any, Any], torch.Tensor],
    schedule: Schedule,
    inputs: Any,
    targets: Any,
    **kwargs: Any,
) -> StepResult:
    """One iteration of ``schedule`` on this rank: ``PipelineRunner(...).step(inputs, targets)``.

    Call on every rank of an initialised process group (see
    :func:`pipeoffload.runtime.launcher.launch`)."""
    return PipelineRunner(stage_modules, loss_fn, schedule, **kwargs).step(inputs, targets)
