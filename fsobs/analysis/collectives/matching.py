"""Cross-rank collective matching and clock alignment (docs/design.md §5).

Matching: every synchronising communication event of every rank gets an instance key

- ``(group, seq)`` when the trace carries NCCL's per-group ``Seq`` (PyTorch >= 2.2);
- otherwise ``(group, collective, step, ordinal)``: the k-th all_reduce of a group in step s on
  one rank is the k-th all_reduce of that group in step s on every other rank. Counting within
  the step keeps one extra collective on one rank (the tail of one caught before the first
  step, a collective only one rank issued) from shifting the pairs of later steps. The step is
  the one the rank asked for the collective in: on gloo the step holding its enqueue, since a
  worker may start it after that step ended on one rank and before on another. A gloo
  collective's group comes from the trace when the job marked it (:mod:`fsobs.trace`), else all
  of a gloo run's collectives count as one group.

A collective arrives on a rank when the rank asks for it: on gloo its enqueue (the gloo event
itself starts only when a worker takes it from the group's queue, so a queue delay is part of
the collective, not of the rank's lateness), else the start of its event.

An instance is used only when it is whole and consistent; otherwise it is reported in
``problems`` and never paired:

- seen on only some of the ranks of its group, or the ranks disagree on the collective or (for
  collectives where sizes must agree) on the message size;
- causally impossible: a rank finished an all_reduce / all_gather / all_to_all /
  reduce_scatter / barrier before the last rank had started it (beyond ``_CAUSAL_SLACK_NS``
  plus the clock alignment's error). Such a pair joins two different collectives;
- its end times spread far more than the run's other instances (more than
  ``_SPREAD_FACTOR`` times their median spread and more than ``_SPREAD_FLOOR_NS``): the ranks
  of one instance leave a synchronising collective together.

Partial runs: a group with ranks that were not loaded (``run.json`` or ``distributedInfo`` say
more ranks than there are traces) gives no waits at all, since the missing rank may be the one
everybody waited for; its collectives are listed in ``partial`` and their time is
``unattributed_comm``.

Clock alignment (:mod:`fsobs.analysis.collectives.clocks`): ranks on one host start on one
clock, split into several when the collectives' end times show that they are not (containers,
VMs); each clock gets an offset from the end times of the matched collectives, which finish within
microseconds of each other, or, when none holds, is said to be unaligned and its instances with
other clocks are not paired::

    host A rank 0   |----all_reduce----|            end_A
    host B rank 1        |--all_reduce------|       end_B   offset_B = median(end_B - end_A)
"""

from __future__ import annotations

import pickle
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

import numpy as np
import pandas as pd

from fsobs.analysis.collectives.alltoall import (
    VOLUME_INPUTS,
    AllToAll,
    all_to_all_table,
    volume_columns,
)
from fsobs.analysis.collectives.clocks import Clock, align_clocks, unaligned
from fsobs.analysis.collectives.lateness import (
    LATENESS_COLUMNS,
    LATENESS_INPUTS,
    gpu_gaps,
    lateness_table,
)
from fsobs.trace.categorical import decoded, is_in
from fsobs.trace.schema import ProcessGroup, RankLike, RankTrace, Run
from optim.markers import DENSE_DESC, EMB_DESC


class RankCollectives(RankLike, Protocol):
    """What the matching reads of each rank (a :class:`fsobs.analysis.summary.RankSummary`)."""

    @property
    def sync_collectives(self) -> bytes:
        """:func:`rank_collectives`, pickled by :func:`pack_collectives`."""

    @property
    def process_groups(self) -> tuple[ProcessGroup, ...]: ...

    @property
    def host_name(self) -> str | None: ...


C = TypeVar("C", bound=RankCollectives)

