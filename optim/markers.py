"""Range names the optimizer records in the profiler trace, for the analyzer (no torch here).

``fsobs`` reads these names; ``optim`` writes them (``torch.autograd.profiler.record_function``):

- ``## fsobs:pg:<pg_name> ##`` around every collective the optimizer issues on a process group
  of its own. gloo traces do not say which group a collective ran on; this range, around the
  enqueue on the training thread, lets the analyzer tell the groups apart
  (:mod:`fsobs.trace._collectives`).
- ``## fsobs:data ##`` around the preparation of a step's input (batch build, balance plan,
  shuffle exchange): a data-loader range for the CPU bubble classes.
- ``## fsobs:balance ##`` around the balance toggle's work inside it.
"""

from __future__ import annotations

PG_MARKER_PREFIX = "## fsobs:pg:"
PG_MARKER_SUFFIX = " ##"
DATA_MARKER = "## fsobs:data ##"
BALANCE_MARKER = "## fsobs:balance ##"


def pg_marker(pg_name: str) -> str:
    """The range name for collectives issued on the group named ``pg_name``."""
    return f"{PG_MARKER_PREFIX}{pg_name}{PG_MARKER_SUFFIX}"


def pg_of_marker(name: str) -> str | None:
    """The group name of a ``pg_marker`` range name, None for any other name."""
    if name.startswith(PG_MARKER_PREFIX) and name.endswith(PG_MARKER_SUFFIX):
        return name[len(PG_MARKER_PREFIX) : -len(PG_MARKER_SUFFIX)] or None
    return None
