"""Guards against silent wrong training from plausible use of the runner.

Each names what it found (ranks, layer groups, parameters):

- :func:`declared_ties`: ties a stage module declares itself (``stage.tied_parameters``,
  as :func:`pipeoffload.models.hf.split_causal_lm` sets from the model's tied-weight
  list) join the runner's ``tie=``, so stages built on each rank apart stay tied;
- :func:`agree` (construction, one ``all_gather_object`` over the pipeline group): every
  rank must run the same schedule (name, p, v, m, placement and op order); otherwise a
  ``ParameterError`` on every rank listing what each rank has. It also gathers a
  fingerprint of each parameter, which :func:`check_table` uses;
- :func:`check_table` (construction, no communication): a one-time ``RuntimeWarning``
  for parameters equal on several ranks (same shape, same values, not constant) that
  are not tied: stages built per rank from a model whose head is tied to its embedding,
  without ``tie=``, would train the copies apart; and for names that fell back to
  per-stage ones (``"3.0.weight"``), which a checkpoint cannot reshard across p;
- :class:`GradCheck` (end of each step, local): a one-time ``RuntimeWarning`` naming a
  layer group whose trainable parameters all got no gradient in a step (its output
  needed no gradient: built under ``no_grad``, or detached).

- :class:`EagerMaskCheck` (first forward of each layer group, local): a one-time
  ``RuntimeWarning`` when a layer group whose HF model computes attention "eager" gets a
  boolean 4-D tensor among its inputs: eager attention *adds* its mask to the scores, so
  a boolean mask is added as 0/1 and masks nothing (stages written by hand with a
  boolean mask; ``split_causal_lm`` builds the right form itself and refuses a boolean
  4-D mask for an eager model, ``models/hf.py``).
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ParameterError
from ..ir import Schedule


def declared_ties(modules: Mapping[int, nn.Module], tie: Sequence[Sequence[str]] | None) -> list | None:
    """``tie`` plus the groups the stage modules declare (``tied_parameters``), each once."""
    groups = [tuple(g) for g in tie] if tie is not None else []
    for s in sorted(modules):
        for g in getattr(modules[s], "tied_parameters", None) or ():
            if tuple(g) not in groups:
                groups.append(tuple(g))
    return groups or (None if tie is None else list(tie))


def schedule_signature(schedule: Schedule) -> tuple:
    """What every rank must agree on: name, p, layer groups, m, and a digest of the
    placement and every rank's op order."""
    pl = schedule.placement
    digest = hashlib.sha1(repr(([pl.stages_of(r) for r in range(pl.num_ranks)], schedule.ranks))
                          .encode()).hexdigest()[:12]
    return (schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, digest)


def _fingerprint(p: torch.Tensor) -> tuple | None:
    """Equal tensors give equal fingerprints; independently initialised ones practically
    never do. ``None`` for a tensor the check skips (1-D, constant, sharded, meta)."""
    if p.dim() < 2 or p.is_meta or hasattr(p, "to_local") or p.numel() < 2:
        return None
    with torch.no_grad():
        flat = p.detach().reshape(-1)
        if bool((flat == flat[0]).all()):
            return None
        head = tuple(flat[:8].double().cpu().tolist())
        return (tuple(p.shape), str(p.dtype), head, float(flat.double().sum()), float((flat.double() ** 2).sum()))


def agree(schedule: Schedule, modules: Mapping[int, nn.Module], rank: int, group: Any) -> list:
    """One collective: ParameterError on every rank when ranks run different schedules;
    returns every rank's parameter entries ``(rank, stage, name, fingerprint)``."""
    entries = [(rank, s, n, _fingerprint(p)) for s in sorted(modules) for n, p in modules[s].named_parameters()]
    mine = (schedule_signature(schedule), entries)
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return entries
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    sigs = [e[0] for e in every]
    if len(set(sigs)) > 1:
        what = ("schedule", "p", "layer groups (p·v)", "m (microbatches)", "op order digest")
        diff = [w for i, w in enumerate(what) if len({s[i] for s in sigs}) > 1]
        listing = "; ".join(f"rank {r}: {s[0]} p={s[1]} stages={s[2]} m={s[3]} ops={s[4]}" for r, s in enumerate(sigs))
        err = ParameterError("schedule", f"the pipeline's ranks were built with different schedules "
                             f"(differ in {', '.join(diff)}): {listing}; build the same schedule on every rank")
        err.all_ranks = True
        raise err
    return [x for e in every for x in e[1]]


