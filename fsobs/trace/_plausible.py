"""Times no profile has: events far outside the span of the rest of their trace.

A Kineto trace covers seconds to hours. An event that starts or ends more than
:data:`MAX_GAP_NS` (a day) away from the times of the rest of its trace holds a wrong value
(a clock read as 0, a corrupted duration), not a fact: counted, a ProfilerStep of 31 years
would turn every bubble of the run into busy time. Such events are left out, and a warning
says which::

    time     |=== the trace: events within hours of each other ===|  ... 31 years ...  |
    points    s s e s s e e s e s ...                          e                    e
    clusters [---------------- the span: most of the points --------]              [ ]

1. Sort the starts and ends of all events together.
2. Cut the sorted times wherever two consecutive ones are more than a day apart: clusters.
3. The trace's span is the cluster holding the most of them (the earliest of equals).
4. Every event whose start or end lies outside it is far outside.
"""

from __future__ import annotations

import numpy as np

MAX_GAP_NS = 24 * 3600 * 10**9
"""A gap between the times of one trace longer than this splits it: a day."""
_UNITS = (("years", 365.25 * 86400e9), ("days", 86400e9), ("hours", 3600e9), ("s", 1e9))


def far_outside(start_ns: np.ndarray, dur_ns: np.ndarray) -> np.ndarray:
    """Mask of the events (start and duration in ns) far outside the trace's span (module
    docstring)."""
    num = len(start_ns)
    start = start_ns.astype(np.float64)
    end = start + dur_ns.astype(np.float64)
    if num == 0 or end.max() - start.min() <= MAX_GAP_NS:
        return np.zeros(num, dtype=bool)
    points = np.concatenate([start, end])
    order = np.argsort(points, kind="stable")
    cluster = np.empty(2 * num, dtype=np.int64)
    cluster[order] = np.concatenate([[0], np.cumsum(np.diff(points[order]) > MAX_GAP_NS)])
    inside = cluster == np.bincount(cluster).argmax()
    outside: np.ndarray = ~(inside[:num] & inside[num:])
    return outside


def describe_outside(start_ns: np.ndarray, dur_ns: np.ndarray, outside: np.ndarray) -> str:
    """How the first event of ``outside`` lies outside: ``lasts 31.0 years``, ``starts 2.0
    days after the others end``."""
    first = int(np.flatnonzero(outside)[0])
    kept = ~outside
    start, dur = float(start_ns[first]), float(dur_ns[first])
    if not kept.any():
        return f"lasts {_human(dur)}"
    low = float(start_ns[kept].min())
    high = float((start_ns[kept].astype(np.float64) + dur_ns[kept]).max())
    if start > high + MAX_GAP_NS:
        return f"starts {_human(start - high)} after the others end"
    if start < low - MAX_GAP_NS:
        return f"starts {_human(low - start)} before the others begin"
    return f"lasts {_human(dur)}"


def _human(ns: float) -> str:
    for unit, scale in _UNITS:
        if ns >= scale:
            return f"{ns / scale:.1f} {unit}"
    return f"{ns / 1e9:.3f} s"
