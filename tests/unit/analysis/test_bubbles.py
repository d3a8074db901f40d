"""Bubble classes (docs/design.md §5) on hand-built multi-rank traces, with exact expected values.

Every scenario draws its timeline in the test docstring (not to scale: every boundary has its
own column); times are µs relative to the traces' ``baseTimeNanoseconds`` and the expected
numbers are derived from the timeline by hand. The tables are in ms, so ``expect_row``
(tests/support/bubble_rows.py) divides the µs values by 1000 and compares with a 1e-9 ms tolerance.

Legend: ``|`` a boundary, ``=`` compute kernel / CPU op, ``~`` in a collective before the last
rank arrived (straggler wait), ``x`` in a collective after every rank arrived (exposed); where
compute overlaps ``~`` or ``x`` it is busy. ``m`` memcpy, blank: nothing.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.analysis.bubbles.packing import unpack
from fsobs.analysis.collectives.matching import Collectives
from tests.support.bubble_rows import TOL_MS, checked_table, expect_row, load_docs
from tests.support.kineto import (
    BASE_NS,
    GLOO_TID,
    REFERENCE,
    allreduce,
    gemm,
    gpu_doc,
    memcpy,
    step,
    thread_name,
    trace,
    x,
)

DATA_LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def match_collectives(run: fsobs.Run) -> Collectives:
    return analyze(run).collectives


def _starts_us(colls: Collectives) -> dict[tuple[str, str], dict[int, float]]:
    """(group, key) -> {rank: aligned start in µs relative to the traces' base time}."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for row in colls.instances.itertuples():
        out.setdefault((row.group, row.key), {})[row.rank] = (row.start_ns - BASE_NS) / 1000
    return out


# ----------------------------------------------------------------------------- 1. GPU basics


def test_gpu_straggler_wait_exposed_comm_host_idle_other(tmp_path):
    """Two GPU ranks, one step; rank 1 computes longer, so rank 0 waits in its all_reduce.

    ::

        t (µs)    10       28 30   36  40   50   60        80  85       95
        rank 0    |===========|                                |========|    gemm, stream 7
                           |mmmmmmm|                                         memcpy, stream 8
                                       |~~~~~~~~~|xxxxxxxxx|                 all_reduce, st. 20
        rank 1    |=========================|                  |========|
                                                 |xxxxxxxxx|

    Last arrival A = max(40, 60) = 60.

    rank 0: window [10, 95) = 85; busy = [10,30) + [85,95) = 30;
            straggler_wait = [40, 60) = 20; exposed_comm = [60, 80) = 20;
            other = memcpy [28, 36) minus compute = [30, 36) = 6;
            host_idle = [36,40) + [80,85) = 9.                 30 + 20 + 20 + 9 + 6 = 85
    rank 1: window [10, 95) = 85; busy = 40 + 10 = 50; straggler_wait = 0;
            exposed_comm = [60, 80) = 20; host_idle = [50,60) + [80,85) = 15; other = 0.
    """
    steps = {1: (0, 100)}
    rank0 = [
        (1, gemm(10, 20)),
        (1, memcpy(28, 8, stream=8)),
        (1, allreduce(40, 40, seq=0)),
        (1, gemm(85, 10)),
    ]
    rank1 = [(1, gemm(10, 40)), (1, allreduce(60, 20, seq=0)), (1, gemm(85, 10))]
    run = load_docs(tmp_path, [gpu_doc(0, steps, rank0), gpu_doc(1, steps, rank1)])
    colls = match_collectives(run)
    assert colls.problems.empty
    assert colls.offsets_ns == {0: 0, 1: 0}
    assert colls.instances["last_rank"].tolist() == [1, 1]
    table = checked_table(run)
    assert len(table) == 2
    expect_row(
        table, 0, 1, window=85, busy=30, straggler_wait=20, exposed_comm=20, host_idle=9, other=6
    )
    expect_row(table, 1, 1, window=85, busy=50, exposed_comm=20, host_idle=15)


# ----------------------------------------------------------------- 2. overlap and contention


def test_gpu_overlapped_collective_is_busy_and_contention(tmp_path):
    """An async all_reduce overlapped by compute: the overlapped part is busy, not bubble.
    ``gemm`` runs alone for 10 µs twice and for 14 µs while the all_reduce is in flight.

    ::

        t (µs)    0    10   20   30   36   44   60   70   80
        rank 0    |====|         |=========|         |====|      gemm (10, 14, 10)
                            |~~~~~~~~~|xxxxxxxxx|                all_reduce
        rank 1    |====|##############|              |====|      gemm, other_k (#)
                                      |xxxxxxxxx|                all_reduce

    A = max(20, 36) = 36.

    rank 0: window [0, 80) = 80; busy = 10 + 14 + 10 = 34;
            straggler_wait = [20, 36) - [30, 44) = [20, 30) = 10;
            exposed_comm = [20, 60) - [20, 30) - [30, 44) = [44, 60) = 16;
            host_idle = [10,20) + [60,70) = 20; other = 0.            34 + 10 + 16 + 20 = 80
            contention = 14 - median(10, 10) = 4.
    rank 1: window 80; busy = 10 + 26 + 10 = 46; exposed_comm = [36, 60) = 24;
            host_idle = [60, 70) = 10; contention 0 (other_k only touches the all_reduce).
    """
    steps = {1: (0, 100)}
    rank0 = [
        (1, gemm(0, 10)),
        (1, allreduce(20, 40, seq=0)),
        (1, gemm(30, 14)),
        (1, gemm(70, 10)),
    ]
    rank1 = [
        (1, gemm(0, 10)),
        (1, gemm(10, 26, name="other_k")),
        (1, allreduce(36, 24, seq=0)),
        (1, gemm(70, 10)),
    ]
    run = load_docs(tmp_path, [gpu_doc(0, steps, rank0), gpu_doc(1, steps, rank1)])
    table = checked_table(run)
    assert table.loc[(0, 1), "contention_ms"] == pytest.approx(0.004, abs=TOL_MS)
    expected = dict(straggler_wait=10, exposed_comm=16, host_idle=20, contention=4)
    expect_row(table, 0, 1, window=80, busy=34, **expected)
    expect_row(table, 1, 1, window=80, busy=46, exposed_comm=24, host_idle=10)


# ------------------------------------------------------------- 3. matching by (group, Seq)


def test_two_process_groups_match_by_group_and_seq(tmp_path):
    """Two process groups over the same ranks, issued in a different order on each rank: an
    instance is (group, Seq), never the time order or the Seq alone.

    ::

        t (µs)    5    10   20   30   40   60   65   70   90   95   100  120
        r0 pg 0        |~~~~|xxxx|                   |~~~~|xxxx|                  a, c
        r0 pg 1                       |xxxx|                        |xxxx|        b, d
        r1 pg 0             |xxxx|                        |xxxx|                  a, c
        r1 pg 1   |~~~~~~~~~~~~~~~~~~~|xxxx|    |~~~~~~~~~~~~~~~~~~~|xxxx|        b, d
        a = pg "0" Seq 0, b = pg "1" Seq 0, c = pg "0" Seq 1, d = pg "1" Seq 1
        (pg "0" on stream 20 with 1024 elements, pg "1" on stream 24 with 256)

    rank 0: a waits [10, 20) = 10, c waits [70, 90) = 20, b and d not at all -> 30;
            comm [10,30)+[40,60)+[70,95)+[100,120) = 85 -> exposed 55;
            window [10, 120) = 110, host_idle [30,40)+[60,70)+[95,100) = 25.
    rank 1: b waits [5, 40) = 35, d waits [65, 100) = 35 -> 70 (a, c: 0);
            comm [5, 60) + [65, 120) = 110 -> exposed 40;
            window [5, 120) = 115, host_idle [60, 65) = 5.
    """
    steps = {1: (0, 200)}
    ranks = "[0, 1]"

    def pg0(ts, dur, seq):
        return allreduce(ts, dur, seq, pg="0", stream=20, Process_Group_Ranks=ranks)

    def pg1(ts, dur, seq):
        return allreduce(ts, dur, seq, pg="1", nelems=256, stream=24, Process_Group_Ranks=ranks)

    rank0 = [(1, pg0(10, 20, 0)), (1, pg1(40, 20, 0)), (1, pg0(70, 25, 1)), (1, pg1(100, 20, 1))]
    rank1 = [(1, pg1(5, 55, 0)), (1, pg0(20, 10, 0)), (1, pg1(65, 55, 1)), (1, pg0(90, 5, 1))]
    run = load_docs(tmp_path, [gpu_doc(0, steps, rank0), gpu_doc(1, steps, rank1)])
    colls = match_collectives(run)
    assert colls.problems.empty
    assert _starts_us(colls) == {
        ("0", "seq 0"): {0: 10, 1: 20},
        ("1", "seq 0"): {0: 40, 1: 5},
        ("0", "seq 1"): {0: 70, 1: 90},
        ("1", "seq 1"): {0: 100, 1: 65},
    }
    inst = colls.instances.drop_duplicates("instance").set_index("instance")
    # numbered by the first start over the ranks: b (5), a (10), d (65), c (70)
    assert inst[["group", "key", "last_rank"]].values.tolist() == [
        ["1", "seq 0", 0],
        ["0", "seq 0", 1],
        ["1", "seq 1", 0],
        ["0", "seq 1", 1],
    ]
    assert inst["msg_bytes"].tolist() == [1024, 4096, 1024, 4096]
    table = checked_table(run)
    expect_row(table, 0, 1, window=110, busy=0, straggler_wait=30, exposed_comm=55, host_idle=25)
    expect_row(table, 1, 1, window=115, busy=0, straggler_wait=70, exposed_comm=40, host_idle=5)


# -------------------------------------------------------------- 4. across a step boundary


def test_collective_running_past_its_step_belongs_to_the_launching_step(tmp_path):
    """The all_reduce is launched in step 1 (correlation) and ends after ProfilerStep#1 ended
    on the CPU: it belongs to step 1's window, not to step 2's.

    ::

        t (µs)    0     10    50    60    80    100   130   135   180   200
        CPU       |---ProfilerStep#1------------|---ProfilerStep#2------|
        rank 0          |=====|     |~~~~~|xxxxxxxxxxx|     |=====|
        rank 1          |=====|           |xxxxxxxxxxx|     |=====|

    GPU windows tile: step 1 runs to the first GPU event of step 2.
    step 1: rank 0 window [10, 135) = 125, busy 40, straggler_wait [60, 80) = 20,
            exposed_comm [80, 130) = 50, host_idle [50, 60) + [130, 135) = 15;
            rank 1 window 125, busy 40, exposed_comm 50, host_idle [50, 80) + [130, 135) = 35.
    step 2 (the last): window [135, 180) = 45, all busy, on both ranks.
    """
    steps = {1: (0, 100), 2: (100, 100)}
    rank0 = [(1, gemm(10, 40)), (1, allreduce(60, 70, seq=0)), (2, gemm(135, 45))]
    rank1 = [(1, gemm(10, 40)), (1, allreduce(80, 50, seq=0)), (2, gemm(135, 45))]
    run = load_docs(tmp_path, [gpu_doc(0, steps, rank0), gpu_doc(1, steps, rank1)])
    colls = match_collectives(run)
    assert colls.instances["step"].tolist() == [1, 1]
    table = checked_table(run)
    expect_row(table, 0, 1, window=125, busy=40, straggler_wait=20, exposed_comm=50, host_idle=15)
    expect_row(table, 1, 1, window=125, busy=40, exposed_comm=50, host_idle=35)
    for rank in (0, 1):
        expect_row(table, rank, 2, window=45, busy=45)


def test_sub_microsecond_pieces_are_exact(tmp_path):
    """Boundaries 20-300 ns apart at absolute-epoch ns times (~1.8e18, where a float64 is exact
    to 256 ns only) still give exact classes.

    ::

        t (µs)    10     20.05  20.1   20.3   30     30.02  40
        rank 0    |=============|                    |======|
                         |~~~~~~~~~~~~~|xxxxxx|
        rank 1    |====================|xxxxxx|      |======|

    A = 20.3. rank 0: busy 10.1 + 9.98 = 20.08; straggler_wait [20.1, 20.3) = 0.2 (the
    50 ns under the gemm are busy); exposed_comm [20.3, 30) = 9.7; host_idle [30, 30.02) = 0.02;
    window [10, 40) = 30; contention: the first gemm overlaps the all_reduce by 50 ns, so it
    counts against the gemm alone: 10.1 - 9.98 = 0.12.
    rank 1: busy 10.3 + 9.98 = 20.28, exposed_comm 9.7, host_idle 0.02, contention 0.
    """
    steps = {1: (0, 100)}
    rank0 = [(1, gemm(10, 10.1)), (1, allreduce(20.05, 9.95, 0)), (1, gemm(30.02, 9.98))]
    rank1 = [(1, gemm(10, 10.3)), (1, allreduce(20.3, 9.7, 0)), (1, gemm(30.02, 9.98))]
    run = load_docs(tmp_path, [gpu_doc(0, steps, rank0), gpu_doc(1, steps, rank1)])
    table = checked_table(run)
    expected = dict(straggler_wait=0.2, exposed_comm=9.7, host_idle=0.02, contention=0.12)
    expect_row(table, 0, 1, window=30, busy=20.08, **expected)
    expect_row(table, 1, 1, window=30, busy=20.28, exposed_comm=9.7, host_idle=0.02)


# --------------------------------------------------------------- 5. rotating straggler


def test_rotating_straggler_per_step(tmp_path):
    """Three ranks, three steps; one gemm then one all_reduce per step. The last rank to arrive
    is rank 0 in step 1, rank 1 in step 2, rank 2 in step 3; every all_reduce ends at +60.

    ::

        step s starts at b = 100 (s - 1); gemm lengths per (step, rank):

                    rank 0   rank 1   rank 2        step 1, t - b (µs):
        step 1        50       20       30          t (µs)    0     20    30    50    60
        step 2        30       50       20          rank 0    |=================|xxxxx|
        step 3        20       30       50          rank 1    |=====|~~~~~~~~~~~|xxxxx|
                                                    rank 2    |===========|~~~~~|xxxxx|

    wait of rank r in step s = (longest gemm = 50) - own gemm; exposed = 10 everywhere;
    busy = own gemm, other = 0. GPU windows tile: steps 1 and 2 run to the next step's first
    kernel (window 100, host_idle [60, 100) = 40); step 3, the last, ends with its work (60).
    """
    gemms = {1: (50, 20, 30), 2: (30, 50, 20), 3: (20, 30, 50)}
    steps = {s: (100 * (s - 1), 100) for s in gemms}
    docs = []
    for rank in range(3):
        work = []
        for s, lengths in gemms.items():
            base, own = steps[s][0], lengths[rank]
            work += [(s, gemm(base, own)), (s, allreduce(base + own, 60 - own, seq=s - 1))]
        docs.append(gpu_doc(rank, steps, work, world_size=3))
    run = load_docs(tmp_path, docs)
    colls = match_collectives(run)
    inst = colls.instances.drop_duplicates("instance").set_index("instance")
    assert inst["last_rank"].tolist() == [0, 1, 2]
    assert inst["step"].tolist() == [1, 2, 3]
    table = checked_table(run)
    for s, lengths in gemms.items():
        for rank in range(3):
            own, last = lengths[rank], s == 3
            expect_row(
                table,
                rank,
                s,
                window=60 if last else 100,
                busy=own,
                straggler_wait=50 - own,
                exposed_comm=10,
                host_idle=0 if last else 40,
            )
    waits_us = (table["straggler_wait_ms"].unstack("rank") * 1000).round(6)
    assert waits_us.values.tolist() == [[0, 30, 20], [20, 0, 30], [30, 20, 0]]


# ------------------------------------------------------------------------ 6. CPU / gloo


def _gloo_doc(rank: int, main: list[tuple[str, str, float, float]], comm: tuple[float, float]):
    events = [
        thread_name(GLOO_TID, "pt_gloo_runloop"),
        step(1, 0, 100),
        *(x(name, cat, ts, dur) for name, cat, ts, dur in main),
        x(
            "gloo:all_reduce",
            "user_annotation",
            *comm,
            tid=GLOO_TID,
            Input_Dims=[[1024]],
            Input_type=["float"],
        ),
    ]
    return trace(events, rank=rank, world_size=2, backend="gloo")


def test_cpu_gloo_classes(tmp_path):
    """CPU ranks: the training thread is the resource; the gloo collective runs on its own
    thread, and the training thread is blocked while it runs and no op does.

    ::

        t (µs)    0    10   40   42   45   50   60   62   80   95   98   100
        step      |------------------------------------------------------|
        r0 main   |dddd|====|cccc|    |====|              |====|====|       d = data loader
        r0 gloo                  |~~~~~~~~~~~~~~~~~~~|xxxx|                 mm, add: ops
        r1 main   |dddd|========================|cccc|    |====|====|       c = c10d::allreduce_
        r1 gloo                                      |xxxx|
        r0 main: mm [10,40), add [45,50), mm [80,95), add [95,98);  r1 main: mm [10,60), ...
        c enqueues the collective: the rank asks for it there, so it arrives and is in flight
        from c's start (40 and 60); the gloo worker starts it 2 µs later.

    A = max(40, 60) = 60. The window is ProfilerStep#1 = [0, 100).

    rank 0: in flight [40, 80); blocked = [40, 80) - add [45, 50) = [40,45) + [50,80) = 35;
            straggler_wait = blocked & [40, 60) = 5 + 10 = 15; exposed_comm = [60, 80) = 20;
            host_idle = data [0, 10) = 10; busy = 100 - 35 - 10 = 55 (ops, glue);
            other = 0; contention = add 5 during comm - add 3 alone = 2.
    rank 1: blocked = [60, 80) = 20, all exposed; host_idle 10; busy 70; other 0.
    """
    rank0 = [
        (DATA_LOADER, "user_annotation", 0, 10),
        ("aten::mm", "cpu_op", 10, 30),
        ("c10d::allreduce_", "cpu_op", 40, 2),
        ("aten::add", "cpu_op", 45, 5),
        ("aten::mm", "cpu_op", 80, 15),
        ("aten::add", "cpu_op", 95, 3),
    ]
    rank1 = [
        (DATA_LOADER, "user_annotation", 0, 10),
        ("aten::mm", "cpu_op", 10, 50),
        ("c10d::allreduce_", "cpu_op", 60, 2),
        ("aten::mm", "cpu_op", 80, 15),
        ("aten::add", "cpu_op", 95, 3),
    ]
    run = load_docs(tmp_path, [_gloo_doc(0, rank0, (42, 38)), _gloo_doc(1, rank1, (62, 18))])
    assert run.device == "cpu"
    colls = match_collectives(run)
    assert colls.problems.empty
    inst = colls.instances
    assert inst[["group", "coll", "key", "msg_bytes", "last_rank"]].values.tolist() == [
        ["default", "all_reduce", "all_reduce @1 #0", 4096, 1],
        ["default", "all_reduce", "all_reduce @1 #0", 4096, 1],
    ]
    table = checked_table(run)
    expected = dict(straggler_wait=15, exposed_comm=20, host_idle=10, contention=2)
    expect_row(table, 0, 1, window=100, busy=55, **expected)
    expect_row(table, 1, 1, window=100, busy=70, exposed_comm=20, host_idle=10)
    assert (table["other_ms"] == 0).all()


# ---------------------------------------------------------- 7. incomplete instances


def test_missing_and_disagreeing_collectives_are_reported_not_matched(tmp_path):
    """Rank 1 has no Seq 1; the ranks disagree on the size of Seq 2. Neither takes part in the
    waits: their time is unattributed_comm (whether it was waiting or transfer is unknown).

    ::

        t (µs)    10   20   30   40   60   70   80   90
        rank 0    |~~~~|xxxx|    |xxxx|    |xxxxxxxxx|     Seq 0, 1, 2 (1024 elements each)
        rank 1         |xxxx|                   |xxxx|     Seq 0, 2 (2048 elements); no Seq 1

    Only Seq 0 is matched (A = 20).
    rank 0: window [10, 90) = 80; straggler_wait [10, 20) = 10; exposed_comm [20, 30) = 10;
            unattributed_comm [40, 60) + [70, 90) = 40; host_idle [30,40) + [60,70) = 20.
    rank 1: window [20, 90) = 70; exposed_comm [20, 30) = 10; unattributed_comm [80, 90) = 10;
            host_idle [30, 80) = 50.
    """
    steps = {1: (0, 200)}
    rank0 = [(1, allreduce(10, 20, 0)), (1, allreduce(40, 20, 1)), (1, allreduce(70, 20, 2))]
    rank1 = [(1, allreduce(20, 10, 0)), (1, allreduce(80, 10, 2, nelems=2048))]
    run = load_docs(tmp_path, [gpu_doc(0, steps, rank0), gpu_doc(1, steps, rank1)])
    colls = match_collectives(run)
    problems = colls.problems.sort_values("key")
    assert problems.values.tolist() == [
        ["0", "all_reduce", "seq 1", "missing on ranks [1]", [0]],
        ["0", "all_reduce", "seq 2", "ranks disagree on the size: [1024, 2048]", [0, 1]],
    ]
    assert colls.instances["key"].tolist() == ["seq 0", "seq 0"]
    table = checked_table(run)
    expect_row(
        table,
        0,
        1,
        window=80,
        busy=0,
        straggler_wait=10,
        exposed_comm=10,
        unattributed=40,
        host_idle=20,
    )
    expect_row(table, 1, 1, window=70, busy=0, exposed_comm=10, unattributed=10, host_idle=50)


# ----------------------------------------------------------------- 8. clock alignment


# per all_reduce: (rank 0 start, end), (rank 1 start, end); the ends differ by +2, -1, 0, +3, -2
_AR = [((50, 100), (70, 102)), ((150, 220), (130, 219)), ((260, 300), (280, 300))]
_AR += [((330, 400), (350, 403)), ((450, 500), (420, 498))]
_GEMMS = {
    0: [(0, 50), (100, 150), (220, 260), (300, 330), (400, 450)],
    1: [(0, 70), (102, 130), (219, 280), (300, 350), (403, 420)],
}


def _two_host_docs(shift1: float, hosts: tuple[str, str] = ("a", "b")) -> list[dict]:
    docs = []
    for rank in (0, 1):
        work = [(1, gemm(ts, end - ts)) for ts, end in _GEMMS[rank]]
        for seq, spans in enumerate(_AR):
            ts, end = spans[rank]
            work.append((1, allreduce(ts, end - ts, seq)))
        shift = shift1 if rank == 1 else 0
        docs.append(gpu_doc(rank, {1: (0, 600)}, work, host=hosts[rank], shift=shift))
    return docs


def test_clock_alignment_across_hosts(tmp_path):
    """Rank 0 on host "a", rank 1 on host "b"; five all_reduces whose ends differ by
    +2, -1, 0, +3, -2 µs (median 0). Shifting every timestamp of rank 1 by +5 ms must not change
    the bubbles: the offset is estimated from the ends and subtracted.

    ::

        t (µs)    0  50 70 100 102 130 150 219 220 260 280 300 330 350 400 403 420 450 498 500
        rank 0    |==|~~|xx|===========|xxxxxxx|===|~~~|xxx|===|~~~|xxx|===========|xxxxxxx|
        rank 1    |=====|xxxxxx|===|~~~|xxx|===========|xxx|=======|xxxxxxx|===|~~~|xxx|

    Nothing is idle. rank 0: window [0, 500), busy 220, all_reduces 280 of which waiting
    [50,70) + [260,280) + [330,350) = 60, exposed 220. rank 1: window [0, 498), busy 226,
    all_reduces 272 of which waiting [130,150) + [420,450) = 50, exposed 222.
    """
    plain = load_docs(tmp_path / "plain", _two_host_docs(0))
    shifted = load_docs(tmp_path / "shifted", _two_host_docs(5000))
    plain_colls, shifted_colls = match_collectives(plain), match_collectives(shifted)
    assert plain_colls.offsets_ns == {0: 0, 1: 0}
    assert plain_colls.skew_ms == 0
    assert shifted_colls.offsets_ns[0] == 0
    assert abs(shifted_colls.offsets_ns[1] - 5_000_000) <= 1000
    assert shifted_colls.skew_ms == pytest.approx(5.0, abs=0.001)
    # aligned starts are the same in both runs
    assert _starts_us(shifted_colls) == _starts_us(plain_colls)

    before, after = checked_table(plain), checked_table(shifted)
    assert before.index.equals(after.index)
    assert (after - before).abs().max().max() <= 0.05
    expect_row(before, 0, 1, window=500, busy=220, straggler_wait=60, exposed_comm=220)
    expect_row(before, 1, 1, window=498, busy=226, straggler_wait=50, exposed_comm=222)

    # The same shifted traces claimed to share a host: the all_reduces end 5 ms apart, which
    # ranks on one clock cannot do, so the host has two clocks (containers, VMs) and rank 1's
    # is aligned as if it were on another host (tests/unit/analysis/test_clock_skew.py).
    same_host = load_docs(tmp_path / "same_host", _two_host_docs(5000, hosts=("a", "a")))
    colls = match_collectives(same_host)
    assert [c.name for c in colls.clocks] == ["a#0", "a#1"]
    assert colls.offsets_ns == shifted_colls.offsets_ns
    assert _starts_us(colls) == _starts_us(plain_colls)
    aligned = checked_table(same_host)
    expect_row(aligned, 0, 1, window=500, busy=220, straggler_wait=60, exposed_comm=220)
    expect_row(aligned, 1, 1, window=498, busy=226, straggler_wait=50, exposed_comm=222)


# ------------------------------------------------------- 9. the real gloo straggler trace


def test_reference_gloo_trace_rank2_is_the_straggler():
    """traces/reference/synthetic_gloo_a2a_straggler_4rank: rank 2 sleeps 20 ms before its
    collectives every step (README ground truth: the others wait 15.0-24.3 ms per all_to_all)."""
    run = fsobs.load_run(REFERENCE / "synthetic_gloo_a2a_straggler_4rank")
    colls = match_collectives(run)
    assert colls.problems.empty
    inst = colls.instances.drop_duplicates("instance")
    a2a = inst[inst["coll"] == "all_to_all"]
    assert len(a2a) == 4
    assert (a2a["last_rank"] == 2).all()
    table = checked_table(run)
    assert run.steps == [2, 3, 4, 5]
    assert len(table) == 4 * 4
    waits = table["straggler_wait_ms"].unstack("rank")
    for rank in (0, 1, 3):
        assert waits[rank].between(14, 26).all(), waits[rank]
    assert (waits[2] < 1).all(), waits[2]
    assert (table["other_ms"] == 0).all()


def test_cpu_op_waiting_inside_a_collective_is_a_bubble(tmp_path):
    """torchrec's All2All_Seq_ReqBackward sits for the whole collective with one short child:
    only leaf ops are busy, so its wait is straggler wait, not compute.

    ::

        t (µs)    0    10   20   22   60   70        100
        r0 main   |====|All2All_Seq_ReqBackward-------|     child c10d [20, 22)
        r0 gloo             |~~~~~~~~~~~~~~|xxx|            [20, 70); rank 1 arrives at 60
        r1 main   |==========================|               mm [0, 60)
        r1 gloo                            |xxx|            [60, 70)

    rank 0: blocked = [20, 70) (the child only enqueues: runtime, not compute)
            -> straggler_wait [20, 60) = 40, exposed_comm [60, 70) = 10; busy = 100 - 50 = 50.
    """
    main0 = [
        ("aten::mm", "cpu_op", 0, 10),
        ("All2All_Seq_ReqBackward", "cpu_op", 10, 90),
        ("c10d::alltoall_base_", "cpu_op", 20, 2),
    ]
    main1 = [("aten::mm", "cpu_op", 0, 60)]
    run = load_docs(tmp_path, [_gloo_doc(0, main0, (20, 50)), _gloo_doc(1, main1, (60, 10))])
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=50, straggler_wait=40, exposed_comm=10)
    expect_row(table, 1, 1, window=100, busy=90, exposed_comm=10)


