"""Alert rules from evidence: the run's own earlier windows and its recent steps.

``evaluate(windows, recent, config)`` returns one :class:`~fsobs.live.model.Alert` per rule,
firing or not, in :data:`RULES` order. Only closed windows (analyzed, with a summary) count:

1. ``bubble_ratio_up`` / ``straggler_wait_up``: the latest closed window's value is at least
   ``threshold`` times the median of the earlier closed windows' values, once there are
   ``min_windows`` earlier ones with a value (a run is compared with itself, no absolute bar);
2. ``late_rank``: over the last ``recent_windows`` closed windows (once there are that many),
   one rank was the straggler in at least ``late_share`` of the steps that had one. Its cause:
   ``data`` when the windows it was the culprit of put at least ``data_share`` of their wait on
   the data, or its recent mean ``est_cost`` is ``cost_margin`` times the other ranks' median;
   else ``node`` (GC, preemption or unexplained: the same data, slower); ``unexplained`` with
   neither evidence;
3. ``gc_storm``: a rank's GC pauses over the recent steps are at least ``gc_share`` of its
   wall time over them;
4. ``window_missing``: some window is ``missing`` (every rank is past it, some never published
   it, or one saw its capture too late).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fsobs.live.model import Alert, WindowEntry, WindowSummary

RULES = ("bubble_ratio_up", "straggler_wait_up", "late_rank", "gc_storm", "window_missing")
_NODE_CAUSES = ("gc", "preemption", "unexplained")
_CAUSES = ("data", *_NODE_CAUSES)
"""The causes of :mod:`fsobs.analysis.stragglers.causes`."""


@dataclass(kw_only=True, frozen=True)
class AlertConfig:
    """Thresholds of the rules (``fsobs watch --alert-*`` flags)."""

    threshold: float = 1.5
    """A window's bubble ratio (straggler wait) fires at this many times the median of the
    run's earlier closed windows."""
    min_windows: int = 3
    """Earlier closed windows needed before a window is compared with them."""
    recent_windows: int = 3
    """Closed windows that make "recent" for ``late_rank`` (it waits for that many)."""
    late_share: float = 0.6
    """``late_rank`` fires when one rank was the straggler in this share of the recent
    windows' steps with a straggler."""
    gc_share: float = 0.1
    """``gc_storm`` fires when a rank's GC pauses take this share of its recent step time."""
    data_share: float = 0.5
    """``late_rank``'s cause is ``data`` when the data cause is this share of the wait of the
    recent windows the rank was the culprit of..."""
    cost_margin: float = 1.2
    """...or when its recent mean ``est_cost`` is this many times the other ranks' median."""

    def __post_init__(self) -> None:
        for name in ("threshold", "cost_margin"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("min_windows", "recent_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("late_share", "gc_share", "data_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)}")


def evaluate(
    windows: Sequence[WindowEntry], recent: pd.DataFrame, config: AlertConfig
) -> tuple[Alert, ...]:
    """Every rule's state. ``windows``: the run's index in step order; ``recent``: the recent
    sidecar rows (columns ``rank``, ``step``, ``wall_ms``, ``est_cost``, ``gc_ms``,
    ``gc_count``, ``cpu_ms``, ``nivcsw``; NaN where a line lacks one)."""
    closed = [w for w in windows if w.state == "closed" and w.summary is not None]
    alerts = (
        _rise("bubble_ratio_up", "bubble ratio", closed, _bubble_ratio, _percent, config),
        _rise("straggler_wait_up", "straggler wait", closed, _wait, _ms, config),
        _late_rank(closed[-config.recent_windows :], recent, config),
        _gc_storm(recent, config),
        _window_missing(windows, recent),
    )
    assert tuple(a.name for a in alerts) == RULES
    return alerts


def _bubble_ratio(summary: WindowSummary) -> float:
    return summary.bubble_ratio


def _wait(summary: WindowSummary) -> float:
    return summary.straggler_wait_ms_per_step


def _percent(value: float) -> str:
    return f"{value:.1%}"


def _ms(value: float) -> str:
    return f"{value:.2f} ms per step"


def _where(window: WindowEntry) -> str:
    return f"{window.wid} (steps {window.first_step}-{window.last_step})"


def _summary(window: WindowEntry) -> WindowSummary:
    assert window.summary is not None  # evaluate keeps only closed windows with a summary
    return window.summary


