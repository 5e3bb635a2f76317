"""Checkpoints of a pipeline run: one file per rank, a manifest written last.

Layout of a checkpoint directory ``D``::

    D/step-00000010/rank-00000.pt     # rank 0's layer groups, optimizer, RNG, data position
    D/step-00000010/rank-00000.pt ... # one per rank
    D/step-00000010/manifest.json     # written last: step, world size, sha256 + size of each file

Guarantees

- **Atomic files**: each file is written to a temporary name in the same directory,
  flushed and fsynced, then ``os.replace``\\ d into place, so a reader never sees a
  half-written file under its final name.
- **Complete or ignored**: rank 0 writes ``manifest.json`` only after every rank has
  reported its file's sha256 (a gather), so a checkpoint without a manifest is
  incomplete and never loaded.
- **Verified on load**: :func:`load_latest` tries checkpoints newest first; each rank
  checks the manifest, its own file's size and sha256, and that ``torch.load`` reads
  it; the ranks agree (an all-gather) and, if any rank's check failed, all fall back
  to the previous checkpoint, reporting why the newer one was rejected. A checkpoint
  written for another model or placement is an error, not a fall-back.
- **Retention**: after writing step ``n``, rank 0 keeps the ``keep`` newest complete
  checkpoints up to ``n`` and removes older ones (and incomplete ones older than ``n``).

Works without a process group for a single rank (``world_size=1``). torch is imported
only by the functions that save or load tensors: :func:`precheck` (run by the CLI before
any process starts) and the manifest helpers are pure Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ParameterError, PipeoffloadError

MANIFEST = "manifest.json"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(PipeoffloadError):
    """A checkpoint cannot be used (corrupt, incomplete, or written for another run)."""

    all_ranks = True  # every rank reaches the same verdict (the launcher reports it once)


@dataclass
class Checkpoint:
    step: int  #: optimizer steps completed when it was written
    path: Path  #: the step directory
    manifest: dict
    state: dict  #: this rank's payload
    rejected: list[str]  #: newer checkpoints skipped, with the reason


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


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
    payload: dict,
    *,
    rank: int = 0,
    world_size: int = 1,
    meta: dict | None = None,
    keep: int = 3,
    group: Any = None,
) -> Path:
    """Save this rank's ``payload`` (anything ``torch.load(weights_only=True)`` reads)
    as part of checkpoint ``step``. Call on every rank (it gathers to rank 0, which
    writes the manifest with ``meta`` last and prunes to ``keep``). Returns the step
    directory."""
    import torch
    import torch.distributed as dist

    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        # A manifest left from an earlier run at this step would vouch for files
        # about to be replaced: drop it first (its absence marks the step incomplete).
        (d / MANIFEST).unlink(missing_ok=True)
    path = d / rank_file(rank)
    atomic_write(path, lambda f: torch.save(payload, f))
    entry = {"rank": rank, "file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size}
    if world_size > 1:
        entries: list | None = [None] * world_size if rank == 0 else None
        dist.gather_object(entry, entries, dst=0, group=group)
    else:
        entries = [entry]
    if rank == 0:
        assert entries is not None
        manifest = {
            "format": FORMAT,
            "step": step,
            "world_size": world_size,
            "created": time.time(),
            "files": {str(e["rank"]): {k: e[k] for k in ("file", "sha256", "bytes")} for e in entries},
            "meta": meta or {},
        }
        atomic_write(d / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1, default=str).encode()))
        prune(root, keep, step)
    return d


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
    if (not isinstance(manifest, dict) or manifest.get("format") != FORMAT
            or not isinstance(manifest.get("files"), dict)):
        raise CheckpointError(f"{directory.name}: {MANIFEST} is not a format-{FORMAT} manifest")
    named = _STEP_DIR.match(directory.name)
    if named and manifest.get("step") != int(named.group(1)):
        raise CheckpointError(f"{directory.name}: {MANIFEST} says step {manifest.get('step')!r}")
    return manifest


def verify_rank_file(directory: Path, manifest: dict, rank: int) -> Path:
    """Check this rank's file against the manifest (size, sha256); return its path."""
    ent = manifest["files"].get(str(rank))
    if not isinstance(ent, dict):
        raise CheckpointError(f"{directory.name}: {MANIFEST} lists no file for rank {rank}")
    path = directory / str(ent.get("file", ""))
    if not path.is_file():
        raise CheckpointError(f"{directory.name}: {path.name} is missing")
    size = path.stat().st_size
    if size != ent.get("bytes"):
        raise CheckpointError(f"{directory.name}: {path.name} has {size} bytes, the manifest says {ent.get('bytes')} "
                              "(truncated or replaced)")
    digest = sha256_file(path)
    if digest != ent.get("sha256"):
        raise CheckpointError(f"{directory.name}: {path.name} fails its sha256 check (corrupt)")
    return path


