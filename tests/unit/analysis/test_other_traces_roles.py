"""Roles without FreeScale's markers (issue 24, point 5): torchrec's own ranges and DDP's
gradient hook give a plain torchrec job its roles; with nothing in the trace that says a
role, the time by role is unknown (null), never 0.0. Expected values derived by hand."""

from __future__ import annotations

import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.analysis.pipeline import kpis_by_role
from fsobs.report import to_json
from tests.support.bubble_rows import load_docs
from tests.support.kineto import (
    GLOO_TID,
    REFERENCE,
    cpu_doc,
    cpu_op,
    gloo,
    kernel,
    launch,
    step,
    trace,
    write_allreduce_run,
    x,
)

BWD_TID = 101
"""The autograd engine's thread, where torchrec's backward all-to-all is issued."""

# (name, collective, seq, launch µs, kernel start on rank 0 / rank 1, kernel end)
COLLECTIVES = [
    ("kjt", "all_to_allv", 1, 30, (40, 50), 60),
    ("pooled", "all_to_allv", 2, 110, (120, 115), 140),
    ("pooled_bwd", "all_to_allv", 3, 210, (220, 230), 250),
    ("ddp", "allreduce", 4, 310, (320, 330), 340),
    ("rs", "_reduce_scatter_base", 5, 405, (410, 410), 430),
    ("shampoo", "allgather", 6, 510, (520, 525), 540),
]
"""Six NCCL collectives of a plain torchrec + DDP job, each issued inside the ranges torchrec,
DDP or the optimizer record around it (:func:`_ranges`)::

    kjt         ## sparse_data_dist ## [10, 60) > ## all2all_data:kjt splits ## [12, 20);
                launched at 30, after the inner range ended: the outer one says embedding
    pooled      All2All_Pooled_Req [100, 130) > ## All2All_Pooled_fwd ## [105, 125)
    pooled_bwd  (autograd thread) evaluate_function: All2All_Pooled_WaitBackward [200, 240)
                > All2All_Pooled_WaitBackward [201, 239)
    ddp         evaluate_function: torch::autograd::AccumulateGrad [300, 330)
                > c10d::allreduce_ [305, 320): DDP's hook, dense
    rs          ReduceScatterBase_Req [400, 420) > ## reduce_scatter_base ## [401, 419)
    shampoo     Optimizer.step#Shampoo.step [500, 540): nothing says a role, other

Kernels (µs), the later start is the last arrival, both end together::

    kjt      r0 |~~~~~~~~~|xxxxxxxxx|  [40, 50) wait, [50, 60) exposed; r1 [50, 60) exposed
    pooled   r1 [115, 120) wait; [120, 140) exposed on both
    pooled_bwd  r0 [220, 230) wait; [230, 250) exposed on both
    ddp      r0 [320, 330) wait; [330, 340) exposed on both
    rs       no wait; [410, 430) exposed on both
    shampoo  r0 [520, 525) wait; [525, 540) exposed on both

Means over the 2 ranks (ms): embedding wait (10 + 10 + 5) / 2 = 12.5 µs, exposed
10 + 20 + 20 + 20 = 70 µs; dense wait 10 / 2 = 5 µs, exposed 10 µs; other wait 2.5 µs,
exposed 15 µs.
"""


def _ranges() -> list[dict]:
    e = "autograd::engine::evaluate_function: "
    return [
        x("## sparse_data_dist ##", "user_annotation", 10, 50),
        x("## all2all_data:kjt splits ##", "user_annotation", 12, 8),
        cpu_op("All2All_Pooled_Req", 100, 30),
        x("## All2All_Pooled_fwd ##", "user_annotation", 105, 20),
        x(f"{e}All2All_Pooled_WaitBackward", "cpu_op", 200, 40, tid=BWD_TID),
        x("All2All_Pooled_WaitBackward", "cpu_op", 201, 38, tid=BWD_TID),
        cpu_op(f"{e}torch::autograd::AccumulateGrad", 300, 30),
        cpu_op("c10d::allreduce_", 305, 15),
        cpu_op("ReduceScatterBase_Req", 400, 20),
        x("## reduce_scatter_base ##", "user_annotation", 401, 18),
        x("Optimizer.step#Shampoo.step", "user_annotation", 500, 40),
    ]


