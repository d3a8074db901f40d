"""Load a run: find the trace files, parse the ranks in parallel, check they form one run."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fsobs.errors import (
    DuplicateRankError,
    EmptyRunError,
    MissingRankError,
    TraceFormatError,
    TraceReadError,
    WorldSizeMismatchError,
)
from fsobs.trace._build import build_rank_trace
from fsobs.trace._decode import DEFAULT_MAX_TRACE_BYTES
from fsobs.trace.schema import RankTrace, Run
from fsobs.trace.sidecar import read_sidecars

logger = logging.getLogger(__name__)

RUN_META = "run.json"
COST_MODEL = "cost_model.json"
"""Written into a run directory by ``fsobs fit-cost``; not a trace."""
NOT_TRACES = frozenset({RUN_META, COST_MODEL})
Source = str | Path | Sequence[str | Path]


class _RankLike(Protocol):
    rank: int
    world_size: int
    path: Path
    warnings: list[str]


R = TypeVar("R", bound=_RankLike)
_PARALLEL_MIN_BYTES = 4 * 2**20  # below this, process start-up costs more than it saves


@dataclass(kw_only=True, frozen=True)
class LoadConfig:
    """How traces are read."""

    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES
    """Largest decompressed size accepted per trace file (guards against gzip bombs)."""
    workers: int | None = None
    """Parser processes; None: one per file up to the number of CPUs; 1: parse in-process."""
    step_marker: str | None = None
    """Iterations are the CPU ranges whose name starts with this, numbered 0, 1, ... in time
    order, instead of ``ProfilerStep#N``. Without either, the whole trace is one window."""

    def __post_init__(self) -> None:
        if self.max_trace_bytes <= 0:
            raise ValueError("max_trace_bytes must be positive")
        if self.workers is not None and self.workers < 1:
            raise ValueError("workers must be >= 1")


def load_rank(path: str | Path, config: LoadConfig | None = None) -> RankTrace:
    """Parse one trace file (the rank is whatever its ``distributedInfo`` says, -1 if none)."""
    config = config or LoadConfig()
    return build_rank_trace(Path(path), config.max_trace_bytes, config.step_marker)


def load_run(source: Source, config: LoadConfig | None = None) -> Run[RankTrace]:
    """Load a run directory, one trace file, or a list of trace files.

    The rank of each file comes from its ``distributedInfo.rank``, never from its name. Raises a
    :class:`~fsobs.errors.FsobsError` naming the file, rank and field on any bad input.
    """
    return map_run(source, _identity, config)


def map_run(
    source: Source, reduce: Callable[[RankTrace], R], config: LoadConfig | None = None
) -> Run[R]:
    """Like :func:`load_run`, but each rank is passed through ``reduce`` right after parsing,
    in the worker process, so only the reduced ranks (e.g. analysis summaries) ever coexist.

    ``reduce`` must be picklable (a module-level function or a ``functools.partial`` of one) and
    return an object with the ``rank``, ``world_size``, ``path`` and ``warnings`` of its trace.
    """
    config = config or LoadConfig()
    root, files, meta = _discover(source)
    traces = _parse_all(files, config, reduce)
    warnings: list[str] = []
    world_size = _world_size(traces, meta, root)
    by_rank = _index_by_rank(traces)
    _check_coverage(by_rank, world_size, meta, root, warnings)
    for trace in by_rank.values():
        warnings.extend(trace.warnings)
    is_dir = isinstance(source, (str, Path)) and Path(source).is_dir()
    sidecar = read_sidecars(root) if is_dir else None
    return Run(
        path=root,
        world_size=world_size,
        ranks=by_rank,
        meta=meta,
        warnings=warnings,
        sidecar=sidecar,
    )


def is_trace_name(name: str) -> bool:
    """Whether a file of a run directory is read as a Kineto trace."""
    return name.endswith((".json", ".json.gz")) and name not in NOT_TRACES


def _discover(
    source: Source,
) -> tuple[Path, list[Path], dict[str, Any] | None]:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and is_trace_name(p.name))
            if not files:
                raise EmptyRunError(
                    "no trace files (*.json, *.json.gz) in this directory", path=path
                )
            return path, files, _read_meta(path / RUN_META)
        if not path.exists():
            raise TraceReadError("no such file or directory", path=path)
        return path, [path], None
    files = [Path(p) for p in source]
    if not files:
        raise EmptyRunError("no trace files given")
    for path in files:
        if not path.is_file():
            why = "a directory; give a run directory alone" if path.is_dir() else "no such file"
            raise TraceReadError(why, path=path)
    parents = {p.parent for p in files}
    root = parents.pop() if len(parents) == 1 else Path(os.path.commonpath(files))
    return root, files, None


