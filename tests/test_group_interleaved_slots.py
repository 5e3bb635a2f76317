"""group-interleaved writes each rank's order from the slot arithmetic of the reference
block (``classic._gis_rank``: forward ``x`` then backward and W ``x − Δ``) instead of
sorting every op's slot: the same orders, op for op, as the reference's sort (kept here)."""

from __future__ import annotations

from math import gcd

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.ir import OpKind, Placement, build_schedule
from pipeoffload.schedules import ScheduleSpec
from pipeoffload.schedules.classic import group_interleaved

F, B, W = OpKind.F, OpKind.B, OpKind.W


def _sorted_slots(p: int, m: int, v: int, g: int):
    """The generator as it was: every op's slot in the reference's cyclic block of 3gv
    slots, repeated ⌈m/g⌉ times, sorted per rank."""
    gmin = (p + 1) // 2
    k = -(-gmin // g)
    period = 3 * g * v
    shift_every = v // gcd(v, k)
    per_rank = []
    for i in range(p):
        first_b = 3 * k * g * (v - 1) + 3 * g * ((v - 1) // shift_every) + i + 3 * (p - 1 - i) + 1
        slots = []
        for rep in range(-(-m // g)):
            base = rep * period
            for c in range(v):
                off = 3 * k * g * c + 3 * g * (c // shift_every)
                for jj in range(g):
                    j = rep * g + jj
                    if j >= m:
                        continue
                    f_slot = base + off + 3 * jj + i
                    b_slot = base + first_b + off + 3 * jj
                    slots.append((f_slot, 0, F, c * p + i, j))
                    bs = (v - 1 - c) * p + i
                    slots.append((b_slot, 1, B, bs, j))
                    slots.append((b_slot + 1, 2, W, bs, j))
        slots.sort()
        per_rank.append([(kind, s, j) for _, _, kind, s, j in slots])
    return build_schedule("group-interleaved", m, Placement.loop(p, v), per_rank, p=p, m=m, v=v, g=g)


@settings(deadline=None, max_examples=300)
@given(p=st.integers(1, 20), v=st.integers(1, 5), data=st.data())
def test_slot_arithmetic_is_the_sorted_slots(p: int, v: int, data) -> None:
    """The same schedule (every rank's ops, in order, and the params) as sorting the
    slots, for every valid group size and m from 1 past a few groups; held as compact
    arrays (no Op made)."""
    g = data.draw(st.integers((p + 1) // 2, p))
    m = data.draw(st.integers(1, 4 * p + 3))
    got = group_interleaved(ScheduleSpec("group-interleaved", p, m, v=v, g=g))
    assert got.compact is not None
    want = _sorted_slots(p, m, v, g)
    assert got.params == want.params and got.placement == want.placement
    assert got.ranks == want.ranks


def test_planner_sizes() -> None:
    """Sizes the planner asks for (p = 16 and 64, m a little over p, every g)."""
    for p, m, v in ((16, 37, 3), (64, 130, 2)):
        for g in ((p + 1) // 2, p - 3, p):
            got = group_interleaved(ScheduleSpec("group-interleaved", p, m, v=v, g=g))
            assert got.ranks == _sorted_slots(p, m, v, g).ranks
