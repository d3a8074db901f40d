"""optim.window and the window mode of the planner and the sampler (``BalanceConfig(window=K)``).

Expected values come from the rule in optim/window.py's docstring, worked by hand; the
properties (exactly once, at most K - 1 steps moved, never worse than planning each step alone,
the same shares in separate processes) are checked on generated inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optim.balance import CostModel, partition
from optim.plan import BalanceConfig, plan_window
from optim.sampler import BalancedBatchSampler, ShareList
from optim.window import deal_window, step_levels
from tests.support.procs import json_from_fresh_processes

WINDOW = BalanceConfig(enabled=True, method="lpt", window=3)
COST = CostModel(c0=1.0, a=0.5, b=0.25)


def _heavy(seed: int, num_batches: int, size: int, sigma: float) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.lognormal(0.0, sigma, size) for _ in range(num_batches)]


def _sum_of_maxima(pooled: np.ndarray, steps: list[list[np.ndarray]]) -> float:
    return sum(max(float(pooled[p].sum()) for p in parts) for parts in steps)


def test_the_docstring_window_is_dealt_as_worked_by_hand():
    """Sorted: 9(0) 3(6) 3(7) 2(1) 2(5) 2(8) 2(9) 2(10) 1(2) 1(3) 1(4) 1(11), levels 9 and 2.
    LPT towards them: 9 -> b0; 3 -> b1, 3 -> b2; the 2s alternate b1 b2 b1 b2 b1 (b1 at 9);
    the first 1 -> b2 (gap 2, ties with b3..b5, lowest index); the last three 1s -> b3 b4 b5."""
    costs = [np.array([9, 2, 1, 1, 1, 2.0]), np.array([3, 3, 2, 2, 2, 1.0])]
    steps = deal_window(costs, 3)
    assert [[p.tolist() for p in parts] for parts in steps] == [
        [[0], [1, 6, 8, 10], [2, 5, 7, 9]],
        [[3], [4], [11]],
    ]
    # the per-step lpt plan's step maxima are 9 and 5; the window's 9 and 1
    pooled = np.concatenate(costs)
    assert _sum_of_maxima(pooled, steps) == 9 + 1


def test_step_levels_follow_the_costliest_sample_of_each_step():
    sorted_costs = np.array([9, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1.0])
    # l0 = max(9, 29/6) = 9; rest 29 - 27 = 2; l1 = max(c3 = 2, 2/3) = 2
    assert step_levels(sorted_costs, 2, 3) == [9.0, 2.0]
    # no whale: 12 ones into 2 steps of 3 ranks: both levels 12/6 = 2
    assert step_levels(np.ones(12), 2, 3) == [2.0, 2.0]


def test_zero_costs_fill_the_emptiest_bins_and_no_bin_stays_empty():
    """Costs 4 0 0 0 into 2 steps of 2 ranks: the 4 takes bin 0, the zeros bins 1, 2, 3."""
    steps = deal_window([np.array([4.0, 0.0]), np.array([0.0, 0.0])], 2)
    assert [[p.tolist() for p in parts] for parts in steps] == [[[0], [1]], [[2], [3]]]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_batches=st.integers(1, 5),
    world_size=st.integers(1, 6),
    per_rank=st.integers(1, 6),
    sigma=st.floats(0.0, 2.0),
    zeros=st.integers(0, 3),
)
def test_every_sample_once_and_never_worse_than_each_step_alone(
    seed: int, num_batches: int, world_size: int, per_rank: int, sigma: float, zeros: int
):
    costs = _heavy(seed, num_batches, world_size * per_rank, sigma)
    costs[0][:zeros] = 0.0
    steps = deal_window(costs, world_size)
    pooled = np.concatenate(costs)
    assert len(steps) == num_batches and all(len(parts) == world_size for parts in steps)
    flat = np.concatenate([p for parts in steps for p in parts])
    assert sorted(flat.tolist()) == list(range(pooled.size))
    assert all(np.all(np.diff(p) > 0) for parts in steps for p in parts)
    # at least K·W samples: no rank of any step is left without one
    assert all(p.size > 0 for parts in steps for p in parts)
    for method in ("kk", "lpt"):
        alone = [
            max(
                float(c[p].sum())
                for p in partition(c, world_size, method=method, equal_size=method == "kk")
            )
            for c in costs
        ]
        assert _sum_of_maxima(pooled, steps) <= sum(alone) + 1e-9


@pytest.mark.parametrize("window", [2, 4, 8])
def test_heavy_tailed_steps_are_closer_than_the_per_step_plan(window: int):
    """256 ranks x 16 samples, lognormal sigma 1.5 (a few samples cost more than a rank's mean):
    every step's max/mean rank cost in the window is below the best per-step plan's mean."""
    costs = _heavy(7, window, 256 * 16, 1.5)
    plans = plan_window(costs, 256)
    per_step = [
        min(
            max(float(c[p].sum()) for p in partition(c, 256, method=m, equal_size=m == "kk"))
            / (c.sum() / 256)
            for m in ("kk", "lpt")
        )
        for c in costs
    ]
    assert max(p.imbalance_after for p in plans) < float(np.mean(per_step))


def test_the_window_config_is_checked():
    # a window moves samples between ranks: kk's counts resolve to unequal, equal ones refuse
    assert BalanceConfig(enabled=True, window=2).counts == "unequal"
    with pytest.raises(ValueError, match="window: 2 needs counts 'unequal'"):
        BalanceConfig(enabled=True, window=2, counts="equal")
    with pytest.raises(ValueError, match="window: 2 needs counts 'unequal'"):
        BalanceConfig(enabled=True, method="random", window=2)  # random splits equal counts
    with pytest.raises(ValueError, match="window"):
        BalanceConfig(window=0)
    # shuffle mode deals a window too (optim.shuffle.ShuffleBalancer.window)
    assert BalanceConfig(enabled=True, method="lpt", mode="shuffle", window=2).window == 2


def _samplers(
    num_samples: int, world_size: int, config: BalanceConfig, seed: int = 3
) -> list[BalancedBatchSampler]:
    lengths = (np.arange(num_samples) * 37 % 23) ** 2 % 97 + 1
    return [
        BalancedBatchSampler(
            range(num_samples),
            lengths,
            batch_size=4,
            world_size=world_size,
            rank=r,
            config=config,
            costs=COST,
            seed=seed,
        )
        for r in range(world_size)
    ]


def _epoch(samplers: list[BalancedBatchSampler]) -> list[list[ShareList[int]]]:
    """[rank][step] this rank's shares of one epoch."""
    return [list(s) for s in samplers]


def test_sampler_window_serves_every_sample_once_near_its_own_step():
    """70 samples, 3 ranks x 4: 6 global batches (the last of 10), windows of 3 steps."""
    samplers = _samplers(70, 3, WINDOW)
    shares = _epoch(samplers)
    batches = samplers[0].global_batches()
    assert [len(b) for b in batches] == [12, 12, 12, 12, 12, 10]
    origin = {int(i): k for k, batch in enumerate(batches) for i in batch}
    seen: dict[int, int] = {}
    for rank_shares in shares:
        assert len(rank_shares) == 6
        for step, share in enumerate(rank_shares):
            assert share.share.step == step
            for i in share:
                assert i not in seen
                seen[i] = step
    assert sorted(seen) == list(range(70))
    for i, step in seen.items():
        assert step // 3 == origin[i] // 3  # the same window
        assert abs(step - origin[i]) <= 2


def test_sampler_window_shares_carry_their_steps_counts_and_mean_weights():
    samplers = _samplers(70, 3, WINDOW)
    shares = _epoch(samplers)
    lengths = (np.arange(70) * 37 % 23) ** 2 % 97 + 1  # _samplers' lengths
    for step in range(6):
        step_ids = [i for rank_shares in shares for i in rank_shares[step]]
        for rank_shares in shares:
            share = rank_shares[step].share
            assert share.num_samples == len(step_ids)
            assert share.num_tokens == int(lengths[step_ids].sum())
        # losses = lengths: the ranks' averaged weighted sums are the step's own mean
        averaged = (
            sum(
                rank_shares[step].share.loss_weight("mean")
                * float(lengths[list(rank_shares[step])].sum())
                for rank_shares in shares
            )
            / 3
        )
        assert averaged == pytest.approx(float(lengths[step_ids].mean()))
    assert len({shares[0][s].share.num_samples for s in range(6)}) > 1  # sizes vary


_SCRIPT = """
import json
from tests.integration.optim.test_window import WINDOW, _epoch, _samplers
out = []
for epoch in (0, 1):
    samplers = _samplers(70, 3, WINDOW, seed=5)
    for s in samplers:
        s.set_epoch(epoch)
    out.append([[[list(b), b.share.digest] for b in r] for r in _epoch(samplers)])
print(json.dumps(out))
"""


def test_sampler_window_gives_the_same_shares_in_separate_processes():
    runs = json_from_fresh_processes(_SCRIPT)
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]  # epoch 1 is another order
    here = _epoch(_samplers(70, 3, WINDOW, seed=5))
    assert runs[0][0] == [[[list(b), b.share.digest] for b in r] for r in here]
