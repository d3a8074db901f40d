"""Tests of ``optim.balance``: cost model, partitioners, imbalance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optim.balance import METHODS, CostModel, imbalance, partition

COSTS = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=0, max_size=40)
SMALL = settings(max_examples=50, deadline=None)


@st.composite
def divisible(draw: st.DrawFn) -> tuple[list[float], int]:
    k = draw(st.integers(1, 6))
    m = draw(st.integers(0, 8))
    costs = draw(
        st.lists(
            st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=k * m, max_size=k * m
        )
    )
    return costs, k


def _loads(costs: list[float], parts: list[list[int]]) -> list[float]:
    return [sum(costs[i] for i in p) for p in parts]


@SMALL
@given(case=divisible(), method=st.sampled_from(METHODS))
def test_equal_size_covers_once_and_equal_counts(case, method):
    costs, k = case
    parts = partition(costs, k, method=method)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert {len(p) for p in parts} == {len(costs) // k}
    assert all(p == sorted(p) for p in parts)


@SMALL
@given(costs=COSTS, k=st.integers(1, 7), method=st.sampled_from(METHODS))
def test_unequal_covers_once_and_is_deterministic(costs, k, method):
    parts = partition(costs, k, method=method, equal_size=False)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert parts == partition(list(costs), k, method=method, equal_size=False)
    firsts = [p[0] for p in parts if p]
    assert firsts == sorted(firsts)
    assert all(not p for p in parts[len(firsts) :])


@SMALL
@given(case=divisible(), method=st.sampled_from(METHODS))
def test_deterministic_equal_size(case, method):
    costs, k = case
    assert partition(costs, k, method=method) == partition(np.array(costs), k, method=method)


@SMALL
@given(case=divisible())
def test_kk_never_worse_than_sorted_round_robin(case):
    costs, k = case
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    round_robin = [order[p::k] for p in range(k)]
    kk = max(_loads(costs, partition(costs, k, method="kk")), default=0.0)
    rr = max(_loads(costs, round_robin), default=0.0)
    assert kk <= rr * (1 + 1e-9) + 1e-9


@SMALL
@given(costs=COSTS, k=st.integers(1, 7))
def test_lpt_bound(costs, k):
    loads = _loads(costs, partition(costs, k, method="lpt", equal_size=False))
    mean = sum(costs) / k
    assert max(loads) <= (mean + max(costs, default=0.0)) * (1 + 1e-9) + 1e-9


def test_random_is_contiguous_chunks():
    assert partition([5, 1, 1, 5, 3, 3], 3, method="random") == [[0, 1], [2, 3], [4, 5]]


def test_kk_balances_a_simple_case():
    costs = [8, 7, 6, 5, 4, 3, 2, 1]
    parts = partition(costs, 2)
    assert _loads(costs, parts) == [18, 18]
    assert imbalance(costs, parts) == 1.0


def test_imbalance():
    assert imbalance([3, 1], [[0], [1]]) == pytest.approx(1.5)
    assert imbalance([0, 0], [[0], [1]]) == 1.0


@pytest.mark.parametrize(
    ("costs", "k", "kwargs", "match"),
    [
        ([1, 2], 0, {}, "num_parts"),
        ([1, 2, 3], 2, {}, "equal_size"),
        ([1, -2], 2, {}, "costs"),
        ([1, float("nan")], 2, {}, "costs"),
        ([1, float("inf")], 2, {}, "costs"),
        ([1, 2], 2, {"method": "magic"}, "method"),
        ([[1, 2]], 1, {}, "costs"),
    ],
)
def test_partition_errors(costs, k, kwargs, match):
    with pytest.raises(ValueError, match=match):
        partition(costs, k, **kwargs)


def test_cost_model_call():
    model = CostModel(c0=1, a=2, b=3, ids=0.5)
    np.testing.assert_allclose(model(np.array([0, 2]), np.array([4, 0])), [3.0, 17.0])
    np.testing.assert_allclose(CostModel(c0=1, a=0, b=1)(np.array([3])), [10.0])
    with pytest.raises(ValueError, match="num_ids"):
        model(np.array([1, 2]))


@pytest.mark.parametrize("field", ["c0", "a", "b", "ids"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_cost_model_validation(field, bad):
    values = {"c0": 1.0, "a": 1.0, "b": 1.0, "ids": 0.0, field: bad}
    with pytest.raises(ValueError, match=field):
        CostModel(**values)


def test_cost_model_json_round_trip(tmp_path):
    model = CostModel(c0=1.5, a=2.25, b=1e-3, ids=7.0)
    path = tmp_path / "cost.json"
    model.to_json(path)
    assert CostModel.from_json(path) == model
    assert list(tmp_path.iterdir()) == [path]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # readable like any written file


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"c0": 1, "a": 2}), "'b'"),
        (json.dumps({"c0": 1, "a": -2, "b": 0}), "a: must be"),
        (json.dumps({"c0": 1, "a": "x", "b": 0}), "a: must be a number"),
        (json.dumps({"c0": 1, "a": 2, "b": 0, "zz": 1}), "zz"),
    ],
)
def test_cost_model_bad_file(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        CostModel.from_json(path)
    assert "bad.json" in str(info.value)


def test_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import optim.balance as b; "
        "print(b.partition([3, 2, 1, 0], 2))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[0, 3], [1, 2]]"
