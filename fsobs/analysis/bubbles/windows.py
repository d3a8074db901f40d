"""The step windows of one rank, and the GPU work they leave out.

A GPU rank's windows are timed by the GPU (:func:`gpu_windows`): they tile its timeline from the
first GPU event of the first step to the last event of the last one. When no step launched any
GPU work (a ``--step-marker`` range that runs only CPU code, or a trace whose launches were not
recorded), there is no GPU window to draw, and the steps' CPU ranges are the windows instead
(:func:`cpu_windows`): the GPU is still the resource, looked at during those ranges.

GPU work is counted by time, whoever launched it. A kernel whose launch is not in the trace
(queued before the profiler started) or ran outside every step belongs to no step, but where it
runs inside a window it is that window's work; only the work outside every window is left out,
and :func:`gpu_coverage` counts both::

    CPU steps     |--step 1--|--step 2--|
    GPU           |uu|  |11| |uu| |22|2|   |uu|      u: launched by no recorded step
    windows             [----1----)[-2--)
    unlaunched               |uu|                    in window 1: counted there
    outside       |uu|                      |uu|     before the first, after the last: left out
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.trace.categorical import is_in

Windows = dict[int, tuple[int, int]]
"""step -> [start, end) in ns."""


@dataclass(frozen=True)
class GpuCoverage:
    """The GPU work no recorded step launched, around one window of a GPU rank."""

    unlaunched_events: int = 0
    """GPU events that start inside the window and that no recorded step launched (their
    launch is not in the trace, or was outside every step): counted in the window."""
    unlaunched_ns: int = 0
    """Their time in the window (a union: overlapping events count once)."""
    outside_events: int = 0
    """GPU events that start outside every window, in the gap after this one (on the first
    window, also before it): left out of the analysis."""
    outside_ns: int = 0
    """The GPU time in that gap (a union of the GPU work there)."""


def gpu_windows(step: np.ndarray, start: np.ndarray, end: np.ndarray) -> Windows:
    """GPU window of every step (``step``, ``start``, ``end``: those of the rank's GPU events):
    from its first GPU event to the next step's first one.

    Consecutive windows tile the GPU timeline, so a gap between steps (data loading, a late
    launch) counts once, as host_idle of the step before it, and work of two steps that overlap
    (pipelining) is never counted twice. The last recorded step ends with its own last event.
    A step that launched no GPU work has no GPU window::

        step 1 work |====|  |===|         step 2 work  |===| |====|
        window 1    [-----------------)   window 2     [----------]
    """
    mine = step >= 0
    steps, which = np.unique(step[mine], return_inverse=True)
    first = np.full(len(steps), np.iinfo(np.int64).max)
    np.minimum.at(first, which, start[mine])
    last = np.full(len(steps), np.iinfo(np.int64).min)
    np.maximum.at(last, which, end[mine])
    order = np.argsort(first, kind="quicksort")  # as pandas' sort_values
    starts = first[order].tolist()
    ends = [*starts[1:], int(last[order[-1]])] if len(order) else []
    return {
        int(s): (lo, max(hi, lo))
        for s, lo, hi in zip(steps[order].tolist(), starts, ends, strict=True)
    }


def cpu_windows(events: pd.DataFrame, marks: np.ndarray) -> Windows:
    """The CPU range of every step (``events``: the rank's; ``marks``: the rows of its step
    ranges), else, for a trace without steps, the span of all its CPU events, as step 0."""
    ts, dur = events["ts_ns"].to_numpy(), events["dur_ns"].to_numpy()
    if len(marks):
        step = events["step"].to_numpy()[marks].tolist()
        return {
            s: (lo, lo + d)
            for s, lo, d in zip(step, ts[marks].tolist(), dur[marks].tolist(), strict=True)
        }
    cpu = is_in(events["device"], ("cpu",))
    if not cpu.any():
        return {}
    start = ts[cpu]
    return {0: (int(start.min()), int((start + dur[cpu]).max()))}


def gpu_coverage(
    windows: Windows, step: np.ndarray, start: np.ndarray, end: np.ndarray
) -> dict[int, GpuCoverage]:
    """:class:`GpuCoverage` of every window (``step``, ``start``, ``end``: the rank's GPU
    events; ``step`` -1 where no recorded step launched the event)."""
    if not windows:
        return {}
    order = sorted(windows, key=windows.__getitem__)
    lo = np.array([windows[s][0] for s in order], np.int64)
    hi = np.array([windows[s][1] for s in order], np.int64)
    covered = iv.union(lo, hi)
    inside = iv.covered(covered, start)
    owner = np.maximum(np.searchsorted(lo, start, "right") - 1, 0)  # its window, or the gap's
    unlaunched = inside & (step < 0)
    outside_set = iv.subtract(iv.union(start, end), covered)
    gap_owner = np.maximum(np.searchsorted(lo, outside_set[0], "right") - 1, 0)
    unlaunched_set = iv.union(start[unlaunched], end[unlaunched])
    count = len(order)
    return {
        s: GpuCoverage(
            unlaunched_events=int(n_in),
            unlaunched_ns=int(iv.length(in_window)),
            outside_events=int(n_out),
            outside_ns=int(ns_out),
        )
        for s, n_in, in_window, n_out, ns_out in zip(
            order,
            np.bincount(owner[unlaunched], minlength=count),
            iv.clip_each(unlaunched_set, lo, hi),
            np.bincount(owner[~inside], minlength=count),
            np.bincount(gap_owner, outside_set[1] - outside_set[0], minlength=count),
            strict=True,
        )
    }
