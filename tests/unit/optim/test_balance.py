"""Tests of ``optim.balance``: cost model, partitioners, imbalance."""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import assume, given, settings
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
def test_unequal_covers_once_in_order(costs, k, method):
    parts = partition(costs, k, method=method, equal_size=False)
    assert len(parts) == k
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))
    assert all(p == sorted(p) for p in parts)
    firsts = [p[0] for p in parts if p]
    assert firsts == sorted(firsts)
    assert all(not p for p in parts[len(firsts) :])


_CHILD = """
import json, sys
from optim.balance import METHODS, partition
costs, k = json.load(sys.stdin)
plans = [partition(costs, k, method=m, equal_size=e) for m in METHODS for e in (True, False)]
print(json.dumps(plans))
"""


def _all_plans(costs: list[float], k: int) -> list[list[list[int]]]:
    return [partition(costs, k, method=m, equal_size=e) for m in METHODS for e in (True, False)]


def test_deterministic_across_processes():
    """Every rank plans alone (docs/design.md §6): two fresh interpreters with different hash seeds
    (and this one) must give the same plans, ties and zeros included."""
    rng = np.random.default_rng(7)
    costs = np.concatenate([rng.integers(1, 30, 300), np.zeros(20)]).astype(float)
    costs = rng.permutation(costs).tolist()  # many ties, zeros spread over the batch
    payload = json.dumps([costs, 16])
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=payload,
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        outputs.append(json.loads(out.stdout))
    assert outputs[0] == outputs[1] == _all_plans(costs, 16)


def _cost_multisets(costs: list[float], parts: list[list[int]]) -> list[list[float]]:
    """Each part as its sorted costs, parts sorted: what a relabeling of the samples keeps."""
    return sorted(sorted(costs[i] for i in p) for p in parts)


