"""Non-GPU accelerators (issue 36, point 1): an MTIA trace (HTA's own test trace
``tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz``) stopped fsobs with an IndexError in
``gpu_gaps``: its device work is ``mtia_ccp_events`` (kernels and ``dma_request`` copies, each
with ``args.stream`` and a correlation id), launched by ``mtia_runtime`` calls, and none of it
counted as device work while the rank had (gloo) collectives.

The hand-built trace copies that shape (an ``MTIA 9`` process, one stream per tid, the
runtime's ``runFunction - job_prep_and_submit_for_execution``) on the timeline of
``test_other_traces_format.py``'s 2021 trace, whose rows are worked out there::

    t (µs)   0   10  30     60 65 75    100       130     150 155    200
    CPU      |-----ProfilerStep#5-------|-------ProfilerStep#6-------|
    MTIA             |==fc==|  |dma|           |==fc==|dma|
    windows          [---------- 5 -------------)[-- 6 -)

Window 5 = [30, 130): fc 30 busy, the DMA copy 10 other, host idle 60. Window 6 =
[130, 155): fc 20 busy, the copy 5 other.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import fsobs
from fsobs.analysis import analyze_path
from fsobs.analysis.collectives.lateness import gpu_gaps
from fsobs.trace.categorical import is_in
from tests.support.bubble_rows import expect_row
from tests.support.kineto import write

T0 = 3_605_054_881_000.0  # µs, as the MTIA trace's
HOST, MTIA = 3100453, 9
RUN_FUNCTION = "runFunction - job_prep_and_submit_for_execution"


def _host(name: str, cat: str, ts: float, dur: float, **args: object) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": HOST, "tid": HOST, "ts": T0 + ts}
    return event | {"dur": dur, "args": dict(args)}


def _device(name: str, ts: float, dur: float, corr: int, stream: int = 1) -> dict:
    args = {"stream": stream, "correlation": corr}
    event = {"ph": "X", "cat": "mtia_ccp_events", "name": name, "pid": MTIA, "tid": stream}
    return event | {"ts": T0 + ts, "dur": dur, "args": args}


def _process(pid: int, name: str) -> dict:
    return {
        "name": "process_name",
        "ph": "M",
        "ts": 0,
        "pid": pid,
        "tid": 0,
        "args": {"name": name},
    }


def _doc(device_events: list[dict]) -> dict:
    events = [
        _process(MTIA, f"MTIA {MTIA}"),
        _host("ProfilerStep#5", "user_annotation", 0, 100),
        _host("ProfilerStep#6", "user_annotation", 100, 100),
        _host("aten::linear", "cpu_op", 10, 10),
        _host("aten::linear", "cpu_op", 102, 8),
        _host(RUN_FUNCTION, "mtia_runtime", 12, 1, correlation=1),
        _host(RUN_FUNCTION, "mtia_runtime", 15, 2, correlation=2),
        _host(RUN_FUNCTION, "mtia_runtime", 104, 3, correlation=3),
        _host(RUN_FUNCTION, "mtia_runtime", 113, 1, correlation=4),
        *device_events,
    ]
    info = {"backend": "mtia:hccl,cpu:gloo", "rank": 0, "world_size": 1}
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": events}


MTIA_WORK = [
    _device("fc-dtype_Float", 30, 30, 1),
    _device("dma_request", 65, 10, 2),
    _device("fc-dtype_Float", 130, 20, 3),
    _device("dma_request", 150, 5, 4),
]


def test_mtia_kernels_and_copies_are_device_work(tmp_path):
    rank = fsobs.load_rank(write(tmp_path / "mtia_rank_0.json", _doc(MTIA_WORK)))
    assert rank.device == "gpu"  # the device, whichever accelerator it is
    ev = rank.events.set_index("name")
    assert set(ev.loc["fc-dtype_Float", "kind"]) == {"compute"}
    assert set(ev.loc["dma_request", "kind"]) == {"memcpy"}
    assert set(ev.loc[RUN_FUNCTION, "kind"]) == {"runtime"}
    assert set(ev.loc["fc-dtype_Float", "step"]) == {5, 6}  # through their launches


def test_an_mtia_trace_is_split_into_its_steps(tmp_path):
    write(tmp_path / "mtia_rank_0.json", _doc(MTIA_WORK))
    table = analyze_path(tmp_path).steps.set_index(["rank", "step"])
    expect_row(table, 0, 5, window=100, busy=30, host_idle=60, other=10)
    expect_row(table, 0, 6, window=25, busy=20, other=5)


def test_collectives_on_a_device_rank_without_device_work(tmp_path):
    """A device rank whose device shows only annotations (no kernel, no copy) and which has
    collectives: each collective's device gap reaches back to the trace's start (the rule for
    a first kernel), instead of the IndexError the MTIA trace ended in."""
    annotation = {"ph": "X", "cat": "gpu_user_annotation", "name": "## forward ##"}
    annotation |= {"pid": MTIA, "tid": 1, "ts": T0 + 20, "dur": 50, "args": {"stream": 1}}
    gloo = [
        _host("gloo:barrier", "user_annotation", 40, 5),
        _host("gloo:barrier", "user_annotation", 140, 5),
    ]
    doc = _doc([annotation])
    doc["traceEvents"] += gloo
    rank = fsobs.load_rank(write(tmp_path / "mtia_rank_0.json", doc))
    assert rank.device == "gpu"
    ev = rank.events
    rows = np.flatnonzero(is_in(ev["kind"], ("comm",)))
    arrival = ev["ts_ns"].to_numpy()[rows]
    gap, _ = gpu_gaps(rank, rows, arrival)
    start = int(ev["ts_ns"].min())  # the trace's first event: ProfilerStep#5 at 0
    assert (arrival - start).tolist() == [40_000, 140_000]
    assert gap.tolist() == [40_000, 140_000]
    analyze_path(tmp_path)  # and the whole analysis runs


def test_hta_reads_the_mtia_shape_as_fsobs_does(tmp_path):
    """HTA 0.5.0 (run live) counts ``mtia_ccp_events`` as kernels and ``dma*`` as memory: its
    temporal breakdown equals fsobs's HTA section on this trace (on the real MTIA trace too:
    idle 5,649,476 µs, 54.81% compute, both)."""
    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    write(tmp_path / "mtia_rank_0.json", _doc(MTIA_WORK))
    temporal = hta.TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    ours = analyze_path(tmp_path).hta
    assert ours is not None
    columns = [c.replace("(us)", "_us") for c in temporal.columns]
    np.testing.assert_array_equal(
        ours.temporal_breakdown[columns].to_numpy(float), temporal.to_numpy(float)
    )
    # by hand: HTA drops what the last ProfilerStep launched (its rule with two step names,
    # hta_compat rule 2), so step 5's work is left: [30, 75), fc 30 compute, DMA 10 non-compute
    row = ours.temporal_breakdown.iloc[0]
    assert (row["compute_time_us"], row["non_compute_time_us"]) == (30, 10)
    assert row["idle_time_us"] == 45 - 30 - 10
