"""Exchange with PyTorch torch.distributed.pipelining: action strings and schedule CSV."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.cli import main as cli_main
from pipeoffload.errors import ParameterError
from pipeoffload.interop.torch_csv import (
    action_string,
    from_actions,
    parse_action,
    read_csv,
    to_actions,
    write_csv,
)
from pipeoffload.ir import OVERLAP, Op, OpKind, Placement, build_schedule
from pipeoffload.schedules import generate

from helpers import assert_imports_no_torch, import_torch, torch_dualpipev_csv

torch_schedules = import_torch("torch.distributed.pipelining.schedules")
_Action = torch_schedules._Action

GRID = [(p, m) for p in (2, 4) for m in (p, 2 * p + 1)]
#: Schedules that need more microbatches than GRID's smallest (m >= 2p: DualPipeV): run at their minimum.
MIN_M = {"dualpipev": lambda p: 2 * p}


def grid_m(name: str, p: int, m: int) -> int:
    return max(m, MIN_M[name](p)) if name in MIN_M else m


# ----------------------------------------------------------------------------- action strings


@pytest.mark.parametrize(
    "kind, text",
    [(OpKind.F, "3F1"), (OpKind.B, "3I1"), (OpKind.W, "3W1"), (OpKind.BW, "3B1"),
     (OpKind.SEND_F, "3SEND_F1"), (OpKind.RECV_F, "3RECV_F1"), (OpKind.SEND_B, "3SEND_B1"),
     (OpKind.RECV_B, "3RECV_B1")],
)
def test_action_string_matches_torch_grammar(kind: OpKind, text: str) -> None:
    op = Op(kind, 3, 1, rank=1, chunk=1)
    assert action_string(op) == text
    assert parse_action(text) == (kind, 3, 1)
    assert parse_action(f"  {text} ") == (kind, 3, 1)
    # torch reads it back as the same action and writes the same string
    assert str(_Action.from_str(text)) == text


def test_our_b_is_torch_input_backward_and_bw_is_full_backward() -> None:
    C = torch_schedules._ComputationType
    assert _Action.from_str(action_string(Op(OpKind.B, 0, 0, 0, 0))).computation_type is C.BACKWARD_INPUT
    assert _Action.from_str(action_string(Op(OpKind.BW, 0, 0, 0, 0))).computation_type is C.FULL_BACKWARD


@settings(deadline=None)
@given(kind=st.sampled_from([OpKind.F, OpKind.B, OpKind.W, OpKind.BW, OpKind.SEND_F, OpKind.RECV_B]),
       stage=st.integers(0, 200), mb=st.integers(0, 5000))
def test_action_string_parse_round_trip(kind: OpKind, stage: int, mb: int) -> None:
    assert parse_action(action_string(Op(kind, stage, mb, 0, 0))) == (kind, stage, mb)


@pytest.mark.parametrize("text", ["", "F1", "0F", "0X1", "0F1x", "-1F0", "0 F 1", "1UNSHARD", "0f1"])
def test_parse_action_rejects_malformed(text: str) -> None:
    with pytest.raises(ParameterError, match="expected"):
        parse_action(text)


def test_offload_ops_have_no_torch_action() -> None:
    with pytest.raises(ParameterError, match="offload/reload"):
        action_string(Op(OpKind.OFFLOAD_START, 0, 0, 0, 0))


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("p, m", GRID)
def test_registry_round_trip(schedule_name: str, p: int, m: int, tmp_path: Path) -> None:
    m = grid_m(schedule_name, p, m)
    sched = generate(schedule_name, p=p, m=m)
    path = write_csv(sched, tmp_path / "s.csv")
    back = read_csv(path)
    assert back.placement == sched.placement  # same mapping *and* loop/v label
    assert back.num_microbatches == m
    assert back.ranks == sched.ranks
    assert back.params.get(OVERLAP) == sched.params.get(OVERLAP)  # overlapped pairs kept
    assert to_actions(back) == to_actions(sched)


@pytest.mark.parametrize("p, m", GRID)
def test_torch_accepts_exported_schedule(schedule_name: str, p: int, m: int, tmp_path: Path) -> None:
    from pipeoffload.interop.torch_actions import to_torch_actions

    m = grid_m(schedule_name, p, m)
    sched = generate(schedule_name, p=p, m=m)
    S = sched.num_stages
    actions = to_torch_actions(sched)
    mapping = torch_schedules._validate_schedule(actions, p, S, m)
    assert mapping == dict(enumerate(sched.placement.stage_to_rank))

    # torch's own CSV loader accepts the file and infers the same stage -> rank mapping ...
    loader = _bare(torch_schedules.PipelineScheduleMulti, p, m, S)
    loader._load_csv(str(write_csv(sched, tmp_path / "s.csv")))
    assert loader.stage_index_to_group_rank == mapping
    # ... and can lower it to a compute+comms schedule (it raises when sends/recvs cannot be ordered).
    lowered = torch_schedules._add_send_recv(loader.pipeline_order, mapping.__getitem__, S)
    n_comm = sum(1 for row in lowered.values() for a in row if not a.is_compute_op)
    cells = sum(len(r) for r in sched.ranks) - len(sched.params.get(OVERLAP, ()))  # a pair is one cell
    assert n_comm == sum(1 for row in lowered.values() for a in row) - cells


# ----------------------------------------------------------------------------- torch's schedules


def _bare(cls, p: int, m: int, num_stages: int):
    """A torch schedule object without stages or a process group: just the attributes its
    order computation and CSV methods read (torch 2.13's constructors set the same ones)."""
    obj = cls.__new__(cls)
    v = num_stages // p
    obj.pp_group_size = p
    obj._n_microbatches = m
    obj._num_stages = obj.num_stages = num_stages
    obj.n_local_stages = v
    obj._stages = []
    obj.number_of_rounds = max(1, m // p)
    obj.microbatches_per_round = m // obj.number_of_rounds
    obj.pipeline_order = {}
    return obj


def torch_order(cls, p: int, m: int, v: int) -> dict[int, list]:
    obj = _bare(cls, p, m, p * v)
    obj._stages = [None] * v  # LoopedBFS counts its local stages
    obj.pipeline_order = {r: obj._calculate_single_rank_operations(r) for r in range(p)}
    if cls is torch_schedules.ScheduleInterleavedZeroBubble:
        obj.pipeline_order = obj._add_bubbles_to_actions(p * v)
    return obj.pipeline_order


TORCH_CASES = [
    ("ScheduleLoopedBFS", 2, "loop"),
    ("ScheduleInterleaved1F1B", 2, "loop"),
    ("ScheduleInterleaved1F1B", 3, "loop"),
    ("ScheduleInterleavedZeroBubble", 2, "loop"),
    ("ScheduleZBVZeroBubble", 2, "v"),
    ("ScheduleDualPipeV", 2, "v"),
]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12)])
@pytest.mark.parametrize("cls_name, v, kind", TORCH_CASES)
def test_torch_schedule_csv_imports(cls_name: str, v: int, kind: str, p: int, m: int, tmp_path: Path) -> None:
    cls = getattr(torch_schedules, cls_name)
    order = torch_order(cls, p, m, v)
    path = tmp_path / "torch.csv"
    dumper = _bare(cls, p, m, p * v)
    dumper.pipeline_order = order
    torch_schedules.PipelineScheduleMulti._dump_csv(dumper, str(path))  # torch's own writer

    sched = read_csv(path, name=cls_name)
    assert sched.placement.kind == kind and sched.chunks == v and sched.num_microbatches == m
    # same actions in the same order, idle steps dropped; DualPipeV's OVERLAP_F_B cells
    # read as overlapped pairs and written back as such
    assert to_actions(sched) == [[str(a) for a in order[r] if a is not None] for r in range(p)]
    overlaps = sum(1 for row in order.values() for a in row if a is not None and a.sub_actions)
    assert len(sched.params.get(OVERLAP, ())) == overlaps
    again = read_csv(write_csv(sched, tmp_path / "ours.csv"))
    assert again.placement == sched.placement and again.ranks == sched.ranks


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_torch_compute_comms_csv(p: int, m: int, tmp_path: Path) -> None:
    """A lowered (compute+comms) torch CSV: comm actions are dropped by default and kept,
    with torch's peers, under keep_comm=True; then the export is torch's rows exactly."""
    order = torch_order(torch_schedules.ScheduleInterleaved1F1B, p, m, 2)
    mapping = torch_schedules._validate_schedule(order, p, 2 * p, m)
    lowered = torch_schedules._add_send_recv({r: [a for a in row if a] for r, row in order.items()},
                                             mapping.__getitem__, 2 * p)
    path = tmp_path / "comms.csv"
    dumper = _bare(torch_schedules.ScheduleInterleaved1F1B, p, m, 2 * p)
    dumper.pipeline_order_with_comms = lowered
    torch_schedules._PipelineScheduleRuntime._dump_csv(dumper, str(path), format="compute_comms")

    compute = read_csv(path)
    assert all(o.kind.is_compute for o in compute.ops())
    assert to_actions(compute) == [[str(a) for a in order[r] if a is not None] for r in range(p)]

    full = read_csv(path, keep_comm=True)
    assert to_actions(full) == [[str(a) for a in lowered[r]] for r in range(p)]
    for op in full.ops():
        if op.kind is OpKind.SEND_F:
            assert op.peer == mapping[op.stage + 1]
        elif op.kind is OpKind.RECV_F:
            assert op.peer == mapping[op.stage - 1]
        elif op.kind is OpKind.SEND_B:
            assert op.peer == mapping[op.stage - 1]
        elif op.kind is OpKind.RECV_B:
            assert op.peer == mapping[op.stage + 1]
    assert full.compute_only().ranks == compute.ranks