_WARNED: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)  # the user's call of the runner


def check_table(entries: list, table: Any, rank: int, param_names: Any) -> None:
    """The one-time warnings of the module docstring (untied equal copies, per-stage
    names), from :func:`agree`'s entries and the built parameter table."""
    if param_names == "auto" and table.naming == "stage":
        by_name: dict[str, set[int]] = {}
        for _, s, n, _ in entries:
            by_name.setdefault(n, set()).add(s)
        clash = sorted(n for n, st in by_name.items() if len(st) > 1)
        _warn_once(("names", rank), "parameter names fell back to per-stage ones (\"<layer group>.<name>\") since "
                   f"layer groups use the same names for different parameters ({', '.join(clash[:4])}"
                   f"{', ...' if len(clash) > 4 else ''}): a checkpoint is then tied to this split and cannot be "
                   "loaded at another pipeline size. Keep the model's fully qualified names in each stage "
                   "(pipeoffload.models.split.split_by_name) or pass `param_names`=\"stage\" to accept it")
    if table.naming == "custom":
        return

    def name(s: int, n: str) -> str:
        return f"{s}.{n}" if table.naming == "stage" else n

    seen: dict[tuple, list[tuple[int, str]]] = {}
    for r, s, n, fp in entries:
        if fp is not None:
            seen.setdefault(fp, []).append((r, name(s, n)))
    for uses in seen.values():
        ranks = {r for r, _ in uses}
        canon = {table.aliases.get(n, n) for _, n in uses}
        if len(ranks) > 1 and len(canon) > 1 and rank == min(ranks):
            listing = ", ".join(f"{n} (rank {r})" for r, n in sorted(uses))
            _warn_once(("equal", listing), f"parameters equal on several ranks but not tied: {listing}. If the "
                       "model ties them (an output head tied to the embedding), declare it with `tie`=[(...)] "
                       "or the copies train apart")


class GradCheck:
    """After a step: a one-time warning per layer group whose trainable parameters all
    got no gradient (module docstring)."""

    def __init__(self, modules: Mapping[int, nn.Module], table: Any) -> None:
        copies = {id(c) for g in table.groups for c in g.copies}  # their gradient is the canonical copy's
        self.todo = {s: [(n, p) for n, p in m.named_parameters() if p.requires_grad and id(p) not in copies]
                     for s, m in modules.items()}
        self.todo = {s: ps for s, ps in self.todo.items() if ps}

    def after_step(self) -> None:
        for s in list(self.todo):
            ps = self.todo[s]
            if any(p.grad is not None for _, p in ps):
                del self.todo[s]  # it gets gradients: nothing more to check there
                continue
            names = ", ".join(n for n, _ in ps[:3]) + (", ..." if len(ps) > 3 else "")
            _warn_once(("nograd", s), f"layer group {s}: none of its {len(ps)} trainable parameters ({names}) got "
                       "a gradient in this step. Its output (or a later stage's) needs no gradient: built under "
                       "torch.no_grad, detached, or not depending on them; these parameters will not train")
            del self.todo[s]


class EagerMaskCheck:
    """Before the first forward of each layer group: a one-time warning when its model
    attends "eager" and a boolean 4-D tensor is among its inputs (module docstring)."""

    def __init__(self, modules: Mapping[int, nn.Module]) -> None:
        self.todo = {s for s, m in modules.items() if _eager_attention(m)}

    def before_forward(self, stage: int, leaves: Sequence[Any]) -> None:
        if stage not in self.todo:
            return
        self.todo.discard(stage)
        masks = [t for t in leaves if isinstance(t, torch.Tensor) and t.dtype == torch.bool and t.dim() == 4]
        if masks:
            _warn_once(("eager-mask", stage), f"layer group {stage}: its model computes attention \"eager\", which "
                       "adds the attention mask to its scores, but it receives a boolean 4-D tensor "
                       f"{tuple(masks[0].shape)}: a boolean mask is added as 0/1 and masks nothing. Pass the "
                       "additive form (pipeoffload.models.hf_llama.causal_mask(..., dtype=the model's dtype), or "
                       "transformers' create_causal_mask), or use attn_implementation=\"sdpa\"")


def _eager_attention(module: nn.Module) -> bool:
    """Whether a HF config among ``module``'s submodules asks for eager attention."""
    for m in module.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "eager":
            return True
    return False
