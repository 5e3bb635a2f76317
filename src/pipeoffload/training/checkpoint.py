"""Checkpoints of a pipeline run: ``torch.distributed.checkpoint`` files, a manifest last.

Layout of a checkpoint directory ``D``::

    D/step-00000010/__0_0.distcp      # rank 0's tensors and values (DCP's own format)
    D/step-00000010/__1_0.distcp ...  # one per rank
    D/step-00000010/.metadata         # DCP's index: which key is where
    D/step-00000010/manifest.json     # ours, written last: step, world size, sha256 + size of every file

What is saved is the state dict the caller passes (every rank its own part; keys
naming parameters, not ranks, reshard across pipeline sizes — ``runtime/state.py``);
nothing is added to it. The step lives in the directory name and the manifest.

Guarantees

- **Atomic files**: DCP writes each rank's file and fsyncs it, and writes
  ``.metadata`` to a temporary name, fsynced, then renamed; the manifest is written to
  a temporary name, fsynced and ``os.replace``\\ d into place.
- **Complete or ignored**: rank 0 writes ``manifest.json`` only after every rank has
  reported its files' sha256 (a gather), so a checkpoint without a manifest is
  incomplete and never loaded.
- **Verified on load**: :func:`load_latest` tries checkpoints newest first; the ranks
  share the checking of every file listed in the manifest (size and sha256) and agree
  (an all-gather); then DCP reads it. If any check or the read failed, all fall back to
  the previous checkpoint, reporting why the newer one was rejected. A checkpoint
  written for another model or placement is an error, not a fall-back.
- **Retention**: after writing step ``n``, rank 0 keeps the ``keep`` newest complete
  checkpoints up to ``n`` and removes older ones (and incomplete ones older than ``n``).

Works without a process group for a single rank (``world_size=1``). torch is imported
only by the functions that save or load tensors: :func:`precheck` (run by the CLI before
any process starts) and the manifest helpers are pure Python.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ParameterError, PipeoffloadError

MANIFEST = "manifest.json"
FORMAT = 2  #: 2: torch.distributed.checkpoint files (1: one torch.save file per rank)
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(PipeoffloadError):
    """A checkpoint cannot be used (corrupt, incomplete, or written for another run)."""

    all_ranks = True  # every rank reaches the same verdict (the launcher reports it once)


@dataclass
class Checkpoint:
    step: int  #: optimizer steps completed when it was written
    path: Path  #: the step directory
    manifest: dict
    state: dict  #: the state dict passed to :func:`load_latest`, filled in
    rejected: list[str]  #: newer checkpoints skipped, with the reason


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every step directory under ``root``, newest first
    (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d))
    return sorted(out, reverse=True)


# --------------------------------------------------------------------------- writing
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write ``path`` via ``write(binary file)`` to a temporary name, fsync, then rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_checkpoint(
    root: str | Path,
    step: int,
    state: dict,
    *,
    rank: int = 0,
    world_size: int = 1,
    meta: dict | None = None,
    keep: int = 3,
    group: Any = None,
) -> Path:
    """Save this rank's ``state`` (a flat dict of tensors and picklable values) as
    part of checkpoint ``step`` with ``torch.distributed.checkpoint``. Call on every
    rank (it gathers to rank 0, which writes the manifest with ``meta`` last and prunes
    to ``keep``). Returns the step directory."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        # A manifest left from an earlier run at this step would vouch for files
        # about to be replaced: drop it first (its absence marks the step incomplete).
        (d / MANIFEST).unlink(missing_ok=True)
    dist_on = world_size > 1 or dist.is_initialized()
    with _quiet_dcp():
        dcp.save(state, checkpoint_id=str(d), process_group=group, no_dist=not dist_on)
    mine = sorted(d.glob(f"__{rank}_*.distcp")) + ([d / ".metadata"] if rank == 0 else [])
    entries = [{"file": f.name, "sha256": sha256_file(f), "bytes": f.stat().st_size} for f in mine]
    gathered = _gather_to_rank0(entries, world_size, group)
    if rank == 0:
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": world_size,
            "created": time.time(),
            "files": {e["file"]: {"sha256": e["sha256"], "bytes": e["bytes"]} for part in gathered for e in part},
            "meta": meta or {},
        }
        atomic_write(d / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1, default=str).encode()))
        prune(root, keep, step)
    return d


