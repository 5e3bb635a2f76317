"""Start the ranks: spawn local processes, or join a ``torchrun`` launch.

:func:`launch` runs ``fn(ctx, *args)`` once per rank with an initialised default
process group, ``ctx`` a :class:`DistContext`:

- under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` in the environment; ``LOCAL_RANK``
  defaults to ``RANK``) this process is one rank: it joins via ``env://``, after
  checking — before any rendezvous — that ``WORLD_SIZE`` is what the schedule needs;
- otherwise it spawns ``world_size`` local processes (``torch.multiprocessing``,
  ``spawn`` start method) rendezvousing on a store the launcher holds on a localhost port.

Backend "auto": NCCL with one GPU per local rank when CUDA has enough devices, else
gloo on CPU. The process-group timeout (init and collectives) is ``init_timeout_s``.

Spawned ranks import ``fn`` by reference: before anything starts, a lambda, a nested
function, or one defined in ``__main__`` of ``python -c``, an interactive session or a
notebook (which a spawned process cannot import) is a one-line
:class:`~pipeoffload.errors.ParameterError` saying what to do, as are arguments that
cannot be pickled; a function a spawned rank still cannot load (defined under
``if __name__ == "__main__":``) is reported once, by every rank, as a
:class:`LaunchError` saying so.

Under ``torchrun`` ``launch`` may be called several times: the first call initialises
the default process group (or uses one the caller initialised) and later calls reuse
it; it is destroyed when the process exits.

Failures (spawned ranks): the parent watches every rank's process. When one exits
with an error or dies (SIGKILL, crash), the others — possibly blocked in a receive
from the dead one — are sent SIGTERM, then SIGKILL after ``grace_s``, and all are
reaped; :class:`LaunchError` names the rank that started it: a *lost* rank (died
without reporting an error) or the one whose own error came first, not a peer's
"connection closed" consequence. Each spawned rank also dies with the parent
(``PR_SET_PDEATHSIG``), so killing the launcher leaves no rank behind.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import pickle
import sys
import re
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from multiprocessing import connection as mp_connection
from multiprocessing import util as mp_util

from ..errors import ParameterError


class LaunchError(RuntimeError):
    """A rank failed. ``rank`` (the one whose failure started it), ``details`` (the
    ranks' tracebacks), ``lost`` (it died without reporting an error, e.g. SIGKILL)
    and ``exitcode`` are attached."""

    def __init__(self, rank: int, message: str, details: str, *, lost: bool = False,
                 exitcode: int | None = None) -> None:
        self.rank, self.details, self.lost, self.exitcode = rank, details, lost, exitcode
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
    """True when an external launcher (``torchrun`` or anything that sets ``RANK`` and
    ``WORLD_SIZE`` for ``env://``) started this process as one rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def external_world() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` from the launcher's environment, checked
    (ParameterError naming the variable), or None when not launched externally."""
    if not under_torchrun():
        return None
    vals = {}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        raw = os.environ.get(var)
        if raw is None:
            continue
        try:
            vals[var] = int(raw)
        except ValueError:
            raise ParameterError(var, f"must be an integer, got {raw!r} (set by torchrun)") from None
    world, rank = vals["WORLD_SIZE"], vals["RANK"]
    if world < 1:
        raise ParameterError("WORLD_SIZE", f"must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise ParameterError("RANK", f"must be in 0..{world - 1} for WORLD_SIZE={world}, got {rank}")
    return rank, world, vals.get("LOCAL_RANK", rank)


def check_external_world(world_size: int, param: str = "world_size") -> None:
    """Fail fast, before any rendezvous, when an external launch does not fit the
    schedule: ``WORLD_SIZE`` must equal ``world_size`` (else ParameterError for
    ``param``, by default this argument; a command line passes its own name for the
    number of ranks) and the rendezvous address be set (else for the variable)."""
    ext = external_world()
    if ext is None:
        return
    _, world, _ = ext
    if world != world_size:
        raise ParameterError(param, f"the launcher started {world} processes (WORLD_SIZE={world}) but the "
                             f"schedule needs {world_size}; use torchrun --nproc-per-node {world_size} or "
                             f"`{param}`={world}")
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise ParameterError(var, "not set; env:// rendezvous needs MASTER_ADDR and MASTER_PORT "
                                 "(torchrun sets them)")


#: ``init_method`` of locally spawned ranks: the parent holds the rendezvous store's server
#: (bound to a port the kernel picked, held for the whole run) and each rank joins it as a
#: client. Picking a free port, closing it and letting rank 0 bind it seconds later, after
#: the spawned interpreters import torch, lost the port to another process now and then
#: (EADDRINUSE: any outgoing connection may be given the same ephemeral port).
PARENT_STORE = "parent-store://"


def parent_store(timeout_s: float) -> tuple[dist.TCPStore, str]:
    """The rendezvous store's server on a localhost port, and the ``init_method`` that
    makes a rank join it (:data:`PARENT_STORE`). Keep the store referenced until the
    ranks have exited: dropping it stops the server."""
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return store, f"{PARENT_STORE}127.0.0.1:{store.port}"


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
    grace_s: float = 5.0,
) -> None:
    """Run ``fn(ctx, *args)`` on every rank (see module docstring).

    Args:
        fn: called on every rank with a :class:`DistContext` (rank, world size, device)
            and ``args``. A module-level function of an importable file (it is pickled
            by reference for ``spawn``); under torchrun any callable works.
        world_size: number of ranks to spawn locally (checked against torchrun's world
            when running under it).
        backend: "auto" (NCCL when every rank can have its own GPU, else gloo), "gloo"
            or "nccl".
        init_timeout_s: limit of process-group initialisation and collectives.
        threads: torch intra-op threads per rank (default: cores / local ranks).
        grace_s: seconds between SIGTERM and SIGKILL of the other ranks after a failure.

    Raises:
        ParameterError: naming ``fn``, ``args``, ``world_size`` or ``backend`` when they
            cannot work (a lambda, an unpicklable argument, a world torchrun disagrees
            with).
        LaunchError: a rank failed; its one-line message names the rank that started it
            (lost, or its error with where in a step it was raised) and the ranks
            stopped.

    Guarantees:
        - Spawned ranks are supervised: as soon as one exits with an error or is killed,
          the others get SIGTERM, then SIGKILL after ``grace_s``; none is left behind,
          also when this process dies (Linux ``PR_SET_PDEATHSIG``).
        - Under an external launcher the rank's error is re-raised as
          :class:`LaunchError` (its launcher stops the others).
    """
    if external_world() is not None:
        _join_external_launch(fn, world_size, args, backend, init_timeout_s, threads)
    else:
        blob = _spawnable(fn, args)
        _spawn_local_ranks(blob, world_size, backend, init_timeout_s, threads, grace_s)


def _spawnable(fn: Callable[..., Any], args: tuple) -> bytes:
    """``(fn, args)`` pickled for the spawned ranks; ParameterError (naming ``fn`` or
    ``args``) for what a spawned process cannot import or unpickle."""
    qual = getattr(fn, "__qualname__", "") or ""
    name = getattr(fn, "__name__", type(fn).__name__)
    if "<lambda>" in qual or "<locals>" in qual:
        raise ParameterError("fn", f"{qual} is a lambda or a function defined inside another function, which "
                             "spawned ranks cannot import; define it at module level in a .py file")
    if getattr(fn, "__module__", None) == "__main__" and getattr(sys.modules["__main__"], "__file__", None) is None:
        raise ParameterError("fn", f"{name} is defined in __main__ of `python -c`, an interactive session or a "
                             "notebook, which spawned ranks cannot import; put it in a .py file and import it "
                             "(or run that file), or start the ranks with torchrun")
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - any pickling failure
        raise ParameterError("fn", f"{name} cannot be sent to spawned ranks ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160]}); pass a module-level function") from None
    try:
        return pickle.dumps((fn, tuple(args)))
    except Exception as e:  # noqa: BLE001
        raise ParameterError("args", f"cannot be sent to spawned ranks ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160]}); pass picklable values (build the rest in fn)") from None


class WorkerLoadError(RuntimeError):
    """A spawned rank could not load the worker function (every rank reports the same)."""

    all_ranks = True


def _load_worker(blob: bytes) -> tuple[Callable[..., Any], tuple]:
    try:
        fn, args = pickle.loads(blob)
    except Exception as e:  # noqa: BLE001 - what the spawned interpreter cannot import
        raise WorkerLoadError(f"the worker could not be loaded in a spawned rank ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200]}); define it at module level of an importable .py "
                              "file, outside `if __name__ == \"__main__\":`") from None
    return fn, args


def _join_external_launch(fn: Callable[..., Any], world_size: int, args: tuple, backend: str,
                          init_timeout_s: float, threads: int | None) -> None:
    """Run this process as the one rank ``torchrun`` made it; a failure becomes a
    :class:`LaunchError` naming this rank (or the lost peer it found)."""
    check_external_world(world_size)
    rank, world, local_rank = external_world()  # type: ignore[misc]
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    resolved = resolve_backend(backend, local_world)
    try:
        _run_rank(local_rank, fn, world, args, resolved, "env://", init_timeout_s, threads, True)
    except (KeyboardInterrupt, SystemExit, ParameterError):
        raise
    except BaseException as e:
        text = error_text(e)
        msg = text if getattr(e, "all_ranks", False) else f"rank {rank} failed: {text}"
        if getattr(e, "lost_peer", None) is not None:  # torchrun's report names it too
            msg = f"rank {e.lost_peer} was lost ({str(e).strip()})"
        raise LaunchError(rank, msg, traceback.format_exc()) from None


def _spawn_local_ranks(blob: bytes, world_size: int, backend: str,
                       init_timeout_s: float, threads: int | None, grace_s: float) -> None:
    """Spawn ``world_size`` local ranks rendezvousing on a store this process holds
    (:func:`parent_store`) and supervise them until all exit (:func:`_supervise`)."""
    resolved = resolve_backend(backend, world_size)
    store, init = parent_store(init_timeout_s)  # noqa: F841 -- held until the ranks exit
    with tempfile.TemporaryDirectory(prefix="pipeoffload-launch-") as err_dir:
        spawned = mp.start_processes(
            _run_rank,
            args=(blob, world_size, (), resolved, init, init_timeout_s, threads, False, err_dir, os.getpid()),
            nprocs=world_size, join=False, start_method="spawn")
        try:
            _supervise(list(spawned.processes), Path(err_dir), grace_s)
        finally:
            for f in getattr(spawned, "error_files", []):  # torch's own crash files (we report ours)
                if f:
                    Path(f).unlink(missing_ok=True)


def _supervise(procs: list, err_dir: Path, grace_s: float) -> None:
    """The parent-side watchdog: wait until every rank exits; on the first failure
    (non-zero exit or death by a signal) stop the rest and raise :class:`LaunchError`."""
    waiting = {p.sentinel: i for i, p in enumerate(procs)}
    failed: dict[int, float] = {}  # rank -> when the parent saw it exit with an error
    try:
        while waiting and not failed:
            for s in mp_connection.wait(list(waiting)):
                i = waiting.pop(s)
                procs[i].join()
                if procs[i].exitcode != 0:
                    failed[i] = time.time()
    except BaseException:  # KeyboardInterrupt or anything else: leave nothing behind
        _stop(procs, grace_s)
        raise
    if not failed:
        return
    # Ranks that exited on their own in the meantime are part of the story, not ours to stop.
    for i, p in enumerate(procs):
        if i not in failed and not p.is_alive() and p.exitcode not in (None, 0):
            failed[i] = time.time()
    stopped = _stop(procs, grace_s)
    raise _root_cause(procs, failed, stopped, err_dir)


def _stop(procs: list, grace_s: float) -> list[int]:
    """SIGTERM every live rank, SIGKILL those still alive after ``grace_s``, reap all.
    Returns the ranks this stopped."""
    stopped = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in stopped:
        procs[i].terminate()
    deadline = time.time() + grace_s
    for i in stopped:
        procs[i].join(max(0.0, deadline - time.time()))
    for i in stopped:
        if procs[i].is_alive():
            procs[i].kill()
    for p in procs:
        p.join()
    return stopped


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _root_cause(procs: list, failed: dict[int, float], stopped: list[int], err_dir: Path) -> LaunchError:
    """The failure that started it. Each rank that failed on its own is either *lost*
    (it died without reporting an error: killed by a signal, a crash, ``os._exit``) or
    reported an error (``rank*.json``). A peer's "connection closed" is a consequence;
    the cause is the earliest lost rank or reported non-consequence error."""
    errs: dict[int, dict] = {}
    for f in err_dir.glob("rank*.json"):
        try:
            rec = json.loads(f.read_text())
            errs[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError):
            continue
    cands = []
    # A rank that wrote its error failed on its own, even if it was still exiting
    # (and so got stopped) when a peer's "connection closed" exit was seen first.
    failed = {**{i: rec["time"] for i, rec in errs.items() if i not in failed}, **failed}
    for i, seen in failed.items():
        code = procs[i].exitcode
        if i in errs:
            rec = errs[i]
            cands.append((_is_consequence(rec["error"]), min(seen, rec["time"]), i, rec["error"], False, rec))
        else:
            how = f"killed by {_signal_name(code)}" if code is not None and code < 0 else f"exited with status {code}"
            cands.append((False, seen, i, f"{how} without reporting an error", True, None))
    if not cands:  # cannot happen: _supervise saw a failure
        return LaunchError(-1, "a rank failed", "")
    cands.sort(key=lambda c: (c[0], c[1]))
    _, _, root, what, lost, rec = cands[0]
    others = [f"rank {i}: {_short(w)}" for _, _, i, w, _, _ in cands[1:]]
    stopped = [i for i in stopped if i not in errs]
    if lost:
        msg = f"rank {root} was lost ({what})"
    elif rec and rec.get("all_ranks"):  # every rank reached the same verdict: say it once
        msg = rec["error"].partition(": ")[2] or rec["error"]
        others = [o for o, c in zip(others, cands[1:]) if not (c[5] or {}).get("all_ranks")]
        stopped = []  # the rest were stopped on their way to the same error
    else:
        msg = f"rank {root} failed: {what}"
    if stopped:
        msg += f"; stopped rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}"
    if others:
        msg += " (then " + "; ".join(others) + ")"
    details = "\n\n".join(errs[i]["traceback"] for i in sorted(errs))
    return LaunchError(root, msg, details, lost=lost, exitcode=procs[root].exitcode)


def _short(error: str, n: int = 120) -> str:
    """An error line without gloo's source-location prefix, cut to ``n`` characters."""
    error = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ", "", error)
    error = error.split(". This is typically", 1)[0]  # gloo's advice, once per peer, adds nothing
    return error if len(error) <= n else error[: n - 3] + "..."


def _is_consequence(error: str) -> bool:
    return any(s in error for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                    "could not send at", "could not post the receive", "lost rank"))


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: this process gets SIGKILL when its parent dies, so a killed launcher
    leaves no rank behind. Best effort elsewhere."""
    if parent_pid is None:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


def _run_rank(local_rank: int, fn: Callable[..., Any] | bytes, world_size: int, args: tuple, backend: str,
              init_method: str, init_timeout_s: float, threads: int | None, torchrun: bool,
              err_dir: str | None = None, parent_pid: int | None = None) -> None:
    """One rank's life: device, process group, ``fn``, a common exit. A spawned rank
    gets ``fn`` and ``args`` pickled together (``fn`` bytes), records its error for the
    parent (``err_dir``), destroys its process group and leaves by
    :func:`_exit_spawned_rank`; a torchrun rank keeps the process group for later calls."""
    _die_with_parent(parent_pid)
    rank = int(os.environ["RANK"]) if torchrun else local_rank
    device = _rank_device(local_rank, backend, world_size, threads, torchrun)
    try:
        if isinstance(fn, bytes):
            fn, args = _load_worker(fn)
        _ensure_process_group(backend, init_method, rank, world_size, init_timeout_s, device)
        fn(DistContext(rank, world_size, local_rank, backend, device, torchrun), *args)
        # Leave together: tearing gloo down while a peer still drains its last
        # messages aborted a rank ("terminate called without an active exception")
        # in about 1 run in 10. On failure the parent stops the others instead.
        # Best effort: a pair that gloo already closed (after a handled timeout)
        # must not turn a finished rank into a failed one.
        try:
            dist.barrier()
        except Exception:
            pass
    except BaseException as e:
        if err_dir is not None:  # for the parent's root-cause report
            _write_rank_error(err_dir, rank, e)
        raise
    finally:
        if not torchrun:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
    if not torchrun:
        _exit_spawned_rank()


def _ensure_process_group(backend: str, init_method: str, rank: int, world_size: int, init_timeout_s: float,
                          device: torch.device) -> None:
    """Initialise the default process group, or reuse the one already there (an earlier
    ``launch`` under torchrun, or the caller's) when it has ``world_size`` ranks."""
    if dist.is_initialized():
        have = dist.get_world_size()
        if have != world_size:
            raise ParameterError("world_size", f"the process group already initialised here has {have} ranks, "
                                 f"this launch needs {world_size}")
        return
    kw: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    timeout = datetime.timedelta(seconds=init_timeout_s)
    if init_method.startswith(PARENT_STORE):  # a spawned rank: join the parent's store
        host, port = init_method[len(PARENT_STORE):].rsplit(":", 1)
        kw["store"] = dist.TCPStore(host, int(port), None, False, timeout=timeout)
    else:
        kw["init_method"] = init_method
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **kw)
    atexit.register(_destroy_at_exit)


def _destroy_at_exit() -> None:
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def _rank_device(local_rank: int, backend: str, world_size: int, threads: int | None,
                 torchrun: bool) -> torch.device:
    """This rank's device: its GPU under NCCL; else the CPU, with the cores shared
    among the local ranks (``threads`` each, default cores / local ranks)."""
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    # Share the cores: without this every rank starts one thread per core.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) if torchrun else world_size
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world))
    return torch.device("cpu")


