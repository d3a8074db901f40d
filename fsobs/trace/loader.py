"""Load a run: find the trace files, parse the ranks in parallel, check they form one run.

A run is a local directory or file(s), or an fsspec URL of either (:mod:`fsobs.storage`).
The ranks are parsed in this machine's fork pool, or as tasks on the workers of a Dask cluster
(:mod:`fsobs.trace.cluster`) when ``LoadConfig.scheduler`` or ``FSOBS_DASK_SCHEDULER`` names one.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
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
from fsobs.runformat.files import RunFiles, run_files
from fsobs.runformat.names import RUN_JSON, WINDOW_RE, WINDOWS_DIR, is_run_file, is_trace_name
from fsobs.runformat.runmeta import RunMeta, read_run_meta
from fsobs.runformat.steps import sidecar_frame
from fsobs.storage import Location, RemotePath, as_location, check_protocol, open_local
from fsobs.trace._build import build_rank_trace
from fsobs.trace._decode import DEFAULT_MAX_HELD_BYTES, DEFAULT_MAX_TRACE_BYTES
from fsobs.trace._sniff import NOT_TRACE_NOTE, is_trace_file
from fsobs.trace.classify import comm_kernel_re
from fsobs.trace.cluster import DaskCluster, Progress, raise_first, scheduler_address
from fsobs.trace.schema import RankLike, RankTrace, Run

logger = logging.getLogger(__name__)

Source = str | Path | RemotePath | Sequence[str | Path | RemotePath]
"""A run directory, a trace file, or a list of trace files; each a local path or a URL."""


class _RankLike(RankLike, Protocol):
    rank: int
    world_size: int
    path: Location
    warnings: list[str]


R = TypeVar("R", bound=_RankLike)
LINKS_NOTE = "skipped symbolic links: {names} (a run's files must lie in its folder)"
"""The note of a run folder's run files that are links, never followed."""
T = TypeVar("T")
_PARALLEL_MIN_BYTES = 4 * 2**20  # below this, process start-up costs more than it saves


@dataclass(kw_only=True, frozen=True)
class LoadConfig:
    """How traces are read."""

    max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES
    """Largest decompressed size accepted per trace file (guards against gzip bombs); the text
    is read as a stream, a few MiB at a time (default 4 GiB)."""
    max_held_bytes: int = DEFAULT_MAX_HELD_BYTES
    """Largest text held whole in memory per trace file: a file the streaming reader cannot
    cut into events, or one event too long to cut (default 512 MiB; what a hostile file can
    cost each parser)."""
    workers: int | None = None
    """Parser processes; None: one per file up to the number of CPUs; 1: parse in-process."""
    step_marker: str | None = None
    """Iterations are the CPU ranges whose name starts with this, numbered 0, 1, ... in time
    order, instead of ``ProfilerStep#N``. Without either, the whole trace is one window."""
    comm_kernels: tuple[str, ...] = ()
    """Regular expressions (searched in the name, case-insensitive) of GPU kernels that are
    communication, beside the built-in list :data:`fsobs.trace.classify.COMM_KERNEL_PATTERNS`
    (NCCL, RCCL, DeepEP, NVSHMEM, ...): a job's own all-to-all or expert dispatch kernels."""
    scheduler: str | None = None
    """Address of a Dask scheduler (``tcp://host:8786``) whose workers parse and reduce the
    ranks, one task per file; only the reduced ranks come back. None: the
    ``FSOBS_DASK_SCHEDULER`` environment variable when set, else this machine's processes;
    ``"local"``: this machine's processes whatever the environment says."""

    def __post_init__(self) -> None:
        if self.max_trace_bytes <= 0:
            raise ValueError("max_trace_bytes must be positive")
        if self.max_held_bytes <= 0:
            raise ValueError("max_held_bytes must be positive")
        if self.workers is not None and self.workers < 1:
            raise ValueError("workers must be >= 1")
        comm_kernel_re(self.comm_kernels)  # ValueError naming the field for a bad pattern
        if self.scheduler is not None and not self.scheduler.strip():
            raise ValueError("scheduler must be an address such as tcp://host:8786, or None")


