"""Stragglers: who arrives last at each step's synchronising collectives, and what it costs.

For a matched collective instance with aligned arrivals ``a_r`` and last arrival ``A``, rank r
waits from ``a_r`` until ``A``; the last rank *causes* that wait::

    rank 0  a0|......wait......|xx|
    rank 1        a1|...wait...|xx|
    rank 2 (last)              A|xx|      caused = wait_0 + wait_1

The waits are the straggler_wait class itself: :mod:`fsobs.analysis.bubbles` charges every
piece of every rank's straggler_wait to one last rank (``StepBubbles.caused_ns``), so the wait
caused, summed over the culprits, equals the straggler_wait summed over the ranks, step by
step.

The straggler of a step is the rank that caused the most wait in it, when that wait is not
tiny: at least ``min_wait_ms`` and ``min_wait_share`` of the step time. Otherwise the step has
no straggler (``rank`` is null), and when two ranks caused exactly the same largest wait the
step is a tie (``rank`` null, ``tied_ranks`` lists them).

The run's verdict across steps needs several of them: with at least ``min_steps`` steps that
have a straggler it is ``stable`` when one rank is the straggler of at least ``stable_share``
of them, ``rotating`` otherwise. With fewer (one step, or a trace without steps analyzed as one
window) no pattern across steps can be seen: the verdict is ``few_steps`` and the collectives
speak instead. ``none``: no straggler and no culprit.

Whatever the number of steps, the **culprits** are the ranks that caused at least
``culprit_share`` of the run's straggler wait (and at least ``min_wait_ms``), the largest
first; per rank the report counts how often it arrived last at a collective that kept someone
waiting and what it was doing meanwhile (:mod:`fsobs.analysis.collectives.lateness`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis.collectives.lateness import LATENESS_PARTS


@dataclass(kw_only=True, frozen=True)
class StragglerConfig:
    """When a step has a straggler, and when a rank is named."""

    min_wait_ms: float = 0.1
    min_wait_share: float = 0.02
    """Of the step time (its longest window over the ranks)."""
    stable_share: float = 0.75
    min_steps: int = 3
    """Steps with a straggler that a verdict across steps (stable, rotating) needs."""
    culprit_share: float = 0.2
    """Share of the run's straggler wait that makes a rank a culprit."""
    host_bound_share: float = 0.5
    """A culprit is host-bound when, for at least this share of the wait it caused, its GPU
    was idle while its CPU thread was busy (:mod:`fsobs.analysis.collectives.lateness`)."""

    def __post_init__(self) -> None:
        for name in ("stable_share", "culprit_share", "min_wait_share", "host_bound_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {self.min_steps}")
        if not self.min_wait_ms >= 0:
            raise ValueError(f"min_wait_ms must be >= 0, got {self.min_wait_ms}")


@dataclass
class Stragglers:
    """``per_step``: step, rank (the straggler; null when none or a tie), wait_caused_ms (the
    largest wait one rank caused in the step), tied_ranks (list, empty unless a tie), note.

    ``per_rank``: rank, times_last (steps it was the straggler), wait_caused_ms (all steps),
    wait_share (of the run's straggler wait), times_arrived_last (collectives it arrived last
    at while someone waited), and what it did while they waited, as shares of that wait:
    gpu_active_share, host_bound_share, idle_share (:mod:`fsobs.analysis.collectives.lateness`; NaN
    on CPU ranks and for
    ranks nobody waited for).
    """

    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    verdict: str
    culprit: int | None
    """The most frequent straggler across steps; None without a verdict across steps
    (``few_steps``, ``none``) or when two ranks share the largest count."""
    culprits: list[int] = field(default_factory=list)
    """The ranks that caused at least ``culprit_share`` of the wait, the largest first."""
    num_waits: int = 0
    """Matched collectives at which some rank waited for the last one."""
    lateness_shares: dict[str, float] = field(default_factory=dict)
    """Of the run's wait (over every collective that kept someone waiting): what the last rank
    was doing (``gpu_active``, ``host_bound``, ``idle``); NaN on CPU runs."""
    host_bound: list[int] = field(default_factory=list)
    """The culprits that are host-bound (``StragglerConfig.host_bound_share``)."""
    config: StragglerConfig = field(default_factory=StragglerConfig)
    """The thresholds these were found with."""


