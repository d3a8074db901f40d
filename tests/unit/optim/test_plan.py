"""optim.plan: the toggle's config, the per-step plan, digests and the loss scale (no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from optim.balance import CostModel, partition
from optim.padded import PaddedCosts
from optim.plan import (
    BalanceConfig,
    StepPlan,
    batch_digest,
    loss_scale,
    plan_digest,
    plan_window,
)

COSTS = np.array([9.0, 1.0, 1.0, 1.0, 8.0, 2.0, 1.0, 1.0])


def test_off_is_the_random_split():
    plan = StepPlan.make(COSTS, 2, BalanceConfig())
    assert [p.tolist() for p in plan.parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # rank costs 12 and 12: balanced by luck
    assert plan.imbalance_before == plan.imbalance_after == 1.0


def test_balanced_plan_on_a_skewed_batch():
    costs = np.array([9.0, 8.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0])  # random split: 19 vs 5
    plan = StepPlan.make(costs, 2, BalanceConfig(enabled=True))
    assert plan.imbalance_before == pytest.approx(19 / 12)
    loads = sorted(float(costs[p].sum()) for p in plan.parts)
    assert loads == [12.0, 12.0] and plan.imbalance_after == 1.0
    assert sorted(np.concatenate(plan.parts).tolist()) == list(range(8))
    assert {p.size for p in plan.parts} == {4}


def test_lpt_gives_unequal_counts():
    costs = np.array([10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    plan = StepPlan.make(costs, 2, BalanceConfig(enabled=True, method="lpt"))
    assert sorted(p.size for p in plan.parts) == [2, 10]  # 10+1 and ten 1s
    assert plan.imbalance_after == pytest.approx(11 / 10.5)


def test_lpt_takes_a_batch_that_is_not_a_multiple_of_the_world_size():
    """10 samples on 4 ranks. LPT: the 9 alone, the nine 1s three each to the three lighter
    ranks: loads 9, 3, 3, 3 (max/mean 9 / 4.5). The random split: chunks of 3, 3, 2, 2 samples,
    costing 11, 3, 2, 2 (max/mean 11 / 4.5)."""
    costs = np.array([9.0] + [1.0] * 9)
    plan = StepPlan.make(costs, 4, BalanceConfig(enabled=True, method="lpt"))
    assert sorted(np.concatenate(plan.parts).tolist()) == list(range(10))
    assert sorted(p.size for p in plan.parts) == [1, 3, 3, 3]
    assert sorted(float(costs[p].sum()) for p in plan.parts) == [3.0, 3.0, 3.0, 9.0]
    assert plan.imbalance_after == pytest.approx(9 / 4.5)
    assert plan.imbalance_before == pytest.approx(11 / 4.5)
    scales = [loss_scale(p.size, 10, 4) for p in plan.parts]
    assert sorted(scales) == pytest.approx([0.4, 1.2, 1.2, 1.2])  # 4 * n_r / 10
    assert sum(scales) == pytest.approx(4.0)  # the ranks' mean of the scales is 1


def test_equal_count_methods_still_need_a_multiple_of_the_world_size():
    costs = np.ones(10)
    with pytest.raises(ValueError, match="equal_size"):
        StepPlan.make(costs, 4, BalanceConfig(enabled=True, method="kk"))
    off = StepPlan.make(costs, 4, BalanceConfig())  # the random split: 3, 3, 2, 2 samples
    assert [p.tolist() for p in off.parts] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_plan_is_deterministic_and_the_digest_tells_plans_apart():
    config = BalanceConfig(enabled=True)
    a, b = StepPlan.make(COSTS, 2, config), StepPlan.make(COSTS.copy(), 2, config)
    assert a.digest == b.digest and len(a.digest) == 16
    swapped = plan_digest([a.parts[1], a.parts[0]])
    assert swapped != a.digest  # rank order counts
    raw = partition(COSTS, 2)
    assert [p.tolist() for p in a.parts] == raw


def test_batch_digest_ignores_order_but_not_content():
    assert batch_digest(np.array([5, 1, 3])) == batch_digest(np.array([3, 5, 1]))
    assert batch_digest(np.array([5, 1, 3])) != batch_digest(np.array([5, 1, 4]))


def test_loss_scale_makes_the_averaged_gradient_the_global_mean():
    counts = np.array([1, 11])
    grads = [np.full(n, float(r + 1)) for r, n in enumerate(counts)]  # per-sample gradients
    scaled = [loss_scale(len(g), 12, 2) * g.mean() for g in grads]
    assert np.mean(scaled) == pytest.approx(np.concatenate(grads).mean())
    assert loss_scale(6, 12, 2) == 1.0
    with pytest.raises(ValueError, match="num_global"):
        loss_scale(1, 0, 2)


def test_kk_with_unequal_counts():
    """Costs 9 1 1 1 on 2 ranks. Equal counts: the 9 shares its rank with a 1: loads 10 and 2.
    Unequal counts: the only split whose heavier rank costs 9 is the 9 alone, against the three
    1s (loads 9 and 3); each rank's mean loss is scaled by 2·n_r/4: 0.5 and 1.5."""
    costs = np.array([9.0, 1.0, 1.0, 1.0])
    equal = StepPlan.make(costs, 2, BalanceConfig(enabled=True))
    assert sorted(float(costs[p].sum()) for p in equal.parts) == [2.0, 10.0]
    config = BalanceConfig(enabled=True, counts="unequal")
    assert config.method == "kk" and not config.equal_size
    plan = StepPlan.make(costs, 2, config)
    assert [p.tolist() for p in plan.parts] == [[0], [1, 2, 3]]
    assert plan.imbalance_after == pytest.approx(9 / 6)
    assert [loss_scale(p.size, 4, 2) for p in plan.parts] == [0.5, 1.5]
    odd = StepPlan.make(np.ones(5), 2, config)  # unequal counts take any batch size
    assert sorted(p.size for p in odd.parts) == [2, 3]