SYNC_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "all_to_allv",
        "barrier",
        "broadcast",
        "reduce",
        "gather",
        "scatter",
    }
)
_SIZE_MUST_AGREE = frozenset({"all_reduce", "broadcast", "reduce", "barrier"})
_ALL_TO_ALL_DEPENDENT = frozenset(
    {"all_reduce", "all_gather", "all_to_all", "all_to_allv", "reduce_scatter", "barrier"}
)
"""Collectives where no rank can finish before every rank has started."""
_CAUSAL_SLACK_NS = 10_000
_SPREAD_FACTOR = 200
_SPREAD_FLOOR_NS = 50_000_000
DEFAULT_GROUP = "default"


@dataclass
class Collectives:
    """Matched collectives of a run.

    ``instances``: one row per (instance, rank) of the complete instances, columns
    ``instance, rank, group, coll, key, row, step, start_ns, end_ns, msg_bytes, role``
    (clock-aligned times, i.e. on rank 0's host clock; role: one of
    :data:`optim.markers.ALL_ROLES`) plus
    ``arrival_last_ns`` (the latest aligned start of the instance over its ranks) and
    ``last_rank``.

    ``problems``: ``group, coll, key, issue, ranks`` for instances that could not be used.

    ``partial``: ``group, missing_ranks, num_collectives`` for groups with ranks that were not
    loaded (their collectives give no waits).

    ``offsets_ns``: per rank, what was subtracted from its clock; ``skew_ms`` the largest
    absolute offset. ``clocks``: the clocks found and their offsets, or why one could not be
    aligned (:mod:`fsobs.analysis.collectives.clocks`).

    ``roles_known``: whether anything in the run says the role of at least one collective (a
    marker, a PEC, torchrec or DDP range, a group description, run.json's group layout);
    without, every role is the fallback ``other`` and the time by role is unknown.

    ``lateness``: per instance that kept a rank waiting, what its last rank was doing
    meanwhile (:func:`fsobs.analysis.collectives.lateness.lateness_table`).

    ``all_to_all``: the send / receive imbalance and volume matrix of every all_to_all(v)
    instance (:mod:`fsobs.analysis.collectives.alltoall`).
    """

    instances: pd.DataFrame
    problems: pd.DataFrame
    offsets_ns: dict[int, int]
    partial: pd.DataFrame = field(default_factory=lambda: _empty_partial())
    roles_known: bool = False
    lateness: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LATENESS_COLUMNS))
    all_to_all: AllToAll = field(default_factory=AllToAll)
    clocks: list[Clock] = field(default_factory=list)

    @property
    def skew_ms(self) -> float:
        return max((abs(v) for v in self.offsets_ns.values()), default=0) / 1e6


def match_collectives(run: Run[C]) -> Collectives:
    """Match the synchronising collectives of every rank and align the hosts' clocks."""
    raw = _all_ranks(run)
    if raw.empty:
        return Collectives(_empty_instances(), _empty_problems(), dict.fromkeys(run.rank_ids, 0))
    raw["role"], known = _roles(run, raw)
    complete, problems, partial = _complete_instances(run, raw)
    hosts = {r: run[r].host_name or "" for r in run.rank_ids}
    offsets, clocks = align_clocks(hosts, complete)
    shift = complete["rank"].map(offsets).to_numpy(np.int64)
    complete["start_ns"] -= shift
    complete["end_ns"] -= shift
    complete, skewed = unaligned(complete, clocks)
    complete["arrival_last_ns"] = complete.groupby("instance")["start_ns"].transform("max")
    complete, inconsistent = _consistent(complete, cross_host=len(set(offsets.values())) > 1)
    last = complete.loc[complete.groupby("instance")["start_ns"].idxmax(), ["instance", "rank"]]
    complete["last_rank"] = complete["instance"].map(last.set_index("instance")["rank"])
    found = [p for p in (problems, skewed, inconsistent) if len(p)]
    problems = pd.concat(found or [problems])
    lateness, all_to_all = lateness_table(complete), all_to_all_table(complete)
    complete = complete.drop(columns=[*LATENESS_INPUTS, *VOLUME_INPUTS])
    return Collectives(
        complete.reset_index(drop=True),
        problems.reset_index(drop=True),
        offsets,
        partial,
        roles_known=known,
        lateness=lateness,
        all_to_all=all_to_all,
        clocks=clocks,
    )


