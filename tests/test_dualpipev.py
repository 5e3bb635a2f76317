"""DualPipeV (schedules/dualpipev.py), pure: valid and deadlock-free with its overlapped
pairs run as one op, DeepSeek's published bubble and peak on a grid, the m >= 2p rule,
offload in both windows. (Its order against torch's own ScheduleDualPipeV, and its CSV,
are in tests/test_interop.py; the runtime's gradients in tests/test_runtime.py.)"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.costs import Costs, MemoryDeltas
from pipeoffload.errors import ParameterError, ScheduleError
from pipeoffload.ir import OVERLAP, OpKind, overlap_pairs, without_overlap
from pipeoffload.passes.comm import insert_comm
from pipeoffload.passes.offload import plan_offload
from pipeoffload.passes.timing import overlapped_positions, prove_deadlock_free, run_list_schedule, simulate
from pipeoffload.passes.validate import validate
from pipeoffload.schedules import generate

from helpers import assert_imports_no_torch

GRID = [(p, m) for p in range(1, 9) for m in sorted({2 * p, 2 * p + 1, 3 * p, 4 * p + 3})]


def published_bubble(p: int, f: float, b: float, w: float) -> float:
    """deepseek-ai/DualPipe README, DualPipeV row: (PP/2 − 1)(F&B + B − 3W), PP = 2p stages,
    per-chunk F, full backward B (ours: b + w), W; F&B run one after the other (torch)."""
    full = b + w
    return (p - 1) * ((f + full) + full - 3 * w)


def published_peak_chunks(p: int) -> int:
    """The same row's activation per device: PP + 1 chunk activations."""
    return 2 * p + 1


def bubble(p: int, m: int, f: float, b: float, w: float) -> tuple[float, list[float]]:
    """The busiest rank's idle time within its span, and the per-rank peaks in chunk units,
    at per-chunk costs f, b, w (per-rank costs 2f, 2b, 2w: two chunks per rank)."""
    tl = simulate(generate("dualpipev", p=p, m=m), Costs(F=2 * f, B=2 * b, W=2 * w), MemoryDeltas())
    return max(tl.spans()) - m * 2 * (f + b + w), [2 * x for x in tl.peak_memory()]


@pytest.mark.parametrize("p,m", GRID)
def test_valid_deadlock_free_and_every_pair_one_op(p, m):
    s = generate("dualpipev", p=p, m=m)  # validates: pairs adjacent, no deadlock with pairs run as one op
    pairs = overlap_pairs(s)
    assert len(pairs) == len(s.params[OVERLAP])
    # per rank r: (m - 2p + r + 1) main steps of two pairs, less the last rank's first, plus p - r - 1
    assert len(pairs) == sum(2 * (m - 2 * p + r + 1) - (r == p - 1) + (p - r - 1) for r in range(p))
    prog = insert_comm(s)  # proves the send/receive order deadlock-free
    one_op = overlapped_positions(prog, prog.ranks)
    assert len(one_op) == len(pairs)
    for r, i in one_op:
        f, bw = prog.ranks[r][i], prog.ranks[r][i + 1]
        assert f.kind is OpKind.F and bw.kind is OpKind.BW and f.microbatch != bw.microbatch
        assert {f.chunk, bw.chunk} == {0, 1}  # one chunk's forward with the other's backward


@pytest.mark.parametrize("p,m", GRID)
def test_published_bubble_and_peak_with_equal_costs(p, m):
    got, peaks = bubble(p, m, 1.0, 1.0, 1.0)
    assert got == pytest.approx(published_bubble(p, 1.0, 1.0, 1.0), abs=1e-9)
    assert peaks == [pytest.approx(published_peak_chunks(p))] * p


@given(p=st.integers(1, 8), extra=st.integers(0, 12), f=st.floats(0.25, 3), b=st.floats(0.25, 3),
       w=st.floats(0.1, 3))
def test_bubble_at_most_published_when_the_backward_dominates(p, extra, f, b, w):
    # The published formula assumes a backward at least as long as the forward and the
    # W part (F <= B, W <= B, per chunk); there our bubble never exceeds it.
    b = max(b, f, w)
    got, peaks = bubble(p, 2 * p + extra, f, b, w)
    assert got <= published_bubble(p, f, b, w) + 1e-9
    assert max(peaks) == pytest.approx(published_peak_chunks(p))


def test_a_pair_waits_for_both_inputs():
    # The timing pass runs a pair as one op: its F starts no earlier than the inputs of
    # its backward are in, even where the F alone could start earlier.
    s = generate("dualpipev", p=3, m=8)
    tl = simulate(s, Costs(F=1, B=4, W=1, comm=0.5))
    # the backward's completion key: B and BW both as "B"
    start = {(OpKind.BW if e.op.kind is OpKind.B else e.op.kind, e.op.stage, e.op.microbatch): e
             for e in tl.compute_events()}
    for (fs, fj), (bs, bj) in overlap_pairs(s).items():
        fe, be = start[(OpKind.F, fs, fj)], start[(OpKind.BW, bs, bj)]
        assert be.start == pytest.approx(fe.end)  # back to back
        src = (OpKind.BW, bs + 1, bj) if bs + 1 < s.num_stages else (OpKind.F, bs, bj)
        lat = 0.5 if s.placement.rank_of(src[1]) != s.placement.rank_of(bs) else 0.0
        assert fe.start >= start[src].end + lat - 1e-9


