"""Device meshes for the runtime: pipeline (``pp``), data-parallel (``dp``) and
tensor-parallel (``tp``) dimensions over the default process group.

:func:`build_mesh` lays ranks out as ``rank = (dp_i · pp + pp_i) · tp + tp_i`` (tensor
parallel innermost: its collectives are the most frequent; data parallel outermost),
the layout of Megatron and torchtitan. The runner accepts any
:class:`~torch.distributed.device_mesh.DeviceMesh` with named dimensions, in any rank
order: it only ever asks the mesh for its sub-groups and for the global rank of each
pipeline peer (:func:`pipeline_ranks`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..errors import ParameterError

#: The dimension names the runtime understands, outermost first in :func:`build_mesh`.
DIMS = ("dp", "pp", "tp")


def build_mesh(pp: int, dp: int = 1, tp: int = 1, *, device_type: str = "cpu") -> Any:
    """A DeviceMesh over the default process group with dimensions ``("dp", "pp", "tp")``,
    dimensions of size 1 kept (``mesh["dp"]``, ``mesh["pp"]``, ``mesh["tp"]`` always work).
    The world size must be ``pp·dp·tp`` (ParameterError naming the sizes otherwise).
    A collective: every rank calls it."""
    from torch.distributed.device_mesh import init_device_mesh

    for name, n in (("pp", pp), ("dp", dp), ("tp", tp)):
        if not isinstance(n, int) or n < 1:
            raise ParameterError(name, f"must be a whole number ≥ 1, got {n!r}")
    if not dist.is_initialized():
        raise ParameterError("mesh", "needs an initialised process group (pipeoffload.runtime.launch or torchrun)")
    world = dist.get_world_size()
    if world != pp * dp * tp:
        raise ParameterError("pp", f"pp·dp·tp = {pp}·{dp}·{tp} = {pp * dp * tp} ranks, but the world has "
                             f"{world}; launch {pp * dp * tp} processes or change the sizes")
    return init_device_mesh(device_type, (dp, pp, tp), mesh_dim_names=DIMS)


def dim_size(mesh: Any, name: str) -> int:
    """Size of dimension ``name`` of ``mesh`` (1 when the mesh has no such dimension)."""
    names = mesh.mesh_dim_names or ()
    return mesh.size(names.index(name)) if name in names else 1


def coords(mesh: Any) -> dict[str, int]:
    """``{"pp": i, "dp": j, "tp": k}``: this rank's position in ``mesh`` (0 for a missing
    dimension). Positions in the mesh's own layout (``mesh.get_coordinate()``, as DTensor
    uses them), not ranks in the dimension's process group, which torch sorts: in a mesh
    row ``[3, 0]`` global rank 3 is at position 0."""
    names = mesh.mesh_dim_names or ()
    _check_names(names)
    at = mesh.get_coordinate()
    return {d: (int(at[names.index(d)]) if d in names else 0) for d in ("pp", "dp", "tp")}


def sub_group(mesh: Any, name: str) -> Any:
    """The process group of dimension ``name`` through this rank, or None when the mesh
    has no such dimension."""
    names = mesh.mesh_dim_names or ()
    _check_names(names)
    return mesh.get_group(name) if name in names else None


def sub_mesh(mesh: Any, name: str) -> Any:
    """The 1-D mesh of dimension ``name`` through this rank (None when missing)."""
    return mesh[name] if name in (mesh.mesh_dim_names or ()) else None


def pipeline_ranks(group: Any, mesh: Any = None) -> list[int] | None:
    """Global rank of each pipeline rank (index = pipeline rank): the mesh's ``pp`` row
    through this rank when a mesh is given (its order, which a process group — sorted —
    does not keep), else the group's ranks; None for the default group (pipeline ranks
    are global ranks)."""
    if mesh is not None and "pp" in (mesh.mesh_dim_names or ()):
        return [int(r) for r in mesh["pp"].mesh.tolist()]
    if group is None or group is dist.GroupMember.WORLD or not dist.is_initialized():
        return None
    return [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))]


def _check_names(names: tuple) -> None:
    bad = [n for n in names if n not in DIMS]
    if not names or bad:
        raise ParameterError("mesh", f"dimensions must be named from {DIMS} (any subset), got {tuple(names)!r}")
