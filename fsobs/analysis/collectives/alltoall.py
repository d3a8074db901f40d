"""all_to_all(v) imbalance: how much each rank sends and receives at each matched instance.

An all_to_allv moves ``split[j]`` rows from rank r to the j-th rank of its group (``In split
size``: what r sends). The ranks with the most to send or receive finish last, and everyone
else waits for them: the cost of uneven data in an embedding exchange. Per instance, over its
ranks::

    send_imbalance = max_r send_r / mean_r send_r       send_r: In msg nelems x dtype size
    recv_imbalance = max_r recv_r / mean_r recv_r       recv_r: Out msg nelems x dtype size
    matrix[r][j]   = send_r x split_r[j] / sum_j split_r[j]       bytes rank r sends to rank j

1.0 is perfectly balanced; NaN where a rank's size is not recorded. The matrix needs every
rank's split sizes (a trace truncates a list beyond 30 entries: then there is none); its rows
and columns are the instance's ranks in ascending order (PyTorch numbers a group's ranks so).
Where the received sizes are not recorded, the matrix's column sums give them.

With step sidecars (:func:`alltoall_with_data`) each instance is tied to the data: the rank with the
most ids in that step (``len_sum``, the sum of its samples' sequence lengths), and whether it
is the heaviest sender, since the ids a rank sends to the embedding shards are its samples'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsobs.trace.categorical import codes, decoded, is_in
from fsobs.trace.classify import dtype_bytes

ALL_TO_ALL = ("all_to_all", "all_to_allv")
VOLUME_INPUTS = ("recv_bytes", "in_split")
"""The columns :func:`volume_columns` adds to a rank's collectives, which the matching
carries to :func:`all_to_all_table`."""
IMBALANCE_COLUMNS = [
    "instance",
    "step",
    "group",
    "coll",
    "num_ranks",
    "send_bytes_total",
    "send_imbalance",
    "recv_imbalance",
    "heaviest_sender",
    "heaviest_receiver",
]
DATA_COLUMNS = ["most_ids_rank", "heaviest_sender_has_most_ids"]


@dataclass
class AllToAll:
    """``per_instance``: one row per all_to_all(v) instance (:data:`IMBALANCE_COLUMNS`; null
    ranks for ties or unknown sizes). ``matrices``: instance -> (its ranks, the rank x rank
    bytes), for the instances whose ranks all recorded their split sizes."""

    per_instance: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=IMBALANCE_COLUMNS)
    )
    matrices: dict[int, tuple[list[int], np.ndarray]] = field(default_factory=dict)


def volume_columns(colls: pd.DataFrame, at: np.ndarray) -> dict[str, np.ndarray]:
    """For the collectives at positions ``at`` of a rank's
    :attr:`fsobs.trace.RankTrace.collectives`: the bytes received (``Out msg nelems`` x dtype
    size, -1 unknown) and the send split sizes (a list of ints, None unless an all_to_all(v)
    recorded them whole; an object array)."""
    size = decoded(colls["dtype"], dtype_bytes(None), _dtype_bytes)[at].astype(np.int64)
    out = colls["out_nelems"].to_numpy(np.int64)[at]
    recv = np.where((out >= 0) & (size > 0), out * size, -1)
    texts = decoded(colls["in_split"])[at]
    splits = np.full(len(at), None, object)
    recorded = is_in(colls["coll"], ALL_TO_ALL) & (codes(colls["in_split"]) >= 0)
    for k in np.flatnonzero(recorded[at]).tolist():  # no text: no split sizes (None)
        splits[k] = _splits(texts[k])
    return {"recv_bytes": recv, "in_split": splits}


def _dtype_bytes(dtype: object) -> int:
    return dtype_bytes(dtype if isinstance(dtype, str) else None)


def _splits(text: object) -> list[int] | None:
    """``"[3, 1]"`` -> ``[3, 1]``; None for ``"[]"`` (equal splits), a truncated list
    (``"[1, 2, ..., 9]"``) or anything else."""
    if not isinstance(text, str) or "..." in text:
        return None
    try:
        values = [int(v) for v in text.strip("[] ").split(",") if v.strip()]
    except ValueError:
        return None
    return values if values and min(values) >= 0 else None


def all_to_all_table(instances: pd.DataFrame) -> AllToAll:
    """Imbalance and volume matrix of every all_to_all(v) instance (module docstring), from
    the matched instances with the :data:`VOLUME_INPUTS` columns."""
    a2a = instances[instances["coll"].isin(ALL_TO_ALL)].sort_values(["instance", "rank"])
    if a2a.empty:
        return AllToAll()
    a2a = a2a.assign(send=a2a["msg_bytes"].astype(np.float64))
    matrices = _matrices(a2a)
    recv = a2a["recv_bytes"].astype(np.float64).to_numpy()
    for inst, (_, matrix) in matrices.items():  # received sizes from the matrix
        mine = (a2a["instance"] == inst).to_numpy()
        recv[mine] = np.where(recv[mine] < 0, matrix.sum(axis=0), recv[mine])
    a2a = a2a.assign(recv=recv)
    by = a2a.groupby("instance", sort=True)
    send_total = by["send"].sum().where(by["send"].min() >= 0)
    per_instance = pd.DataFrame(
        {
            "instance": by["instance"].first().astype(np.int64),
            "step": by["step"].agg(lambda s: int(s.mode().iloc[0])).astype(np.int64),
            "group": by["group"].first(),
            "coll": by["coll"].first(),
            "num_ranks": by.size().astype(np.int64),
            "send_bytes_total": send_total,
            "send_imbalance": _imbalance(a2a, "send"),
            "recv_imbalance": _imbalance(a2a, "recv"),
            "heaviest_sender": _heaviest(a2a, "send"),
            "heaviest_receiver": _heaviest(a2a, "recv"),
        }
    ).reset_index(drop=True)
    return AllToAll(per_instance[IMBALANCE_COLUMNS], matrices)


def _matrices(a2a: pd.DataFrame) -> dict[int, tuple[list[int], np.ndarray]]:
    """Bytes from each rank (rows) to each rank (columns) of the instances whose ranks all
    recorded whole split lists."""
    out = {}
    for inst, mine in a2a.groupby("instance", sort=True):
        send, splits = mine["send"].to_numpy(), mine["in_split"].tolist()
        if (send < 0).any() or any(s is None or len(s) != len(mine) for s in splits):
            continue
        parts = np.array(splits, np.float64)
        totals = parts.sum(axis=1, keepdims=True)
        shares = np.divide(parts, totals, out=np.zeros_like(parts), where=totals > 0)
        out[int(str(inst))] = (mine["rank"].astype(int).tolist(), shares * send[:, None])
    return out


def _imbalance(a2a: pd.DataFrame, column: str) -> pd.Series:
    """max / mean per instance; NaN when a size is unknown (< 0) or all are 0."""
    by = a2a.groupby("instance", sort=True)[column]
    mean = by.mean()
    return (by.max() / mean).where((by.min() >= 0) & (mean > 0))


def _heaviest(a2a: pd.DataFrame, column: str) -> pd.Series:
    """Per instance, the rank with the one largest size (Int64; null for a tie, an unknown
    size, or nothing sent)."""
    by = a2a.groupby("instance", sort=True)[column]
    top = a2a[column] == by.transform("max")
    first = a2a[top].groupby("instance", sort=True)["rank"].first()
    unique = top.groupby(a2a["instance"]).sum() == 1
    known = (by.min() >= 0) & (by.max() > 0)
    return first.where(unique & known).astype("Int64")


def alltoall_with_data(per_instance: pd.DataFrame, sidecar: pd.DataFrame | None) -> pd.DataFrame:
    """``per_instance`` (:attr:`AllToAll.per_instance`) with :data:`DATA_COLUMNS`: the rank
    with the most ids (``len_sum``) in the instance's step, and whether it is the heaviest
    sender (null without sidecars, for a tie, or where either is unknown)."""
    most = pd.Series(pd.NA, index=per_instance.index, dtype="Int64")
    if sidecar is not None and not sidecar.empty and len(per_instance):
        ids = sidecar.pivot_table(index="step", columns="rank", values="len_sum", aggfunc="sum")
        top = ids.eq(ids.max(axis=1), axis=0)
        single = ids.idxmax(axis=1).where(top.sum(axis=1) == 1)
        most = per_instance["step"].map(single).astype("Int64")
    sender = per_instance["heaviest_sender"].astype("Int64")
    same = (sender == most).astype("boolean").where(sender.notna() & most.notna())
    return per_instance.assign(most_ids_rank=most, heaviest_sender_has_most_ids=same)
