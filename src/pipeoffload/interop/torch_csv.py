"""Exchange schedules with PyTorch ``torch.distributed.pipelining`` (pure Python, no torch).

PyTorch describes a pipeline schedule as one list of *actions* per rank; an action is the
string ``{stage}{type}{microbatch}`` (``0F1``, ``1I0``, ``1W0``, ``0B3``, ``2SEND_F3``) and a
schedule file is a CSV with one row per rank and one action per cell
(``PipelineScheduleMulti._dump_csv`` / ``_load_csv``). PyTorch's *stage* is our layer group
(``Op.stage``); its rank is the row.

Op kinds map as follows (ours → torch's ``_ComputationType`` and action letters):

- ``F`` forward → ``F`` FORWARD;
- ``B`` input gradient → ``I`` BACKWARD_INPUT;
- ``W`` weight gradient → ``W`` BACKWARD_WEIGHT;
- ``BW`` fused backward → ``B`` FULL_BACKWARD;
- ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B`` → the same names;
- offload/reload ops → none: skipped on export (``strict=True`` raises instead).

Beware the letter ``B``: ours is the input-gradient half, torch's is the *full* backward.

Communication actions follow torch's convention: the stage index of a send or receive is
a layer group held by the rank that runs it (``SEND_F`` of stage ``s`` goes to the rank of
``s+1``, whose ``RECV_F`` names ``s+1``; ``SEND_B`` of ``s`` goes to the rank of ``s-1``,
whose ``RECV_B`` names ``s-1``). A compute-only schedule therefore exports to torch's
``"compute_only"`` format and one with communication ops to ``"compute_comms"``.

The rest of torch 2.13's grammar:

- ``OVERLAP_F_B`` (``(0F3;5B1)OVERLAP_F_B``, DualPipeV's overlapped pair) ↔ our
  overlapped pair: the F and the backward as adjacent ops, named in
  ``params[OVERLAP]`` (:func:`pipeoffload.ir.overlap_pairs`), which the runtime runs as
  one op. A cell of other sub-actions (not one F then one backward) is read as its
  sub-actions in order, run one after the other (as torch runs them).
- ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD`` (FSDP's all-gather, its release, the
  data-parallel gradient reduction of a stage): our runtime does each at fixed points
  of its own (``runtime/data_parallel.py``): a layer group is unsharded before its first
  op of the step, its gradients reduced and it resharded after its last ``W``/``BW``.
  Import drops them (the file's placement of them is not followed: the runtime's is);
  export writes them at exactly those points with ``dp_actions=True``.

Import (:func:`read_csv`, :func:`from_actions`) skips empty cells (torch's idle steps, also
the literal ``None``), drops the three bookkeeping actions, reads ``OVERLAP_F_B`` cells as
above, drops communication actions unless ``keep_comm=True``, and infers the placement
from the rows the layer groups appear on (loop, V, or the custom mapping they imply).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Sequence

from ..errors import ParameterError, ScheduleError
from ..ir import OVERLAP, Op, OpKind, Placement, Schedule
from ..passes.timing import overlapped_positions
from ..passes.validate import validate

__all__ = [
    "action_string",
    "parse_action",
    "to_actions",
    "write_csv",
    "from_actions",
    "read_csv",
    "placement_kind",
]

#: Our op kind → torch's action letter(s).
TORCH_LETTER: dict[OpKind, str] = {
    OpKind.F: "F",
    OpKind.B: "I",
    OpKind.W: "W",
    OpKind.BW: "B",
    OpKind.SEND_F: "SEND_F",
    OpKind.RECV_F: "RECV_F",
    OpKind.SEND_B: "SEND_B",
    OpKind.RECV_B: "RECV_B",
}
#: torch's action letter(s) → our op kind.
FROM_TORCH: dict[str, OpKind] = {v: k for k, v in TORCH_LETTER.items()}
#: torch actions with no microbatch that only steer its runtime (FSDP, DP grads): dropped on import.
TORCH_BOOKKEEPING = frozenset({"UNSHARD", "RESHARD", "REDUCE_GRAD"})

# Longest alternatives first, so a longer name is never cut short by a shorter one.
_KINDS = "|".join(sorted(FROM_TORCH, key=len, reverse=True))
_ACTION = re.compile(rf"(\d+)({_KINDS})(\d+)")
_BOOKKEEPING = re.compile(rf"(\d+)({'|'.join(sorted(TORCH_BOOKKEEPING))})(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")
_EXPECTED = "expected {stage}{F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B}{microbatch}, e.g. 0F1 or 1I0"
_IDLE = frozenset({"", "none"})


# ----------------------------------------------------------------------------- actions


def action_string(op: Op) -> str:
    """torch's action string for ``op`` (``Op(BW, 0, 3)`` → ``"0B3"``).

    Raises :class:`ParameterError` for offload/reload ops, which torch cannot express."""
    letter = TORCH_LETTER.get(op.kind)
    if letter is None:
        raise ParameterError(
            "schedule", f"{op} has no torch.distributed.pipelining action (offload/reload ops cannot be exported)"
        )
    return f"{op.stage}{letter}{op.microbatch}"


def parse_action(text: str) -> tuple[OpKind, int, int]:
    """Parse one torch action (``"1I0"`` → ``(OpKind.B, 1, 0)``); surrounding spaces are ignored.

    Only actions with a pipeoffload equivalent are accepted; anything else (empty text,
    a bookkeeping or overlap action, a missing microbatch, trailing junk) raises
    :class:`ParameterError` saying what was expected."""
    found = _ACTION.fullmatch(text.strip())
    if found is None:
        raise ParameterError("action", f"{text!r} is not an action; {_EXPECTED}")
    stage, letter, mb = found.groups()
    return FROM_TORCH[letter], int(stage), int(mb)


def _parse_cell(text: str) -> list[tuple[OpKind, int, int]]:
    """The actions one CSV cell holds: none (idle, bookkeeping), one, or an overlap's several.

    Raises ValueError with a message (the caller adds file, row and column)."""
    cell = text.strip()
    if cell.lower() in _IDLE or _BOOKKEEPING.fullmatch(cell):
        return []
    overlap = _OVERLAP.fullmatch(cell)
    if overlap is not None:
        parts = [s for s in overlap.group(1).split(";") if s.strip()]
        if not parts:
            raise ValueError(f"cell {text!r}: OVERLAP_F_B with no sub-actions")
        return [t for part in parts for t in _parse_cell(part)]
    found = _ACTION.fullmatch(cell)
    if found is None:
        raise ValueError(f"cell {text!r} is not an action; {_EXPECTED}")
    stage, letter, mb = found.groups()
    return [(FROM_TORCH[letter], int(stage), int(mb))]


# ----------------------------------------------------------------------------- export


def to_actions(schedule: Schedule, strict: bool = False, dp_actions: bool = False) -> list[list[str]]:
    """One list of torch action strings per rank, in the schedule's order.

    Offload/reload ops are skipped (torch has no such action) unless ``strict``, which
    raises :class:`ParameterError` naming the first one. A communication op whose stage is
    not held by its own rank breaks torch's convention (see the module docstring) and raises.
    An overlapped pair the runtime runs as one op becomes one ``OVERLAP_F_B`` cell.
    ``dp_actions``: add ``UNSHARD``/``REDUCE_GRAD``/``RESHARD`` where our runtime does them.
    """
    pl = schedule.placement
    pairs = overlapped_positions(schedule, schedule.ranks)
    rows: list[list[str]] = []
    for r, lst in enumerate(schedule.ranks):
        first, last_w = _dp_points(lst) if dp_actions else ({}, {})
        row = []
        i = 0
        while i < len(lst):
            op = lst[i]
            if op.kind.is_transfer:
                if strict:
                    raise ParameterError(
                        "schedule",
                        f"rank {r}, position {i}: {op} has no torch.distributed.pipelining action "
                        f"(export without strict to skip offload/reload ops)",
                    )
                i += 1
                continue
            if op.kind.is_comm and not (0 <= op.stage < pl.num_stages and pl.rank_of(op.stage) == r):
                raise ParameterError(
                    "schedule",
                    f"rank {r}, position {i}: {op} names a layer group rank {r} does not hold; torch "
                    f"expects a send/receive to name the sending/receiving rank's own stage",
                )
            group = lst[i:i + 2] if (r, i) in pairs else [op]
            row += [f"{o.stage}UNSHARD" for k, o in enumerate(group) if first.get(o.stage) == i + k]
            row.append(action_string(op) if len(group) == 1 else
                       f"({';'.join(action_string(o) for o in group)})OVERLAP_F_B")
            for k, o in enumerate(group):
                if last_w.get(o.stage) == i + k:
                    row += [f"{o.stage}REDUCE_GRAD", f"{o.stage}RESHARD"]
            i += len(group)
        rows.append(row)
    return rows


def _dp_points(ops: Sequence[Op]) -> tuple[dict[int, int], dict[int, int]]:
    """Per layer group, the position of its first compute op and of its last W/BW."""
    first: dict[int, int] = {}
    last_w: dict[int, int] = {}
    for i, op in enumerate(ops):
        if op.kind.is_compute:
            first.setdefault(op.stage, i)
            if op.kind in (OpKind.W, OpKind.BW):
                last_w[op.stage] = i
    return first, last_w


def write_csv(schedule: Schedule, path: str | Path, strict: bool = False, param: str = "path",
              dp_actions: bool = False) -> Path:
    """Write ``schedule`` as torch's schedule CSV (one row per rank, one action per cell).

    The file loads with ``PipelineScheduleMulti._load_csv`` (compute-only schedules) or
    ``_PipelineScheduleRuntime._load_csv(..., format="compute_comms")`` (with comm ops).
    Returns the path written. Unwritable paths raise :class:`ParameterError` for ``param``
    (default ``path``, this function's argument; a command line passes its flag).
    ``strict``, ``dp_actions``: as for :func:`to_actions`."""
    rows = to_actions(schedule, strict=strict, dp_actions=dp_actions)
    out = Path(path)
    try:
        with out.open("w", newline="") as f:
            csv.writer(f).writerows(rows)
    except OSError as e:
        raise ParameterError(param, f"cannot write {out}: {e.strerror or e}") from None
    return out


# ----------------------------------------------------------------------------- import


def placement_kind(stage_to_rank: Sequence[int], p: int) -> Placement:
    """The placement for ``stage_to_rank``, labelled ``loop`` or ``v`` when it is one, else ``custom``."""
    mapping = tuple(stage_to_rank)
    S = len(mapping)
    if S % p == 0 and mapping == Placement.loop(p, S // p).stage_to_rank:
        return Placement.loop(p, S // p)
    if S == 2 * p and mapping == Placement.vshape(p).stage_to_rank:
        return Placement.vshape(p)
    return Placement.custom(mapping, p)


def _comm_peer(kind: OpKind, stage: int, pl: Placement) -> int | None:
    """The other rank of a send/receive under torch's convention; None if that stage does not exist."""
    other = stage + 1 if kind in (OpKind.SEND_F, OpKind.RECV_B) else stage - 1
    return pl.rank_of(other) if 0 <= other < pl.num_stages else None


def from_actions(
    rows: Sequence[Sequence[str | None]],
    placement: str | Placement | None = None,
    num_microbatches: int | None = None,
    name: str = "imported",
    keep_comm: bool = False,
    source: str = "actions",
    param: str = "schedule",
) -> Schedule:
    """Build a validated :class:`Schedule` from torch action strings, one sequence per rank.

    ``p`` is the number of rows; each layer group's rank is the row its actions appear on
    (one row only). ``placement`` — ``"loop"``, ``"v"``, ``"custom"`` or a
    :class:`Placement` — is checked against that; when None it is inferred and labelled
    ``loop``/``v`` if it matches one (loop wins where both do, i.e. p = 1), else ``custom``.
    ``num_microbatches`` defaults to the largest microbatch + 1. Cells are read as in the
    module docstring. Every problem raises :class:`ParameterError` for ``param``, naming
    ``source`` and the row and column (1-based; row r+1 is rank r) of the offending cell.
    """
    fail = _CellError(source, param)
    rows = [list(row) for row in rows]
    while rows and all(_blank(c) for c in rows[-1]):
        rows.pop()  # trailing blank lines are not ranks
    if not rows:
        raise fail("no actions; expected one row of actions per rank")
    parsed, owner, pairs = _parse_rows(rows, keep_comm, fail)
    for r, ops in enumerate(parsed):
        if not any(k.is_compute for k, *_ in ops):
            raise fail("no compute actions; every rank must run at least one layer group", r)
    pl = _placement_of(placement, len(rows), owner, fail)
    m = _microbatch_count(parsed, num_microbatches, fail)
    ranks, columns = _ops_of(parsed, pl, fail)
    params: dict = {"p": len(rows), "m": m, "v": pl.max_chunks, "source": source}
    if pairs:
        params[OVERLAP] = tuple(pairs)
    sched = Schedule(name, m, pl, ranks, params)
    try:
        validate(sched)
    except ScheduleError as e:
        raise fail(f"not a valid schedule: {_with_columns(str(e), ranks, columns)}") from None
    return sched


class _CellError:
    """Makes the ParameterError of :func:`from_actions`: ``param``, then ``source`` and,
    where known, the row (rank) and column of the cell."""

    def __init__(self, source: str, param: str) -> None:
        self.source, self.param = source, param

    def __call__(self, msg: str, r: int | None = None, c: int | None = None) -> ParameterError:
        where = self.source
        if r is not None:
            where += f", row {r + 1} (rank {r})"
        if c is not None:
            where += f", column {c + 1}"
        return ParameterError(self.param, f"{where}: {msg}")


#: One parsed action: kind, layer group, microbatch, and the column it came from.
_Parsed = tuple[OpKind, int, int, int]


def _parse_rows(rows: list[list], keep_comm: bool, fail: _CellError) -> tuple[
        list[list[_Parsed]], dict[int, tuple[int, int]], list[tuple[int, int, int, int]]]:
    """Every row's actions (comm ones only with ``keep_comm``), where each layer group is
    first seen (row, column), and the overlapped pairs (``OVERLAP_F_B`` cells of one F then
    one backward); a layer group on two ranks or an action that repeats is an error naming
    both cells."""
    pairs: list[tuple[int, int, int, int]] = []
    parsed: list[list[_Parsed]] = []
    owner: dict[int, tuple[int, int]] = {}  # stage -> (row, column) first seen
    seen: dict[tuple[OpKind, int, int], tuple[int, int]] = {}
    for r, row in enumerate(rows):
        ops: list[_Parsed] = []
        for c, cell in enumerate(row):
            text = "" if cell is None else str(cell).strip()
            try:
                triples = _parse_cell(text)
            except ValueError as e:
                raise fail(str(e), r, c) from None
            if len(triples) == 2 and triples[0][0] is OpKind.F and triples[1][0].is_backward \
                    and _OVERLAP.fullmatch(text):
                pairs.append((triples[0][1], triples[0][2], triples[1][1], triples[1][2]))
            for kind, s, j in triples:
                if kind.is_comm and not keep_comm:
                    continue
                if kind.is_compute:
                    r0, c0 = owner.setdefault(s, (r, c))
                    if r0 != r:
                        raise fail(
                            f"{text} runs layer group {s} on rank {r}, but row {r0 + 1}, column "
                            f"{c0 + 1} already runs it on rank {r0}; a layer group lives on one rank", r, c)
                    if (kind, s, j) in seen:
                        r0, c0 = seen[(kind, s, j)]
                        raise fail(f"{text} repeats row {r0 + 1}, column {c0 + 1}; each action runs once",
                                   r, c)
                    seen[(kind, s, j)] = (r, c)
                ops.append((kind, s, j, c))
        parsed.append(ops)
    return parsed, owner, pairs


def _placement_of(placement: str | Placement | None, p: int, owner: dict[int, tuple[int, int]],
                  fail: _CellError) -> Placement:
    """The observed layer group → rank map as a placement (inferred when ``placement``
    is None), or the one asked for, checked against what the actions show."""
    num_stages = max(owner) + 1
    if placement is None:
        missing = [s for s in range(num_stages) if s not in owner]
        if missing:
            raise fail(f"layer group(s) {', '.join(map(str, missing[:5]))} never appear; stages must be "
                       f"numbered 0..{num_stages - 1} with no gaps (or pass a placement)")
        return placement_kind([owner[s][0] for s in range(num_stages)], p)
    pl = _resolve_placement(placement, p, num_stages, owner, fail)
    for s, (r, c) in owner.items():
        if s >= pl.num_stages or pl.rank_of(s) != r:
            held = "does not exist" if s >= pl.num_stages else f"is on rank {pl.rank_of(s)}"
            raise fail(f"layer group {s} runs on rank {r} but in the {pl.kind} placement it {held}", r, c)
    return pl


def _microbatch_count(parsed: list[list[_Parsed]], num_microbatches: int | None, fail: _CellError) -> int:
    """``num_microbatches``, checked to cover every microbatch used; default the largest + 1."""
    top = max(j for ops in parsed for _, _, j, _ in ops) + 1
    if num_microbatches is None:
        return top
    m = num_microbatches
    if not isinstance(m, int) or isinstance(m, bool) or m < top:
        raise fail(f"num_microbatches={m!r} but the actions use microbatch {top - 1}; need an integer >= {top}")
    return m


def _ops_of(parsed: list[list[_Parsed]], pl: Placement,
            fail: _CellError) -> tuple[list[list[Op]], list[list[int]]]:
    """Each rank's ops (sends/receives with their peer under torch's convention), and
    the CSV column of each op (for the validator's messages)."""
    ranks: list[list[Op]] = []
    columns: list[list[int]] = []
    for r, ops in enumerate(parsed):
        lst, cols = [], []
        for kind, s, j, c in ops:
            peer = None
            if kind.is_comm:
                if not (0 <= s < pl.num_stages and pl.rank_of(s) == r):
                    raise fail(f"{kind.value} of layer group {s}, which rank {r} does not hold; torch's "
                               f"convention is that a send/receive names its own rank's stage", r, c)
                peer = _comm_peer(kind, s, pl)
                if peer is None:
                    raise fail(f"{kind.value} of layer group {s} has no peer (no layer group "
                               f"{s + 1 if kind in (OpKind.SEND_F, OpKind.RECV_B) else s - 1})", r, c)
            lst.append(Op(kind, s, j, r, pl.chunk_of(s), peer))
            cols.append(c)
        ranks.append(lst)
        columns.append(cols)
    return ranks, columns


def read_csv(
    path: str | Path,
    placement: str | Placement | None = None,
    num_microbatches: int | None = None,
    name: str = "imported",
    keep_comm: bool = False,
    param: str = "path",
) -> Schedule:
    """Read torch's schedule CSV (one row per rank) into a validated :class:`Schedule`.

    See :func:`from_actions` for how p, the placement and m are inferred. Any problem —
    missing or unreadable file, empty file, malformed cell, a layer group on two ranks,
    an invalid order — raises :class:`ParameterError` for ``param`` (default ``path``, this
    function's argument) naming the file, and the row and column where one applies."""
    src = Path(path)
    try:
        with src.open(newline="") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise ParameterError(param, f"{src}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ParameterError(param, f"{src}: cannot read as CSV: {e}") from None
    return from_actions(rows, placement, num_microbatches, name, keep_comm, source=str(src), param=param)


def _blank(cell: str | None) -> bool:
    return cell is None or str(cell).strip() == ""


def _resolve_placement(placement: str | Placement, p: int, num_stages: int, owner: dict,
                       fail: _CellError) -> Placement:
    if isinstance(placement, Placement):
        if placement.num_ranks != p:
            raise fail(f"{p} rows (ranks) but the placement has {placement.num_ranks} ranks")
        return placement
    if placement == "loop":
        if num_stages % p:
            raise fail(f"loop placement needs a multiple of {p} layer groups, the actions use {num_stages}")
        return Placement.loop(p, num_stages // p)
    if placement == "v":
        if num_stages > 2 * p:
            raise fail(f"V placement has {2 * p} layer groups for {p} ranks, the actions use {num_stages}")
        return Placement.vshape(p)
    if placement == "custom":
        missing = [s for s in range(num_stages) if s not in owner]
        if missing:
            raise fail(f"layer group(s) {', '.join(map(str, missing[:5]))} never appear")
        return Placement.custom([owner[s][0] for s in range(num_stages)], p)
    raise ParameterError("placement", f"expected 'loop', 'v', 'custom' or a Placement, got {placement!r}")


_POSITION = re.compile(r"rank (\d+), position (\d+)")


def _with_columns(message: str, ranks: list[list[Op]], columns: list[list[int]]) -> str:
    """Rewrite the validator's "rank r, position i" (index among ops) as the CSV cell."""

    def sub(found: re.Match) -> str:
        r, i = int(found.group(1)), int(found.group(2))
        if r < len(columns) and i < len(columns[r]):
            return f"rank {r} (row {r + 1}, column {columns[r][i] + 1})"
        return found.group(0)

    return _POSITION.sub(sub, message)

