"""Simulations made ahead by helper processes while the search goes on. Pure Python (no torch).

Why (docs/planner.md §4e): the plain phase proves, from a candidate's untimed peaks, that none
of its light recompute settings fits; the offload phase later times those settings before it
can rank the candidate (:attr:`~.search._Candidate.untimed`). On Llama-405B over 16,384 H100s
these timings are ≈ 17 s of the search's ≈ 76 s of CPU, and they are known ≈ 30 s before they
are read. A helper process makes them meanwhile, on another core.

What: a :class:`Prefetcher` forks ``helpers`` processes from the search the first time it is
handed work (each a copy of the :class:`~.simulate.Simulator` as it stands then), hands each
candidate's simulation keys to one helper (one candidate's settings share its schedules), and
keeps the results as they come back. :meth:`~.simulate.Simulator.simulate` takes a result that
has come back and otherwise simulates as it always did: the search never waits for a helper.

Guarantees: the plan is the same with any number of processes, float for float. A simulation is
a function of its key alone (the simulator's caches decide how much work it takes, never its
floats: the generators are deterministic and a replayed timing gives the timing's floats,
:class:`~pipeoffload.passes.timing.OrderTimer`), and a result is used only once it came back
whole, unpickled. A helper that fails or dies only loses the results it had not sent; closing
the prefetcher kills the helpers. The search's ``stats`` count the work whose results it used,
the helpers' included. A candidate's keys go with the schedules the search has made for them
(for its untimed peaks), which the helper times instead of generating them again (that was
≈ 20 s of a helper's ≈ 47 s on Llama-405B over 16,384 H100s); a helper may still generate one
that the search makes after handing the keys.

Calls (:meth:`Prefetcher.submit_call`): a function of the simulator's state that a helper makes
on the keys it simulated; the search takes the answer where it has come back
(:meth:`Prefetcher.take`) and else makes it, and a call not begun by then is dropped. A helper
takes its simulations and calls by lowest rank (the search ranks a candidate's by its time bound,
the order in which the offload phase reaches them). The offload phase's first question about an
untimed candidate — can any offload try fit? — is one (:func:`~.search._hopeless_ahead`: ≈ 14 s
of the search's time on Llama-405B over 16,384 H100s, where the helper had ≈ 35 s idle,
docs/planner.md §4g).

Needs the "fork" start method (Linux): a forked helper starts in milliseconds with the search's
state, where a spawned one would import and rebuild it. ``workers=None`` (:func:`resolve_workers`)
uses one helper where that is safe and useful: Linux, at least two CPUs for this process, and no
other thread running (a fork copies only the calling thread; a lock another thread held would stay
held in the child). The helpers take up to one more core and their results' memory.
"""

from __future__ import annotations

import heapq
import multiprocessing
import os
import pickle
import queue
import sys
import threading
from multiprocessing.connection import Connection
import time
from typing import Any, Callable, Sequence, TypeVar

from ..errors import ParameterError
from .refusals import Refused

__all__ = ["Prefetcher", "forked_map", "resolve_workers"]

T = TypeVar("T")
R = TypeVar("R")


