"""Each closed window analyzed once, its summary kept in the run (the run's index of windows).

A window is closed once every rank published it (:mod:`fsobs.runformat.windows`). The indexer
then completes its folder into a run of its own, ``run.json`` (the run's, ``complete``, with
every rank present) and each rank's sidecar lines of the window's steps, analyzes it like any
run (:func:`fsobs.analysis.analyze_path`), and keeps the result in ``summary.json``. Those
files are written atomically, summary last, so a reader that finds ``summary.json`` never
analyzes again; where the store cannot be written (read-only) the summary lives in the
reader's memory only. A window costs its own traces, whatever the run's length.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from fsobs.analysis import analyze_summary, summarize_path
from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from fsobs.analysis.bubbles.tables import step_times
from fsobs.analysis.pipeline import Analysis
from fsobs.errors import FsobsError
from fsobs.live.model import WindowSummary
from fsobs.runformat.atomic import write_atomic
from fsobs.runformat.bounded import read_limited
from fsobs.runformat.names import RUN_JSON, SUMMARY_JSON, sidecar_file_name
from fsobs.runformat.runmeta import RunMeta, write_run_json
from fsobs.runformat.steps import read_sidecars
from fsobs.runformat.windows import MAX_SMALL_JSON, WindowFolder

logger = logging.getLogger(__name__)


def read_summary(folder: Path) -> WindowSummary | None:
    """The window's kept summary, None when it has none (or one that cannot be read)."""
    path = folder / SUMMARY_JSON
    if not path.is_file():
        return None
    try:
        return WindowSummary.from_json(json.loads(read_limited(path, MAX_SMALL_JSON, "summary")))
    except (FsobsError, OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("%s: unreadable, analyzed again: %s", path, exc)
        return None


def analyze_window(
    window: WindowFolder, meta: RunMeta | None, lines: Mapping[int, list[bytes]]
) -> WindowSummary:
    """Analyze a closed window; ``lines``: each rank's sidecar lines of its steps. Keeps the
    completed folder and ``summary.json`` where it can (module docstring)."""
    folder = window.path
    ranks = tuple(sorted(window.notes))
    window_meta = _window_meta(meta, window, ranks)
    sidecar = _sidecar(folder, lines)
    run = summarize_path(folder)
    run = replace(run, sidecar=sidecar, meta=window_meta)
    summary = summarize(analyze_summary(run))
    _keep(folder, window_meta, summary)
    return summary


def summarize(analysis: Analysis) -> WindowSummary:
    """The index's numbers of one analyzed window."""
    kpis = analysis.summary
    per_step = analysis.stragglers.per_step
    late = per_step["rank"].dropna().astype(int).value_counts()
    sidecar = analysis.run.sidecar
    imbalance = {}
    for key in ("imbalance_before", "imbalance_after"):
        values = sidecar[key].to_numpy(dtype=float) if sidecar is not None else np.array([])
        values = values[np.isfinite(values)]
        imbalance[key] = float(values.mean()) if len(values) else None
    times = step_times(analysis.steps)
    causes = analysis.causes.shares if analysis.causes is not None else {}
    return WindowSummary(
        num_steps=int(analysis.steps["step"].nunique()),
        step_ms=float(times.mean()) if len(times) else float("nan"),
        bubble_ratio=float(kpis["bubble_ratio"]),
        bubble_ms_per_step=float(kpis["bubble_ms_per_step"]),
        classes_ms_per_step={c: float(kpis[f"{c}_ms_per_step"]) for c in BUBBLE_CLASSES},
        straggler=analysis.stragglers.culprit,
        straggler_wait_ms_per_step=float(kpis["straggler_wait_ms_per_step"]),
        late_steps={int(str(rank)): int(n) for rank, n in late.items()},
        causes={k: float(v) for k, v in causes.items() if np.isfinite(v)},
        imbalance_before=imbalance["imbalance_before"],
        imbalance_after=imbalance["imbalance_after"],
        analyzed_ns=time.time_ns(),
    )


def _window_meta(meta: RunMeta | None, window: WindowFolder, ranks: tuple[int, ...]) -> RunMeta:
    base = meta or RunMeta.now()
    name = f"{base.name or window.path.parent.parent.name} {window.wid}"
    return msgspec.structs.replace(
        base,
        name=name,
        status="complete",
        reason=None,
        ranks_present=ranks,
        world_size=base.world_size or len(ranks),
    )


def _sidecar(folder: Path, lines: Mapping[int, list[bytes]]) -> pd.DataFrame | None:
    """The window's sidecar lines as the analysis reads them: written into the folder (which
    they complete), or, where the store cannot be written, into a scratch folder."""
    try:
        _write_lines(folder, lines)
        return read_sidecars(folder)
    except OSError as exc:
        logger.info("%s: its sidecar lines kept in memory only: %s", folder, exc)
    with tempfile.TemporaryDirectory(prefix="fsobs-window-") as scratch:
        _write_lines(Path(scratch), lines)
        return read_sidecars(Path(scratch))


def _write_lines(folder: Path, lines: Mapping[int, list[bytes]]) -> None:
    for rank, rank_lines in lines.items():
        write_atomic(folder / sidecar_file_name(rank), b"".join(x + b"\n" for x in rank_lines))


def _keep(folder: Path, meta: RunMeta, summary: WindowSummary) -> None:
    """Complete the folder (run.json) and write summary.json last; a store that cannot be
    written keeps nothing (logged)."""
    try:
        if not (folder / RUN_JSON).exists():
            write_run_json(folder, meta)
        write_atomic(folder / SUMMARY_JSON, json.dumps(summary.to_json(), sort_keys=True).encode())
    except OSError as exc:
        logger.info("%s: summary kept in memory only: %s", folder, exc)