_INTERN_RANKS = 64
"""Ranks whose collectives are read and their strings interned together (:func:`_all_ranks`)."""


def _all_ranks(run: Run[C]) -> pd.DataFrame:
    """Every rank's collectives in one frame (the ranks' own columns are freed here), read
    :data:`_INTERN_RANKS` ranks at a time: each group's strings are interned before the next
    group is read, so at most that many ranks' own copies coexist."""
    ids = run.rank_ids
    groups = [
        _shared_strings(
            concat_columns(
                [unpack_collectives(run[r].sync_collectives) for r in ids[i : i + _INTERN_RANKS]]
            )
        )
        for i in range(0, len(ids), _INTERN_RANKS)
    ]
    return concat_columns(groups) if groups else pd.DataFrame()


Columns = dict[str, np.ndarray]
"""A frame as its columns: what :func:`pack_collectives` keeps of one rank's collectives."""


def pack_collectives(columns: Columns) -> bytes:
    """One rank's :func:`rank_collectives`, pickled: its arrays (a frame of a few rows
    unpickles several times slower than its arrays, on every rank of the run)."""
    return pickle.dumps(columns, pickle.HIGHEST_PROTOCOL)


def unpack_collectives(data: bytes) -> Columns:
    columns: Columns = pickle.loads(data)
    return columns


def concat_columns(parts: Sequence[Columns | pd.DataFrame]) -> pd.DataFrame:
    """``pd.concat(parts, ignore_index=True)``: array by array where the parts agree on their
    columns and dtypes (as the ranks' collectives do), which on hundreds of small parts is a
    fraction of pandas' general concatenation; else pandas' own."""
    columns = [p if isinstance(p, dict) else {c: p[c].to_numpy() for c in p.columns} for p in parts]
    if len({tuple((name, a.dtype) for name, a in c.items()) for c in columns}) != 1:
        return pd.concat([pd.DataFrame(c, copy=False) for c in columns], ignore_index=True)
    names = list(columns[0])
    return pd.DataFrame({n: np.concatenate([c[n] for c in columns]) for n in names}, copy=False)


