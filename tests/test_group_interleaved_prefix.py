"""group-interleaved's order at m1 is its order at m2 > m1 with the microbatches >= m1
dropped, rank by rank (``classic._gis_rank``: each op's slot depends on its block index,
not on m, and m only marks ops past it as absent). The planner times a schedule at two
microbatch counts (``planner.simulate.simulated_microbatches``); this is the property a
derivation of the smaller run from the larger one would rest on, kept true here."""

from __future__ import annotations

from itertools import compress

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.schedules import ScheduleSpec, build


def _drop_from(sched: object, m1: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Per rank: (kinds, layer groups, microbatches) of ``sched``'s ops on microbatches < m1."""
    out = []
    for kd, stg, mb in zip(sched._compact.kinds, sched._compact.stages, sched._compact.mbs):  # type: ignore[attr-defined]
        keep = [j < m1 for j in mb]
        out.append((list(compress(kd, keep)), list(compress(stg, keep)), list(compress(mb, keep))))
    return out


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 10), v=st.integers(1, 4), data=st.data())
def test_smaller_m_is_the_larger_order_filtered(p: int, v: int, data: st.DataObject) -> None:
    """Op for op, on every rank, for every admissible group size and m1 < m2."""
    g = data.draw(st.integers((p + 1) // 2, p), label="g")
    m1 = data.draw(st.integers(1, 4 * p + 3), label="m1")
    m2 = data.draw(st.integers(m1 + 1, m1 + 3 * g * v + 5), label="m2")
    small = build(ScheduleSpec("group-interleaved", p, m1, v=v, g=g), check=False)
    large = build(ScheduleSpec("group-interleaved", p, m2, v=v, g=g), check=False)
    want = [(list(k), list(s), list(j)) for k, s, j in
            zip(small._compact.kinds, small._compact.stages, small._compact.mbs)]
    assert _drop_from(large, m1) == want


def test_filter_drops_something() -> None:
    """The check is not vacuous: the larger order has ops the filter removes, on every rank."""
    large = build(ScheduleSpec("group-interleaved", 4, 12, v=2, g=2), check=False)
    kept = _drop_from(large, 8)
    assert all(len(k[0]) < len(mb) for k, mb in zip(kept, large._compact.mbs))
