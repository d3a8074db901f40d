"""Straggler verdicts from evidence (issue 24, point 4), on hand-built traces with the expected
values derived by hand (legend of tests/unit/analysis/test_bubbles.py: ``~`` straggler wait, ``x``
exposed,
``=`` compute, ``h`` a CPU op of the late rank).

A "stable" straggler needs several steps; with one step (or none: a trace analyzed as one
window) the collectives say who kept the others waiting, every rank with at least 20% of the
wait is named with its share, and a host-bound straggler is told from the trace itself.
"""

from __future__ import annotations

import math

import pytest

from fsobs.analysis import analyze
from fsobs.analysis.stragglers.identify import StragglerConfig
from fsobs.report import findings, to_json
from tests.support.bubble_rows import load_docs
from tests.support.kineto import allreduce, cpu_doc, gemm, gloo, launch, step, trace, x

# ------------------------------------------------------- culprits from the collectives (CPU)

ARRIVALS = {  # µs: (start on rank 0, rank 1, rank 2); every rank ends the collective together
    "ar1": ((1000, 2000, 5000), 6000),
    "ar2": ((10000, 7000, 8000), 11000),
    "ar3": ((12000, 15000, 12500), 16000),
}
"""Three all_reduces in one step of 3 gloo ranks::

    t (ms)   1    2    5 6  7  8    10 11 12 12.5  15 16
    rank 0   |~~~~~~~~~|x|            |x| |~~~~~~~~~|x|     ar1 waits 4, ar3 waits 3
    rank 1        |~~~~|x|  |~~~~~~~~~|x|           |x|     ar1 waits 3, ar2 waits 3
    rank 2              |x|    |~~~~~~|x|   |~~~~~~|x|     ar2 waits 2, ar3 waits 2.5

ar1: rank 2 last, caused 4 + 3 = 7 ms; ar2: rank 0 last, 3 + 2 = 5 ms; ar3: rank 1 last,
3 + 2.5 = 5.5 ms. Total 17.5 ms: rank 2 7/17.5 = 40%, rank 1 5.5/17.5 = 31.4%, rank 0
5/17.5 = 28.6%, every one >= 20%. Rank 2 caused the most in the step, so it is the step's
straggler; with one step no verdict across steps can be given.
"""


def _gloo_docs(steps: tuple[tuple[int, float, float], ...], repeat: int = 1) -> list[dict]:
    """The three all_reduces of :data:`ARRIVALS`, in each of ``repeat`` consecutive 20 ms
    blocks (one per step when there are steps)."""
    docs = []
    for rank in range(3):
        events = [
            gloo("all_reduce", block * 20000 + starts[rank], end - starts[rank])
            for block in range(repeat)
            for starts, end in ARRIVALS.values()
        ]
        docs.append(cpu_doc(rank, events, world_size=3, steps=steps))
    return docs


def test_one_step_names_every_rank_with_a_fifth_of_the_wait(tmp_path):
    result = analyze(load_docs(tmp_path, _gloo_docs(((1, 0, 20000),))))
    strag = result.stragglers
    assert strag.per_step["rank"].tolist() == [2]
    assert strag.verdict == "few_steps" and strag.culprit is None
    per_rank = strag.per_rank.set_index("rank")
    assert per_rank["wait_caused_ms"].tolist() == pytest.approx([5.0, 5.5, 7.0])
    assert per_rank["wait_share"].tolist() == pytest.approx([5 / 17.5, 5.5 / 17.5, 7 / 17.5])
    assert strag.culprits == [2, 1, 0]
    assert per_rank["times_arrived_last"].tolist() == [1, 1, 1]
    assert strag.num_waits == 3
    assert all(math.isnan(v) for v in strag.lateness_shares.values())  # CPU: no GPU to starve
    lines = findings(result)
    assert (
        "1 step(s) with a straggler: too few to call one stable or rotating (that needs 3), so "
        "judged from the 3 collective(s) at which a rank waited"
    ) in lines
    assert (
        "ranks with at least 20% of the straggler wait: rank 2 caused 40% (last at 1 of the 3 "
        "collectives with a wait), rank 1 caused 31% (last at 1 of 3), rank 0 caused 29% (last "
        "at 1 of 3)"
    ) in lines
    assert not any("(stable)" in line for line in lines)
    out = to_json(result)["stragglers"]
    assert out["verdict"] == "few_steps" and out["culprits"] == [2, 1, 0]


def test_a_trace_without_steps_is_judged_from_its_collectives(tmp_path):
    """No ProfilerStep: one window per rank (step 0), judged like a single step."""
    result = analyze(load_docs(tmp_path, _gloo_docs(())))
    strag = result.stragglers
    assert strag.per_step["step"].tolist() == [0]
    assert strag.verdict == "few_steps" and strag.culprits == [2, 1, 0]


@pytest.mark.parametrize(
    ("num_steps", "verdict", "culprit"), [(2, "few_steps", None), (3, "stable", 2)]
)
def test_a_verdict_across_steps_needs_three_steps(tmp_path, num_steps, verdict, culprit):
    """The same three all_reduces in every step: rank 2 is each step's straggler (7 of the
    17.5 ms). Two such steps are too few for a verdict across steps; with three, rank 2 is
    the straggler of 3 of 3 (at least the stable share, 75%)."""
    steps = tuple((n + 1, n * 20000.0, 20000.0) for n in range(num_steps))
    strag = analyze(load_docs(tmp_path, _gloo_docs(steps, repeat=num_steps))).stragglers
    assert strag.per_step["rank"].tolist() == [2] * num_steps
    assert (strag.verdict, strag.culprit) == (verdict, culprit)
    assert strag.culprits == [2, 1, 0]


