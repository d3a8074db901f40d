"""The balance plan of one logged global batch (plain functions over ``optim.balance``).

The step sidecars list each rank's per-sample lengths; concatenated over the ranks (in rank
order) they are the step's global batch. *Before* is the split the job used: each rank's own
samples, costed with the cost model. *After* is :func:`optim.balance.partition` of the whole batch
into as many parts as ranks (part i goes to rank i), with equal sample counts when they divide
evenly. ``imbalance = max / mean`` per-rank cost (1.0 is perfect).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fsobs import TraceReadError
from fsobs.runformat import COST_MODEL, read_limited
from fsobs.storage import Location
from optim import MAX_COST_MODEL_BYTES, CostModel, imbalance, partition

DEFAULT_MODEL = CostModel(c0=0.0, a=1.0, b=1.0)
UNTRAINED = "untrained default c(L) = L + L²"


@dataclass(frozen=True)
class CostChoice:
    """A cost model and where it comes from (shown next to every number it produced)."""

    model: CostModel
    source: str


@dataclass(frozen=True)
class BalancePlan:
    """Per-rank cost before and after balancing one global batch."""

    per_rank: pd.DataFrame
    """rank, samples_before, cost_before, samples_after, cost_after."""
    imbalance_before: float
    imbalance_after: float
    equal_size: bool
    """Whether the partition kept equal sample counts per rank."""


def default_model() -> CostChoice:
    """The fallback when nothing better is known: ``c(L) = L + L²``, clearly labelled."""
    return CostChoice(DEFAULT_MODEL, UNTRAINED)


def stored_cost_model(run_dir: Location) -> tuple[CostChoice | None, str | None]:
    """The run's ``cost_model.json`` if present: (choice, None), or (None, why it is unusable).
    ``run_dir`` may be a URL (a read-only store)."""
    path = run_dir / COST_MODEL
    if isinstance(path, Path) and path.is_symlink():  # a run's files lie in its folder
        return None, "a symbolic link, not followed"
    try:
        text = read_limited(path, MAX_COST_MODEL_BYTES, "cost model").decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None, None
    except TraceReadError as exc:
        return None, str(exc).replace(f"{run_dir}/", "")
    try:
        model = CostModel.from_json_text(text, str(path))
    except ValueError as exc:
        return None, str(exc).replace(f"{run_dir}/", "")
    return CostChoice(model, f"the run's {COST_MODEL}"), None


def balance_plan(lengths: dict[int, np.ndarray], model: CostModel, method: str) -> BalancePlan:
    """Cost each rank's samples, re-partition the global batch with ``method``, compare."""
    if not lengths:
        raise ValueError("lengths: no rank logged per-sample lengths for this step")
    ranks = sorted(lengths)
    costs = [model(np.asarray(lengths[r])) for r in ranks]
    flat = np.concatenate(costs)
    bounds = np.cumsum([0] + [len(c) for c in costs])
    before = [list(range(bounds[i], bounds[i + 1])) for i in range(len(ranks))]
    equal = len(flat) % len(ranks) == 0
    after = partition(flat, len(ranks), method=method, equal_size=equal)
    per_rank = pd.DataFrame(
        {
            "rank": ranks,
            "samples_before": [len(p) for p in before],
            "cost_before": [float(flat[p].sum()) for p in before],
            "samples_after": [len(p) for p in after],
            "cost_after": [float(flat[p].sum()) if p else 0.0 for p in after],
        }
    )
    return BalancePlan(
        per_rank=per_rank,
        imbalance_before=imbalance(flat, before),
        imbalance_after=imbalance(flat, after),
        equal_size=equal,
    )