def error_text(error: BaseException) -> str:
    """``Type: message`` of a rank's error, with where in the step it was raised when
    the runner located it (``runtime/op_errors.py``) and the message does not say so."""
    text = f"{type(error).__name__}: {str(error).strip()}"
    where = getattr(error, "where", None)
    return text if not where or where in text else f"{text} — raised at {where}"


def _write_rank_error(err_dir: str, rank: int, error: BaseException) -> None:
    """``err_dir/rank<r>.json``: the error, when, and whether every rank reaches it
    (read by :func:`_root_cause`). Call inside the ``except`` block (traceback)."""
    rec = {"rank": rank, "time": time.time(), "error": error_text(error)[:700],
           "all_ranks": bool(getattr(error, "all_ranks", False)), "traceback": traceback.format_exc()}
    Path(err_dir, f"rank{rank}.json").write_text(json.dumps(rec))


def _exit_spawned_rank() -> None:
    """Leave a spawned rank that finished cleanly, skipping interpreter finalization.

    Gloo's worker threads can still hold work objects whose destruction then needs the
    GIL and aborts the process ("terminate called without an active exception",
    SIGABRT, ~1 run in 10 here; see pytorch/pytorch#179291), so the rank ends with
    ``os._exit``. Results are already written. First it does what multiprocessing does
    when a process ends normally (``Process._bootstrap`` calls
    ``multiprocessing.util._exit_function``): run its exit finalizers, which unlink
    and unregister the named semaphores this process created — tqdm's write lock
    (a ``multiprocessing.RLock``, made with the first progress bar), or any
    ``Lock``/``Queue`` of ``fn``. Skipped, they stay registered with the parent's
    resource tracker, which reports them at shutdown as "leaked semaphore objects"."""
    try:
        mp_util._exit_function()
    except Exception:  # best effort: never turn a finished rank into a failed one
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
