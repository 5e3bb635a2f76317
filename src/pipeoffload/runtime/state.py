"""A pipeline's state by the user's names, saved with ``torch.distributed.checkpoint``.

:meth:`PipelineRunner.state_dict` gives this rank's part as one flat dict; every key is
documented here, nothing else is added:

==================================  ==================================================
``model.<name>``                    a parameter (each shared parameter once, under its
                                    canonical name) or a persistent buffer of a stage
                                    module, by the runner's names (``runtime/params.py``)
``optim.state.<name>.<key>``        the optimizer's state of parameter ``<name>``
                                    (``exp_avg``, ``exp_avg_sq``, ``step``, ...)
``optim.param_groups.<name>.<key>`` the hyperparameters of ``<name>``'s parameter group
                                    (``lr``, ``betas``, ``weight_decay``, ...)
``runner.steps_done``               training steps run (keys the random streams)
==================================  ==================================================

Keys name parameters, never ranks or layer groups, so a state saved with one pipeline
size, schedule or placement loads into another (each rank loads the names it holds;
the whole model's ``state_dict()`` uses the same ``model.``-less names when the stage
modules keep the model's structure). :func:`save` / :func:`load` write and read it with
``torch.distributed.checkpoint`` (one file per rank and a ``.metadata`` file; shared
parameters, held by several ranks, are written once), every rank calling them together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

import torch
import torch.distributed as dist

from ..errors import ParameterError



class Runner(Protocol):
    """What this module reads of a :class:`~pipeoffload.runtime.executor.PipelineRunner`
    (a protocol, so that the runner's module and this one do not import each other)."""

    modules: dict
    my_stages: tuple
    table: Any
    group: Any
    steps_done: int

    def parameters(self) -> list: ...

    def state_dict(self, optimizer: Any = None) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any], optimizer: Any = None) -> None: ...

STEPS_KEY = "runner.steps_done"