def test_counts_default_to_the_method_and_refuse_what_it_cannot_do():
    assert BalanceConfig().counts == "equal"
    assert BalanceConfig(method="lpt").counts == "unequal"
    assert BalanceConfig(method="lpt") == BalanceConfig(method="lpt", counts="unequal")
    assert BalanceConfig(method="random").counts == "equal"
    for method, counts in (("lpt", "equal"), ("random", "unequal"), ("kk", "some")):
        with pytest.raises(ValueError, match="counts"):
            BalanceConfig(method=method, counts=counts)
    assert BalanceConfig(enabled=True, counts="unequal", window=2).window == 2


def test_a_window_implies_unequal_counts_where_the_method_has_them():
    """A window deals K global batches into K steps: counts differ per step, so kk's counts
    resolve to unequal (lpt's are unequal anyway); random's only counts are equal: refused,
    and so are equal counts asked for with a window."""
    assert BalanceConfig(enabled=True, window=2).counts == "unequal"
    assert BalanceConfig(window=2) == BalanceConfig(counts="unequal", window=2)
    assert BalanceConfig(method="lpt", window=3).counts == "unequal"
    for fields in ({"counts": "equal"}, {"method": "random"}):
        with pytest.raises(ValueError, match="window: 2 needs counts 'unequal'"):
            BalanceConfig(window=2, **fields)


@pytest.mark.parametrize(
    ("field", "value"), [("method", "best"), ("mode", "stream"), ("check_every", -1)]
)
def test_config_rejects_bad_fields(field, value):
    with pytest.raises(ValueError, match=field):
        BalanceConfig(**{field: value})


def test_checks_at():
    config = BalanceConfig(check_every=5)
    assert [s for s in range(12) if config.checks_at(s)] == [0, 5, 10]
    assert not BalanceConfig(check_every=0).checks_at(0)


PAD = CostModel(c0=0.0, a=0.0, b=0.0, padded=1.0)


def test_a_padded_model_plans_with_the_padded_objective():
    """lengths 6 6 5 5 5 5 on 2 ranks, cost n · max(L)². The random split [6 6 5] [5 5 5]
    costs 3·36 = 108 and 3·25 = 75 (imbalance 108 / 91.5); the padded split [6 6] [5 5 5 5]
    costs 72 and 100 (100 / 86)."""
    costs = PaddedCosts(np.array([6, 6, 5, 5, 5, 5]), PAD)
    plan = StepPlan.make(costs, 2, BalanceConfig(enabled=True, counts="unequal"))
    assert [p.tolist() for p in plan.parts] == [[0, 1], [2, 3, 4, 5]]
    assert plan.imbalance_before == pytest.approx(108 / 91.5)
    assert plan.imbalance_after == pytest.approx(100 / 86)
    assert plan.digest == plan_digest(plan.parts)
    lpt = StepPlan.make(costs, 2, BalanceConfig(enabled=True, method="lpt"))
    assert lpt.digest == plan.digest  # lpt and kk-unequal: the same padded objective
    off = StepPlan.make(costs, 2, BalanceConfig())
    assert [p.tolist() for p in off.parts] == [[0, 1, 2], [3, 4, 5]]
    assert off.imbalance_after == off.imbalance_before == pytest.approx(108 / 91.5)
    random = StepPlan.make(costs, 2, BalanceConfig(enabled=True, method="random"))
    assert random.digest == off.digest


def test_a_window_refuses_a_padded_model():
    costs = [PaddedCosts(np.array([1, 2]), PAD), np.array([1.0, 2.0])]
    with pytest.raises(ValueError, match="^window: a balance window deals per-sample costs"):
        plan_window(costs, 2)
