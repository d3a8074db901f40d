"""Tests of ``optim.balance.imbalance_bound``: hand-computed bounds, and the bound never above
what a split achieves (the partitioners on random heavy-tailed costs, every split of small
inputs)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optim.balance import imbalance, imbalance_bound, partition

SMALL = settings(max_examples=60, deadline=None)


def test_a_whale_against_the_mean_part() -> None:
    # total 13, mean part 6.5: the sample of cost 10 sits on one part, whatever the split
    assert imbalance_bound([10, 1, 1, 1], 2) == pytest.approx(10 / 6.5)
    # two per part: the part with the 10 takes one more sample, at best a 1: 11 / 6.5
    assert imbalance_bound([10, 1, 1, 1], 2, equal_size=True) == pytest.approx(11 / 6.5)


def test_no_whale_gives_one() -> None:
    # the costliest sample (3) is below the mean part (12 / 3 = 4): nothing bounds the split
    assert imbalance_bound([3, 3, 2, 2, 1, 1], 3) == 1.0
    assert imbalance_bound([5.0] * 6, 3, equal_size=True) == 1.0
    assert imbalance_bound([0.0, 0.0], 2, equal_size=True) == 1.0
    assert imbalance_bound([], 4) == 1.0


def test_equal_counts_two_whales_bound_beyond_the_first() -> None:
    # 3 parts of 2 from [4, 4, 2, 2, 2, 0]: total 14, mean 14/3. The part with one 4 takes at
    # least the 0: 4, below the mean. The two 4s: on one part (8), or on two parts that take
    # two more samples, at least 0 + 2: those two parts hold >= 10, the heavier >= 5.
    # The three costliest (4, 4, 2) on two parts hold one more sample (>= 0): >= 10 / 2 = 5
    # again; on three parts the mean. So the bound is 5 / (14/3).
    assert imbalance_bound([4, 4, 2, 2, 2, 0], 3, equal_size=True) == pytest.approx(15 / 14)
    assert imbalance_bound([4, 4, 2, 2, 2, 0], 3) == 1.0  # any counts: {4}, {4}, {2, 2, 2, 0}


def test_one_sample_per_part_is_exact() -> None:
    # k = 1: every split is a permutation, the max part is the costliest sample
    costs = [7.0, 1.0, 2.0, 2.0]
    assert imbalance_bound(costs, 4, equal_size=True) == pytest.approx(7 / 3)
    assert imbalance(costs, [[0], [1], [2], [3]]) == pytest.approx(7 / 3)


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="equal_size"):
        imbalance_bound([1, 2, 3], 2, equal_size=True)
    with pytest.raises(ValueError, match="num_parts"):
        imbalance_bound([1, 2], 0)
    with pytest.raises(ValueError, match="num_parts"):
        imbalance_bound([1, 2], True)
    with pytest.raises(ValueError, match="costs"):
        imbalance_bound([1, -2], 2)


def _heavy_tailed(seed: int, n: int) -> np.ndarray:
    """Per-sample costs ``c0 + a·L + b·L²`` of lognormal lengths (a few whales)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(4.0, 1.2, size=n), 5000.0)
    return 200.0 + 10.0 * lengths + 0.05 * lengths**2


@SMALL
@given(
    seed=st.integers(0, 2**31),
    num_parts=st.sampled_from([2, 3, 8, 32]),
    per_part=st.integers(1, 12),
)
def test_bound_is_never_above_what_the_partitioners_achieve(
    seed: int, num_parts: int, per_part: int
) -> None:
    costs = _heavy_tailed(seed, num_parts * per_part)
    equal = imbalance_bound(costs, num_parts, equal_size=True)
    free = imbalance_bound(costs, num_parts)
    assert 1.0 <= free <= equal
    for method in ("kk", "lpt", "random"):
        achieved = imbalance(costs, partition(costs, num_parts, method=method))
        assert equal <= achieved * (1 + 1e-12)
    for method in ("kk", "lpt"):
        parts = partition(costs, num_parts, method=method, equal_size=False)
        assert free <= imbalance(costs, parts) * (1 + 1e-12)


def _equal_splits(n: int, k: int) -> list[list[list[int]]]:
    """Every split of ``range(n)`` into ``n / k`` parts of ``k`` (part order ignored)."""
    if n == 0:
        return [[]]
    out = []

    def grow(left: list[int], parts: list[list[int]]) -> None:
        if not left:
            out.append(parts)
            return
        first, rest = left[0], left[1:]
        for others in itertools.combinations(rest, k - 1):
            remaining = [i for i in rest if i not in others]
            grow(remaining, [*parts, [first, *others]])

    grow(list(range(n)), [])
    return out


@SMALL
@given(
    costs=st.lists(st.integers(0, 50), min_size=4, max_size=8),
    num_parts=st.sampled_from([2, 4]),
)
def test_bound_is_never_above_the_best_split(costs: list[int], num_parts: int) -> None:
    costs = costs[: len(costs) // num_parts * num_parts]
    k = len(costs) // num_parts
    best_equal = min(imbalance(costs, s) for s in _equal_splits(len(costs), k))
    assert imbalance_bound(costs, num_parts, equal_size=True) <= best_equal * (1 + 1e-12)
    # any counts: every owner of every sample, the loads of all of them at once
    owners = np.array(list(itertools.product(range(num_parts), repeat=len(costs))))
    loads = np.stack([((owners == p) * costs).sum(axis=1) for p in range(num_parts)], axis=1)
    mean = sum(costs) / num_parts
    best_any = float(loads.max(axis=1).min() / mean) if mean else 1.0
    assert imbalance_bound(costs, num_parts) <= best_any * (1 + 1e-12)
