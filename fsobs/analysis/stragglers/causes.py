"""Why the straggler was late: its data, garbage collection, a preempted CPU, or unexplained.

For each step with a straggler ``s`` (:mod:`fsobs.analysis.stragglers`), its **lateness** is its
busy time above the step's median over the ranks, and the step sidecars (this rank's numbers
against the step's median over the ranks, :mod:`fsobs.collect.pauses`) split it::

    busy_s   |=========================================|
    median   |===========================|              lateness
                                         |..data..|gc|pre|?|
    data        = (est_cost_s - median est_cost) x ms_per_cost    (the cost model's excess)
    gc          = gc_ms_s - median gc_ms                          (Python GC pauses)
    preemption  = off_s - median off,  off = wall - cpu - blocked (off the CPU without waiting
                                         in a collective: the OS ran something else)
    unexplained = lateness - the three

``ms_per_cost`` converts the cost model's units: total busy over total estimated cost of the
run. Each part is clipped at 0; when the three exceed the lateness they are scaled down to it.
A straggler that was not busier than the median (lateness <= 0) was late for a reason outside
its busy time: all unexplained. Per run, each cause's **share** of the straggler wait is the
wait each step's straggler caused, split in the proportions of that step's parts.

Sidecars without some field the split needs give no causes, and the report names what is
missing (:func:`missing_inputs`): ``est_cost`` null (a run recorded without a cost model), the
pause fields absent (older runs, runs without the profiler), or the wall times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis.stragglers.identify import Stragglers

CAUSES = ("data", "gc", "preemption", "unexplained")
_NEEDED = ("est_cost", "gc_ms", "cpu_ms", "wall_ms")


@dataclass
class Causes:
    """``per_step``: step, rank (the straggler), wait_ms (the wait it caused), late_ms, and one
    ms column per cause (``CAUSES``). ``shares``: cause -> share of the run's straggler wait."""

    per_step: pd.DataFrame
    shares: dict[str, float]


def missing_inputs(sidecar: pd.DataFrame | None) -> list[str]:
    """The sidecar columns :func:`straggler_causes` needs that no line has (every one of
    ``est_cost, gc_ms, cpu_ms, wall_ms`` without a sidecar); [] when they are all there."""
    if sidecar is None or sidecar.empty:
        return list(_NEEDED)
    return [name for name in _NEEDED if bool(sidecar[name].isna().all())]


def straggler_causes(
    steps: pd.DataFrame, sidecar: pd.DataFrame | None, strag: Stragglers
) -> Causes | None:
    """The causes of each step's lateness (module docstring); None without the sidecar
    fields they need."""
    if missing_inputs(sidecar):
        return None
    assert sidecar is not None  # missing_inputs names every field without one
    side = sidecar.set_index(["rank", "step"])  # one row each (fsobs.analysis.partial)
    table = steps.set_index(["rank", "step"]).join(side[list(_NEEDED)], how="inner")
    table["blocked_ms"] = table[
        ["straggler_wait_ms", "exposed_comm_ms", "unattributed_comm_ms"]
    ].sum(1)
    table["off_ms"] = table["wall_ms"] - table["cpu_ms"] - table["blocked_ms"]
    ms_per_cost = float(table["busy_ms"].sum() / table["est_cost"].sum())
    medians = table.groupby(level="step")[["busy_ms", "est_cost", "gc_ms", "off_ms"]].median()
    rows = []
    named = strag.per_step.dropna(subset=["rank"])
    for step, rank, wait in named[["step", "rank", "wait_caused_ms"]].itertuples(index=False):
        key = (int(rank), int(step))
        if key not in table.index:
            continue
        row, med = cast(pd.Series, table.loc[key]), cast(pd.Series, medians.loc[int(step)])
        parts = {
            "data": (row["est_cost"] - med["est_cost"]) * ms_per_cost,
            "gc": row["gc_ms"] - med["gc_ms"],
            "preemption": row["off_ms"] - med["off_ms"],
        }
        late = float(row["busy_ms"] - med["busy_ms"])
        rows.append({"step": int(step), "rank": int(rank), "wait_ms": float(wait), "late_ms": late}
                    | _split(late, parts))  # fmt: skip
    per_step = pd.DataFrame(rows, columns=["step", "rank", "wait_ms", "late_ms", *CAUSES])
    return Causes(per_step, _shares(per_step))


def _split(late: float, parts: dict[str, float]) -> dict[str, float]:
    """The lateness in ms per cause (clipped, scaled to fit, the rest unexplained)."""
    if not late > 0:
        return dict.fromkeys(CAUSES[:-1], 0.0) | {"unexplained": max(late, 0.0)}
    known = {k: max(float(v), 0.0) if np.isfinite(v) else 0.0 for k, v in parts.items()}
    total = sum(known.values())
    if total > late:
        known = {k: v * late / total for k, v in known.items()}
    return known | {"unexplained": late - sum(known.values())}


def _shares(per_step: pd.DataFrame) -> dict[str, float]:
    """Each cause's share of the straggler wait: per step, the wait split like the lateness
    (a step with no lateness: all unexplained)."""
    wait = per_step["wait_ms"].to_numpy(float)
    if not len(per_step) or wait.sum() <= 0:
        return dict.fromkeys(CAUSES, float("nan"))
    parts = per_step[list(CAUSES)].to_numpy(float)
    totals = parts.sum(axis=1)
    fractions = np.divide(
        parts, totals[:, None], out=np.zeros_like(parts), where=totals[:, None] > 0
    )
    fractions[totals <= 0, CAUSES.index("unexplained")] = 1.0
    shares = (fractions * wait[:, None]).sum(axis=0) / wait.sum()
    return {cause: float(share) for cause, share in zip(CAUSES, shares, strict=True)}
