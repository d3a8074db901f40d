"""The simulator's balance modes (``SimConfig.balance``, a ``BalanceConfig``): a window
keeps each window's samples, `compare` sees the same batches, the balance-mode study, and
``fsobs simulate``'s balance flags."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fsobs.analysis import analyze_path, compare
from fsobs.cli import main
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from fsobs.simulate.study import BALANCE_MODES, balance_study
from optim.plan import BalanceConfig

SMALL = SimConfig(world_size=4, steps=6, seed=3, batch_per_rank=8, length_sigma=1.5)
WINDOW = replace(SMALL, balance=BalanceConfig(method="lpt", window=4))


def _pooled(step_parts: list[list[np.ndarray]]) -> list[int]:
    return sorted(np.concatenate([p for parts in step_parts for p in parts]).tolist())


def test_a_window_keeps_each_windows_samples_and_balances_better() -> None:
    base, kk = simulate(SMALL), simulate(SMALL, {"balance"})
    win = simulate(WINDOW, {"balance"})
    # windows of 4 steps from step 0: steps 0-3, then the short window 4-5
    for lo, hi in ((0, 4), (4, 6)):
        assert _pooled(win.lengths[lo:hi]) == _pooled(base.lengths[lo:hi])
    counts = [sum(p.size for p in parts) for parts in win.lengths]
    assert sum(counts) == 6 * 4 * 8 and len(set(counts)) > 1  # each step's size varies
    assert win.imbalance_after.mean() < kk.imbalance_after.mean()
    assert np.array_equal(win.imbalance_before, base.imbalance_before)


def test_compare_sees_the_same_batches_within_each_window(tmp_path: Path) -> None:
    write_run(simulate(SMALL), tmp_path / "base", workers=1)
    write_run(simulate(WINDOW, {"balance"}), tmp_path / "win", workers=1)
    c = compare(analyze_path(tmp_path / "base"), analyze_path(tmp_path / "win"))
    assert c.same_batches is True
    assert not [w for w in c.warnings if "global batches" in w]


def test_balance_study_rows_and_modes() -> None:
    cfg = replace(SMALL, steps=4)
    frame = balance_study(cfg, world_size=8, seeds=(0,), modes=("kk", "window2"))
    assert list(frame["mode"]) == ["kk", "kk", "window2", "window2"]
    assert list(frame["toggles"]) == ["balance", "all"] * 2
    assert (frame["bubble_reduction"] > 0).all()
    assert BALANCE_MODES["window8"] == BalanceConfig(method="lpt", counts="unequal", window=8)
    with pytest.raises(ValueError, match="modes"):
        balance_study(cfg, world_size=8, seeds=(0,), modes=("window3",))


def test_sim_config_plays_its_balance_config_with_the_toggle() -> None:
    """``SimConfig.balance`` is the policy; the toggles simulated switch it on or off."""
    assert SMALL.balance == BalanceConfig() and not SMALL.balance.enabled
    assert WINDOW.balance_config(enabled=True) == BalanceConfig(
        enabled=True, method="lpt", window=4
    )
    assert not WINDOW.balance_config(enabled=False).enabled


def test_cli_simulate_balance_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fsobs simulate --balance-method --balance-window`` plays that mode and records it in
    run.json's workload at a real run's paths (``freescale.balance``, BalanceConfig's own
    JSON); the toggle off records BalanceConfig's defaults."""
    common = ["simulate", "--world-size", "4", "--steps", "4", "--seed", "3", "--workers", "1"]
    flags = ["--toggles", "balance", "--balance-method", "lpt", "--balance-window", "2"]
    assert main([*common, *flags, "--out", str(tmp_path / "win")]) == 0
    assert "balance (lpt, unequal counts, window 2)" in capsys.readouterr().out
    assert main([*common, "--out", str(tmp_path / "base")]) == 0
    workload = {
        name: json.loads((tmp_path / name / "run.json").read_text())["workload"]
        for name in ("win", "base")
    }
    on = BalanceConfig(enabled=True, method="lpt", window=2)
    assert workload["win"]["freescale"]["balance"] == {
        "enabled": True,
        "method": "lpt",
        "counts": "unequal",
        "mode": "plan",
        "check_every": on.check_every,
        "window": 2,
    }
    assert workload["base"]["freescale"]["balance"] == dataclasses.asdict(BalanceConfig())
    assert workload["win"]["steps"] == 4 and workload["win"]["simulator"]["steps"] == 4
    flags = ["--toggles", "balance", "--balance-counts", "unequal", "--out", str(tmp_path / "u")]
    assert main([*common, *flags]) == 0
    assert "balance (kk, unequal counts, window 1)" in capsys.readouterr().out
    sizes = analyze_path(tmp_path / "u").run.sidecar.groupby(["step", "rank"])["num_samples"]
    assert sizes.sum().nunique() > 1  # unequal counts: ranks of a step hold different numbers
    # the same run as the library's: each window of 2 steps keeps its samples, the steps'
    # sizes differ (4 ranks x 32 samples per step in the baseline)
    win, base = analyze_path(tmp_path / "win"), analyze_path(tmp_path / "base")
    sizes = win.run.sidecar.groupby("step")["num_samples"].sum()
    assert sizes.sum() == 4 * 4 * 32 and sizes.nunique() > 1
    assert compare(base, win).same_batches is True


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--balance-method", "lpt"], "--balance-method needs --toggles balance"),
        (
            ["--toggles", "balance", "--balance-window", "2", "--balance-counts", "equal"],
            "window: 2 needs counts 'unequal'",
        ),
        (
            ["--toggles", "balance", "--balance-window", "2", "--balance-method", "random"],
            "window: 2 needs counts 'unequal'",
        ),
    ],
)
def test_cli_simulate_balance_flag_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    args = ["simulate", "--world-size", "2", "--steps", "2", "--out", str(tmp_path / "x")]
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
