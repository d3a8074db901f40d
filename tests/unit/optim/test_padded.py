"""Tests of the padded cost shape: ``CostModel(batch=, padded=)`` and ``optim.padded``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import combinations_with_replacement

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optim.balance import CostModel, partition
from optim.padded import PaddedCosts, partition_padded, rank_cost, split_costs

PAD = CostModel(c0=0.0, a=0.0, b=0.0, padded=1.0)
"""Padded attention alone: a rank of n samples costs n · max(L)²."""
SMALL = settings(max_examples=60, deadline=None)


def _loads(lengths: list[int], parts: list[list[int]], model: CostModel) -> list[float]:
    return [model.batch_cost(np.array([lengths[i] for i in p])) for p in parts]


# ------------------------------------------------------------------------------ the model


def test_batch_cost_of_a_padded_model():
    m = CostModel(c0=1.0, a=2.0, b=0.0, batch=10.0, padded=3.0)
    # 10 + (1 + 2·2) + (1 + 2·5) + 3 · 2 · 5²
    assert m.batch_cost(np.array([2, 5])) == 10 + 5 + 11 + 150
    assert m.batch_cost(np.array([], dtype=np.int64)) == 10.0  # a rank without samples
    assert m.shape == "padded"
    assert CostModel(c0=0.0, a=0.0, b=0.0, batch=1.0).shape == "padded"


def test_a_padded_model_has_no_per_sample_cost():
    with pytest.raises(ValueError, match=r"^padded: .*use CostModel.batch_cost"):
        PAD(np.array([1, 2]))


def test_an_additive_model_costs_the_sum_of_its_samples():
    m = CostModel(c0=1.0, a=2.0, b=0.5)
    assert m.shape == "additive"
    # (1 + 6 + 4.5) + (1 + 2 + 0.5)
    assert m.batch_cost(np.array([3, 1])) == 11.5 + 3.5 == float(m(np.array([3, 1])).sum())
    assert m.additive_part() == m
    padded = CostModel(c0=1.0, a=2.0, b=0.5, batch=4.0, padded=7.0)
    assert padded.additive_part() == m


def test_padded_json_round_trip_and_the_old_format(tmp_path):
    m = CostModel(c0=1.0, a=2.0, b=0.0, batch=10.0, padded=3.0)
    path = tmp_path / "cost_model.json"
    m.to_json(path)
    assert json.loads(path.read_text()) == {
        "c0": 1.0,
        "a": 2.0,
        "b": 0.0,
        "ids": 0.0,
        "batch": 10.0,
        "padded": 3.0,
    }
    assert CostModel.from_json(path) == m
    old = tmp_path / "old.json"
    old.write_text('{"c0": 5, "a": 1, "b": 0.25}')  # a file of before the padded shape
    read = CostModel.from_json(old)
    assert (read.batch, read.padded, read.shape) == (0.0, 0.0, "additive")
    CostModel(c0=5.0, a=1.0, b=0.25).to_json(path)  # an additive model writes the old fields
    assert set(json.loads(path.read_text())) == {"c0", "a", "b", "ids"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"c0": 1, "a": 1, "b": 1, "padded": -1}', "padded: must be finite and >= 0"),
        ('{"c0": 1, "a": 1, "b": 1, "batch": "x"}', "batch: must be a number"),
        ('{"c0": 1, "a": 1, "b": 1, "pad": 1}', r"unknown field\(s\) \['pad'\]"),
    ],
)
def test_a_bad_padded_file_names_the_file_and_field(tmp_path, text, match):
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{path}: .*{match}"):
        CostModel.from_json(path)


# ------------------------------------------------------------------------- the split


def test_unequal_counts_beat_the_kk_split_by_hand():
    """lengths 6 6 5 5 5 5 on 2 ranks, cost n · max(L)². KK on L² (36 36 25 25 25 25, total
    172) finds the only split of equal sums, 86 = 36 + 25 + 25: [6 5 5] [6 5 5], each costing
    3 · 36 = 108. The contiguous cuts of the sorted order cost (cut after k samples of
    5 5 5 5 6 6): k=3: 75 | 3·36=108; k=4: 4·25=100 | 2·36=72; k=5: 125 | 36: best 100."""
    lengths = [6, 6, 5, 5, 5, 5]
    kk = partition(np.square(lengths), 2, method="kk", equal_size=False)
    assert sorted(_loads(lengths, kk, CostModel(c0=0.0, a=0.0, b=1.0))) == [86, 86]
    assert _loads(lengths, kk, PAD) == [108, 108]
    parts = partition_padded(lengths, 2, PAD, equal_size=False)
    assert parts == [[0, 1], [2, 3, 4, 5]]
    assert _loads(lengths, parts, PAD) == [72, 100]


def test_unequal_counts_with_per_sample_terms_by_hand():
    """cost = 5 (per rank) + 1·ΣL + n · max(L)², lengths 1 1 1 1 8 on 2 ranks. Cuts of the
    sorted order 1 1 1 1 8 after k samples: k=4: 5 + 4 + 4 = 13 | 5 + 8 + 64 = 77; k=3:
    5 + 3 + 3 = 11 | 5 + 9 + 2·64 = 142: the whale alone, 77. KK on the per-sample part
    (1 1 1 1 8: the 8 alone, 4 ones together) is that split too; on L² as well."""
    m = CostModel(c0=0.0, a=1.0, b=0.0, batch=5.0, padded=1.0)
    lengths = [1, 8, 1, 1, 1]
    parts = partition_padded(lengths, 2, m, equal_size=False)
    assert parts == [[0, 2, 3, 4], [1]]
    assert _loads(lengths, parts, m) == [13, 77]


def test_equal_counts_are_chunks_of_the_sorted_order():
    """lengths 9 1 8 2 on 2 ranks of 2, cost n · max(L)²: chunks [1 2] [8 9] cost 2·4 = 8 and
    2·81 = 162. With equal counts the rank holding the 9 costs at least 2 · 81 whatever the
    split (KK on L² gives [9 1] [8 2]: 162 and 128): the same maximum, the chunks kept."""
    lengths = [9, 1, 8, 2]
    parts = partition_padded(lengths, 2, PAD)
    assert parts == [[0, 2], [1, 3]]
    assert _loads(lengths, parts, PAD) == [162, 8]


def test_equal_counts_keep_kk_when_the_per_sample_terms_decide():
    """cost = 10·ΣL + n · max(L)², lengths 4 3 3 1 on 2 ranks of 2. Chunks [1 3] [3 4]:
    (10 + 30) + 2·9 = 58 and 70 + 2·16 = 102. KK on the per-sample part 40 30 30 10: [4 1]
    [3 3], 50 + 32 = 82 and 60 + 18 = 78: lower, kept."""
    m = CostModel(c0=0.0, a=10.0, b=0.0, padded=1.0)
    lengths = [4, 3, 3, 1]
    parts = partition_padded(lengths, 2, m)
    assert parts == [[0, 3], [1, 2]]
    assert _loads(lengths, parts, m) == [82, 78]


def test_more_ranks_than_samples():
    assert partition_padded([3, 1], 4, PAD, equal_size=False) == [[0], [1], [], []]
    assert partition_padded([], 3, PAD) == [[], [], []]
    assert partition_padded([], 3, PAD, equal_size=False) == [[], [], []]
    assert partition_padded([5], 1, PAD) == [[0]]


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([1, 2, 3], 2), {}, "equal_size: 3 samples do not split into 2"),
        (([1, 2], 0), {}, "num_parts: must be >= 1"),
        (([1, 2], 1.5), {}, "num_parts: must be an int"),
        (([1, -2], 2), {}, "lengths: must be finite and >= 0"),
        (([[1, 2]], 1), {}, "lengths: must be 1-D"),
    ],
)
def test_partition_padded_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        partition_padded(*args, PAD, **kwargs)


LENGTHS = st.lists(st.integers(0, 60), min_size=0, max_size=30)
MODELS = st.builds(
    CostModel,
    c0=st.sampled_from([0.0, 3.0]),
    a=st.sampled_from([0.0, 1.0, 20.0]),
    b=st.sampled_from([0.0, 0.5]),
    batch=st.sampled_from([0.0, 50.0]),
    padded=st.sampled_from([0.0, 0.1, 1.0]),
)


@SMALL
@given(lengths=LENGTHS, k=st.integers(1, 7), model=MODELS, equal=st.booleans())
def test_every_sample_once_in_partition_order(lengths, k, model, equal):
    if equal:
        lengths = lengths[: len(lengths) - len(lengths) % k]
    parts = partition_padded(lengths, k, model, equal_size=equal)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(p == sorted(p) for p in parts)
    firsts = [p[0] for p in parts if p]
    assert firsts == sorted(firsts) and all(not p for p in parts[len(firsts) :])
    if equal:
        assert {len(p) for p in parts} <= {len(lengths) // k}
    elif len(lengths) >= k:
        assert all(parts)  # no rank left empty


@SMALL
@given(lengths=LENGTHS, k=st.integers(1, 6), model=MODELS, equal=st.booleans())
def test_never_worse_than_kk_on_the_per_sample_part(lengths, k, model, equal):
    if equal:
        lengths = lengths[: len(lengths) - len(lengths) % k]
    parts = partition_padded(lengths, k, model, equal_size=equal)
    kk = partition(model.additive_part()(np.array(lengths, dtype=float)), k, equal_size=equal)
    assert max(_loads(lengths, parts, model)) <= max(_loads(lengths, kk, model))


def _best_contiguous(lengths: list[int], k: int, model: CostModel) -> float:
    """The smallest largest cost over every cut of the sorted lengths into k groups."""
    ordered = sorted(lengths)
    n, best = len(ordered), float("inf")
    for cuts in combinations_with_replacement(range(n + 1), k - 1):
        bounds = [0, *cuts, n]
        pairs = zip(bounds[:-1], bounds[1:], strict=True)
        costs = [model.batch_cost(np.array(ordered[lo:hi])) for lo, hi in pairs]
        best = min(best, max(costs))
    return best


@SMALL
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    k=st.integers(1, 3),
    model=MODELS,
)
def test_unequal_counts_reach_the_best_contiguous_cut(lengths, k, model):
    parts = partition_padded(lengths, k, model, equal_size=False)
    best = _best_contiguous(lengths, k, model)
    assert max(_loads(lengths, parts, model)) <= best * (1 + 1e-9) + 1e-9


_CHILD = """
import json, sys
from optim.balance import CostModel
from optim.padded import partition_padded
lengths, k = json.load(sys.stdin)
m = CostModel(c0=2.0, a=1.0, b=0.0, batch=7.0, padded=0.01)
print(json.dumps([partition_padded(lengths, k, m, equal_size=e) for e in (True, False)]))
"""


def test_deterministic_across_processes():
    """Every rank plans alone: fresh interpreters with other hash seeds give the same parts,
    with many tied lengths."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, 240).tolist()
    m = CostModel(c0=2.0, a=1.0, b=0.0, batch=7.0, padded=0.01)
    here = [partition_padded(lengths, 8, m, equal_size=e) for e in (True, False)]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=json.dumps([lengths, 8]),
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        assert json.loads(out) == here


# --------------------------------------------------------------- what the callers split


def test_split_costs_and_rank_cost():
    lengths = np.array([3, 1])
    additive = CostModel(c0=1.0, a=2.0, b=0.0)
    assert split_costs(additive, lengths).tolist() == [7.0, 3.0]
    assert split_costs(None, lengths).tolist() == [3.0, 1.0]
    assert split_costs(lambda x: x * 2.0, lengths).tolist() == [6.0, 2.0]
    found = split_costs(PAD, lengths)
    assert isinstance(found, PaddedCosts) and found.lengths.tolist() == [3.0, 1.0]
    assert found.loads([[0, 1], []]).tolist() == [2 * 9.0, 0.0]
    assert rank_cost(PAD, lengths) == 18.0
    assert rank_cost(additive, lengths) == 10.0
    assert rank_cost(None, lengths) == 4.0
    assert rank_cost(lambda x: x * 2.0, lengths) == 8.0
