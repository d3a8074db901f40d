"""Per-rank ``torch.profiler`` wrapper that writes ``rank<R>.trace.json.gz`` (docs/design.md §3).

Usage in a training loop (the ``ProfilerStep#N`` ranges come from torch.profiler itself)::

    with StepProfiler(run_dir, rank, ProfilerConfig(wait=1, warmup=1, active=3)) as prof:
        for batch in batches:
            train_step(batch)
            prof.step()

Schedule, per cycle (repeated ``repeat`` times)::

    step:    0 .. wait-1 | wait .. wait+warmup-1 | ... active steps ...
    action:  idle        | warm up (discarded)   | recorded -> trace exported at the cycle's end

The trace is written when a cycle's last active step ends, or when the ``with`` block is left
(also on an exception) while steps are being recorded. Each cycle (profiling window) is written
when it closes, and the rank's one trace file (one trace per rank is the run format) holds every
window closed so far: with ``repeat > 1`` the file is rewritten at each window's end with the
earlier windows' events (kept in a temporary file meanwhile) and the new ones, so a job killed
mid-run keeps the windows it finished. Writing is atomic: Chrome JSON to a temporary name in
the run directory, gzip to a second temporary name, then ``os.replace`` to the final name; a
failing write leaves no file under the final name and no temporary file, and the file keeps the
windows written before. Its exception is not raised into ``step()`` (torch's profiler breaks if
its callback raises) but kept and re-raised when the ``with`` block is left, so training is
never disturbed by profiling. ``distributedInfo`` is added by torch when ``torch.distributed``
is initialized; without it the trace still loads (as rank 0 when alone). Every thread of the
process is profiled (Kineto's ``profile_all_threads``), so ranges recorded off the training
thread (FreeScale's balance planner, :mod:`optim.ahead`) land in the trace with their thread.

Profiling only observes: it adds no synchronization, no randomness and no change to tensors, so
the trained parameters are the same with the profiler on or off (tested bit for bit).

:class:`ProfilerConfig` imports without torch (a launcher builds it before any rank starts);
torch is imported when a :class:`StepProfiler` starts.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from fsobs.collect.live_windows import LiveWindows
from fsobs.runformat.atomic import publish, temp_path
from fsobs.runformat.names import trace_file_name
from fsobs.runformat.windows import WindowSchedule
from optim.errors import FieldError

if TYPE_CHECKING:
    import torch
    from torch.profiler import ProfilerActivity

logger = logging.getLogger(__name__)

__all__ = ["ProfilerConfig", "StepProfiler"]


@dataclass(kw_only=True, frozen=True)
class ProfilerConfig:
    """What to profile and when (the ``torch.profiler.schedule`` of each rank)."""

    enabled: bool = True
    """Profile at all; False: :class:`StepProfiler` does nothing (and writes nothing)."""
    wait: int = 1
    """Steps skipped at the start of each cycle."""
    warmup: int = 1
    """Steps traced but discarded before recording (torch warns that 0 skews the results)."""
    active: int = 3
    """Steps recorded in each cycle."""
    repeat: int = 1
    """Number of cycles (profiling windows); the trace file holds every window closed so far."""
    every: int | None = None
    """Live windows: a cycle starts every ``every`` steps, without end, and each window goes to
    its own folder as it closes (:mod:`fsobs.runformat.windows`); the job also records the
    steps a capture request asks for. ``0``: on request only. None: the cycles above, in
    one trace file."""
    record_shapes: bool = True
    """Record input shapes (gloo collectives carry their sizes only in ``Input Dims``)."""
    with_stack: bool = False
    """Record Python stacks (about 2-3x larger traces)."""
    profile_memory: bool = False
    """Record tensor allocations."""

    def __post_init__(self) -> None:
        for name, low in (("wait", 0), ("warmup", 1), ("active", 1), ("repeat", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise FieldError(name, f"must be an integer >= {low}, got {value!r}")
        for name in ("enabled", "record_shapes", "with_stack", "profile_memory"):
            if type(getattr(self, name)) is not bool:
                raise FieldError(name, f"must be a bool, got {getattr(self, name)!r}")
        if self.every is not None:
            if self.repeat != 1:
                raise FieldError("repeat", "live windows (every) repeat without end; leave it 1")
            self.schedule  # noqa: B018  # checks every against the cycle

    @classmethod
    def every_step(cls, steps: int, **fields: Any) -> ProfilerConfig:
        """One cycle that records every step of a ``steps``-step loop after its ``wait`` and
        ``warmup`` steps (default one each); ``fields`` set the others, not ``active`` and
        ``repeat``."""
        wait, warmup = fields.pop("wait", 1), fields.pop("warmup", 1)
        if steps <= wait + warmup:
            raise ValueError(
                f"steps: must be > wait + warmup ({wait + warmup}) so that a step is recorded, "
                f"got {steps}"
            )
        return cls(wait=wait, warmup=warmup, active=steps - wait - warmup, **fields)

    @property
    def cycle_steps(self) -> int:
        """Steps in one cycle (wait + warmup + active)."""
        return self.wait + self.warmup + self.active

    @property
    def num_steps(self) -> int:
        """Steps needed to complete every cycle (live windows: the first); later steps are not
        profiled."""
        return self.cycle_steps * self.repeat

    @property
    def schedule(self) -> WindowSchedule:
        """The live windows' schedule (``ValueError`` without ``every``)."""
        if self.every is None:
            raise ValueError("every: not set, the profiler writes no live windows")
        return WindowSchedule(
            every=self.every, wait=self.wait, warmup=self.warmup, active=self.active
        )


