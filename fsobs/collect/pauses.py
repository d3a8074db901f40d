"""Why a rank was slow in a step, measured where it happens: GC pauses, CPU time, preemption.

:class:`StepMonitor` watches the training thread, step by step, and gives the step sidecar
(:mod:`fsobs.runformat.steps`) five numbers per step::

    gc_count, gc_ms, gc_max_gen   Python's garbage collector (``gc.callbacks``): pauses in the
                                  step, their total and the oldest generation collected
    cpu_ms                        CPU time of the training thread (``time.thread_time_ns``)
    nivcsw                        involuntary context switches of the training thread (the OS
                                  took the core away: ``getrusage(RUSAGE_THREAD)``)

With the step's wall time (the sidecar's ``wall_start_ns``/``wall_end_ns``), ``wall - cpu``
is the time the thread was off the CPU: waiting in a collective (the trace says how long) or
preempted. Each GC pause is also a range in the trace, ``## fsobs:gc gen<N> ##``, so the
timeline shows it. A callback costs a few µs per collection; the job runs the monitor on every
step, profiled or not, and writes its fields and ranges only when it profiles
(``benchmarks/bench_profiler_overhead.py`` times the monitor on its own).
"""

from __future__ import annotations

import gc
import resource
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch.autograd.profiler as autograd_profiler

GC_MARKER = "## fsobs:gc gen{gen} ##"


@dataclass
class StepPauses:
    """What :class:`StepMonitor` measured in one step (the sidecar's fields)."""

    gc_count: int
    gc_ms: float
    gc_max_gen: int
    """-1 when no collection ran."""
    cpu_ms: float
    nivcsw: int

    def fields(self) -> dict[str, Any]:
        return {
            "gc_count": self.gc_count,
            "gc_ms": self.gc_ms,
            "gc_max_gen": self.gc_max_gen,
            "cpu_ms": self.cpu_ms,
            "nivcsw": self.nivcsw,
        }


class StepMonitor:
    """Per-step GC pauses, CPU time and involuntary switches of the calling thread.

    Use as a context manager around the training loop; call :meth:`begin` at the start of each
    step and :meth:`end` after it (on the training thread: CPU time and switches are that
    thread's)."""

    def __init__(self, *, trace_ranges: bool = True) -> None:
        self.trace_ranges = trace_ranges
        self._gc_started = 0
        self._range: AbstractContextManager[Any] | None = None
        self._reset()
        self._cpu0 = 0
        self._switches0 = 0

    def __enter__(self) -> StepMonitor:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def begin(self) -> None:
        self._reset()
        self._cpu0 = time.thread_time_ns()
        self._switches0 = _involuntary_switches()

    def end(self) -> StepPauses:
        return StepPauses(
            gc_count=self._count,
            gc_ms=self._gc_ns / 1e6,
            gc_max_gen=self._max_gen,
            cpu_ms=(time.thread_time_ns() - self._cpu0) / 1e6,
            nivcsw=_involuntary_switches() - self._switches0,
        )

    def _reset(self) -> None:
        self._count, self._gc_ns, self._max_gen = 0, 0, -1

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter_ns()
            if self.trace_ranges:
                name = GC_MARKER.format(gen=info.get("generation", -1))
                self._range = autograd_profiler.record_function(name)
                self._range.__enter__()  # type: ignore[no-untyped-call]  # torch: unannotated
            return
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        self._count += 1
        self._gc_ns += time.perf_counter_ns() - self._gc_started
        self._max_gen = max(self._max_gen, info.get("generation", -1))


def _involuntary_switches() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
