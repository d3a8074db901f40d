"""Hand-built runs and their bubble table, compared row by row with values in µs (the bubble
tests and the straggler-cause tests share these)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.analysis.bubbles.parts import CLASSES
from tests.support.kineto import write_ranks

TOL_MS = 1e-9


def load_docs(run_dir: Path, docs: list[dict]) -> fsobs.Run:
    """The run of the rank documents ``docs``, written to ``run_dir``."""
    return fsobs.load_run(write_ranks(run_dir, docs))


def checked_table(run: fsobs.Run) -> pd.DataFrame:
    """The bubble table, checked for its identities, indexed by (rank, step)."""
    table = analyze(run).steps
    classes = table[[f"{c}_ms" for c in CLASSES]].sum(axis=1)
    assert (classes - table["window_ms"]).abs().max() < TOL_MS
    assert ((table["window_ms"] - table["busy_ms"]) - table["bubble_ms"]).abs().max() < TOL_MS
    return table.set_index(["rank", "step"])


def expect_row(
    table: pd.DataFrame,
    rank: int,
    step_n: int,
    *,
    window: float,
    busy: float,
    straggler_wait: float = 0,
    exposed_comm: float = 0,
    unattributed: float = 0,
    host_idle: float = 0,
    other: float = 0,
    contention: float = 0,
) -> None:
    """Compare one row against values in µs; also checks that they add up to the window."""
    total = busy + straggler_wait + exposed_comm + unattributed + host_idle + other
    assert total == pytest.approx(window)
    expected_us = {
        "window": window,
        "busy": busy,
        "bubble": window - busy,
        "straggler_wait": straggler_wait,
        "exposed_comm": exposed_comm,
        "unattributed_comm": unattributed,
        "host_idle": host_idle,
        "other": other,
        "contention": contention,
    }
    got = table.loc[(rank, step_n)]
    for name, value in expected_us.items():
        assert got[f"{name}_ms"] == pytest.approx(value / 1000, abs=TOL_MS), (rank, step_n, name)
