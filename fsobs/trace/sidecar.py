"""The step sidecar ``steps.rank<R>.jsonl`` (DESIGN §3): what data each rank got in each step.

One JSON object per line::

    {"step": 12, "num_samples": 64, "seq_lengths": [310, 17, ...],   # or the three sums below
     "len_sum": 20480, "len_sq_sum": 9123456, "len_max": 4096,
     "est_cost": 1.84e7,                     # cost-model estimate of the rank's compute
     "wall_start_ns": 1790..., "wall_end_ns": 1790...,
     "loss": 0.69,                           # the step's training loss on this rank
     "imbalance_before": 1.41, "imbalance_after": 1.01, "batch_digest": "9f2c...",
     "gc_count": 1, "gc_ms": 4.2, "gc_max_gen": 0,   # this rank's GC pauses in the step
     "cpu_ms": 171.3, "nivcsw": 12}          # training thread's CPU time, preemptions

``seq_lengths`` may be replaced by ``len_sum``/``len_sq_sum``/``len_max`` when there are too many
samples; everything after ``len_max`` is optional (NaN / None in the frame when absent). The
frame gets ``wall_ms`` (``wall_end_ns - wall_start_ns``) too. The
balance fields are the same on every rank of a step: max / mean estimated cost over the ranks
for the random split and for the split used, and a digest of the step's global batch (equal
digests: the same samples).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsobs.errors import TraceFormatError, TraceReadError
from fsobs.trace.storage import Location, as_location, list_dir, read_text

SIDECAR_RE = re.compile(r"^steps\.rank(\d+)\.jsonl$")
COLUMNS = (
    "rank",
    "step",
    "num_samples",
    "len_sum",
    "len_sq_sum",
    "len_max",
    "est_cost",
    "loss",
    "imbalance_before",
    "imbalance_after",
    "batch_digest",
    "wall_ms",
    "gc_count",
    "gc_ms",
    "gc_max_gen",
    "cpu_ms",
    "nivcsw",
)
_OPTIONAL_FLOATS = ("est_cost", "loss", "imbalance_before", "imbalance_after")
_OPTIONAL_PAUSES = ("gc_count", "gc_ms", "gc_max_gen", "cpu_ms", "nivcsw")
"""Floats, NaN when a record lacks them (traces without them analyze; causes are unknown)."""


def read_sidecars(run_dir: Location) -> pd.DataFrame | None:
    """The sidecars of a run directory (a path or a URL) as one frame (columns ``COLUMNS``);
    None without any."""
    files = sidecar_files(run_dir)
    if not files:
        return None
    rows = []
    for path, rank in files:
        rows.extend(_read_one(path, rank))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def read_step_lengths(run_dir: str | Location, step: int) -> dict[int, np.ndarray]:
    """Per rank, the per-sample lengths (int64) of ``step``, from the sidecars that list them
    (a rank whose record has only the sums, or lacks the step, is left out)."""
    out: dict[int, np.ndarray] = {}
    for path, rank in sidecar_files(as_location(run_dir)):
        for line in read_text(path).splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("step") == step and record.get("seq_lengths") is not None:
                out[rank] = np.asarray(record["seq_lengths"], dtype=np.int64)
                break
    return out


def sidecar_files(run_dir: Location) -> list[tuple[Location, int]]:
    """(file, rank) of every ``steps.rank<R>.jsonl`` of the run directory, sorted by name."""
    if isinstance(run_dir, Path):
        names: list[Location] = list(run_dir.glob("steps.rank*.jsonl"))
    else:
        try:
            names = [e.location for e in list_dir(run_dir) if not e.is_dir]
        except OSError as exc:
            raise TraceReadError(f"cannot list the run folder: {exc}", path=run_dir) from exc
    found = []
    for path in sorted(names, key=lambda p: p.name):
        match = SIDECAR_RE.match(path.name)
        if match is not None:
            found.append((path, int(match.group(1))))
    return found


def _read_one(path: Location, rank: int) -> list[dict[str, float | int | str | None]]:
    rows = []
    try:
        lines = read_text(path).splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"unreadable step sidecar ({exc})", path=path, rank=rank) from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            rows.append(_row(record, rank))
        except (json.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
            raise TraceFormatError(
                f"bad step record ({exc})", path=path, rank=rank, field=f"line {number}"
            ) from exc
    return rows


def _row(record: dict[str, Any], rank: int) -> dict[str, float | int | str | None]:
    lengths = record.get("seq_lengths")
    if lengths is not None:
        len_sum = sum(int(v) for v in lengths)
        len_sq_sum = sum(int(v) ** 2 for v in lengths)
        len_max = max((int(v) for v in lengths), default=0)
        num_samples = int(record.get("num_samples", len(lengths)))
    else:
        len_sum, len_sq_sum = int(record["len_sum"]), int(record["len_sq_sum"])
        len_max, num_samples = int(record["len_max"]), int(record["num_samples"])
    row: dict[str, float | int | str | None] = {
        "rank": rank,
        "step": int(record["step"]),
        "num_samples": num_samples,
        "len_sum": len_sum,
        "len_sq_sum": len_sq_sum,
        "len_max": len_max,
    }
    for name in (*_OPTIONAL_FLOATS, *_OPTIONAL_PAUSES):
        value = record.get(name)
        row[name] = float(value) if value is not None else float("nan")
    digest = record.get("batch_digest")
    row["batch_digest"] = str(digest) if digest is not None else None
    start, end = record.get("wall_start_ns"), record.get("wall_end_ns")
    row["wall_ms"] = (
        (int(end) - int(start)) / 1e6 if start is not None and end is not None else None
    )
    return row
