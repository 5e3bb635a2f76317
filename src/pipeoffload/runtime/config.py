"""Training configuration as dataclasses: model, schedule, training, runtime.

Pure Python (no torch). Sources, later ones winning: the defaults below, an optional
TOML file (``--config``; sections ``[model]``, ``[schedule]``, ``[training]``,
``[runtime]`` with the field names below), then command-line flags.

>>> cfg = TrainConfig.load("run.toml", overrides={"schedule.stages": 2})
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from ..errors import ParameterError, require
from ..models.config import ModelConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class ScheduleConfig:
    """Which schedule to run (names as in ``pipeoffload schedules``)."""

    name: str = "group-interleaved"
    stages: int = 4  #: p, pipeline ranks
    microbatches: int = 8  #: m
    v: int | None = None  #: chunks per rank (schedule default when None)
    g: int | None = None  #: group size for group-interleaved
    mem_limit: float | None = None  #: for zb-auto, in units


@dataclass
class TrainingConfig:
    steps: int = 60
    microbatch_size: int = 4
    lr: float = 3e-3
    warmup_steps: int = 5
    weight_decay: float = 0.0
    seed: int = 0  #: data order
    corpus: str | None = None  #: text file; None = the stdlib documentation topics


@dataclass
class RuntimeConfig:
    backend: str = "auto"  #: auto, gloo, nccl
    timeout_s: float = 120.0  #: every blocking wait (receives, sends at step end)
    init_timeout_s: float = 120.0  #: process-group init and collectives
    threads: int | None = None  #: torch threads per CPU rank (default cores / ranks)
    recv_lookahead: int = 2  #: receives posted ahead of their consumer
    memory_meter: str = "auto"  #: auto, saved, cuda, none
    output: str | None = None  #: output folder (default runs/<timestamp>)
    progress: bool = True  #: tqdm progress bar on rank 0


_SECTIONS = {"model": ModelConfig, "schedule": ScheduleConfig, "training": TrainingConfig, "runtime": RuntimeConfig}


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "config") -> "TrainConfig":
        """Build from ``{"model": {...}, ...}``; unknown sections or keys raise ParameterError."""
        parts: dict[str, Any] = {}
        for sec, sub in data.items():
            if sec not in _SECTIONS:
                raise ParameterError(source, f"unknown section [{sec}]; valid: {', '.join(_SECTIONS)}")
            if not isinstance(sub, Mapping):
                raise ParameterError(source, f"[{sec}] must be a table")
            parts[sec] = _make(_SECTIONS[sec], sub, f"{sec}")
        return cls(**parts)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> "TrainConfig":
        """Defaults ← TOML file ``path`` ← ``overrides`` (``{"section.key": value}``, None values skipped)."""
        data: dict[str, dict[str, Any]] = {}
        if path is not None:
            p = Path(path)
            try:
                data = tomllib.loads(p.read_text())
            except FileNotFoundError:
                raise ParameterError("--config", f"file not found: {p}") from None
            except tomllib.TOMLDecodeError as e:
                raise ParameterError("--config", f"{p} is not valid TOML: {e}") from None
        for key, val in (overrides or {}).items():
            if val is None:
                continue
            sec, _, name = key.partition(".")
            data.setdefault(sec, {})[name] = val
        return cls.from_dict(data, "--config")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self):
        """Check everything that can be checked without torch; return the schedule."""
        from ..schedules import ScheduleSpec, build

        t, sc = self.training, self.schedule
        require(t.steps >= 1, "--steps", f"must be >= 1, got {t.steps}")
        require(t.microbatch_size >= 1, "training.microbatch_size", f"must be >= 1, got {t.microbatch_size}")
        require(t.lr > 0, "training.lr", f"must be > 0, got {t.lr}")
        require(self.runtime.timeout_s > 0, "--timeout", f"must be > 0, got {self.runtime.timeout_s}")
        require(self.runtime.recv_lookahead >= 0, "runtime.recv_lookahead", "must be >= 0")
        sched = build(ScheduleSpec(sc.name, sc.stages, sc.microbatches, v=sc.v, g=sc.g, mem_limit=sc.mem_limit))
        self.model.check_split(sched.num_stages)
        if t.corpus is not None:
            require(Path(t.corpus).is_file(), "--corpus", f"file not found: {t.corpus}")
        return sched


def _make(cls: type, values: Mapping[str, Any], section: str) -> Any:
    names = {f.name for f in fields(cls)}
    for k in values:
        if k not in names:
            raise ParameterError(f"{section}.{k}", f"unknown key; valid keys of [{section}]: {', '.join(sorted(names))}")
    types = {f.name: f.type for f in fields(cls)}
    for k, val in values.items():
        _check_type(f"{section}.{k}", val, types[k])
    try:
        return cls(**dict(values))
    except TypeError as e:
        raise ParameterError(section, str(e)) from None


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),)}


def _check_type(param: str, val: Any, annotation: Any) -> None:
    """Check a TOML value against a field annotation such as ``"int | None"``."""
    names = [t.strip() for t in str(annotation).split("|")]
    allowed = tuple(t for n in names for t in _TYPES.get(n, (object,)))
    ok = isinstance(val, allowed) and not (isinstance(val, bool) and "bool" not in names)
    if not ok:
        raise ParameterError(param, f"must be {' or '.join(names)}, got {val!r}")
