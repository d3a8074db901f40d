"""fsobs.trace on hand-built traces: time, ranks, classification, steps, collectives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fsobs
from fsobs.runformat import names
from fsobs.trace import LoadConfig, loader
from tests.support.kineto import (
    BASE_NS,
    MAIN_TID,
    REFERENCE,
    kernel,
    launch,
    step,
    thread_name,
    trace,
    write,
    x,
)


def _events(path):
    return fsobs.load_rank(path).events


def test_relative_timestamps_become_absolute_ns(tmp_path):
    # one trace each: 51 days apart, one trace would leave the first out (fsobs.trace._plausible)
    events = [x("aten::mm", "cpu_op", 4458676524595.135, 92.865), x("a", "cpu_op", 10.0004, 1.0)]
    paths = [write(tmp_path / f"{i}.json", trace([e])) for i, e in enumerate(events)]
    ev = pd.concat([_events(p) for p in paths])
    assert ev["ts_ns"].tolist() == [BASE_NS + 4458676524595135, BASE_NS + 10000]
    assert ev["dur_ns"].tolist() == [92865, 1000]
    # HTA's view: ceil(ts), floor(ts + dur) in the trace's microseconds
    assert ev["hta_ts"].tolist() == [4458676524596.0, 11.0]
    assert ev["hta_end"].tolist() == [4458676524688.0, 11.0]


def test_old_absolute_integer_microseconds(tmp_path):
    path = write(
        tmp_path / "t.json",
        trace([x("aten::mm", "cpu_op", 1682725898236567, 68.0)], base_ns=None),
    )
    ev = _events(path)
    assert ev["ts_ns"].tolist() == [1682725898236567000]
    assert ev["dur_ns"].tolist() == [68000]
    # integer timestamps: HTA does not round
    assert ev["hta_ts"].tolist() == [1682725898236567.0]
    assert fsobs.load_rank(path).time_format == "absolute-us"


def test_rank_comes_from_distributed_info_not_the_file_name(tmp_path):
    write(tmp_path / "rank1.json", trace([step(1, 0, 10)], rank=0, world_size=2))
    write(tmp_path / "rank0.json.gz", trace([step(1, 0, 10)], rank=1, world_size=2))
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0, 1]
    assert run[0].path.name == "rank1.json"
    assert run.world_size == 2 and run.warnings == []


def test_string_pid_tid_and_uint64_comms_id(tmp_path):
    comms_id = 2**64 - 5
    events = [
        x("PyTorch Profiler (0)", "Trace", 0, 100, pid="Spans", tid="PyTorch Profiler"),
        x("aten::add", "cpu_op", 1, 2, pid="proc", tid="worker"),
        kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            5,
            3,
            stream=20,
            corr=9,
            Collective_name="allreduce",
            Comms_Id=comms_id,
            Seq=4,
            In_msg_nelems=256,
            Out_msg_nelems=256,
            dtype="Float",
            Group_size=2,
        ),
    ]
    rank = fsobs.load_rank(write(tmp_path / "t.json", trace(events)))
    assert "Trace" not in set(rank.events["cat"].astype(str))
    assert rank.events["tid"].astype(str).tolist() == ["worker", "20"]
    coll = rank.collectives.iloc[0]
    assert int(coll["comms_id"]) == comms_id
    assert (coll["coll"], coll["seq"], coll["msg_bytes"], coll["group_size"]) == (
        "all_reduce",
        4,
        1024,
        2,
    )
    assert coll["source"] == "args"


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        (kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 0, 1, corr=1), "comm"),
        (kernel("ncclDevKernel_SendRecv", 0, 1, corr=1), "comm"),
        (kernel("void at::native::vectorized_elementwise_kernel<4>", 0, 1, corr=1), "compute"),
        (
            x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 0, 1, pid=0, tid=7, stream=7),
            "memcpy",
        ),
        (x("Memcpy PtoP (Device -> Device)", "gpu_memcpy", 0, 1, pid=0, tid=7, stream=7), "comm"),
        (x("Memset (Device)", "gpu_memset", 0, 1, pid=0, tid=7, stream=7), "memset"),
        (x("Stream Sync", "cuda_sync", 0, 1, pid=0, tid=7, stream=7), "sync"),
        (x("cudaLaunchKernel", "cuda_runtime", 0, 1), "runtime"),
        (x("c10d::allreduce_", "cpu_op", 0, 1), "runtime"),
        (x("record_param_comms", "cpu_op", 0, 1), "runtime"),
        (x("gloo:all_to_all", "user_annotation", 0, 1, tid=7), "comm"),
        (x("nccl:all_reduce", "user_annotation", 0, 1), "annotation"),
        (x("## forward ##", "gpu_user_annotation", 0, 1, pid=0, tid=7), "annotation"),
        (x("train.py(12): step", "python_function", 0, 1), "annotation"),
        (x("aten::mm", "cpu_op", 0, 1), "compute"),
        (x("ProfilerStep#3", "user_annotation", 0, 1), "step"),
        (x("mystery", "cuda_profiler_range", 0, 1), "other"),
    ],
)
def test_kind_classification(tmp_path, event, kind):
    ev = _events(write(tmp_path / "t.json", trace([event])))
    assert ev["kind"].tolist() == [kind]


def test_device_side_events(tmp_path):
    events = [
        x("aten::mm", "cpu_op", 0, 1),
        kernel("gemm", 0, 1, corr=1),
        x("## fwd ##", "gpu_user_annotation", 0, 1, pid=0, tid=7),
    ]
    rank = fsobs.load_rank(write(tmp_path / "t.json", trace(events)))
    assert rank.events["device"].tolist() == ["cpu", "gpu", "gpu"]
    assert rank.events["stream"].tolist() == [-1, 7, -1]
    assert rank.device == "gpu"


def test_steps_by_window_and_by_launch(tmp_path):
    """A kernel launched in step 1 that runs after step 1 ended still belongs to step 1."""
    events = [
        step(1, 0, 100),
        step(2, 100, 100),
        x("aten::mm", "cpu_op", 10, 5),
        launch(20, corr=11),
        x("aten::mm", "cpu_op", 150, 5),
        x("outside", "cpu_op", 250, 5),
        kernel("gemm", 120, 50, corr=11),
        kernel("orphan", 130, 5, corr=99),
    ]
    ev = _events(write(tmp_path / "t.json", trace(events)))
    assert ev.set_index("name")["step"].to_dict() == {
        "ProfilerStep#1": 1,
        "ProfilerStep#2": 2,
        "aten::mm": 2,  # last aten::mm wins in to_dict; the first is checked below
        "cudaLaunchKernel": 1,
        "outside": -1,
        "gemm": 1,
        "orphan": -1,
    }
    assert ev.loc[ev["name"] == "aten::mm", "step"].tolist() == [1, 2]
    assert fsobs.load_rank(write(tmp_path / "t.json", trace(events))).steps == [1, 2]


def test_collective_metadata_from_launch_context(tmp_path):
    """Old traces: kernels carry no args; record_param_comms or nccl:* around the launch does."""
    events = [
        step(1, 0, 1000),
        x("nccl:all_to_all", "user_annotation", 10, 50),
        launch(20, corr=1),
        x(
            "record_param_comms",
            "cpu_op",
            100,
            50,
            Collective_name="all_to_allv",
            Seq=7,
            Group_size=4,
        ),
        launch(110, corr=2),
        launch(300, corr=3),
        kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 30, 40, stream=20, corr=1),
        kernel("ncclDevKernel_SendRecv", 120, 40, stream=20, corr=2),
        kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t", 310, 40, stream=20, corr=3),
    ]
    rank = fsobs.load_rank(write(tmp_path / "t.json", trace(events)))
    colls = rank.collectives
    assert colls["coll"].tolist() == ["all_to_all", "all_to_allv", "all_gather"]
    assert colls["source"].tolist() == ["annotation", "record_param_comms", "kernel_name"]
    assert colls["seq"].tolist() == [-1, 7, -1]
    assert rank.events.loc[colls["row"], "name"].str.startswith("nccl").all()


def test_gloo_annotation_sizes_and_thread_names(tmp_path):
    events = [
        thread_name(MAIN_TID, "thread 100 (python)"),
        thread_name(7, "thread 7 (python)"),
        thread_name(7, "thread 7 (pt_gloo_runloop)"),
        step(1, 0, 100),
        x("c10d::alltoall_base_", "cpu_op", 5, 1),
        x(
            "gloo:all_to_all",
            "user_annotation",
            6,
            50,
            tid=7,
            Input_Dims=[[512, 64]],
            Input_type=["float"],
        ),
    ]
    rank = fsobs.load_rank(write(tmp_path / "t.json", trace(events, backend="gloo")))
    assert rank.thread_names["7"] == "thread 7 (pt_gloo_runloop)"
    coll = rank.collectives.iloc[0]
    assert (coll["coll"], coll["in_nelems"], coll["msg_bytes"], coll["source"]) == (
        "all_to_all",
        512 * 64,
        512 * 64 * 4,
        "gloo",
    )
    assert rank.device == "cpu"


def test_gzip_and_plain_json_load_the_same(tmp_path):
    doc = trace([step(1, 0.5, 10.25), x("aten::mm", "cpu_op", 1.001, 2.002)])
    a = _events(write(tmp_path / "a.json", doc))
    b = _events(write(tmp_path / "b.json.gz", doc))
    assert a.equals(b)


def test_parallel_parse_equals_serial(tmp_path, monkeypatch):
    for r in range(3):
        events = [
            step(1, 0, 100),
            x("aten::mm", "cpu_op", 10 + r, 5),
            kernel("gemm", 20, 5, corr=1),
        ]
        write(tmp_path / f"r{r}.json.gz", trace(events, rank=r, world_size=3))
    serial = fsobs.load_run(tmp_path, LoadConfig(workers=1))
    monkeypatch.setattr(loader, "_PARALLEL_MIN_BYTES", 0)
    parallel = fsobs.load_run(tmp_path, LoadConfig(workers=2))
    assert parallel.rank_ids == serial.rank_ids == [0, 1, 2]
    for r in serial.rank_ids:
        assert parallel[r].events.equals(serial[r].events)
        assert parallel[r].collectives.equals(serial[r].collectives)


def test_partial_run_without_run_json_is_a_warning(tmp_path):
    write(tmp_path / "a.json", trace([step(1, 0, 10)], rank=3, world_size=8))
    run = fsobs.load_run(tmp_path)
    assert run.world_size == 8 and run.rank_ids == [3]
    assert run.warnings == ["loaded 1 of 8 ranks (missing: 0, 1, 2, 4, 5, 6, 7)"]


def test_single_file_without_rank_is_rank_zero_with_a_warning(tmp_path):
    path = write(tmp_path / "solo.json", trace([step(1, 0, 10)], rank=None))
    run = fsobs.load_run(path)
    assert run.rank_ids == [0] and run.world_size == 1
    assert any("no distributedInfo.rank" in w for w in run.warnings)


def test_run_steps_are_the_common_steps(tmp_path):
    write(tmp_path / "a.json", trace([step(1, 0, 10), step(2, 10, 10)], rank=0, world_size=2))
    write(tmp_path / "b.json", trace([step(2, 10, 10), step(3, 20, 10)], rank=1, world_size=2))
    assert fsobs.load_run(tmp_path).steps == [2]


def test_list_of_files(tmp_path):
    a = write(tmp_path / "x" / "a.json", trace([step(1, 0, 10)], rank=0, world_size=2))
    b = write(tmp_path / "y" / "b.json", trace([step(1, 0, 10)], rank=1, world_size=2))
    run = fsobs.load_run([a, b])
    assert run.rank_ids == [0, 1]
    assert run.path == tmp_path


def test_every_reference_trace_loads():
    files = sorted(REFERENCE.rglob("*.json.gz"))
    assert len(files) >= 15
    for path in files:
        rank = fsobs.load_rank(path)
        assert len(rank.events) > 0, path
        assert np.all(rank.events["dur_ns"].to_numpy() >= 0)


def test_oversized_collective_fields_are_unknown_not_a_crash(tmp_path):
    events = [
        kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            0,
            1,
            corr=1,
            Collective_name="allreduce",
            In_msg_nelems=2**70,
            Group_size=2**40,
            Seq=2**64,
            dtype="Float",
        )
    ]
    coll = fsobs.load_rank(write(tmp_path / "t.json", trace(events))).collectives.iloc[0]
    assert (coll["in_nelems"], coll["group_size"], coll["seq"], coll["msg_bytes"]) == (
        -1,
        -1,
        -1,
        -1,
    )


def test_missing_category_is_nan_not_a_string(tmp_path):
    events = [
        x("aten::mm", "cpu_op", 0, 1),
        {"ph": "X", "name": "nocat", "pid": 1, "tid": 1, "ts": 2, "dur": 1},
    ]
    ev = _events(write(tmp_path / "t.json", trace(events)))
    assert ev["cat"].isna().tolist() == [False, True]
    assert ev["kind"].tolist() == ["compute", "other"]


def test_a_cost_model_in_the_run_directory_is_not_a_trace(tmp_path):
    from optim.balance import CostModel

    write(tmp_path / "a.json", trace([step(1, 0, 10)], rank=0, world_size=1))
    CostModel(c0=1.0, a=2.0, b=3.0).to_json(tmp_path / names.COST_MODEL)
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0] and run.warnings == []
