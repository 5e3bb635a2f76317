"""Validator: reject a malformed schedule, naming the first bad op and the rule.

Rules checked, in order:
1. shape: one op list per rank; each op's stage, microbatch, rank and chunk agree
   with the placement ("placement consistent");
2. completeness: every (layer group, microbatch) has exactly one F and either one BW
   or one B and one W;
3. local order: on each rank an op comes after the ops it depends on that share its rank;
4. overlapped pairs (``params[OVERLAP]``, DualPipe's F&B): each names an F and the
   backward (B or BW) that follows it directly among its rank's compute ops;
5. deadlock freedom: cross-rank dependencies can be satisfied (no cycle), each
   overlapped pair run as one op (its F waits for its backward's inputs).

Cost: O(number of ops) for p ranks, v chunks and m microbatches, i.e. O(p·v·m), rules 1 and 3
in one pass, with flat per-(layer group, microbatch) tables (rule 2 is a byte scan in
C); rule 5 is the timing pass's engine without the timing (docs/algorithms.md#9-speed).
A schedule still held as arrays (:class:`~pipeoffload.ir.CompactOrders`) is checked on
them: rules 1 and 2, then the proof, which implies rule 3; only when it fails are the
Op lists made to name the first broken rule (docs/algorithms.md §9.1). Where a timing
follows, :func:`~pipeoffload.passes.lower.validate_and_time` lets the timing stand for the
proof (:func:`check_rules`, :func:`counted_shape`, :func:`every_op_placed`; §9.3).
"""

from __future__ import annotations

import math
from array import array

from ..errors import ScheduleError
from ..ir import CompactOrders, OpKind, Schedule, overlap_pairs
from ..native import c_engine
from .timing import _code_dependencies, _compact_addresses, _proved_compact, prove_deadlock_free

#: Index of each compute kind in the validator's per-kind tables.
_F, _B, _W, _BW = 0, 1, 2, 3
_KIND_INDEX = {OpKind.F: _F, OpKind.B: _B, OpKind.W: _W, OpKind.BW: _BW}
_KIND_OF_INDEX = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)
#: The compact kind codes of the compute kinds (F, B, W, BW), as bytes.
_COMPUTE_CODES = bytes((_F, _B, _W, _BW))
#: Rule 2 on one (layer group, microbatch) as the byte F | B<<1 | W<<2 | BW<<3: complete
#: is one F with one BW (9) or one B and one W (7); rule 1 already rejected BW mixed with B/W.
_INCOMPLETE = bytes(0 if b in (7, 9) else 1 for b in range(256))


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks a rule; return None if valid.

    Guarantees: the rules are checked in the order of the module docstring, and the
    error names the first bad op (rank and position) or the missing op, and the rule.
    """
    if check_rules(schedule):
        prove_deadlock_free(schedule)


def check_rules(schedule: Schedule) -> bool:
    """:func:`validate` up to the deadlock proof: raise :class:`ScheduleError` for the
    first broken rule among 1 to 4; return whether rule 5's proof is still to run (False
    when the compact proof already ran and passed).

    Guarantees: ``validate(s)`` is ``check_rules(s) and prove_deadlock_free(s)``; a
    timing that places every op as the proof does (each overlapped pair as one op) may
    stand for the proof (:func:`~pipeoffload.passes.lower.validate_and_time`)."""
    pl = schedule.placement
    m = schedule.num_microbatches
    if m < 1:
        raise ScheduleError(f"schedule has {m} microbatches; need at least 1")
    compact = schedule.compact
    lists = len(compact.kinds) if compact is not None else len(schedule.ranks)
    if lists != pl.num_ranks:
        raise ScheduleError(f"schedule has {lists} op lists but the placement has {pl.num_ranks} ranks")
    if compact is not None and not overlap_pairs(schedule):  # pairs need the Op lists' checks
        _check_complete(schedule, _check_shape_compact(schedule, compact))
        if _proved(schedule):
            return False  # rules 3 to 5 hold: a proof that places every op places its same-rank inputs first
        # else the Op lists' checks below name the first broken rule
    counts, order_error = _check_shape(schedule)
    _check_complete(schedule, counts)
    if order_error:  # rule 3, found in rule 1's pass and raised after rule 2
        raise ScheduleError(order_error)
    _check_overlap(schedule)
    return True


def counted_shape(schedule: Schedule) -> bool:
    """Whether ``schedule`` is held as compute-only :class:`CompactOrders` without
    overlapped pairs whose counts make a complete schedule once every op is placed:
    one list per rank, every layer group on its list's rank, every microbatch in
    ``[0, m)``, and per kind ``S·m`` F's with ``S·m`` B's and W's (no BW) or ``S·m``
    BW's (no B or W). O(p) calls into C.

    Guarantees (with :func:`every_op_placed`): if this holds and a proof or a timing
    that places each rank's ops in order, each once its inputs are placed, places every
    op into an end table in which every slot of those kinds is then set, the schedule
    passes :func:`validate`: each slot set at least once by a count of ops equal to the
    number of slots is each op exactly once (rules 1 and 2, no duplicates), and the
    placement order is rules 3 and 5 (rule 4: no pairs)."""
    compact, pl, m = schedule.compact, schedule.placement, schedule.num_microbatches
    if compact is None or m < 1 or len(compact.kinds) != pl.num_ranks or overlap_pairs(schedule):
        return False
    rank_of, n = pl.stage_to_rank, [0, 0, 0, 0]
    for r, (ks, ss, js) in enumerate(zip(compact.kinds, compact.stages, compact.mbs)):
        if not js:
            continue
        codes = ks.tobytes()  # one byte a kind code: counted by memchr-speed bytes methods
        if min(js) < 0 or max(js) >= m or codes.translate(None, _COMPUTE_CODES) or \
                any(rank_of[s] != r for s in set(ss)):
            return False
        for k in range(4):
            n[k] += codes.count(k)
    full = pl.num_stages * m
    return n[_F] == full and (n[_B] == n[_W] == full and not n[_BW] or n[_BW] == full and not n[_B] + n[_W])


def every_op_placed(schedule: Schedule, end: array) -> bool:
    """Whether the engine's end table ``end`` (``-inf`` at an op never placed) has every
    slot of the schedule's kinds set: F and B (a BW completes the B), and W unless the
    schedule runs BW's. Call after :func:`counted_shape` holds (module contract there)."""
    size = schedule.num_stages * schedule.num_microbatches
    if len(end) != 3 * size:
        return False
    kinds = 2 if any(k.tobytes().count(_BW) for k in schedule.compact.kinds) else 3
    return -math.inf not in end[:kinds * size]


