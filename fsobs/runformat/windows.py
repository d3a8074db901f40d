"""Live runs: profiling windows published one by one, and capture requests (no torch).

A job profiled on a schedule (``ProfilerConfig(every=N)``) or on request (``fsobs capture``)
publishes each window into its own folder as the window closes, never rewriting an older one,
so a day-long run costs each window only itself::

    <run>/
      capture.json                    the latest capture request (:class:`CaptureRequest`)
      windows/
        w00000102/                    one window, named by its first recorded step
          rank<R>.trace.json.gz       rank R's trace of the window's steps
          window.rank<R>.json         rank R's note (:class:`WindowNote`), written after its
                                      trace: the rank has published the window once it exists
          run.json, steps.rank<R>.jsonl   the run's metadata and the window's sidecar lines,
                                      written by the indexer once every rank published
                                      (:mod:`fsobs.live.index`): the folder is then a run
                                      of its own, ``fsobs analyze`` reads it
          summary.json                the indexer's summary of the window (the run's index)

**Capture.** ``capture.json`` names the first step to record (``start_step``, chosen by the
requester ahead of the job's progress), the number of steps and an id. Each rank looks at the
file's modification time at every step boundary (one ``stat``: no collective, no read on steps
without a new request) and plans the window when the request is new to it, so every rank
records the same steps. A rank that sees a request only after its warm-up step should have
begun cannot record it: it notes so in ``window.rank<R>.json`` (``missed``) instead of a trace.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsobs.errors import TraceFormatError
from fsobs.runformat.atomic import write_atomic
from fsobs.runformat.bounded import read_limited
from fsobs.runformat.names import (
    CAPTURE_JSON,
    NOTE_RE,
    SCHEDULE_JSON,
    WINDOW_RE,
    WINDOWS_DIR,
    note_file_name,
)
from optim.errors import FieldError

TRIGGERS = ("schedule", "capture")
MAX_SMALL_JSON = 2**20
"""The largest note, request or summary read (1 MiB)."""


def window_id(first_step: int) -> str:
    """The window's folder name: ``w`` and its first recorded step, 8 digits at least."""
    return f"w{first_step:08d}"


def window_dir(run_dir: str | Path, first_step: int) -> Path:
    return Path(run_dir) / WINDOWS_DIR / window_id(first_step)