def load_rank(path: str | Path | RemotePath, config: LoadConfig | None = None) -> RankTrace:
    """Parse one trace file, here (the rank is whatever its ``distributedInfo`` says, -1 if
    none). ``path`` may be a URL."""
    config = config or LoadConfig()
    location = as_location(path)
    return build_rank_trace(
        location,
        config.max_trace_bytes,
        config.max_held_bytes,
        config.step_marker,
        config.comm_kernels,
    )


def load_run(source: Source, config: LoadConfig | None = None) -> Run[RankTrace]:
    """Load a run directory, one trace file, or a list of trace files.

    The rank of each file comes from its ``distributedInfo.rank``, never from its name. Raises a
    :class:`~fsobs.errors.FsobsError` naming the file, rank and field on any bad input.
    """
    return map_run(source, _identity, config)


def map_run(
    source: Source,
    reduce: Callable[[RankTrace], R],
    config: LoadConfig | None = None,
    progress: Progress | None = None,
    keep: Callable[[R], R] | None = None,
) -> Run[R]:
    """Like :func:`load_run`, but each rank is passed through ``reduce`` right after parsing,
    in the worker process, so only the reduced ranks (e.g. analysis summaries) ever coexist.

    ``reduce`` must be picklable (a module-level function or a ``functools.partial`` of one) and
    return an object with the ``rank``, ``world_size``, ``path`` and ``warnings`` of its trace.
    ``keep`` is called in this process on each reduced rank the moment it arrives (e.g. to move
    its bulk to disk), and what it returns is kept instead. ``progress(done, total)`` is called
    in this process as each file is parsed (and once with ``done == 0`` before); it must not
    raise.
    """
    config = config or LoadConfig()
    found = _discover(source)
    traces = _parse_all(found, config, reduce, progress or _no_progress, keep or _identity)
    warnings: list[str] = []
    world_size = _world_size(traces, found.meta, found.root)
    by_rank = _index_by_rank(traces)
    _check_coverage(by_rank, world_size, found.meta, found.root, warnings)
    if found.skipped:
        warnings.append(NOT_TRACE_NOTE.format(names=", ".join(found.skipped)))
    if found.links:
        warnings.append(LINKS_NOTE.format(names=", ".join(found.links)))
    for trace in by_rank.values():
        warnings.extend(trace.warnings)
    sidecar = sidecar_frame(found.sidecars) if found.is_dir else None
    return Run(
        path=found.root,
        world_size=world_size,
        ranks=by_rank,
        meta=found.meta,
        warnings=warnings,
        sidecar=sidecar,
    )


@dataclass(frozen=True)
class _Found:
    """The files of a source, before any is parsed."""

    root: Location
    files: list[Location]
    total_bytes: int | None
    """None when a remote listing does not give sizes."""
    meta: RunMeta | None
    is_dir: bool
    skipped: tuple[str, ...] = ()
    """JSON files of the folder that are not traces (:mod:`fsobs.trace._sniff`)."""
    links: tuple[str, ...] = ()
    """Run files of a local folder that are symbolic links, left out."""
    sidecars: tuple[tuple[Location, int], ...] = ()
    """(file, rank) of the folder's step sidecars."""


def _traces(candidates: Sequence[Location], folder: Location) -> tuple[list[Location], list[str]]:
    """The trace files among a folder's JSON files, and the names of the others; none a trace:
    the error naming what was found."""
    files: list[Location] = []
    skipped: list[Location] = []
    for file in candidates:
        (files if is_trace_file(file) else skipped).append(file)
    if not files and skipped:
        raise EmptyRunError(
            "no Kineto trace in this directory; "
            + NOT_TRACE_NOTE.format(names=", ".join(f.name for f in skipped)),
            path=folder,
        )
    return files, [f.name for f in skipped]


def _discover(source: Source) -> _Found:
    """The files of ``source``; a local path that cannot be looked at (no permission) is a
    :class:`TraceReadError` naming it."""
    try:
        return _discover_source(source)
    except OSError as exc:
        where = Path(exc.filename) if exc.filename else Path(".")
        raise TraceReadError(f"cannot read: {exc.strerror or exc}", path=where) from exc


