"""What the step windows of a run cover, rank by rank: their clock, and the GPU work they count
without a launch or leave out (:mod:`.windows`).

:func:`window_row` gives one rank's row of :attr:`fsobs.analysis.Analysis.windows`:

==================  =======  ==============================================================
column              dtype    meaning
==================  =======  ==============================================================
rank                int      the rank
clock               str      what times its windows: ``gpu`` (the GPU work each step
                             launched) or ``cpu`` (each step's CPU range)
windows             int      windows analyzed (steps common to every rank with a window here)
window_ms_mean      float    their mean length, ms (NaN without any)
cpu_step_ms_mean    float    mean length of their steps' CPU ranges, ms (NaN without any)
gpu_work_ms         float    GPU work inside them (any GPU event, a union), ms; 0 on a CPU rank
unlaunched_events   int      GPU events inside them that no recorded step launched (counted)
unlaunched_ms       float    their time, ms
outside_events      int      GPU events outside every window of the rank (left out)
outside_ms          float    the GPU time outside every window, ms
no_window_steps     list     steps of the run (every rank has them) with no window on this
                             rank: they launched no GPU work here, so they are left out
sparse_gpu          bool     a GPU rank whose GPU windows span less than
                             :data:`SPARSE_GPU_SHARE` of their steps' CPU ranges: an almost
                             empty GPU timeline (a trace of CUDA graph capture, GPU activity
                             not recorded), whose bubble numbers describe a few events only
==================  =======  ==============================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fsobs.analysis import intervals as iv
from fsobs.analysis.bubbles.parts import StepParts

SPARSE_GPU_SHARE = 0.01
"""GPU windows spanning under this share of their CPU step time make a GPU timeline "almost
empty". (A GPU that idles through long windows is not: its bubble is real, and large.)"""

WINDOW_COLUMNS = (
    "rank",
    "clock",
    "windows",
    "window_ms_mean",
    "cpu_step_ms_mean",
    "gpu_work_ms",
    "unlaunched_events",
    "unlaunched_ms",
    "outside_events",
    "outside_ms",
    "no_window_steps",
    "sparse_gpu",
)


def window_row(rank: int, device: str, parts: list[StepParts], wanted: list[int]) -> dict[str, Any]:
    """The row of ``rank`` (see the module docstring): ``parts`` are all its steps' parts,
    ``wanted`` the steps the analysis keeps (those of every rank)."""
    kept = [p for p in parts if p.step in set(wanted)]
    window_ns = np.array([p.window[1] - p.window[0] for p in kept], np.int64)
    cpu_ns = np.array([p.cpu_ns for p in kept], np.int64)
    gpu_ns = sum(iv.length(p.everything) for p in kept)
    cpu_total = int(cpu_ns.sum())
    return {
        "rank": rank,
        "clock": parts[0].clock if parts else ("gpu" if device == "gpu" else "cpu"),
        "windows": len(kept),
        "window_ms_mean": window_ns.mean() / 1e6 if len(kept) else float("nan"),
        "cpu_step_ms_mean": cpu_ns.mean() / 1e6 if cpu_total else float("nan"),
        "gpu_work_ms": gpu_ns / 1e6,
        "unlaunched_events": sum(p.coverage.unlaunched_events for p in kept),
        "unlaunched_ms": sum(p.coverage.unlaunched_ns for p in kept) / 1e6,
        "outside_events": sum(p.coverage.outside_events for p in parts),
        "outside_ms": sum(p.coverage.outside_ns for p in parts) / 1e6,
        "no_window_steps": sorted(set(wanted) - {p.step for p in parts}),
        "sparse_gpu": bool(
            device == "gpu" and cpu_total > 0 and window_ns.sum() < SPARSE_GPU_SHARE * cpu_total
        ),
    }
