"""The grid lowering's hole filling and squeezes with their period skips (issue 24): the
sweeps that write the periods they prove repeated (:class:`pipeoffload.schedules.
v_grid_lowering._HoleFiller`, :class:`~pipeoffload.schedules.v_grid_lowering._Squeezer`)
against the plain sweeps, on the grids the lowering hands them for V-auto's block family —
the same grid, the same counts, positions and levels, the same refusals — and the skips
must fire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeoffload.schedules import v_auto as va
from pipeoffload.schedules import v_grid_lowering as vg


def _grids_to_fill(monkeypatch, p: int, m: int, members: list) -> list:
    """The grids lower_grid hands to the hole filling for ``members`` of p's family."""
    seen: list = []
    real = vg._fill_holes

    def capture(grid, m_, skip=True):
        seen.append(([row[:] for row in grid], m_))
        return real(grid, m_, skip)

    monkeypatch.setattr(vg, "_fill_holes", capture)
    for params in members:
        for release in (True, False):
            vg.lower_grid(va._family_block(p, params), m, release)
    monkeypatch.setattr(vg, "_fill_holes", real)
    return seen


def _run(grid: list, m: int, skip: bool) -> tuple:
    """The filler's outcome: its state after the sweep, or the refusal."""
    filler = vg._HoleFiller([row[:] for row in grid], m)
    try:
        filler.run(skip)
    except vg._Refused:
        return ("refused",), 0
    return (filler.grid, filler.count, filler.where, filler.level), filler.skipped


def _members(p: int, n: int) -> list:
    fam = [params for pk, params in va._family(p) if pk <= 2 * p]
    return fam[:: max(1, len(fam) // n)]


@pytest.mark.parametrize("p,m", [(8, 96), (12, 120), (16, 128), (24, 150)])  # larger: the p = 48 lowering test
def test_skip_is_the_plain_sweep(monkeypatch, p, m):
    """Every filled grid of a sample of the family is the plain sweep's, and the skip
    writes periods on most of them."""
    grids = _grids_to_fill(monkeypatch, p, m, _members(p, 12))
    assert grids
    fired = 0
    for grid, mm in grids:
        plain, none = _run(grid, mm, skip=False)
        fast, skipped = _run(grid, mm, skip=True)
        assert none == 0
        assert fast == plain, (p, m)
        fired += skipped > 0
    assert fired >= len(grids) // 2, (fired, len(grids))


@settings(max_examples=25, deadline=None)
@given(p=st.integers(6, 20), extra=st.integers(0, 120), pick=st.integers(0, 10_000))
def test_skip_random_members(p, extra, pick):
    """Random members and microbatch counts: the same outcome as the plain sweep."""
    fam = [params for pk, params in va._family(p) if pk <= 2 * p]
    params = fam[pick % len(fam)]
    m = 2 * p + extra
    with pytest.MonkeyPatch.context() as mp:
        grids = _grids_to_fill(mp, p, m, [params])
    for grid, mm in grids:
        assert _run(grid, mm, skip=True)[0] == _run(grid, mm, skip=False)[0]


def test_lowering_unchanged_and_skip_fires_at_scale(monkeypatch):
    """V-auto's grid candidate at p = 48, m = 384 (the size class where it costs most): the
    lowering with both skips is the lowering without, and the fill's skip writes most periods."""
    p, m = 48, 384
    fam = va._family(p)
    order = sorted((i for i, (pk, _) in enumerate(fam) if pk <= min(2 * p, 2 * ((p + 2) // 2))),
                   key=lambda i: (-fam[i][0], i))
    block = va._family_block(p, fam[order[0]][1])
    skipped: list = []
    real = vg._HoleFiller

    class Spy(real):
        def run(self, skip):
            super().run(skip)
            skipped.append(self.skipped)

    monkeypatch.setattr(vg, "_HoleFiller", Spy)
    fast = vg.lower_grid(block, m, True)
    real_fill, real_squeeze = vg._fill_holes, vg._squeeze
    monkeypatch.setattr(vg, "_fill_holes", lambda grid, m_: real_fill(grid, m_, skip=False))
    monkeypatch.setattr(vg, "_squeeze", lambda grid, m_: real_squeeze(grid, m_, skip=False))
    plain = vg.lower_grid(block, m, True)
    assert fast is not None and fast == plain
    assert skipped[0] > m // 2, skipped


def _squeezes(monkeypatch, p: int, m: int, members: list) -> list:
    """The grids lower_grid squeezes for ``members`` of p's family."""
    seen: list = []
    real = vg._squeeze

    def capture(grid, m_, skip=True):
        seen.append(([row[:] for row in grid], m_))
        return real(grid, m_, skip)

    monkeypatch.setattr(vg, "_squeeze", capture)
    for params in members:
        for release in (True, False):
            vg.lower_grid(va._family_block(p, params), m, release)
    monkeypatch.setattr(vg, "_squeeze", real)
    return seen


def _squeezed(grid: list, m: int, skip: bool) -> tuple:
    """The squeezer's outcome: output rows, counts, positions, next slots; or the refusal."""
    sq = vg._Squeezer([row[:] for row in grid], m)
    try:
        sq.run(skip)
    except vg._Refused:
        return ("refused",), 0
    return ([row[:max(sq.nxt)] for row in sq.out], sq.count, sq.where, sq.nxt), sq.skipped


@pytest.mark.parametrize("p,m", [(4, 12), (6, 30), (12, 50), (16, 128), (24, 20)])  # larger: the p = 48 lowering test
def test_squeeze_skip_is_the_plain_squeeze(monkeypatch, p, m):
    """Every squeeze of the grid lowering (rules 2, 3, 4) on a sample of the family: the same
    output, counts, positions and refusals as the plain sweep; the skip fires on most."""
    grids = _squeezes(monkeypatch, p, m, _members(p, 10))
    fired = 0
    for grid, mm in grids:
        plain, none = _squeezed(grid, mm, skip=False)
        fast, skipped = _squeezed(grid, mm, skip=True)
        assert none == 0
        assert fast == plain, (p, m)
        fired += skipped > 0
    assert fired >= len(grids) // 4, (fired, len(grids))


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 20), extra=st.integers(0, 100), pick=st.integers(0, 10_000))
def test_squeeze_skip_random_members(p, extra, pick):
    """Random members and microbatch counts (m from 1): the same outcome as the plain squeeze."""
    fam = [params for pk, params in va._family(p) if pk <= 2 * p]
    params = fam[pick % len(fam)]
    m = 1 + extra
    with pytest.MonkeyPatch.context() as mp:
        grids = _squeezes(mp, p, m, [params])
    for grid, mm in grids:
        assert _squeezed(grid, mm, skip=True)[0] == _squeezed(grid, mm, skip=False)[0]