def _read_meta(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceReadError(f"cannot read file: {exc.strerror or exc}", path=path) from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"run metadata is not UTF-8 text ({exc.reason})", path=path) from exc
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"run metadata is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
            path=path,
        ) from exc
    if not isinstance(meta, dict):
        raise TraceFormatError("run metadata must be a JSON object", path=path)
    size = meta.get("world_size")
    if size is not None and (type(size) is not int or size < 1):
        raise TraceFormatError(
            f"expected a positive integer, got {json.dumps(size)}", path=path, field="world_size"
        )
    return meta


def _identity(trace: RankTrace) -> RankTrace:
    return trace


def _load_reduced(
    path: Path, config: LoadConfig, reduce: Callable[[RankTrace], R], sole: bool
) -> R:
    trace = load_rank(path, config)
    if trace.rank < 0:  # settle the rank before anything is computed from it
        if not sole:
            raise TraceFormatError(
                "missing; needed to tell the ranks of a multi-file run apart",
                path=path,
                field="distributedInfo.rank",
            )
        trace.rank = 0
        trace.world_size = max(trace.world_size, 1)
        trace.warnings.append(f"{path.name}: no distributedInfo.rank; treated as rank 0")
    return reduce(trace)


def _parse_all(files: list[Path], config: LoadConfig, reduce: Callable[[RankTrace], R]) -> list[R]:
    total = sum(p.stat().st_size for p in files)
    workers = config.workers or min(len(files), os.cpu_count() or 1)
    work = partial(_load_reduced, config=config, reduce=reduce, sole=len(files) == 1)
    if workers <= 1 or len(files) == 1 or total < _PARALLEL_MIN_BYTES:
        return [work(p) for p in files]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(work, files))


def _world_size(traces: Sequence[_RankLike], meta: dict[str, Any] | None, root: Path) -> int:
    sizes = {t.world_size for t in traces if t.world_size > 0}
    if len(sizes) > 1:
        by_size = {t.world_size: t for t in traces}
        a, b = (by_size[s] for s in sorted(sizes)[:2])
        raise WorldSizeMismatchError(
            f"world_size {a.world_size} in {a.path.name} (rank {a.rank}) but "
            f"{b.world_size} in {b.path.name} (rank {b.rank})",
            path=root,
            field="distributedInfo.world_size",
        )
    world_size = sizes.pop() if sizes else max(t.rank for t in traces) + 1
    for trace in traces:
        trace.world_size = world_size
    if meta is not None and "world_size" in meta and meta["world_size"] != world_size:
        raise WorldSizeMismatchError(
            f"run.json says world_size {meta['world_size']} but the traces say {world_size}",
            path=root / RUN_META,
            field="world_size",
        )
    return world_size


def _index_by_rank(traces: list[R]) -> dict[int, R]:
    by_rank: dict[int, R] = {}
    for trace in traces:
        other = by_rank.get(trace.rank)
        if other is not None:
            raise DuplicateRankError(
                f"both {other.path.name} and {trace.path.name} claim this rank",
                path=trace.path.parent,
                rank=trace.rank,
                field="distributedInfo.rank",
            )
        by_rank[trace.rank] = trace
    return dict(sorted(by_rank.items()))


def _check_coverage(
    by_rank: dict[int, R],
    world_size: int,
    meta: dict[str, Any] | None,
    root: Path,
    warnings: list[str],
) -> None:
    missing = sorted(set(range(world_size)) - set(by_rank))
    if not missing:
        return
    shown = ", ".join(str(r) for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
    if meta is not None and meta.get("status", "complete") == "complete":
        which = f"rank {shown} has" if len(missing) == 1 else f"ranks {shown} have"
        raise MissingRankError(
            f"{RUN_META} says the run of {world_size} ranks is complete but {which} no trace",
            path=root,
            rank=missing[0],
        )
    warnings.append(f"loaded {len(by_rank)} of {world_size} ranks (missing: {shown})")
