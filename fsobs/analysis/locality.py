"""Communication inside a host and across hosts: per collective class, how much of the
communication time and bytes belonged to collectives whose ranks all ran on one host.

A matched collective instance (:attr:`fsobs.analysis.collectives.matching.Collectives.instances`:
one row per member rank) is **intra-node** when every member rank's trace names the same host
(``host_name``), **inter-node** when they name two or more, and **unknown** when a member's
trace names none. The members are the ranks that took part in the instance, which are the
process group's ranks (a group's collective is matched across exactly its members)::

    host a: ranks 0 1     host b: ranks 2 3
    all_reduce over {0, 1}        -> intra-node
    all_to_all over {0, 1, 2, 3}  -> inter-node (its intra-host part is not split off)

Per class (``coll``) and span: the instances, their rank-time (the sum of the member ranks'
own collective durations, as ``comm_time_ms`` of the overview counts it) and their bytes (the
members' ``msg_bytes``, where the trace records them). Host names are what the profiler wrote:
containers of one machine that report different names count as different hosts, and hosts
that share a name (a default name in every container) as one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsobs.analysis.pipeline import Analysis

SPANS = ("intra-node", "inter-node", "unknown")
LOCALITY_COLUMNS = ["coll", "span", "instances", "rank_ms", "bytes", "bytes_known"]


def comm_locality(analysis: Analysis) -> pd.DataFrame:
    """One row per (collective class, span) with any instance: :data:`LOCALITY_COLUMNS`
    (``bytes`` sums the members' known ``msg_bytes``; ``bytes_known``: whether every member
    recorded its size)."""
    inst = analysis.collectives.instances
    if inst.empty:
        return pd.DataFrame(columns=LOCALITY_COLUMNS)
    hosts = {r: t.host_name or "" for r, t in analysis.run.ranks.items()}
    frame = inst[["instance", "coll", "rank", "start_ns", "end_ns", "msg_bytes"]].copy()
    frame["host"] = frame["rank"].map(hosts).fillna("")
    per = frame.groupby("instance").agg(
        coll=("coll", "first"),
        hosts=("host", "nunique"),
        unnamed=("host", lambda h: bool((h == "").any())),
    )
    per["span"] = np.where(
        per["unnamed"], "unknown", np.where(per["hosts"] == 1, "intra-node", "inter-node")
    )
    frame["span"] = frame["instance"].map(per["span"])
    frame["rank_ms"] = (frame["end_ns"] - frame["start_ns"]) / 1e6
    frame["known"] = frame["msg_bytes"] >= 0
    frame["bytes"] = frame["msg_bytes"].where(frame["known"], 0)
    out = frame.groupby(["coll", "span"], observed=True).agg(
        instances=("instance", "nunique"),
        rank_ms=("rank_ms", "sum"),
        bytes=("bytes", "sum"),
        bytes_known=("known", "all"),
    )
    out = out.reset_index()
    out["span"] = pd.Categorical(out["span"], SPANS, ordered=True)
    out = out.sort_values(["coll", "span"]).reset_index(drop=True)
    out["span"] = out["span"].astype(str)
    out["bytes"] = out["bytes"].astype(np.int64)
    return out[LOCALITY_COLUMNS]


def intra_share(table: pd.DataFrame) -> tuple[float, float] | None:
    """Of all communication with a known span: the share of rank-time and of (known) bytes in
    intra-node collectives; None when no span is known."""
    known = table[table["span"] != "unknown"]
    if known.empty or not known["rank_ms"].sum() > 0:
        return None
    intra = known[known["span"] == "intra-node"]
    time = float(intra["rank_ms"].sum() / known["rank_ms"].sum())
    total_bytes = float(known["bytes"].sum())
    share = float(intra["bytes"].sum() / total_bytes) if total_bytes > 0 else float("nan")
    return time, share