@dataclass(kw_only=True, frozen=True)
class WindowNote:
    """What one rank says of one window: the steps it recorded and why."""

    rank: int
    first_step: int
    last_step: int
    """The last recorded step (inclusive); a window cut by the loop's end ends earlier."""
    trigger: str
    """``schedule`` or ``capture``."""
    request: str | None = None
    """The capture request's id (trigger ``capture``)."""
    closed_ns: int
    """Wall clock (ns since the epoch) when the rank published the window."""
    missed: str | None = None
    """Why the rank recorded nothing (a capture it saw too late); then it has no trace."""

    def __post_init__(self) -> None:
        for name in ("rank", "first_step", "last_step", "closed_ns"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise FieldError(name, f"must be an integer >= 0, got {value!r}")
        if self.last_step < self.first_step:
            raise FieldError("last_step", f"{self.last_step} before first_step {self.first_step}")
        if self.trigger not in TRIGGERS:
            raise FieldError("trigger", f"must be one of {TRIGGERS}, got {self.trigger!r}")
        for name in ("request", "missed"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise FieldError(name, f"must be a non-empty string or null, got {value!r}")
        if (self.request is None) != (self.trigger == "schedule"):
            raise FieldError("request", "a capture window names its request, a scheduled one none")

    @property
    def steps(self) -> range:
        return range(self.first_step, self.last_step + 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "trigger": self.trigger,
            "request": self.request,
            "closed_ns": self.closed_ns,
            "missed": self.missed,
        }

    @classmethod
    def from_json(cls, value: object) -> WindowNote:
        fields = {"rank", "first_step", "last_step", "trigger", "request", "closed_ns", "missed"}
        if not isinstance(value, dict) or set(value) != fields:
            raise ValueError(f"must be an object with exactly {sorted(fields)}")
        return cls(**value)


def write_note(run_dir: str | Path, note: WindowNote) -> Path:
    """Publish ``note`` (atomically) in its window's folder; returns its path."""
    path = window_dir(run_dir, note.first_step) / note_file_name(note.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(note.to_json(), sort_keys=True).encode())
    return path


def read_note(path: Path) -> WindowNote:
    """One ``window.rank<R>.json``; :class:`TraceFormatError` naming the file when bad."""
    value = _read_json(path, "a window note")
    try:
        note = WindowNote.from_json(value)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"bad window note: {exc}", path=path) from exc
    match = NOTE_RE.match(path.name)
    if (
        match is None
        or int(match.group(1)) != note.rank
        or path.parent.name != window_id(note.first_step)
    ):
        raise TraceFormatError(
            f"the note of rank {note.rank} for step {note.first_step} is misplaced", path=path
        )
    return note


@dataclass(kw_only=True, frozen=True)
class WindowFolder:
    """One ``windows/w<step>`` folder as listed: the notes its ranks published so far."""

    path: Path
    first_step: int
    notes: dict[int, WindowNote]
    """Rank -> its note (ranks that have published)."""
    bad: dict[str, str]
    """File name -> why it could not be read."""

    @property
    def wid(self) -> str:
        return self.path.name


def list_windows(run_dir: str | Path, skip: Container[str] = ()) -> list[WindowFolder]:
    """The run's window folders by first step, with the notes published so far (a note that
    cannot be read is listed in ``bad``, never raised: a live run is read as it is written);
    the folders named in ``skip`` are left out, their notes unread."""
    root = Path(run_dir) / WINDOWS_DIR
    if not root.is_dir():
        return []
    folders = []
    for sub in sorted(root.iterdir()):
        match = WINDOW_RE.match(sub.name)
        if match is None or sub.name in skip or not sub.is_dir() or sub.is_symlink():
            continue
        notes: dict[int, WindowNote] = {}
        bad: dict[str, str] = {}
        for file in sorted(sub.iterdir()):
            if NOTE_RE.match(file.name) is None or not file.is_file():
                continue
            try:
                note = read_note(file)
            except (TraceFormatError, OSError) as exc:
                bad[file.name] = str(exc)
                continue
            notes[note.rank] = note
        folders.append(WindowFolder(path=sub, first_step=int(match.group(1)), notes=notes, bad=bad))
    return sorted(folders, key=lambda w: w.first_step)


def published_ranks(run_dir: str | Path) -> set[int]:
    """The ranks that published at least one live window of the run."""
    return {r for w in list_windows(run_dir) for r, note in w.notes.items() if note.missed is None}


@dataclass(kw_only=True, frozen=True)
class CaptureRequest:
    """``capture.json``: record steps ``start_step`` .. ``start_step + steps - 1``."""

    id: str
    start_step: int
    steps: int
    requested_ns: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or re.fullmatch(r"[0-9a-z-]{1,64}", self.id) is None:
            raise FieldError("id", f"must be 1-64 of [0-9a-z-], got {self.id!r}")
        for name, low in (("start_step", 1), ("steps", 1), ("requested_ns", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise FieldError(name, f"must be an integer >= {low}, got {value!r}")

    @classmethod
    def new(cls, start_step: int, steps: int) -> CaptureRequest:
        stamp = time.time_ns()
        return cls(
            id=f"c{stamp // 10**9}-{secrets.token_hex(3)}",
            start_step=start_step,
            steps=steps,
            requested_ns=stamp,
        )

    @property
    def last_step(self) -> int:
        return self.start_step + self.steps - 1

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "start_step": self.start_step,
            "steps": self.steps,
            "requested_ns": self.requested_ns,
        }

    @classmethod
    def from_json(cls, value: object) -> CaptureRequest:
        fields = {"id", "start_step", "steps", "requested_ns"}
        if not isinstance(value, dict) or set(value) != fields:
            raise ValueError(f"must be an object with exactly {sorted(fields)}")
        return cls(**value)


def write_capture(run_dir: str | Path, request: CaptureRequest) -> Path:
    """Publish ``request`` as the run's ``capture.json`` (atomically, replacing an older one)."""
    path = Path(run_dir) / CAPTURE_JSON
    write_atomic(path, json.dumps(request.to_json(), sort_keys=True).encode())
    return path


def read_capture(run_dir: str | Path) -> CaptureRequest | None:
    """The run's capture request, None when it has none; :class:`TraceFormatError` when bad."""
    path = Path(run_dir) / CAPTURE_JSON
    if not path.is_file():
        return None
    value = _read_json(path, "a capture request")
    try:
        return CaptureRequest.from_json(value)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"bad capture request: {exc}", path=path) from exc


def _read_json(path: Path, what: str) -> object:
    data = read_limited(path, MAX_SMALL_JSON, what)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{what} that is no JSON: {exc}", path=path) from exc


@dataclass(kw_only=True, frozen=True)
class WindowSchedule:
    """``windows/schedule.json``: when the job profiles (rank 0 writes it as profiling starts).

    Cycle ``k`` spans steps ``k·every`` .. ``(k+1)·every - 1``: ``wait`` idle steps, ``warmup``
    steps traced and discarded, then ``active`` recorded steps, the window; ``every == 0``: no
    scheduled window, only captures. A capture of ``K`` steps from ``S`` is moved past any
    scheduled window it (or its warm-up step) would overlap (:meth:`place`): every rank places
    it the same, whenever it saw the request."""

    every: int
    wait: int
    warmup: int
    active: int

    def __post_init__(self) -> None:
        for name, low in (("every", 0), ("wait", 0), ("warmup", 1), ("active", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise FieldError(name, f"must be an integer >= {low}, got {value!r}")
        if self.every and self.every < self.wait + self.warmup + self.active:
            raise FieldError(
                "every",
                f"a cycle of {self.every} steps cannot hold wait + warmup + active "
                f"({self.wait} + {self.warmup} + {self.active})",
            )

    def scheduled(self, first: int, last: int) -> list[tuple[int, int]]:
        """The scheduled windows (first, last recorded step) that overlap steps first..last."""
        if not self.every:
            return []
        lead = self.wait + self.warmup
        out = []
        for k in range(max(0, (first - lead - self.active) // self.every), last // self.every + 1):
            start = k * self.every + lead
            end = start + self.active - 1
            if end >= first and start <= last:
                out.append((start, end))
        return out

    def place(
        self, start_step: int, steps: int, taken: Sequence[tuple[int, int]] = ()
    ) -> tuple[int, int]:
        """The steps a capture of ``steps`` from ``start_step`` records: moved past the
        windows in ``taken`` (earlier captures) and the scheduled window it would begin in
        (warm-up steps included). Scheduled windows that begin later give way to it
        (:meth:`gives_way`)."""
        start, lead = start_step, self.warmup
        while True:
            span = (start - lead, start + steps - 1)
            clash = [w for w in taken if w[0] - lead <= span[1] and w[1] >= span[0]]
            clash += [
                w
                for w in self.scheduled(span[0], span[0] + lead)
                if w[0] - lead <= span[0] <= w[1] and not self.gives_way(w, taken)
            ]
            if not clash:
                return start, start + steps - 1
            start = max(end for _, end in clash) + 1 + lead

    def gives_way(self, window: tuple[int, int], captures: Sequence[tuple[int, int]]) -> bool:
        """Whether the scheduled ``window`` is dropped for one of the ``captures`` (placed by
        :meth:`place`): they overlap, warm-up steps included."""
        lead = self.warmup
        return any(c[0] - lead <= window[1] and c[1] >= window[0] - lead for c in captures)

    def to_json(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "wait": self.wait,
            "warmup": self.warmup,
            "active": self.active,
        }

    @classmethod
    def from_json(cls, value: object) -> WindowSchedule:
        if not isinstance(value, dict) or set(value) != {"every", "wait", "warmup", "active"}:
            raise ValueError("must be an object with exactly active, every, wait, warmup")
        return cls(**value)


def write_schedule(run_dir: str | Path, schedule: WindowSchedule) -> None:
    path = Path(run_dir) / WINDOWS_DIR / SCHEDULE_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(schedule.to_json(), sort_keys=True).encode())


def read_schedule(run_dir: str | Path) -> WindowSchedule | None:
    """The run's schedule, None when the job profiles no live windows."""
    path = Path(run_dir) / WINDOWS_DIR / SCHEDULE_JSON
    if not path.is_file():
        return None
    value = _read_json(path, "a window schedule")
    try:
        return WindowSchedule.from_json(value)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"bad window schedule: {exc}", path=path) from exc