def test_from_torch_actions_matches_csv_path(tmp_path: Path) -> None:
    from pipeoffload.interop.torch_actions import from_torch_actions, to_torch_actions

    order = torch_order(torch_schedules.ScheduleZBVZeroBubble, 4, 8, 2)
    sched = from_torch_actions(order)
    assert sched.placement == Placement.vshape(4)
    assert {r: [str(a) for a in row] for r, row in to_torch_actions(sched).items()} == {
        r: [str(a) for a in row if a is not None] for r, row in order.items()
    }
    with pytest.raises(ParameterError, match="ranks must be 0..1"):
        from_torch_actions({0: order[0], 2: order[1]})


# ----------------------------------------------------------------------------- placements and options


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in.csv"
    path.write_text(text)
    return path


def test_custom_placement_is_inferred(tmp_path: Path) -> None:
    # layer group 0 on rank 1 and 1 on rank 0: neither loop nor V
    path = _write(tmp_path, "1F0,1B0\n0F0,0B0\n")
    sched = read_csv(path)
    assert sched.placement.kind == "custom" and sched.placement.stage_to_rank == (1, 0)
    assert sched.ranks[0][0] == Op(OpKind.F, 1, 0, 0, 0)


def test_idle_cells_bookkeeping_and_trailing_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path, "0F0,,None,0UNSHARD,1F0,1B0,0B0,0RESHARD\n\n\n")
    sched = read_csv(path)
    assert sched.num_ranks == 1 and sched.placement == Placement.loop(1, 2)
    assert [str(o.kind) for o in sched.ranks[0]] == ["F", "F", "BW", "BW"]


