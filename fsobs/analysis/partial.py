"""Partial runs: what each rank lacks, and what the analysis leaves out because of it.

Nothing is concluded from data that is missing or ambiguous; each gap is one line naming the
rank and what it lacks (:attr:`Gaps.lines`), and the rest is analyzed.

Traces (:func:`left_out_ranks`): a rank whose trace has no events, or no steps while other
ranks' traces have them, cannot be split into steps. It is left out of the analysis as if its
trace were missing: the process groups it belongs to then give no waits
(:mod:`fsobs.analysis.collectives.matching`), since it may be the rank the others waited for.
A rank whose trace lacks some steps the others have is kept; those steps are left out
(``Run.steps`` holds the steps of every rank).

Step sidecars (:func:`check_sidecar`), per (rank, step) of the analyzed ranks and steps:

- more than one line for a (rank, step) (a line written twice, or a second sidecar file for the
  rank such as ``steps.rank01.jsonl``): identical lines count once; lines that differ leave the
  (rank, step) without data, since nothing says which one is true;
- no line: the rank's data for that step is unknown.

The resolved sidecar has at most one row per (rank, step). What sets ranks against each other
within a step (the data attribution, the straggler causes) reads only the steps where every
analyzed rank has its row (:attr:`SidecarCheck.comparable`); what is per (rank, step) (the cost
fit, the what-if's lengths) reads every row, and says how many points it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fsobs.analysis.summary import RankSummary
from fsobs.runformat.names import sidecar_file_name
from fsobs.runformat.steps import sidecar_files
from fsobs.storage import Location
from fsobs.trace.schema import Run

WHOLE_TRACE = "whole trace"
"""The ``step_source`` of a trace without steps (one window)."""
_SHOWN = 8


@dataclass
class SidecarCheck:
    """The step sidecars as the analysis may use them (see the module docstring)."""

    frame: pd.DataFrame
    """At most one row per (rank, step): :func:`fsobs.runformat.steps.read_sidecars`' columns."""
    ranks: list[int]
    """The analyzed ranks."""
    full_steps: list[int]
    """The analyzed steps for which every analyzed rank has its row."""
    missing: dict[int, list[int]] = field(default_factory=dict)
    """Analyzed rank -> the analyzed steps without any line (every step: no sidecar at all)."""
    conflicting: dict[int, list[int]] = field(default_factory=dict)
    """Rank -> the steps whose several lines differ (left without data)."""
    repeated: dict[int, list[int]] = field(default_factory=dict)
    """Rank -> the steps with several identical lines (counted once)."""

    @property
    def comparable(self) -> pd.DataFrame:
        """The rows of the analyzed ranks in :attr:`full_steps`."""
        keep = self.frame["rank"].isin(self.ranks) & self.frame["step"].isin(self.full_steps)
        return self.frame[keep.to_numpy()].reset_index(drop=True)


@dataclass
class Gaps:
    """What the run lacks (see the module docstring)."""

    left_out: dict[int, str] = field(default_factory=dict)
    """Rank -> why its trace was left out of the analysis."""
    sidecar: SidecarCheck | None = None
    """None without step sidecars."""
    sidecar_files: dict[int, list[str]] = field(default_factory=dict)
    """Rank -> the names of its sidecar files, where it has more than one."""

    @property
    def lines(self) -> list[str]:
        """One line per gap, naming the rank and what it lacks."""
        lines = [f"rank {r}: {why}; left out of the analysis" for r, why in self.left_out.items()]
        if self.sidecar is not None:
            lines += _sidecar_lines(self.sidecar, self.sidecar_files)
        return lines


def left_out_ranks(run: Run[RankSummary]) -> dict[int, str]:
    """Rank -> why its trace cannot be analyzed (no events; no steps while other ranks have
    them); empty when no rank would be left to analyze."""
    stepped = {t.step_source for t in run.ranks.values() if t.step_source != WHOLE_TRACE}
    out = {}
    for rank, summary in run.ranks.items():
        if summary.overview["num_events"] == 0:
            out[rank] = "its trace has no events"
        elif stepped and summary.step_source == WHOLE_TRACE:
            marks = " / ".join(sorted(stepped))
            out[rank] = f"its trace has no steps ({marks}) while other ranks' traces have them"
    return out if len(out) < len(run.ranks) else {}