def find_stragglers(
    caused: pd.DataFrame,
    step_ms: pd.Series,
    lateness: pd.DataFrame,
    ranks: list[int],
    config: StragglerConfig | None = None,
) -> Stragglers:
    """Straggler per step and per rank, culprits and verdict (see the module docstring), from
    the :func:`~fsobs.analysis.bubbles.tables.caused_table` of the run, the time of each step
    (ms, indexed by step: :func:`fsobs.analysis.bubbles.tables.step_times`) and the
    :attr:`~fsobs.analysis.collectives.matching.Collectives.lateness` of its collectives."""
    config = config or StragglerConfig()
    by_step = caused.groupby(["step", "culprit"])["wait_ns"].sum()
    items = cast("Iterable[tuple[int, float]]", step_ms.items())  # labels: the steps
    rows = [_step_row(int(step), by_step, float(ms), config) for step, ms in items]
    per_step = pd.DataFrame(rows, columns=["step", "rank", "wait_caused_ms", "tied_ranks", "note"])
    per_step["rank"] = per_step["rank"].astype("Int64")
    counts = per_step["rank"].dropna().astype(int).value_counts()
    per_rank = _per_rank(caused, counts, lateness, ranks)
    wait = per_rank["wait_caused_ms"]
    named = per_rank[
        (per_rank["wait_share"] >= config.culprit_share) & (wait >= config.min_wait_ms) & (wait > 0)
    ]
    named = named.sort_values("wait_share", ascending=False, kind="stable")
    bound = named[named["host_bound_share"] >= config.host_bound_share]
    verdict, culprit = _verdict(counts, not named.empty, config)
    return Stragglers(
        per_step,
        per_rank,
        verdict,
        culprit,
        culprits=[int(r) for r in named["rank"]],
        num_waits=len(lateness),
        lateness_shares=_shares(lateness),
        host_bound=[int(r) for r in bound["rank"]],
        config=config,
    )


def _verdict(
    counts: pd.Series, has_culprits: bool, config: StragglerConfig
) -> tuple[str, int | None]:
    """(verdict, most frequent straggler) from the count of steps each rank was the straggler."""
    if counts.sum() < config.min_steps:
        return ("few_steps" if has_culprits or len(counts) else "none"), None
    top = counts[counts == counts.max()]
    culprit = int(top.index[0]) if len(top) == 1 else None
    share = counts.max() / counts.sum()
    verdict = "stable" if culprit is not None and share >= config.stable_share else "rotating"
    return verdict, culprit


def _per_rank(
    caused: pd.DataFrame, counts: pd.Series, lateness: pd.DataFrame, ranks: list[int]
) -> pd.DataFrame:
    total = caused.groupby("culprit")["wait_ns"].sum().reindex(ranks, fill_value=0)
    wait = total.to_numpy(np.float64)
    late = lateness.groupby("last_rank")
    waited = late["wait_ns"].sum().reindex(ranks).to_numpy(np.float64)
    frame = pd.DataFrame(
        {
            "rank": ranks,
            "times_last": counts.reindex(ranks, fill_value=0).to_numpy(np.int64),
            "wait_caused_ms": wait / 1e6,
            "wait_share": wait / wait.sum() if wait.sum() > 0 else np.zeros(len(ranks)),
            "times_arrived_last": late.size().reindex(ranks, fill_value=0).to_numpy(np.int64),
        }
    )
    for part in LATENESS_PARTS:
        # min_count: a rank whose parts are all NaN (a CPU rank) keeps NaN, not 0
        ns = late[f"{part}_ns"].sum(min_count=1).reindex(ranks).to_numpy(np.float64)
        frame[f"{part}_share"] = ns / waited
    return frame


def _shares(lateness: pd.DataFrame) -> dict[str, float]:
    """Each part's share of the wait at the collectives whose last rank has a GPU."""
    known = lateness.dropna(subset=[f"{p}_ns" for p in LATENESS_PARTS])
    total = float(known["wait_ns"].sum())
    return {
        part: float(known[f"{part}_ns"].sum()) / total if total > 0 else float("nan")
        for part in LATENESS_PARTS
    }


def _step_row(
    step: int, by_step: pd.Series, step_ms: float, config: StragglerConfig
) -> dict[str, object]:
    waits = by_step.xs(step, level="step") if step in by_step.index.get_level_values(0) else None
    if waits is None or waits.empty:
        return {"step": step, "rank": None, "wait_caused_ms": 0.0, "tied_ranks": [], "note": ""}
    largest_ms = float(waits.max()) / 1e6
    threshold = max(config.min_wait_ms, config.min_wait_share * step_ms)
    row: dict[str, object] = {"step": step, "wait_caused_ms": largest_ms, "tied_ranks": []}
    if largest_ms < threshold:
        note = f"largest wait {largest_ms:.3f} ms is below {threshold:.3f} ms: no straggler"
        return row | {"rank": None, "note": note}
    tied = sorted(int(r) for r in waits.index[waits == waits.max()])
    if len(tied) > 1:
        return row | {"rank": None, "tied_ranks": tied, "note": f"tie between ranks {tied}"}
    return row | {"rank": tied[0], "note": ""}
