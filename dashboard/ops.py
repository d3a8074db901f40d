"""The ops and kernels behind the timeline's bars: names, streams and threads, self time.

The analysis (:class:`fsobs.Analysis`) keeps interval sets, not events, so these functions read
a rank's events again (:func:`fsobs.load_rank`) and reduce them to :data:`OPS_COLUMNS`. No
Streamlit here.

- **self time**: a GPU event's duration; a CPU op's duration minus its children's on the same
  thread (:class:`fsobs.analysis.bubbles.optree.OpTree`), so nested ops are not counted twice.
- **place**: ``stream <S>`` for a GPU event, ``thread <T>`` for a CPU one.
- A GPU run's bars are named by its GPU events (the resource the classes are computed on), a
  CPU run's by its CPU events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis import op_tree
from fsobs.trace import RankTrace

OPS_COLUMNS = ["rank", "step", "name", "kind", "place", "start_ns", "end_ns", "self_ns"]
LANE_KINDS = {
    "busy": ("compute",),
    "straggler_wait": ("comm",),
    "exposed_comm": ("comm",),
    "unattributed_comm": ("comm",),
    "host_idle": ("memcpy", "memset", "sync", "runtime", "annotation", "other"),
    "other": ("memcpy", "memset", "sync", "runtime", "annotation", "other", "comm"),
}
"""The kinds of event that name a bar of each class (a data loader's range on a CPU rank is an
annotation; a GPU's host idle has, by definition, no kernel to name)."""
NAMES_PER_BAR = 3
NAME_CHARS = 60
"""A hover shortens longer names (C++ kernel signatures) to this many characters."""
TOP_OPS = 20


def rank_ops(trace: RankTrace, device: str) -> pd.DataFrame:
    """The events of one rank that can name a bar (:data:`OPS_COLUMNS`; times absolute ns):
    on ``device`` (``gpu`` or ``cpu``), inside a step, not the step annotations themselves."""
    ev = trace.events
    ev = ev[(ev["device"] == device) & (ev["step"] >= 0) & (ev["dur_ns"] > 0)]
    start = ev["ts_ns"].to_numpy(np.int64)
    end = start + ev["dur_ns"].to_numpy(np.int64)
    self_ns = end - start
    if device == "cpu":
        for _, rows in ev.groupby(["pid", "tid"], observed=True).indices.items():
            tree = op_tree(start[rows], end[rows])
            self_ns[rows[tree.rows]] = tree.self_ns()
    if device == "gpu":
        place = "stream " + ev["stream"].astype(str)
    else:
        place = "thread " + ev["tid"].astype(str)
    frame = pd.DataFrame(
        {
            "rank": trace.rank,
            "step": ev["step"].to_numpy(np.int64),
            "name": ev["name"].astype(str).to_numpy(),
            "kind": ev["kind"].astype(str).to_numpy(),
            "place": place.to_numpy(),
            "start_ns": start,
            "end_ns": end,
            "self_ns": self_ns,
        }
    )
    return frame[frame["kind"] != "step"].reset_index(drop=True)


def top_ops(ops: pd.DataFrame, steps: Sequence[int], n: int = TOP_OPS) -> pd.DataFrame:
    """The ``n`` ops / kernels with the most self time in ``steps``, over the ranks in ``ops``.

    Columns: name, kind, where (its streams or threads, the busiest first, at most 3), count,
    self_ms, total_ms (its durations, children included), self_share (of the self time of
    every op in the table's steps and ranks).
    """
    chosen = ops[ops["step"].isin(list(steps))]
    total_self = float(chosen["self_ns"].sum())
    if chosen.empty:
        return pd.DataFrame(
            columns=["name", "kind", "where", "count", "self_ms", "total_ms", "self_share"]
        )
    dur = chosen["end_ns"] - chosen["start_ns"]
    grouped = chosen.assign(dur_ns=dur).groupby(["name", "kind"], sort=False)
    table = grouped.agg(
        count=("self_ns", "size"), self_ns=("self_ns", "sum"), dur_ns=("dur_ns", "sum")
    )
    places = chosen.groupby(["name", "kind", "place"], sort=False)["self_ns"].sum()
    where = {
        key: ", ".join(part.sort_values(ascending=False).index.get_level_values("place")[:3])
        for key, part in places.groupby(level=["name", "kind"], sort=False)
    }
    table = table.sort_values(["self_ns", "count"], ascending=False, kind="stable").head(n)
    return pd.DataFrame(
        {
            "name": [k[0] for k in table.index],
            "kind": [k[1] for k in table.index],
            "where": [where[k] for k in table.index],
            "count": table["count"].to_numpy(np.int64),
            "self_ms": table["self_ns"].to_numpy(np.float64) / 1e6,
            "total_ms": table["dur_ns"].to_numpy(np.float64) / 1e6,
            "self_share": table["self_ns"].to_numpy(np.float64) / total_self
            if total_self
            else np.nan,
        }
    )


def bar_names(bars: pd.DataFrame, ops: pd.DataFrame, shifts_ns: dict[int, int]) -> list[str]:
    """For each timeline bar (rows of :func:`dashboard.tables.timeline_frame`), the ops or
    kernels of its class's kinds (:data:`LANE_KINDS`) that ran inside it, the most self time
    inside the bar first (ties: the first to appear in ``ops``):
    ``aten::mm ×3 (0.41 ms, thread 7)``, at most :data:`NAMES_PER_BAR`, ``; ``-separated;
    ``""`` where none did.

    ``shifts_ns``: per rank, the absolute time of the timeline's 0 on that rank's clock (the
    frame's ``origin_ns`` plus the rank's clock offset). An op's time inside a bar is its self
    time times the fraction of it that overlaps the bar.
    """
    names = [""] * len(bars)
    name_codes, name_of = pd.factorize(ops["name"])
    place_codes, place_of = pd.factorize(ops["place"])
    key = name_codes.astype(np.int64) * max(len(place_of), 1) + place_codes
    rank_of, kind_of = ops["rank"].to_numpy(), ops["kind"].to_numpy()
    op_start, op_end = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    self_ms = ops["self_ns"].to_numpy(np.float64) / 1e6
    bar_start, bar_end = bars["start_ms"].to_numpy(), bars["end_ms"].to_numpy()
    for group, rows in bars.groupby(["rank", "lane"], sort=False).indices.items():
        rank, lane = cast("tuple[int, str]", group)
        mine = np.flatnonzero((rank_of == rank) & np.isin(kind_of, LANE_KINDS[str(lane)]))
        if not len(mine):
            continue
        shift = shifts_ns[int(rank)]
        start = (op_start[mine] - shift) / 1e6
        end = (op_end[mine] - shift) / 1e6
        weight = self_ms[mine] / np.maximum(end - start, 1e-12)
        for row in rows:
            lo, hi = bar_start[row], bar_end[row]
            inside = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None) * weight
            hit = np.flatnonzero(inside > 0)
            if len(hit):
                names[row] = _describe(key[mine[hit]], inside[hit], name_of, place_of)
    return names