def test_explicit_placement_and_microbatches(tmp_path: Path) -> None:
    sched = generate("1f1b", p=2, m=3)
    path = write_csv(sched, tmp_path / "s.csv")
    assert read_csv(path, placement="loop").placement == sched.placement
    assert read_csv(path, placement=Placement.loop(2, 1)).ranks == sched.ranks
    assert read_csv(path, placement="custom").placement.kind == "custom"
    with pytest.raises(ParameterError, match="V placement|not a valid schedule"):
        read_csv(path, placement="v")  # stages 2, 3 of the V never run
    with pytest.raises(ParameterError, match="missing F"):
        read_csv(path, num_microbatches=4)  # microbatch 3 is never run
    with pytest.raises(ParameterError, match="need an integer >= 3"):
        read_csv(path, num_microbatches=2)
    with pytest.raises(ParameterError, match="placement: expected"):
        read_csv(path, placement="zigzag")
    with pytest.raises(ParameterError, match="placement has 3 ranks"):
        read_csv(path, placement=Placement.loop(3, 1))


def test_wrong_explicit_placement_names_cell(tmp_path: Path) -> None:
    path = write_csv(generate("interleaved-1f1b", p=2, m=2), tmp_path / "s.csv")
    with pytest.raises(ParameterError, match=r"row 1 \(rank 0\), column \d+: layer group 2 .* placement it is on rank 1"):
        read_csv(path, placement=Placement.custom([0, 1, 1, 0], 2))


def test_strict_export_rejects_offload_ops(tmp_path: Path) -> None:
    base = generate("1f1b", p=2, m=2)
    ranks = [list(r) for r in base.ranks]
    ranks[0].insert(1, Op(OpKind.OFFLOAD_START, 0, 0, 0, 0))
    ranks[0].insert(2, Op(OpKind.OFFLOAD_END, 0, 0, 0, 0))
    with_offload = base.with_ranks(ranks)
    assert to_actions(with_offload) == to_actions(base)  # skipped by default
    with pytest.raises(ParameterError, match=r"rank 0, position 1: OFFLOAD_START"):
        to_actions(with_offload, strict=True)
    with pytest.raises(ParameterError):
        write_csv(with_offload, tmp_path / "x.csv", strict=True)


