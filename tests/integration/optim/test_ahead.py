"""The balance plan made ahead on a planner thread (optim.ahead, FreeScale.shares, the sampler):
the same plans as on the training thread, errors raised at the step that needs the plan, no
thread left at close; and the planner's range in a real Kineto trace, on the planner's thread.
Real threads throughout; nothing is timed."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from torch.autograd.profiler import record_function  # noqa: E402

from fsobs.collect.profiler import ProfilerConfig, StepProfiler  # noqa: E402
from fsobs.trace import load_run  # noqa: E402
from optim.ahead import PlanAhead  # noqa: E402
from optim.balance import CostModel  # noqa: E402
from optim.config import FreeScaleConfig  # noqa: E402
from optim.freescale import FreeScale  # noqa: E402
from optim.markers import BALANCE_MARKER  # noqa: E402
from optim.plan import BalanceConfig, StepPlan, plan_window  # noqa: E402
from optim.sampler import BalancedBatchSampler  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

COST = CostModel(c0=1.0, a=0.5, b=0.25)
SEEDS = range(40)


def _planners() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "freescale-planner"]


def _batches(seed: int, num: int, size: int) -> list[np.ndarray]:
    """Heavy-tailed lengths (lognormal, a few whales) of ``num`` global batches."""
    rng = np.random.default_rng(seed)
    return [rng.lognormal(3.0, 1.2, size).astype(np.int64) + 1 for _ in range(num)]


# --------------------------------------------------------------- the same plans, many seeds


@pytest.mark.parametrize("method", ["kk", "lpt", "random"])
def test_plans_made_ahead_equal_the_plans_made_in_place(method: str) -> None:
    """For 40 seeds x 6 global batches of 24 samples on 4 ranks: the planner thread's plans have
    the parts and the digest that StepPlan.make gives on this thread, in step order."""
    config = BalanceConfig(enabled=True, method=method)
    for seed in SEEDS:
        costs = [COST(b) for b in _batches(seed, 6, 24)]
        with PlanAhead(lambda _, c: StepPlan.make(c, 4, config), costs) as ahead:
            made = list(ahead)
        expected = [StepPlan.make(c, 4, config) for c in costs]
        assert [p.digest for p in made] == [p.digest for p in expected]
        for got, want in zip(made, expected, strict=True):
            assert [p.tolist() for p in got.parts] == [p.tolist() for p in want.parts]
    assert _planners() == []


def test_windows_made_ahead_equal_the_windows_made_in_place() -> None:
    """Windows of 3 global batches (the last of 2), 3 ranks: plan_window on the planner thread
    gives this thread's deal, and item i of the windows is step 3·i."""
    steps: list[int] = []

    def plan(step: int, window: list[np.ndarray]) -> list[StepPlan]:
        steps.append(step)
        return plan_window(window, 3)

    for seed in SEEDS:
        costs = [COST(b) for b in _batches(seed, 8, 9)]
        windows = [costs[0:3], costs[3:6], costs[6:8]]
        steps.clear()
        with PlanAhead(plan, windows, stride=3) as ahead:
            made = list(ahead)
        assert steps == [0, 3, 6]
        expected = [plan_window(w, 3) for w in windows]
        assert [[p.digest for p in w] for w in made] == [[p.digest for p in w] for w in expected]


def test_a_hand_checked_plan_made_ahead() -> None:
    """KK on costs 9 9 1 1 5 5 into 2 parts of 3: the groups by descending cost are (9, 9),
    (5, 5), (1, 1); each part takes one of each group, so both cost 15: positions {0, 3, 5} and
    {1, 2, 4} (9 + 1 + 5 each; the parts listed by their smallest position)."""
    config = BalanceConfig(enabled=True)
    costs = np.array([9.0, 9, 1, 1, 5, 5])
    with PlanAhead(lambda _, c: StepPlan.make(c, 2, config), [costs]) as ahead:
        (plan,) = list(ahead)
    assert [p.tolist() for p in plan.parts] == [[0, 3, 5], [1, 2, 4]]
    assert plan.imbalance_after == 1.0


