"""fsobs: FreeScale observability — computational bubbles in distributed training traces."""

from fsobs.analysis import Analysis, BubbleConfig, Comparison, analyze, analyze_path, compare
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
    "Comparison",
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
    "compare",
    "load_rank",
    "load_run",
]
