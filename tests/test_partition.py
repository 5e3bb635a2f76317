"""``models.config.balanced_ranges`` (pure): the contiguous split of layers into layer groups
with the smallest maximum cost, the embedding and the head counted on the first and last
group. Checked against brute force over every split of small cases (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeoffload.errors import ParameterError
from pipeoffload.models.config import balanced_ranges


def _max_cost(ranges, costs, first, last):
    n = len(ranges)
    return max(sum(costs[i] for i in r) + (first if s == 0 else 0) + (last if s == n - 1 else 0)
               for s, r in enumerate(ranges))


@given(st.lists(st.integers(0, 9), min_size=1, max_size=9), st.integers(1, 5), st.integers(0, 9), st.integers(0, 9))
def test_the_split_is_contiguous_covering_and_no_split_has_a_smaller_maximum(costs, groups, first, last):
    if len(costs) < groups:
        with pytest.raises(ParameterError, match="num_stages"):
            balanced_ranges(costs, groups, first, last)
        return
    got = balanced_ranges(costs, groups, first, last)
    assert [i for r in got for i in r] == list(range(len(costs))) and all(len(r) >= 1 for r in got)
    best = min(_max_cost([range(a, b) for a, b in zip((0,) + cuts, cuts + (len(costs),))], costs, first, last)
               for cuts in itertools.combinations(range(1, len(costs)), groups - 1))
    assert _max_cost(got, costs, first, last) == best


def test_an_embedding_and_a_head_as_heavy_as_a_layer_take_a_layer_from_the_ends():
    assert balanced_ranges([1] * 10, 4, 1, 1) == [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    assert balanced_ranges([1] * 8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