def _torchrec_rank(rank: int) -> dict:
    events = [step(1, 0, 1000), *_ranges()]
    for corr, (name, coll, seq, at, starts, end) in enumerate(COLLECTIVES, start=1):
        events.append(launch(at, corr, dur=1, tid=BWD_TID if name == "pooled_bwd" else 100))
        events.append(
            kernel(
                "ncclDevKernel_SendRecv",
                starts[rank],
                end - starts[rank],
                stream=20,
                corr=corr,
                Collective_name=coll,
                Process_Group_Name="0",
                Seq=seq,
            )
        )
    return trace(events, rank=rank, world_size=2)


def test_torchrec_and_ddp_ranges_give_the_roles(tmp_path):
    run = load_docs(tmp_path, [_torchrec_rank(0), _torchrec_rank(1)])
    roles = run[0].collectives.sort_values("seq")["role"].astype(object).fillna("none")
    assert roles.tolist() == ["embedding", "embedding", "embedding", "dense", "embedding", "none"]
    result = analyze(run)
    assert result.collectives.roles_known
    expected = {
        "embedding": {"straggler_wait_ms_per_step": 0.0125, "exposed_comm_ms_per_step": 0.07},
        "dense": {"straggler_wait_ms_per_step": 0.005, "exposed_comm_ms_per_step": 0.01},
        "other": {"straggler_wait_ms_per_step": 0.0025, "exposed_comm_ms_per_step": 0.015},
    }
    for role, values in expected.items():
        assert kpis_by_role(result.roles)[role] == pytest.approx(values)
        assert to_json(result)["by_role"][role] == pytest.approx(values)


def test_a_gloo_enqueue_inside_a_torchrec_range_gives_its_role(tmp_path):
    """gloo: the worker's all_to_all takes the role of the range around its enqueue (the
    ``c10d::alltoall_base_`` it is paired with); the all_reduce's enqueue is under DDP's
    hook::

        main  |All2All_Seq_Req [5, 20)|      |evaluate_function: AccumulateGrad [40, 60)|
              |  c10d::alltoall_base_ 8 |    |   c10d::allreduce_ 45                    |
        gloo          |gloo:all_to_all [10, 30)|       |gloo:all_reduce [50, 70)|
    """

    def doc(rank: int) -> dict:
        events = [
            cpu_op("All2All_Seq_Req", 5, 15),
            cpu_op("c10d::alltoall_base_", 8, 1),
            cpu_op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 40, 20),
            cpu_op("c10d::allreduce_", 45, 1),
            gloo("all_to_all", 10, 20, tid=GLOO_TID),
            gloo("all_reduce", 50, 20, tid=GLOO_TID),
        ]
        return cpu_doc(rank, events)

    run = load_docs(tmp_path, [doc(0), doc(1)])
    colls = run[0].collectives.sort_values("row")
    assert colls[["coll", "role"]].astype(str).values.tolist() == [
        ["all_to_all", "embedding"],
        ["all_reduce", "dense"],
    ]


def test_by_role_is_unknown_when_nothing_says_the_role(tmp_path):
    """Two GPU ranks meeting in an all_reduce with no marker, range, group description or
    run.json: the roles are unknown, so by_role is null (not 0.0 embedding, 0.0 dense)."""
    result = analyze(fsobs.load_run(write_allreduce_run(tmp_path, [(10, 30)])))
    assert not result.collectives.instances.empty
    assert not result.collectives.roles_known
    assert to_json(result)["by_role"] is None


def test_the_reference_gloo_run_has_no_roles():
    """The synthetic gloo run records no marker and no torchrec range: unknown."""
    result = fsobs.analyze_path(REFERENCE / "synthetic_gloo_a2a_straggler_4rank")
    assert to_json(result)["by_role"] is None


def test_a_real_torchrec_trace_gets_its_roles_from_torchrec():
    """Rank 0 of HTA's 16-rank TorchRec trace: every nccl:all_to_all it records lies inside
    torchrec's input dist (``## all2all_data:kjt ... ##``) or pooled all-to-all
    (``## alltoall_fwd_single ##`` / ``_bwd_single``), the reduce_scatter inside
    ``ReduceScatterBase_Req``, the all_gather inside ``ReduceScatterBase_WaitBackward``, and
    the all_reduce inside DDP's ``AccumulateGrad`` hook (read in the trace)."""
    colls = fsobs.load_run(REFERENCE / "hta_recsys_a2a_rs_16rank_rank0")[0].collectives
    by_coll = colls.groupby("coll", observed=True)["role"].agg(lambda r: set(r.astype(object)))
    assert by_coll["all_to_all"] == {"embedding"}
    assert by_coll["reduce_scatter"] == {"embedding"}
    assert by_coll["all_gather"] == {"embedding"}
    assert by_coll["all_reduce"] == {"dense"}
