"""The critical path across ranks (:mod:`fsobs.analysis.critical_path`): hand-built traces with
the path worked out by hand, and the simulator, whose schedule knows who arrived last."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fsobs.analysis import analyze, analyze_path
from fsobs.analysis.critical_path.chain import KINDS, Chain, Pieces
from fsobs.analysis.critical_path.path import CriticalPath
from fsobs.analysis.critical_path.walk import Lane, walk
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from tests.support.bubble_rows import load_docs
from tests.support.kineto import BASE_NS, allreduce, gemm, gpu_doc, x
from tests.unit.analysis.test_bubbles import _gloo_doc


def _ns(us: float) -> int:
    return BASE_NS + int(us * 1000)


def _segments(path: CriticalPath, step: int) -> list[tuple[int, str, str, int, int]]:
    rows = path.segments[path.segments["step"] == step]
    columns = ["rank", "kind", "name", "start_ns", "end_ns"]
    return [tuple(r) for r in rows[columns].itertuples(index=False)]


def assert_tiles(path: CriticalPath) -> None:
    """Every step's segments are contiguous, non-empty and cover its window exactly."""
    for step, start, end in path.steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
        rows = path.segments[path.segments["step"] == step]
        lo, hi = rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()
        assert lo[0] == start and hi[-1] == end
        assert (hi > lo).all()
        assert (lo[1:] == hi[:-1]).all()


def two_rank_docs() -> list[dict]:
    """Rank 1's forward kernel is 30 µs longer; both meet in an all_reduce, then run bwd::

        t (µs)   10        30     60     80      100
        rank 0   |==fwd====|[AR wait....|xx]|=bwd=|       arrives at 30
        rank 1   |==fwd===============|[xx]|=bwd=|       arrives last, at A = 60

    Both windows are [10, 100); rank 0 (the lower of the two ending at 100) starts the walk:
    bwd on rank 0 [80, 100); the all_reduce on rank 0 after the last arrival [60, 80); at A the
    path jumps to rank 1 (rank 0's wait [30, 60) is not on it): rank 1's fwd [10, 60).
    Root rank: rank 1 (50 µs outside collectives against rank 0's 20)."""
    return [
        gpu_doc(
            rank,
            {1: (0, 200)},
            [
                (1, gemm(10, fwd, name="fwd")),
                (1, allreduce(10 + fwd, 70 - fwd, 1)),
                (1, gemm(80, 20, name="bwd")),
            ],
        )
        for rank, fwd in ((0, 20), (1, 50))
    ]


def test_two_ranks_the_path_jumps_to_the_late_rank(tmp_path: Path) -> None:
    """:func:`two_rank_docs`."""
    docs = two_rank_docs()
    path = analyze(load_docs(tmp_path, docs)).critical_path
    assert _segments(path, 1) == [
        (1, "kernel", "fwd", _ns(10), _ns(60)),
        (0, "collective", "all_reduce", _ns(60), _ns(80)),
        (0, "kernel", "bwd", _ns(80), _ns(100)),
    ]
    assert path.steps.set_index("step").loc[1, "root_rank"] == 1
    assert_tiles(path)


def test_three_ranks_each_late_at_another_collective(tmp_path: Path) -> None:
    """Rank 1 is late at the first all_reduce, rank 2 at the second::

        t (µs)  10          40 50   70   90  100      130  150  160
        rank 0  |fwd=======|[AR1 ........|xx]|mid|[AR2 ......|xx]|tail|
        rank 1  |fwd====================|[xx]|mid|[AR2 ......|xx]|tail|
        rank 2  |fwd===========|[AR1 ...|xx]|mid===========|[xx]|tail|

    AR1: last arrival A1 = 70 (rank 1), ends at 90; AR2: A2 = 130 (rank 2), ends at 150.
    From rank 0's end (160): tail [150, 160) on 0; AR2 after A2 [130, 150) on 0, jump to 2;
    rank 2's mid [90, 130); AR1 after A1 on rank 2 [70, 90), jump to 1; rank 1's fwd [10, 70).
    Outside collectives: rank 1 60 µs, rank 2 40, rank 0 10: root rank 1."""
    plan = {0: (30, 10), 1: (60, 10), 2: (40, 40)}  # rank -> (fwd, mid) durations in µs
    docs = []
    for rank, (fwd, mid) in plan.items():
        work = [
            (1, gemm(10, fwd, name="fwd")),
            (1, allreduce(10 + fwd, 80 - fwd, 1)),
            (1, gemm(90, mid, name="mid")),
            (1, allreduce(90 + mid, 60 - mid, 2)),
            (1, gemm(150, 10, name="tail")),
        ]
        docs.append(gpu_doc(rank, {1: (0, 200)}, work, world_size=3))
    path = analyze(load_docs(tmp_path, docs)).critical_path
    assert _segments(path, 1) == [
        (1, "kernel", "fwd", _ns(10), _ns(70)),
        (2, "collective", "all_reduce", _ns(70), _ns(90)),
        (2, "kernel", "mid", _ns(90), _ns(130)),
        (0, "collective", "all_reduce", _ns(130), _ns(150)),
        (0, "kernel", "tail", _ns(150), _ns(160)),
    ]
    facts = path.steps.set_index("step").loc[1]
    assert (facts["root_rank"], facts["end_rank"]) == (1, 0)
    assert facts["phase"] == "other"  # no marker, no group description: the fallback role
    assert_tiles(path)


