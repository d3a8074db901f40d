"""Why the straggler was late (fsobs.analysis.stragglers.causes), on a hand-built 2-rank gloo run
whose sidecars say the data cost, the GC pauses and the CPU time of each rank."""

from __future__ import annotations

import json

import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.report import findings, to_json
from tests.support.kineto import cpu_doc, cpu_op, gloo, write

MS = 1000  # the trace's µs per ms


def _run(tmp_path, pauses: bool, cost: bool = True):
    """``cost`` false: ``est_cost`` null (recorded without a cost model)::

    t (ms)    0          40    60 70         100
    rank 0    |====mm====|~~~~~|xx|           |    busy 70, waits 20 for rank 1
    rank 1    |=======mm=======|xx|           |    busy 90
    """
    docs = [
        cpu_doc(0, [cpu_op("aten::mm", 0, 40 * MS), gloo("all_reduce", 40 * MS, 30 * MS)],
                steps=((1, 0, 100 * MS),)),
        cpu_doc(1, [cpu_op("aten::mm", 0, 60 * MS), gloo("all_reduce", 60 * MS, 10 * MS)],
                steps=((1, 0, 100 * MS),)),
    ]  # fmt: skip
    side = {0: (100.0, 0.0, 70.0), 1: (110.0, 2.0, 86.0)}  # est_cost, gc_ms, cpu_ms
    for doc in docs:
        rank = doc["distributedInfo"]["rank"]
        write(tmp_path / f"rank{rank}.json", doc)
        est_cost, gc_ms, cpu_ms = side[rank]
        est_cost = est_cost if cost else None
        record = {"step": 1, "num_samples": 1, "seq_lengths": [5], "est_cost": est_cost,
                  "wall_start_ns": 0, "wall_end_ns": 100_000_000}  # fmt: skip
        if pauses:
            record |= {"gc_count": int(gc_ms > 0), "gc_ms": gc_ms, "gc_max_gen": 0,
                       "cpu_ms": cpu_ms, "nivcsw": 3}  # fmt: skip
        (tmp_path / f"steps.rank{rank}.jsonl").write_text(json.dumps(record) + "\n")
    return analyze(fsobs.load_run(tmp_path))


def test_lateness_split_into_data_gc_preemption_and_the_rest(tmp_path):
    """Lateness: busy 90 against the median of 70 and 90: 10 ms.

    data: ms per cost = (70 + 90) / (100 + 110); (110 - 105) x 160/210 = 3.8095 ms;
    gc: 2 - median(0, 2) = 1 ms;
    preemption: off = wall - cpu - blocked: rank 0 100 - 70 - 30 = 0, rank 1 100 - 86 - 10 = 4;
    4 - 2 = 2 ms; unexplained: 10 - 3.8095 - 1 - 2 = 3.1905 ms.
    All 20 ms of wait are in that step, so the shares are the parts over 10 ms.
    """
    result = _run(tmp_path, pauses=True)
    row = result.causes.per_step.iloc[0]
    assert (row["step"], row["rank"]) == (1, 1)
    assert row["wait_ms"] == pytest.approx(20.0)
    assert row["late_ms"] == pytest.approx(10.0)
    data = 5 * 160 / 210
    assert row["data"] == pytest.approx(data)
    assert row["gc"] == pytest.approx(1.0)
    assert row["preemption"] == pytest.approx(2.0)
    assert row["unexplained"] == pytest.approx(10 - data - 3)
    shares = result.causes.shares
    assert shares == pytest.approx(
        {"data": data / 10, "gc": 0.1, "preemption": 0.2, "unexplained": (7 - data) / 10}
    )
    out = to_json(result)["stragglers"]["causes"]
    assert out["known"] and out["shares"]["gc"] == pytest.approx(0.1)
    assert any(line.startswith("the straggler wait by the cause") and "gc 10%" in line
               for line in findings(result))  # fmt: skip


GC_LINE = (
    "the step sidecars have no GC, CPU-time and context-switch fields (runs recorded with the "
    "profiler have them)"
)
COST_LINE = (
    "no cost model: est_cost is null in the sidecars (RunRecorder(cost_model=...) or fsobs "
    "fit-cost)"
)


def _unknown(result) -> list[str]:
    return [line for line in findings(result) if "were late is unknown" in line]


def test_without_the_pause_fields_the_causes_are_unknown(tmp_path):
    result = _run(tmp_path, pauses=False)
    assert result.causes is None
    assert to_json(result)["stragglers"]["causes"] == {
        "known": False, "shares": None, "per_step": [], "missing": ["gc_ms", "cpu_ms"],
    }  # fmt: skip
    assert _unknown(result) == [f"why the stragglers were late is unknown: {GC_LINE}"]


def test_without_a_cost_model_the_report_says_so_not_that_the_pauses_are_missing(tmp_path):
    # the pause fields are there; only est_cost is null
    result = _run(tmp_path, pauses=True, cost=False)
    assert result.causes is None
    assert to_json(result)["stragglers"]["causes"]["missing"] == ["est_cost"]
    assert _unknown(result) == [f"why the stragglers were late is unknown: {COST_LINE}"]
    assert not any("no GC" in line for line in findings(result))


def test_without_a_cost_model_and_the_pauses_both_are_named(tmp_path):
    result = _run(tmp_path, pauses=False, cost=False)
    assert to_json(result)["stragglers"]["causes"]["missing"] == ["est_cost", "gc_ms", "cpu_ms"]
    assert _unknown(result) == [f"why the stragglers were late is unknown: {COST_LINE}; {GC_LINE}"]


def test_parts_larger_than_the_lateness_are_scaled_down_to_it():
    from fsobs.analysis.stragglers.causes import _split

    assert _split(4.0, {"data": 6.0, "gc": 2.0, "preemption": -1.0}) == pytest.approx(
        {"data": 3.0, "gc": 1.0, "preemption": 0.0, "unexplained": 0.0}
    )
    assert _split(-2.0, {"data": 1.0, "gc": 1.0, "preemption": 1.0}) == {
        "data": 0.0, "gc": 0.0, "preemption": 0.0, "unexplained": 0.0,
    }  # fmt: skip
