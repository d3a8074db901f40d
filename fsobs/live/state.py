"""The incremental reader of a live run: :class:`LiveRun`, whose ``poll()`` is a :class:`LiveState`.

Each poll reads what is new and nothing else: the bytes the sidecars grew by
(:mod:`fsobs.live.sidecar_tail`), the window folders' notes, and each newly closed window once
(:mod:`fsobs.live.index`; later polls and later readers take its ``summary.json``).

**Status.** ``complete`` when ``run.json`` says so; ``stopped`` when it says ``incomplete`` for
another reason than ``running`` (a launcher saw a rank die, a recorder failed), or when no
sidecar grew for ``stale_after_s`` (default: the larger of 120 s and 30 recent steps), which
says how long ago; else ``running``.

**Windows.** ``closed`` once every rank published it and it is analyzed (without a summary
when the reader does not index, ``LiveConfig.index``); ``pending`` while some
rank has not (shown as pending, never as a smaller run); ``missing`` when some rank recorded
nothing (its note says why), or every rank that lacks it is 2 steps past it (a rank publishes
a window before it ends the step after it), or the run stopped without it. A scheduled window
that no rank published at all is listed too, ``missing``, from ``windows/schedule.json``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsobs.errors import FsobsError, RunError
from fsobs.live.alerts import AlertConfig, evaluate
from fsobs.live.index import analyze_window, read_summary
from fsobs.live.model import (
    Alert,
    LateRank,
    LiveState,
    RankProgress,
    WindowEntry,
    ago,
)
from fsobs.live.sidecar_tail import SidecarTail, StepRow
from fsobs.runformat.files import run_files
from fsobs.runformat.names import RUN_JSON
from fsobs.runformat.runmeta import RunMeta, read_run_meta
from fsobs.runformat.windows import (
    WindowFolder,
    WindowSchedule,
    list_windows,
    read_capture,
    read_schedule,
    window_id,
)

RUNNING = "running"
"""``run.json``'s reason while the job runs."""
PAST = 2
"""Steps past a window after which a rank that has not published it never will."""
_RECENT_COLUMNS = ("est_cost", "gc_ms", "gc_count", "cpu_ms", "nivcsw")


@dataclass(kw_only=True, frozen=True)
class LiveConfig:
    """How a live run is read."""

    stale_after_s: float | None = None
    """No sidecar growth for this long: stopped. None: max(120 s, 30 recent steps)."""
    alerts: AlertConfig = field(default_factory=AlertConfig)
    recent_steps: int = 50
    """Steps per rank that make "recent" (step time, costs, GC)."""
    index: bool = True
    """Analyze closed windows (False: list them only)."""

    def __post_init__(self) -> None:
        if self.stale_after_s is not None and not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s: must be > 0, got {self.stale_after_s!r}")
        if type(self.recent_steps) is not int or self.recent_steps < 1:
            raise ValueError(f"recent_steps: must be an integer >= 1, got {self.recent_steps!r}")