def test_the_stable_verdict_names_its_share_and_the_other_culprits(tmp_path):
    steps = tuple((n + 1, n * 20000.0, 20000.0) for n in range(3))
    result = analyze(load_docs(tmp_path, _gloo_docs(steps, repeat=3)))
    lines = findings(result)
    assert (
        "rank 2 is the straggler in 3 of 3 steps (stable); it made the others wait 21.0 ms in "
        "total (40% of the wait)"
    ) in lines
    assert (
        "other ranks with at least 20% of the straggler wait: rank 1 caused 31% (last at 3 of "
        "the 9 collectives with a wait), rank 0 caused 29% (last at 3 of 9)"
    ) in lines


# ------------------------------------------------------------ host-bound, from the trace (GPU)


def _gpu_rank(rank: int, late: bool) -> dict:
    """Two GPU ranks, one step [0, 10) ms, one all_reduce (Seq 1) ending at 8 ms::

        t (ms)     1    2    3              6   7    8
        rank 0 GPU |=========|~~~~~~~~~~~~~~~~~~|xxxx|      arrives at 3, waits until 7
        rank 1 GPU |====|                       |xxxx|      arrives at 7 (the straggler)
        rank 1 CPU      |hhhhhhhhhhhhhhhhhhhh|    l         aten::index [2, 6), launch 6.99

    Rank 1's GPU is idle from 2 ms to its arrival at 7 (the gap, 5 ms); rank 0 waits the 4 ms
    [3, 7), all inside the gap, so nothing of it is GPU work. Rank 1's CPU thread is busy in
    the gap for [3, 6) of the window (3 ms) and in the collective's launch [6.99, 6.995)
    (0.005 ms): host-bound 3.005 of 4 ms, idle 0.995 ms. With ``late=False`` rank 1
    computes until 7 instead: all 4 ms are GPU work.
    """
    compute_end = 2000 if late else 7000
    arrival = 3000 if rank == 0 else 7000
    events = [
        step(1, 0, 10000),
        launch(500, 1, dur=2),
        gemm(1000, (3000 if rank == 0 else compute_end) - 1000, corr=1),
        launch(arrival - 10, 2, dur=5),
        allreduce(arrival, 8000 - arrival, 1, corr=2),
    ]
    if rank == 1 and late:
        events.append(x("aten::index", "cpu_op", 2000, 4000))
    return trace(events, rank=rank, world_size=2)


def test_a_host_bound_straggler_is_told_from_the_trace(tmp_path):
    result = analyze(load_docs(tmp_path, [_gpu_rank(0, True), _gpu_rank(1, True)]))
    strag = result.stragglers
    assert strag.culprits == [1] and strag.verdict == "few_steps"
    late = result.collectives.lateness.iloc[0]
    assert (late["last_rank"], late["wait_ns"]) == (1, 4_000_000)
    assert late[["gpu_active_ns", "host_bound_ns", "idle_ns"]].tolist() == [0, 3_005_000, 995_000]
    assert strag.lateness_shares == pytest.approx(
        {"gpu_active": 0.0, "host_bound": 3.005 / 4, "idle": 0.995 / 4}
    )
    assert strag.per_rank.set_index("rank").loc[1, "host_bound_share"] == pytest.approx(3.005 / 4)
    assert strag.host_bound == [1]
    lines = findings(result)
    assert (
        "rank 1 is a host-bound straggler: for 75% of the wait it caused its GPU was idle while "
        "its CPU thread was busy"
    ) in lines
    assert (
        "from the trace, while the others waited the late rank's GPU worked 0% of the time (more "
        "or slower GPU work), idled while its CPU thread was busy 75% (host-bound), idled with "
        "nothing recorded on its CPU 25%"
    ) in lines


def test_a_gpu_bound_straggler_is_not_host_bound(tmp_path):
    result = analyze(load_docs(tmp_path, [_gpu_rank(0, False), _gpu_rank(1, False)]))
    strag = result.stragglers
    assert strag.lateness_shares == {"gpu_active": 1.0, "host_bound": 0.0, "idle": 0.0}
    assert strag.culprits == [1] and strag.host_bound == []


def test_without_a_sidecar_one_line_says_what_cannot_be_checked(tmp_path):
    """No contradictory cause lines: no sidecar is said once, and nothing claims the sidecars
    lack fields (there are none) or that the cause is unknown beside the trace's evidence."""
    lines = findings(analyze(load_docs(tmp_path, [_gpu_rank(0, True), _gpu_rank(1, True)])))
    sidecar_lines = [line for line in lines if "sidecar" in line]
    assert sidecar_lines == [
        "no step sidecar (steps.rank<R>.jsonl): the late ranks' input data, GC pauses and CPU "
        "time cannot be checked"
    ]
    assert not any("unknown" in line for line in lines)


@pytest.mark.parametrize(
    ("field", "value"), [("culprit_share", 1.5), ("min_steps", 0), ("host_bound_share", -0.1)]
)
def test_bad_thresholds_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        StragglerConfig(**{field: value})
