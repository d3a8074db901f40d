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
step is a tie (``rank`` null, ``tied_ranks`` lists them). The run's verdict is ``stable`` when
one rank is the straggler of at least ``stable_share`` of the steps that have one,
``rotating`` otherwise, ``none`` when no step has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd


@dataclass(kw_only=True, frozen=True)
class StragglerConfig:
    """When a step has a straggler."""

    min_wait_ms: float = 0.1
    min_wait_share: float = 0.02
    """Of the step time (its longest window over the ranks)."""
    stable_share: float = 0.75


@dataclass
class Stragglers:
    """``per_step``: step, rank (the straggler; null when none or a tie), wait_caused_ms (the
    largest wait one rank caused in the step), tied_ranks (list, empty unless a tie), note.
    ``per_rank``: rank, times_last (steps it was the straggler), wait_caused_ms (all steps).
    """

    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    verdict: str
    culprit: int | None
    """The most frequent straggler, None without any (or when two ranks share that count)."""


def find_stragglers(
    caused: pd.DataFrame,
    step_ms: pd.Series,
    ranks: list[int],
    config: StragglerConfig | None = None,
) -> Stragglers:
    """Straggler per step and per rank (see the module docstring), from the
    :func:`~fsobs.analysis.bubbles.tables.caused_table` of the run and the time of each step (ms,
    indexed by step: :func:`fsobs.analysis.bubbles.tables.step_times`)."""
    config = config or StragglerConfig()
    by_step = caused.groupby(["step", "culprit"])["wait_ns"].sum()
    items = cast("Iterable[tuple[int, float]]", step_ms.items())  # labels: the steps
    rows = [_step_row(int(step), by_step, float(ms), config) for step, ms in items]
    per_step = pd.DataFrame(rows, columns=["step", "rank", "wait_caused_ms", "tied_ranks", "note"])
    per_step["rank"] = per_step["rank"].astype("Int64")
    counts = per_step["rank"].dropna().astype(int).value_counts()
    total = caused.groupby("culprit")["wait_ns"].sum()
    per_rank = pd.DataFrame(
        {
            "rank": ranks,
            "times_last": counts.reindex(ranks, fill_value=0).to_numpy(np.int64),
            "wait_caused_ms": total.reindex(ranks, fill_value=0).to_numpy(np.float64) / 1e6,
        }
    )
    if counts.empty:
        return Stragglers(per_step, per_rank, "none", None)
    top = counts[counts == counts.max()]
    culprit = int(top.index[0]) if len(top) == 1 else None
    share = counts.max() / counts.sum()
    verdict = "stable" if culprit is not None and share >= config.stable_share else "rotating"
    return Stragglers(per_step, per_rank, verdict, culprit)


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