def _check_shape(schedule: Schedule) -> tuple[list[bytearray], str | None]:
    """Rule 1, and no op twice: each compute op agrees with the placement; in the same
    pass, rule 3 (:func:`_check_local_order`), whose first error is returned, not raised
    (rule 2 comes first). Returns, per kind (F, B, W, BW), a 0/1 table over
    ``stage·m + microbatch`` of the ops present, and rule 3's error message or None."""
    pl = schedule.placement
    S, m = pl.num_stages, schedule.num_microbatches
    counts = [bytearray(S * m) for _ in range(4)]
    have_b, have_w, have_bw = counts[_B], counts[_W], counts[_BW]
    rank_of, chunk_of = pl.stage_to_rank, pl._chunk_of
    kind_index = _KIND_INDEX
    local, done = _local_inputs(schedule), bytearray(3 * S * m)
    code_of = (0, 1, 2, 1)  # KIND_CODE by kind index: a BW completes the B
    order_error = None
    for r, lst in enumerate(schedule.ranks):
        for i, op in enumerate(lst):
            k = kind_index.get(op.kind)
            if k is None:  # not a compute op
                continue
            stage, j = op.stage, op.microbatch
            bad = None
            if not 0 <= stage < S:
                bad = f"stage out of range 0..{S - 1} (rule: placement consistent)"
            elif not 0 <= j < m:
                bad = f"microbatch out of range 0..{m - 1}"
            elif op.rank != r or rank_of[stage] != r:
                bad = (f"layer group {stage} is placed on rank {rank_of[stage]}, "
                       f"not rank {r} (rule: placement consistent)")
            elif op.chunk != chunk_of[stage]:
                bad = (f"chunk {op.chunk} but layer group {stage} is chunk "
                       f"{chunk_of[stage]} of rank {r} (rule: placement consistent)")
            else:
                idx = stage * m + j
                if counts[k][idx] or (have_bw[idx] if k == _B or k == _W else
                                      k == _BW and (have_b[idx] or have_w[idx])):
                    bad = _conflict(counts, k, idx)
                counts[k][idx] = 1
            if bad:
                raise ScheduleError(f"rank {r}, position {i}: {op}: {bad}")
            own = code_of[k] * S + stage
            for base, _, _ in local[own]:
                if not done[base + j] and order_error is None:
                    order_error = _local_order_error(local[own], done, r, i, op)
            done[own * m + j] = 1
    return counts, order_error


def _conflict(counts: list[bytearray], k: int, idx: int) -> str:
    """Why op kind ``k`` at ``idx`` (``stage·m + microbatch``) cannot join the 0/1 tables
    ``counts`` (rule 2's op-once part), for the rare op that cannot; the shape checks
    test the same condition inline, per op, and call this only for the message."""
    if counts[k][idx]:
        return "duplicate op (rule: each op runs exactly once)"
    if k == _BW:
        return "BW together with B/W for the same layer group and microbatch"
    return "B/W together with BW for the same layer group and microbatch"


def _proved(schedule: Schedule) -> bool:
    """Whether the compact deadlock proof places every compute op (no overlapped pairs).
    It places each rank's ops in order, each once its inputs are placed, so when it
    places them all, every op came after its same-rank inputs (rule 3) too."""
    addr = _compact_addresses(schedule)
    return addr is not None and _proved_compact(schedule, *addr)


