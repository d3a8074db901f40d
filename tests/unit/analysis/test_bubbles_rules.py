"""The CPU innermost-op rule, robust matching, partial runs and straggler charging, on
hand-built traces with expected values derived by hand (see tests/unit/analysis/test_bubbles.py for
the
legend: ``~`` straggler wait, ``x`` exposed, ``u`` unattributed, ``=`` compute, ``d`` data).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.analysis.bubbles.tables import step_times
from fsobs.analysis.stragglers.identify import StragglerConfig, find_stragglers
from fsobs.report import findings
from tests.support.bubble_rows import checked_table, expect_row, load_docs
from tests.support.kineto import (
    GLOO_PG1_TID,
    GLOO_TID,
    allreduce,
    cpu_doc,
    cpu_op,
    gemm,
    gloo,
    gpu_doc,
    kernel,
    launch,
    memcpy,
    step,
    thread_name,
    trace,
    write,
    x,
)

DATA = "## fsobs:data ##"
TINY = StragglerConfig(min_wait_ms=0.0, min_wait_share=0.0)
"""Hand-built traces are in µs: name every straggler, however small."""


# ------------------------------------------------------------- 1. the innermost-op rule (CPU)


def test_innermost_compute_op_is_busy_whatever_is_in_flight(tmp_path):
    """An async all_reduce is in flight while rank 0 runs aten::bmm, whose child
    aten::resolve_conj is the innermost op for 2 µs: the whole bmm is busy (a leaf-op rule lost
    the bmm's own 28 µs). Glue of a non-compute op is busy when nothing is in flight; inside a
    data-loader range, non-compute time is host_idle and compute ops stay busy.

    ::

        t (µs)    0  3 5  10     20 22     40   48 50   60 62      78 80 85  90     100
        r0 main   |  |c|  |bmm====|rc|=====|              |eval|mm====|eval|dd|cat|ddddd|
        r0 gloo        |~~~~|                |~~~~~~~|xxxx|
        r1 main   |mm============================|c|     |eval|mm====|eval|dd|cat|ddddd|
        r1 gloo                                        |xxxx|

    c = c10d::allreduce_ (the enqueue: the collective is in flight from there), eval =
    autograd::engine::evaluate_function (glue), d = ## fsobs:data ## range. A = 48 (rank 1
    asks last).

    rank 0: compute (innermost) = [10,40) + [62,78) + [85,90); comm [3, 60);
            blocked = [3,10) + [40,60) = 27 -> straggler_wait [3,10) + [40,48) = 15,
            exposed_comm [48, 60) = 12; host_idle = [80,85) + [90,100) = 15;
            busy = 100 - 27 - 15 = 58 (bmm, eval glue and mm, cat, Python before c).
    rank 1: blocked = [48, 60) = 12, all exposed; host_idle 15; busy 73.
    """

    def tail() -> list[dict]:
        return [
            cpu_op("autograd::engine::evaluate_function: MmBackward0", 60, 20),
            cpu_op("aten::mm", 62, 16),
            x(DATA, "user_annotation", 80, 20),
            cpu_op("aten::cat", 85, 5),
        ]

    rank0 = [
        cpu_op("c10d::allreduce_", 3, 2),
        cpu_op("aten::bmm", 10, 30),
        cpu_op("aten::resolve_conj", 20, 2),
        gloo("all_reduce", 5, 55),
        *tail(),
    ]
    rank1 = [
        cpu_op("aten::mm", 0, 48),
        cpu_op("c10d::allreduce_", 48, 2),
        gloo("all_reduce", 50, 10),
        *tail(),
    ]
    table = checked_table(load_docs(tmp_path, [cpu_doc(0, rank0), cpu_doc(1, rank1)]))
    expect_row(table, 0, 1, window=100, busy=58, straggler_wait=15, exposed_comm=12, host_idle=15)
    expect_row(table, 1, 1, window=100, busy=73, exposed_comm=12, host_idle=15)


def test_collective_in_flight_inside_the_data_range_is_blocked_not_idle(tmp_path):
    """The balance toggle's exchange runs inside the data range: blocked time there is comm.

    ::

        t (µs)    0    20   30   40   50   60        100
        r0 main   |====|ddddd|c|dddddddddddd|=========|     d = data range [20, 60)
        r0 gloo             |~~~~|xxxx|                     all_to_all [30, 50)
        r1 main   |=========|ddd|c|ddddddddd|=========|     data [35, 60)
        r1 gloo                  |xxxx|                     all_to_all [40, 50)

    c = c10d::alltoall_base_ (inside the data range): the collective is in flight from there.
    A = 38. rank 0: compute [0,20) + [60,100) = 60; blocked [28, 50) -> wait [28, 38) = 10,
    exposed 12; host_idle = [20,28) + [50,60) = 18; busy 60.   rank 1: compute [0,35) +
    [60,100) = 75; blocked [38, 50) exposed 12; host_idle [35,38) + [50,60) = 13; busy 75.
    """
    rank0 = [
        cpu_op("aten::mm", 0, 20),
        x(DATA, "user_annotation", 20, 40),
        cpu_op("c10d::alltoall_base_", 28, 1),
        gloo("all_to_all", 30, 20),
        cpu_op("aten::mm", 60, 40),
    ]
    rank1 = [
        cpu_op("aten::mm", 0, 35),
        x(DATA, "user_annotation", 35, 25),
        cpu_op("c10d::alltoall_base_", 38, 1),
        gloo("all_to_all", 40, 10),
        cpu_op("aten::mm", 60, 40),
    ]
    table = checked_table(load_docs(tmp_path, [cpu_doc(0, rank0), cpu_doc(1, rank1)]))
    expect_row(table, 0, 1, window=100, busy=60, straggler_wait=10, exposed_comm=12, host_idle=18)
    expect_row(table, 1, 1, window=100, busy=75, exposed_comm=12, host_idle=13)


# ------------------------------------------------------------ 3. matching without Seq


def test_an_extra_collective_before_the_first_step_shifts_nothing(tmp_path):
    """Rank 0's trace caught the tail of an all_reduce before ProfilerStep#1; rank 1's did not.
    Counting per step keeps steps 1 and 2 paired right (a global count would pair rank 0's
    tail with rank 1's step-1 all_reduce, and every later pair would be off by one).

    ::

        t (µs)   -30 -20   0    40   50  60  100   140  150  160  200
        r0 gloo   |xx|     |    |~~~~|xxx|   |          |xxxx|        step -1 tail, 1, 2
        r1 gloo            |         |xxx|   |     |~~~~|xxxx|

    step 1: A = 50, rank 0 waits [40, 50); step 2: A = 150, rank 1 waits [140, 150).
    """
    steps = ((1, 0, 100), (2, 100, 100))
    rank0 = [
        gloo("all_reduce", -30, 10),
        gloo("all_reduce", 40, 20),
        gloo("all_reduce", 150, 10),
    ]
    rank1 = [gloo("all_reduce", 50, 10), gloo("all_reduce", 140, 20)]
    run = load_docs(tmp_path, [cpu_doc(0, rank0, steps=steps), cpu_doc(1, rank1, steps=steps)])
    result = analyze(run)
    assert result.collectives.problems[["key", "issue", "ranks"]].values.tolist() == [
        ["all_reduce @-1 #0", "missing on ranks [1]", [0]]
    ]
    inst = result.collectives.instances.drop_duplicates("instance")
    assert inst[["key", "last_rank"]].values.tolist() == [
        ["all_reduce @1 #0", 1],
        ["all_reduce @2 #0", 0],
    ]
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=80, straggler_wait=10, exposed_comm=10)
    expect_row(table, 1, 1, window=100, busy=90, exposed_comm=10)
    expect_row(table, 0, 2, window=100, busy=90, exposed_comm=10)
    expect_row(table, 1, 2, window=100, busy=80, straggler_wait=10, exposed_comm=10)


def test_ranks_that_disagree_on_the_step_are_not_paired(tmp_path):
    """The same all_reduce starts in step 1 on rank 0 and in step 2 on rank 1: reported on
    both sides, never paired, its time unattributed.

    ::

        t (µs)    0        90  100  110  200
        r0 gloo   |        |uuuu|uuu|    |       [90, 110): step 1
        r1 gloo   |             |   |uuuu|       [105, 120): step 2
    """
    steps = ((1, 0, 100), (2, 100, 100))
    run = load_docs(
        tmp_path,
        [
            cpu_doc(0, [gloo("all_reduce", 90, 20)], steps=steps),
            cpu_doc(1, [gloo("all_reduce", 105, 15)], steps=steps),
        ],
    )
    colls = analyze(run).collectives
    assert colls.instances.empty
    assert sorted(colls.problems[["key", "issue"]].values.tolist()) == [
        ["all_reduce @1 #0", "missing on ranks [1]"],
        ["all_reduce @2 #0", "missing on ranks [0]"],
    ]
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=90, unattributed=10)
    expect_row(table, 0, 2, window=100, busy=90, unattributed=10)
    expect_row(table, 1, 2, window=100, busy=85, unattributed=15)


def test_an_instance_whose_ends_spread_far_more_than_the_others_is_not_paired(tmp_path):
    """Four steps of 1 s; each all_reduce ends within 1 µs on both ranks, except step 3's,
    where rank 1 ends 100 ms after rank 0 (limit: max(200 x median spread, 50 ms) = 50 ms;
    the floor keeps the jitter of a loaded CPU host, tens of ms, from looking like this).
    Step 3's pair is dropped and its time unattributed; the others are matched.
    """
    steps = tuple((n, 1_000_000 * (n - 1), 1_000_000) for n in (1, 2, 3, 4))
    rank0, rank1 = [], []
    for n, base, _ in steps:
        rank0.append(gloo("all_reduce", base + 10_000, 10_000))
        late_end = 100_000 if n == 3 else 1
        rank1.append(gloo("all_reduce", base + 15_000, 5_000 + late_end))
    run = load_docs(tmp_path, [cpu_doc(0, rank0, steps=steps), cpu_doc(1, rank1, steps=steps)])
    colls = analyze(run).collectives
    assert colls.problems["key"].tolist() == ["all_reduce @3 #0"]
    assert "end times spread 100.000 ms" in colls.problems["issue"].iloc[0]
    assert sorted(colls.instances["key"].unique()) == [f"all_reduce @{n} #0" for n in (1, 2, 4)]
    table = checked_table(run)
    expect_row(table, 0, 3, window=1_000_000, busy=990_000, unattributed=10_000)
    expect_row(table, 1, 3, window=1_000_000, busy=895_000, unattributed=105_000)
    expect_row(
        table, 0, 1, window=1_000_000, busy=990_000, straggler_wait=5_000, exposed_comm=5_000
    )


def _two_group_doc(rank: int, events: list[dict]) -> dict:
    doc = cpu_doc(rank, events)
    doc["distributedInfo"]["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]},
        {"pg_name": "1", "pg_desc": "freescale_balance", "pg_size": 2, "ranks": [0, 1]},
    ]
    return doc


def test_gloo_collectives_of_two_groups_are_never_paired_across_groups(tmp_path):
    """Two gloo groups, each with an all_reduce in the step, issued in opposite orders on the
    two ranks. gloo names no group; the optimizer's ``## fsobs:comm:other:1 ##`` range around the
    enqueue does, and each worker thread takes the group of its collectives' enqueues.

    ::

        t (µs)    4 5 7 10 12  20 22   25 28 30      40        100
        r0 main        |pg1|  |c|                             pg1 = marker around c10d [10, 11)
        r0 gloo 300        |~~~~~~~~~~~~~~~|xx|               group 1 [12, 30)
        r0 gloo 200               |xxxxxxxxxxxxxxx|           default [22, 40)
        r1 main   |c|                |pg1|
        r1 gloo 200  |~~~~~~~~~~~|xxxxxxxxxxxxxxxxx|          default [7, 40)
        r1 gloo 300                      |xx|                 group 1 [28, 30)

    A collective arrives with its enqueue (c): group 1 at 10 (rank 0) and 25 (rank 1),
    default at 20 (rank 0) and 4 (rank 1). Paired by group: group 1, A = 25 -> rank 0 waits
    [10, 25) = 15 for rank 1; default, A = 20 -> rank 1 waits [4, 20) = 16 for rank 0.
    (Paired by order instead, rank 0's [12, 30) would meet rank 1's [7, 40).)
    rank 0: in flight [10, 40): wait 15, exposed 15, busy 70.
    rank 1: in flight [4, 40): wait 16, exposed 20, busy 64.
    """
    rank0 = [
        x("## fsobs:comm:other:1 ##", "user_annotation", 10, 2),
        cpu_op("c10d::allreduce_", 10, 1),
        gloo("all_reduce", 12, 18, tid=GLOO_PG1_TID),
        cpu_op("c10d::allreduce_", 20, 1),
        gloo("all_reduce", 22, 18),
    ]
    rank1 = [
        cpu_op("c10d::allreduce_", 4, 1),
        gloo("all_reduce", 7, 33),
        x("## fsobs:comm:other:1 ##", "user_annotation", 25, 2),
        cpu_op("c10d::allreduce_", 25, 1),
        gloo("all_reduce", 28, 2, tid=GLOO_PG1_TID),
    ]
    run = load_docs(tmp_path, [_two_group_doc(0, rank0), _two_group_doc(1, rank1)])
    result = analyze(run)
    assert result.collectives.problems.empty
    inst = result.collectives.instances.sort_values(["group", "rank"])
    assert inst[["group", "rank", "start_ns"]].assign(
        start_ns=lambda f: (f["start_ns"] - run[0].base_time_ns) / 1000
    ).values.tolist() == [["1", 0, 10], ["1", 1, 25], ["default", 0, 20], ["default", 1, 4]]
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=70, straggler_wait=15, exposed_comm=15)
    expect_row(table, 1, 1, window=100, busy=64, straggler_wait=16, exposed_comm=20)
    strag = find_stragglers(
        result.caused, step_times(result.steps), result.collectives.lateness, run.rank_ids, TINY
    )
    assert strag.per_step.loc[0, "rank"] == 0  # caused 16 µs, rank 1 caused 15
    assert strag.per_rank["wait_caused_ms"].tolist() == pytest.approx([0.016, 0.015])


# ---------------------------------------------------------------------- 4. partial runs


def test_a_group_with_a_missing_rank_gives_no_waits(tmp_path):
    """World size 3, ranks 0 and 1 loaded. pg "0" spans all three ranks (rank 2 may be the one
    everybody waited for): no waits, its time unattributed. pg "5" spans ranks 0 and 1 only:
    whole, matched as usual.

    ::

        t (µs)    10   20   30   40   50   60
        rank 0    |uuuuuuuuu|    |~~~~|xxxx|       pg 0 [10, 30), pg 5 [40, 60)
        rank 1         |uuuu|         |xxxx|       pg 0 [20, 30), pg 5 [50, 60)

    rank 0: window [10, 60) = 50: unattributed 20, wait 10, exposed 10, host_idle [30, 40) 10.
    rank 1: window [20, 60) = 40: unattributed 10, exposed 10, host_idle [30, 50) 20.
    """
    steps = {1: (0, 100)}

    def group0(ts, dur):
        return allreduce(ts, dur, 0, pg="0", Process_Group_Ranks="[0, 1, 2]")

    def group5(ts, dur):
        return allreduce(ts, dur, 0, pg="5", stream=24, Process_Group_Ranks="[0, 1]")

    rank0 = [(1, group0(10, 20)), (1, group5(40, 20))]
    rank1 = [(1, group0(20, 10)), (1, group5(50, 10))]
    docs = [gpu_doc(r, steps, w, world_size=3) for r, w in ((0, rank0), (1, rank1))]
    run = load_docs(tmp_path, docs)
    result = analyze(run)
    partial = result.collectives.partial
    assert partial.values.tolist() == [["0", [2], 1]]
    assert result.collectives.problems.empty
    assert result.collectives.instances["group"].unique().tolist() == ["5"]
    table = checked_table(run)
    expect_row(
        table,
        0,
        1,
        window=50,
        busy=0,
        unattributed=20,
        straggler_wait=10,
        exposed_comm=10,
        host_idle=10,
    )
    expect_row(table, 1, 1, window=40, busy=0, unattributed=10, exposed_comm=10, host_idle=20)
    assert any(
        "misses ranks 2" in line and "every rank of the group" in line for line in findings(result)
    )


# ------------------------------------------------------------------------ 5. stragglers


def test_overlapping_waits_are_charged_once_to_the_binding_last_rank(tmp_path):
    """Rank 0 waits in two collectives at once (pg "0" with rank 1, pg "1" with rank 2);
    each piece of its wait is charged once, to the instance whose last arrival is latest.

    ::

        t (µs)    10   20   30   40        60
        r0 pg 0   |~~~~~~~~~|xxxxxxxxxxxxxx|       last: rank 1 at 30
        r0 pg 1        |~~~~~~~~~|xxxxxxxxx|       last: rank 2 at 40
        rank 1              |xxxxxxxxxxxxxx|
        rank 2                   |xxxxxxxxx|

    rank 0 straggler_wait = [10, 40) = 30: [20, 40) to rank 2 (binding), [10, 20) to rank 1.
    The wait caused adds up to the straggler_wait class: 10 + 20 = 30.
    """
    steps = {1: (0, 100)}

    def pg0(ts, dur):
        return allreduce(ts, dur, 0, pg="0", Process_Group_Ranks="[0, 1]")

    def pg1(ts, dur):
        return allreduce(ts, dur, 0, pg="1", stream=24, Process_Group_Ranks="[0, 2]")

    work = {0: [(1, pg0(10, 50)), (1, pg1(20, 40))], 1: [(1, pg0(30, 30))], 2: [(1, pg1(40, 20))]}
    run = load_docs(tmp_path, [gpu_doc(r, steps, w, world_size=3) for r, w in work.items()])
    result = analyze(run)
    bubbles = {sb.rank: sb for sb in result.bubbles}
    assert bubbles[0].caused_ns == {1: 10_000, 2: 20_000}
    strag = find_stragglers(
        result.caused, step_times(result.steps), result.collectives.lateness, run.rank_ids, TINY
    )
    assert strag.per_step[["step", "rank", "wait_caused_ms"]].values.tolist() == [[1, 2, 0.02]]
    assert strag.per_rank["wait_caused_ms"].tolist() == pytest.approx([0, 0.01, 0.02])
    total = result.steps["straggler_wait_ms"].sum()
    assert strag.per_rank["wait_caused_ms"].sum() == pytest.approx(total) == pytest.approx(0.03)


def test_equal_waits_are_a_tie_and_tiny_waits_name_no_straggler(tmp_path):
    """Step 1: rank 0 waits 10 µs for rank 1 (all_reduce a), rank 1 waits 10 µs for rank 0
    (all_reduce b): a tie, no straggler named. Step 2: rank 0 waits 5 µs, rank 1 is named with
    TINY, and with the default config (waits under 0.1 ms are tiny) no step names anyone.

    ::

        step 1    0    10   20   30   40   50          step 2    100  105  110
        rank 0    |~~~~|xxxx|    |xxxx|                rank 0    |~~~~|xxxx|
        rank 1         |xxxx|~~~~|xxxx|                rank 1         |xxxx|
    """
    steps = ((1, 0, 100), (2, 100, 100))
    rank0 = [gloo("all_reduce", 0, 20), gloo("all_reduce", 30, 10), gloo("all_reduce", 100, 10)]
    rank1 = [gloo("all_reduce", 10, 10), gloo("all_reduce", 20, 20), gloo("all_reduce", 105, 5)]
    run = load_docs(tmp_path, [cpu_doc(0, rank0, steps=steps), cpu_doc(1, rank1, steps=steps)])
    result = analyze(run)
    strag = find_stragglers(
        result.caused, step_times(result.steps), result.collectives.lateness, run.rank_ids, TINY
    )
    first, second = strag.per_step.to_dict("records")
    assert pd.isna(first["rank"]) and first["tied_ranks"] == [0, 1]
    assert first["wait_caused_ms"] == pytest.approx(0.01)
    assert second["rank"] == 1 and second["tied_ranks"] == []
    assert strag.per_rank["times_last"].tolist() == [0, 1]
    calm = result.stragglers  # the default config: 0.1 ms at least
    assert calm.per_step["rank"].isna().all() and calm.verdict == "none"
    assert calm.culprit is None
    assert "below 0.100 ms" in calm.per_step.loc[1, "note"]
    assert not any("straggler" in line for line in findings(result))


# --------------------------------------------------------- 10. traces of other jobs: windows


def _stepless_doc(rank: int, events: list[dict]) -> dict:
    names = [thread_name(GLOO_TID, "pt_gloo_runloop")]
    return trace([*names, *events], rank=rank, world_size=2, backend="gloo")


def test_a_trace_without_steps_is_one_window_per_rank(tmp_path):
    """No ProfilerStep (a manual profiler start/stop): one window per rank, the span of its
    CPU events, as step 0.

    ::

        t (µs)    0         30   40   50   60
        r0 main   |=========|                      mm; gloo [30, 50)
        r0 gloo             |~~~~|xxxx|
        r1 main   |==============|    |====|       mm, add; gloo [40, 50)
        r1 gloo                  |xxxx|

    rank 0: window [0, 50): busy 30, wait 10, exposed 10. rank 1: [0, 60): busy 50, exposed 10.
    """
    rank0 = [cpu_op("aten::mm", 0, 30), gloo("all_reduce", 30, 20)]
    rank1 = [cpu_op("aten::mm", 0, 40), gloo("all_reduce", 40, 10), cpu_op("aten::add", 50, 10)]
    run = load_docs(tmp_path, [_stepless_doc(0, rank0), _stepless_doc(1, rank1)])
    assert run.steps == [0]
    assert {t.step_source for t in run.ranks.values()} == {"whole trace"}
    assert any("one window (step 0)" in w for w in run.warnings)
    table = checked_table(run)
    expect_row(table, 0, 0, window=50, busy=30, straggler_wait=10, exposed_comm=10)
    expect_row(table, 1, 0, window=60, busy=50, exposed_comm=10)


def test_a_step_marker_makes_the_users_ranges_the_steps(tmp_path):
    """``--step-marker train_step``: the outermost ``train_step`` ranges are the steps 0, 1
    (a nested ``train_step.data`` range is part of its step); ProfilerStep#7 around both is
    then a plain annotation.

    ::

        t (µs)    0        30   40 45 50       70   80   90  100
        steps     |----train_step 0-----|----train_step 1-------|
        r0        |========|~~~~|xx|    |=============|xxxx|      mm; gloo [30,45), [80,90)
        r1        |=============|xx|    |========|~~~~|xxxx|      mm; gloo [40,45), [70,90)

    step 0: A = 40: rank 0 waits 10, both exposed 5; busy 35 / 45 of 50.
    step 1: A = 80: rank 1 waits 10, both exposed 10; busy 40 / 30 of 50.
    """

    def doc(rank: int, work: list[dict]) -> dict:
        ranges = [
            x("ProfilerStep#7", "user_annotation", 0, 100),
            x("train_step", "user_annotation", 0, 50),
            x("train_step.data", "user_annotation", 1, 2),
            x("train_step", "user_annotation", 50, 50),
        ]
        return _stepless_doc(rank, [*ranges, *work])

    rank0 = [cpu_op("aten::mm", 0, 30), gloo("all_reduce", 30, 15)]
    rank0 += [cpu_op("aten::mm", 50, 30), gloo("all_reduce", 80, 10)]
    rank1 = [cpu_op("aten::mm", 0, 40), gloo("all_reduce", 40, 5)]
    rank1 += [cpu_op("aten::mm", 50, 20), gloo("all_reduce", 70, 20)]
    for r, work in ((0, rank0), (1, rank1)):
        write(tmp_path / f"rank{r}.json", doc(r, work))
    run = fsobs.load_run(tmp_path, fsobs.LoadConfig(step_marker="train_step"))
    assert run.steps == [0, 1]
    table = checked_table(run)
    expect_row(table, 0, 0, window=50, busy=35, straggler_wait=10, exposed_comm=5)
    expect_row(table, 1, 0, window=50, busy=45, exposed_comm=5)
    expect_row(table, 0, 1, window=50, busy=40, exposed_comm=10)
    expect_row(table, 1, 1, window=50, busy=30, straggler_wait=10, exposed_comm=10)


# -------------------------------------------------------------------------- 6. findings


def test_findings_report_large_other_and_steps_missing_on_some_ranks(tmp_path):
    """Rank 1 recorded step 1 only; both ranks copy memory for 10 µs in step 1.

    ::

        t (µs)    10        40   50                    110  120
        rank 0    |=========|mmmm|                     |====|      step 2 starts at 110
        rank 1    |=========|mmmm|

    Only step 1 is analyzed. rank 0: window [10, 110) (to step 2's first kernel): busy 30,
    other 10, host_idle 60; rank 1: window [10, 50): busy 30, other 10. other = 20 of 140
    (14.3%) of the window: above the 5% it should be.
    """
    step1 = [(1, gemm(10, 30)), (1, memcpy(40, 10, stream=8))]
    docs = [
        gpu_doc(0, {1: (0, 100), 2: (100, 100)}, [*step1, (2, gemm(110, 10))]),
        gpu_doc(1, {1: (0, 100)}, [(1, gemm(10, 30)), (1, memcpy(40, 10, stream=8))]),
    ]
    run = load_docs(tmp_path, docs)
    assert run.steps == [1]
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=30, other=10, host_idle=60)
    expect_row(table, 1, 1, window=40, busy=30, other=10)
    lines = findings(analyze(run))
    assert any(line.startswith("'other' takes 14.3% of the window") for line in lines)
    assert "step(s) 2 are missing on some ranks (rank 1 lacks 2): left out of the analysis" in lines


# ------------------------------------------------------------- 11. roles of the collectives


def test_roles_from_the_markers_split_wait_and_exposed_time(tmp_path):
    """Rank 0 waits in an embedding all_to_all (group 2) and a dense all_reduce (group 3) at
    once; FreeScale's markers around the enqueues (e, d) name role and group, and each
    collective arrives with its enqueue.

    ::

        t (µs)    5  8  10    19   24   30        40
        r0 main   |e |d |                                 enqueues at 5 (a2a) and 8 (ar)
        r0 t300         |~~~~~~~~~~~~~~|xxxxxxxxxxxx|     all_to_all [10, 40), last: r1 at 19
        r0 t400         |~~~~~~~~~~~~~~~~~~~|xxxx|        all_reduce [10, 30), last: r1 at 24
        r1 main               |e   |d                     enqueues at 19 and 24
        r1 t300                |xxxxxxxxxxxxxxxxx|        [20, 40)
        r1 t400                     |xxxx|                [25, 30)

    rank 0: in flight [5, 40); straggler_wait [5, 24) = 19: the all_reduce's [8, 24) = 16
    charged to it (the binding one, latest last arrival: dense), the rest [5, 8) = 3 to the
    all_to_all (embedding); exposed [24, 40) = 16, embedding (embedding before dense where
    both are in flight); busy 65. rank 1: in flight [19, 40): exposed 21, embedding; busy 79.
    Per rank and step: embedding wait 3 / 2 = 1.5, exposed (16 + 21) / 2 = 18.5; dense wait
    16 / 2 = 8.
    """
    from fsobs.analysis.pipeline import kpis_by_role

    def doc(rank: int, asks: tuple[float, float], a2a: tuple[float, float], ar) -> dict:
        events = [
            x("## fsobs:comm:embedding:2 ##", "user_annotation", asks[0], 1),
            cpu_op("c10d::alltoall_base_", asks[0], 1),
            x("## fsobs:comm:dense:3 ##", "user_annotation", asks[1], 1),
            cpu_op("c10d::allreduce_", asks[1], 1),
            gloo("all_to_all", *a2a, tid=GLOO_PG1_TID),
            gloo("all_reduce", *ar, tid=400),
        ]
        return cpu_doc(rank, events)

    run = load_docs(
        tmp_path,
        [doc(0, (5, 8), (10, 30), (10, 20)), doc(1, (19, 24), (20, 20), (25, 5))],
    )
    result = analyze(run)
    inst = result.collectives.instances.drop_duplicates("instance")
    assert sorted(inst[["group", "role", "coll"]].values.tolist()) == [
        ["2", "embedding", "all_to_all"],
        ["3", "dense", "all_reduce"],
    ]
    table = checked_table(run)
    expect_row(table, 0, 1, window=100, busy=65, straggler_wait=19, exposed_comm=16)
    expect_row(table, 1, 1, window=100, busy=79, exposed_comm=21)
    roles = kpis_by_role(result.roles)
    assert roles["embedding"] == pytest.approx(
        {"straggler_wait_ms_per_step": 0.0015, "exposed_comm_ms_per_step": 0.0185}
    )
    assert roles["dense"] == pytest.approx(
        {"straggler_wait_ms_per_step": 0.008, "exposed_comm_ms_per_step": 0.0}
    )
    assert roles["other"] == {"straggler_wait_ms_per_step": 0.0, "exposed_comm_ms_per_step": 0.0}


def test_roles_from_the_nccl_group_description_and_from_run_json(tmp_path):
    """Without markers: an NCCL kernel of the group described ``freescale_emb`` is embedding;
    on gloo, run.json's group layout names the roles (here the default group is dense)."""
    from fsobs.analysis.pipeline import kpis_by_role

    steps = {1: (0, 100)}

    def emb(ts, dur):
        return allreduce(ts, dur, 0, pg="4", Process_Group_Description="freescale_emb")

    docs = [gpu_doc(0, steps, [(1, emb(10, 20))]), gpu_doc(1, steps, [(1, emb(20, 10))])]
    roles = kpis_by_role(analyze(load_docs(tmp_path / "gpu", docs)).roles)
    assert roles["embedding"]["straggler_wait_ms_per_step"] == pytest.approx(0.005)  # 10/2 µs

    rank0 = [gloo("all_reduce", 10, 20)]
    rank1 = [gloo("all_reduce", 20, 10)]
    gloo_dir = tmp_path / "gloo"
    for r, events in ((0, rank0), (1, rank1)):
        write(gloo_dir / f"rank{r}.json", cpu_doc(r, events))
    layout = {"dense": {"pg_name": "default"}, "embedding": {"pg_name": "7"}}
    (gloo_dir / "run.json").write_text(json.dumps({"world_size": 2, "process_groups": layout}))
    roles = kpis_by_role(analyze(fsobs.load_run(gloo_dir)).roles)
    assert roles["dense"]["straggler_wait_ms_per_step"] == pytest.approx(0.005)
    assert roles["embedding"]["straggler_wait_ms_per_step"] == 0.0


def test_a_group_of_several_roles_in_run_json_names_none(tmp_path):
    """Every toggle off, FreeScale's embedding and dense groups are both the default group:
    run.json's layout then says nothing of an unmarked collective's role (not 'embedding')."""
    from fsobs.analysis.pipeline import kpis_by_role

    for r, events in ((0, [gloo("all_reduce", 10, 20)]), (1, [gloo("all_reduce", 20, 10)])):
        write(tmp_path / f"rank{r}.json", cpu_doc(r, events))
    layout = {"dense": {"pg_name": "0"}, "embedding": {"pg_name": "0"}}
    (tmp_path / "run.json").write_text(json.dumps({"world_size": 2, "process_groups": layout}))
    roles = kpis_by_role(analyze(fsobs.load_run(tmp_path)).roles)
    assert roles["other"]["straggler_wait_ms_per_step"] == pytest.approx(0.005)  # 10/2 µs
    assert roles["embedding"]["straggler_wait_ms_per_step"] == 0.0
    assert roles["dense"]["straggler_wait_ms_per_step"] == 0.0


def test_a_loops_own_collective_on_the_marked_default_group_keeps_the_queue_in_order(tmp_path):
    """DDP's all-reduce marked on the default group ("0") and the loop's own unmarked
    all-reduce on that same group share one gloo queue: each collective pairs with its own
    enqueue (dense, then the loop's, twice), not with the next marked one.

    ::

        t (µs)   10 11    20   30 31 35   50 51    60   70 71 75
        main     |m|       |   |u|        |m|       |   |u|          m: marked, u: unmarked
        gloo        |dense-|      |oth|      |dense-|      |oth|
    """
    events = []
    for start in (10, 50):
        events += [
            x("## fsobs:comm:dense:0 ##", "user_annotation", start - 0.5, 2),
            cpu_op("c10d::allreduce_", start, 1),
            gloo("all_reduce", start + 1, 9),
            cpu_op("c10d::allreduce_", start + 20, 1),
            gloo("all_reduce", start + 21, 4),
        ]
    for r in (0, 1):
        write(tmp_path / f"rank{r}.json", cpu_doc(r, events))
    colls = analyze(fsobs.load_run(tmp_path)).collectives.instances
    mine = colls[colls["rank"] == 0].sort_values("start_ns")
    assert mine["role"].tolist() == ["dense", "other", "dense", "other"]


def test_an_async_collective_issued_before_the_data_range_does_not_block_it(tmp_path):
    """The pipeline issues the next batch's input dist (async), then loads data while it runs:
    the loading is host_idle, not wait; the wait comes when the thread really waits for it.

    ::

        t (µs)    0    10 11 12        40   48   60             100
        r0 main   |====|c|~|dddddddddddd|~~~~|xxxx|=============|   d = data [12, 40)
        r0 gloo          |~|  (in flight)  |~~~~|xxxx|             all_to_all [11, 60)
        r1 main   |=================================|c|=========|   c [48, 49)
        r1 gloo                                     |xxxx|          all_to_all [50, 60)

    Arrivals are the enqueues: 10 and 48, A = 48. rank 0: the all_to_all is in flight over
    the data range, but arrived before it: host_idle [12, 40) = 28; blocked [10, 12) +
    [40, 60): straggler_wait [10, 12) + [40, 48) = 10, exposed 12; busy = [0, 10) +
    [60, 100) = 50.   rank 1: blocked [48, 60) exposed 12; busy 88.
    """
    rank0 = [
        cpu_op("aten::mm", 0, 10),
        cpu_op("c10d::alltoall_base_", 10, 1),
        gloo("all_to_all", 11, 49),
        x(DATA, "user_annotation", 12, 28),
        cpu_op("aten::mm", 60, 40),
    ]
    rank1 = [
        cpu_op("aten::mm", 0, 48),
        cpu_op("c10d::alltoall_base_", 48, 1),
        gloo("all_to_all", 50, 10),
        cpu_op("aten::mm", 60, 40),
    ]
    table = checked_table(load_docs(tmp_path, [cpu_doc(0, rank0), cpu_doc(1, rank1)]))
    expect_row(table, 0, 1, window=100, busy=50, straggler_wait=10, exposed_comm=12, host_idle=28)
    expect_row(table, 1, 1, window=100, busy=88, exposed_comm=12)


# ----------------------------------------------------------- 12. contention and copy engines


def test_contention_compares_like_kernels_and_ignores_copy_engine_transfers(tmp_path):
    """One GPU rank. ``gemm`` runs at two launch shapes (grid 1 and grid 2); NCCL kernels
    take SMs, the copy-engine memcpy (launched inside FreeScale's comm range) does not.

    ::

        t (µs)  0   10 18 20  35 40  60 70 80  106 110 135 140 146 170 172  200 206
        g1      |===|   |=====|      |==|                                        10, 15, 10
        g2                                 |===|  |=======|  |===|    |=======|   30, 40, 30, 34
        nccl           |=======|                                   |========|
        CE copy                                |mmmmmm|  (Memcpy DtoD, in the comm range)

    grid 1: alone 10, 10 -> median 10; during NCCL 15: +5.
    grid 2: alone 30, 40, 30 (the 40 overlaps only the copy: that is not contention, the copy
    engines take no SMs) -> median 30; during NCCL 34: +4. Total 9 µs. (By name alone the
    median of 10, 10, 30, 40, 30 would be 30, giving 0 + 4 = 4.)
    """

    def grid_gemm(ts, dur, corr, grid):
        return kernel("gemm", ts, dur, corr=corr, grid=[grid, 1, 1], block=[128, 1, 1])

    def nccl(ts, dur, corr, seq):
        return kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            ts,
            dur,
            stream=20,
            corr=corr,
            Collective_name="allreduce",
            Process_Group_Name="0",
            Process_Group_Ranks="[0]",
            Seq=seq,
        )

    copy = x(
        "Memcpy DtoD (Device -> Device)",
        "gpu_memcpy",
        105,
        30,
        pid=0,
        tid=24,
        stream=24,
        correlation=9,
    )
    gpu = [
        grid_gemm(0, 10, 1, 1), grid_gemm(20, 15, 2, 1), grid_gemm(60, 10, 3, 1),
        grid_gemm(80, 30, 4, 2), grid_gemm(106, 40, 5, 2), grid_gemm(140, 30, 6, 2),
        grid_gemm(172, 34, 7, 2),
        nccl(18, 22, 8, 0), nccl(170, 30, 10, 1), copy,
    ]  # fmt: skip
    cpu = [step(1, -50, 400)] + [launch(-40 + corr, corr, dur=0.5) for corr in range(1, 11)]
    cpu.append(x("## fsobs:comm:embedding:2 ##", "user_annotation", -32, 2))  # around corr 9
    run = load_docs(tmp_path, [trace(cpu + gpu, rank=0, world_size=1)])
    events = run[0].events
    assert events.loc[events["name"] == "Memcpy DtoD (Device -> Device)", "kind"].tolist() == [
        "comm"
    ]
    colls = run[0].collectives
    assert colls.loc[colls["source"] == "launch_context", "coll"].tolist() == ["transfer"]
    table = checked_table(run)
    assert table.loc[(0, 1), "contention_ms"] == pytest.approx(0.009, abs=1e-9)


def test_gloo_collectives_are_paired_with_their_enqueues_first_in_first_out(tmp_path):
    """One gloo group, two worker threads. Three all_reduces are enqueued at 10, 11, 12 and a
    dense marker names them; the third waits in the queue until a worker is free at 30. The
    first collective of the trace (at 2) was enqueued before the trace began: no pair.

    ::

        t (µs)    2  6 10 11 12   20       30       40   50
        main         |c |c |c |                                    enqueues at 10, 11, 12
        worker a  |xx|  |==========|        |=========|            [2, 6) unpaired, [10, 20)
        worker b           |===================|                  [11, 30)... then [30, 40)

    FIFO: [10, 20) <- 10, [11, 30) <- 11, [30, 40) <- 12 (its queue delay [12, 30) is part of
    the collective: in flight from 12).
    """
    events = [
        gloo("all_reduce", 2, 4),
        *(x("## fsobs:comm:dense:0 ##", "user_annotation", t, 1) for t in (10, 11, 12)),
        *(cpu_op("c10d::allreduce_", t, 1) for t in (10, 11, 12)),
        gloo("all_reduce", 10, 10),
        gloo("all_reduce", 11, 19, tid=GLOO_PG1_TID),
        gloo("all_reduce", 30, 10),
    ]
    run = load_docs(tmp_path, [cpu_doc(0, events, world_size=1)])
    colls = (
        run[0]
        .collectives.merge(run[0].events[["ts_ns"]], left_on="row", right_index=True)
        .sort_values("ts_ns")
    )
    base = run[0].base_time_ns
    asked = [(e - base) / 1000 if e >= 0 else None for e in colls["enqueue_ns"]]
    assert asked == [None, 10, 11, 12]
    assert colls["role"].tolist()[1:] == ["dense"] * 3
    table = checked_table(run)
    # in flight [2, 6) and [10, 40): 34 µs; rank 0 alone: nothing to wait for, all exposed
    expect_row(table, 0, 1, window=100, busy=66, exposed_comm=34)


def test_a_gloo_collective_belongs_to_the_step_that_asked_for_it(tmp_path):
    """Both ranks enqueue an all_reduce late in step 1 (at 40) and one in step 2 (at 70). Rank
    0's worker starts the first only after step 1 ended; rank 1's before. Keyed by the step of
    the worker's start, rank 0 would have two all_reduces in step 2 and pair its first [55, 60)
    with rank 1's second [72, 80), which began after it ended. Keyed by the step of the
    enqueue, each pairs with its twin.

    ::

        t (µs)    0       40 42    50 55 60   70 72 75 80     100
        step      |1                |2                           |
        main              |c|                  |c|              enqueues at 40 and 70
        r0 gloo                        |xxxx|      |xxxx|        [55, 60), [75, 80)
        r1 gloo              |xxxxxxxxxxxx|     |xxxxxx|         [42, 60), [72, 80)
    """
    steps = ((1, 0, 50), (2, 50, 50))
    docs = [
        cpu_doc(
            rank,
            [
                cpu_op("c10d::allreduce_", 40, 1),
                cpu_op("c10d::allreduce_", 70, 1),
                gloo("all_reduce", first, 60 - first),
                gloo("all_reduce", second, 80 - second),
            ],
            steps=steps,
        )
        for rank, first, second in ((0, 55, 75), (1, 42, 72))
    ]
    run = load_docs(tmp_path, docs)
    colls = analyze(run).collectives
    assert colls.problems.empty
    inst = colls.instances.sort_values(["instance", "rank"])
    base = run[0].base_time_ns
    got = [
        (int(i), int(r), int(s), (a - base) / 1000, (e - base) / 1000)
        for i, r, s, a, e in inst[["instance", "rank", "step", "start_ns", "end_ns"]].values
    ]
    assert got == [
        (0, 0, 1, 40, 60),
        (0, 1, 1, 40, 60),
        (1, 0, 2, 70, 80),
        (1, 1, 2, 70, 80),
    ]
