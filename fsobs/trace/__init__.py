"""Kineto trace loading: JSON(.gz) files -> :class:`Run` of per-rank event tables (no torch).

The names load on first use (PEP 562 ``__getattr__``), so that importing a light submodule such
as :mod:`fsobs.trace.cluster` does not import pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsobs._lazy import lazy_attributes

if TYPE_CHECKING:
    from fsobs.trace._decode import GZIP_MAGIC
    from fsobs.trace.cluster import scheduler_address
    from fsobs.trace.loader import LoadConfig, load_rank, load_run
    from fsobs.trace.schema import KINDS, ProcessGroup, RankTrace, Run

__all__ = [
    "GZIP_MAGIC",
    "KINDS",
    "LoadConfig",
    "ProcessGroup",
    "RankTrace",
    "Run",
    "load_rank",
    "load_run",
    "scheduler_address",
]

_LAZY = {
    "GZIP_MAGIC": "fsobs.trace._decode",
    "scheduler_address": "fsobs.trace.cluster",
    "LoadConfig": "fsobs.trace.loader",
    "load_rank": "fsobs.trace.loader",
    "load_run": "fsobs.trace.loader",
    "KINDS": "fsobs.trace.schema",
    "ProcessGroup": "fsobs.trace.schema",
    "RankTrace": "fsobs.trace.schema",
    "Run": "fsobs.trace.schema",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