def test_idle_time_is_on_the_path_and_counts_for_the_root(tmp_path: Path) -> None:
    """Rank 1 has a 30 µs GPU gap (a late launch) before the same work as rank 0::

        t (µs)   10    30       60    70    80
        rank 0   |=k=|[AR wait.........|xx]|
        rank 1   |=k=|   (idle)   |=k2=|[xx]|       arrives last, at 70

    The window of each is [10, 80). Walk from rank 0 (lower of the two ending at 80): the
    all_reduce on 0 [70, 80), jump to 1 at 70: k2 [60, 70), idle [30, 60), k [10, 30).
    Root rank 1 (60 µs outside collectives; rank 0: 0)."""
    docs = [
        gpu_doc(0, {1: (0, 200)}, [(1, gemm(10, 20, name="k")), (1, allreduce(30, 50, 1))]),
        gpu_doc(
            1,
            {1: (0, 200)},
            [(1, gemm(10, 20, name="k")), (1, gemm(60, 10, name="k2")), (1, allreduce(70, 10, 1))],
        ),
    ]
    path = analyze(load_docs(tmp_path, docs)).critical_path
    assert _segments(path, 1) == [
        (1, "kernel", "k", _ns(10), _ns(30)),
        (1, "idle", "", _ns(30), _ns(60)),
        (1, "kernel", "k2", _ns(60), _ns(70)),
        (0, "collective", "all_reduce", _ns(70), _ns(80)),
    ]
    assert path.steps.set_index("step").loc[1, "root_rank"] == 1


def test_where_the_gpu_idles_the_path_follows_the_host_op(tmp_path: Path) -> None:
    """The run of :func:`test_idle_time_is_on_the_path_and_counts_for_the_root` with a host op
    ``aten::copy_`` [25, 55) on rank 1's training thread: where rank 1's GPU idles, the op is
    what it waits for::

        t (µs)   10    25 30       55  60    70    80
        rank 1 GPU |=k=|    (idle)     |=k2=|[xx]|
        rank 1 CPU     |==aten::copy_==|

    Back from rank 1 at 70: k2 [60, 70); the GPU idles before 60 and the op ended at 55: idle
    [55, 60); the op [30, 55) (from the end of k, the GPU's last work before it); k [10, 30)."""
    docs = [
        gpu_doc(0, {1: (0, 200)}, [(1, gemm(10, 20, name="k")), (1, allreduce(30, 50, 1))]),
        gpu_doc(
            1,
            {1: (0, 200)},
            [(1, gemm(10, 20, name="k")), (1, gemm(60, 10, name="k2")), (1, allreduce(70, 10, 1))],
        ),
    ]
    docs[1]["traceEvents"].append(x("aten::copy_", "cpu_op", 25, 30))
    path = analyze(load_docs(tmp_path, docs)).critical_path
    assert _segments(path, 1) == [
        (1, "kernel", "k", _ns(10), _ns(30)),
        (1, "op", "aten::copy_", _ns(30), _ns(55)),
        (1, "idle", "", _ns(55), _ns(60)),
        (1, "kernel", "k2", _ns(60), _ns(70)),
        (0, "collective", "all_reduce", _ns(70), _ns(80)),
    ]


def test_the_simulated_slow_rank_is_the_root_and_the_path_jumps_where_the_schedule_says(
    tmp_path: Path,
) -> None:
    """A 4-rank job whose rank 2 computes 4x slower (enough to outweigh the data: with
    2.5x, the data makes rank 3 the last in step 0): every step's root rank is rank 2. The
    schedule knows each step's last arrival at the embedding all-to-all (``max k1_end``) and
    at the dense all-reduce (``max k2_end``): the path crosses each collective there, coming
    from the rank that arrived last."""
    cfg = SimConfig(world_size=4, steps=3, seed=1, batch_per_rank=8, slow_rank=2, slow_factor=4.0)
    sched = simulate(cfg)
    write_run(sched, tmp_path / "run", workers=1)
    path = analyze_path(tmp_path / "run").critical_path
    assert_tiles(path)
    assert path.steps["root_rank"].tolist() == [2, 2, 2]
    for i, step in enumerate(path.steps["step"].tolist()):
        assert path.steps.loc[i, "root_rank"] == int(np.argmax(sched.t["k2_end"][i]))
        rows = path.segments[path.segments["step"] == step].reset_index(drop=True)
        for arrivals in (sched.t["k1_end"][i], sched.t["k2_end"][i]):
            at = int(arrivals.max())
            cross = rows.index[(rows["kind"] == "collective") & (rows["start_ns"] == at)]
            assert len(cross) == 1
            before = rows.loc[cross[0] - 1]
            assert before["rank"] == int(np.argmax(arrivals))
            assert (before["kind"], before["end_ns"]) == ("kernel", at)


