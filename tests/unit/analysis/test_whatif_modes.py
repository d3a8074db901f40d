"""What-if of each balance mode (issue 27, point 7): the re-split of a hand-built 2-rank
baseline in every mode, against partitions derived by hand; the modes' names; the prediction
of each mode from a simulated baseline against the simulator's run in that mode; the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fsobs.analysis import analyze_path
from fsobs.analysis.whatif.calibration import Calibration
from fsobs.analysis.whatif.predict import whatif
from fsobs.analysis.whatif.splits import BalanceSplit, resplit
from fsobs.cli import main
from fsobs.simulate.simulator import Schedule, SimConfig, simulate, truth_frame, write_run
from optim.balance import CostModel
from optim.plan import BalanceConfig
from tests.unit.analysis.test_whatif import QUIET, calibration

LENGTHS = {
    (0, 0): [9, 7, 6],
    (1, 0): [5, 4, 1],
    (0, 1): [10, 3, 3],
    (1, 1): [2, 1, 1],
}
"""Two ranks, two steps of 3 samples each (the random split: rank 0 takes the first half)."""
PARTITION = CostModel(c0=0.0, a=1.0, b=0.0)
"""The job's cost model: c(L) = L."""
FITTED = CostModel(c0=1.0, a=1.0, b=0.0)
"""The busy model fitted on the run: 1 + L per sample, so a share costs n + ΣL."""


def _calibration(lengths: dict[tuple[int, int], list[int]], steps: list[int]) -> Calibration:
    """Speed 1, no residual: the predicted busy time is the fitted model on the new share."""
    return calibration(lengths, FITTED, steps)


def _busy(name: str, steps: tuple[int, ...] = (0, 1)) -> list[list[float]]:
    cal = _calibration(LENGTHS, list(steps))
    split = resplit(cal, PARTITION, BalanceSplit.parse(name), 0.0)
    return split.predicted_ns.T.tolist()  # [step][rank]


def test_kk_equal_counts_by_hand() -> None:
    # step 0, costs 9 7 6 5 4 1: KK pairs (9,7) (6,5) (4,1); (4|1) with (9|7): 4+7 | 1+9, then
    # with (6|5): 16 | 16 = {9 6 1} {7 5 4}, 3 samples each: busy 3 + 16 = 19 each.
    # step 1, costs 10 3 3 2 1 1: KK gives {10 2 1} {3 3 1} (13 | 7), capped LPT (3 per rank)
    # {10 1 1} {3 3 2} (12 | 8): the lower max wins; busy 3 + 12, 3 + 8
    assert _busy("kk") == [[19.0, 19.0], [15.0, 11.0]]
    split = resplit(_calibration(LENGTHS, [0, 1]), PARTITION, BalanceSplit.parse("kk"), 0.0)
    assert split.imbalance_before.tolist() == pytest.approx([22 / 16, 16 / 10])
    assert split.imbalance_after.tolist() == pytest.approx([1.0, 12 / 10])


def test_kk_unequal_and_lpt_by_hand() -> None:
    # step 1 unequal: the 10 alone, 3 3 2 1 1 on the other rank (10 | 10): busy 1 + 10, 5 + 10
    assert _busy("kk-unequal") == [[19.0, 19.0], [11.0, 15.0]]
    # lpt, step 0: 9 -> r0, 7 -> r1, 6 -> r1 (13), 5 -> r0 (14), 4 -> r1 (17), 1 -> r0 (15)
    assert _busy("lpt") == [[18.0, 20.0], [11.0, 15.0]]


