"""The step monitor: GC pauses, CPU time and involuntary switches of the training thread."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from fsobs.collect.pauses import StepMonitor  # noqa: E402
from fsobs.runformat import StepRecord  # noqa: E402


def test_a_collection_in_the_step_is_counted_and_traced():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with StepMonitor() as monitor:
            monitor.begin()
            gc.collect(1)
            gc.collect(2)
            total = sum(i * i for i in range(200_000))  # some CPU time
            pauses = monitor.end()
    assert total > 0
    assert pauses.gc_count == 2 and pauses.gc_max_gen == 2
    assert pauses.gc_ms > 0 and pauses.cpu_ms > 0 and pauses.nivcsw >= 0
    names = [e.name for e in prof.events()]
    assert names.count("## fsobs:gc gen1 ##") == 1 and names.count("## fsobs:gc gen2 ##") == 1
    assert monitor._on_gc not in gc.callbacks  # removed on exit


def test_a_step_without_collection():
    with StepMonitor(trace_ranges=False) as monitor:
        monitor.begin()
        pauses = monitor.end()
    assert (pauses.gc_count, pauses.gc_ms, pauses.gc_max_gen) == (0, 0.0, -1)


def test_the_sidecar_validates_the_pause_fields():
    base = dict(step=0, lengths=[1], est_cost=1.0, wall_start_ns=0, wall_end_ns=1)
    record = StepRecord.of(**base, gc_count=1, gc_ms=2.5, gc_max_gen=0, cpu_ms=10.0, nivcsw=4)
    record = record.to_json()
    assert (record["gc_count"], record["gc_ms"], record["cpu_ms"], record["nivcsw"]) == (
        1,
        2.5,
        10.0,
        4,
    )
    for bad in ({"gc_count": -1}, {"gc_ms": float("nan")}, {"gc_max_gen": -2}, {"nivcsw": -1}):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=name):
            StepRecord.of(**base, **bad)