@SMALL
@given(
    case=divisible(),
    method=st.sampled_from(("kk", "lpt")),
    equal_size=st.booleans(),
    ties=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_plan_depends_on_costs_not_on_input_order(case, method, equal_size, ties, seed):
    """The same costs in another order give the same plan, up to exchanging samples of equal
    cost (the order only breaks ties): mapped back, each part holds the same costs. Without
    ties the parts are the same sets of samples."""
    costs, k = case
    if ties:
        costs = [float(round(c) % 5) for c in costs]  # few distinct values, zeros included
    perm = np.random.default_rng(seed).permutation(len(costs))
    shuffled = [costs[i] for i in perm]
    parts = partition(costs, k, method=method, equal_size=equal_size)
    back = [
        [int(perm[i]) for i in p]
        for p in partition(shuffled, k, method=method, equal_size=equal_size)
    ]
    assert _cost_multisets(costs, back) == _cost_multisets(costs, parts)
    if len(set(costs)) == len(costs):
        assert sorted(map(sorted, back)) == sorted(parts)


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


ZERO_HEAVY = st.lists(
    st.one_of(st.just(0.0), st.just(0.0), st.floats(min_value=0, max_value=1e6, allow_nan=False)),
    min_size=1,
    max_size=40,
)


@SMALL
@given(
    costs=ZERO_HEAVY,
    k=st.integers(1, 9),
    method=st.sampled_from(METHODS),
    equal_size=st.booleans(),
)
def test_no_empty_part_when_samples_suffice(costs, k, method, equal_size):
    if equal_size:
        costs = costs[: len(costs) - len(costs) % k]
    assume(len(costs) >= k)
    parts = partition(costs, k, method=method, equal_size=equal_size)
    assert all(parts), parts
    assert sorted(i for p in parts for i in p) == list(range(len(costs)))


@SMALL
@given(
    n=st.integers(0, 60),
    k=st.integers(1, 9),
    method=st.sampled_from(METHODS),
    equal_size=st.booleans(),
)
def test_all_zero_costs_are_spread_by_count(n, k, method, equal_size):
    if equal_size:
        n -= n % k
    sizes = [len(p) for p in partition([0.0] * n, k, method=method, equal_size=equal_size)]
    assert sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1


@SMALL
@given(
    costs=ZERO_HEAVY.map(lambda c: c[:9]),
    method=st.sampled_from(METHODS),
    equal_size=st.booleans(),
)
def test_as_many_samples_as_parts_gives_one_each(costs, method, equal_size):
    parts = partition(costs, len(costs), method=method, equal_size=equal_size)
    assert sorted(parts) == [[i] for i in range(len(costs))]


@pytest.mark.parametrize("method", ["kk", "lpt"])
def test_many_zeros_and_a_few_large_costs(method):
    """3 large costs each get a part of their own; the 20 zeros then go by count: 5 empty parts
    and 3 holding one sample; levelling everyone to 2 samples takes 13 zeros, and the other 7
    go one each: 23 samples as seven parts of 3 and one of 2."""
    costs = [0.0] * 23
    for i, cost in ((4, 1e6), (11, 5e5), (19, 7e5)):
        costs[i] = cost
    parts = partition(costs, 8, method=method, equal_size=False)
    assert sorted(len(p) for p in parts) == [2] + [3] * 7
    assert sorted(_loads(costs, parts)) == [0.0] * 5 + [5e5, 7e5, 1e6]


def _reference_kk_unequal(costs: list[float], k: int) -> list[float]:
    """The textbook k-way differencing the fast one must reproduce: every item its own
    partition ``(cost, 0, ..., 0)``; pop the two of largest spread (ties: older first, items by
    descending cost then index before any merge), pair the i-th heaviest part of one with the
    i-th lightest of the other, push the result. Returns the final part costs, ascending."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    heap = [(-costs[i], rank, [costs[i]] + [0.0] * (k - 1)) for rank, i in enumerate(order)]
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        sums = sorted((first[i] + second[k - 1 - i] for i in range(k)), reverse=True)
        heapq.heappush(heap, (-(sums[0] - sums[-1]), counter, sums))
        counter += 1
    return sorted(heap[0][2]) if heap else [0.0] * k


@settings(max_examples=300, deadline=None)
@given(
    costs=st.lists(st.integers(1, 12), min_size=1, max_size=120)
    | st.lists(st.integers(1, 10**6), min_size=1, max_size=60),
    k=st.integers(2, 12),
)
def test_kk_unequal_matches_the_textbook_differencing(costs, k):
    """Integer costs (exact sums, so any order of addition agrees), with many ties or few,
    exercise every shortcut of the fast version: the part costs must be the reference's."""
    parts = partition(costs, k, method="kk", equal_size=False)
    assert sorted(_loads(costs, parts)) == _reference_kk_unequal(costs, k)


def test_kk_unequal_beats_lpt_on_a_classic_case():
    """{8, 7, 6, 5, 4} into 2. LPT: 8 | 7, 6 to the 7 (13), 5 to the 8 (13), 4 to the first
    on the tie: 8+5+4 | 7+6 = 17 | 13. Differencing: 8 and 7 pair up (spread 1), 6 and 5 too
    (spread 1); 4 (spread 4) merges with the older pair: 8 | 7+4 (spread 3); that merges with
    6 | 5, heaviest with lightest: 8+6 | 7+4+5 = 14 | 16."""
    costs = [8, 7, 6, 5, 4]
    assert partition(costs, 2, method="lpt", equal_size=False) == [[0, 3, 4], [1, 2]]
    assert partition(costs, 2, method="kk", equal_size=False) == [[0, 2], [1, 3, 4]]


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


def test_cost_model_file_over_the_limit_is_refused_unread(tmp_path):
    """A 2 GiB (sparse) cost-model file: refused naming the file and the 1 MiB limit, after
    reading at most the limit (tracemalloc's peak stays near it)."""
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(2 * 2**30)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"huge\.json: over the 1 MiB limit"):
            CostModel.from_json(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * 2**20
    exact = tmp_path / "exact.json"
    text = json.dumps({"c0": 1.0, "a": 2.0, "b": 0.5})
    exact.write_text(text + " " * (2**20 - len(text)))  # exactly at the limit: read
    assert CostModel.from_json(exact) == CostModel(c0=1.0, a=2.0, b=0.5)


def test_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import optim.balance as b; "
        "print(b.partition([3, 2, 1, 0], 2))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[[0, 3], [1, 2]]"