def test_the_planner_runs_one_step_ahead() -> None:
    """depth=1: once step 0 is taken, the planner plans step 1 and waits; step 2 waits for step
    1 to be taken."""
    planned: list[int] = []
    done = {k: threading.Event() for k in range(4)}

    def plan(step: int, item: int) -> int:
        planned.append(step)
        done[step].set()
        return item * 10

    with PlanAhead(plan, [0, 1, 2, 3]) as ahead:
        assert done[0].wait(60)
        assert planned == [0]  # no slot for step 1 until step 0 is taken
        assert next(ahead) == 0
        assert done[1].wait(60)
        assert planned == [0, 1]
        assert next(ahead) == 10
        assert done[2].wait(60)
        assert planned == [0, 1, 2]
        assert list(ahead) == [20, 30]
    assert not ahead.alive


# ------------------------------------------------------------------ errors and close


def test_a_failed_plan_is_raised_at_the_step_that_needs_it() -> None:
    """Step 3's plan fails: steps 0-2 get their plans first, then the planner's ValueError is
    raised here, with a note naming step 3; the thread has ended."""

    def plan(step: int, item: int) -> int:
        if step == 3:
            raise ValueError("costs: must be finite and >= 0")
        return item

    ahead = PlanAhead(plan, range(6))
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="costs: must be finite") as e:
        next(ahead)
    assert e.value.__notes__ == ["step 3: raised on the balance planner thread (optim.ahead)"]
    assert not ahead.alive
    with pytest.raises(StopIteration):
        next(ahead)


def test_an_error_in_the_items_names_its_step() -> None:
    """The items are read on the planner thread: when reading the 3rd fails, the error names
    step first_step + 2 * stride = 10 + 4."""

    def items():
        yield 1
        yield 2
        raise KeyError("sample 77")

    ahead = PlanAhead(lambda _, x: x, items(), first_step=10, stride=2)
    assert [next(ahead), next(ahead)] == [1, 2]
    with pytest.raises(KeyError, match="sample 77") as e:
        next(ahead)
    assert e.value.__notes__ == ["step 14: raised on the balance planner thread (optim.ahead)"]
    assert not ahead.alive


def test_close_stops_the_planner_early_and_a_loop_that_raises_leaves_no_thread() -> None:
    """A loop that stops after 2 of 100 steps, and one that raises: the with block joins the
    planner, which was waiting for a free slot; close is idempotent and ends the iteration."""
    with PlanAhead(lambda _, x: x, range(100)) as ahead:
        assert [next(ahead), next(ahead)] == [0, 1]
    assert not ahead.alive
    ahead.close()
    assert list(ahead) == []

    with pytest.raises(RuntimeError, match="the loop failed"):
        with PlanAhead(lambda _, x: x, range(100)) as failing:
            for step in failing:
                if step == 5:
                    raise RuntimeError("the loop failed")
    assert not failing.alive
    assert _planners() == []


def test_close_waits_for_the_plan_in_progress() -> None:
    """close() while the planner is inside a plan: it returns once that plan is done, and the
    plan's result is dropped."""
    inside, release = threading.Event(), threading.Event()

    def plan(step: int, item: int) -> int:
        if step == 1:
            inside.set()
            assert release.wait(60)
        return item

    ahead = PlanAhead(plan, range(4))
    assert next(ahead) == 0
    assert inside.wait(60)
    closer = threading.Thread(target=ahead.close)
    closer.start()
    release.set()
    closer.join(60)
    assert not closer.is_alive() and not ahead.alive
    assert list(ahead) == []


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="depth"):
        PlanAhead(lambda _, x: x, [], depth=0)
    with pytest.raises(ValueError, match="stride"):
        PlanAhead(lambda _, x: x, [], stride=True)


# --------------------------------------------------------------------------- the sampler


def test_the_sampler_plans_ahead_the_same_shares() -> None:
    """The sampler plans on the planner thread; its shares are StepPlan.make's parts of each
    global batch (shuffled order, drop_last=False: a last batch of 6 = 3 per rank), and no
    planner is left after the epoch or after a loop that stops early."""
    lengths = _batches(5, 1, 70)[0]
    config = BalanceConfig(enabled=True)
    sampler = BalancedBatchSampler(
        range(70), lengths, batch_size=8, world_size=2, rank=1, config=config, costs=COST
    )
    shares = list(sampler)
    assert _planners() == []
    expected = [
        batch[StepPlan.make(COST(lengths[batch]), 2, config).parts[1]].tolist()
        for batch in sampler.global_batches()
    ]
    assert [list(s) for s in shares] == expected
    assert [len(s) for s in shares] == [8, 8, 8, 8, 3]
    sampler.set_epoch(0)  # the same epoch again, on purpose (without it: a warning)
    loader = iter(sampler)
    assert list(next(loader)) == expected[0]
    loader.close()  # the DataLoader drops its sampler iterator: the generator is closed
    assert _planners() == []