def test_a_run_without_collectives_is_one_rank_s_chain(tmp_path: Path) -> None:
    """One rank, no collective: the path is its own kernels and gaps, rooted there::

    t (µs)  10   20    25   35
    rank 0  |=a=|      |=b=|"""
    doc = gpu_doc(0, {1: (0, 100)}, [(1, gemm(10, 10, name="a")), (1, gemm(25, 10, name="b"))])
    doc["distributedInfo"]["world_size"] = 1
    path = analyze(load_docs(tmp_path, [doc])).critical_path
    assert _segments(path, 1) == [
        (0, "kernel", "a", _ns(10), _ns(20)),
        (0, "idle", "", _ns(20), _ns(25)),
        (0, "kernel", "b", _ns(25), _ns(35)),
    ]
    assert path.steps["root_rank"].tolist() == [0]


def test_gloo_ranks_the_path_follows_the_training_threads_ops(tmp_path: Path) -> None:
    """The CPU run of ``tests.test_bubbles.test_cpu_op_waiting_inside_a_collective_is_a_bubble``::

        t (µs)    0    10   20   22   60   70        100
        r0 main   |=mm=|All2All_Seq_ReqBackward-------|     child c10d [20, 22)
        r0 gloo             |~~~~~~~~~~~~~~|xxx|            [20, 70); rank 1 arrives at 60
        r1 main   |==========aten::mm========|               [0, 60)
        r1 gloo                            |xxx|            [60, 70)

    Both windows are the ProfilerStep [0, 100); the walk starts on rank 0: the glue op around
    the collective after its end [70, 100) (other tier, from the collective's end), the
    all_reduce after the last arrival [60, 70), then rank 1's mm [0, 60). Root rank 1."""
    main0 = [
        ("aten::mm", "cpu_op", 0, 10),
        ("All2All_Seq_ReqBackward", "cpu_op", 10, 90),
        ("c10d::alltoall_base_", "cpu_op", 20, 2),
    ]
    main1 = [("aten::mm", "cpu_op", 0, 60)]
    docs = [_gloo_doc(0, main0, (20, 50)), _gloo_doc(1, main1, (60, 10))]
    path = analyze(load_docs(tmp_path, docs)).critical_path
    assert _segments(path, 1) == [
        (1, "op", "aten::mm", _ns(0), _ns(60)),
        (0, "collective", "all_reduce", _ns(60), _ns(70)),
        (0, "op", "All2All_Seq_ReqBackward", _ns(70), _ns(100)),
    ]
    assert path.steps["root_rank"].tolist() == [1]


def _lane(rank: int, colls: list[tuple[int, int, int, int, int]]) -> Lane:
    """A rank with no kernels or ops and the collectives ``(instance, a, end, last, last_rank)``."""
    names = ("instance", "start_ns", "end_ns", "arrival_last_ns", "last_rank")
    values = (np.array(c, np.int64) for c in zip(*colls, strict=True))
    columns = dict(zip(names, values, strict=True))
    columns["coll"] = np.array(["all_reduce"] * len(colls), object)
    empty = np.zeros(0, np.int64)
    nothing = Pieces(empty, empty, empty.astype(np.int8), empty)
    return Lane.of(rank, Chain(nothing, nothing, ()), 0, columns)


def test_a_circular_wait_is_a_wait_segment_on_the_rank_where_it_closes() -> None:
    """Two overlapping collectives wait for each other's rank (a pair the matching would not
    keep, but the walk must end)::

        t      0          40   50   60        100
        rank 0 [X  waits for rank 1 |.....]          X: last arrival 50 (rank 1)
        rank 1 [Y  waits for rank 0 ......|...]      Y: last arrival 60 (rank 0)

    From (rank 0, 40): inside X's wait, jump to rank 1 at 40; inside Y's wait for rank 0,
    already visited at 40: a wait segment on rank 1 from Y's arrival, [0, 40)."""
    lanes = {0: _lane(0, [(0, 0, 100, 50, 1)]), 1: _lane(1, [(1, 0, 100, 60, 0)])}
    assert walk(lanes, 0, 40, 0) == [(1, KINDS.index("wait"), "all_reduce", 0, 40, 1)]