class StepProfiler:
    """Context manager profiling one rank's training loop into ``run_dir``.

    With ``config.enabled`` False it is a true no-op: no profiler is created, nothing is
    written (not even the directory), and ``step()`` does nothing, so the call sites stay the same.
    """

    def __init__(self, run_dir: str | Path, rank: int, config: ProfilerConfig) -> None:
        if type(rank) is not int or rank < 0:
            raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
        if not isinstance(config, ProfilerConfig):
            raise ValueError(f"config must be a ProfilerConfig, got {type(config).__name__}")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.config = config
        self.enabled = config.enabled
        self.trace_path = self.run_dir / trace_file_name(rank)
        """Where the trace is written."""
        self.num_exports = 0
        """Windows written so far (one per completed or interrupted recording cycle)."""
        self.export_error: Exception | None = None
        """The first failed export; re-raised when the ``with`` block is left without error."""
        self._prof: torch.profiler.profile | None = None
        self._keep_previous = False
        self._num_windows = 0
        self._windows = _Windows(self.trace_path)
        self.live = (
            LiveWindows(self.run_dir, rank, config.schedule, _write_window)
            if config.enabled and config.every is not None
            else None
        )
        """The live windows and capture requests (``config.every`` set), else None."""

    def __enter__(self) -> StepProfiler:
        if not self.enabled:
            return self
        if self._prof is not None:
            raise RuntimeError("StepProfiler is already active; it cannot be nested")
        _check_rank(self.rank)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.trace_path.exists():
            raise FileExistsError(f"{self.trace_path}: a trace of this rank is already there")
        import torch
        from torch._C._profiler import _ExperimentalConfig

        cfg = self.config
        if self.live is not None:
            self.live.start()
        prof = torch.profiler.profile(
            activities=_activities(),
            schedule=self.live.action
            if self.live is not None
            else torch.profiler.schedule(
                wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat
            ),
            on_trace_ready=self._export,
            record_shapes=cfg.record_shapes,
            with_stack=cfg.with_stack,
            profile_memory=cfg.profile_memory,
            # every thread of the process, not only this one: FreeScale's planner thread
            # (optim.ahead) records its ## fsobs:balance ## ranges there
            experimental_config=_ExperimentalConfig(profile_all_threads=True),
        )
        prof.__enter__()  # type: ignore[no-untyped-call]  # torch: unannotated
        self._prof = prof
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        # Leaving on an error mid-cycle: keep the complete earlier cycles rather than add a
        # partial one, so that the ranks' traces still cover the same steps (live windows: each
        # is its own file, so a cut one is never published).
        live = self.live is not None
        self._keep_previous = exc_type is not None and (live or self.trace_path.exists())
        try:
            with self._quiet():
                prof.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]  # torch: unannotated
        finally:
            self._windows.close()
        if self.export_error is not None and exc_type is None:
            raise self.export_error

    def step(self) -> None:
        """Mark the end of a training step (call once per step, after the optimizer step)."""
        if not self.enabled:
            return
        if self._prof is None:
            raise RuntimeError("StepProfiler.step() called outside its with block")
        if self.live is not None:
            self.live.poll(self._prof.step_num + 1)
        with self._quiet():
            self._prof.step()

    @property
    def published(self) -> bool:
        """Whether this rank has published a trace: its trace file, or a live window."""
        if self.live is not None:
            return self.live.num_published > 0
        return self.trace_path.exists()

    def _export(self, prof: torch.profiler.profile) -> None:
        # torch calls this in the middle of a state transition: an exception escaping here leaves
        # its profiler half-stopped (a later step segfaults, torch 2.13), so keep it for __exit__.
        if self._keep_previous:
            return
        self._num_windows += 1
        more = self._prof is not None and self._num_windows < self.config.repeat
        try:
            if self.live is not None:
                self.live.export(prof, stopping=self._prof is None)
            else:
                self._windows.write(prof, more=more)
        except Exception as error:
            logger.error(
                "rank %d: trace export to %s failed: %s", self.rank, self.trace_path, error
            )
            if self.export_error is None:
                self.export_error = error
            return
        self.num_exports += 1
        logger.debug("rank %d: trace written to %s", self.rank, self.trace_path)

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Silence torch's warning that each cycle starts afresh (intended, see the module doc)."""
        if self.config.repeat == 1 and self.live is None:
            yield
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each")
            yield


