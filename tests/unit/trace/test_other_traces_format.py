"""Historical trace shapes (issue 24, point 2): PyTorch 1.8 / 1.9 Kineto traces name CPU ops,
``ProfilerStep#N`` included, ``Operator`` (and kernels ``Kernel``, copies ``Memcpy``, ...); they
are read as today's (:mod:`fsobs.trace._legacy`), so their steps are steps. The hand-built trace
copies the shape of pytorch/kineto's 2021 sample
``tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz``: absolute
integer µs, no ``baseTimeNanoseconds``, no ``distributedInfo``, string tids, ``Input dims``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import fsobs
from fsobs.analysis import analyze_path
from tests.support.bubble_rows import expect_row
from tests.support.kineto import write

T0 = 1_623_142_623_460_000  # µs since the epoch, as the 2021 sample
PID, TID = 25738, "25738"


def _op(name: str, ts: int, dur: int, **args: object) -> dict:
    event = {"ph": "X", "cat": "Operator", "name": name, "pid": PID, "tid": TID}
    return event | {"ts": T0 + ts, "dur": dur, "args": {"Trace name": "PyTorch Profiler", **args}}


def _runtime(name: str, ts: int, corr: int) -> dict:
    event = {"ph": "X", "cat": "Runtime", "name": name, "pid": PID, "tid": TID}
    return event | {"ts": T0 + ts, "dur": 2, "args": {"cbid": 211, "correlation": corr}}


def _gpu(cat: str, name: str, ts: int, dur: int, corr: int) -> dict:
    args = {"device": 0, "stream": 7, "correlation": corr, "external id": corr}
    event = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": "stream 7"}
    return event | {"ts": T0 + ts, "dur": dur, "args": args}


def _doc_2021() -> dict:
    """Two steps, launched work on stream 7::

        t (µs)   0   10  30     60 65 75    100       130     150 155    200
        CPU      |-----ProfilerStep#5-------|-------ProfilerStep#6-------|
        GPU              |=gemm=|  |mc|            |=gemm=|ms|
        windows          [---------- 5 -------------)[-- 6 -)

    Window 5 = [30, 130): gemm 30 busy, the copy 10 other, host_idle 60. Window 6 =
    [130, 155): gemm 20 busy, the memset 5 other.
    """
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Traces"}
        | {"tid": "PyTorch Profiler", "ts": T0, "dur": 200},
        _op("ProfilerStep#5", 0, 100),
        _op("ProfilerStep#6", 100, 100),
        _op("aten::mm", 10, 10, **{"Input dims": [[2, 3], [3, 4]]}),
        _op("aten::mm", 102, 8, **{"Input dims": [[2, 3], [3, 4]]}),
        _op("aten::add", 111, 1, **{"Input dims": [[2, 4], [2, 4]]}),
        _runtime("cudaLaunchKernel", 12, 1),
        _runtime("cudaMemcpyAsync", 15, 2),
        _runtime("cudaLaunchKernel", 104, 3),
        _runtime("cudaMemsetAsync", 113, 4),
        _gpu("Kernel", "volta_sgemm_128x64_nn", 30, 30, 1),
        _gpu("Memcpy", "Memcpy HtoD (Pageable -> Device)", 65, 10, 2),
        _gpu("Kernel", "volta_sgemm_128x64_nn", 130, 20, 3),
        _gpu("Memset", "Memset (Device)", 150, 5, 4),
        {"ph": "s", "id": 1, "pid": PID, "tid": PID, "ts": T0 + 12, "cat": "async"}
        | {"name": "launch"},
    ]
    return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}


def test_a_2021_trace_has_its_profiler_steps_and_todays_categories(tmp_path):
    rank = fsobs.load_rank(write(tmp_path / "worker0.pt.trace.json", _doc_2021()))
    assert rank.step_source == "ProfilerStep" and rank.steps == [5, 6]
    assert rank.time_format == "absolute-us"
    ev = rank.events.set_index("name")
    assert ev.loc["ProfilerStep#5", "cat"] == "cpu_op"
    assert ev.loc["ProfilerStep#5", "kind"] == "step"
    assert set(ev.loc["volta_sgemm_128x64_nn", "kind"]) == {"compute"}
    assert set(ev.loc["volta_sgemm_128x64_nn", "step"]) == {5, 6}
    assert ev.loc["Memcpy HtoD (Pageable -> Device)", "kind"] == "memcpy"
    assert ev.loc["Memset (Device)", "kind"] == "memset"
    assert set(ev.loc["cudaLaunchKernel", "kind"]) == {"runtime"}
    assert ev.loc["aten::add", "kind"] == "compute"
    # "Input dims" (2021's spelling) tells like ops apart: the two mm are alike, add is not
    mm = ev.loc["aten::mm", "shape_key"].tolist()
    assert mm[0] == mm[1] != 0 and ev.loc["aten::add", "shape_key"] not in (0, mm[0])
    assert not any("no ProfilerStep" in w for w in rank.warnings)


def test_a_2021_trace_is_split_into_its_steps(tmp_path):
    write(tmp_path / "worker0.pt.trace.json", _doc_2021())
    result = analyze_path(tmp_path)
    assert result.run.steps == [5, 6]
    table = result.steps.set_index(["rank", "step"])
    expect_row(table, 0, 5, window=100, busy=30, host_idle=60, other=10)
    expect_row(table, 0, 6, window=25, busy=20, other=5)


def test_hta_reads_the_2021_trace_as_fsobs_does(tmp_path):
    """HTA's rules look at the category only to pick kernels, copies and memsets for the idle
    breakdown, and accept the 2021 names there: reading the categories as today's changes
    none of its numbers (HTA 0.5.0, run live)."""
    hta = pytest.importorskip("hta.trace_analysis")
    logging.getLogger("hta").setLevel(logging.ERROR)
    write(tmp_path / "worker0.pt.trace.json", _doc_2021())
    theirs = hta.TraceAnalysis(trace_dir=str(tmp_path))
    ours = analyze_path(tmp_path).hta
    temporal = theirs.get_temporal_breakdown(visualize=False)
    columns = [c.replace("(us)", "_us") for c in temporal.columns]
    np.testing.assert_array_equal(
        ours.temporal_breakdown[columns].to_numpy(float), temporal.to_numpy(float)
    )
    idle, _ = theirs.get_idle_time_breakdown(ranks=[0], visualize=False)
    assert ours.idle_time_breakdown["idle_time_us"].tolist() == idle["idle_time"].tolist()
    assert idle["idle_time"].sum() > 0  # the 5 µs before the copy, at least


def test_a_bare_array_of_events_is_refused_with_what_it_is(tmp_path):
    """The autograd profiler's legacy ``export_chrome_trace`` writes ``[{"name": ..., "ph": "X",
    "pid": "CPU functions", "args": {}}, ...]``: no category, stream or step to analyze."""
    event = {"name": "aten::mm", "ph": "X", "ts": 1, "dur": 2, "tid": 1, "pid": "CPU functions"}
    path = write(tmp_path / "legacy.json", [event | {"args": {}}])  # a list, not a document
    with pytest.raises(fsobs.TraceFormatError) as error:
        fsobs.load_rank(path)
    assert str(error.value) == (
        f"{path}: not a Kineto trace: expected an object, got an array (a bare array of events "
        "is what the autograd profiler writes without Kineto, its legacy export_chrome_trace: "
        "no categories, streams or steps; record with torch.profiler instead)"
    )
