"""The all_to_all(v) imbalance in ``fsobs analyze``
(:mod:`fsobs.analysis.collectives.alltoall`): its JSON, its tables and its finding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from fsobs.analysis import Analysis
from fsobs.analysis.collectives.alltoall import alltoall_with_data
from fsobs.report._format import cell, table
from fsobs.report._json import clean, records

_SHOWN = 5
"""Instances in the human report's table: the most uneven ones."""
_MAX_MATRIX_RANKS = 16
_UNEVEN = 1.05
"""A finding names the imbalance from this max/mean on."""
COLUMNS = {
    "instance": "instance",
    "step": "step",
    "coll": "collective",
    "num_ranks": "ranks",
    "send_mb": "MB sent",
    "send_imbalance": "send max/mean",
    "recv_imbalance": "receive max/mean",
    "heaviest_sender": "top sender",
    "heaviest_receiver": "top receiver",
    "most_ids_rank": "most ids (sidecar)",
}


def imbalance(analysis: Analysis) -> pd.DataFrame:
    """Every all_to_all(v) instance's imbalance, tied to the step sidecars' data."""
    return alltoall_with_data(analysis.collectives.all_to_all.per_instance, analysis.run.sidecar)


def all_to_all_json(analysis: Analysis) -> dict[str, Any]:
    """``per_instance`` (one record per instance) and ``matrices`` (``instance``, ``ranks``,
    ``bytes``: row r, column j = bytes rank ``ranks[r]`` sent to rank ``ranks[j]``)."""
    matrices = analysis.collectives.all_to_all.matrices
    return {
        "per_instance": records(imbalance(analysis)),
        "matrices": [
            {"instance": inst, "ranks": ranks, "bytes": clean(matrix.tolist())}
            for inst, (ranks, matrix) in sorted(matrices.items())
        ],
    }


def all_to_all_tables(analysis: Analysis) -> list[str | Table]:
    """The most uneven instances, and the volume matrix of the most uneven one that has one."""
    frame = _uneven(imbalance(analysis))
    if frame.empty or _worst(frame.iloc[0]) < _UNEVEN:
        return []
    frame = frame.assign(send_mb=frame["send_bytes_total"] / 1e6)
    items: list[str | Table] = [
        table(f"all_to_all(v) imbalance (the {_SHOWN} most uneven instances)", frame, COLUMNS)
    ]
    matrices = analysis.collectives.all_to_all.matrices
    with_matrix = [i for i in frame["instance"].tolist() if i in matrices]
    if with_matrix and len(matrices[with_matrix[0]][0]) <= _MAX_MATRIX_RANKS:
        items.append(_matrix_table(with_matrix[0], *matrices[with_matrix[0]]))
    return items


def _uneven(frame: pd.DataFrame) -> pd.DataFrame:
    """The instances with a known imbalance, the most uneven (send or receive) first."""
    worst = frame[["send_imbalance", "recv_imbalance"]].max(axis=1)
    known = frame.assign(_worst=worst)[worst.notna()]
    ordered = known.sort_values(["_worst", "instance"], ascending=[False, True], kind="stable")
    return ordered.head(_SHOWN).drop(columns="_worst")


def _worst(row: pd.Series) -> float:
    """The larger of an instance's send and receive imbalance."""
    return float(np.nanmax(row[["send_imbalance", "recv_imbalance"]].to_numpy(np.float64)))


def _matrix_table(instance: int, ranks: list[int], matrix: np.ndarray) -> Table:
    title = f"all_to_all(v) instance {instance}: bytes sent (row) to (column)"
    out = Table(title=title, title_justify="left", min_width=len(title))
    out.add_column("from \\ to", justify="right")
    for rank in ranks:
        out.add_column(str(rank), justify="right")
    for rank, row in zip(ranks, matrix.tolist(), strict=True):
        out.add_row(str(rank), *(cell(int(round(v))) for v in row))
    return out


def all_to_all_findings(analysis: Analysis) -> list[str]:
    """The most uneven all_to_all(v) and, with sidecars, whether the data explains it."""
    frame = imbalance(analysis)
    uneven = _uneven(frame)
    if uneven.empty or _worst(uneven.iloc[0]) < _UNEVEN:
        return []
    top = uneven.iloc[0]
    sizes = [
        f"{top[f'{way}_imbalance']:.2f}x the mean {done}"
        for way, done in (("send", "sent"), ("recv", "received"))
        if not pd.isna(top[f"{way}_imbalance"])
    ]
    sender = "a tie" if pd.isna(top["heaviest_sender"]) else f"rank {top['heaviest_sender']}"
    line = (
        f"all_to_all(v) sizes are uneven: up to {' and '.join(sizes)} (instance "
        f"{top['instance']}, step {top['step']}, top sender {sender})"
    )
    median = frame["send_imbalance"].median()
    if not pd.isna(median):
        line += f"; median over {len(frame)} instance(s) {median:.2f}x sent"
    tied = frame["heaviest_sender_has_most_ids"].dropna()
    if len(tied):
        line += (
            f"; the top sender had its step's most ids (step sidecars) in {int(tied.sum())} of "
            f"{len(tied)} instance(s)"
        )
    return [line]