def load_latest(
    root: str | Path,
    *,
    rank: int = 0,
    world_size: int = 1,
    expect: dict | None = None,
    group: Any = None,
    warn: Callable[[str], None] | None = None,
) -> Checkpoint | None:
    """The newest checkpoint under ``root`` that every rank can load, or None when
    there is none at all. Call on every rank.

    ``expect``: entries the manifest's ``meta["fingerprint"]`` must equal (model and
    placement); a mismatch raises CheckpointError on every rank. A corrupt, truncated
    or incomplete checkpoint is skipped with ``warn(reason)`` (rank 0) and the previous
    one tried; if none is usable, CheckpointError lists why each was rejected."""
    rejected: list[str] = []
    for step, d in _candidates_of_rank0(root, world_size, group):
        status, why, state, man = _try_checkpoint(d, step, rank, world_size, expect)
        verdicts = _all_verdicts(status, why, world_size, group)
        mismatches = [w for s, w in verdicts if s == "mismatch"]
        if mismatches:
            raise CheckpointError(mismatches[0])
        bad = sorted({w for s, w in verdicts if s == "bad"})
        if not bad:
            return Checkpoint(step, d, man, state, rejected)
        reason = "; ".join(bad)
        rejected.append(reason)
        if warn is not None and rank == 0:
            warn(f"checkpoint {d} is unusable: {reason}; trying the previous one")
    if not rejected:
        return None
    raise CheckpointError(f"no usable checkpoint in {root}: " + " | ".join(rejected))


def _candidates_of_rank0(root: str | Path, world_size: int, group: Any) -> list[tuple[int, Path]]:
    """Rank 0's list of checkpoints, newest first, on every rank, so the collectives of
    :func:`load_latest` pair up."""
    cands = list_checkpoints(root)
    if world_size > 1:
        import torch.distributed as dist

        box = [[(s, str(d)) for s, d in cands]]
        dist.broadcast_object_list(box, src=0, group=group)
        cands = [(s, Path(d)) for s, d in box[0]]
    return cands


def _try_checkpoint(d: Path, step: int, rank: int, world_size: int,
                    expect: dict | None) -> tuple[str, str, Any, dict]:
    """This rank's verdict on checkpoint ``d``: ``(status, why, state, manifest)`` with
    status "ok", "mismatch" (another run's checkpoint: an error) or "bad" (corrupt,
    truncated or incomplete: skipped)."""
    import torch

    man: dict = {}
    try:
        man = read_manifest(d)
        if man.get("world_size") != world_size:
            raise _Mismatch(f"{d.name} was written by {man.get('world_size')} ranks; this run has {world_size}")
        fp = (man.get("meta") or {}).get("fingerprint")
        if expect is not None and fp != expect:
            raise _Mismatch(f"{d.name} was written for a different model or placement "
                            f"({_diff(fp, expect)}); use another --checkpoint-dir or the original settings")
        path = verify_rank_file(d, man, rank)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any load failure means "corrupt"
            raise CheckpointError(f"{d.name}: {path.name} cannot be loaded ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        if not isinstance(state, dict) or state.get("step") != step:
            raise CheckpointError(f"{d.name}: {path.name} does not hold step {step}")
    except _Mismatch as e:
        return "mismatch", str(e), None, man
    except CheckpointError as e:
        return "bad", str(e), None, man
    return "ok", "", state, man


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
