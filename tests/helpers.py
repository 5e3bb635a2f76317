"""Pieces the test modules share: the registry's schedule names (conftest.py
parametrizes ``schedule_name`` with them), the torch-free import check, skipping where
torch is not installed, and a training loop on the runtime.

A regular module, not conftest.py: the runtime tests' rank functions run in processes
spawned by ``launch`` that import the test module, and through it this one, by name
(the spawned interpreter gets the parent's ``sys.path``, where pytest put ``tests/``).
Importing this module never imports torch.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from pipeoffload.schedules import SCHEDULES

#: Every schedule in the registry, in its order. Tests that cover "every schedule"
#: iterate this (or take the ``schedule_name`` argument conftest.py parametrizes with it):
#: a generator that starts raising fails them, it is never filtered out.
ALL_SCHEDULES: tuple[str, ...] = tuple(SCHEDULES)

#: The structural classes of schedules, each with its declared representative. Where
#: running every schedule is not itself the check (the runtime's own equivalence to
#: single-process training, tests/test_runtime.py and test_runtime_offload.py, is), a
#: test runs ``REPRESENTATIVES``: one schedule of each class. What a schedule's class is
#: follows from the schedule itself (:func:`schedule_class`), and
#: tests/test_schedule_classes.py fails for a registry schedule outside every class, so
#: a new kind of schedule cannot go unsampled.
SCHEDULE_CLASSES: dict[tuple[str, bool, bool], str] = {
    # (placement kind, several layer groups per rank, backward split into B and W): representative
    ("loop", False, False): "1f1b",                  # gpipe, 1f1b
    ("loop", True, False): "interleaved-1f1b",       # interleaved-1f1b
    ("loop", True, True): "group-interleaved",       # group-interleaved
    ("loop", False, True): "zb-h2",                  # zb-h1, zb-h2, zb-auto
    ("v", True, True): "v-half",                     # zb-v, v-min, v-half, v-zb, v-auto
}
REPRESENTATIVES: tuple[str, ...] = tuple(SCHEDULE_CLASSES.values())


def schedule_class(sched) -> tuple[str, bool, bool]:
    """The class of a generated schedule: (placement kind, more than one layer group on a
    rank, B and W as separate ops)."""
    from pipeoffload.ir import OpKind

    kinds = {op.kind for ops in sched.ranks for op in ops}
    return (sched.placement.kind, sched.chunks > 1, OpKind.W in kinds)


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` imported as a module. Scripts there put ``src/`` and
    ``benchmarks/`` on ``sys.path`` when run; that is undone here, so a test's imports stay
    the installed package's."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    saved = list(sys.path)
    sys.path.insert(0, str(root / "benchmarks"))  # a script may import its sibling scripts
    try:
        spec = importlib.util.spec_from_file_location(name, root / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path[:] = saved


def require(modname: str):
    """Import and return ``modname``, or ``None`` when it is not installed. A test module
    that needs it marks its tests with :func:`missing` when it is: conftest.py makes each
    of them *fail* with that message (CI must run them, not skip them), unless
    PIPEOFFLOAD_ALLOW_MISSING=1 (a developer's machine) turns the failures into skips."""
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name != modname.split(".")[0]:
            raise
        return None


def missing(what: str, how: str) -> pytest.MarkDecorator:
    """The mark for tests that cannot run because ``what`` is not installed (``how``: how
    to install it)."""
    return pytest.mark.requires(f"{what} is not installed; these tests need it ({how}; `make test` installs it). "
                                "PIPEOFFLOAD_ALLOW_MISSING=1 skips them instead")


def requires_torchrun(bin_dir: Path):
    """The mark for tests that launch ``torchrun`` from ``bin_dir`` (the interpreter's scripts):
    none where the script is there, else ``missing``'s (the test fails, not skips, in CI)."""
    if shutil.which("torchrun", path=str(bin_dir)) is not None:
        return lambda test: test
    return missing(f"torchrun (in {bin_dir})", "pip installs it with torch: pip install torch==2.13.0")


def import_torch(modname: str = "torch"):
    """Import and return ``modname`` (torch or one of its modules), or skip the calling test
    (or module, at module level) when torch is not installed: it is the optional ``runtime``
    extra (``pip install -e '.[dev]'`` runs the pure tests; ``make test`` installs torch).
    Anything else, a torch without ``modname`` (older than the ``runtime`` extra's
    ``torch>=2.5``) or a broken install, is an error, not a skip."""
    assert modname == "torch" or modname.startswith("torch."), modname
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        pytest.skip("torch is not installed (the optional `runtime` extra: pip install -e '.[runtime]')",
                    allow_module_level=True)


# ----------------------------------------------------------------------------- import weight

_IMPORT_CHECK = """
import importlib, sys
forbidden = {forbidden!r}

def loaded():
    return sorted({{m.split('.')[0] for m in sys.modules}} & set(forbidden))

for name in {modules!r}:
    importlib.import_module(name)
    assert not loaded(), f"import {{name}} imported {{loaded()}}"
exec(compile({then!r}, "<then>", "exec"), {{}})
assert not loaded(), f"running the code after the imports imported {{loaded()}}"
"""


def assert_imports_no_torch(*modules: str, then: str = "",
                            forbidden: Sequence[str] = ("torch",)) -> subprocess.CompletedProcess:
    """In a fresh interpreter, import ``modules`` one by one, then run the code ``then``;
    fail if any of them loaded a package named in ``forbidden`` (torch by default), naming
    the module or code that did. Returns the finished process (its stdout is ``then``'s
    output)."""
    assert modules, "name at least one module"
    code = _IMPORT_CHECK.format(forbidden=tuple(forbidden), modules=modules, then=then)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


# ----------------------------------------------------------------------------- training on the runtime


@dataclass
class Trained:
    """What :func:`train_steps` saw on this rank."""

    runner: Any  #: the PipelineRunner, after the last step
    results: list  #: StepResult of every step, in order
    first_grads: dict  #: parameter name -> gradient of the first step (before its update)

    @property
    def first(self):
        return self.results[0]

    @property
    def last(self):
        return self.results[-1]

    def params(self) -> dict:
        """Parameter name -> a copy of its value now (after the last update)."""
        return {n: p.detach().clone() for n, p in self.runner.named_parameters()}


def train_steps(sched, cfg, data: Callable[[int], tuple[list, list]], *, steps: int, lr: float,
                store=None, timeout_s: float = 60.0, **runner_kw: Any) -> Trained:
    """``steps`` SGD steps (learning rate ``lr``) of the transformer ``cfg`` split into
    ``sched``'s layer groups, on this rank, with microbatches ``data(step)``, the
    activation store ``store`` (None: the runner's default) and other PipelineRunner
    options ``runner_kw``."""
    import torch

    from pipeoffload.models.transformer import build_stage, lm_loss
    from pipeoffload.runtime.executor import PipelineRunner

    S = sched.num_stages
    runner = PipelineRunner(lambda s: build_stage(cfg, s, S), lm_loss, sched, timeout_s=timeout_s,
                            activation_store=store, **runner_kw)
    opt = torch.optim.SGD(runner.parameters(), lr=lr)
    results, grads = [], {}
    for step in range(steps):
        xs, ys = data(step)
        results.append(runner.step(xs, ys))
        if step == 0:
            grads = {n: p.grad.clone() for n, p in runner.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    return Trained(runner, results, grads)


def run_world(worker: Callable, p: int, path: Any, *args: Any) -> dict:
    """Run ``worker(ctx, str(path), *args)`` on ``p`` gloo ranks (real processes via
    ``pipeoffload.runtime.launcher.launch``) and return what its rank 0 saved to ``path``
    with ``torch.save``. One spawn runs many cases: the runtime tests keep CI short."""
    torch = import_torch()
    from pipeoffload.runtime.launcher import launch

    launch(worker, p, (str(path), *args), backend="gloo", init_timeout_s=120)
    return torch.load(path, weights_only=False)


def torch_dualpipev_csv(p: int, m: int, path) -> Any:
    """torch 2.13's own ScheduleDualPipeV for ``p`` ranks and ``m`` microbatches, lowered by
    torch (``_prepare_schedule_with_comms``: UNSHARD/RESHARD, REDUCE_GRAD, sends and
    receives around its OVERLAP_F_B cells) and dumped by torch's own writer as a
    compute_comms CSV at ``path``: every action of torch's grammar. The schedule object is
    built without stages or a process group (the attributes its order computation and
    lowering read, as torch's constructor sets them). Returns ``path``."""
    from torch.distributed.pipelining import schedules as ts

    obj = ts.ScheduleDualPipeV.__new__(ts.ScheduleDualPipeV)
    obj.pp_group_size, obj._n_microbatches = p, m
    obj._num_stages = obj.num_stages = 2 * p
    obj.n_local_stages, obj._stages, obj._defer_pp_recv = 2, [], False
    obj.stage_index_to_group_rank = ts.generate_stage_to_rank_mapping(p, 2 * p, style="v")
    order = {r: obj._calculate_single_rank_operations(r) for r in range(p)}
    obj._prepare_schedule_with_comms(order)
    obj._dump_csv(str(path), format="compute_comms")
    return path
