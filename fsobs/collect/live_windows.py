"""The live windows of one rank: the schedule, capture requests, and each window's files.

:class:`~fsobs.collect.profiler.StepProfiler` hands torch's profiler :meth:`LiveWindows.action`
as its schedule and calls :meth:`LiveWindows.poll` at every step boundary, before torch asks
for the next step's action: one ``stat`` of ``capture.json`` (no collective, no read unless the
file changed). A new request is placed by the rule every rank shares
(:meth:`~fsobs.runformat.windows.WindowSchedule.place`, past the scheduled windows and the
captures planned before it), so the ranks record the same steps whenever each saw it, as
long as it saw it before the first of them began; a rank that saw it too late publishes a
note saying so (``missed``) instead. Each window is published when it closes, trace first
(``windows/w<step>/rank<R>.trace.json.gz``), then the rank's note.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsobs.errors import FsobsError
from fsobs.runformat.names import CAPTURE_JSON, trace_file_name
from fsobs.runformat.windows import (
    WindowNote,
    WindowSchedule,
    read_capture,
    window_dir,
    write_note,
    write_schedule,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

WriteTrace = Callable[["torch.profiler.profile", Path], None]


@dataclass(frozen=True)
class _Window:
    first: int
    last: int
    request: str | None

    @property
    def trigger(self) -> str:
        return "schedule" if self.request is None else "capture"


class LiveWindows:
    """One rank's live windows (module docstring)."""

    def __init__(
        self, run_dir: Path, rank: int, schedule: WindowSchedule, write_trace: WriteTrace
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.schedule = schedule
        self._write_trace = write_trace
        self._captures: list[_Window] = []
        self._seen: set[str] = set()
        self._mtime_ns: int | None = None
        self._recording: _Window | None = None
        self._next_step = 0
        """The first step torch has not asked about yet."""
        self.num_published = 0
        """Windows this rank has published."""

    def start(self) -> None:
        """Profiling begins: rank 0 writes the schedule; a request already there is read."""
        if self.rank == 0:
            write_schedule(self.run_dir, self.schedule)
        self.poll(0)

    def window_of(self, step: int) -> _Window | None:
        """The window recording ``step``, if any."""
        for capture in self._captures:
            if capture.first <= step <= capture.last:
                return capture
        taken = [(c.first, c.last) for c in self._captures]
        for first, last in self.schedule.scheduled(step, step):
            if not self.schedule.gives_way((first, last), taken):
                return _Window(first, last, None)
        return None

    def action(self, step: int) -> Any:
        """torch's ``ProfilerAction`` for ``step`` (the profiler's schedule callable)."""
        from torch.profiler import ProfilerAction

        self._next_step = max(self._next_step, step + 1)
        window = self.window_of(step)
        if window is not None:
            self._recording = window
            return ProfilerAction.RECORD_AND_SAVE if step == window.last else ProfilerAction.RECORD
        for ahead in range(1, self.schedule.warmup + 1):
            coming = self.window_of(step + ahead)
            if coming is not None and coming.first == step + ahead:
                return ProfilerAction.WARMUP
        return ProfilerAction.NONE

    def poll(self, next_step: int) -> None:
        """Look for a new capture request before torch asks for ``next_step``'s action; a
        request that cannot be read is logged and left (profiling never breaks training)."""
        try:
            mtime = os.stat(self.run_dir / CAPTURE_JSON).st_mtime_ns
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("rank %d: cannot look at %s: %s", self.rank, CAPTURE_JSON, exc)
            return
        if mtime == self._mtime_ns:
            return
        self._mtime_ns = mtime
        try:
            request = read_capture(self.run_dir)
        except (FsobsError, OSError) as exc:
            logger.warning("rank %d: capture request ignored: %s", self.rank, exc)
            return
        if request is None or request.id in self._seen:
            return
        self._seen.add(request.id)
        taken = [(c.first, c.last) for c in self._captures]
        first, last = self.schedule.place(request.start_step, request.steps, taken)
        window = _Window(first, last, request.id)
        if first < max(next_step, self._next_step):
            why = f"rank {self.rank} saw the request at step {next_step}, after step {first}"
            self._note(window, first, missed=why)
            logger.warning("capture %s missed: %s", request.id, why)
        else:
            self._captures.append(window)
            logger.info("rank %d: capture %s: steps %d-%d", self.rank, request.id, first, last)

    def export(self, prof: torch.profiler.profile, *, stopping: bool) -> None:
        """torch's window is ready: publish its trace, then the note. ``stopping``: the
        profiler stops mid-window (the loop ended): a live window is whole or not at all, so
        it is dropped (a capture's gets a note saying so)."""
        window, self._recording = self._recording, None
        if window is None:
            raise RuntimeError("a window closed that was never recorded")
        if stopping:
            if window.request is not None:
                self._note(window, window.last, missed=f"the loop ended in step {prof.step_num}")
            return
        folder = window_dir(self.run_dir, window.first)
        folder.mkdir(parents=True, exist_ok=True)
        self._write_trace(prof, folder / trace_file_name(self.rank))
        self._note(window, window.last)
        self.num_published += 1

    def _note(self, window: _Window, last: int, missed: str | None = None) -> None:
        note = WindowNote(
            rank=self.rank,
            first_step=window.first,
            last_step=last,
            trigger=window.trigger,
            request=window.request,
            closed_ns=time.time_ns(),
            missed=missed,
        )
        write_note(self.run_dir, note)
