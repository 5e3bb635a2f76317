"""Training configuration as dataclasses: model, schedule, training, runtime.

Pure Python (no torch). Sources, later ones winning: the defaults below, an optional
TOML file (``pipeoffload train --config``; sections ``[model]``, ``[schedule]``,
``[parallel]``, ``[offload]``, ``[training]``, ``[runtime]``, ``[checkpoint]``, ``[plan]``
with the field names below), then overrides (the command line's flags).
:meth:`TrainConfig.dump` writes a file that :meth:`TrainConfig.load` reads back equal;
:func:`config_from_plan` turns a planner result into such a file's configuration
(``pipeoffload plan --emit-config``).

Errors are :class:`~pipeoffload.errors.ParameterError` naming the configuration key
(``training.steps``, ``offload.offload_chunks``, ``model.layers``), or ``config`` for the
file as a whole; the command line shows the keys its flags set as those flags.

>>> cfg = TrainConfig.load("run.toml", overrides={"schedule.ranks": 2})
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from ..errors import ParameterError, read_input, require
from ..models.config import ModelConfig
from ..recompute import Recompute

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class ScheduleConfig:
    """Which schedule to run (names as in ``pipeoffload schedules``)."""

    name: str = "group-interleaved"
    ranks: int = 4  #: p, pipeline ranks (``stages`` in older files: accepted, deprecated)
    microbatches: int = 8  #: m
    v: int | None = None  #: chunks (layer groups) per rank (schedule default when None)
    g: int | None = None  #: group size for group-interleaved
    mem_limit: float | None = None  #: for zb-auto, zb-v and v-auto, in units (1 per whole-stage F)


@dataclass
class ParallelConfig:
    """The device mesh around the pipeline: ``dp`` data-parallel replicas of each
    pipeline rank and ``tp`` tensor-parallel ranks inside each stage, so the job runs
    ``schedule.ranks · dp · tp`` processes (mesh dims ``("dp", "pp", "tp")``)."""

    dp: int = 1  #: data-parallel degree (gradient all-reduce, or FSDP2 sharding with ``fsdp``)
    tp: int = 1  #: tensor-parallel degree inside every stage (DTensor colwise/rowwise); divides heads, kv_heads, ffn
    fsdp: bool = False  #: shard the stages' parameters over the dp group (FSDP2 ``fully_shard``) instead of replicating
    sequence_parallel: bool = False  #: TP with sequence parallelism (norms and residuals sharded along the sequence)


@dataclass
class PlanPrediction:
    """``[plan]``: what ``pipeoffload plan`` predicted for this configuration (written by
    ``--emit-config``; the train report prints the measured figures beside it). Times in
    seconds, memory in bytes per device; empty when the configuration was not planned."""

    source: str | None = None  #: how the prediction was made (the plan's model, hardware, GPUs)
    model: str | None = None  #: the planner's model name
    hardware: str | None = None  #: the planner's hardware profile
    configuration: str | None = None  #: the planner's one-line description of the chosen configuration
    step_time_s: float | None = None  #: predicted iteration time (pipeline + exposed DP reduction)
    pipeline_s: float | None = None  #: predicted pipeline makespan
    bubble: float | None = None  #: predicted bubble rate
    peak_memory_bytes: float | None = None  #: predicted device peak of the binding rank (states + activations)
    peak_memory_rank: int | None = None  #: the pipeline rank that binds
    peak_activation_bytes: list[float] | None = None  #: predicted peak activation memory per pipeline rank


@dataclass
class OffloadConfig:
    """Activation offload (PipeOffload): the offload pass plans which (chunk,
    microbatch) activations go to host memory; the runtime's ``OffloadStore`` moves them.

    The keys are the offload pass's setting names (:class:`~pipeoffload.passes.offload.OffloadOptions`,
    :meth:`options`): ``offload_chunks`` is C, the number of chunks offloaded, or "auto" /
    "none"; ``offload_time`` the one-way transfer. ``chunks`` and ``time``, their old names,
    are still read (with a DeprecationWarning) from files, overrides and attributes. Default:
    ``offload_chunks = "auto"`` with ``offload_time = 0`` (transfers assumed free — on CPU a
    transfer is a memcpy — so the pass picks the C with the lowest peak) and
    ``on_infeasible = "skip"`` (an offload whose reload cannot finish before its B is
    dropped, never an error). ``recompute`` is the runtime's, not the pass's.
    """

    offload_chunks: int | str = "auto"  #: "auto", "none", or C: offload chunks c < C of every rank
    offload_time: float = 0.0  #: one one-way transfer of a chunk's activations, as a multiple of its F+B+W time
    #: recompute norm / SwiGLU elementwise outputs in backward instead of moving them: none or
    #: elementwise (a :class:`~pipeoffload.recompute.Recompute` name; false/true as before)
    recompute: bool | str = False
    link_group: int = 2  #: ranks sharing one host link
    on_infeasible: str = "skip"  #: skip, delay or error
    stash: bool = False  #: also offload the W stash between B and W (the stash window, B→W)

    @property
    def chunks(self) -> int | str:
        """Deprecated name of :attr:`offload_chunks` (warns)."""
        _warn_renamed("offload", "chunks", stacklevel=3)
        return self.offload_chunks

    @chunks.setter
    def chunks(self, value: int | str) -> None:
        _warn_renamed("offload", "chunks", stacklevel=3)
        self.offload_chunks = value

    @property
    def time(self) -> float:
        """Deprecated name of :attr:`offload_time` (warns)."""
        _warn_renamed("offload", "time", stacklevel=3)
        return self.offload_time

    @time.setter
    def time(self, value: float) -> None:
        _warn_renamed("offload", "time", stacklevel=3)
        self.offload_time = value

    def recompute_level(self) -> Recompute:
        """``recompute`` as the one :class:`~pipeoffload.recompute.Recompute`. Raises
        ParameterError naming ``offload.recompute`` for anything but none or elementwise (the
        runtime recomputes the elementwise outputs only)."""
        level = Recompute.of(self.recompute, "offload.recompute")
        require(level in (Recompute.NONE, Recompute.ELEMENTWISE), "offload.recompute",
                f"the runtime recomputes elementwise outputs only: none or elementwise (false/true), got {level}")
        return level

    def options(self) -> Any:
        """These settings as the offload pass's one settings value
        (:class:`~pipeoffload.passes.offload.OffloadOptions`); ``offload_chunks`` must be
        "auto" or a number (``none`` plans no offload and has no options)."""
        from ..passes.offload import OffloadOptions

        auto = self.offload_chunks == "auto"
        return OffloadOptions(offload_chunks=None if auto else int(self.offload_chunks), auto=auto,
                              offload_time=float(self.offload_time), link_group=self.link_group,
                              on_infeasible=self.on_infeasible, stash=bool(self.stash))


@dataclass
class TrainingConfig:
    steps: int = 60
    microbatch_size: int = 4
    lr: float = 3e-3
    warmup_steps: int = 5
    weight_decay: float = 0.0
    seed: int = 0  #: data order and the keyed random streams (dropout)
    corpus: str | None = None  #: text file; None = the stdlib documentation topics
    holdout: float = 0.05  #: fraction of the corpus (its end) held out for the validation loss
    eval_every: int = 20  #: validation loss every N steps (and after the last); 0 = never
    on_nonfinite: str = "stop"  #: non-finite loss or gradients: "stop" the run or "skip" the step


@dataclass
class RuntimeConfig:
    backend: str = "auto"  #: auto, gloo, nccl
    timeout_s: float = 120.0  #: every blocking wait (receives, sends at step end)
    init_timeout_s: float = 120.0  #: process-group init and collectives
    threads: int | None = None  #: torch threads per CPU rank (default cores / ranks)
    recv_lookahead: int = 2  #: a receive is issued at most this many ops before its consumer
    memory_meter: str = "auto"  #: auto, saved, cuda, none
    output: str | None = None  #: output folder (default runs/<timestamp>)
    progress: bool = True  #: tqdm progress bar on rank 0
    fault_injection: str | None = None  #: testing: "op=kill,rank=R,step=N[,at=B]" (see training.faults)


@dataclass
class CheckpointConfig:
    """Checkpoints (``training.checkpoint``): one directory per saved step."""

    dir: str | None = None  #: where; None = no checkpoints
    every: int = 0  #: save every N steps (and after the last); 0 = only after the last
    keep: int = 3  #: complete checkpoints kept (older ones removed)
    resume: bool = False  #: continue from the newest usable checkpoint in ``dir``


_SECTIONS = {"model": ModelConfig, "schedule": ScheduleConfig, "parallel": ParallelConfig,
             "offload": OffloadConfig, "training": TrainingConfig, "runtime": RuntimeConfig,
             "checkpoint": CheckpointConfig, "plan": PlanPrediction}


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    plan: PlanPrediction = field(default_factory=PlanPrediction)

    @property
    def world_size(self) -> int:
        """Processes the job runs: pipeline ranks × dp × tp."""
        from ..schedules import ScheduleSpec, build

        sc = self.schedule
        p = build(ScheduleSpec(sc.name, sc.ranks, sc.microbatches, v=sc.v, g=sc.g, mem_limit=sc.mem_limit)).num_ranks
        return p * self.parallel.dp * self.parallel.tp

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> "TrainConfig":
        """Build from ``{"model": {...}, ...}``; unknown sections or keys and values of the
        wrong type raise ParameterError (``source``: the file ``data`` was read from, if any)."""
        parts: dict[str, Any] = {}
        for sec, sub in data.items():
            if sec not in _SECTIONS:
                raise ParameterError("config", f"unknown section [{sec}]; valid: {', '.join(_SECTIONS)}")
            if not isinstance(sub, Mapping):
                raise ParameterError("config", f"[{sec}] must be a table")
            parts[sec] = _make(_SECTIONS[sec], _renamed(sec, sub, source), sec, source)
        return cls(**parts)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> "TrainConfig":
        """Defaults ← TOML file ``path`` ← ``overrides`` (``{"section.key": value}``, None values skipped)."""
        data: dict[str, dict[str, Any]] = {}
        if path is not None:
            p = Path(path)
            text = read_input(p, "config")
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise ParameterError("config", f"{p} is not valid TOML: {e}") from None
        # Old key names read as the new ones before the overrides apply: a flag beats the
        # file whichever name either uses.
        src = None if path is None else str(path)
        data = {sec: dict(_renamed(sec, sub, src)) if isinstance(sub, Mapping) else sub for sec, sub in data.items()}
        for key, val in (overrides or {}).items():
            if val is None:
                continue
            sec, _, name = key.partition(".")
            name = RENAMED.get(sec, {}).get(name, name)
            data.setdefault(sec, {})[name] = val
        return cls.from_dict(data, src)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_toml(self) -> str:
        """The configuration as TOML: every section, every key whose value is not None
        (None is each such key's default, so :meth:`load` reads the text back equal)."""
        out: list[str] = []
        for sec, values in self.to_dict().items():
            out.append(f"[{sec}]")
            out += [f"{k} = {_toml_value(v, f'{sec}.{k}')}" for k, v in values.items() if v is not None]
            out.append("")
        return "\n".join(out)

    def dump(self, path: str | Path, header: str | None = None) -> Path:
        """Write :meth:`to_toml` to ``path`` (``header`` as leading ``#`` comment lines);
        ``TrainConfig.load(path) == self`` afterwards. Returns the path."""
        p = Path(path)
        lead = "".join(f"# {line}\n" for line in header.splitlines()) + "\n" if header else ""
        p.write_text(lead + self.to_toml())
        return p

    def check(self):
        """Check everything that can be checked without torch; return the schedule."""
        from ..schedules import ScheduleSpec, build

        t, sc = self.training, self.schedule
        require(t.steps >= 1, "training.steps", f"must be >= 1, got {t.steps}")
        require(t.microbatch_size >= 1, "training.microbatch_size", f"must be >= 1, got {t.microbatch_size}")
        require(t.lr > 0, "training.lr", f"must be > 0, got {t.lr}")
        require(t.eval_every >= 0, "training.eval_every", f"must be >= 0 (0 = no validation), got {t.eval_every}")
        require(0.0 <= t.holdout < 1.0, "training.holdout", f"must be in [0, 1), got {t.holdout}")
        require(t.eval_every == 0 or t.holdout > 0, "training.holdout",
                "must be > 0 for a validation loss (or set `training.eval_every`=0)")
        require(self.runtime.timeout_s > 0, "runtime.timeout_s", f"must be > 0, got {self.runtime.timeout_s}")
        require(self.runtime.recv_lookahead >= 0, "runtime.recv_lookahead", "must be >= 0")
        self._check_parallel()
        self.offload.recompute_level()
        sched = build(ScheduleSpec(sc.name, sc.ranks, sc.microbatches, v=sc.v, g=sc.g, mem_limit=sc.mem_limit))
        self.model.check_split(sched.num_stages)
        self._check_reliability(sched)
        self.plan_offload(sched)  # an infeasible or out-of-range C fails here, before any process starts
        if t.corpus is not None:
            require(Path(t.corpus).is_file(), "training.corpus", f"file not found: {t.corpus}")
        return sched

    def plan_offload(self, sched):
        """The offload pass on ``sched`` with ``[offload]`` (unit costs, +1/0/−1 memory),
        or None when offload is off. Pure and deterministic: every rank gets the same
        plan. Raises ParameterError naming the key (``offload.offload_chunks``, ``offload.offload_time``) or
        the offload pass's parameter for bad settings."""
        o = self.offload
        c = o.offload_chunks
        if isinstance(c, str):
            require(c in ("auto", "none", "off"), "offload.offload_chunks",
                    f"must be auto, none or a number of chunks 0..{sched.chunks}, got {c!r}")
        if c in ("none", "off", 0):
            return None
        t = o.offload_time
        require(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0, "offload.offload_time",
                f"must be a finite number >= 0, got {t!r}")
        from ..passes.offload import plan_offload

        return plan_offload(sched, options=o.options())

    def _check_parallel(self) -> None:
        """dp, tp >= 1; tp splits the model's heads, kv heads and SwiGLU width evenly (each
        TP rank holds whole heads); fsdp needs a dp group, sequence parallel a tp group."""
        par, mdl = self.parallel, self.model
        for key in ("dp", "tp"):
            val = getattr(par, key)
            require(isinstance(val, int) and not isinstance(val, bool) and val >= 1, f"parallel.{key}",
                    f"must be an integer >= 1, got {val!r}")
        tp = par.tp
        if tp > 1:
            for what, n in (("heads", mdl.heads), ("kv_heads", mdl.kv_heads), ("ffn", mdl.ffn_dim)):
                if n % tp:
                    valid = [d for d in range(1, n + 1) if n % d == 0 and mdl.heads % d == 0
                             and mdl.kv_heads % d == 0 and mdl.ffn_dim % d == 0]
                    raise ParameterError("parallel.tp", f"must divide the model's {what} ({n}) so every TP rank "
                                         f"holds whole {what}; got {tp} (valid: {', '.join(map(str, valid))})")
        require(not par.fsdp or par.dp > 1, "parallel.fsdp",
                f"shards over the data-parallel group and needs `parallel.dp` > 1 (got dp = {par.dp})")
        require(not par.sequence_parallel or tp > 1, "parallel.sequence_parallel",
                f"shards TP regions along the sequence and needs `parallel.tp` > 1 (got tp = {tp})")
        if par.sequence_parallel:
            require(mdl.seq_len % tp == 0, "parallel.sequence_parallel",
                    f"needs `model.seq_len` ({mdl.seq_len}) divisible by `parallel.tp` ({tp})")
        # What the runtime does not combine yet: refused here, before any process starts.
        require(not par.sequence_parallel, "parallel.sequence_parallel",
                "sequence parallelism is not implemented by the runtime's TP yet (the planner models it); leave it off")
        require(not (par.fsdp and tp > 1), "parallel.fsdp",
                "with tensor parallelism (`parallel.tp` > 1) is not supported by the runtime yet; drop it (dp replicates)")
        if par.dp * tp > 1:
            require(self.checkpoint.dir is None, "checkpoint.dir",
                    "checkpoints of a dp/tp mesh are not supported yet (`parallel.dp` and `parallel.tp` must be 1)")
            require(self.runtime.fault_injection is None, "runtime.fault_injection",
                    "fault injection runs on a pure pipeline only (`parallel.dp` and `parallel.tp` must be 1)")

    def _check_reliability(self, sched) -> None:
        """V placements, non-finite policy, checkpoints, fault injection, threads."""
        t, rt, ck = self.training, self.runtime, self.checkpoint
        S, p = sched.num_stages, sched.num_ranks
        if sched.placement.kind == "v" and self.model.layers % S:
            lo, hi = S * (self.model.layers // S), S * (self.model.layers // S + 1)
            raise ParameterError("model.layers", f"schedule {sched.name} puts 2 layer groups on each of {p} devices "
                                 f"in a V and needs equal groups: {self.model.layers} layers do not split into {S} "
                                 f"(use a multiple of 2p = {S}, e.g. {lo} or {hi})")
        require(t.on_nonfinite in ("stop", "skip"), "training.on_nonfinite",
                f"must be stop or skip, got {t.on_nonfinite!r}")
        require(rt.threads is None or rt.threads >= 1, "runtime.threads", f"must be >= 1, got {rt.threads}")
        require(rt.init_timeout_s > 0, "runtime.init_timeout_s", f"must be > 0, got {rt.init_timeout_s}")
        require(ck.every >= 0, "checkpoint.every", f"must be >= 0 (0 = only after the last step), got {ck.every}")
        require(ck.keep >= 1, "checkpoint.keep", f"must be >= 1, got {ck.keep}")
        if ck.dir is None:
            require(not ck.resume, "checkpoint.resume", "needs `checkpoint.dir`")
            require(ck.every == 0, "checkpoint.every", "needs `checkpoint.dir`")
        elif Path(ck.dir).exists():
            require(Path(ck.dir).is_dir(), "checkpoint.dir", f"{ck.dir} exists and is not a directory")
        from .faults import resolve  # pure: the configured fault, or $PIPEOFFLOAD_FAULT

        spec = resolve(rt.fault_injection)
        if spec is not None:
            from ..passes.comm import insert_comm

            spec.check(p, insert_comm(sched))
            require(spec.step <= t.steps, spec.source, f"step={spec.step} is after the last step ({t.steps})")


#: Keys renamed to the one vocabulary (docs/glossary.md): section -> {old: new}.
RENAMED = {"schedule": {"stages": "ranks"}, "offload": {"chunks": "offload_chunks", "time": "offload_time"}}


def _warn_renamed(section: str, old: str, stacklevel: int) -> None:
    import warnings

    warnings.warn(f"{section}.{old} is deprecated; call it {section}.{RENAMED[section][old]}", DeprecationWarning,
                  stacklevel=stacklevel)


def _renamed(section: str, values: Mapping[str, Any], source: str | None) -> Mapping[str, Any]:
    """``values`` with old key names replaced by the new ones, with a DeprecationWarning;
    both spellings at once is an error naming the old one."""
    old_new = RENAMED.get(section, {})
    if not any(k in old_new for k in values):
        return values
    out = dict(values)
    for old, new in old_new.items():
        if old in out:
            if new in out:
                raise ParameterError(f"{section}.{old}", f"is the old name of {section}.{new}; give only "
                                     f"{section}.{new}", source=source)
            _warn_renamed(section, old, stacklevel=5)
            _check_type(f"{section}.{old}", out[old], next(f.type for f in fields(_SECTIONS[section]) if f.name == new),
                        source)
            out[new] = out.pop(old)
    return out


def _make(cls: type, values: Mapping[str, Any], section: str, source: str | None) -> Any:
    """One section's dataclass; errors name the key ``section.key`` read from ``source``."""
    names = {f.name for f in fields(cls)}
    for k in values:
        if k not in names:
            raise ParameterError(f"{section}.{k}",
                                 f"unknown key; valid keys of [{section}]: {', '.join(sorted(names))}", source=source)
    types = {f.name: f.type for f in fields(cls)}
    for k, val in values.items():
        _check_type(f"{section}.{k}", val, types[k], source)
    try:
        return cls(**dict(values))
    except TypeError as e:
        raise ParameterError(section, str(e)) from None


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),),
          "list[float]": (list,)}


