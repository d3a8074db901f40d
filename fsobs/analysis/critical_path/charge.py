"""Each step's bubble charged to the root rank of its critical path, with a phase and a cause.

For step ``s`` with root rank ``R`` (:mod:`.path`):

- ``bubble_ms``: the step's bubble summed over the ranks (the bubble table's ``bubble_ms``);
- ``phase``: the role (``embedding``, ``dense``, ``other``, PEC's) of the collective at which
  ``R`` kept the others waiting longest in the step (the matching's lateness table: per
  instance, the waits of the others), None when ``R`` kept nobody waiting;
- ``cause``: why ``R`` was late, in the straggler analysis' labels: the largest part of
  :data:`fsobs.analysis.stragglers.causes.CAUSES` when the step sidecars split ``R``'s
  lateness in that step, else the largest part of that collective's lateness
  (:data:`fsobs.analysis.collectives.lateness.LATENESS_PARTS`, GPU ranks), else None.
"""

from __future__ import annotations

import pandas as pd

from fsobs.analysis.collectives.lateness import LATENESS_PARTS
from fsobs.analysis.collectives.matching import Collectives
from fsobs.analysis.stragglers.causes import CAUSES, Causes

CHARGED_COLUMNS = ["bubble_ms", "phase", "cause", "instance"]
"""Added to the per-step facts of the path (``instance``: the collective of ``phase``, -1)."""


def charged(
    facts: pd.DataFrame, steps: pd.DataFrame, colls: Collectives, causes: Causes | None
) -> pd.DataFrame:
    """``facts`` (step, root_rank, ...) with :data:`CHARGED_COLUMNS` (module docstring)."""
    bubble = steps.groupby("step")["bubble_ms"].sum()
    late = colls.lateness
    role = colls.instances.drop_duplicates("instance").set_index("instance")["role"]
    sidecar = causes.per_step.set_index(["step", "rank"]) if causes is not None else None
    rows = []
    for step, root in facts[["step", "root_rank"]].itertuples(index=False):
        mine = late[(late["step"] == step) & (late["last_rank"] == root)]
        top = mine.loc[mine["wait_ns"].idxmax()] if len(mine) else None
        inst = int(top["instance"]) if top is not None else -1
        rows.append(
            {
                "bubble_ms": float(bubble.get(step, 0.0)),
                "phase": str(role[inst]) if inst >= 0 else None,
                "cause": _cause(sidecar, (int(step), int(root)), top),
                "instance": inst,
            }
        )
    return pd.concat([facts, pd.DataFrame(rows, columns=CHARGED_COLUMNS)], axis=1)


def _cause(sidecar: pd.DataFrame | None, key: tuple[int, int], top: pd.Series | None) -> str | None:
    """The largest sidecar cause of ``key`` (step, rank), else the largest lateness part of
    the collective ``top``; None when neither has a positive part."""
    if sidecar is not None and key in sidecar.index:
        parts = sidecar.loc[key, list(CAUSES)].astype(float)
        if parts.max() > 0:
            return str(parts.idxmax())
    if top is not None:
        trace = top[[f"{p}_ns" for p in LATENESS_PARTS]].astype(float)
        if trace.max() > 0:
            return str(trace.idxmax()).removesuffix("_ns")
    return None
