"""Data attribution: how much of the straggler wait the input data explains (docs/design.md §3, §5).

With the step sidecars, every rank's estimated compute cost per step is known. Per step with a
straggler (:mod:`fsobs.analysis.stragglers`): the straggler's cost against the mean over ranks
(``cost_ratio``), whether it alone had the largest cost (``culprit_has_max_cost``; a shared
largest cost is a tie, ``max_cost_tied``, and explains nothing), and how far apart the ranks'
costs were (``cost_spread = (max - min) / mean``). Across steps, the Spearman rank correlation
between a rank's cost and its lateness at the step's collectives (``a_r - min_j a_j``, averaged
over the step's instances). Near 1: the expensive data arrives last.

``explained_wait_share`` is the share of the straggler wait caused in steps whose straggler
alone had the largest cost. The verdict says only what this shows:

- ``explains``: the costliest rank was last in a clear majority of the waiting time
  (``explained_wait_share >= EXPLAINS_SHARE``) and cost and lateness correlate positively;
- ``balanced``: the ranks' costs were within ``BALANCED_SPREAD`` of each other (median over the
  steps), so the data cannot be what made one rank late;
- ``not_explained``: neither;
- ``unknown``: no step has a straggler to explain, or none with every rank's data.

A step counts only when every analyzed rank logged it (the sidecar given is
:attr:`fsobs.analysis.partial.SidecarCheck.comparable`): a step with a straggler and a rank
without data is left out (``steps_without_data``), never judged on the ranks that have it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis.collectives.matching import Collectives
from fsobs.analysis.stragglers.identify import Stragglers

EXPLAINS_SHARE = 2 / 3
BALANCED_SPREAD = 0.02
_COLUMNS = [
    "step",
    "rank",
    "culprit_cost",
    "mean_cost",
    "cost_ratio",
    "culprit_has_max_cost",
    "max_cost_tied",
    "cost_spread",
]


@dataclass
class Attribution:
    """``per_step``: the columns of ``_COLUMNS`` (see the module docstring)."""

    per_step: pd.DataFrame
    rank_correlation: float
    explained_wait_share: float
    cost_source: str
    """``est_cost`` (the job's cost model) or ``len_sq_sum`` when no estimate was logged."""
    verdict: str
    steps_without_data: list[int]
    """Steps with a straggler left out because some rank has no data for them."""

    @property
    def median_cost_spread(self) -> float:
        return float(self.per_step["cost_spread"].median()) if len(self.per_step) else np.nan


def attribute(sidecar: pd.DataFrame, strag: Stragglers, colls: Collectives) -> Attribution:
    """Tie each step's straggler to the cost of the data it got (see the module docstring);
    ``sidecar`` holds one row per rank of each step it has."""
    source = "est_cost" if sidecar["est_cost"].notna().all() else "len_sq_sum"
    cost = sidecar.pivot(index="step", columns="rank", values=source).astype(np.float64)
    rows, waits, without = [], [], []
    named = strag.per_step.dropna(subset=["rank"])
    for step, rank, wait in named[["step", "rank", "wait_caused_ms"]].itertuples(index=False):
        if step not in cost.index or rank not in cost.columns:
            without.append(int(step))
            continue
        rows.append(_step_costs(int(step), int(rank), cost.loc[step].dropna()))
        waits.append(float(wait))
    per_step = pd.DataFrame(rows, columns=_COLUMNS)
    wait = np.array(waits)
    explained = (
        float(wait[per_step["culprit_has_max_cost"].to_numpy(bool)].sum() / wait.sum())
        if wait.sum() > 0
        else float("nan")
    )
    correlation = _lateness_correlation(cost, colls)
    return Attribution(
        per_step=per_step,
        rank_correlation=correlation,
        explained_wait_share=explained,
        cost_source=source,
        verdict=_verdict(per_step, explained, correlation),
        steps_without_data=without,
    )


def _step_costs(step: int, rank: int, costs: pd.Series) -> dict[str, object]:
    mean = float(costs.mean())
    top = costs.max()
    return {
        "step": step,
        "rank": rank,
        "culprit_cost": float(costs[rank]),
        "mean_cost": mean,
        "cost_ratio": float(costs[rank] / mean) if mean else float("nan"),
        "culprit_has_max_cost": bool(costs[rank] == top and (costs == top).sum() == 1),
        "max_cost_tied": bool((costs == top).sum() > 1),
        "cost_spread": float((top - costs.min()) / mean) if mean else float("nan"),
    }


def _verdict(per_step: pd.DataFrame, explained: float, correlation: float) -> str:
    if per_step.empty:
        return "unknown"
    if float(per_step["cost_spread"].median()) < BALANCED_SPREAD:
        return "balanced"
    if explained >= EXPLAINS_SHARE and correlation > 0:
        return "explains"
    return "not_explained"


def _lateness_correlation(cost: pd.DataFrame, colls: Collectives) -> float:
    inst = colls.instances
    if inst.empty:
        return float("nan")
    first = inst.groupby("instance")["start_ns"].transform("min")
    late = inst.assign(late=inst["start_ns"] - first)
    lateness = late.pivot_table(index="step", columns="rank", values="late", aggfunc="mean")
    values = []
    for step in lateness.index.intersection(cost.index):
        pair = pd.DataFrame({"cost": cost.loc[step], "late": lateness.loc[step]}).dropna()
        if len(pair) >= 2 and pair["cost"].nunique() > 1 and pair["late"].nunique() > 1:
            values.append(pair["cost"].rank().corr(pair["late"].rank()))
    return float(np.mean(values)) if values else float("nan")