def _shared_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each string of its text columns interned: every rank's rows name the same
    groups, collectives and member lists (``pg_ranks``: N ranks' worth of text on each of the N
    ranks), which the run then holds once. Each distinct string of a column is interned once."""
    for column in frame.select_dtypes(object).columns:
        values = frame[column].to_numpy()
        if pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
            codes, uniques = pd.factorize(values)  # missing values: code -1, kept as they are
            interned = np.array([sys.intern(u) for u in uniques] + [None], dtype=object)
            frame[column] = pd.Series(
                np.where(codes >= 0, interned[codes], values), index=frame.index, dtype=object
            )
        else:  # other objects (e.g. interval arrays), with or without strings among them
            shared = [sys.intern(v) if type(v) is str else v for v in values]
            frame[column] = pd.Series(shared, index=frame.index, dtype=object)
    return frame


def rank_collectives(trace: RankTrace) -> Columns:
    """One rank's synchronising collectives with their instance keys (see the module doc),
    in arrival order, as columns (a frame of its own would cost more to build and to take
    apart again than its few rows are worth)."""
    colls, events = trace.collectives, trace.events
    row, enqueue = colls["row"].to_numpy(), colls["enqueue_ns"].to_numpy()
    sync = np.flatnonzero(is_in(colls["coll"], SYNC_COLLECTIVES))
    start = arrivals(trace, row[sync], enqueue[sync])
    order = np.argsort(start, kind="stable")
    at, start = sync[order], start[order]  # positions in colls, in arrival order
    rows = row[at]
    end = events["ts_ns"].to_numpy()[rows] + events["dur_ns"].to_numpy()[rows]
    gap, host_busy = gpu_gaps(trace, rows, start)
    columns = {
        "rank": np.full(len(rows), trace.rank, dtype=np.int64),
        "group": decoded(colls["pg_name"], DEFAULT_GROUP, str)[at],
        "coll": decoded(colls["coll"], convert=str)[at],
        "seq": colls["seq"].to_numpy()[at],
        "row": rows,
        "step": _issue_steps(trace, rows, enqueue[at]),
        "start_ns": start,
        "end_ns": end,
        "in_nelems": colls["in_nelems"].to_numpy()[at],
        "msg_bytes": colls["msg_bytes"].to_numpy()[at],
        "pg_ranks": decoded(colls["pg_ranks"])[at],
        "pg_desc": decoded(colls["pg_desc"])[at],
        "role": decoded(colls["role"])[at],
        "gpu_gap_ns": gap,
        "host_busy": host_busy,
        **volume_columns(colls, at),
    }
    columns["key"] = _instance_keys(*(columns[c] for c in ("group", "coll", "step", "seq")))
    return columns


def _instance_keys(
    group: np.ndarray, coll: np.ndarray, step: np.ndarray, seq: np.ndarray
) -> np.ndarray:
    """``seq <n>`` where the trace has NCCL's Seq, else ``<coll> @<step> #<ordinal>`` (the
    ordinal counting this rank's collectives of that group, collective and step in arrival
    order); a key seen before in the same group gets ``.1``, ``.2``, ... (one value per
    collective in each array)."""
    ordinal: dict[tuple[str, str, int], int] = defaultdict(int)
    seen: dict[tuple[str, str], int] = defaultdict(int)
    keys = []
    for g, c, s, n in zip(group.tolist(), coll.tolist(), step.tolist(), seq.tolist(), strict=True):
        key = f"seq {n}" if n >= 0 else f"{c} @{s} #{ordinal[g, c, s]}"
        ordinal[g, c, s] += 1
        repeat = seen[g, key]
        seen[g, key] += 1
        keys.append(f"{key}.{repeat}" if repeat else key)
    return np.array(keys, dtype=object)


GROUP_ROLES = {EMB_DESC: "embedding", DENSE_DESC: "dense"}
"""Process-group descriptions FreeScale gives its groups (``optim.groups``) -> role."""


def _roles(run: Run[C], raw: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """Each collective's role: PEC's range, FreeScale's marker or torchrec's / DDP's range
    around its issue (:mod:`fsobs.trace`), else its group's description (NCCL traces name it),
    else the group layout in ``run.json``, else ``other``; and whether any collective's role
    came from before the fallback."""
    layout = (run.meta.process_groups if run.meta is not None else None) or {}
    claims: dict[str, set[str]] = defaultdict(set)
    for name, info in layout.items():
        if isinstance(info, dict):
            claims[str(info.get("pg_name"))].add(
                name if name in ("embedding", "dense") else "other"
            )
    # a group that serves several roles (every toggle off: FreeScale's groups are the default
    # one) says nothing of a collective's role
    by_name = {pg: next(iter(roles)) for pg, roles in claims.items() if len(roles) == 1}
    role = raw["role"].where(raw["role"].notna(), raw["pg_desc"].map(GROUP_ROLES))
    role = role.where(role.notna(), raw["group"].map(by_name))
    return role.fillna("other").to_numpy(object), bool(role.notna().any())


def _issue_steps(trace: RankTrace, rows: np.ndarray, enqueue: np.ndarray) -> np.ndarray:
    """The step in which each collective (its event ``rows``, its ``enqueue`` times) was asked
    for: on gloo the step window holding its enqueue (its worker may start it after the step
    ended, and the step of that start differs between ranks), else the step of its event."""
    events = trace.events
    step: np.ndarray = events["step"].to_numpy()[rows]
    if not (enqueue >= 0).any():
        return step
    marks = step_marks(events)
    if not len(marks):
        return step
    ts = events["ts_ns"].to_numpy()
    marks = marks[np.argsort(ts[marks], kind="quicksort")]  # as pandas' sort_values
    lo = ts[marks]
    hi = lo + events["dur_ns"].to_numpy()[marks]
    pos = np.searchsorted(lo, enqueue, side="right") - 1
    inside = (enqueue >= 0) & (pos >= 0) & (enqueue < hi[np.maximum(pos, 0)])
    return np.where(inside, events["step"].to_numpy()[marks][np.maximum(pos, 0)], step)


def step_marks(events: pd.DataFrame) -> np.ndarray:
    """Rows of the step ranges (ProfilerSteps, or the step marker's) of a rank's events."""
    kind, device = events["kind"], events["device"]
    return np.flatnonzero(is_in(kind, ("step",)) & is_in(device, ("cpu",)))


def arrivals(trace: RankTrace, rows: np.ndarray, enqueue: np.ndarray) -> np.ndarray:
    """When each collective (its event ``rows``, its ``enqueue`` times: those of
    ``trace.collectives``) arrived on this rank: its enqueue on gloo (the rank asked; a queue
    delay after that is the collective's own time), else the start of its event (an NCCL
    kernel starts when the rank reaches it)."""
    start = trace.events["ts_ns"].to_numpy()[rows]
    return cast(np.ndarray, np.where(enqueue >= 0, np.minimum(enqueue, start), start))


def _group_ranks(run: Run[C], group: str, pg_ranks: object) -> frozenset[int]:
    """Every rank of a group (loaded or not): the event's own list, the trace's ``pg_config``,
    else the whole world."""
    if isinstance(pg_ranks, str) and pg_ranks.strip("[] "):
        try:
            return frozenset(int(r) for r in pg_ranks.strip("[] ").split(","))
        except ValueError:
            pass
    for trace in run.ranks.values():
        for pg in trace.process_groups:
            if pg.name == group and pg.ranks:
                return frozenset(pg.ranks)
    return frozenset(range(max(run.world_size, max(run.rank_ids, default=-1) + 1)))


def _complete_instances(
    run: Run[C], raw: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Split the instances into complete ones (all rows kept), problems (one row each) and the
    groups with ranks that were not loaded (one row each)."""
    raw = raw.assign(_id=raw.groupby(["group", "key"], sort=False).ngroup())
    by = raw.groupby("_id", sort=True)
    facts = by.agg(
        group=("group", "first"),
        key=("key", "first"),
        coll=("coll", "first"),
        pg_ranks=("pg_ranks", "first"),
        num_ranks=("rank", "nunique"),
        num_colls=("coll", "nunique"),
    )
    sized = raw[raw["in_nelems"] >= 0].groupby("_id")["in_nelems"].nunique()
    facts["num_sizes"] = sized.reindex(facts.index, fill_value=0)
    expected = {
        (g, r): _group_ranks(run, str(g), r)
        for g, r in facts[["group", "pg_ranks"]].drop_duplicates().itertuples(index=False)
    }
    # pandas-stubs: a column takes a list of any objects, not only of scalars
    facts["expected"] = [  # type: ignore[assignment]
        expected[(g, r)] for g, r in zip(facts["group"], facts["pg_ranks"], strict=True)
    ]
    loaded = frozenset(run.rank_ids)
    facts["missing"] = [tuple(sorted(e - loaded)) for e in facts["expected"]]
    is_partial = facts["missing"].map(len) > 0
    partial = (
        facts[is_partial]
        .groupby(["group", "missing"], sort=True)
        .size()
        .rename("num_collectives")
        .reset_index()
        .rename(columns={"missing": "missing_ranks"})
    )
    partial["missing_ranks"] = partial["missing_ranks"].map(list)
    facts = facts[~is_partial]
    complete_ids = facts.index[
        (facts["num_ranks"] == facts["expected"].map(len))
        & (facts["num_colls"] == 1)
        & ~(facts["coll"].isin(_SIZE_MUST_AGREE) & (facts["num_sizes"] > 1))
    ]
    problems = [
        _problem(row, raw[raw["_id"] == i]) for i, row in facts.drop(complete_ids).iterrows()
    ]
    complete = raw[raw["_id"].isin(complete_ids)]
    first = complete.groupby("_id")["start_ns"].transform("min")
    complete = complete.assign(_first=first).sort_values(["_first", "_id", "rank"], kind="stable")
    complete["instance"] = complete.groupby(["_first", "_id"], sort=False).ngroup()
    complete = complete.drop(columns=["_first", "_id", "seq", "in_nelems", "pg_ranks", "pg_desc"])
    problem_frame = pd.DataFrame(problems, columns=list(_empty_problems().columns))
    return complete.reset_index(drop=True), problem_frame, partial[list(_empty_partial().columns)]


def _consistent(complete: pd.DataFrame, *, cross_host: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Drop the instances that cannot be one collective (see the module docstring); return the
    rest and a problem row for each dropped one. Times are clock-aligned."""
    if complete.empty:
        return complete, _empty_problems()
    by = complete.groupby("instance")
    spread = by["end_ns"].max() - by["end_ns"].min()
    slack = _CAUSAL_SLACK_NS + (int(spread.median()) if cross_host else 0)
    early = (complete["end_ns"] < complete["arrival_last_ns"] - slack) & complete["coll"].isin(
        _ALL_TO_ALL_DEPENDENT
    )
    acausal = early.groupby(complete["instance"]).any()
    limit = max(_SPREAD_FACTOR * float(spread.median()), _SPREAD_FLOOR_NS)
    bad = acausal | (spread > limit)
    if not bad.any():
        return complete, _empty_problems()
    rows = []
    for inst in bad.index[bad]:
        mine = complete[complete["instance"] == inst]
        if acausal[inst]:
            first_done = mine.loc[mine["end_ns"].idxmin()]
            issue = (
                f"rank {int(first_done['rank'])} finished it "
                f"{(mine['arrival_last_ns'].iloc[0] - first_done['end_ns']) / 1e6:.3f} ms before "
                "the last rank started it: not one collective"
            )
        else:
            issue = (
                f"end times spread {spread[inst] / 1e6:.3f} ms (run median "
                f"{spread.median() / 1e6:.3f} ms): not one collective"
            )
        rows.append(
            {
                "group": mine["group"].iloc[0],
                "coll": mine["coll"].iloc[0],
                "key": mine["key"].iloc[0],
                "issue": issue,
                "ranks": sorted(mine["rank"].tolist()),
            }
        )
    kept = complete[~complete["instance"].isin(bad.index[bad])]
    kept = kept.assign(instance=kept.groupby("instance", sort=True).ngroup())
    return kept, pd.DataFrame(rows, columns=list(_empty_problems().columns))


def _problem(facts: pd.Series, inst: pd.DataFrame) -> dict[str, object]:
    """Why an instance cannot be used, in words."""
    present = set(inst["rank"].tolist())
    if present != facts["expected"]:
        issue = f"missing on ranks {sorted(facts['expected'] - present)}"
    elif facts["num_colls"] > 1:
        issue = f"ranks disagree on the collective: {sorted(inst['coll'].unique())}"
    else:
        issue = f"ranks disagree on the size: {sorted(inst['in_nelems'].unique().tolist())}"
    return {
        "group": facts["group"],
        "coll": facts["coll"],
        "key": facts["key"],
        "issue": issue,
        "ranks": sorted(present),
    }


def _empty_instances() -> pd.DataFrame:
    return pd.DataFrame(
        columns=[
            "instance",
            "rank",
            "group",
            "coll",
            "key",
            "row",
            "step",
            "start_ns",
            "end_ns",
            "msg_bytes",
            "role",
            "arrival_last_ns",
            "last_rank",
        ]
    )


def _empty_problems() -> pd.DataFrame:
    return pd.DataFrame(columns=["group", "coll", "key", "issue", "ranks"])


def _empty_partial() -> pd.DataFrame:
    return pd.DataFrame(columns=["group", "missing_ranks", "num_collectives"])
