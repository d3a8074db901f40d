"""fsobs: FreeScale observability — computational bubbles in distributed training traces."""

from fsobs.analysis import Analysis, BubbleConfig, analyze, analyze_path
from fsobs.errors import (
    DuplicateRankError,
    EmptyRunError,
    FsobsError,
    MissingRankError,
    RunError,
    TraceFormatError,
    TraceReadError,
    WorldSizeMismatchError,
)
from fsobs.trace import LoadConfig, RankTrace, Run, load_rank, load_run

__all__ = [
    "Analysis",
    "BubbleConfig",
    "DuplicateRankError",
    "EmptyRunError",
    "FsobsError",
    "LoadConfig",
    "MissingRankError",
    "RankTrace",
    "Run",
    "RunError",
    "TraceFormatError",
    "TraceReadError",
    "WorldSizeMismatchError",
    "analyze",
    "analyze_path",
    "load_rank",
    "load_run",
]
