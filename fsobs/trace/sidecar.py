"""The step sidecar ``steps.rank<R>.jsonl`` (DESIGN §3): what data each rank got in each step.

One JSON object per line::

    {"step": 12, "num_samples": 64, "seq_lengths": [310, 17, ...],   # or the three sums below
     "len_sum": 20480, "len_sq_sum": 9123456, "len_max": 4096,
     "est_cost": 1.84e7,                     # cost-model estimate of the rank's compute
     "wall_start_ns": 1790..., "wall_end_ns": 1790...}

``seq_lengths`` may be replaced by ``len_sum``/``len_sq_sum``/``len_max`` when there are too many
samples; ``est_cost`` and the wall-clock bounds are optional.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from fsobs.errors import TraceFormatError

SIDECAR_RE = re.compile(r"^steps\.rank(\d+)\.jsonl$")
COLUMNS = ("rank", "step", "num_samples", "len_sum", "len_sq_sum", "len_max", "est_cost")


def read_sidecars(run_dir: Path) -> pd.DataFrame | None:
    """The sidecars of a run directory as one frame (columns ``COLUMNS``); None without any."""
    files = sorted(p for p in run_dir.glob("steps.rank*.jsonl") if SIDECAR_RE.match(p.name))
    if not files:
        return None
    rows = []
    for path in files:
        rank = int(SIDECAR_RE.match(path.name).group(1))  # type: ignore[union-attr]
        rows.extend(_read_one(path, rank))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _read_one(path: Path, rank: int) -> list[dict[str, float | int]]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
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


def _row(record: dict, rank: int) -> dict[str, float | int]:
    lengths = record.get("seq_lengths")
    if lengths is not None:
        len_sum = sum(int(v) for v in lengths)
        len_sq_sum = sum(int(v) ** 2 for v in lengths)
        len_max = max((int(v) for v in lengths), default=0)
        num_samples = int(record.get("num_samples", len(lengths)))
    else:
        len_sum, len_sq_sum = int(record["len_sum"]), int(record["len_sq_sum"])
        len_max, num_samples = int(record["len_max"]), int(record["num_samples"])
    cost = record.get("est_cost")
    return {
        "rank": rank,
        "step": int(record["step"]),
        "num_samples": num_samples,
        "len_sum": len_sum,
        "len_sq_sum": len_sq_sum,
        "len_max": len_max,
        "est_cost": float(cost) if cost is not None else float("nan"),
    }
