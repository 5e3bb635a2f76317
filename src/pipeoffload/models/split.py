"""A by-name split of any ``nn.Module`` (torchtitan's way): each stage keeps the submodules
you list and drops the rest, and runs the model's own ``forward``.

    stages = split_by_name(model, [["tok_embeddings", "layers.0", "layers.1"],
                                   ["layers.2", "layers.3", "norm", "output"]])

Each stage is a shallow view of ``model``: the same class, the same parameter tensors (no
copy), the same fully qualified names (``layers.2.attention.wq.weight``), so checkpoints
reshard across pipeline sizes and a module shared by two stages is one tensor. A dropped
child of a plain module reads as ``None``; a dropped entry of an ``nn.ModuleDict`` is
absent. The model's forward must allow that, as torchtitan's models do::

    h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
    for layer in self.layers.values():
        h = layer(h)
    h = self.norm(h) if self.norm is not None else h
    return self.output(h) if self.output is not None else h

(``examples/torchtitan_llama.py``). Layers kept in an ``nn.ModuleList`` cannot be split
by name (a list has no holes): use an ``nn.ModuleDict`` keyed by the layer number.
"""

from __future__ import annotations

import copy
from typing import Sequence

from torch import nn

from ..errors import ParameterError


def split_by_name(model: nn.Module, stages: Sequence[Sequence[str]]) -> list[nn.Module]:
    """One view of ``model`` per stage, keeping the listed submodules.

    Args:
        model: any module whose forward skips the submodules a stage drops (module docstring).
        stages: per stage, the fully qualified names of the submodules (or parameters) it
            keeps: ``"layers.3"`` keeps that layer with everything under it.

    Returns:
        The stage modules, in order; pass them to ``PipelineRunner`` as a list.

    Raises:
        ParameterError: a name that is not in the model, a name in two stages, a
            parameter no stage keeps, or a split ``nn.ModuleList`` (naming them).

    Guarantees: a stage's parameters are the model's tensors under the model's names;
    every parameter of the model is in exactly one stage.
    """
    lists = [list(s) for s in stages]
    if not lists or any(not s for s in lists):
        raise ParameterError("stages", "expected one non-empty list of submodule names per stage")
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    owner: dict[str, int] = {}
    for s, names in enumerate(lists):
        for n in names:
            if n not in modules and n not in params:
                raise ParameterError("stages", f"stage {s}: {model.__class__.__name__} has no submodule or "
                                     f"parameter {n!r}")
            if n in owner:
                raise ParameterError("stages", f"{n!r} is listed in stages {owner[n]} and {s}")
            owner[n] = s
    views = [_view(model, "", set(names)) for names in lists]
    kept = {n for v in views for n, _ in v.named_parameters()}
    lost = [n for n in params if n not in kept]
    if lost:
        raise ParameterError("stages", f"parameters no stage keeps: {', '.join(lost[:5])}"
                             f"{', ...' if len(lost) > 5 else ''}")
    return views


def _covered(prefix: str, keep: set[str]) -> bool:
    return any(k == prefix or prefix == "" or k.startswith(prefix + ".") for k in keep)


def _view(mod: nn.Module, prefix: str, keep: set[str]) -> nn.Module:
    if prefix in keep:
        return mod  # the whole subtree
    view = copy.copy(mod)  # same class and attributes; its own child and parameter tables
    view._modules = {}
    view._parameters = {n: p for n, p in mod._parameters.items() if _join(prefix, n) in keep}
    for name, child in mod._modules.items():
        path = _join(prefix, name)
        if child is not None and _covered(path, keep):
            view._modules[name] = _view(child, path, keep)
        elif isinstance(mod, nn.ModuleList):
            if any(_covered(_join(prefix, n), keep) for n in mod._modules):
                raise ParameterError("stages", f"{prefix!r} is an nn.ModuleList split between stages; make it an "
                                     "nn.ModuleDict keyed by the layer number (torchtitan's layout)")
        elif not isinstance(mod, nn.ModuleDict):
            view._modules[name] = None
    return view


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
