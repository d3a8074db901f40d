"""Our HTA-compatible metrics equal HTA 0.5.0's own output, HTA run live, on every GPU trace."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import fsobs
from fsobs.analysis import analyze_path
from fsobs.analysis.hta_compat import HtaView, _hta_merge, comm_comp_overlap, temporal_breakdown
from tests.support.hta_check import assert_equal_to_hta, hta_trace_analysis
from tests.support.kineto import REFERENCE

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
    "tracelens_h100_timesformer",
    "tracelens_mi300x_resnet_act_checkpoint_rank0",
]


@pytest.fixture(scope="module")
def trace_analysis():
    return hta_trace_analysis()


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
    ours = analyze_path(REFERENCE / folder).hta
    assert_equal_to_hta(REFERENCE / folder, ours, trace_analysis)
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


def test_known_values_sub_microsecond_events():
    """HTA 0.5.0's numbers on the two TraceLens traces, as a regression anchor.

    Both have events shorter than 1 µs whose rounded length is -1 (``ceil(ts) > floor(ts+dur)``),
    which HTA's interval merge counts: 12 ``Memset (Device)`` on the H100 add 12 µs of idle, 21
    elementwise kernels under an RCCL kernel on the MI300X remove 21 µs of compute.
    """
    h100 = analyze_path(REFERENCE / "tracelens_h100_timesformer").hta.temporal_breakdown
    assert h100.loc[0, ["idle_time_us", "compute_time_us", "non_compute_time_us"]].tolist() == [
        2098,
        154_407,
        3486,
    ]
    mi300 = analyze_path(REFERENCE / "tracelens_mi300x_resnet_act_checkpoint_rank0").hta
    tb = mi300.temporal_breakdown
    assert tb.loc[0, ["idle_time_us", "compute_time_us", "non_compute_time_us"]].tolist() == [
        1541,
        17_018,
        37_958,
    ]


@pytest.mark.parametrize("seed", range(20))
def test_merge_equals_hta_merge_kernel_intervals(seed):
    """Our copy of HTA's interval merge, on rounded events with ties, zero and -1 lengths."""
    utils = pytest.importorskip("hta.utils.utils")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 2000))
    ts = rng.integers(0, 3 * n, n).astype(np.int64)
    dur = rng.choice([-1.0, 0.0, 1.0, 2.0, 5.0, 30.0], n, p=[0.2, 0.2, 0.2, 0.2, 0.1, 0.1])
    theirs = utils.merge_kernel_intervals(pd.DataFrame({"ts": ts, "dur": dur}))
    starts, ends = _hta_merge(ts, ts + dur)
    np.testing.assert_array_equal(starts, theirs["ts"].to_numpy())
    np.testing.assert_array_equal(ends, theirs["end"].to_numpy())


_NAMES = ["gemm", "ncclDevKernel_AllReduce", "Memset (Device)", "Memcpy HtoD", "elementwise"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # HTA divides 0/0 without comm kernels
@pytest.mark.parametrize("seed", range(10))
def test_breakdown_and_overlap_equal_hta_on_random_events(seed):
    """HTA's own analyses on random rounded events (ties, zero and -1 lengths, three streams)."""
    breakdown = pytest.importorskip("hta.analyzers.breakdown_analysis")
    communication = pytest.importorskip("hta.analyzers.communication_analysis")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 2000))
    ts = rng.integers(0, max(2, int(n * rng.choice([0.2, 1, 5]))), n).astype(np.int64)
    dur = rng.choice([-1.0, 0.0, 1.0, 3.0, 20.0, 200.0], n, p=[0.3, 0.2, 0.2, 0.1, 0.15, 0.05])
    name = rng.integers(0, len(_NAMES), n)
    stream = np.where(name == 1, 20, rng.choice([7, 8], n))

    def hta_trace():
        df = pd.DataFrame({"ts": ts, "dur": dur, "stream": stream, "name": name})
        symbols = SimpleNamespace(get_sym_table=lambda: _NAMES)
        return SimpleNamespace(traces={0: df}, symbol_table=symbols)

    frame = pd.DataFrame(
        {"ts": ts.astype(float), "end": ts + dur, "stream": stream, "name": np.take(_NAMES, name)}
    )
    views = {0: HtaView(rank=0, frame=frame)}
    ours = temporal_breakdown(views)
    try:
        theirs = breakdown.BreakdownAnalysis.get_temporal_breakdown(hta_trace(), visualize=False)
    except AssertionError:  # HTA's `assert non_compute_time >= 0`
        assert ours.loc[0, "non_compute_time_us"] < 0
    else:
        theirs = theirs.rename(columns=lambda c: c.replace("(us)", "_us"))[list(ours.columns)]
        np.testing.assert_array_equal(ours.to_numpy(float), theirs.to_numpy(float))
    theirs = communication.CommunicationAnalysis.get_comm_comp_overlap(hta_trace(), visualize=False)
    np.testing.assert_array_equal(
        comm_comp_overlap(views).to_numpy(float),
        theirs[["rank", "comp_comm_overlap_pctg"]].to_numpy(float),
    )
