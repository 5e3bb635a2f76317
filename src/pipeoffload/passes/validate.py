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
    for r, lst in enumerate(schedule.ranks):
        for i, op in enumerate(lst):
            where = f"rank {r}, position {i}: {op}"
            if not op.kind.is_compute:
                continue
            if not 0 <= op.stage < S:
                raise ScheduleError(f"{where}: stage out of range 0..{S - 1} (rule: placement consistent)")
            if not 0 <= op.microbatch < m:
                raise ScheduleError(f"{where}: microbatch out of range 0..{m - 1}")
            if op.rank != r or pl.rank_of(op.stage) != r:
                raise ScheduleError(
                    f"{where}: layer group {op.stage} is placed on rank {pl.rank_of(op.stage)}, "
                    f"not rank {r} (rule: placement consistent)"
                )
            if op.chunk != pl.chunk_of(op.stage):
                raise ScheduleError(
                    f"{where}: chunk {op.chunk} but layer group {op.stage} is chunk "
                    f"{pl.chunk_of(op.stage)} of rank {r} (rule: placement consistent)"
                )
            c = counts[op.key] = counts[op.key] + 1
            if c > 1:
                raise ScheduleError(f"{where}: duplicate op (rule: each op runs exactly once)")
            k, s, j = op.key
            if k is OpKind.BW and (counts[(OpKind.B, s, j)] or counts[(OpKind.W, s, j)]):
                raise ScheduleError(f"{where}: BW together with B/W for the same layer group and microbatch")
            if k in (OpKind.B, OpKind.W) and counts[(OpKind.BW, s, j)]:
                raise ScheduleError(f"{where}: B/W together with BW for the same layer group and microbatch")

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
