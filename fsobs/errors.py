"""Errors raised by fsobs on bad input, and by its commands when they refuse to go on.

Every error is one line that names the file, the rank and the field involved, so that the CLI
can print it as is (and exit with code 2) and the dashboard can show it as a message::

    FsobsError
     +-- TraceReadError       the file cannot be read: missing, not gzip, truncated, too big
     +-- TraceFormatError     the content is not a Kineto trace: not JSON, wrong types, bad values
     +-- RunError             the set of files is not one consistent run
          +-- EmptyRunError          no trace file found
          +-- DuplicateRankError     two files claim the same rank
          +-- MissingRankError       run.json promises ranks that have no trace
          +-- WorldSizeMismatchError files disagree on the world size
     +-- ClusterError         the Dask cluster cannot be used, or lost a file after its retries
     +-- ExportError          ``fsobs export`` would overwrite the input or existing files
     +-- LaunchError          ``fsobs run`` could not start the job, or the job did not finish
     +-- JobConfigError       a job's config (job.json) is unreadable or has a bad field

All of them are also ``ValueError`` so that generic callers can catch bad input the usual way.
This module imports nothing heavy (no torch, no pandas): every part of fsobs can raise these.
"""

from __future__ import annotations


class FsobsError(ValueError):
    """Base class: bad input, described in one line. ``path`` is the file or folder (a path,
    a URL: anything whose ``str`` names it)."""

    def __init__(
        self,
        message: str,
        *,
        path: object = None,
        rank: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.rank = rank
        self.field = field
        self.detail = message
        parts = []
        if self.path is not None:
            parts.append(self.path)
        if rank is not None:
            parts.append(f"rank {rank}")
        if field is not None:
            parts.append(f"field {field}")
        prefix = ": ".join(parts)
        text = f"{prefix}: {message}" if prefix else message
        super().__init__(" ".join(text.split()))  # always one line

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields across process pools
        return (_rebuild, (type(self), self.detail, self.path, self.rank, self.field))


def _rebuild(
    cls: type[FsobsError], detail: str, path: str | None, rank: int | None, field: str | None
) -> FsobsError:
    return cls(detail, path=path, rank=rank, field=field)


class TraceReadError(FsobsError):
    """The file cannot be read or decompressed."""


class TraceFormatError(FsobsError):
    """The file is readable but is not a valid Kineto trace."""


class RunError(FsobsError):
    """The files do not form one consistent run."""


class EmptyRunError(RunError):
    """No trace file was found."""


class DuplicateRankError(RunError):
    """Two trace files claim the same rank."""


class MissingRankError(RunError):
    """The run says it is complete but some ranks have no trace."""


class WorldSizeMismatchError(RunError):
    """Trace files disagree on the world size."""


class ClusterError(FsobsError):
    """The Dask cluster cannot be used, or lost a file's task for good (the message says which
    file, and why)."""


class ExportError(FsobsError):
    """The export would overwrite the input or existing files."""


class LaunchError(FsobsError):
    """The job could not be started or did not finish."""


class JobConfigError(FsobsError):
    """A job configuration (``job.json``, :mod:`fsobs.workload.config`) cannot be read or has
    a bad field."""
