"""The per-step tables of a run's classes, in ms: bubbles, roles, the wait each rank caused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.analysis.bubbles.classify import StepBubbles
from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES, CLASSES
from optim.markers import PEC_ROLES, ROLES

BUBBLE_TABLE_COLUMNS = [
    "rank",
    "step",
    "window_ms",
    "busy_ms",
    "bubble_ms",
    *(f"{c}_ms" for c in BUBBLE_CLASSES),
    "contention_ms",
]
ROLE_CLASSES = ("straggler_wait", "exposed_comm")
ROLE_TABLE_COLUMNS = ["rank", "step", "role", *(f"{c}_ms" for c in ROLE_CLASSES)]
CAUSED_COLUMNS = ["step", "rank", "culprit", "wait_ns"]
Columns = dict[str, np.ndarray]


def bubble_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """Per rank and step, in ms: window, busy, bubble and its classes, contention beside."""
    return _frame([_bubble_columns(steps)], BUBBLE_TABLE_COLUMNS)


def role_table(steps: list[StepBubbles], roles: tuple[str, ...] = ROLES) -> pd.DataFrame:
    """Per rank, step and role, in ms: the straggler_wait and exposed_comm spent in collectives
    of that role (every role of ``roles`` on every row, 0 when none; :func:`run_roles`)."""
    return _frame([_role_columns(steps, roles)], ROLE_TABLE_COLUMNS)


def run_roles(instances: pd.DataFrame) -> tuple[str, ...]:
    """The roles a run's role table has: :data:`optim.markers.ROLES` always, then the PEC roles
    of its matched collectives (``instances``: :attr:`Collectives.instances`), in the order of
    :data:`optim.markers.PEC_ROLES`."""
    present = set(instances["role"].astype(str)) if len(instances) else set()
    return (*ROLES, *(role for role in PEC_ROLES if role in present))


def caused_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """step, rank (who waited), culprit (who caused it), wait_ns: straggler_wait, charged
    (:attr:`StepBubbles.caused_ns`; no row for 0 ns)."""
    return _frame([_caused_columns(steps)], CAUSED_COLUMNS)


@dataclass
class StepTables:
    """:func:`bubble_table`, :func:`role_table` and :func:`caused_table` of a run, gathered a
    rank at a time (:meth:`add`): only their numbers are kept, not the steps' interval sets."""

    role_names: tuple[str, ...] = ROLES
    """The roles of the role table (:func:`run_roles`)."""
    bubbles: list[Columns] = field(default_factory=list)
    roles: list[Columns] = field(default_factory=list)
    caused: list[Columns] = field(default_factory=list)

    def add(self, steps: list[StepBubbles]) -> None:
        self.bubbles.append(_bubble_columns(steps))
        self.roles.append(_role_columns(steps, self.role_names))
        self.caused.append(_caused_columns(steps))

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(bubble table, role table, caused table), rows in the order added."""
        return (
            _frame(self.bubbles, BUBBLE_TABLE_COLUMNS),
            _frame(self.roles, ROLE_TABLE_COLUMNS),
            _frame(self.caused, CAUSED_COLUMNS),
        )


def _frame(chunks: list[Columns], columns: list[str]) -> pd.DataFrame:
    """The rows of ``chunks`` in order (a frame without rows when there are none)."""
    chunks = [c for c in chunks if len(c[columns[0]])]
    if not chunks:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame({n: np.concatenate([c[n] for c in chunks]) for n in columns})


def _bubble_columns(steps: list[StepBubbles]) -> Columns:
    table: Columns = {
        "rank": np.array([sb.rank for sb in steps], np.int64),
        "step": np.array([sb.step for sb in steps], np.int64),
        "window_ms": np.array([sb.window[1] - sb.window[0] for sb in steps], np.int64) / 1e6,
    }
    for name in CLASSES:
        table[f"{name}_ms"] = _total_ns([sb.classes[name] for sb in steps]) / 1e6
    table["bubble_ms"] = table["window_ms"] - table["busy_ms"]
    table["contention_ms"] = np.array([sb.contention_ns for sb in steps], np.int64) / 1e6
    return table


def _role_columns(steps: list[StepBubbles], roles: tuple[str, ...]) -> Columns:
    every = [(sb, role) for sb in steps for role in roles]
    return {
        "rank": np.array([sb.rank for sb, _ in every], np.int64),
        "step": np.array([sb.step for sb, _ in every], np.int64),
        "role": np.array([role for _, role in every], object),
        **{
            f"{c}_ms": np.array([sb.by_role_ns.get((c, r), 0) for sb, r in every], np.int64) / 1e6
            for c in ROLE_CLASSES
        },
    }


def _caused_columns(steps: list[StepBubbles]) -> Columns:
    rows = [
        (sb.step, sb.rank, culprit, ns)
        for sb in steps
        for culprit, ns in sb.caused_ns.items()
        if ns > 0
    ]
    table = np.array(rows, np.int64).reshape(len(rows), len(CAUSED_COLUMNS))
    return dict(zip(CAUSED_COLUMNS, table.T, strict=True))


def _total_ns(sets: list[iv.Intervals]) -> np.ndarray:
    """Total length of each canonical set (what :meth:`StepBubbles.total_ns` gives one)."""
    if not sets:
        return np.zeros(0, np.int64)
    pieces = np.concatenate([s[1] for s in sets]) - np.concatenate([s[0] for s in sets])
    running = np.concatenate([[0], np.cumsum(pieces)])
    bounds = np.cumsum([0, *(len(s[0]) for s in sets)])
    return cast(np.ndarray, running[bounds[1:]] - running[bounds[:-1]])


def step_times(steps: pd.DataFrame) -> pd.Series:
    """The step time of each step of a :func:`bubble_table` (ms, indexed by step): its longest
    window over the ranks."""
    return steps.groupby("step")["window_ms"].max().rename("step_time_ms")