def _check_type(key: str, val: Any, annotation: Any, source: str | None) -> None:
    """Check a TOML value against a field annotation such as ``"int | None"``."""
    names = [t.strip() for t in str(annotation).split("|")]
    allowed = tuple(t for n in names for t in _TYPES.get(n, (object,)))
    ok = isinstance(val, allowed) and not (isinstance(val, bool) and "bool" not in names)
    if ok and isinstance(val, list):
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in val)
    if not ok:
        raise ParameterError(key, f"must be {' or '.join(names)}, got {val!r}", source=source)


def _toml_value(val: Any, key: str) -> str:
    """One TOML value: bool, int, float (inf/nan spelled as TOML does), string (JSON's
    escapes are TOML's basic-string escapes), or a list of those."""
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, int):
        return str(val)
    if isinstance(val, float):
        if math.isnan(val):
            return "nan"
        if math.isinf(val):
            return "inf" if val > 0 else "-inf"
        return repr(val)
    if isinstance(val, str):
        return json.dumps(val)
    if isinstance(val, (list, tuple)):
        return "[" + ", ".join(_toml_value(x, key) for x in val) + "]"
    raise ParameterError(key, f"cannot be written to TOML: {val!r} ({type(val).__name__})")


def config_from_plan(result: Any, config: Any = None, *, steps: int | None = None,
                     source: str | None = None) -> TrainConfig:
    """The train configuration of one planned configuration (``pipeoffload plan
    --emit-config``): ``config`` (a :class:`~pipeoffload.planner.config.Config` of
    ``result``, default ``result.best``) as ``[schedule]`` (name, P, m, v, g), ``[parallel]``
    (dp, tp), ``[offload]`` (chunks offloaded, recompute), ``[training]`` (microbatch size),
    ``[model]`` (the planner's model shape), and ``[plan]`` with the planner's prediction.

    Pure Python (reads the result's fields; recomputes the configuration's simulated
    timeline for the per-rank activation peaks). Guarantees: the schedule, split and
    microbatching are the planner's; anything the runtime has no setting for (dtype,
    flash attention, dropout, tied embeddings, fused kernels) keeps the runtime's reference model and is
    said in ``plan.source`` (with how many times a layer's saved bytes the reference model's plain
    PyTorch ops keep when the plan priced fused kernels).
    """
    from ..costmodel.hardware import GiB

    cfg_ = result.best if config is None else config
    fam, split, spec = cfg_.family, cfg_.split, result.model
    mem_limit = None
    if fam.schedule in ("zb-auto", "zb-v") and fam.limit is not None:
        # the planner's limit is L × 1F1B's peak; in the runtime's units (1 per whole-stage F) that is L·p
        mem_limit = float(fam.limit * split.pp)
    elif fam.schedule == "zb-auto":
        mem_limit = float(split.pp)
    out = TrainConfig(
        model=ModelConfig.from_spec(spec),
        schedule=ScheduleConfig(name=fam.schedule, ranks=split.pp, microbatches=cfg_.m,
                                v=fam.v if fam.v > 1 else None, g=cfg_.g, mem_limit=mem_limit),
        parallel=ParallelConfig(dp=split.dp, tp=split.tp),
        offload=OffloadConfig(offload_chunks=cfg_.offload_chunks if cfg_.offload_chunks else "none",
                              recompute=bool(cfg_.recompute), stash=bool(cfg_.offload_stash)),
        training=TrainingConfig(microbatch_size=spec.microbatch, **({"steps": steps} if steps else {})),
    )
    peaks = [float(x) for x in result.timeline(cfg_).peak_memory()]
    hw = result.hardware
    eager = spec.replace(kernels="eager").layer().saved_bytes / spec.layer().saved_bytes
    kernels = ("" if spec.kernels == "eager" else  # the reference model's plain ops keep more (docs/cost-model.md §3)
               f"; activations priced for fused kernels: the reference model's plain PyTorch ops keep {eager:.2f}x a layer's")
    out.plan = PlanPrediction(
        source=(source or f"pipeoffload plan --model {spec.name} --hardware {hw.name} --gpus {result.gpus}")
        + f" (budget {result.budget / GiB:.3g} GiB per device; model dtype {spec.dtype}"
        + ("" if cfg_.simulated_m == cfg_.m else f"; simulated at m={cfg_.simulated_m}") + kernels + ")",
        model=spec.name, hardware=hw.name, configuration=cfg_.describe(),
        # what the runner's step time measures: the pipeline and the DP reduction, not the optimizer step
        step_time_s=(cfg_.makespan_ms + cfg_.dp_exposed_ms) / 1e3, pipeline_s=cfg_.makespan_ms / 1e3, bubble=cfg_.bubble_rate,
        peak_memory_bytes=float(cfg_.memory.device), peak_memory_rank=int(cfg_.memory.rank),
        peak_activation_bytes=peaks,
    )
    return out

