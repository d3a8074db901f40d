"""Our HTA-compatible metrics equal HTA 0.5.0's own output, HTA run live, on every GPU trace."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fsobs
from fsobs.analysis import analyze_path

REFERENCE = Path(__file__).resolve().parents[1] / "traces" / "reference"
GPU_FOLDERS = [
    "hta_recsys_a2a_2rank",
    "hta_recsys_a2a_rs_16rank_rank0",
    "hta_recsys_a2a_trace_diff/control",
    "hta_recsys_a2a_trace_diff/test",
    "hta_ddp_cnn_nccl_args",
    "hta_ddp_allreduce_rank1",
    "hta_ns_resolution",
    "hta_amd_mi250",
    "hta_cuda_sync_alexnet",
]


@pytest.fixture(scope="module")
def trace_analysis():
    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    return hta.TraceAnalysis


def test_every_gpu_reference_folder_is_covered():
    gpu = sorted(
        str(p.parent.relative_to(REFERENCE))
        for p in REFERENCE.rglob("*.json.gz")
        if fsobs.load_rank(p).device == "gpu"
    )
    assert sorted(set(gpu)) == sorted(GPU_FOLDERS)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # HTA divides 0/0 without comm kernels
@pytest.mark.parametrize("folder", GPU_FOLDERS)
def test_equal_to_hta(folder, trace_analysis):
    ta = trace_analysis(trace_dir=str(REFERENCE / folder))
    ours = analyze_path(REFERENCE / folder).hta

    theirs = ta.get_temporal_breakdown(visualize=False).rename(
        columns=lambda c: c.replace("(us)", "_us")
    )
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
    assert len(ours.idle_time_breakdown) > 0


def test_known_values_recsys_2rank():
    """HTA 0.5.0's numbers from shared/notes/kineto_hta.md §10, as a regression anchor."""
    result = analyze_path(REFERENCE / "hta_recsys_a2a_2rank").hta
    tb = result.temporal_breakdown.set_index("rank")
    assert tb.loc[0, "idle_time_us"] == 321_378
    assert tb.loc[0, "compute_time_us"] == 106_252
    assert tb.loc[0, "non_compute_time_us"] == 172_428
    assert tb.loc[1, "kernel_time_us"] == 600_674
    overlap = result.comm_comp_overlap.set_index("rank")["comp_comm_overlap_pctg"]
    assert overlap.to_dict() == {0: 11.81, 1: 20.05}