def _rise(
    name: str,
    what: str,
    closed: list[WindowEntry],
    value: Callable[[WindowSummary], float],
    fmt: Callable[[float], str],
    config: AlertConfig,
) -> Alert:
    """Rule 1: the latest closed window against the median of the earlier ones."""
    if not closed:
        return Alert(name=name, firing=False, message=f"{what}: no closed window yet")
    latest = closed[-1]
    current = value(_summary(latest))
    if not math.isfinite(current):
        message = f"{what}: none measured in {_where(latest)}"
        return Alert(name=name, firing=False, message=message, window=latest.wid)
    earlier = [v for v in (value(_summary(w)) for w in closed[:-1]) if math.isfinite(v)]
    head = f"{what} {fmt(current)} in {_where(latest)}"
    if len(earlier) < config.min_windows:
        message = f"{head}: {len(earlier)} earlier window(s), {config.min_windows} needed"
        return Alert(name=name, firing=False, message=message, window=latest.wid)
    baseline = statistics.median(earlier)
    firing = current > 0 and current >= config.threshold * baseline
    ratio = current / baseline if baseline > 0 else math.inf
    times = f"{ratio:.2f}x" if baseline > 0 else "above"
    message = f"{head}, {times} the median {fmt(baseline)} of the {len(earlier)} earlier windows"
    if not firing:
        message += f" (fires at {config.threshold:g}x)"
    evidence = {"value": current, "baseline": baseline, "ratio": ratio, "earlier": len(earlier)}
    return Alert(name=name, firing=firing, message=message, window=latest.wid, evidence=evidence)


def _late_rank(
    recent_windows: list[WindowEntry], recent: pd.DataFrame, config: AlertConfig
) -> Alert:
    """Rule 2: the rank late in most recent steps, and whether its data or its node made it."""
    name = "late_rank"
    if len(recent_windows) < config.recent_windows:
        message = (
            f"late rank: {len(recent_windows)} closed window(s), {config.recent_windows} needed"
        )
        return Alert(name=name, firing=False, message=message)
    counts: Counter[int] = Counter()
    for window in recent_windows:
        counts.update(_summary(window).late_steps)
    total = sum(counts.values())
    if not total:
        return Alert(name=name, firing=False, message="no straggler in the recent windows")
    rank, late = counts.most_common(1)[0]
    share = late / total
    first, last = recent_windows[0], recent_windows[-1]
    span = _where(first)
    if len(recent_windows) > 1:
        span = f"{first.wid}..{last.wid} (steps {first.first_step}-{last.last_step})"
    head = f"rank {rank} was the straggler in {late} of the {total} steps with one ({share:.0%})"
    evidence: dict[str, Any] = {"rank": rank, "share": share, "late_steps": late, "steps": total}
    if share < config.late_share:
        message = f"no rank late in most recent steps: {head} of {span}"
        message += f" (fires at {config.late_share:.0%})"
        return Alert(name=name, firing=False, message=message, evidence=evidence)
    cause, why, more = _cause(rank, recent_windows, recent, config)
    message = f"{head} of {span}; cause {cause}: {why}"
    evidence |= more
    return Alert(
        name=name,
        firing=True,
        message=message,
        rank=rank,
        window=recent_windows[-1].wid,
        cause=cause,
        evidence=evidence,
    )


def _cause(
    rank: int, windows: list[WindowEntry], recent: pd.DataFrame, config: AlertConfig
) -> tuple[str, str, dict[str, Any]]:
    """``late_rank``'s cause, the evidence that decided it in words, and its numbers."""
    shares = _culprit_causes(rank, windows)
    ratio = _cost_ratio(rank, recent)
    evidence = {"causes": shares, "est_cost_ratio": ratio}
    if shares is None and ratio is None:
        why = "no causes in its windows, no est_cost in its recent steps"
        return "unexplained", why, evidence
    cost = None if ratio is None else f"its recent est_cost {ratio:.2f}x the other ranks' median"
    if shares is not None and shares["data"] >= config.data_share:
        return "data", f"the data caused {shares['data']:.0%} of its windows' wait", evidence
    if cost is not None and ratio is not None and ratio >= config.cost_margin:
        return "data", cost, evidence
    parts = [] if cost is None else [cost]
    if shares is not None:
        split = ", ".join(f"{c} {shares[c]:.0%}" for c in _NODE_CAUSES)
        parts.insert(0, f"{split} of its wait (data {shares['data']:.0%})")
    return "node", ", ".join(parts), evidence


