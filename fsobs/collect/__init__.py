"""Collect a run with torch: the per-rank trace (:mod:`.profiler`), the per-step pauses
(:mod:`.pauses`) and, over both, the recorder a training loop embeds (:mod:`.recorder`:
:class:`RunRecorder` writes the trace, the step sidecar and ``run.json``; :func:`table_ids` and
``RunRecorder.global_ids`` give it the global batch's IDs per table, :mod:`.batch_ids`). The
files themselves are the run format (:mod:`fsobs.runformat`, no torch).

Profiling needs torch (``pip install freescale[train]``), imported when a :class:`StepProfiler`
starts or :class:`RunRecorder` is first used: :class:`ProfilerConfig` imports without it, so a
launcher can build a job's config before any rank runs. ``fsobs``, ``fsobs.trace`` and
``fsobs.analysis`` never import this package.
"""

from typing import TYPE_CHECKING

from fsobs.collect.profiler import ProfilerConfig, StepProfiler
from optim.lazy import lazy_attributes

if TYPE_CHECKING:
    from fsobs.collect.batch_ids import table_ids
    from fsobs.collect.recorder import RunRecorder, StepState

__all__ = ["ProfilerConfig", "RunRecorder", "StepProfiler", "StepState", "table_ids"]

__getattr__, __dir__ = lazy_attributes(
    __name__, {"RunRecorder": ".recorder", "StepState": ".recorder", "table_ids": ".batch_ids"}
)
