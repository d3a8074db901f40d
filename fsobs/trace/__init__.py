"""Kineto trace loading: JSON(.gz) files -> :class:`Run` of per-rank event tables (no torch)."""

from fsobs.trace.loader import LoadConfig, load_rank, load_run
from fsobs.trace.schema import KINDS, ProcessGroup, RankTrace, Run

__all__ = ["KINDS", "LoadConfig", "ProcessGroup", "RankTrace", "Run", "load_rank", "load_run"]
