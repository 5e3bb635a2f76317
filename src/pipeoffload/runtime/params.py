"""Parameters of a pipeline: the user's names, and parameters shared by several stages.

Names
-----
A parameter's name is its name in its stage module (``param_names="module"``): a
stage module that keeps the model's own structure (``model.layers.3.mlp.up_proj``
kept under ``model.layers["3"]``) gives the model's own names, so a checkpoint of the
pipeline loads into the whole model and back, at any pipeline size.
``param_names="stage"`` prefixes each name with its layer group (``"3.0.weight"``, the
names of ``nn.Sequential(*stages)``); a callable ``(stage, name) -> name`` is also
accepted. The default ``"auto"`` is ``"module"`` unless two layer groups use one name
for different parameters (not declared tied), then ``"stage"``.

Shared (tied) parameters
------------------------
A parameter used by several layer groups — an embedding tied to the output head, any
module reused — is one *tie group*, found three ways:

- *detected on a rank*: the same tensor object in two of its layer groups;
- *detected in a module list*: ``stage_modules`` given as a list or mapping of all layer
  groups, two of which hold the same tensor object (every rank sees the whole list);
- *declared*: ``tie=[("model.embed_tokens.weight", "lm_head.weight"), ...]`` by names,
  for layer groups built separately on different ranks.

Guarantees: :meth:`ParamTable.parameters` lists each tie group once per rank (its
*canonical* copy: the one of the lowest layer group on the rank, named by the first
declared name or else by that layer group's name); after every step
:meth:`ParamTable.reduce_grads` gives every copy the sum of the gradients of all uses,
on all ranks that hold one (summed in rank order, so the copies get the same bits and
stay equal under the same optimizer), exchanged only among those ranks (Megatron's
embedding group); a further copy on the same rank (declared tied, a different tensor)
takes the canonical copy's values before each step (:meth:`ParamTable.sync_copies`).
Declared or detected copies that differ at the start are an error naming them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ParameterError
from .p2p import P2P, TIE_TAG_BASE

Namer = Callable[[int, str], str]
NAMINGS = ("auto", "module", "stage")


@dataclass
class TieGroup:
    """One shared parameter as this rank holds it."""

    name: str  #: canonical name
    holders: tuple[int, ...]  #: pipeline ranks holding a copy, ascending
    param: nn.Parameter  #: this rank's canonical copy
    copies: list[nn.Parameter] = field(default_factory=list)  #: other tensors of it on this rank
    names: tuple[str, ...] = ()  #: every name it has, anywhere
    index: int = 0  #: its position among the pipeline's shared parameters (the same on every rank)


@dataclass(frozen=True)
class _Entry:
    rank: int
    stage: int
    local: str
    shape: tuple[int, ...]
    dtype: str
    oid: int  #: id() of the tensor in its process (equal ids = same tensor on one rank)
    origin: int = 0  #: id() of the tensor it was made from (FSDP shards each use apart); else ``oid``


class ParamTable:
    """This rank's parameters by the user's names, and its tie groups (module docstring)."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], groups: list[TieGroup], aliases: dict[str, str],
                 stage_of: dict[int, int]) -> None:
        self.named = named
        self.groups = groups
        self.aliases = aliases  #: every name of this pipeline -> its canonical name
        self.stage_of = stage_of  #: id(parameter) -> the lowest local layer group using it
        self.naming = "module"  #: the naming in force: "module", "stage" or "custom"

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named]

    def sync_copies(self) -> None:
        """Further copies on this rank take the canonical copy's values."""
        with torch.no_grad():
            for g in self.groups:
                for c in g.copies:
                    c.copy_(g.param)

    def reduce_grads(self, p2p: P2P | None, rank: int) -> None:
        """Every copy of every tie group gets the sum of all uses' gradients (module docstring).

        DTensor gradients (FSDP shards, TP shards) are exchanged by their local tensors:
        the holders of one copy lay it out alike (same shape, same mesh sizes), so the
        sum of local shards is the local shard of the sum."""
        for g in self.groups:
            local = _local_sum(g)
            if len(g.holders) > 1 and p2p is not None:
                mine = _local_tensor(local)
                parts = {rank: mine}
                for peer in g.holders:
                    if peer != rank:
                        parts[peer] = p2p.exchange(mine, peer, TIE_TAG_BASE + g.index,
                                                   f"gradient exchange of shared parameter {g.name!r}")
                total = parts[g.holders[0]].clone()
                for r in g.holders[1:]:
                    total.add_(parts[r])
                local = _like(local, total)
            if g.param.requires_grad:
                g.param.grad = local
            for c in g.copies:
                c.grad = None


