"""EventColumns.serial (each rank's ops in time order, each lasting a positive time):
the timing pass sets it only when it holds, and the metrics it shortens would be wrong
if it were set blindly."""

from __future__ import annotations

from array import array

from pipeoffload.costs import Costs, MemoryDeltas, parse_memory
from pipeoffload.passes.timing import simulate
from pipeoffload.schedules import generate
from pipeoffload.timeline import EventColumns, Timeline


def _metrics(tl: Timeline) -> tuple:
    return tl.summary(), tl.peak_memory(), tl.spans()


def _general(tl: Timeline) -> Timeline:
    """The same timeline as a plain event list (the metrics' general path; reading
    ``tl.events`` turns ``tl`` into such a list too)."""
    return Timeline(num_ranks=tl.num_ranks, events=list(tl.events), name=tl.name,
                    num_microbatches=tl.num_microbatches, chunks=tl.chunks)


def test_set_for_ordinary_costs_and_same_metrics() -> None:
    for name in ("1f1b", "zb-v", "zb-h1"):
        for costs in (Costs(), Costs(F=1.0, B=1.5, W=0.5, comm=0.1)):
            tl = simulate(generate(name, 4, 9), costs, parse_memory("F=2,B=-0.5,W=-1.5"))
            assert tl._columns is not None and tl._columns.serial
            assert _metrics(tl) == _metrics(_general(tl))


def test_not_set_when_a_duration_vanishes_next_to_a_time() -> None:
    """A backward of 1 after a forward of 1e17 ends where it starts (1 is below the unit
    in the last place): the timing pass does not call those columns serial."""
    tl = simulate(generate("1f1b", 2, 3), Costs(F=1e17, B=1.0, W=1.0), MemoryDeltas())
    cols = tl._columns
    assert cols is not None and not cols.serial
    assert any(a == b for st, en in zip(cols.start, cols.end) for a, b in zip(st, en))
    assert _metrics(tl) == _metrics(_general(tl))


def test_set_blindly_the_peak_would_be_wrong() -> None:
    """An op allocating and one freeing, both at [5, 5]: the sweep frees first (peak 0),
    the running sum that serial columns allow would say 1."""
    sched = generate("1f1b", 1, 1)
    ops = [list(sched.ranks[0])]  # F then BW

    def timeline(serial: bool) -> Timeline:
        cols = EventColumns(ops, [array("d", [5.0, 5.0])], [array("d", [5.0, 5.0])], [array("d", [1.0, -1.0])],
                            array("l", [0, 0]), serial=serial)
        return Timeline.from_columns(1, cols, name="t", num_microbatches=1, chunks=1)

    assert timeline(False).peak_memory() == [0.0] == _general(timeline(False)).peak_memory()
    assert timeline(True).peak_memory() == [1.0]
