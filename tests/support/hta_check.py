"""One comparison with HTA 0.5.0, run live: our HTA-compatible metrics of a trace folder against
HTA's own temporal breakdown, comm/comp overlap and idle-time breakdown."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fsobs.analysis.hta_compat import HtaView


def hta_trace_analysis() -> Any:
    """HTA's ``TraceAnalysis`` class (the test skips without HTA), its logging quiet."""
    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    return hta.TraceAnalysis


def hta_breakdown(ta: Any) -> pd.DataFrame:
    """HTA's temporal breakdown with our column names (``idle_time_us`` for ``idle_time(us)``)."""
    return ta.get_temporal_breakdown(visualize=False).rename(
        columns=lambda c: c.replace("(us)", "_us")
    )


def assert_equal_to_hta(folder: Path, ours: HtaView | None, trace_analysis: Any) -> Any:
    """Assert ``ours`` (``analyze_path(folder).hta``) equals HTA on ``folder``; returns HTA's
    ``TraceAnalysis`` of it."""
    assert ours is not None
    ta = trace_analysis(trace_dir=str(folder))
    theirs = hta_breakdown(ta)
    columns = list(theirs.columns)
    assert columns == list(ours.temporal_breakdown.columns)
    np.testing.assert_array_equal(
        ours.temporal_breakdown[columns].to_numpy(float), theirs.to_numpy(float)
    )

    theirs = ta.get_comm_comp_overlap(visualize=False)[["rank", "comp_comm_overlap_pctg"]]
    np.testing.assert_array_equal(ours.comm_comp_overlap.to_numpy(float), theirs.to_numpy(float))

    theirs, _ = ta.get_idle_time_breakdown(ranks=ta.t.get_ranks(), visualize=False)
    theirs = theirs.rename(columns={"idle_time": "idle_time_us"}).reset_index(drop=True)
    pd.testing.assert_frame_equal(
        ours.idle_time_breakdown, theirs[list(ours.idle_time_breakdown.columns)], check_dtype=False
    )
    return ta
