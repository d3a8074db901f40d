"""The N-rank simulator (docs/design.md §7): play a job on N ranks through S steps and write
it in the run format, with the truth of every bubble class (no torch).

    cfg = SimConfig(world_size=256, steps=20)          # or calibrate(analyze_path(RUN))
    sched = simulate(cfg, {"balance"})                  # the schedule and its truth, in memory
    write_run(sched, "out/sim256")                      # traces, sidecars, run.json, truth.json
    live = SimWindows(schedule=WindowSchedule(every=10, wait=0, warmup=1, active=4))
    write_run(sched, "out/live", windows=live)          # the live layout, a window every 10

:mod:`fsobs.simulate.schedule` says what each step does and how the truth follows from it;
:mod:`fsobs.simulate.simtrace` how it is written. ``fsobs analyze`` on the written run recovers
the truth (:func:`truth_error`; the test suite checks it within 1% of each step).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from fsobs.simulate.config import SIM_TOGGLES, SimConfig, SimWindows, calibrate
from fsobs.simulate.schedule import TRUTH_CLASSES, Schedule, plan
from fsobs.simulate.simtrace import truth_json, write_run

__all__ = [
    "SIM_TOGGLES",
    "Schedule",
    "SimConfig",
    "SimWindows",
    "calibrate",
    "simulate",
    "truth_error",
    "truth_frame",
    "truth_json",
    "write_run",
]


def simulate(cfg: SimConfig, toggles: Iterable[str] = ()) -> Schedule:
    """The schedule of ``cfg`` under the toggles' policies, with its truth."""
    chosen = frozenset(toggles)
    unknown = sorted(chosen - set(SIM_TOGGLES))
    if unknown:
        raise ValueError(f"toggles: unknown {unknown}, expected some of {list(SIM_TOGGLES)}")
    return plan(cfg, chosen)


def truth_frame(sched: Schedule) -> pd.DataFrame:
    """The truth as a table: ``rank, step, window_ms`` and ``<class>_ms`` (the classes of
    docs/design.md §5, ``contention_ms`` beside), like ``Analysis.steps``."""
    return pd.DataFrame(truth_json(sched)["steps"])


def truth_error(truth: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank, step and class, ``|analyzed - true| / true window`` (the round trip's error);
    columns ``rank, step`` and one per class of the truth."""
    both = truth.merge(steps, on=["rank", "step"], suffixes=("_true", ""))
    out = both[["rank", "step"]].copy()
    window = both["window_ms_true"].to_numpy()
    for name in ("window", *TRUTH_CLASSES, "contention"):
        col = f"{name}_ms"
        out[col] = np.abs(both[col].to_numpy() - both[f"{col}_true"].to_numpy()) / window
    return out
