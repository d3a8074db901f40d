"""The names of a run directory's files (docs/design.md §3), written once.

::

    <run>/
      run.json                  the run's metadata (:mod:`fsobs.runformat.runmeta`)
      job.json                  the reference job's config, read by its ranks
                                (:mod:`fsobs.workload.config`; other loops may have none)
      rank<R>.trace.json.gz     one Kineto trace per rank (the loader reads any *.json(.gz) that
                                is no file named here and is named or looks like a trace:
                                fsobs.trace._sniff)
      steps.rank<R>.jsonl       one line per step and rank (:mod:`fsobs.runformat.steps`)
      cost_model.json           ``fsobs fit-cost``'s coefficients (optional)
      truth.json                a simulated run's true classes (``fsobs simulate``)
      capture.json              a capture request (:mod:`fsobs.runformat.windows`)
      windows/w<step>/          one profiling window of a live run (:mod:`fsobs.runformat.windows`):
        rank<R>.trace.json.gz, window.rank<R>.json, then the indexer's run.json,
        steps.rank<R>.jsonl and summary.json
"""

from __future__ import annotations

import re

FORMAT_VERSION = 1
"""The ``format_version`` of ``run.json``."""
RUN_JSON = "run.json"
JOB_JSON = "job.json"
COST_MODEL = "cost_model.json"
TRUTH = "truth.json"
CAPTURE_JSON = "capture.json"
WINDOWS_DIR = "windows"
SCHEDULE_JSON = "schedule.json"
"""The job's profiling schedule, in ``windows/``."""
SUMMARY_JSON = "summary.json"
"""The indexer's summary of a window, in the window's folder."""
WINDOW_RE = re.compile(r"^w(\d{8,})$")
NOTE_RE = re.compile(r"^window\.rank(\d+)\.json$")
NOT_TRACES = frozenset(
    {RUN_JSON, JOB_JSON, COST_MODEL, TRUTH, CAPTURE_JSON, SUMMARY_JSON, SCHEDULE_JSON}
)
"""JSON files of a run directory that are not traces."""
PARTIAL_SUFFIX = ".partial"
"""A step sidecar still being written (or left by a rank that died) carries this suffix."""
TRACE_RE = re.compile(r"^rank(\d+)\.trace\.json\.gz$")
NAMED_TRACE_RE = re.compile(r"^(?:rank\d+\.trace|.+\.pt\.trace)\.json(?:\.gz)?$")
"""Names that are traces whatever the file holds: ours (gzipped or not) and torch's
``tensorboard_trace_handler`` ones (``<worker>.<time>.pt.trace.json[.gz]``)."""
SIDECAR_RE = re.compile(r"^steps\.rank(\d+)\.jsonl$")
PARTIAL_RE = re.compile(r"^steps\.rank(\d+)\.jsonl" + re.escape(PARTIAL_SUFFIX) + "$")


def trace_file_name(rank: int, *, gzip: bool = True) -> str:
    """The trace of ``rank``: ``rank<R>.trace.json.gz`` (``rank<R>.trace.json`` not gzipped)."""
    return f"rank{rank}.trace.json" + (".gz" if gzip else "")


def note_file_name(rank: int) -> str:
    """Rank ``rank``'s note of a window: ``window.rank<R>.json``."""
    return f"window.rank{rank}.json"


def sidecar_file_name(rank: int) -> str:
    """The step sidecar of ``rank``: ``steps.rank<R>.jsonl``."""
    return f"steps.rank{rank}.jsonl"


def is_trace_name(name: str) -> bool:
    """Whether a file of a run directory may be a Kineto trace: a ``*.json`` / ``*.json.gz``
    that is none of the run's other files (the loader then reads those named as traces and
    those whose opening looks like one, :mod:`fsobs.trace._sniff`)."""
    return (
        name.endswith((".json", ".json.gz"))
        and name not in NOT_TRACES
        and NOTE_RE.match(name) is None
    )


def is_run_file(name: str) -> bool:
    """Whether a file of a run directory is one a reader of the run takes: a trace
    (:func:`is_trace_name`), ``run.json`` or a step sidecar (what an upload may hold, and the
    links a loader names as left out)."""
    return is_trace_name(name) or name == RUN_JSON or SIDECAR_RE.match(name) is not None


def is_named_trace(name: str) -> bool:
    """Whether a file's name makes it a trace, whatever it holds (:data:`NAMED_TRACE_RE`)."""
    return NAMED_TRACE_RE.match(name) is not None