def runner_state_dict(runner: Runner, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """This rank's state (module docstring): the model, the optimizer's state if given,
    and the step counter. Tensors are the live ones (detached), not copies."""
    out: dict[str, Any] = {f"model.{n}": p.detach() for n, p in runner.table.named}
    out.update({f"model.{n}": b for n, b in _buffers(runner).items()})
    if optimizer is not None:
        out.update(_optimizer_state(runner, optimizer))
    out[STEPS_KEY] = runner.steps_done
    return out


def _buffers(runner: Runner) -> dict[str, torch.Tensor]:
    """Persistent buffers of this rank's stage modules, by the runner's naming."""
    params = {id(p) for mod in runner.modules.values() for p in mod.parameters()}
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for s in runner.my_stages:
        for k, v in runner.modules[s].state_dict(keep_vars=True).items():
            if isinstance(v, torch.Tensor) and id(v) not in params and id(v) not in seen:
                seen.add(id(v))
                out[_buffer_name(runner, s, k)] = v.detach()
    return out


def _buffer_name(runner: Runner, stage: int, local: str) -> str:
    return f"{stage}.{local}" if runner.table.naming == "stage" else local


def _param_names(runner: Runner, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    names = {id(p): n for n, p in runner.table.named}
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in names:
                raise ParameterError("optimizer", f"optimizes a tensor of shape {list(p.shape)} that is not one of "
                                     "runner.parameters(); build it on runner.parameters()")
    return names


def _optimizer_state(runner: Runner, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    names = _param_names(runner, optimizer)
    out: dict[str, Any] = {}
    for g in optimizer.param_groups:
        hyper = {k: v for k, v in g.items() if k != "params"}
        for p in g["params"]:
            n = names[id(p)]
            out.update({f"optim.param_groups.{n}.{k}": v for k, v in hyper.items()})
            out.update({f"optim.state.{n}.{k}": v for k, v in optimizer.state.get(p, {}).items()})
    return out


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's per-parameter state (e.g. AdamW's moments) where it has
    none yet, without changing any parameter: one step with learning rate 0 on zero
    gradients; gradients and learning rates are restored. A state dict to load into
    needs the state's tensors to exist."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if all(p in optimizer.state and optimizer.state[p] for p in params):
        return
    grads = [p.grad for p in params]
    lrs = [g["lr"] for g in optimizer.param_groups]
    try:
        for g in optimizer.param_groups:
            g["lr"] = torch.zeros_like(g["lr"]) if isinstance(g["lr"], torch.Tensor) else 0.0
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        for g, lr in zip(optimizer.param_groups, lrs):
            g["lr"] = lr
        for p, gr in zip(params, grads):
            p.grad = gr


def load_runner_state_dict(runner: Runner, state: Mapping[str, Any],
                           optimizer: torch.optim.Optimizer | None) -> None:
    """Copy ``state`` into this rank's parameters, buffers, optimizer and step counter.
    Every key this rank needs must be present (ParameterError naming the missing ones);
    keys of other ranks' parameters are ignored."""
    want = runner_state_dict(runner, optimizer) if optimizer is None else _template(runner, optimizer)
    missing = [k for k in want if k not in state]
    if missing:
        raise ParameterError("state", f"{len(missing)} keys this rank needs are missing, e.g. "
                             f"{', '.join(missing[:4])}")
    with torch.no_grad():
        for k, dst in want.items():
            src = state[k]
            if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor):
                if dst.shape != src.shape:
                    raise ParameterError("state", f"{k} has shape {list(src.shape)}, this runner's has "
                                         f"{list(dst.shape)}")
                if dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
    if optimizer is not None:
        _apply_optimizer_values(runner, optimizer, state)
    runner.steps_done = int(state[STEPS_KEY])


def _template(runner: Runner, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    init_optimizer_state(optimizer)
    return runner_state_dict(runner, optimizer)


def _apply_optimizer_values(runner: Runner, optimizer: torch.optim.Optimizer,
                            state: Mapping[str, Any]) -> None:
    """Non-tensor optimizer state and hyperparameters (tensors were copied in place)."""
    names = _param_names(runner, optimizer)
    for g in optimizer.param_groups:
        first = names[id(g["params"][0])] if g["params"] else None
        for k in list(g):
            key = f"optim.param_groups.{first}.{k}"
            if k != "params" and key in state and not isinstance(g[k], torch.Tensor):
                g[k] = state[key]
        for p in g["params"]:
            st = optimizer.state.get(p, {})
            for k, v in st.items():
                key = f"optim.state.{names[id(p)]}.{k}"
                if not isinstance(v, torch.Tensor) and key in state:
                    st[k] = state[key]


def save(runner: Runner, path: str | Path, optimizer: torch.optim.Optimizer | None = None,
         extra: Mapping[str, Any] | None = None) -> None:
    """Write the pipeline's state (and ``extra`` keys, same on every rank or per-rank
    names) to the directory ``path`` with ``torch.distributed.checkpoint``. Collective."""
    import torch.distributed.checkpoint as dcp

    state = {**runner.state_dict(optimizer), **(extra or {})}
    dcp.save(state, checkpoint_id=str(path), process_group=runner.group, no_dist=not dist.is_initialized())


def load(runner: Runner, path: str | Path, optimizer: torch.optim.Optimizer | None = None,
         extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read what :func:`save` wrote — with any pipeline size, schedule or placement —
    into the runner (and the optimizer); ``extra``: further keys to read (filled in and
    returned). Collective."""
    import torch.distributed.checkpoint as dcp

    template = {**(_template(runner, optimizer) if optimizer is not None else runner_state_dict(runner, None)),
                **(extra or {})}
    _check_keys(template, path)
    dcp.load(template, checkpoint_id=str(path), process_group=runner.group, no_dist=not dist.is_initialized())
    runner.load_state_dict(template, optimizer)
    return {k: template[k] for k in (extra or {})}


def _check_keys(template: Mapping[str, Any], path: str | Path) -> None:
    """Before reading: every key this rank needs is in the checkpoint at ``path`` (a
    directory written by :func:`save`), else a ParameterError naming a few and, when the
    two sides name parameters differently (per-stage ``"<stage>.<name>"`` against the
    model's own names), saying so — instead of the reader's long trace."""
    import re

    import torch.distributed.checkpoint as dcp

    if not Path(path).is_dir():
        return  # not a local directory: the reader itself reports what is wrong
    try:
        have = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    except Exception:  # noqa: BLE001 - unreadable metadata: the reader's own error is clearer
        return
    missing = [k for k in template if k not in have]
    if not missing:
        return
    staged = re.compile(r"^(model\.)?\d+\.")
    ours = sum(bool(staged.match(k)) for k in template if not k.startswith(("optim.", "runner.")))
    theirs = sum(bool(staged.match(k)) for k in have if not k.startswith(("optim.", "runner.")))
    hint = ""
    if (ours == 0) != (theirs == 0):
        which = "the checkpoint's" if theirs else "this runner's"
        hint = (f"; {which} parameter names are per layer group (\"<stage>.<name>\", which change with the "
                "split), the other side's are the model's own: build the stages so that they keep the model's "
                "names (split_causal_lm, split_by_name) on both sides, or load with the split that saved it")
    raise ParameterError("path", f"the checkpoint at {path} lacks {len(missing)} of the {len(template)} keys this "
                         f"rank needs, e.g. {', '.join(missing[:3])}{hint}")
