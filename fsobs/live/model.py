"""What a live view knows of a run at one moment (:class:`LiveState`), as plain frozen data.

Made by :class:`fsobs.live.state.LiveRun` (``poll()``); read by ``fsobs watch`` (terminal, JSON,
Prometheus) and the dashboard. ``to_json()`` is the ``fsobs watch --once --json`` object."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("running", "complete", "stopped")
WINDOW_STATES = ("closed", "pending", "missing", "bad")
"""``closed``: every rank published it and it is analyzed (no summary when the reader does not
index); ``pending``: some rank has not
published it yet; ``missing``: every rank is well past it and some never published (or a
capture some rank missed); ``bad``: published, but it could not be analyzed (``error``)."""


@dataclass(kw_only=True, frozen=True)
class RankProgress:
    """One rank's step sidecar as it grows."""

    rank: int
    num_steps: int
    """Lines read so far."""
    last_step: int | None
    step_ms: float | None
    """Median wall time of its recent steps (``LiveConfig.recent_steps``)."""
    last_ms: float | None
    """Wall time of its last step."""
    est_cost: float | None
    """Mean estimated cost of its recent steps (null without a cost model)."""
    gc_ms: float | None
    """Mean GC pause per recent step (null without the pause fields)."""
    idle_s: float
    """Seconds since its sidecar last grew."""
    closed: bool
    """Its sidecar is published (the rank closed it, or the run was finalized)."""


@dataclass(kw_only=True, frozen=True)
class WindowSummary:
    """One closed window, analyzed once (``summary.json``): means per step over its steps."""

    num_steps: int
    step_ms: float
    """Mean step time (each step's longest window over the ranks)."""
    bubble_ratio: float
    bubble_ms_per_step: float
    classes_ms_per_step: dict[str, float]
    """Bubble class -> ms per (rank, step) (the KPIs' ``<class>_ms_per_step``)."""
    straggler: int | None
    """The window's culprit (the most frequent straggler), None without one."""
    straggler_wait_ms_per_step: float
    late_steps: dict[int, int]
    """Rank -> the steps of the window it was the straggler in."""
    causes: dict[str, float]
    """Cause (``data``, ``gc``, ``preemption``, ``unexplained``) -> share of the straggler
    wait; empty when the sidecars cannot split it."""
    imbalance_before: float | None
    imbalance_after: float | None
    """Means over the window's steps of the sidecars' ``imbalance_*`` (null without them)."""
    analyzed_ns: int

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["late_steps"] = {str(k): v for k, v in self.late_steps.items()}
        return _finite(out)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> WindowSummary:
        value = dict(value)
        value["late_steps"] = {int(k): int(v) for k, v in value["late_steps"].items()}
        for key in ("step_ms", "bubble_ratio", "bubble_ms_per_step", "straggler_wait_ms_per_step"):
            value[key] = math.nan if value[key] is None else float(value[key])
        return cls(**value)


@dataclass(kw_only=True, frozen=True)
class WindowEntry:
    """One window of the run's index."""

    wid: str
    first_step: int
    last_step: int
    trigger: str
    """``schedule`` or ``capture`` (of the ranks that published it)."""
    request: str | None
    state: str
    published: tuple[int, ...]
    """Ranks that published it."""
    missed: dict[int, str] = field(default_factory=dict)
    """Rank -> why it recorded nothing (a capture seen too late)."""
    summary: WindowSummary | None = None
    error: str | None = None
    """Why a ``bad`` window could not be analyzed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "wid": self.wid,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "trigger": self.trigger,
            "request": self.request,
            "state": self.state,
            "published": list(self.published),
            "missed": {str(k): v for k, v in self.missed.items()},
            "summary": None if self.summary is None else self.summary.to_json(),
            "error": self.error,
        }


@dataclass(kw_only=True, frozen=True)
class Alert:
    """One alert rule's state (:mod:`fsobs.live.alerts`): every rule is always listed, firing
    or not, so that a scraper sees it go back to 0."""

    name: str
    """The rule: ``bubble_ratio_up``, ``straggler_wait_up``, ``late_rank``, ``gc_storm``,
    ``window_missing``."""
    firing: bool
    message: str
    """One line for people: what, where, since when, from what evidence."""
    rank: int | None = None
    window: str | None = None
    cause: str | None = None
    """For ``late_rank``: ``data`` (its samples cost more) or ``node`` (the same data, slower:
    GC, preemption, the machine) or ``unexplained``."""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _finite(asdict(self))


@dataclass(kw_only=True, frozen=True)
class LateRank:
    """The rank late in most recent steps, from the recent closed windows (the ``late_rank``
    rule's evidence, :mod:`fsobs.live.alerts`)."""

    rank: int
    share: float
    """Of the recent windows' steps with a straggler, those where it was the one."""
    cause: str | None
    """``data``, ``node`` or ``unexplained`` once the rule fires (its share reached
    ``late_share``), else None."""


@dataclass(kw_only=True, frozen=True)
class LiveState:
    """The run at one poll."""

    run: str
    name: str | None
    status: str
    """``running``, ``complete`` or ``stopped`` (:data:`STATUSES`)."""
    reason: str | None
    """Why it stopped (``run.json``'s reason, or "no sidecar grew for ...")."""
    idle_s: float | None
    """Seconds since any sidecar last grew (before the first: since run.json was written; how
    long ago a stopped run stopped); None when neither exists."""
    world_size: int | None
    step: int | None
    """The last step every rank has ended (the slowest rank's last step)."""
    ranks: tuple[RankProgress, ...]
    imbalance_before: float | None
    imbalance_after: float | None
    """Recent means of the sidecars' max / mean estimated cost under the random split and the
    split used (null without them)."""
    late_rank: LateRank | None
    windows: tuple[WindowEntry, ...]
    alerts: tuple[Alert, ...]
    capture: dict[str, Any] | None
    """The latest capture request and what became of it: ``id``, ``start_step``, ``steps``,
    ``window`` (its folder, once some rank published it), ``state``."""
    polled_ns: int

    @property
    def closed_windows(self) -> tuple[WindowEntry, ...]:
        return tuple(w for w in self.windows if w.state == "closed")

    @property
    def firing(self) -> tuple[Alert, ...]:
        return tuple(a for a in self.alerts if a.firing)

    def to_json(self) -> dict[str, Any]:
        return _finite(
            {
                "run": self.run,
                "name": self.name,
                "status": self.status,
                "reason": self.reason,
                "idle_s": self.idle_s,
                "world_size": self.world_size,
                "step": self.step,
                "ranks": [asdict(r) for r in self.ranks],
                "imbalance_before": self.imbalance_before,
                "imbalance_after": self.imbalance_after,
                "late_rank": None if self.late_rank is None else asdict(self.late_rank),
                "windows": [w.to_json() for w in self.windows],
                "alerts": [a.to_json() for a in self.alerts],
                "capture": self.capture,
                "polled_ns": self.polled_ns,
            }
        )


def ago(seconds: float) -> str:
    """``seconds`` for people: ``45 s``, ``3 min``, ``2 h 5 min`` (``-`` when unknown: a
    sidecar never seen is idle for ever)."""
    if not math.isfinite(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def _finite(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with every non-finite float as None (strict JSON)."""
    out: dict[str, Any] = _finite_value(value)
    return out


def _finite_value(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_value(v) for v in value]
    return value
