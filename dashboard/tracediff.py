"""Per-op count and duration diff of two runs: HTA's ``TraceDiff`` table (plain functions).

:func:`op_diff` runs HolisticTraceAnalysis 0.5.0's ``TraceDiff.compare_traces`` on the first rank
of each run (HTA's defaults: that rank's first iteration, CPU ops and GPU kernels). HTA parses
slowly and is meant for GPU traces, so the pages call it on demand only. When HTA is not
installed, is not asked for, or cannot load a trace, fsobs computes the same table from its own
event table (events of the trace's first ProfilerStep, grouped by name, durations rounded as
HTA rounds them), labelled as such.

The table: index ``name``; columns ``control_counts``, ``test_counts``,
``control_total_duration``, ``test_total_duration`` (µs), ``diff_counts``, ``diff_duration``
(test - control) and ``counts_change_categories`` (``+``, ``-``, ``=``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fsobs import load_rank
from fsobs.storage import Location

logger = logging.getLogger(__name__)

HTA_SOURCE = "HTA TraceDiff"
FSOBS_SOURCE = "fsobs (HTA TraceDiff's table, computed from fsobs events)"
COLUMNS = (
    "control_counts",
    "test_counts",
    "control_total_duration",
    "test_total_duration",
    "diff_counts",
    "diff_duration",
    "counts_change_categories",
)

RankFile = tuple[Location, int]
"""A trace file and the rank it holds."""


@dataclass(frozen=True)
class OpDiff:
    """The diff table, who computed it, and what was compared."""

    table: pd.DataFrame
    source: str
    note: str


def op_diff(control: RankFile, test: RankFile, *, use_hta: bool) -> OpDiff:
    """HTA's TraceDiff table when ``use_hta`` and HTA can load both files, else fsobs's."""
    note = f"rank {control[1]} of control against rank {test[1]} of test, first step of each"
    if use_hta:
        try:
            return OpDiff(_hta_table(control, test), HTA_SOURCE, note)
        except Exception as exc:  # HTA missing or unable to parse: say so and fall back
            logger.warning("HTA TraceDiff failed: %s", exc)
            note += f"; HTA could not compare these traces ({type(exc).__name__}: {exc})"
    return OpDiff(fsobs_table(control, test), FSOBS_SOURCE, note)


def change_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many ops were added, deleted, increased, decreased, unchanged (HTA's ``ops_diff``)."""
    control, test, diff = table["control_counts"], table["test_counts"], table["diff_counts"]
    return {
        "added": int((control.eq(0) & test.gt(0)).sum()),
        "deleted": int((control.gt(0) & test.eq(0)).sum()),
        "increased": int((control.gt(0) & diff.gt(0)).sum()),
        "decreased": int((test.gt(0) & diff.lt(0)).sum()),
        "unchanged": int((test.gt(0) & diff.eq(0)).sum()),
    }


def fsobs_table(control: RankFile, test: RankFile) -> pd.DataFrame:
    """The TraceDiff table from fsobs's events of each trace's first ProfilerStep."""
    return _diff(_op_summary(control[0]), _op_summary(test[0]))


def _op_summary(path: Location) -> pd.DataFrame:
    events = load_rank(path).events
    steps = events.loc[events["kind"] == "step", "step"]
    if len(steps):
        events = events[events["step"] == int(steps.min())]
    dur_us = events["hta_end"] - events["hta_ts"]  # HTA's rounding of ns timestamps
    grouped = dur_us.groupby(events["name"], observed=True).agg(["count", "sum"])
    return pd.DataFrame(
        {"counts": grouped["count"].astype(float), "total_duration": grouped["sum"]}
    )


def _diff(control: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    both = control.add_prefix("control_").join(test.add_prefix("test_"), how="outer")
    both = both.fillna(0.0)
    both.index = both.index.astype(str)
    both.index.name = "name"
    both["diff_counts"] = both["test_counts"] - both["control_counts"]
    both["diff_duration"] = both["test_total_duration"] - both["control_total_duration"]
    both["counts_change_categories"] = np.select(
        [both["diff_counts"] > 0, both["diff_counts"] < 0], ["+", "-"], "="
    )
    return both[list(COLUMNS)].sort_index()


def _hta_table(control: RankFile, test: RankFile) -> pd.DataFrame:
    if not (isinstance(control[0], Path) and isinstance(test[0], Path)):
        raise ValueError("HTA reads local files only")
    from hta.common.trace import Trace
    from hta.trace_diff import LabeledTrace, TraceDiff

    labeled = [
        LabeledTrace(
            label=label, t=Trace(trace_files={rank: str(path)}, trace_dir=str(path.parent))
        )
        for label, (path, rank) in (("control", control), ("test", test))
    ]
    table = TraceDiff.compare_traces(labeled[0], labeled[1])
    table.index = table.index.astype(str)
    table.index.name = "name"
    ordered: pd.DataFrame = table[list(COLUMNS)].sort_index()
    return ordered
