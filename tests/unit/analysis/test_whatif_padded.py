"""The what-if's balance re-split with a padded cost model (``--cost-model`` of a padded
``fit-cost``): planned with the padded objective, as the job plans it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsobs.analysis.whatif.splits import BalanceSplit, resplit
from fsobs.cli import main
from fsobs.errors import FsobsError
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from optim.balance import CostModel
from tests.unit.analysis.test_whatif import QUIET, calibration

PAD = CostModel(c0=0.0, a=0.0, b=0.0, padded=1.0)
SQUARE = CostModel(c0=0.0, a=0.0, b=1.0)


def test_resplit_with_a_padded_model():
    """Rank 0 has 6 6 5, rank 1 5 5 5: the global batch 6 6 5 5 5 5 split for n · max(L)² with
    unequal counts is [6 6] [5 5 5 5] (tests/unit/optim/test_padded.py); the busy model fitted on
    the run (L²) predicts 36 + 36 = 72 and 4 · 25 = 100 ns for those shares. The random split
    costs 108 and 75 under the padded model (imbalance 108 / 91.5), the new one 72 and 100."""
    cal = calibration({(0, 0): [6, 6, 5], (1, 0): [5, 5, 5]}, SQUARE)
    split = resplit(cal, PAD, BalanceSplit.parse("kk-unequal"), planner_ns=0.0)
    assert split.predicted_ns[:, 0].tolist() == [72.0, 100.0]
    assert split.imbalance_before[0] == pytest.approx(108 / 91.5)
    assert split.imbalance_after[0] == pytest.approx(100 / 86)


def test_a_window_refuses_a_padded_model():
    cal = calibration({(0, 0): [6, 6, 5], (1, 0): [5, 5, 5]}, SQUARE)
    with pytest.raises(FsobsError, match="^balance_split: window:2 deals per-sample costs"):
        resplit(cal, PAD, BalanceSplit.parse("window:2"))


def test_cli_whatif_with_a_padded_cost_model(tmp_path: Path, capsys) -> None:
    run = tmp_path / "base"
    write_run(simulate(SimConfig(world_size=4, steps=6, seed=3, **QUIET), ()), run, workers=1)
    model = CostModel(c0=1_000.0, a=50.0, b=0.0, batch=20_000.0, padded=0.5)
    model.to_json(run / "cost_model.json")
    cmd = ["whatif", str(run), "--toggles", "balance", "--draws", "3", "--json"]
    for mode in ("kk", "kk-unequal", "lpt"):
        argv = [*cmd, "--cost-model", str(run / "cost_model.json"), "--balance-split", mode]
        assert main(argv) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["calibration"]["balance_split"] == mode
    argv = [*cmd, "--cost-model", str(run / "cost_model.json"), "--balance-split", "window:2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cost model is padded" in err