class _Windows:
    """The rank's trace file, rewritten at the end of each window with every window so far.

    The events of the windows before are kept in a temporary file next to the trace (a dot-name
    ending in ``.tmp``, removed by :meth:`close`, or by ``finalize_incomplete`` after a kill)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._earlier: Path | None = None
        """The earlier windows' events (JSON objects separated by commas), None before any."""
        self._base: bytes | None = None
        self._broken = False

    def write(self, prof: torch.profiler.profile, *, more: bool) -> None:
        """Export ``prof``'s window and publish the trace of every window so far; ``more``:
        keep this window's events for the windows still to come."""
        if self._broken:
            raise OSError(f"{self.path}: an earlier window was not kept; not replacing the file")
        header, events = _export_window(prof, self.path)
        base = header.get("baseTimeNanoseconds")
        if self._base is not None and (base is None or bytes(base) != self._base):
            raise ValueError(f"{self.path}: a window has another baseTimeNanoseconds")
        self._base = None if base is None else bytes(base)
        pieces: list[bytes | memoryview | Path] = [_document_start(header)]
        if self._earlier is not None:
            pieces.append(self._earlier)
        if events:
            pieces += [b",\n" if self._earlier is not None else b"", events]
        pieces.append(b"\n]}\n")
        packed = temp_path(self.path, "gz")
        try:
            _gzip(pieces, packed)
            publish(packed, self.path)
        finally:
            packed.unlink(missing_ok=True)
        if more and events:
            self._keep(events)

    def _keep(self, events: memoryview) -> None:
        earlier = self._earlier or temp_path(self.path, "events")
        with open(earlier, "ab") as handle:
            start = handle.tell()
            try:
                handle.write(b",\n" if start else b"")
                handle.write(events)
                handle.flush()
            except OSError:
                self._broken = True  # the next file would lack this window: write none
                raise
        self._earlier = earlier

    def close(self) -> None:
        """Remove the temporary file of the earlier windows' events."""
        if self._earlier is not None:
            self._earlier.unlink(missing_ok=True)
            self._earlier = None


_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_WS = b" \t\r\n"


def _export_window(
    prof: torch.profiler.profile, path: Path
) -> tuple[dict[str, msgspec.Raw], memoryview]:
    """The window's top-level fields but ``traceEvents``, and the text of its events (between
    the array's brackets, surrounding blanks stripped); the export's temporary file removed."""
    raw = temp_path(path, "raw")
    kineto_temp = raw.with_name(raw.name + ".tmp")  # Kineto writes there, then renames
    try:
        try:
            prof.export_chrome_trace(str(raw))
            text = raw.read_bytes()
        except OSError as exc:  # Kineto only logs its failure: torch then misses the file
            free = shutil.disk_usage(path.parent).free / 2**20
            raise OSError(
                f"{path}: the profiler could not write the window ({free:.1f} MiB free on the "
                f"disk): {exc.strerror or exc}"
            ) from exc
        header = _TOP_LEVEL.decode(text)
    finally:
        raw.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):  # Kineto keeps it open after a failed
            os.truncate(kineto_temp, 0)  # write: emptied first, its space is freed at once
        kineto_temp.unlink(missing_ok=True)
    array = header.pop("traceEvents", None)
    view = memoryview(array) if array is not None else memoryview(b"")  # no copy
    if bytes(view[:1]) != b"[":
        raise ValueError(f"{path}: the profiler's export has no traceEvents array")
    first, last = 1, len(view) - 1
    while first < last and view[first] in _WS:
        first += 1
    while last > first and view[last - 1] in _WS:
        last -= 1
    return header, view[first:last]


def _write_window(prof: torch.profiler.profile, path: Path) -> None:
    """Export ``prof``'s window alone to ``path`` (gzipped, atomic)."""
    header, events = _export_window(prof, path)
    packed = temp_path(path, "gz")
    try:
        _gzip([_document_start(header), events, b"\n]}\n"], packed)
        publish(packed, path)
    finally:
        packed.unlink(missing_ok=True)


def _document_start(header: dict[str, msgspec.Raw]) -> bytes:
    """``{``, the top-level fields, then the opening of ``traceEvents``."""
    fields = [msgspec.json.encode(key) + b": " + bytes(value) for key, value in header.items()]
    return b"{\n" + b"".join(f + b",\n" for f in fields) + b'"traceEvents": [\n'


def _gzip(pieces: Iterable[bytes | memoryview | Path], target: Path) -> None:
    """Write the pieces one after the other (a path: that file's content) gzipped to target."""
    with gzip.open(target, "xb", compresslevel=6) as fout:
        for piece in pieces:
            if isinstance(piece, Path):
                with open(piece, "rb") as fin:
                    shutil.copyfileobj(fin, fout, length=4 * 2**20)
            else:
                fout.write(piece)


def _activities() -> list[ProfilerActivity]:
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _check_rank(rank: int) -> None:
    """The file name and ``distributedInfo.rank`` must agree, or the analysis mixes ranks up."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != rank:
        raise ValueError(
            f"rank {rank} given, but torch.distributed says this process is rank {dist.get_rank()}"
        )