def test_comm_op_on_wrong_rank_is_not_exported() -> None:
    base = generate("1f1b", p=2, m=1)
    ranks = [list(r) for r in base.ranks]
    ranks[1].insert(0, Op(OpKind.RECV_F, 0, 0, 1, 0, peer=0))  # torch would name stage 1 here
    with pytest.raises(ParameterError, match="does not hold"):
        to_actions(base.with_ranks(ranks))


# ----------------------------------------------------------------------------- malformed files


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("", r"no actions; expected one row of actions per rank"),
        ("\n\n", r"no actions"),
        ("0F0,0X0,0B0\n", r"row 1 \(rank 0\), column 2: cell '0X0' is not an action; expected"),
        ("0F0,0B0\n1F0,1F\n", r"row 2 \(rank 1\), column 2: cell '1F' is not an action"),
        ("0F0,1F0\n1B0,0B0\n", r"row 2 \(rank 1\), column 1: 1B0 runs layer group 1 on rank 1, but row 1, column 2"),
        ("0F0,0B0,0F0\n", r"column 3: 0F0 repeats row 1, column 1"),
        ("0F0,0B0\n,,\n1F0,1B0\n", r"row 2 \(rank 1\): no compute actions"),
        ("0F0,0B0\n\n2F0,2B0\n", r"row 2 \(rank 1\): no compute actions"),
        ("0F0,0B0\n2F0,2B0\n", r"layer group\(s\) 1 never appear"),
        ("0B0,0F0\n", r"rank 0 \(row 1, column 1\): .* comes before its same-rank dependency F\(stage=0, mb=0\)"),
        ("0F0\n", r"missing B and W \(or BW\)"),
        ("0F0,0I0,0B0\n", r"BW together with B/W"),
        ("(0F0;)OVERLAP_F_B,0B0\n", None),  # fine: sub-action list may end with ';'
        ("()OVERLAP_F_B,0F0,0B0\n", r"OVERLAP_F_B with no sub-actions"),
    ],
)
def test_malformed_csv(text: str, pattern: str | None, tmp_path: Path) -> None:
    path = _write(tmp_path, text)
    if pattern is None:
        read_csv(path)
        return
    with pytest.raises(ParameterError) as info:
        read_csv(path)
    msg = str(info.value)
    assert msg.startswith(f"path: {path}"), msg  # read_csv's argument; a CLI passes its flag
    assert re.search(pattern, msg), msg


def test_local_order_error_points_at_the_cell(tmp_path: Path) -> None:
    path = _write(tmp_path, ",,0B0,0F0\n")
    with pytest.raises(ParameterError, match=r"rank 0 \(row 1, column 3\): BW\(stage=0, mb=0"):
        read_csv(path)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="no such file"):
        read_csv(tmp_path / "nope.csv")
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ParameterError, match="cannot read as CSV"):
        read_csv(bad)
    with pytest.raises(ParameterError, match="^path: cannot write"):  # the argument; a CLI passes its flag
        write_csv(generate("1f1b", p=2, m=2), tmp_path / "no" / "dir" / "x.csv")


def test_from_actions_names_its_source() -> None:
    with pytest.raises(ParameterError, match=r"^schedule: actions, row 1 \(rank 0\), column 1: cell 'zz'"):
        from_actions([["zz"]])
    sched = from_actions([["0F0", None, "0B0"]], name="x")
    ref = build_schedule("x", 1, Placement.loop(1), [[(OpKind.F, 0, 0), (OpKind.BW, 0, 0)]])
    assert sched.name == "x" and sched.placement == ref.placement and sched.ranks == ref.ranks


# ----------------------------------------------------------------------------- purity and CLI


def test_pure_modules_do_not_import_torch() -> None:
    assert_imports_no_torch("pipeoffload.interop", "pipeoffload.interop.torch_csv", "pipeoffload.interop.torch_actions")