def _culprit_causes(rank: int, windows: list[WindowEntry]) -> dict[str, float] | None:
    """The causes' shares of the wait of the windows ``rank`` was the culprit of, weighted by
    their wait; None when none of them splits its wait."""
    weights: list[float] = []
    causes: list[dict[str, float]] = []
    for window in windows:
        summary = _summary(window)
        wait = summary.straggler_wait_ms_per_step * summary.num_steps
        # null (read back from JSON) or NaN where a window could not split its wait
        values = [summary.causes.get(c) for c in _CAUSES]
        known = all(isinstance(v, int | float) and math.isfinite(v) for v in values)
        if summary.straggler == rank and known and math.isfinite(wait) and wait > 0:
            weights.append(wait)
            causes.append({c: float(v or 0.0) for c, v in zip(_CAUSES, values, strict=True)})
    if not weights:
        return None
    total = sum(weights)
    return {
        c: sum(w * k[c] for w, k in zip(weights, causes, strict=True)) / total for c in causes[0]
    }


def _cost_ratio(rank: int, recent: pd.DataFrame) -> float | None:
    """``rank``'s mean ``est_cost`` over the recent steps / the median of the other ranks'
    means; None without them."""
    if recent.empty or "est_cost" not in recent:
        return None
    means = recent.dropna(subset=["est_cost"]).groupby("rank")["est_cost"].mean()
    others = means.drop(rank, errors="ignore")
    if rank not in means.index or others.empty or not others.median() > 0:
        return None
    return float(means[rank] / others.median())


def _gc_storm(recent: pd.DataFrame, config: AlertConfig) -> Alert:
    """Rule 3: the rank whose GC pauses took the largest share of its recent wall time."""
    name = "gc_storm"
    rows = recent.dropna(subset=["gc_ms", "wall_ms"]) if not recent.empty else recent
    if rows.empty:
        return Alert(name=name, firing=False, message="no GC pauses recorded in the recent steps")
    per_rank = rows.groupby("rank")[["gc_ms", "wall_ms", "gc_count"]].sum()
    per_rank = per_rank[per_rank["wall_ms"] > 0]
    if per_rank.empty:
        return Alert(name=name, firing=False, message="no wall time in the recent steps")
    shares = per_rank["gc_ms"] / per_rank["wall_ms"]
    rank = int(shares.idxmax())
    share = float(shares[rank])
    steps = f"steps {int(rows['step'].min())}-{int(rows['step'].max())}"
    gc_ms, count = float(per_rank["gc_ms"][rank]), int(per_rank["gc_count"][rank])
    evidence = {"share": share, "gc_ms": gc_ms, "gc_count": count}
    if share < config.gc_share:
        message = (
            f"no GC storm: GC took at most {share:.1%} of a rank's wall time (rank {rank}) "
            f"in {steps} (fires at {config.gc_share:.0%})"
        )
        return Alert(name=name, firing=False, message=message, evidence=evidence)
    message = (
        f"rank {rank}: GC took {share:.0%} of its wall time in {steps} "
        f"({count} collections, {gc_ms:.1f} ms)"
    )
    return Alert(name=name, firing=True, message=message, rank=rank, evidence=evidence)


def _window_missing(windows: Sequence[WindowEntry], recent: pd.DataFrame) -> Alert:
    """Rule 4: the missing windows, and the ranks that did not publish them (of the ranks seen
    in any window or in the recent steps)."""
    name = "window_missing"
    missing = [w for w in windows if w.state == "missing"]
    if not missing:
        return Alert(name=name, firing=False, message="no window missing")
    seen = {int(r) for r in recent["rank"]} if "rank" in recent else set()
    for window in windows:
        seen |= set(window.published) | set(window.missed)
    texts, evidence, absent_all = [], {}, set()
    for window in missing:
        absent = sorted(seen - set(window.published) - set(window.missed))
        absent_all |= set(absent) | set(window.missed)
        said = [f"{_ranks(absent)} did not publish it"] if absent else []
        said += [f"rank {r} missed it ({why})" for r, why in sorted(window.missed.items())]
        texts.append(f"{_where(window)}: {', '.join(said) or 'not published'}")
        evidence[window.wid] = {
            "absent": absent,
            "missed": {str(k): v for k, v in window.missed.items()},
        }
    head = "window" if len(missing) == 1 else f"{len(missing)} windows"
    return Alert(
        name=name,
        firing=True,
        message=f"{head} missing: " + "; ".join(texts),
        rank=min(absent_all) if len(absent_all) == 1 else None,
        window=missing[-1].wid,
        evidence=evidence,
    )


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