def _gather_to_rank0(obj: Any, world_size: int, group: Any) -> list:
    if world_size <= 1:
        return [obj]
    import torch.distributed as dist

    out: list | None = [None] * world_size if dist.get_rank(group) == 0 else None
    dist.gather_object(obj, out, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return out or []


@contextlib.contextmanager
def _quiet_dcp():
    """DCP warns that it saves "in a single process" without a process group: intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process.*")
        yield


def prune(root: str | Path, keep: int, newest: int) -> None:
    """Keep the ``keep`` newest complete checkpoints with step <= ``newest``; remove
    older complete ones and incomplete ones older than ``newest``."""
    complete = 0
    for step, d in list_checkpoints(root):
        if step > newest:
            continue
        if (d / MANIFEST).is_file() and complete < max(1, keep):
            complete += 1
            continue
        if step < newest or (d / MANIFEST).is_file():
            shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- reading
def read_manifest(directory: Path) -> dict:
    """The manifest of step directory ``directory``; CheckpointError if missing or malformed."""
    path = directory / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{directory.name}: incomplete (no {MANIFEST}; the run stopped while writing it)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{directory.name}: {MANIFEST} is unreadable ({e})") from None
    if (not isinstance(manifest, dict) or manifest.get("format") not in (1, FORMAT)
            or not isinstance(manifest.get("files"), dict)):
        raise CheckpointError(f"{directory.name}: {MANIFEST} is not a format-{FORMAT} manifest")
    named = _STEP_DIR.match(directory.name)
    if named and manifest.get("step") != int(named.group(1)):
        raise CheckpointError(f"{directory.name}: {MANIFEST} says step {manifest.get('step')!r}")
    return manifest


def verify_files(directory: Path, manifest: dict, rank: int = 0, world_size: int = 1) -> None:
    """Check this rank's share of the files the manifest lists (every ``world_size``-th,
    from the ``rank``-th, by name): present, their size and sha256."""
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{directory.name}: written by an older pipeoffload (format {manifest.get('format')}; "
                              f"this version reads format {FORMAT})")
    files = manifest["files"]
    if ".metadata" not in files:
        raise CheckpointError(f"{directory.name}: {MANIFEST} lists no .metadata")
    for name in sorted(files)[rank::max(1, world_size)]:
        ent, path = files[name], directory / name
        if not isinstance(ent, dict) or not path.is_file():
            raise CheckpointError(f"{directory.name}: {name} is missing")
        size = path.stat().st_size
        if size != ent.get("bytes"):
            raise CheckpointError(f"{directory.name}: {name} has {size} bytes, the manifest says {ent.get('bytes')} "
                                  "(truncated or replaced)")
        if sha256_file(path) != ent.get("sha256"):
            raise CheckpointError(f"{directory.name}: {name} fails its sha256 check (corrupt)")


def load_latest(
    root: str | Path,
    state: dict,
    *,
    rank: int = 0,
    world_size: int = 1,
    expect: dict | None = None,
    group: Any = None,
    warn: Callable[[str], None] | None = None,
) -> Checkpoint | None:
    """Load the newest checkpoint under ``root`` that every rank can load into
    ``state`` (a state dict whose tensors are filled in place and other values
    replaced, as ``torch.distributed.checkpoint.load`` does), or return None when there
    is none at all. Call on every rank.

    ``expect``: entries the manifest's ``meta["fingerprint"]`` must equal (model and
    placement); a mismatch raises CheckpointError on every rank. A corrupt, truncated
    or incomplete checkpoint, or one DCP cannot read, is skipped with ``warn(reason)``
    (rank 0) and the previous one tried; if none is usable, CheckpointError lists why
    each was rejected."""
    rejected: list[str] = []
    for step, d in _candidates_of_rank0(root, world_size, group):
        status, why, man = _check_checkpoint(d, rank, world_size, expect)
        verdicts = _all_verdicts(status, why, world_size, group)
        mismatches = [w for s, w in verdicts if s == "mismatch"]
        if mismatches:
            raise CheckpointError(mismatches[0])
        bad = sorted({w for s, w in verdicts if s == "bad"})
        if not bad:
            why = _read(d, state, group, world_size)
            bad = sorted({w for s, w in _all_verdicts("bad" if why else "ok", why or "", world_size, group)
                          if s == "bad"})
            if not bad:
                return Checkpoint(step, d, man, state, rejected)
        reason = "; ".join(bad)
        rejected.append(reason)
        if warn is not None and rank == 0:
            warn(f"checkpoint {d} is unusable: {reason}; trying the previous one")
    if not rejected:
        return None
    raise CheckpointError(f"no usable checkpoint in {root}: " + " | ".join(rejected))


def _read(d: Path, state: dict, group: Any, world_size: int) -> str | None:
    """DCP-load ``d`` into ``state``; the reason it failed (the same on every rank), or None."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    dist_on = world_size > 1 or dist.is_initialized()
    try:
        with _quiet_dcp():
            dcp.load(state, checkpoint_id=str(d), process_group=group, no_dist=not dist_on)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - any read failure makes it unusable
        text = str(e).strip().splitlines()
        return f"{d.name}: cannot be read ({type(e).__name__}: {text[0][:200] if text else ''})"
    return None


