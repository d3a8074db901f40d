"""DataFrames the pages draw, derived from an :class:`fsobs.Analysis` (pure functions).

Column names keep fsobs's units (``_ms``). Nothing here imports Streamlit or Plotly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from dashboard.store import RunEntry, toggles_summary
from fsobs import Analysis
from fsobs.analysis import BUBBLE_CLASSES, StepBubbles, alltoall_with_data
from fsobs.report import ALLTOALL_COLUMNS
from optim import CostModel

TIMELINE_CLASSES = (
    "busy",
    "exposed_comm",
    "unattributed_comm",
    "straggler_wait",
    "host_idle",
    "other",
)
"""Timeline lanes, in their order: fsobs's classes, by fsobs's names."""


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


TIMELINE_STEPS = 2
"""Steps the timeline shows by default (the first ones of the run)."""
TIMELINE_PIXELS = 1000
"""Horizontal resolution of the timeline: in each lane, a gap shorter than the window's span
over this many pixels is closed (the screen could not show it)."""
MAX_TIMELINE_BARS = 2000
"""Most bars in one timeline chart, over all its lanes (the browser draws one SVG path per bar)."""
TIMELINE_COLUMNS = ["rank", "lane", "start_ms", "end_ms", "class_ms", "intervals"]


PATH_COLUMNS = ["step", "rank", "kind", "name", "start_ms", "end_ms"]


def path_frame(segments: pd.DataFrame, steps: Sequence[int], origin_ns: int) -> pd.DataFrame:
    """The critical path's segments of ``steps`` (``Analysis.critical_path.segments``, clock
    aligned) in the timeline's ms (``origin_ns``: its 0, ``timeline_frame``'s
    ``attrs["origin_ns"]``), in step and time order."""
    chosen = segments[segments["step"].isin(list(steps))]
    return chosen.assign(
        start_ms=(chosen["start_ns"] - origin_ns) / 1e6, end_ms=(chosen["end_ns"] - origin_ns) / 1e6
    )[PATH_COLUMNS].reset_index(drop=True)


def timeline_frame(
    bubbles: list[StepBubbles],
    steps: Sequence[int],
    offsets_ns: dict[int, int],
    *,
    pixels: int = TIMELINE_PIXELS,
    max_bars: int = MAX_TIMELINE_BARS,
) -> pd.DataFrame:
    """The bars of the timeline of ``steps``, one lane per rank and class (``TIMELINE_CLASSES``).

    Columns: rank, lane (the class), start_ms, end_ms (clock-aligned: each rank's offset
    subtracted, relative to the earliest window start over the ranks and steps), class_ms
    (time of the lane's class inside the bar, exact) and intervals
    (how many intervals the bar stands for).

    1. Per rank and class, the intervals of the chosen steps, in order.
    2. The minimum gap is the span of the window (earliest start to latest end) / ``pixels``;
       intervals separated by less are drawn as one bar (:func:`merge_close`).
    3. If the chart would still have more than ``max_bars`` bars, each lane keeps at most
       ``max_bars`` / (number of lanes) of them, closing its narrowest gaps.

    Summing ``class_ms`` over a lane gives the class total of the bubble table whatever was
    merged. ``frame.attrs``: ``merged`` (a gap of positive width was closed), ``capped`` (step 3
    closed wider gaps), ``min_gap_ms``, ``num_intervals`` (before merging), ``lane_bars`` (the cap
    of step 3), ``origin_ns`` (the timeline's 0, absolute, on the clock of a rank with offset 0).
    """
    chosen = sorted((b for b in bubbles if b.step in set(steps)), key=lambda b: (b.rank, b.step))
    frame = pd.DataFrame({c: [] for c in TIMELINE_COLUMNS})
    frame.attrs.update(
        merged=False, capped=False, min_gap_ms=0.0, num_intervals=0, lane_bars=0, origin_ns=0
    )
    if not chosen:
        return frame
    origin = min(b.window[0] - offsets_ns.get(b.rank, 0) for b in chosen)
    span = max(b.window[1] - offsets_ns.get(b.rank, 0) for b in chosen) - origin
    min_gap = span / pixels if pixels > 0 else 0.0
    lanes: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for rank in sorted({b.rank for b in chosen}):
        mine = [b for b in chosen if b.rank == rank]
        shift = origin + offsets_ns.get(rank, 0)
        for name in TIMELINE_CLASSES:
            starts = np.concatenate([np.asarray(b.classes[name][0], dtype=np.int64) for b in mine])
            ends = np.concatenate([np.asarray(b.classes[name][1], dtype=np.int64) for b in mine])
            if len(starts):
                order = np.argsort(starts, kind="stable")
                lanes[(rank, name)] = (starts[order] - shift, ends[order] - shift)
    per_lane = max(1, max_bars // max(1, len(lanes)))
    parts, merged, capped, count = [], False, False, 0
    for (rank, cls), (starts, ends) in lanes.items():
        bar_starts, bar_ends, covered, intervals = merge_close(starts, ends, min_gap, per_lane)
        merged |= bool(np.any(covered < bar_ends - bar_starts))
        capped |= int(np.count_nonzero(starts[1:] - ends[:-1] >= min_gap)) >= per_lane
        count += len(starts)
        parts.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "lane": cls,
                    "start_ms": bar_starts / 1e6,
                    "end_ms": bar_ends / 1e6,
                    "class_ms": covered / 1e6,
                    "intervals": intervals,
                }
            )
        )
    if parts:
        frame = pd.concat(parts, ignore_index=True)
    frame.attrs.update(
        merged=merged,
        capped=capped,
        min_gap_ms=min_gap / 1e6,
        num_intervals=count,
        lane_bars=per_lane,
        origin_ns=int(origin),
    )
    return frame


def merge_close(
    starts: np.ndarray, ends: np.ndarray, min_gap: float, max_bars: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bars for sorted, disjoint intervals: a gap shorter than ``min_gap`` is closed, and if more
    than ``max_bars`` bars are left, the narrowest gaps too (only the ``max_bars - 1`` widest
    stay open). Returns the bars' starts and ends, the interval time inside each bar and the
    number of intervals it holds."""
    starts, ends = np.asarray(starts), np.asarray(ends)
    if len(starts) == 0:
        empty = np.zeros(0, dtype=starts.dtype)
        return empty, empty.copy(), empty.copy(), np.zeros(0, dtype=np.int64)
    gaps = starts[1:] - ends[:-1]
    kept = np.flatnonzero(gaps >= min_gap)  # gap i lies between intervals i and i + 1
    if len(kept) > max_bars - 1:
        widest = np.argsort(gaps[kept], kind="stable")[len(kept) - (max_bars - 1) :]
        kept = np.sort(kept[widest])
    first = np.concatenate([[0], kept + 1])
    last = np.concatenate([kept, [len(starts) - 1]])
    total = np.concatenate([[0], np.cumsum(ends - starts)])
    return starts[first], ends[last], total[last + 1] - total[first], last - first + 1


def lateness_frame(analysis: Analysis) -> pd.DataFrame | None:
    """Per rank and step: the data's estimated cost and how late the rank arrived at the step's
    collectives (mean of ``a_r - min_j a_j`` over the instances, ms). None without sidecars."""
    attr, sidecar = analysis.attribution, analysis.run.sidecar
    inst = analysis.collectives.instances
    if attr is None or sidecar is None or inst.empty:
        return None
    first = inst.groupby("instance")["start_ns"].transform("min")
    late = inst.assign(lateness_ms=(inst["start_ns"] - first) / 1e6)
    late = late.groupby(["rank", "step"], as_index=False)[["lateness_ms"]].mean()
    cost = sidecar.groupby(["rank", "step"], as_index=False)[[attr.cost_source]].sum()
    cost = cost.rename(columns={attr.cost_source: "cost"})
    return cost.merge(late, on=["rank", "step"], how="inner")


A2A_SHOWN = 10
"""all_to_all(v) instances in the Bubbles page's table: the most uneven ones."""
A2A_COLUMNS = {
    **ALLTOALL_COLUMNS,  # the report's names
    "heaviest_sender_has_most_ids": "top sender has most ids",
    "matrix": "rank x rank matrix",
}
"""Column -> header of :func:`all_to_all_frame` (``send_mb``, ``matrix`` are added there)."""


def all_to_all_frame(analysis: Analysis, shown: int = A2A_SHOWN) -> pd.DataFrame:
    """The ``shown`` most uneven all_to_all(v) instances (the larger of send and receive
    max / mean first), tied to the data (:func:`fsobs.analysis.alltoall_with_data`),
    with ``send_mb`` and ``matrix`` (whether every rank recorded its split sizes); columns renamed
    by :data:`A2A_COLUMNS`, in that order (a sidecar's columns only with sidecars)."""
    a2a = analysis.collectives.all_to_all
    frame = alltoall_with_data(a2a.per_instance, analysis.run.sidecar)
    worst = frame[["send_imbalance", "recv_imbalance"]].astype(float).max(axis=1)
    frame = frame.assign(
        _worst=worst,
        send_mb=frame["send_bytes_total"].astype(float) / 1e6,
        matrix=frame["instance"].isin(list(a2a.matrices)),
    )[worst.notna()]
    frame = frame.sort_values(["_worst", "instance"], ascending=[False, True], kind="stable")
    columns = [c for c in A2A_COLUMNS if c in frame.columns]
    return frame.head(shown)[columns].rename(columns=A2A_COLUMNS).reset_index(drop=True)


def imbalance_steps(sidecar: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per step, the logged imbalance of the random split and of the split used; None if absent."""
    columns = ["imbalance_before", "imbalance_after"]
    if sidecar is None or not set(columns) <= set(sidecar.columns):
        return None
    logged = sidecar.dropna(subset=columns, how="all")
    if logged.empty:
        return None
    return logged.groupby("step", as_index=False)[columns].first()


def oracle_split(total_ms: float, data_share: float | None) -> tuple[float, float] | None:
    """The oracle's straggler wait split between the data and the noise: ``total x share``
    and the rest, so that neither is ever above the total they split (None without a share)."""
    if data_share is None or math.isnan(data_share) or math.isnan(total_ms):
        return None
    share = min(max(data_share, 0.0), 1.0)
    return total_ms * share, total_ms * (1 - share)


def degenerate_terms(model: CostModel) -> str | None:
    """``"L²"`` (or ``"L"``, ``"c0"``) when a fitted cost model has only that one term non-zero
    (a fit at a bound: it cannot tell the terms apart), None otherwise (a zero model too)."""
    terms = {"c0": model.c0, "L": model.a, "L²": model.b, "ids": model.ids}
    nonzero = [name for name, value in terms.items() if value != 0]
    return nonzero[0] if len(nonzero) == 1 else None


def run_facts(
    entry: RunEntry,
    analysis: Analysis | None,
    error: str | None,
    state: tuple[str | None, str | None],
) -> dict[str, Any]:
    """One row of the runs table; ``state``: the run's status and why it stopped
    (:func:`dashboard.store.run_state`)."""
    meta = entry.meta
    row: dict[str, Any] = {
        "run": entry.run_id,
        "bubble ratio": None,
        "world size": meta.world_size if meta else None,
        "device": meta.device if meta else None,
        "ranks loaded": None,
        "steps": None,
        "toggles": toggles_summary(entry.meta),
        "status": state[0] or "no run.json",
        "why stopped": state[1] or "",
        "simulated": meta is not None and meta.simulated,
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


def has_sidecar(analysis: Analysis | None) -> bool:
    """True when the run has a bubble breakdown and step sidecars (the samples' lengths)."""
    return has_data(analysis) and analysis is not None and analysis.run.sidecar is not None


COLUMN_WORDS = {
    "coll": "collective",
    "span": "ranks on",
    "rank_ms": "rank-time (ms)",
    "bytes_known": "every size recorded",
    "times_last": "steps last",
    "wait_share": "share of the wait",
    "times_arrived_last": "last at (collectives)",
    "gpu_active_share": "GPU working",
    "host_bound_share": "host-bound",
    "idle_share": "idle",
    "culprit_cost": "straggler's cost",
    "culprit_has_max_cost": "straggler had the costliest data",
    "max_cost_tied": "costliest tied",
    "non_compute_time_us": "non-compute time (µs)",
    "non_compute_time_pctg": "non-compute time (%)",
    "comp_comm_overlap_pctg": "compute overlapped with comm (%)",
    "idle_category": "cause",
    "idle_time_ratio": "share of idle time",
    "ci_lo": "CI low",
    "ci_hi": "CI high",
}
"""Words for fsobs's column names that :func:`column_label`'s rule would not find (the words
of ``fsobs analyze``'s tables where it has them)."""
_UNITS = {"ms": "ms", "us": "µs", "ns": "ns", "mb": "MB", "pctg": "%"}
_ACRONYMS = {"gpu": "GPU", "cpu": "CPU", "hta": "HTA", "ci": "CI", "id": "ID", "ids": "IDs"}
_SIDES = ("control", "test", "delta")


def column_label(name: object) -> str:
    """A column as the tables show it: ``bubble_ms_per_step`` -> ``bubble / step (ms)``,
    ``straggler_wait_ms_test`` -> ``straggler wait (ms): test``; a name without ``_`` as it is.

    :data:`COLUMN_WORDS` first; else the words of the name, its unit (``_ms``, ``_us``,
    ``_pctg``, ...) in parentheses, ``per_step`` as ``/ step``, acronyms in capitals, and a
    Compare side (``_control``, ``_test``, ``_delta``) after a colon."""
    text = str(name)
    if text in COLUMN_WORDS:
        return COLUMN_WORDS[text]
    if "_" not in text:
        return text
    *rest, last = text.split("_")
    if last in _SIDES:
        return f"{column_label('_'.join(rest))}: {last}"
    words, units = [], []
    for token in text.split("_"):
        if token in _UNITS:
            units.append(_UNITS[token])
        elif token == "per":
            words.append("/")
        else:
            words.append(_ACRONYMS.get(token, token))
    return " ".join(words) + "".join(f" ({unit})" for unit in units)
