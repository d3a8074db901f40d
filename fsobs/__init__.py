"""fsobs: FreeScale observability — computational bubbles in distributed training traces."""

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
    "load_rank",
    "load_run",
]