def _discover_source(source: Source) -> _Found:
    if isinstance(source, (str, Path, RemotePath)):
        location = as_location(source)
        if isinstance(location, RemotePath):
            _check_protocol(location)
            return _discover_remote(location)
        path = location
        if path.is_dir():
            return _discover_folder(path)
        if not path.exists():
            raise TraceReadError("no such file or directory", path=path)
        return _Found(path, [path], _local_bytes([path]), None, is_dir=False)
    listed = [as_location(p) for p in source]
    if not listed:
        raise EmptyRunError("no trace files given")
    for file in listed:
        if isinstance(file, Path) and not file.is_file():
            why = "a directory; give a run directory alone" if file.is_dir() else "no such file"
            raise TraceReadError(why, path=file)
    for url in {p.protocol: p for p in listed if isinstance(p, RemotePath)}.values():
        _check_protocol(url)
    local = [p for p in listed if isinstance(p, Path)]
    size = _local_bytes(local) if len(local) == len(listed) else None
    return _Found(_common_root(listed), listed, size, None, is_dir=False)


def _discover_folder(path: Path) -> _Found:
    """A local run folder: its trace files and ``run.json``, symbolic links left out (a run's
    files are in its folder) and named in a warning."""
    listed = _listing(path)
    links = listed.linked_run_files
    for special in (p for p in listed.special if is_run_file(p.name)):
        try:  # a FIFO, a device: say what it is
            open_local(special).close()
        except OSError as exc:
            raise TraceReadError(f"cannot read file: {exc.strerror}", path=special) from exc
    if not listed.traces:
        raise (
            _live_run(path)
            if listed.windows is not None
            else _no_traces(path, _run_folders(listed), links)
        )
    return _found_folder(listed, links)


def _listing(folder: Location) -> RunFiles:
    """The folder's files, listed once; TraceReadError when it cannot be listed."""
    try:
        return run_files(folder)
    except FileNotFoundError as exc:
        raise TraceReadError("no such file or directory", path=folder) from exc
    except OSError as exc:
        raise TraceReadError(
            f"cannot list this folder: {exc.strerror or exc}", path=folder
        ) from exc


def _discover_remote(url: RemotePath) -> _Found:
    """A URL is one trace file when its name says so (no request made), else a run folder,
    listed once. (Asking the server whether a URL is a folder can cost a whole download.)"""
    if is_trace_name(url.name):
        return _Found(url, [url], None, None, is_dir=False)
    listed = _listing(url)
    if not listed.traces:
        raise _no_traces(url, list(listed.folders), checked=False)
    return _found_folder(listed)


def _found_folder(listed: RunFiles, links: tuple[str, ...] = ()) -> _Found:
    """A run folder with trace files: those the sniffer takes, their size, its ``run.json``."""
    files, skipped = _traces([e.location for e in listed.traces], listed.folder)
    sizes = [e.size for e in listed.traces if e.location in files]
    total = None if None in sizes else sum(s for s in sizes if s is not None)
    meta = None if listed.run_json is None else read_run_meta(listed.run_json)
    return _Found(listed.folder, files, total, meta, True, tuple(skipped), links, listed.sidecars)


_RUNS_SHOWN = 8
_RUN_DEPTH = 3


def _run_folders(root: RunFiles) -> list[str]:
    """Folders under ``root`` (``_RUN_DEPTH`` levels at most) that hold trace files: runs,
    as paths relative to ``root``, shallowest first, by name within a level; the first
    ``_RUNS_SHOWN`` + 1 found."""
    found: list[str] = []
    level = [(Path(), root)]
    for _ in range(_RUN_DEPTH):
        below = []
        for relative, folder in level:
            for name in folder.folders:
                try:
                    sub = run_files(folder.folder / name)
                except OSError:
                    continue  # an unreadable folder is no run to suggest
                if sub.traces:
                    found.append(str(relative / name))
                    if len(found) > _RUNS_SHOWN:
                        return found
                else:
                    below.append((relative / name, sub))
        level = below
    return found


def _live_run(folder: Path) -> EmptyRunError:
    """The error for a live run's folder: its traces are in its windows' folders."""
    windows = sorted(p for p in (folder / WINDOWS_DIR).iterdir() if WINDOW_RE.match(p.name))
    if not windows:
        return EmptyRunError("a live run that has published no window yet", path=folder)
    return EmptyRunError(
        f"a live run: its traces are in its {len(windows)} window(s), each a run of its own; "
        f"analyze one (e.g. {windows[-1]}) or see them all: fsobs watch {folder} --once",
        path=folder,
    )


