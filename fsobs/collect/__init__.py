"""Collect a run (DESIGN §3): per-rank traces, step sidecars and ``run.json``, all atomic.

Profiling needs torch (``pip install freescale[train]``), imported when a :class:`StepProfiler`
starts: the configs and writers import without it, so a launcher can build a job's config before
any rank runs. ``fsobs``, ``fsobs.trace`` and ``fsobs.analysis`` never import this package. Pieces:

- :class:`StepProfiler` / :class:`ProfilerConfig`: ``rank<R>.trace.json.gz`` (``profiler``);
- :class:`SidecarWriter`: ``steps.rank<R>.jsonl`` (``sidecar``);
- :func:`build_run_meta`, :func:`write_run_json`, :func:`mark_incomplete`,
  :func:`finalize_incomplete`: ``run.json`` and interrupted runs (``runmeta``).
"""

from fsobs.collect.profiler import ProfilerConfig, StepProfiler, trace_file_name
from fsobs.collect.runmeta import (
    build_run_meta,
    finalize_incomplete,
    mark_incomplete,
    read_run_json,
    write_run_json,
)
from fsobs.collect.sidecar import SidecarWriter, sidecar_file_name

__all__ = [
    "ProfilerConfig",
    "SidecarWriter",
    "StepProfiler",
    "build_run_meta",
    "finalize_incomplete",
    "mark_incomplete",
    "read_run_json",
    "sidecar_file_name",
    "trace_file_name",
    "write_run_json",
]
