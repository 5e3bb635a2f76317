"""The grid lowering of a V building block (pipeoffload.schedules.v_grid_lowering): valid
schedules for many p and m (m < p and m < 2p included), the block's peak kept, a hand-checked
case, its real-cost timing equal to the simulator's, and clear errors for bad input."""

from __future__ import annotations

import pytest

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError
from pipeoffload.ir import OpKind, Placement, build_schedule
from pipeoffload.passes.timing import simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules.building_block import BuildingBlock, steady_peak
from pipeoffload.schedules.v_auto import block_family
from pipeoffload.schedules.v_grid_lowering import grid_rows, lower_block, lower_grid, time_grid
from pipeoffload.schedules.vshape import v_half_block, v_min_block

#: One chunk activation per F under the V placement (each of a rank's two chunks gets F/2).
UNIT = MemoryDeltas(F=2.0, B=0.0, W=-2.0)


def _spread(p: int, k: int = 6) -> list[BuildingBlock]:
    """``k`` blocks of the family spread over its peaks, all within ``2p`` (the rules' bound)."""
    fam = [b for b, pk in block_family(p) if pk <= 2 * p]
    return [fam[i * (len(fam) - 1) // (k - 1)] for i in range(k)]


def _schedule(block: BuildingBlock, m: int, orders):
    p = block.placement.num_ranks
    return build_schedule("grid", m, Placement.vshape(p), orders, p=p, m=m, v=2)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("m_of_p", [lambda p: 1, lambda p: p - 1, lambda p: p, lambda p: p + 1,
                                    lambda p: 2 * p - 1, lambda p: 2 * p, lambda p: 3 * p],
                         ids=["1", "p-1", "p", "p+1", "2p-1", "2p", "3p"])
def test_valid_and_within_the_blocks_peak(p, m_of_p):
    m = max(1, m_of_p(p))
    lowered = 0
    for block in _spread(p):
        orders = lower_block(block, m)
        if orders is None:
            continue
        lowered += 1
        s = _schedule(block, m, orders)
        validate(s)  # every op once, local order, no deadlock
        peak = max(simulate(s, Costs(), UNIT).peak_memory())
        assert peak <= max(steady_peak(block)) + 1e-9
        assert peak <= min(2 * p, 2 * m) + 1e-9
    # most blocks of the family lower; a rule that refused everything would pass the loop above
    assert lowered >= 3, f"only {lowered} of 6 blocks lowered for p={p} m={m}"


@pytest.mark.parametrize("p, m", [(4, 2), (4, 4), (4, 9), (5, 3)])
def test_v_min_and_v_half_blocks_lower(p, m):
    for block in (v_min_block(p), v_half_block(p)):
        orders = lower_block(block, m)
        assert orders is not None
        s = _schedule(block, m, orders)
        validate(s)
        assert max(simulate(s, Costs(), UNIT).peak_memory()) <= max(steady_peak(block)) + 1e-9


def test_one_microbatch_is_the_tight_round_trip():
    # p = 2: rank 0 holds layer groups 0 and 3, rank 1 holds 1 and 2. One microbatch goes
    # F0 (rank 0) → F1, F2 (rank 1) → F3, B3, W3 (rank 0) → B2 (rank 1) at slot 5 with B1 and
    # the W's after it, then B0 on rank 0: every op at its earliest slot.
    block = block_family(2)[0][0]
    assert grid_rows(lower_grid(block, 1)) == ["F  fBW bw", " Ff  BbWw"]
    assert lower_block(block, 1) == [
        [(OpKind.F, 0, 0), (OpKind.F, 3, 0), (OpKind.B, 3, 0), (OpKind.W, 3, 0), (OpKind.B, 0, 0), (OpKind.W, 0, 0)],
        [(OpKind.F, 1, 0), (OpKind.F, 2, 0), (OpKind.B, 2, 0), (OpKind.B, 1, 0), (OpKind.W, 2, 0), (OpKind.W, 1, 0)],
    ]


def test_two_microbatches_hand_checked():
    # p = 2, m = 2 (fewer than the 2p the warm-up rules are written for): rank 0 runs both
    # F's, then the turn-around f B f B, then b W b W w w; rank 1 interleaves F f F f and then
    # B b B b W w W w. Peak: all four chunk activations (2m) are alive on both ranks.
    block = block_family(2)[0][0]
    rows = grid_rows(lower_grid(block, 2))
    assert rows == ["FF fBfBbWbWww", " FfFfBbBbWwWw"]
    s = _schedule(block, 2, lower_block(block, 2))
    validate(s)
    assert max(simulate(s, Costs(), UNIT).peak_memory()) == 4


@pytest.mark.parametrize("costs", [Costs(F=1, B=1, W=1), Costs(F=1, B=2, W=1, comm=0.1),
                                   Costs(F=1, B=1.5, W=0.6, comm=0.1)])
def test_time_grid_matches_the_simulator(costs):
    p, m = 4, 6
    memory = MemoryDeltas(F=2.0, B=-1.0, W=-1.0)
    pl = Placement.vshape(p)
    for block in _spread(p, 4):
        grid = lower_grid(block, m)
        if grid is None:
            continue
        span, makespan, peak = time_grid(grid, costs.duration_table(pl), costs.comm, memory.delta_table(pl))
        tl = simulate(_schedule(block, m, lower_block(block, m)), costs, memory)
        assert span == pytest.approx(max(tl.spans()))
        assert makespan == pytest.approx(tl.makespan)
        assert peak == pytest.approx(max(tl.peak_memory()))


def test_a_block_above_2p_is_refused():
    p = 3
    over = [b for b, pk in block_family(p) if pk > 2 * p]
    assert over
    assert lower_block(over[0], 3 * p) is None


def test_bad_input():
    block = block_family(3)[0][0]
    with pytest.raises(ParameterError, match="m"):
        lower_block(block, 0)
    # a valid block, but for the 1F1B placement (one layer group per rank)
    loop = BuildingBlock(Placement.loop(2), 6, {(OpKind.F, 0): 0, (OpKind.F, 1): 1, (OpKind.B, 1): 2,
                                                (OpKind.W, 1): 3, (OpKind.B, 0): 3, (OpKind.W, 0): 4})
    with pytest.raises(ParameterError, match="block"):
        lower_block(loop, 2)