def test_window_deals_two_steps_by_hand() -> None:
    # pooled 9 7 6 5 4 1 | 10 3 3 2 1 1 (total 52) into 2 steps x 2 ranks: levels
    # max(10, 52 / 4) = 13 and max(7, 26 / 2) = 13, then LPT into the 4 bins:
    # (0,0) 10 3, (0,1) 9 3 1, (1,0) 7 4 2, (1,1) 6 5 1 1: 13 each (the per-step plans' step
    # maxima sum to 16 + 12 (kk) or 17 + 10 (lpt), more than 13 + 13: the deal is kept)
    assert _busy("window:2") == [[15.0, 16.0], [16.0, 17.0]]
    # only step 1 traced: the window still pools step 0's lengths from the sidecars
    assert _busy("window:2", steps=(1,)) == [[16.0, 17.0]]
    # a third step is a window of its own: 2 2 | 1 1 at level max(2, 6 / 2) = 3: {2 1} {2 1}
    three = {**LENGTHS, (0, 2): [2, 2], (1, 2): [1, 1]}
    cal = _calibration(three, [0, 1, 2])
    split = resplit(cal, PARTITION, BalanceSplit.parse("window:2"), 0.0)
    assert split.predicted_ns[:, 2].tolist() == [5.0, 5.0]
    assert split.short_windows == 1
    assert split.imbalance_after.tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_mode_names() -> None:
    for name in ("kk", "lpt", "kk-unequal", "window:4"):
        assert BalanceSplit.parse(name).name == name
    assert BalanceSplit.parse("window:8") == BalanceSplit(
        BalanceConfig(enabled=True, method="lpt", window=8)
    )
    assert BalanceSplit.parse("kk-unequal").config == BalanceConfig(enabled=True, counts="unequal")
    for bad in ("random", "window:1", "window:x", "window", ""):
        with pytest.raises(ValueError, match="balance_split"):
            BalanceSplit.parse(bad)
    for config in (
        BalanceConfig(enabled=True, window=2),  # a window is named lpt's (window:K)
        BalanceConfig(enabled=True, method="random"),
        BalanceConfig(),  # off
    ):
        with pytest.raises(ValueError, match="balance_split"):
            BalanceSplit(config)


CFG = SimConfig(world_size=4, steps=8, seed=3, **QUIET)
MODES = {
    "kk": BalanceConfig(),
    "lpt": BalanceConfig(method="lpt"),
    "kk-unequal": BalanceConfig(counts="unequal"),
    "window:2": BalanceConfig(method="lpt", window=2),
    "window:4": BalanceConfig(method="lpt", window=4),
}
"""The modes the simulator plays (:attr:`SimConfig.balance`)."""


def _bubble(sched: Schedule) -> float:
    truth = truth_frame(sched)
    return float((truth["window_ms"] - truth["busy_ms"]).mean())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whatif_modes") / "base"
    write_run(simulate(CFG), root, workers=1)
    return root


@pytest.mark.parametrize("name", list(MODES))
def test_each_mode_predicted_from_a_simulated_baseline(baseline: Path, name: str) -> None:
    """Noise-free, the prediction from the baseline alone is within 1 pp of the simulator's run
    in that mode on the same batches (its truth)."""
    cfg = replace(CFG, balance=MODES[name])
    run = simulate(cfg, {"balance"})
    measured = 1 - _bubble(run) / _bubble(simulate(CFG))
    w = whatif(
        analyze_path(baseline),
        ("balance",),
        draws=5,
        planner_ns=0.0,
        balance_split=BalanceSplit.parse(name),
    )
    assert w.predictions[0].bubble_reduction == pytest.approx(measured, abs=0.01)
    assert w.calibration is not None and w.calibration.resplit is not None
    assert w.calibration.resplit.balance_split == name
    assert any(n.startswith(f"balance {name}:") for n in w.notes) == (MODES[name].window > 1)


def test_cli_names_the_mode(baseline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["whatif", str(baseline), "--toggles", "balance,sm_free", "--draws", "3"]
    assert main([*args, "--balance-split", "window:4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calibration"]["balance_split"] == "window:4"
    assert main([*args, "--balance-split", "kk-unequal"]) == 0
    out = capsys.readouterr().out
    assert "balance (kk-unequal) + sm_free" in out
    with pytest.raises(SystemExit) as exc:
        main([*args, "--balance-split", "window:1"])
    assert exc.value.code == 2
    assert "balance_split" in capsys.readouterr().err
    # without the balance toggle the mode would be ignored: refused in one line
    sm_free = ["whatif", str(baseline), "--toggles", "sm_free", "--balance-split", "lpt"]
    assert main(sm_free) == 2
    err = capsys.readouterr().err
    assert "--balance-split needs the balance toggle" in err and err.count("\n") == 1
