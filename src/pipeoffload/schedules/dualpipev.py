"""DualPipeV: DeepSeek's DualPipe cut in half (docs/schedules.md#dualpipev).

V placement (v = 2: rank ``r`` of ``p`` holds layer groups ``r``, chunk 0, and
``2p−1−r``, chunk 1; the loss is on rank 0). Each rank runs eight phases, written as
in deepseek-ai/DualPipe's ``dualpipev.py`` and torch's ``ScheduleDualPipeV`` (torch
2.13, ``_calculate_single_rank_operations``), with ``0``/``1`` the rank's chunks:

1. ``2(p−r−1)`` × F0;  2. ``r+1`` × (F0 F1);  3. ``p−r−1`` × (B1 W F1), zero bubble;
4. ``m−2p+r+1`` × (F0&B1, F1&B0): the main phase, each pair *overlapped* (one
   microbatch's forward with another's full backward; the last rank's first F0, B1
   run apart);  5. ``p−r−1`` × (B1, F1&B0);  6. ``r+1`` × (B1 B0), the second half
   split into B and W;  7. ``p−r−1`` × (W B0);  8. ``r+1`` × W.

A full backward is a ``BW`` op, a split one ``B`` then ``W`` (W's in the order their
B's ran). Each overlapped pair is an ``F`` immediately followed by its ``BW`` on the
rank, named in ``schedule.params[OVERLAP]`` (:func:`pipeoffload.ir.overlap_pairs`):
the communication pass receives both halves' inputs before the pair and sends both
outputs after it, and the runtime can issue the two back to back as one op
(``PipelineRunner(overlap_pairs=True)``; by default it runs them as two ops, which is
never slower while nothing overlaps their kernels). The timing pass runs a pair as one
op, the halves one after the other (``F&B = F + B + W``: torch's execution; kernels
overlapped on a GPU can only shorten it).

Guarantees (tests/test_dualpipev.py: p 1..8 × four m, and random costs): valid and
deadlock-free with the pairs run as one op, for every ``p ≥ 1`` and ``m ≥ 2p``; the
peak of every rank is DeepSeek's published PP + 1 = ``2p+1`` chunk activations (unit
accounting); with per-chunk costs ``F``, ``B`` (input gradient), ``W`` and no
communication time, the busiest rank's bubble is at most the published
``(p−1)(F&B + B_full − 3W)`` (``B_full = B + W``, ``F&B = F + B_full``) whenever
``F ≤ B`` and ``W ≤ B``, with equality at ``F = B = W``. The order is torch 2.13's
``ScheduleDualPipeV``, action for action (tests/test_interop.py).
"""

from __future__ import annotations

from ..ir import OVERLAP, OpKind, Placement, Schedule, build_schedule
from .spec import ScheduleSpec

__all__ = ["dualpipev", "dualpipev_orders"]

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW

Triple = tuple[OpKind, int, int]


def dualpipev_orders(p: int, m: int) -> tuple[list[list[Triple]], list[tuple[Triple, Triple]]]:
    """Per rank, the ``(kind, stage, microbatch)`` order of DualPipeV, and the overlapped
    ``(F, BW)`` pairs. Needs ``m >= 2p`` (not checked here; :func:`dualpipev` does)."""
    orders: list[list[Triple]] = []
    pairs: list[tuple[Triple, Triple]] = []
    for r in range(p):
        out: list[Triple] = []
        nxt: dict[tuple[OpKind, int], int] = {}  # (F or B, stage) -> next microbatch
        w_queue: list[tuple[int, int]] = []  # split backwards whose W has not run, oldest first
        s0, s1 = r, 2 * p - 1 - r

        def take(kind: OpKind, s: int) -> int:
            j = nxt.get((kind, s), 0)
            nxt[(kind, s)] = j + 1
            return j

        def fwd(s: int) -> Triple:
            t = (F, s, take(F, s))
            out.append(t)
            return t

        def bwd(s: int, split: bool) -> Triple:
            j = take(B, s)
            t = (B if split else BW, s, j)
            out.append(t)
            if split:
                w_queue.append((s, j))
            return t

        def weight() -> None:
            if w_queue:
                s, j = w_queue.pop(0)
                out.append((W, s, j))

        def overlapped(sf: int, sb: int) -> None:
            pairs.append((fwd(sf), bwd(sb, split=False)))

        for _ in range(2 * (p - r - 1)):  # 1: F0
            fwd(s0)
        for _ in range(r + 1):  # 2: F0 F1
            fwd(s0)
            fwd(s1)
        for _ in range(p - r - 1):  # 3: B1 W F1 (zero bubble)
            bwd(s1, split=True)
            weight()
            fwd(s1)
        for i in range(m - 2 * p + r + 1):  # 4: F0&B1, F1&B0
            if i == 0 and r == p - 1:  # the turn's first pair runs apart: a shorter bubble
                fwd(s0)
                bwd(s1, split=False)
            else:
                overlapped(s0, s1)
            overlapped(s1, s0)
        for _ in range(p - r - 1):  # 5: B1, F1&B0
            bwd(s1, split=False)
            overlapped(s1, s0)
        split = False
        for i in range(r + 1):  # 6: B1 B0, the second half split (zero bubble)
            if i == (r + 1) // 2 and r % 2 == 1:
                split = True
            bwd(s1, split)
            if i == (r + 1) // 2 and r % 2 == 0:
                split = True
            bwd(s0, split)
        for _ in range(p - r - 1):  # 7: W B0
            weight()
            bwd(s0, split)
        for _ in range(r + 1):  # 8: W
            weight()
        orders.append(out)
    return orders, pairs


def dualpipev(spec: ScheduleSpec) -> Schedule:
    """DualPipeV on ``spec.p`` ranks (``2p`` layer groups, V placement), ``spec.m``
    microbatches.

    Args:
        spec: ``p``, ``m``; ``v`` must be 2 or unset, ``g`` unset; costs/memory unused
            (the order is fixed).

    Returns:
        The schedule; ``params[OVERLAP]`` lists its overlapped ``(F, BW)`` pairs.

    Raises:
        ParameterError: ``m`` < ``2p`` (naming ``m``), ``v`` ≠ 2, ``g`` given.

    Guarantees: see the module docstring (published bubble and peak, deadlock-free).
    """
    spec.no_group()
    spec.resolve_v(2, allowed=(2,))
    spec.need_m_at_least(2 * spec.p, "DualPipeV's warm-up fills both chunks of every rank: m >= 2p = number of "
                                     "layer groups")
    orders, pairs = dualpipev_orders(spec.p, spec.m)
    return build_schedule("dualpipev", spec.m, Placement.vshape(spec.p), orders, p=spec.p, m=spec.m, v=2,
                          **{OVERLAP: tuple((f[1], f[2], b[1], b[2]) for f, b in pairs)})
