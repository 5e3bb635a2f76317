"""Validator: reject a malformed schedule, naming the first bad op and the rule.

Rules checked, in order:
1. shape: one op list per rank; each op's stage, microbatch, rank and chunk agree
   with the placement ("placement consistent");
2. completeness: every (layer group, microbatch) has exactly one F and either one BW
   or one B and one W;
3. local order: on each rank an op comes after the ops it depends on that share its rank;
4. deadlock freedom: cross-rank dependencies can be satisfied (no cycle).
"""

from __future__ import annotations

from collections import Counter

from ..errors import ScheduleError
from ..ir import OpKind, Schedule
from .timing import completion_key, dependencies, run_list_schedule


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks a rule; return None if valid."""
    pl = schedule.placement
    p, S, m = pl.num_ranks, pl.num_stages, schedule.num_microbatches
    if m < 1:
        raise ScheduleError(f"schedule has {m} microbatches; need at least 1")
    if len(schedule.ranks) != p:
        raise ScheduleError(f"schedule has {len(schedule.ranks)} op lists but the placement has {p} ranks")

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
                key = (kind, stage, j)
                c = counts[key] = counts[key] + 1
                if c > 1:
                    bad = "duplicate op (rule: each op runs exactly once)"
                elif kind is OpKind.BW and (counts[(OpKind.B, stage, j)] or counts[(OpKind.W, stage, j)]):
                    bad = "BW together with B/W for the same layer group and microbatch"
                elif kind in (OpKind.B, OpKind.W) and counts[(OpKind.BW, stage, j)]:
                    bad = "B/W together with BW for the same layer group and microbatch"
            if bad:
                raise ScheduleError(f"rank {r}, position {i}: {op}: {bad}")

    for s in range(S):
        for j in range(m):
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

    run_list_schedule(schedule, lambda o: 1.0, 0.0)
