"""The split bound in the reports (:mod:`fsobs.analysis.whatif.bounds`): its JSON, and the
findings that tell a whale (one sample costlier than the mean rank load, which no split can
balance) from a bad split."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from fsobs.analysis.whatif.bounds import BoundSummary, SplitBounds
from fsobs.report._format import short_list
from fsobs.report._json import clean, records

AT_BOUND = 1.02
"""A split within this factor of the equal-count bound is as good as a split inside the step
can be."""


def bounds_json(bounds: SplitBounds | None) -> dict[str, Any] | None:
    """The ``split_bound`` object of ``fsobs analyze --json``; None without sidecars or a cost
    model."""
    if bounds is None:
        return None
    out: dict[str, Any] = clean(asdict(bounds.summary()))
    return out | {"missing_steps": bounds.missing_steps, "per_step": records(bounds.per_step)}


def whale_findings(bounds: SplitBounds | None) -> list[str]:
    """The step whose straggler is the worst whale, then the bound over the run."""
    if bounds is None:
        return []
    if bounds.per_step.empty:
        return ["no step lists the per-sample lengths of every rank: no split bound"]
    lines = []
    held = bounds.per_step[bounds.per_step["straggler_has_whale"]]
    if len(held):
        worst = held.loc[held["whale_bound"].idxmax()]
        more = f" ({len(held)} steps have such a straggler)" if len(held) > 1 else ""
        lines.append(
            f"step {int(worst['step'])}'s straggler is a whale: its costliest sample alone is "
            f"{worst['whale_bound']:.2f}x the mean rank load; no split can balance it{more}"
        )
    return lines + [bound_line(bounds.summary())] + _missing(bounds)


def bound_line(s: BoundSummary) -> str:
    """The bound over the run in one line (``analyze`` and ``whatif``)."""
    equal = "" if math.isnan(s.equal_bound) else f"{s.equal_bound:.2f} with equal counts, "
    line = (
        f"split bound over {s.num_steps} step(s) (cost model: {s.cost_source}): no split inside "
        f"a step can bring the imbalance (max / mean rank load) below {equal}"
        f"{s.whale_bound:.2f} with any counts (means over steps); the split trained on had "
        f"{s.imbalance:.2f}; {s.num_whale_steps} step(s) have a whale (a sample costlier than "
        "the mean rank load" + (f", up to {s.max_whale_bound:.2f}x)" if s.num_whale_steps else ")")
    )
    if not math.isnan(s.equal_bound) and s.imbalance <= s.equal_bound * AT_BOUND:
        line += (
            ": the split is at the bound, a better split of the same steps cannot help, only "
            "moving samples across steps"
        )
    return line


def _missing(bounds: SplitBounds) -> list[str]:
    if not bounds.missing_steps:
        return []
    return [
        f"step(s) {short_list(bounds.missing_steps)} lack some rank's per-sample lengths: no "
        "split bound for them"
    ]