def _check_shape_compact(schedule: Schedule, compact: CompactOrders) -> list[bytearray]:
    """Rule 1 and no op twice, as :func:`_check_shape`, over a schedule still held as
    :class:`CompactOrders`: the same checks, tables and messages (an op's rank and chunk
    are its layer group's, so rule 1 asks only whether that rank is the list's), an
    :class:`Op` made only for a message; rule 3 is left to the proof (:func:`_proved`)."""
    pl = schedule.placement
    S, m = pl.num_stages, schedule.num_microbatches
    rank_of = pl.stage_to_rank
    loop = getattr(c_engine(), "shape_counts", None)
    if loop is not None:  # in C where built: the same tables; an op it refuses is named below
        got = loop(list(compact.kinds), list(compact.stages), list(compact.mbs), list(rank_of), S, m)
        if got is not None:
            return got
    counts = [bytearray(S * m) for _ in range(4)]
    have_b, have_w, have_bw = counts[_B], counts[_W], counts[_BW]
    for r, (ks, ss, js) in enumerate(zip(compact.kinds, compact.stages, compact.mbs)):
        for i, (k, stage, j) in enumerate(zip(ks, ss, js)):
            if k >= 4:  # not a compute op
                continue
            bad = None
            if not 0 <= j < m:
                bad = f"microbatch out of range 0..{m - 1}"
            elif rank_of[stage] != r:
                bad = (f"layer group {stage} is placed on rank {rank_of[stage]}, "
                       f"not rank {r} (rule: placement consistent)")
            else:
                idx = stage * m + j
                if counts[k][idx] or (have_bw[idx] if k == _B or k == _W else
                                      k == _BW and (have_b[idx] or have_w[idx])):
                    bad = _conflict(counts, k, idx)
                counts[k][idx] = 1
            if bad:
                raise ScheduleError(f"rank {r}, position {i}: {compact.op(pl, r, i)}: {bad}")
    return counts


def _local_inputs(schedule: Schedule) -> list[tuple[tuple[int, int, int], ...]]:
    """Per (code, stage): its same-rank inputs as (slot of microbatch 0, code, stage)."""
    pl = schedule.placement
    S, m = pl.num_stages, schedule.num_microbatches
    rank_of = pl.stage_to_rank
    return [
        tuple(((dc * S + ds) * m, dc, ds) for dc, ds in _code_dependencies(c, s, S) if rank_of[ds] == rank_of[s])
        for c in range(3) for s in range(S)
    ]


def _local_order_error(inputs: tuple[tuple[int, int, int], ...], done: bytearray, r: int, i: int,
                       op: object) -> str | None:
    """Rule 3's message for ``op`` (rank ``r``, position ``i``) if a same-rank input is
    not ``done`` yet, else None."""
    mb = op.microbatch
    for base, dc, ds in inputs:
        if not done[base + mb]:
            return (f"rank {r}, position {i}: {op} comes before its same-rank dependency "
                    f"{'FBW'[dc]}(stage={ds}, mb={mb}) (rule: local order)")
    return None


def _check_complete(schedule: Schedule, counts: list[bytearray]) -> None:
    """Rule 2: every (layer group, microbatch) has one F and one BW, or one B and one W.
    The first incomplete one in (layer group, microbatch) order is found by a byte scan."""
    pl = schedule.placement
    m = schedule.num_microbatches
    n = len(counts[_F])
    code = 0
    for shift, table in enumerate(counts):  # each byte 0/1, so the shifted sums stay per byte
        code |= int.from_bytes(table, "little") << shift
    first = code.to_bytes(n, "little").translate(_INCOMPLETE).find(1)
    if first < 0:
        return
    s, j = divmod(first, m)
    if not counts[_F][first]:
        raise ScheduleError(f"missing F(stage={s}, mb={j}) on rank {pl.rank_of(s)} (rule: every F runs once)")
    has_b, has_w = counts[_B][first], counts[_W][first]
    miss = "B and W (or BW)" if not (has_b or has_w) else ("W" if has_b else "B")
    raise ScheduleError(
        f"missing {miss} for (stage={s}, mb={j}) on rank {pl.rank_of(s)} "
        f"(rule: one BW, or one B and one W)"
    )


def _check_overlap(schedule: Schedule) -> None:
    """Rule 4: each overlapped pair is an F directly followed by its backward among the
    compute ops of the F's rank."""
    pairs = overlap_pairs(schedule)
    if not pairs:
        return
    pl = schedule.placement
    seen = set()
    for r, lst in enumerate(schedule.ranks):
        comp = [o for o in lst if o.kind.is_compute]
        for a, b in zip(comp, comp[1:]):
            if a.kind is OpKind.F and b.kind.is_backward and pairs.get((a.stage, a.microbatch)) == (b.stage,
                                                                                                    b.microbatch):
                seen.add((a.stage, a.microbatch))
    for (fs, fj), (bs, bj) in pairs.items():
        if (fs, fj) not in seen:
            raise ScheduleError(
                f"overlapped pair F(stage={fs}, mb={fj}) & backward(stage={bs}, mb={bj}) on rank "
                f"{pl.rank_of(fs) if 0 <= fs < pl.num_stages else '?'}: the backward must directly follow the F "
                f"among the rank's compute ops (rule: overlapped pairs)")
