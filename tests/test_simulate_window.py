"""The simulator's balance modes (``SimConfig.balance_method`` / ``balance_window``): a window
keeps each window's samples, `compare` sees the same batches, and the balance-mode study."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fsobs.analysis import analyze_path, compare
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from fsobs.simulate.study import BALANCE_MODES, balance_study

SMALL = SimConfig(world_size=4, steps=6, seed=3, batch_per_rank=8, length_sigma=1.5)
WINDOW = replace(SMALL, balance_method="lpt", balance_window=4)


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
    assert BALANCE_MODES["window8"] == ("lpt", 8)
    with pytest.raises(ValueError, match="modes"):
        balance_study(cfg, world_size=8, seeds=(0,), modes=("window3",))


def test_sim_config_checks_the_balance_mode() -> None:
    with pytest.raises(ValueError, match="window"):
        SimConfig(balance_window=2)  # kk cannot move samples between steps
    with pytest.raises(ValueError, match="method"):
        SimConfig(balance_method="best")