def test_simulate_writes_csv_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "x.csv"
    assert cli_main(["simulate", "interleaved-1f1b", "-p", "4", "-m", "8", "--csv", str(out)]) == 0
    sched = read_csv(out)
    ref = generate("interleaved-1f1b", p=4, m=8)
    assert sched.placement == ref.placement and sched.ranks == ref.ranks
    assert len(out.read_text().splitlines()) == 4

    assert cli_main(["simulate", "1f1b", "-p", "2", "-m", "2", "--csv", str(tmp_path / "no" / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--csv: cannot write" in err[0]


# ----------------------------------------------------------------------------- DualPipeV and the whole grammar


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_dualpipev_is_torchs_order(p: int) -> None:
    # our generator against torch 2.13's own ScheduleDualPipeV, action for action
    for m in (2 * p, 2 * p + 1, 3 * p + 2):
        order = torch_order(torch_schedules.ScheduleDualPipeV, p, m, 2)
        assert to_actions(generate("dualpipev", p=p, m=m)) == \
            [[str(a) for a in order[r] if a is not None] for r in range(p)], (p, m)


@pytest.mark.parametrize("p, m", [(2, 4), (2, 5), (3, 7)])
def test_torch_dualpipev_csv_with_every_action_round_trips(p: int, m: int, tmp_path: Path) -> None:
    path = torch_dualpipev_csv(p, m, tmp_path / "torch.csv")
    text = path.read_text()
    for action in ("OVERLAP_F_B", "UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_B", "I", "W"):
        assert action in text, action  # the file really uses the whole grammar
    ours = generate("dualpipev", p=p, m=m)
    back = read_csv(path)  # placement inferred from the rows
    assert back.placement == Placement.vshape(p) and back.placement.kind == "v"
    assert back.ranks == ours.ranks and set(back.params[OVERLAP]) == set(ours.params[OVERLAP])
    full = read_csv(path, keep_comm=True)
    assert full.compute_only().ranks == ours.ranks
    # written back: torch's rows without the bookkeeping actions, pairs as OVERLAP_F_B cells
    rows = [[c for c in line.split(",") if c and not re.search(r"UNSHARD|RESHARD|REDUCE_GRAD", c)]
            for line in text.splitlines()]
    assert to_actions(full) == rows


@pytest.mark.parametrize("name", ["dualpipev", "zb-v", "1f1b"])
def test_dp_actions_are_written_where_the_runtime_does_them(name: str) -> None:
    sched = generate(name, p=2, m=4)
    rows = to_actions(sched, dp_actions=True)
    for r, row in enumerate(rows):
        for s in sched.placement.stages_of(r):
            i = row.index(f"{s}UNSHARD")
            first = next(k for k, a in enumerate(row) if re.search(rf"(^|[(;]){s}(F)\d", a))
            assert i < first and all(not re.search(rf"(^|[(;]){s}[FIBW]\d", a) for a in row[:i])
            red = row.index(f"{s}REDUCE_GRAD")
            assert row[red + 1] == f"{s}RESHARD"
            assert re.search(rf"(^|[(;]){s}[WB]\d", row[red - 1])  # right after its last W / BW
            assert not any(re.search(rf"(^|[(;]){s}[FIBW]\d", a) for a in row[red:])
    # torch reads them, and the compute part is the schedule's
    acts = {r: [_Action.from_str(a) for a in row] for r, row in enumerate(rows)}
    assert torch_schedules._validate_schedule(acts, 2, sched.num_stages, 4) == \
        dict(enumerate(sched.placement.stage_to_rank))
    assert from_actions(rows).ranks == sched.ranks


def test_overlap_of_other_sub_actions_runs_in_order(tmp_path: Path) -> None:
    # not one F then one backward: the sub-actions, one after the other, no pair
    sched = read_csv(_write(tmp_path, "(0F0;0F1)OVERLAP_F_B,(0B0;0B1)OVERLAP_F_B\n"))
    assert [(o.kind, o.microbatch) for o in sched.ranks[0]] == [(OpKind.F, 0), (OpKind.F, 1), (OpKind.BW, 0),
                                                                 (OpKind.BW, 1)]
    assert OVERLAP not in sched.params


def test_torch_dualpipev_actions_round_trip_in_memory() -> None:
    from pipeoffload.interop.torch_actions import from_torch_actions, to_torch_actions

    order = torch_order(torch_schedules.ScheduleDualPipeV, 3, 7, 2)
    sched = from_torch_actions(order)
    ours = generate("dualpipev", p=3, m=7)
    assert sched.ranks == ours.ranks and set(sched.params[OVERLAP]) == set(ours.params[OVERLAP])
    back = to_torch_actions(sched)  # OVERLAP_F_B actions with their sub-actions, as torch builds them
    assert back == {r: [a for a in row if a is not None] for r, row in order.items()}