def _no_traces(
    folder: Location, runs: list[str], links: tuple[str, ...] = (), *, checked: bool = True
) -> EmptyRunError:
    """The error for a folder without trace files; it names the run folders under it (or,
    remote, its subfolders, unchecked) for the user to pick one, and the links left out."""
    message = "no trace files (*.json, *.json.gz) in this directory"
    if links:
        message += "; " + LINKS_NOTE.format(names=", ".join(links))
    if runs:
        shown = ", ".join(runs[:_RUNS_SHOWN]) + (" ..." if len(runs) > _RUNS_SHOWN else "")
        what = "run folder(s) with trace files" if checked else "subfolder(s)"
        message += (
            f"; it holds {what} ({shown}) and a run is one folder of trace files: analyze "
            f"one of them, e.g. {folder / runs[0]}"
        )
    return EmptyRunError(message, path=folder)


def _check_protocol(url: RemotePath) -> None:
    try:
        check_protocol(url)
    except ImportError as exc:
        raise TraceReadError(f"cannot open this URL: {exc}", path=url) from exc


def _local_bytes(files: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in files)


def _common_root(files: Sequence[Location]) -> Location:
    parents = {p.parent for p in files}
    if len(parents) == 1:
        return parents.pop()
    if all(isinstance(p, Path) for p in files):
        return Path(os.path.commonpath(files))  # type: ignore[arg-type]  # all Paths, just checked
    return files[0].parent  # files of several folders and URLs: name the first one's


def _identity(trace: T) -> T:
    return trace


def _load_reduced(
    path: Location, config: LoadConfig, reduce: Callable[[RankTrace], R], sole: bool
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


def _no_progress(done: int, total: int) -> None:
    pass


def _parse_all(
    found: _Found,
    config: LoadConfig,
    reduce: Callable[[RankTrace], R],
    progress: Progress,
    keep: Callable[[R], R],
) -> list[R]:
    files = found.files
    work = partial(_load_reduced, config=config, reduce=reduce, sole=len(files) == 1)
    address = scheduler_address(config.scheduler)
    if address is not None:
        if config.workers is not None:
            logger.warning("LoadConfig.workers is ignored on a Dask cluster (%s)", address)
        # the workers may run elsewhere: they get absolute paths
        files = [p.absolute() if isinstance(p, Path) else p for p in files]
        return DaskCluster(address).map(work, files, progress, keep)
    workers = config.workers or min(len(files), os.cpu_count() or 1)
    small = found.total_bytes is not None and found.total_bytes < _PARALLEL_MIN_BYTES
    progress(0, len(files))
    if workers <= 1 or len(files) == 1 or small:
        results = []
        for path in files:
            results.append(keep(work(path)))
            progress(len(results), len(files))
        return results
    context = multiprocessing.get_context("fork")
    outcomes: list[Any] = [None] * len(files)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        index = {pool.submit(work, p): i for i, p in enumerate(files)}
        for done, future in enumerate(as_completed(index), start=1):
            i = index.pop(future)  # nothing else refers to the future: its result goes with it
            error = future.exception()
            outcomes[i] = error if error is not None else keep(future.result())
            progress(done, len(files))
    return raise_first(outcomes)


def _world_size(traces: Sequence[_RankLike], meta: RunMeta | None, root: Location) -> int:
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
    if meta is not None and meta.world_size is not None and meta.world_size != world_size:
        raise WorldSizeMismatchError(
            f"run.json says world_size {meta.world_size} but the traces say {world_size}",
            path=root / RUN_JSON,
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
    meta: RunMeta | None,
    root: Location,
    warnings: list[str],
) -> None:
    missing = sorted(set(range(world_size)) - set(by_rank))
    if not missing:
        return
    shown = ", ".join(str(r) for r in missing[:8]) + (" ..." if len(missing) > 8 else "")
    if meta is not None and meta.status == "complete":
        which = f"rank {shown} has" if len(missing) == 1 else f"ranks {shown} have"
        raise MissingRankError(
            f"{RUN_JSON} says the run of {world_size} ranks is complete but {which} no trace",
            path=root,
            rank=missing[0],
        )
    warnings.append(f"loaded {len(by_rank)} of {world_size} ranks (missing: {shown})")