def _describe(
    keys: np.ndarray, inside_ms: np.ndarray, name_of: pd.Index, place_of: pd.Index
) -> str:
    """The bar's text from its ops' (name, place) keys and times inside it: per key, the count
    and the summed time, the most time first, ties in the order the keys first appear."""
    places = len(place_of) or 1
    count: dict[int, int] = {}
    total: dict[int, float] = {}
    for k, ms in zip(keys.tolist(), inside_ms.tolist(), strict=True):
        count[k] = count.get(k, 0) + 1
        total[k] = total.get(k, 0.0) + ms
    top = sorted(total, key=lambda k: -total[k])[:NAMES_PER_BAR]  # stable: first seen first
    return "; ".join(
        f"{_short(str(name_of[k // places]))} ×{count[k]} "
        f"({total[k]:.3f} ms, {place_of[k % places]})"
        for k in top
    )


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


def lane_places(bars: pd.DataFrame, ops: pd.DataFrame) -> dict[tuple[int, str], str]:
    """Per (rank, class) lane, where its named ops ran: ``stream 7, 20`` / ``thread 1234``
    (the streams or threads of the lane's kinds on that rank, by self time, at most 3; ties:
    the first in the order of the places' names)."""
    out: dict[tuple[int, str], str] = {}
    rank_of, kind_of = ops["rank"].to_numpy(), ops["kind"].to_numpy()
    place_codes, place_of = pd.factorize(ops["place"], sort=True)
    self_ns = ops["self_ns"].to_numpy(np.float64)
    for rank, lane in bars[["rank", "lane"]].drop_duplicates().itertuples(index=False):
        mine = (rank_of == rank) & np.isin(kind_of, LANE_KINDS[str(lane)])
        if not mine.any():
            continue
        per_place = np.bincount(place_codes[mine], weights=self_ns[mine], minlength=len(place_of))
        present = np.flatnonzero(np.bincount(place_codes[mine], minlength=len(place_of)))
        by = present[np.argsort(-per_place[present], kind="stable")]
        prefix = str(place_of[by[0]]).split(" ")[0]
        ids = [str(place_of[p]).split(" ", 1)[1] for p in by[:3]]
        more = " ..." if len(by) > 3 else ""
        out[(int(rank), str(lane))] = f"{prefix} {', '.join(ids)}{more}"
    return out