def _can_fork() -> bool:
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _cpus() -> int:
    """CPUs this process may run on (its affinity where the platform says, else the count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_workers(workers: int | None) -> int:
    """The number of processes the search uses: ``workers`` checked, or for None 2 where a
    helper is safe and useful (module docstring), else 1. Raises :class:`ParameterError`
    ("workers") for a value that is not a positive integer, or above 1 where the platform
    cannot fork."""
    if workers is None:
        return 2 if _can_fork() and _cpus() >= 2 and threading.active_count() == 1 else 1
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ParameterError("workers", f"must be a positive integer (1: the search alone, N: N − 1 helper "
                                        f"processes), got {workers!r}")
    if workers > 1 and not _can_fork():
        raise ParameterError("workers", f"helper processes need the 'fork' start method (Linux); "
                                        f"{sys.platform} has {multiprocessing.get_all_start_methods()}: use 1")
    return workers


class Prefetcher:
    """``helpers`` processes that simulate keys ahead for ``simulator`` (module docstring).

    Keys are ``(split, family, m, recompute)``, as :meth:`~.simulate.Simulator.simulate` takes
    them; a result is what it returns or the :class:`Refused` it raises.
    """

    #: How long :meth:`take` waits for a key a helper was handed and has not sent yet (seconds;
    #: 0: never, the search's way). Tests set it so that every key handed is a helper's.
    wait_s: float = 0.0

    def __init__(self, simulator: Any, helpers: int) -> None:
        if helpers < 1:
            raise ValueError(f"a prefetcher needs at least one helper process, got {helpers}")
        self._simulator = simulator
        self._helpers = helpers
        self._tasks: list[Connection] = []  # to each helper
        self._outboxes: list[queue.SimpleQueue] = []  # what its sender thread is to send it
        self._procs: list[Any] = []
        self._threads: list[threading.Thread] = []  # per helper: its sender and its reader
        self._arrived = threading.Condition()  # guards _results; notified at each result
        self._results: dict[tuple, bytes] = {}  # pickled (result, work)
        self._sent: set[tuple] = set()
        self._owner: dict[tuple, int] = {}  # key or call tag → the helper it was handed to
        self._calls: set[tuple] = set()  # the call tags handed (:meth:`submit_call`)
        self._unread: set[tuple] = set()  # handed, then simulated by the search: dropped on arrival
        self._next = 0
        self._started = self._closed = False
        #: Results the search took (each saved it one simulation).
        self.used = 0
        #: Call results (:meth:`submit_call`) the search took.
        self.calls_used = 0

    def submit(self, keys: list[tuple], made: dict | None = None, rank: float = 0.0) -> None:
        """Have one helper simulate ``keys`` (one candidate's), in order; never waits. A helper
        takes its tasks by lowest ``rank`` (a simulation before a call of the same rank, then in
        the order handed). The first call forks the helpers. Keys handed before are left out.
        ``made``: schedules the search has for them (the simulator's ``made_schedules``), which
        the helper takes on instead of generating them again."""
        keys = [k for k in keys if k not in self._sent]
        if not keys or self._closed:
            return
        if not self._started:
            self._started = True
            self._start()
        live = [i for i, p in enumerate(self._procs) if p.is_alive()]
        if not live:
            return
        i = live[self._next % len(live)]
        self._next += 1
        self._outboxes[i].put(("simulate", keys, made or {}, rank))  # by a thread: a full pipe must not hold the search up
        self._sent.update(keys)
        self._owner.update((k, i) for k in keys)

    def submit_call(self, tag: tuple, fn: Callable[..., Any], args: tuple, near: tuple, rank: float) -> None:
        """Have the helper that was handed the key ``near`` make ``fn(simulator, *args)`` (a
        module-level function of the simulator's state and ``args`` alone) and send it back under
        ``tag`` (:meth:`take`), taken by its ``rank`` as :meth:`submit` says. Nothing where no
        helper was handed ``near`` (the search makes it), or ``tag`` was handed before. Never
        waits."""
        i = self._owner.get(near)
        if i is None or tag in self._sent or self._closed or not self._procs[i].is_alive():
            return
        self._outboxes[i].put(("call", tag, fn, args, rank))
        self._sent.add(tag)
        self._calls.add(tag)
        self._owner[tag] = i

    def take(self, key: tuple) -> tuple[Any] | None:
        """``(result,)`` for ``key`` if a helper has sent it (the simulator's ``stats`` then
        count the helper's work for it), else None: the caller simulates it. Waits only up to
        :attr:`wait_s` (0 in the search)."""
        with self._arrived:
            if key in self._sent and self.wait_s > 0:
                end = time.perf_counter() + self.wait_s
                while key not in self._results and time.perf_counter() < end and \
                        any(p.is_alive() for p in self._procs):
                    self._arrived.wait(0.05)
            got = self._results.pop(key, None)
            if got is None:
                if key in self._sent:  # the caller makes it: its result will not be read
                    self._unread.add(key)
                    if key in self._calls:  # a call not begun yet is skipped
                        self._outboxes[self._owner[key]].put(("drop", key))
                return None
        result, work = pickle.loads(got)
        stats = self._simulator.stats
        for name, n in work.items():
            stats[name] = stats.get(name, 0) + n
        if key in self._calls:
            self.calls_used += 1
        else:
            self.used += 1
        return (result,)

    def close(self) -> None:
        """Kill the helpers and drop the results not taken (idempotent)."""
        self._closed = True
        for box in self._outboxes:
            box.put(None)
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)
        for t in self._threads:  # each ends at its pipe's end, which the helper's death closes
            t.join(5)
        for c in self._tasks:
            c.close()
        self._procs, self._threads, self._tasks, self._outboxes = [], [], [], []
        with self._arrived:
            self._results.clear()

    # -- the processes ------------------------------------------------------------------------
    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        pairs = [(ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)) for _ in range(self._helpers)]
        # Every helper closes the search's ends of every pipe (all are inherited by the fork), so
        # that it sees the end of its task pipe when the search goes, and the search sees the end
        # of a result pipe when its helper goes.
        ours = [end for (_, task_send), (result_recv, _) in pairs for end in (task_send, result_recv)]
        for _, (result_recv, _) in pairs:
            _widen(result_recv)
        for (task_recv, task_send), (result_recv, result_send) in pairs:
            proc = ctx.Process(target=_serve, args=(self._simulator, task_recv, result_send, ours),
                               name="pipeoffload-plan-helper", daemon=True)
            try:
                proc.start()
            except OSError:  # no process could be made: the search goes on alone
                break
            self._procs.append(proc)
            self._tasks.append(task_send)
            box: queue.SimpleQueue = queue.SimpleQueue()
            self._outboxes.append(box)
            self._threads.append(threading.Thread(target=_send, args=(box, task_send), daemon=True,
                                                  name="pipeoffload-plan-tasks"))
            self._threads.append(threading.Thread(target=self._read, args=(result_recv,), daemon=True,
                                                  name="pipeoffload-plan-results"))
        for (task_recv, _), (_, result_send) in pairs:
            task_recv.close()
            result_send.close()
        for t in self._threads:
            t.start()

    def _read(self, conn: Connection) -> None:
        """Keep a helper's results as they come (a thread: unpickling, off the search's path
        except for the interpreter's lock)."""
        try:
            while True:
                key = conn.recv()
                data = conn.recv_bytes()  # kept pickled: unpickled only if taken (a bytes object
                with self._arrived:       # is one allocation the collector never scans)
                    if not self._closed and key not in self._unread:
                        self._results[key] = data
                        self._arrived.notify_all()
        except (EOFError, OSError):
            pass
        finally:
            conn.close()


def _send(box: queue.SimpleQueue, conn: Connection) -> None:
    """A helper's sender thread: its task batches, in order, until None or its pipe's end."""
    try:
        for batch in iter(box.get, None):
            conn.send(batch)
    except OSError:  # the helper is gone: the search makes what it asks for itself
        pass


def _widen(conn: Connection) -> None:
    """Give a result pipe the largest buffer an unprivileged process may (Linux: 1 MiB, against
    64 KiB): a result of ≈ 1 MB then crosses in one or two reads, not twenty, and each read
    wakes the reader thread, which takes the interpreter's lock from the search."""
    try:
        import fcntl

        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # the default buffer: slower, the same results


def _serve(simulator: Any, tasks: Connection, results: Connection, parent_ends: list[Connection]) -> None:
    """A helper's loop: its tasks by lowest rank, a "simulate" task (simulate each key) before a
    "call" (make the function) of the same rank, then in the order handed; send the key (or the
    call's tag), then ``(result, work)`` pickled (``work``: the simulator counters it moved).
    Every message that has come is read before each task, so a call the search has made
    meanwhile ("drop") is skipped. Ends when the search closes its task pipe or goes."""
    for end in parent_ends:
        end.close()
    simulator.prefetch = None  # this copy simulates for itself
    tasks_heap: list[tuple[float, int, int, tuple]] = []  # (rank, 0 simulate / 1 call, order, message)
    dropped: set[tuple] = set()
    handed = 0
    try:
        while True:
            while not tasks_heap or tasks.poll(0):
                message = tasks.recv()
                if message[0] == "drop":
                    dropped.add(message[1])
                else:
                    heapq.heappush(tasks_heap, (message[-1], message[0] == "call", handed, message))
                    handed += 1
            message = heapq.heappop(tasks_heap)[3]
            if message[0] == "simulate":
                _, keys, made, _ = message
                simulator.adopt_schedules(made)
                for key in keys:
                    _run(simulator, results, key, simulator.simulate, key)
            elif message[1] not in dropped:
                _, tag, fn, args, _ = message
                _run(simulator, results, tag, fn, (simulator, *args))
    except (EOFError, OSError, KeyboardInterrupt):
        pass


def _run(simulator: Any, results: Connection, key: tuple, fn: Callable[..., Any], args: tuple) -> None:
    """``fn(*args)`` (or the :class:`Refused` it raises) sent under ``key`` with the counters it
    moved; nothing on another error (the search makes it and meets the error itself)."""
    before = dict(simulator.stats)
    try:
        result: Any = fn(*args)
    except Refused as e:
        result = e
    except Exception:  # noqa: BLE001 - not sent: see above
        return
    work = {k: v - before.get(k, 0) for k, v in simulator.stats.items() if v != before.get(k, 0)}
    results.send(key)
    results.send_bytes(pickle.dumps((result, work), pickle.HIGHEST_PROTOCOL))


def forked_map(fn: Callable[[T], R], items: Sequence[T], processes: int) -> list[R]:
    """``[fn(x) for x in items]`` over ``processes`` processes: item ``i`` is made by helper
    ``i mod processes`` (forked now, a copy of this process's state) where that is ≥ 1, and here
    otherwise, in order.

    Guarantees: the same list as the plain comprehension when ``fn`` is a function of its item
    and this process's state (the helpers' copies are that state): results come back pickled,
    whole. An item whose helper fails, dies or does not answer within four times as long as this
    process took for its own items (at least a minute) is made here, and ``fn``'s errors are
    raised here as the comprehension would. ``fn``'s effects on this process's state (caches,
    counters) happen only for the items made here."""
    n = min(processes, len(items))
    if n < 2:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("fork")
    shares: list[tuple[Any, Connection, list[int]]] = []
    ours: list[Connection] = []
    for k in range(1, n):
        recv, send = ctx.Pipe(duplex=False)
        _widen(recv)
        idx = list(range(k, len(items), n))
        proc = ctx.Process(target=_map_share, args=(fn, [items[i] for i in idx], send, ours + [recv]),
                           name="pipeoffload-plan-helper", daemon=True)
        try:
            proc.start()
        except OSError:
            recv.close()
            send.close()
            break
        send.close()
        ours.append(recv)
        shares.append((proc, recv, idx))
    out: dict[int, R] = {}
    start = time.perf_counter()
    taken = {i for _, _, idx in shares for i in idx}
    for i, x in enumerate(items):
        if i not in taken:
            out[i] = fn(x)
    deadline = time.perf_counter() + max(60.0, 4 * (time.perf_counter() - start))
    for proc, conn, idx in shares:
        for i in idx:
            try:
                if not conn.poll(max(0.0, deadline - time.perf_counter())):
                    break
                ok, data = conn.recv()
            except (EOFError, OSError):
                break
            if ok:
                out[i] = pickle.loads(data)
        proc.kill()
        proc.join(5)
        conn.close()
    return [out[i] if i in out else fn(x) for i, x in enumerate(items)]


def _map_share(fn: Callable[[Any], Any], share: list[Any], results: Connection, parent_ends: list[Connection]) -> None:
    """A :func:`forked_map` helper: ``(True, pickled fn(x))`` for each item of its share, in
    order, or ``(False, None)`` where ``fn`` raised (the search makes that item itself)."""
    for end in parent_ends:
        end.close()
    try:
        for x in share:
            try:
                results.send((True, pickle.dumps(fn(x), pickle.HIGHEST_PROTOCOL)))
            except Exception:  # noqa: BLE001 - made again by the search, which meets the error itself
                results.send((False, None))
    except (OSError, KeyboardInterrupt):
        pass
