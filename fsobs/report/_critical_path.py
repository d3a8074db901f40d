"""The critical path in ``fsobs analyze``: its JSON object and its few report lines."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.markup import escape
from rich.table import Table

from fsobs.analysis import Analysis
from fsobs.report._format import duration, time_unit
from fsobs.report._json import plain

SEGMENT_KEYS = ("rank", "kind", "name", "start_ns", "end_ns")
TOP_SEGMENTS = 3


def critical_path_json(analysis: Analysis) -> dict[str, Any]:
    """``{steps: [{step, root_rank, end_rank, start_ns, end_ns, charged: {bubble_ms, phase,
    cause}, segments: [{rank, kind, name, start_ns, end_ns}]}]}``: every step's path in time
    order, its segments tiling ``[start_ns, end_ns)`` (aligned clock, ns)."""
    path = analysis.critical_path
    segments: dict[int, list[dict[str, Any]]] = {}
    columns = [path.segments[k].tolist() for k in ("step", *SEGMENT_KEYS)]
    for step, *values in zip(*columns, strict=True):
        segments.setdefault(int(step), []).append(dict(zip(SEGMENT_KEYS, values, strict=True)))
    return {
        "steps": [
            {
                "step": int(row["step"]),
                "root_rank": int(row["root_rank"]),
                "end_rank": int(row["end_rank"]),
                "start_ns": int(row["start_ns"]),
                "end_ns": int(row["end_ns"]),
                "charged": {k: plain(row[k]) for k in ("bubble_ms", "phase", "cause")},
                "segments": segments.get(int(row["step"]), []),
            }
            for row in path.steps.to_dict("records")
        ]
    }


def critical_path_lines(analysis: Analysis) -> list[str | Table]:
    """The root rank of the steps and the top segments of the path, in a few lines."""
    path = analysis.critical_path
    if path.steps.empty:
        return []
    roots = path.steps["root_rank"].value_counts()
    num_steps = len(path.steps)
    ranks, counts = roots.index.tolist(), roots.tolist()
    others = ", ".join(f"rank {r} ({n})" for r, n in zip(ranks[1:4], counts[1:4], strict=True))
    lines: list[str | Table] = [
        f"Critical path: root rank {ranks[0]} in {counts[0]} of {num_steps} step(s)"
        + (f"; also {others}" if others else "")
    ]
    unit = time_unit(float(analysis.summary["step_time_ms_p50"]))
    for rank, kind, name, ms in _top_segments(path.segments, num_steps):
        label = f"{kind} {escape(name)}" if name else kind
        lines.append(f"  rank {rank} {label}: {duration(ms, unit)} per step")
    return lines


def _top_segments(segments: pd.DataFrame, num_steps: int) -> list[tuple[int, str, str, float]]:
    """The :data:`TOP_SEGMENTS` (rank, kind, name) that take the most path time: mean ms per
    step over the steps."""
    time = (segments["end_ns"] - segments["start_ns"]).rename("ns")
    sums = time.groupby([segments["rank"], segments["kind"], segments["name"]]).sum()
    best = sums.sort_values(ascending=False, kind="stable").head(TOP_SEGMENTS)
    keys: list[tuple[int, str, str]] = best.index.tolist()
    return [
        (int(rank), str(kind), str(name), ns / 1e6 / num_steps)
        for (rank, kind, name), ns in zip(keys, best.tolist(), strict=True)
    ]