def test_the_step_parts_and_the_classes_wait_on_disk_one_rank_each():
    """summarize_path spills every rank's step parts to a file as it arrives; the analysis
    takes them back a rank at a time and keeps none, and keeps the classes in a store on disk,
    one blob per rank, read on demand; the files close with their objects. Every common step
    of every rank is classified, the same as from fresh summaries."""
    from fsobs.analysis import analyze_summary, summarize_path
    from fsobs.analysis.spill import Spilled
    from fsobs.report import to_json

    source = REFERENCE / "synthetic_gloo_a2a_straggler_4rank"
    run = summarize_path(source)
    spilled = [s.parts for s in run.ranks.values()]
    assert all(isinstance(p, Spilled) for p in spilled)
    spill = spilled[0].file  # type: ignore[union-attr]
    assert {p.file for p in spilled} == {spill}  # type: ignore[union-attr]
    pieces = sorted((p.offset, p.size) for p in spilled)  # type: ignore[union-attr]
    assert [o for o, _ in pieces] == [0, *np.cumsum([n for _, n in pieces])[:-1].tolist()]
    assert spill.size == sum(n for _, n in pieces)
    group = run[0].process_groups[0]  # the same group, held once, not once per rank
    assert group.ranks == (0, 1, 2, 3)
    assert all(
        s.process_groups == (group,) and s.process_groups[0] is group for s in run.ranks.values()
    )
    steps = {
        r: [p.step for p in unpack(s.parts.read())]  # type: ignore[union-attr]
        for r, s in run.ranks.items()
    }
    assert all(steps.values())
    analysis = analyze_summary(run)
    assert all(s.parts is None for s in analysis.run.ranks.values())
    with pytest.raises(RuntimeError, match="taken already"):
        analysis.run[0].take_parts()
    want = sorted((r, st) for r, own in steps.items() for st in own if st in set(run.steps))
    assert sorted((sb.rank, sb.step) for sb in analysis.bubbles) == want
    assert len(analysis.bubbles) == len(want) == len(run.rank_ids) * len(run.steps)
    assert analysis.bubbles.ranks == run.rank_ids
    assert [(sb.rank, sb.step) for sb in analysis.bubbles.of_ranks([2, 0])] == [
        (r, st) for r in (2, 0) for st in run.steps
    ]
    store = weakref.ref(analysis.bubbles._file)  # type: ignore[arg-type]
    assert store() is not spill and store().size == analysis.bubbles.nbytes > 0  # type: ignore[union-attr]
    assert to_json(analysis) == to_json(fsobs.analyze_path(source))
    parts = weakref.ref(spill)
    del spilled, spill, run, analysis
    gc.collect()
    assert parts() is None and store() is None  # their finalizers closed the files