def read_all(directory: str | Path) -> dict:
    """Every key of the checkpoint in ``directory`` (a step directory, or any
    ``torch.distributed.checkpoint`` directory), read in this process without a process
    group: for inspection and tests. No checksum verification (see :func:`load_latest`)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = dcp.FileSystemReader(str(directory)).read_metadata()
    state: dict = {}
    for key, m in md.state_dict_metadata.items():
        state[key] = torch.empty(m.size, dtype=m.properties.dtype) if isinstance(m, TensorStorageMetadata) else None
    with _quiet_dcp():
        dcp.load(state, checkpoint_id=str(directory), no_dist=True)
    return state


def _candidates_of_rank0(root: str | Path, world_size: int, group: Any) -> list[tuple[int, Path]]:
    """The group's first rank's list of checkpoints, newest first, on every rank, so the
    collectives of :func:`load_latest` pair up."""
    cands = list_checkpoints(root)
    if world_size > 1:
        import torch.distributed as dist

        box = [[(s, str(d)) for s, d in cands]]
        # src is a global rank: the group's first member (a DP replica's pipeline lacks global rank 0)
        dist.broadcast_object_list(box, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
        cands = [(s, Path(d)) for s, d in box[0]]
    return cands


def _check_checkpoint(d: Path, rank: int, world_size: int, expect: dict | None) -> tuple[str, str, dict]:
    """This rank's verdict on checkpoint ``d`` before reading it: ``(status, why,
    manifest)`` with status "ok", "mismatch" (another run's checkpoint: an error) or
    "bad" (corrupt, truncated or incomplete: skipped)."""
    man: dict = {}
    try:
        man = read_manifest(d)
        if man.get("world_size") != world_size:
            raise _Mismatch(f"{d.name} was written by {man.get('world_size')} ranks; this run has {world_size}")
        fp = (man.get("meta") or {}).get("fingerprint")
        if expect is not None and fp != expect:
            raise _Mismatch(f"{d.name} was written for a different model or placement "
                            f"({_diff(fp, expect)}); use another --checkpoint-dir or the original settings")
        verify_files(d, man, rank, world_size)
    except _Mismatch as e:
        return "mismatch", str(e), man
    except CheckpointError as e:
        return "bad", str(e), man
    return "ok", "", man


def _all_verdicts(status: str, why: str, world_size: int, group: Any) -> list[tuple[str, str]]:
    """Every rank's ``(status, why)`` for the same checkpoint (an all-gather), so all
    ranks accept or skip it together."""
    if world_size <= 1:
        return [(status, why)]
    import torch.distributed as dist

    verdicts: list[Any] = [None] * world_size
    dist.all_gather_object(verdicts, (status, why), group=group)
    return verdicts


class _Mismatch(Exception):
    pass


def _diff(got: Any, want: dict) -> str:
    if not isinstance(got, dict):
        return "no fingerprint"
    out: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        elif a != b:
            out.append(f"{path} {a!r} there, {b!r} here")

    walk(got, want, "")
    return ", ".join(out[:3]) or "?"


def fingerprint(cfg: Any, sched: Any) -> dict:
    """What a checkpoint must match to be loaded (a :class:`TrainConfig` and its
    schedule): the model, and which rank holds each layer group. JSON-normalised, as
    it reads back from a manifest."""
    from dataclasses import asdict

    fp = {"model": asdict(cfg.model), "layer_groups": sched.num_stages, "placement": sched.placement.kind,
          "stage_to_rank": list(sched.placement.stage_to_rank)}
    return json.loads(json.dumps(fp, default=str))


def precheck(root: str | Path, world_size: int, expect: dict, param: str = "root") -> None:
    """Pure, before any process starts: the newest checkpoint with a readable manifest
    must have been written by ``world_size`` ranks for the ``expect`` fingerprint
    (ParameterError for ``param``, by default this function's ``root``; a command line
    passes its flag). File checksums are left to :func:`load_latest`."""
    for _, d in list_checkpoints(root):
        try:
            man = read_manifest(d)
        except CheckpointError:
            continue
        if man.get("world_size") != world_size:
            raise ParameterError(param, f"{d} was written by {man.get('world_size')} ranks; this run has "
                                 f"{world_size} (use the original number of ranks or another `{param}`)")
        if man.get("format") != FORMAT:
            raise ParameterError(param, f"{d} was written by an older pipeoffload (format {man.get('format')}; this "
                                 f"version reads format {FORMAT}); use another `{param}`")
        fp = (man.get("meta") or {}).get("fingerprint")
        if fp != expect:
            raise ParameterError(param, f"{d} was written for a different model or placement ({_diff(fp, expect)}); "
                                 f"use the original settings or another `{param}`")
        return


# --------------------------------------------------------------------------- RNG
def capture_rng(device: Any = None) -> dict:
    """Python and torch (CPU, and ``device``'s CUDA) generator states."""
    import torch

    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def restore_rng(state: dict, device: Any = None) -> None:
    import torch

    random.setstate(_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _tuples(x: Any) -> Any:
    return tuple(_tuples(y) for y in x) if isinstance(x, (list, tuple)) else x
