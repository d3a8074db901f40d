"""Collect a run with torch: the per-rank trace (:mod:`.profiler`) and the per-step pauses
(:mod:`.pauses`). The files themselves, the step sidecars and ``run.json``, are the run format
(:mod:`fsobs.runformat`, no torch).

Needs torch (``pip install freescale[train]``); ``fsobs``, ``fsobs.trace`` and ``fsobs.analysis``
never import this package.
"""

from fsobs.collect.profiler import ProfilerConfig, StepProfiler

__all__ = ["ProfilerConfig", "StepProfiler"]
