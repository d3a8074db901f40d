"""DataFrames the pages draw, derived from an :class:`fsobs.Analysis` (pure functions).

Column names keep fsobs's units (``_ms``). Nothing here imports Streamlit or Plotly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dashboard.store import RunEntry, toggles_summary
from fsobs import Analysis
from fsobs.analysis.bubbles import StepBubbles

BUBBLE_CLASSES = ("straggler_wait", "exposed_comm", "host_idle", "other")
"""The bubble classes of DESIGN §5, in stacking order."""
TIMELINE_LABELS = {
    "busy": "compute",
    "exposed_comm": "comm",
    "straggler_wait": "wait",
    "host_idle": "idle",
    "other": "other",
}
"""Timeline lanes: fsobs class -> label."""


def class_means_by_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank (index), the mean ms per step of each bubble class (columns ``BUBBLE_CLASSES``)."""
    columns = [f"{c}_ms" for c in BUBBLE_CLASSES]
    means = steps.groupby("rank")[columns].mean()
    return means.rename(columns=lambda c: c.removesuffix("_ms"))


def wait_matrix(steps: pd.DataFrame) -> pd.DataFrame:
    """Straggler wait in ms, ranks as rows and steps as columns."""
    return steps.pivot_table(
        index="rank", columns="step", values="straggler_wait_ms", aggfunc="sum"
    )


MAX_BARS = 400
"""Most timeline bars per rank and lane; beyond, the closest intervals are merged for drawing."""


def timeline_frame(
    bubbles: list[StepBubbles], step: int, offsets_ns: dict[int, int], max_bars: int = MAX_BARS
) -> pd.DataFrame:
    """The intervals of one step: rank, lane (``TIMELINE_LABELS``), start_ms, end_ms.

    Times are clock-aligned (each rank's offset subtracted) and relative to the earliest window
    start of the step over the ranks. A lane with more than ``max_bars`` intervals is coarsened
    (:func:`coarsen`) and ``frame.attrs["coarsened"]`` is True.
    """
    chosen = [b for b in bubbles if b.step == step]
    if not chosen:
        return pd.DataFrame(columns=["rank", "lane", "start_ms", "end_ms"])
    origin = min(b.window[0] - offsets_ns.get(b.rank, 0) for b in chosen)
    frames, coarsened = [], False
    for sb in chosen:
        shift = origin + offsets_ns.get(sb.rank, 0)
        for name, label in TIMELINE_LABELS.items():
            starts, ends = coarsen(*sb.classes[name], max_bars)
            coarsened |= len(starts) < len(sb.classes[name][0])
            if len(starts):
                frames.append(
                    pd.DataFrame(
                        {
                            "rank": sb.rank,
                            "lane": label,
                            "start_ms": (np.asarray(starts) - shift) / 1e6,
                            "end_ms": (np.asarray(ends) - shift) / 1e6,
                        }
                    )
                )
    frame = pd.concat(frames, ignore_index=True).sort_values(["rank", "start_ms"], kind="stable")
    frame.attrs["coarsened"] = coarsened
    return frame


def coarsen(starts: np.ndarray, ends: np.ndarray, max_bars: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_bars`` intervals: keep the ``max_bars - 1`` widest gaps between the sorted,
    disjoint intervals and close all the others (drawing only; totals grow by the gaps closed)."""
    starts, ends = np.asarray(starts), np.asarray(ends)
    if len(starts) <= max_bars:
        return starts, ends
    gaps = starts[1:] - ends[:-1]
    breaks = np.sort(np.argsort(gaps, kind="stable")[len(gaps) - (max_bars - 1) :])
    return (
        np.concatenate([starts[:1], starts[breaks + 1]]),
        np.concatenate([ends[breaks], ends[-1:]]),
    )


def lateness_frame(analysis: Analysis) -> pd.DataFrame | None:
    """Per rank and step: the data's estimated cost and how late the rank arrived at the step's
    collectives (mean of ``a_r - min_j a_j`` over the instances, ms). None without sidecars."""
    attr, sidecar = analysis.attribution, analysis.run.sidecar
    inst = analysis.collectives.instances
    if attr is None or sidecar is None or inst.empty:
        return None
    first = inst.groupby("instance")["start_ns"].transform("min")
    late = inst.assign(lateness_ms=(inst["start_ns"] - first) / 1e6)
    late = late.groupby(["rank", "step"], as_index=False)["lateness_ms"].mean()
    cost = sidecar.groupby(["rank", "step"], as_index=False)[attr.cost_source].sum()
    cost = cost.rename(columns={attr.cost_source: "cost"})
    return cost.merge(late, on=["rank", "step"], how="inner")


def imbalance_steps(sidecar: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per step, the logged imbalance of the random split and of the split used; None if absent."""
    columns = ["imbalance_before", "imbalance_after"]
    if sidecar is None or not set(columns) <= set(sidecar.columns):
        return None
    logged = sidecar.dropna(subset=columns, how="all")
    if logged.empty:
        return None
    return logged.groupby("step", as_index=False)[columns].first()


def run_facts(entry: RunEntry, analysis: Analysis | None, error: str | None) -> dict[str, Any]:
    """One row of the runs table."""
    meta = entry.meta or {}
    row: dict[str, Any] = {
        "run": entry.run_id,
        "bubble ratio": None,
        "world size": meta.get("world_size"),
        "device": meta.get("device"),
        "ranks loaded": None,
        "steps": None,
        "toggles": toggles_summary(entry.meta),
        "status": meta.get("status", "no run.json"),
        "simulated": bool(meta.get("simulated", False)),
        "trace MB": round(entry.trace_bytes / 1e6, 2),
        "problem": error or "",
    }
    if analysis is not None:
        ratio = analysis.summary["bubble_ratio"]
        row.update(
            {
                "world size": analysis.run.world_size,
                "device": analysis.run.device,
                "ranks loaded": len(analysis.run.ranks),
                "steps": len(analysis.run.steps),
                "bubble ratio": None if math.isnan(ratio) else ratio,
            }
        )
        if analysis.run.steps == [] and not error:
            row["problem"] = "no step recorded on every rank"
    return row


def has_data(analysis: Analysis | None) -> bool:
    """True when the run has at least one step with a bubble breakdown."""
    return analysis is not None and not analysis.steps.empty