# ---------------------------------------------------------- the planner's range in a trace


def test_the_planners_range_lands_in_the_trace_on_its_own_thread(tmp_path: Path) -> None:
    """StepProfiler (every thread) over 3 steps, steps 1 and 2 recorded (step 0 warms up):
    while step s runs, the planner records the balance range of step s + 1 on its own thread,
    not the one with the ProfilerSteps (the range of step 3 may end after the recording
    stops, so at least one range: step 2's)."""
    config = ProfilerConfig(wait=0, warmup=1, active=2)

    def plan(step: int, item: int) -> int:
        with record_function(BALANCE_MARKER):
            return item

    with StepProfiler(tmp_path, 0, config) as profiler:
        with PlanAhead(plan, range(10)) as ahead:
            for step in range(3):
                assert next(ahead) == step
                profiler.step()
    events = load_run(tmp_path).ranks[0].events
    steps = events[events["kind"] == "step"]
    balance = events[events["name"] == BALANCE_MARKER]
    assert len(steps) == 2 and len(balance) >= 1
    assert set(steps["tid"]) != set(balance["tid"])
    assert len(set(balance["tid"])) == 1


# -------------------------------------------------------- FreeScale.shares on 2 gloo ranks

CONFIGS = {
    "kk": BalanceConfig(enabled=True, check_every=3),
    "lpt": BalanceConfig(enabled=True, method="lpt", check_every=2),
    "window": BalanceConfig(enabled=True, method="lpt", window=3, check_every=1),
    "off": BalanceConfig(),
}


def _compare(rank: int, world_size: int, out: Path) -> None:
    rows = {}
    for name, balance in CONFIGS.items():
        same = []
        with FreeScale(FreeScaleConfig(balance=balance), cost_model=COST) as fs:
            fs.setup()
            for seed in range(12):
                batches = _batches(seed, 7, 10)
                ahead = list(fs.shares(iter(batches)))
                if balance.window > 1:
                    windows = [batches[k : k + 3] for k in range(0, 7, 3)]
                    now = [s for k, w in enumerate(windows) for s in fs.split_window(3 * k, w)]
                else:
                    now = [fs.split(step, b) for step, b in enumerate(batches)]
                same.append(
                    [s.step for s in ahead] == list(range(7))
                    and [(s.step, s.positions.tolist(), s.loss_scale) for s in ahead]
                    == [(s.step, s.positions.tolist(), s.loss_scale) for s in now]
                    and [s.plan.digest for s in ahead] == [s.plan.digest for s in now]
                )
        rows[name] = same
    with FreeScale(FreeScaleConfig(balance=CONFIGS["kk"]), cost_model=COST) as fs:
        fs.setup()
        bad = [*_batches(0, 2, 10), np.full(10, np.inf)]
        failing = fs.shares(iter(bad))
        assert [next(failing).step, next(failing).step] == [0, 1]
        with pytest.raises(ValueError, match="costs: must be finite") as e:
            next(failing)
        rows["note"] = e.value.__notes__
        abandoned = fs.shares(iter(_batches(1, 7, 10)))
        assert next(abandoned).step == 0  # the loop stops here: fs.close() stops the planner
    rows["threads"] = [t.name for t in _planners()]
    (out / f"rank{rank}.json").write_text(json.dumps(rows))


def test_freescale_shares_equal_split_on_two_ranks(tmp_path: Path) -> None:
    """12 seeds x 7 steps of 10 samples, per config (kk, lpt, a window of 3, the toggle off):
    shares() gives split's (split_window's) steps, positions, loss scales and digests, the
    digest checks pass on both ranks. Infinite lengths in step 2 raise the cost check's
    ValueError at step 2, noted; a loop that stops after step 0 leaves no planner thread after
    fs.close()."""
    run_ranks(_compare, 2, tmp_path)
    for rank in (0, 1):
        rows = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in CONFIGS:
            assert rows[name] == [True] * 12, (rank, name)
        assert rows["note"] == ["step 2: raised on the balance planner thread (optim.ahead)"]
        assert rows["threads"] == []