class LiveRun:
    """A run read while it is written (module docstring). ``FsobsError`` (one line) when
    ``run_dir`` is no run: neither ``run.json`` nor a step sidecar."""

    def __init__(self, run_dir: str | Path, config: LiveConfig | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.config = config or LiveConfig()
        check_run(self.run_dir)
        self._tails: dict[int, SidecarTail] = {}
        self._recent: dict[int, deque[StepRow]] = {}
        self._num_rows: dict[int, int] = {}
        self._by_step: dict[int, list[float]] = {}
        """step -> [max wall ms over the ranks read, imbalance_before, imbalance_after]."""
        self._closed: dict[str, WindowEntry] = {}
        """Closed windows by folder name: never read again."""
        self._errors: dict[str, str] = {}
        self._meta: tuple[int, RunMeta | None] | None = None

    def poll(self) -> LiveState:
        """The run now; reads only what is new since the last poll."""
        now = time.time_ns()
        meta = self._read_meta()
        world_size = meta.world_size if meta and meta.world_size else None
        ranks = range(world_size) if world_size else self._sidecar_ranks()
        for rank in ranks:
            self._read_rank(rank)
        progress = tuple(self._progress(rank, now) for rank in sorted(self._tails))
        idle = min((p.idle_s for p in progress), default=math.inf)
        if math.isinf(idle) and self._meta is not None:  # no sidecar yet: since run.json
            idle = max(0.0, (now - self._meta[0]) / 1e9)
        status, reason = _status(meta, idle, self._stale_after(progress))
        step = min((p.last_step for p in progress if p.last_step is not None), default=None)
        if world_size and len([p for p in progress if p.last_step is not None]) < world_size:
            step = None
        windows = self._windows(meta, world_size or len(progress), status, now)
        alerts = evaluate(windows, self._recent_frame(), self.config.alerts)
        return LiveState(
            run=str(self.run_dir),
            name=meta.name if meta else self.run_dir.name,
            status=status,
            reason=reason,
            idle_s=None if math.isinf(idle) else idle,
            world_size=world_size or (len(progress) or None),
            step=step,
            ranks=progress,
            imbalance_before=self._recent_mean(1),
            imbalance_after=self._recent_mean(2),
            late_rank=_late_rank(alerts),
            windows=windows,
            alerts=alerts,
            capture=self._capture(windows, progress),
            polled_ns=now,
        )

    def trend(self) -> pd.DataFrame:
        """Per step read so far (the first poll starts near the sidecars' ends): ``step``,
        ``step_ms`` (the longest wall time over the ranks), ``imbalance_before``,
        ``imbalance_after``."""
        rows = [(s, *v) for s, v in sorted(self._by_step.items())]
        return pd.DataFrame(
            rows, columns=["step", "step_ms", "imbalance_before", "imbalance_after"]
        )

    # sidecars

    def _sidecar_ranks(self) -> list[int]:
        files = run_files(self.run_dir)
        return sorted({rank for _, rank in (*files.sidecars, *files.partial_sidecars)})

    def _read_rank(self, rank: int) -> None:
        tail = self._tails.get(rank)
        if tail is None:
            tail = self._tails[rank] = SidecarTail(self.run_dir, rank, self.config.recent_steps)
            self._recent[rank] = deque(maxlen=self.config.recent_steps)
        for row in tail.read_new():
            self._recent[rank].append(row)
            self._num_rows[rank] = row.step + 1
            entry = self._by_step.setdefault(row.step, [row.wall_ms, math.nan, math.nan])
            entry[0] = max(entry[0], row.wall_ms)
            for i, key in ((1, "imbalance_before"), (2, "imbalance_after")):
                if key in row.values:
                    entry[i] = row.values[key]

    def _progress(self, rank: int, now: int) -> RankProgress:
        tail, recent = self._tails[rank], self._recent[rank]
        walls = [r.wall_ms for r in recent]
        idle = (now - tail.mtime_ns) / 1e9 if tail.mtime_ns is not None else math.inf
        return RankProgress(
            rank=rank,
            num_steps=self._num_rows.get(rank, 0),
            last_step=recent[-1].step if recent else None,
            step_ms=float(np.median(walls)) if walls else None,
            last_ms=walls[-1] if walls else None,
            est_cost=_mean(recent, "est_cost"),
            gc_ms=_mean(recent, "gc_ms"),
            idle_s=max(0.0, idle),
            closed=tail.closed,
        )

    def _stale_after(self, progress: tuple[RankProgress, ...]) -> float:
        if self.config.stale_after_s is not None:
            return self.config.stale_after_s
        times = [p.step_ms for p in progress if p.step_ms is not None]
        return max(120.0, 30 * max(times, default=0.0) / 1000)

    def _recent_frame(self) -> pd.DataFrame:
        rows = [
            {
                "rank": rank,
                "step": r.step,
                "wall_ms": r.wall_ms,
                **{k: r.values.get(k, math.nan) for k in _RECENT_COLUMNS},
            }
            for rank, recent in self._recent.items()
            for r in recent
        ]
        return pd.DataFrame(rows, columns=["rank", "step", "wall_ms", *_RECENT_COLUMNS])

    def _recent_mean(self, column: int) -> float | None:
        steps = sorted(self._by_step)[-self.config.recent_steps :]
        values = [self._by_step[s][column] for s in steps]
        values = [v for v in values if math.isfinite(v)]
        return float(np.mean(values)) if values else None

    def _read_meta(self) -> RunMeta | None:
        path = self.run_dir / RUN_JSON
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return None
        if self._meta is None or self._meta[0] != mtime:
            self._meta = (mtime, read_run_meta(path))
        return self._meta[1]

    # windows

    def _windows(
        self, meta: RunMeta | None, world_size: int, status: str, now: int
    ) -> tuple[WindowEntry, ...]:
        folders = list_windows(self.run_dir, skip=self._closed)  # closed ones stay closed
        last = {rank: (r[-1].step if r else -1) for rank, r in self._recent.items()}
        entries = [*self._closed.values()]
        entries += [self._entry(f, meta, world_size, status, last) for f in folders]
        entries += self._never_published(entries, last, world_size, status)
        return tuple(sorted(entries, key=lambda e: e.first_step))

    def _entry(
        self,
        folder: WindowFolder,
        meta: RunMeta | None,
        world_size: int,
        status: str,
        last: dict[int, int],
    ) -> WindowEntry:
        notes = folder.notes
        first_note = notes[min(notes)] if notes else None
        missed = {r: n.missed for r, n in notes.items() if n.missed is not None}
        published = tuple(sorted(r for r in notes if r not in missed))
        lacking = [r for r in range(world_size) if r not in published]
        end = max((n.last_step for n in notes.values()), default=folder.first_step)
        base: dict[str, Any] = {
            "wid": folder.wid,
            "first_step": folder.first_step,
            "last_step": end,
            "trigger": first_note.trigger if first_note else "schedule",
            "request": first_note.request if first_note else None,
            "published": published,
            "missed": missed,
        }
        if lacking:
            gone = (
                missed or status != RUNNING or all(last.get(r, -1) >= end + PAST for r in lacking)
            )
            return WindowEntry(state="missing" if gone else "pending", **base)
        if folder.wid in self._errors:
            return WindowEntry(state="bad", error=self._errors[folder.wid], **base)
        summary = read_summary(folder.path)
        if summary is None and self.config.index:
            if any(last.get(r, -1) < end for r in range(world_size)):  # its lines are not in yet
                return WindowEntry(state="pending", **base)
            try:
                lines = {r: self._tails[r].lines(folder.first_step, end) for r in published}
                summary = analyze_window(folder, meta, lines)
            except (FsobsError, OSError) as exc:
                self._errors[folder.wid] = str(exc)
                return WindowEntry(state="bad", error=str(exc), **base)
        # summary None: not indexing, published by every rank, not analyzed
        entry = self._closed[folder.wid] = WindowEntry(state="closed", summary=summary, **base)
        return entry

    def _never_published(
        self, listed: list[WindowEntry], last: dict[int, int], world_size: int, status: str
    ) -> list[WindowEntry]:
        """Scheduled windows every rank is past with no folder at all (no rank published)."""
        schedule = _schedule(self.run_dir)
        if schedule is None or not last or len(last) < world_size:
            return []
        reached = min(last.values()) - (PAST if status == RUNNING else 0)
        if reached < 0:
            return []
        have = {w.first_step for w in listed}
        captures = capture_spans(listed)
        out = []
        for first, end in schedule.scheduled(0, reached):
            if end > reached or first in have or schedule.gives_way((first, end), captures):
                continue
            out.append(
                WindowEntry(
                    wid=window_id(first),
                    first_step=first,
                    last_step=end,
                    trigger="schedule",
                    request=None,
                    state="missing",
                    published=(),
                )
            )
        return out

    def _capture(
        self, windows: tuple[WindowEntry, ...], progress: tuple[RankProgress, ...]
    ) -> dict[str, Any] | None:
        try:
            request = read_capture(self.run_dir)
        except FsobsError as exc:
            return {"error": str(exc)}
        if request is None:
            return None
        entry = next((w for w in windows if w.request == request.id), None)
        if entry is not None:
            state, wid = entry.state, entry.wid
        else:
            wid, state = None, "requested"
            schedule = _schedule(self.run_dir)
            end = request.last_step
            if schedule is not None:
                end = schedule.place(request.start_step, request.steps, capture_spans(windows))[1]
            steps = [p.last_step for p in progress if p.last_step is not None]
            if steps and min(steps) >= end + PAST:
                state = "missing"
        return {**request.to_json(), "window": wid, "state": state}


def capture_spans(windows: Sequence[WindowEntry]) -> list[tuple[int, int]]:
    """The (first, last) steps of the captured windows of a run's index: what a new capture
    is placed past (:meth:`~fsobs.runformat.windows.WindowSchedule.place`)."""
    return [(w.first_step, w.last_step) for w in windows if w.trigger == "capture"]


def check_run(run_dir: Path) -> None:
    """``RunError`` (one line) unless ``run_dir`` is a folder with a ``run.json`` or a sidecar."""
    if not run_dir.is_dir():
        raise RunError("no such run folder", path=run_dir)
    try:
        files = run_files(run_dir)
    except OSError as exc:
        raise RunError(f"cannot list the run folder: {exc.strerror or exc}", path=run_dir) from exc
    if files.run_json is None and not files.sidecars and not files.partial_sidecars:
        raise RunError("no run here (neither run.json nor a step sidecar)", path=run_dir)


def run_status(run_dir: str | Path, stale_after_s: float | None = None) -> tuple[str, str | None]:
    """``(status, reason)`` of a run, cheaply (``run.json`` and the sidecars' last lines): what
    :meth:`LiveRun.poll` says, for a list of many runs."""
    state = LiveRun(run_dir, LiveConfig(stale_after_s=stale_after_s, index=False, recent_steps=30))
    meta = state._read_meta()
    if meta is not None and meta.status == "complete":
        return "complete", None
    live = state.poll()
    return live.status, live.reason


def _status(meta: RunMeta | None, idle_s: float, stale_after: float) -> tuple[str, str | None]:
    if meta is not None and meta.status == "complete":
        return "complete", None
    if meta is not None and meta.reason not in (None, RUNNING):
        return "stopped", meta.reason
    if math.isinf(idle_s):
        return "stopped", "no step was ever recorded"
    if idle_s > stale_after:
        return "stopped", f"no step recorded for {ago(idle_s)} (the job may have died)"
    return "running", None


def _schedule(run_dir: Path) -> WindowSchedule | None:
    try:
        return read_schedule(run_dir)
    except (FsobsError, OSError):
        return None


def _mean(rows: deque[StepRow], key: str) -> float | None:
    values = [r.values[key] for r in rows if key in r.values]
    return float(np.mean(values)) if values else None


def _late_rank(alerts: tuple[Alert, ...]) -> LateRank | None:
    """The rank late in most recent steps, as the ``late_rank`` rule found it (firing or
    not); None before the rule has its windows or without a straggler."""
    rule = next((a for a in alerts if a.name == "late_rank"), None)
    if rule is None or "rank" not in rule.evidence:
        return None
    return LateRank(rank=rule.evidence["rank"], share=rule.evidence["share"], cause=rule.cause)


__all__ = ["LiveConfig", "LiveRun", "capture_spans", "check_run", "run_status"]