@pytest.mark.parametrize("p,m,bad", [(2, 3, "m"), (4, 7, "m"), (1, 1, "m")])
def test_too_few_microbatches_names_m(p, m, bad):
    with pytest.raises(ParameterError, match=r"m >= %d" % (2 * p)) as e:
        generate("dualpipev", p=p, m=m)
    assert e.value.param == bad


def test_other_bad_parameters_are_named():
    with pytest.raises(ParameterError) as e:
        generate("dualpipev", p=2, m=4, v=3)
    assert e.value.param == "v"
    with pytest.raises(ParameterError) as e:
        generate("dualpipev", p=2, m=4, g=1)
    assert e.value.param == "g"


def test_validate_rejects_a_pair_that_is_not_adjacent():
    s = generate("dualpipev", p=2, m=4)
    (fs, fj), (bs, bj) = next(iter(overlap_pairs(s).items()))
    # the same F named with another backward (the later entry wins): not the op after it
    bad = dataclasses.replace(s, params={**s.params, OVERLAP: s.params[OVERLAP] + ((fs, fj, bs, (bj + 1) % 4),)})
    with pytest.raises(ScheduleError, match="overlapped pair"):
        validate(bad)


@pytest.mark.parametrize("stash", [False, True])
def test_offload_in_both_windows(stash):
    s = generate("dualpipev", p=4, m=10)
    res = plan_offload(s, offload_chunks=2, stash=stash, on_infeasible="skip")
    base = simulate(s).peak_memory()
    assert max(res.peak) < max(base)
    windows = {o.kind.window for o in res.schedule.ops() if o.kind.is_transfer}
    assert windows == ({"activation", "stash"} if stash else {"activation"})
    insert_comm(res.schedule)  # the program with transfers stays deadlock-free


def test_imports_no_torch():
    assert_imports_no_torch("pipeoffload.schedules.dualpipev", then="from pipeoffload.schedules import generate\n"
                            "generate('dualpipev', p=3, m=6)")


def test_without_overlap_runs_each_half_alone():
    # the runtime's default program: each half with its own receive and send, no pair as one op
    s = generate("dualpipev", p=3, m=6)
    plain = without_overlap(s)
    assert plain.ranks == s.ranks and OVERLAP not in plain.params and OVERLAP in s.params
    assert not overlapped_positions(plain, insert_comm(plain).ranks)
    assert without_overlap(plain) is plain


def _with_pairs(name: str, p: int, m: int, keep) -> object:
    """``name``'s schedule with the adjacent F→backward pairs ``keep`` selects declared overlapped."""
    s = generate(name, p=p, m=m)
    adjacent = [(a.stage, a.microbatch, b.stage, b.microbatch) for lst in s.ranks for a, b in zip(lst, lst[1:])
                if a.kind is OpKind.F and b.kind.is_backward]
    return dataclasses.replace(s, params={**s.params, OVERLAP: tuple(x for x in adjacent if keep())})


def test_a_pair_that_waits_on_its_own_forward_through_another_rank_deadlocks():
    # GPipe's last F and first B on a rank before the last: the B's gradient needs the next
    # rank's forward of that same F's output, so the pair, run as one op, waits on itself
    t = _with_pairs("gpipe", 3, 4, lambda: True)
    with pytest.raises(ScheduleError, match="deadlock"):
        prove_deadlock_free(t)
    with pytest.raises(ScheduleError, match="deadlock"):
        run_list_schedule(t, lambda op: 1.0, 0.0)


@given(name=st.sampled_from(["gpipe", "1f1b", "dualpipev"]), p=st.integers(2, 4), extra=st.integers(0, 4),
       seed=st.integers(0, 10**6))
@settings(deadline=None)
def test_deadlock_proof_with_pairs_agrees_with_the_timing_pass(name, p, extra, seed):
    """The proof without timing (pairs placed as one op) raises exactly when timing the
    same schedule does, for random choices of which adjacent F→backward pairs overlap
    (GPipe's choices deadlock or not, DualPipeV's and 1F1B's run)."""
    import random

    rng = random.Random(seed)
    t = _with_pairs(name, p, 2 * p + extra, lambda: rng.random() < 0.5)

    def fails(f):
        try:
            f()
        except ScheduleError:
            return True
        return False

    assert fails(lambda: prove_deadlock_free(t)) == fails(lambda: run_list_schedule(t, lambda op: 1.0, 0.0))