def without_ranks(run: Run[RankSummary], left_out: Mapping[int, str]) -> Run[RankSummary]:
    """``run`` without the ranks of ``left_out`` (a new run; the same sidecar and warnings)."""
    return Run(
        path=run.path,
        world_size=run.world_size,
        ranks={r: s for r, s in run.ranks.items() if r not in left_out},
        meta=run.meta,
        warnings=list(run.warnings),
        sidecar=run.sidecar,
    )


def check_sidecar(
    sidecar: pd.DataFrame, ranks: Sequence[int], steps: Sequence[int]
) -> SidecarCheck:
    """Resolve repeated lines and find the missing ones (see the module docstring) over the
    analyzed ``ranks`` and ``steps``."""
    keys = ["rank", "step"]
    twice = sidecar[sidecar.duplicated(keys, keep=False).to_numpy()]
    # keys of these rows only: a line's lengths are long
    lines = pd.Series([_row_key(r) for r in twice.itertuples(index=False)], twice.index, object)
    variants = twice.assign(_line=lines).groupby(keys, sort=True)["_line"].nunique()
    conflicting = variants.index[(variants > 1).to_numpy()]
    repeated = variants.index[(variants == 1).to_numpy()]
    bad = pd.MultiIndex.from_frame(sidecar[keys]).isin(conflicting)
    resolved = sidecar[~bad].drop_duplicates(keys)
    have = set(zip(resolved["rank"].tolist(), resolved["step"].tolist(), strict=True))
    logged = set(zip(sidecar["rank"].tolist(), sidecar["step"].tolist(), strict=True))
    missing = {r: [s for s in steps if (r, s) not in logged] for r in ranks}
    missing = {r: s for r, s in missing.items() if s}
    full = [s for s in steps if all((r, s) in have for r in ranks)]
    return SidecarCheck(
        frame=resolved.reset_index(drop=True),
        ranks=list(ranks),
        full_steps=full,
        missing=missing,
        conflicting=_by_rank(conflicting),
        repeated=_by_rank(repeated),
    )


def several_sidecar_files(run_dir: Location) -> dict[int, list[str]]:
    """Rank -> the names of its step sidecar files, for the ranks with more than one."""
    names: dict[int, list[str]] = {}
    for path, rank in sidecar_files(run_dir):
        names.setdefault(rank, []).append(path.name)
    return {r: n for r, n in names.items() if len(n) > 1}


def _row_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row as a hashable value that is equal for equal lines (NaN equal to NaN)."""
    out: list[Any] = []
    for value in row:
        if isinstance(value, np.ndarray):
            out.append(tuple(value.tolist()))
        elif isinstance(value, dict):
            out.append(tuple(sorted(value.items())))
        elif isinstance(value, float) and np.isnan(value):
            out.append(None)
        else:
            out.append(value)
    return tuple(out)


def _by_rank(index: pd.Index) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for rank, step in index:
        out.setdefault(int(rank), []).append(int(step))
    return out


def _sidecar_lines(check: SidecarCheck, files: Mapping[int, list[str]]) -> list[str]:
    lines = []
    for rank, names in files.items():
        lines.append(
            f"rank {rank} has {len(names)} step sidecars ({', '.join(names)}): their lines for "
            "the same step count once when identical, and not at all when they differ"
        )
    for rank, steps in check.conflicting.items():
        lines.append(
            f"rank {rank}: its step sidecar has differing lines for step(s) {_steps(steps)}; "
            "its data for those steps is unknown"
        )
    for rank, steps in check.repeated.items():
        lines.append(
            f"rank {rank}: its step sidecar repeats the line of step(s) {_steps(steps)}; "
            "counted once"
        )
    has_rows = set(check.frame["rank"].tolist())
    for rank, steps in check.missing.items():
        if rank not in has_rows and rank not in check.conflicting:
            lines.append(
                f"rank {rank} has no step sidecar ({sidecar_file_name(rank)}): its input data "
                "is unknown"
            )
        else:
            lines.append(
                f"rank {rank}: its step sidecar lacks step(s) {_steps(steps)} of its trace; "
                "its input data for those steps is unknown"
            )
    return lines


def _steps(steps: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:_SHOWN])
    return shown + (f" ... ({len(steps)} in all)" if len(steps) > _SHOWN else "")
