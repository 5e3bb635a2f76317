"""Start the ranks: spawn local processes, or join a ``torchrun`` launch.

:func:`launch` runs ``fn(ctx, *args)`` once per rank with an initialised default
process group, ``ctx`` a :class:`DistContext`:

- under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment) this
  process is one rank: it joins via ``env://``;
- otherwise it spawns ``world_size`` local processes (``torch.multiprocessing``,
  ``spawn`` start method) rendezvousing on a free localhost port.

Backend "auto": NCCL with one GPU per local rank when CUDA has enough devices, else
gloo on CPU. The process-group timeout (init and collectives) is ``init_timeout_s``.
When one spawned rank fails, the others are terminated and :class:`LaunchError`
names the rank whose failure started it (its own error, not a peer's "connection
closed") and the error.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import ParameterError


class LaunchError(RuntimeError):
    """A rank failed. ``rank`` and ``details`` (the full remote traceback) are attached."""

    def __init__(self, rank: int, message: str, details: str) -> None:
        self.rank, self.details = rank, details
        super().__init__(message)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    torchrun: bool


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_backend(backend: str, local_world: int) -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ParameterError("runtime.backend", f"unknown backend {backend!r}; valid: auto, gloo, nccl")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ParameterError("runtime.backend", "nccl needs CUDA, which is not available here; use gloo")
    return backend


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "auto",
    init_timeout_s: float = 120.0,
    threads: int | None = None,
) -> None:
    """Run ``fn(ctx, *args)`` on every rank (see module docstring). ``fn`` must be a
    module-level function (it is pickled by reference for ``spawn``)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != world_size:
            raise ParameterError("--stages", f"torchrun started {world} processes but the schedule needs {world_size}; "
                                 f"use torchrun --nproc-per-node {world_size}")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        _run_rank(int(os.environ["LOCAL_RANK"]), fn, world, args, resolve_backend(backend, local_world),
                  "env://", init_timeout_s, threads, True)
        return
    be = resolve_backend(backend, world_size)
    init = f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="pipeoffload-launch-") as err_dir:
        try:
            mp.spawn(_run_rank, args=(fn, world_size, args, be, init, init_timeout_s, threads, False, err_dir),
                     nprocs=world_size, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            raise _root_cause(e, Path(err_dir)) from None


def _root_cause(e: Exception, err_dir: Path) -> LaunchError:
    """The failure that started it: a rank's own error before its peers' "connection
    closed" consequences, else the earliest."""
    errs = []
    for f in err_dir.glob("rank*.json"):
        try:
            errs.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if errs:
        errs.sort(key=lambda x: (_is_consequence(x["error"]), x["time"]))
        root = errs[0]
        others = "; ".join(f"rank {x['rank']}: {x['error'][:120]}" for x in errs[1:])
        msg = f"rank {root['rank']} failed: {root['error']}" + (f" (then {others})" if others else "")
        return LaunchError(root["rank"], msg, "\n\n".join(x["traceback"] for x in errs))
    idx = getattr(e, "error_index", -1)
    if isinstance(e, mp.ProcessExitedException):
        return LaunchError(idx, f"rank {idx} exited with code {e.exit_code}", str(e))
    text = str(e)
    last = next((ln for ln in reversed(text.strip().splitlines()) if ln.strip()), text)
    return LaunchError(idx, f"rank {idx} failed: {last.strip()}", text)


def _is_consequence(error: str) -> bool:
    return any(s in error for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                    "could not send at", "could not post the receive"))


def _run_rank(local_rank: int, fn: Callable[..., Any], world_size: int, args: tuple, backend: str,
              init_method: str, init_timeout_s: float, threads: int | None, torchrun: bool,
              err_dir: str | None = None) -> None:
    rank = int(os.environ["RANK"]) if torchrun else local_rank
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Share the cores: without this every rank starts one thread per core.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) if torchrun else world_size
        n = threads or max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(n)
    kw: dict[str, Any] = {}
    if backend == "nccl":
        kw["device_id"] = device
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=init_timeout_s), **kw)
    try:
        fn(DistContext(rank, world_size, local_rank, backend, device, torchrun), *args)
    except BaseException as e:
        if err_dir is not None:  # for the parent's root-cause report
            rec = {"rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {str(e).strip()[:500]}",
                   "traceback": traceback.format_exc()}
            Path(err_dir, f"rank{rank}.json").write_text(json.dumps(rec))
        raise
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
