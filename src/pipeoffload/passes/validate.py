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
"""

from __future__ import annotations

from collections import Counter

from ..errors import ScheduleError
from ..ir import OpKind, Schedule, overlap_pairs
from .timing import completion_key, dependencies, run_list_schedule


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks a rule; return None if valid.

    Guarantees: the rules are checked in the order of the module docstring, and the
    error names the first bad op (rank and position) or the missing op, and the rule.
    """
    pl = schedule.placement
    m = schedule.num_microbatches
    if m < 1:
        raise ScheduleError(f"schedule has {m} microbatches; need at least 1")
    if len(schedule.ranks) != pl.num_ranks:
        raise ScheduleError(f"schedule has {len(schedule.ranks)} op lists but the placement has {pl.num_ranks} ranks")
    counts = _check_shape(schedule)
    _check_complete(schedule, counts)
    _check_local_order(schedule)
    _check_overlap(schedule)
    run_list_schedule(schedule, lambda o: 1.0, 0.0)


def _check_shape(schedule: Schedule) -> Counter:
    """Rule 1, and no op twice: each compute op agrees with the placement. Returns how
    often each op key occurs."""
    pl = schedule.placement
    S, m = pl.num_stages, schedule.num_microbatches
    counts: Counter = Counter()
    rank_of, chunk_of = pl.stage_to_rank, pl.chunk_of
    for r, lst in enumerate(schedule.ranks):
        for i, op in enumerate(lst):
            kind = op.kind
            if not kind.is_compute:
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
            elif op.chunk != chunk_of(stage):
                bad = (f"chunk {op.chunk} but layer group {stage} is chunk "
                       f"{chunk_of(stage)} of rank {r} (rule: placement consistent)")
            else:
                bad = _count(counts, kind, stage, j)
            if bad:
                raise ScheduleError(f"rank {r}, position {i}: {op}: {bad}")
    return counts


def _count(counts: Counter, kind: OpKind, stage: int, j: int) -> str | None:
    """Count op ``(kind, stage, j)``; what is wrong when it repeats or mixes BW with B/W."""
    key = (kind, stage, j)
    c = counts[key] = counts[key] + 1
    if c > 1:
        return "duplicate op (rule: each op runs exactly once)"
    if kind is OpKind.BW and (counts[(OpKind.B, stage, j)] or counts[(OpKind.W, stage, j)]):
        return "BW together with B/W for the same layer group and microbatch"
    if kind in (OpKind.B, OpKind.W) and counts[(OpKind.BW, stage, j)]:
        return "B/W together with BW for the same layer group and microbatch"
    return None


def _check_complete(schedule: Schedule, counts: Counter) -> None:
    """Rule 2: every (layer group, microbatch) has one F and one BW, or one B and one W."""
    pl = schedule.placement
    for s in range(pl.num_stages):
        for j in range(schedule.num_microbatches):
            if not counts[(OpKind.F, s, j)]:
                raise ScheduleError(f"missing F(stage={s}, mb={j}) on rank {pl.rank_of(s)} (rule: every F runs once)")
            has_bw = counts[(OpKind.BW, s, j)]
            has_b, has_w = counts[(OpKind.B, s, j)], counts[(OpKind.W, s, j)]
            if not has_bw and not (has_b and has_w):
                miss = "B and W (or BW)" if not (has_b or has_w) else ("W" if has_b else "B")
                raise ScheduleError(
                    f"missing {miss} for (stage={s}, mb={j}) on rank {pl.rank_of(s)} "
                    f"(rule: one BW, or one B and one W)"
                )


def _check_local_order(schedule: Schedule) -> None:
    """Rule 3: on each rank an op comes after its dependencies that share its rank."""
    pl = schedule.placement
    S = pl.num_stages
    for r, lst in enumerate(schedule.ranks):
        done: set = set()
        for i, op in enumerate(lst):
            if not op.kind.is_compute:
                continue
            for dk in dependencies(op, S):
                stage = dk[1]
                if pl.rank_of(stage) == r and dk not in done:
                    raise ScheduleError(
                        f"rank {r}, position {i}: {op} comes before its same-rank dependency "
                        f"{dk[0]}(stage={dk[1]}, mb={dk[2]}) (rule: local order)"
                    )
            done.add(completion_key(op))


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
