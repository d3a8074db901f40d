"""Data attribution: how much of the straggler wait the input data explains (DESIGN §3, §5).

With the step sidecars, every rank's estimated compute cost per step is known. Two questions:

1. Per step: the straggler's estimated cost against the mean over ranks (``cost_ratio``) and
   whether it had the largest cost of all ranks (``culprit_has_max_cost``).
2. Across steps: the Spearman rank correlation between a rank's cost and its lateness at the
   step's collectives (``a_r - min_j a_j``, averaged over the step's instances). Near 1: the
   expensive data arrives last, so balancing the data removes the wait.

``explained_wait_share`` is the share of all straggler wait caused in steps whose straggler also
had the largest estimated cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis.collectives import Collectives
from fsobs.analysis.stragglers import Stragglers


@dataclass
class Attribution:
    """``per_step``: step, rank, culprit_cost, mean_cost, cost_ratio, culprit_has_max_cost."""

    per_step: pd.DataFrame
    rank_correlation: float
    explained_wait_share: float
    cost_source: str
    """``est_cost`` (the job's cost model) or ``len_sq_sum`` when no estimate was logged."""


def attribute(sidecar: pd.DataFrame, strag: Stragglers, colls: Collectives) -> Attribution:
    """Tie each step's straggler to the cost of the data it got (see the module docstring)."""
    source = "est_cost" if sidecar["est_cost"].notna().all() else "len_sq_sum"
    cost = sidecar.pivot_table(index="step", columns="rank", values=source, aggfunc="sum")
    rows = []
    for step, rank, wait in strag.per_step[["step", "rank", "wait_caused_ms"]].itertuples(
        index=False
    ):
        if step not in cost.index or rank not in cost.columns:
            continue
        costs = cost.loc[step].dropna()
        rows.append(
            {
                "step": int(step),
                "rank": int(rank),
                "culprit_cost": float(costs[rank]),
                "mean_cost": float(costs.mean()),
                "cost_ratio": float(costs[rank] / costs.mean()) if costs.mean() else float("nan"),
                "culprit_has_max_cost": bool(costs[rank] >= costs.max()),
                "wait_caused_ms": float(wait),
            }
        )
    per_step = pd.DataFrame(rows)
    total = per_step["wait_caused_ms"].sum() if len(per_step) else 0.0
    explained = (
        per_step.loc[per_step["culprit_has_max_cost"], "wait_caused_ms"].sum() / total
        if total > 0
        else float("nan")
    )
    return Attribution(
        per_step=per_step.drop(columns="wait_caused_ms", errors="ignore"),
        rank_correlation=_lateness_correlation(cost, colls),
        explained_wait_share=float(explained),
        cost_source=source,
    )


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