def _local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def _like(template: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` (a local tensor) as a tensor laid out like ``template`` (a DTensor: its shard)."""
    if not hasattr(template, "to_local"):
        return t
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t, template.device_mesh, template.placements, shape=template.shape,
                              stride=template.stride(), run_check=False)


def _local_sum(g: TieGroup) -> torch.Tensor:
    grads = [t.grad for t in [g.param] + g.copies if t.grad is not None]
    if not grads:
        return torch.zeros_like(g.param)
    total = grads[0].clone() if len(grads) > 1 else grads[0]
    for extra in grads[1:]:
        total.add_(extra)
    return total


def namer_of(param_names: str | Namer) -> Namer | str:
    if callable(param_names):
        return param_names
    if param_names not in NAMINGS:
        raise ParameterError("param_names", f"unknown naming {param_names!r}; valid: {', '.join(NAMINGS)} "
                             "or a callable (stage, name) -> name")
    return param_names


def _name(namer: Namer | str, stage: int, local: str) -> str:
    if callable(namer):
        return namer(stage, local)
    return f"{stage}.{local}" if namer == "stage" else local


def build_table(modules: Mapping[int, nn.Module], rank: int, *, all_modules: Mapping[int, nn.Module] | None,
                param_names: str | Namer, tie: Sequence[Sequence[str]] | None, group: Any,
                p2p: P2P | None, origin: Mapping[int, int] | None = None, replicas: Any = None) -> ParamTable:
    """Name this rank's parameters and find its tie groups (a collective over ``group``
    when a process group is initialised: every rank of the pipeline must call it).

    ``origin`` maps ``id()`` of a parameter to ``id()`` of the tensor it replaced
    (FSDP's ``fully_shard`` gives each layer group its own sharded parameter, so one
    tensor used by two layer groups becomes two: they stay one tie group, as copies).
    ``replicas`` (the data-parallel group, when copies are sharded over it) also
    agrees the start check, so every rank raises when one replica's shards differ."""
    namer = namer_of(param_names)
    tie = _check_tie_arg(tie)
    origin = dict(origin or {})
    local = _entries(modules, rank, origin)
    every = _gather(local, group)
    detected = _detected_in_list(all_modules, origin) if all_modules is not None else []
    if namer == "auto":
        namer = "stage" if _collisions(every, "module", tie, detected) else "module"
    bad = _collisions(every, namer, tie, detected)
    if bad:
        raise ParameterError("param_names", f"names used by different parameters in different layer groups: "
                             f"{', '.join(bad[:5])}; use `param_names`=\"stage\", or declare them tied with `tie`")
    unions = _unions(every, namer, tie, detected)
    table = _table(modules, rank, local, every, namer, unions, tie)
    table.naming = namer if isinstance(namer, str) else "custom"
    _check_equal_copies(table, rank, group, p2p, replicas)
    return table


def _check_tie_arg(tie: Any) -> list[tuple[str, ...]]:
    if tie is None:
        return []
    try:
        groups = [tuple(g) for g in tie]
    except TypeError:
        groups = []
    if not groups or any(len(g) < 2 or not all(isinstance(n, str) for n in g) for g in groups):
        raise ParameterError("tie", f"expected groups of at least two parameter names, e.g. "
                             f"[(\"embed.weight\", \"head.weight\")], got {tie!r}")
    return groups


def _entries(modules: Mapping[int, nn.Module], rank: int, origin: Mapping[int, int]) -> list[_Entry]:
    out = []
    for s in sorted(modules):
        for name, p in modules[s].named_parameters():
            out.append(_Entry(rank, s, name, tuple(p.shape), str(p.dtype), id(p), origin.get(id(p), id(p))))
    return out


def _gather(local: list[_Entry], group: Any) -> list[_Entry]:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return list(local)
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, local, group=group)
    return [e for part in out for e in part]


def _detected_in_list(all_modules: Mapping[int, nn.Module],
                      origin: Mapping[int, int]) -> list[list[tuple[int, str]]]:
    """Tensors shared by several layer groups of a module list: ``[(stage, name), ...]`` each."""
    seen: dict[int, list[tuple[int, str]]] = {}
    for s in sorted(all_modules):
        for name, p in all_modules[s].named_parameters():
            seen.setdefault(origin.get(id(p), id(p)), []).append((s, name))
    return [uses for uses in seen.values() if len({s for s, _ in uses}) > 1]


def _unions(every: list[_Entry], namer: Namer | str, tie: list[tuple[str, ...]],
            detected: list[list[tuple[int, str]]]) -> dict[tuple[int, int, str], tuple[int, int, str]]:
    """Union-find over entries ``(rank, stage, local name)``: same tensor on a rank,
    detected in a module list, or declared by names."""
    parent: dict[tuple[int, int, str], tuple[int, int, str]] = {}

    def find(k):
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    def union(a, b):
        parent[find(a)] = find(b)

    by_obj: dict[tuple[int, int], tuple[int, int, str]] = {}
    by_name: dict[str, list[tuple[int, int, str]]] = {}
    by_local: dict[tuple[int, str], list[tuple[int, int, str]]] = {}
    for e in every:
        k = (e.rank, e.stage, e.local)
        find(k)
        if (e.rank, e.origin) in by_obj:
            union(k, by_obj[(e.rank, e.origin)])
        by_obj.setdefault((e.rank, e.origin), k)
        by_name.setdefault(_name(namer, e.stage, e.local), []).append(k)
        by_local.setdefault((e.stage, e.local), []).append(k)
    for uses in detected:
        keys = [k for u in uses for k in by_local.get(u, [])]
        for a in keys[1:]:
            union(a, keys[0])
    for names in tie:
        keys = [k for n in names for k in by_name.get(n, [])]
        for a in keys[1:]:
            union(a, keys[0])
    return {k: find(k) for k in parent}


def _collisions(every: list[_Entry], namer: Namer | str, tie: list[tuple[str, ...]],
                detected: list[list[tuple[int, str]]]) -> list[str]:
    """Names that ``namer`` gives to parameters of different tie groups."""
    roots = _unions(every, namer, tie, detected)
    owners: dict[str, set] = {}
    for e in every:
        owners.setdefault(_name(namer, e.stage, e.local), set()).add(roots[(e.rank, e.stage, e.local)])
    return sorted(n for n, r in owners.items() if len(r) > 1)


def _table(modules: Mapping[int, nn.Module], rank: int, local: list[_Entry], every: list[_Entry],
           namer: Namer | str, roots: dict, tie: list[tuple[str, ...]]) -> ParamTable:
    """This rank's :class:`ParamTable` from the gathered entries and their unions."""
    members: dict[tuple, list[_Entry]] = {}
    for e in every:
        members.setdefault(roots[(e.rank, e.stage, e.local)], []).append(e)
    names = {(e.rank, e.stage, e.local): _name(namer, e.stage, e.local) for e in every}
    _check_declared(tie, set(names.values()), namer)
    canon: dict[tuple, str] = {}
    for root, es in members.items():
        canon[root] = _canonical_name(es, names, tie)
        _check_same_kind(es, canon[root])
    shared = sorted(canon[r] for r, es in members.items() if len({(e.rank, e.oid) for e in es}) > 1)
    objects = {(s, n): p for s in modules for n, p in modules[s].named_parameters()}
    named, groups, stage_of, done = [], [], {}, {}
    for e in local:
        root = roots[(e.rank, e.stage, e.local)]
        p = objects[(e.stage, e.local)]
        stage_of.setdefault(id(p), e.stage)
        if root in done:
            g = done[root]
            if g is not None and p is not g.param and all(p is not c for c in g.copies):
                g.copies.append(p)
            continue
        named.append((canon[root], p))
        es = members[root]
        holders = tuple(sorted({x.rank for x in es}))
        g = None
        if canon[root] in shared:
            g = TieGroup(canon[root], holders, p, [], tuple(sorted({names[(x.rank, x.stage, x.local)] for x in es})),
                         shared.index(canon[root]))
            groups.append(g)
        done[root] = g
    groups = [g for g in groups if len(g.holders) > 1 or g.copies]
    groups.sort(key=lambda g: g.index)
    aliases = {n: canon[roots[k]] for k, n in names.items()}
    return ParamTable(named, groups, aliases, stage_of)


def _check_declared(tie: list[tuple[str, ...]], known: set[str], namer: Namer | str) -> None:
    missing = [n for g in tie for n in g if n not in known]
    if missing:
        how = "prefixed with their layer group, since names collide" if namer == "stage" else "as the stage modules name them"
        raise ParameterError("tie", f"no parameter is named {', '.join(map(repr, missing[:5]))} "
                             f"(names are {how}; e.g. {', '.join(sorted(known)[:3])})")


def _canonical_name(es: list[_Entry], names: dict, tie: list[tuple[str, ...]]) -> str:
    mine = {names[(e.rank, e.stage, e.local)] for e in es}
    for g in tie:
        for n in g:
            if n in mine:
                return n
    first = min(es, key=lambda e: (e.stage, e.rank))
    return names[(first.rank, first.stage, first.local)]


def _check_same_kind(es: list[_Entry], name: str) -> None:
    kinds = {(e.shape, e.dtype) for e in es}
    if len(kinds) > 1:
        raise ParameterError("tie", f"the copies of shared parameter {name!r} differ in shape or dtype: "
                             + ", ".join(f"{e.local} of layer group {e.stage}: {list(e.shape)} {e.dtype}" for e in es))


def _check_equal_copies(table: ParamTable, rank: int, group: Any, p2p: P2P | None, replicas: Any = None) -> None:
    """ParameterError on every rank when the copies of a shared parameter differ at
    the start (local copies compared here; a holder compares with the lowest holder).
    Sharded copies are compared shard by shard (their holders shard them alike)."""
    bad = []
    for g in table.groups:
        mine = _local_tensor(g.param.detach())
        if any(not torch.equal(_local_tensor(c.detach()), mine) for c in g.copies):
            bad.append(g.name)
        if len(g.holders) > 1 and p2p is not None:
            peers = g.holders[1:] if rank == g.holders[0] else g.holders[:1]
            for peer in peers:
                other = p2p.exchange(mine, peer, TIE_TAG_BASE + g.index,
                                     f"start check of shared parameter {g.name!r}")
                if not torch.equal(other, mine) and g.name not in bad:
                    bad.append(g.name)
    # agreed over the pipeline (group None: the world), then over the replicas
    for grp in ([group] + ([replicas] if replicas is not None else [])) if dist.is_initialized() else []:
        if dist.get_world_size(grp) > 1:
            every: list[Any] = [None] * dist.get_world_size(grp)
            dist.all_gather_object(every, bad, group=grp)
            bad = sorted({n for part in every for n in part})
    if bad:
        names = {g.name: g.names for g in table.groups}
        detail = "; ".join(f"{n} ({' = '.join(names.get(n, (n,)))})" for n in bad)
        err = ParameterError("tie", f"shared parameters whose copies differ at the start: {detail}; initialise "
                             "them equal (copy one into the others) before building the runner")
        err.all_ranks = True  # every rank raises it: the launcher reports it once
        raise err
