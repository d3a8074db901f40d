"""Collect a run with torch: the per-rank trace (:mod:`.profiler`) and the per-step pauses
(:mod:`.pauses`). The files themselves, the step sidecars and ``run.json``, are the run format
(:mod:`fsobs.runformat`, no torch).

Profiling needs torch (``pip install freescale[train]``), imported when a :class:`StepProfiler`
starts: :class:`ProfilerConfig` imports without it, so a launcher can build a job's config before
any rank runs. ``fsobs``, ``fsobs.trace`` and ``fsobs.analysis`` never import this package.
"""

from fsobs.collect.profiler import ProfilerConfig, StepProfiler

__all__ = ["ProfilerConfig", "StepProfiler"]
