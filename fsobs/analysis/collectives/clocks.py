"""Clock alignment: which ranks share a clock, and each clock's offset (docs/design.md §5).

Synchronising collectives end within microseconds of each other on every rank of an instance,
so the end times of the matched instances (:mod:`fsobs.analysis.collectives.matching`) show the
clocks::

    clock A rank 0   |----all_reduce----|            end_A
    clock B rank 1        |--all_reduce------|       end_B   offset_B = median(end_B - end_A)

1. **Clocks.** Ranks of one host name start on one clock. The host name does not prove it
   (containers, VMs): when a rank's collectives end, by the median over the instances it shares
   with the host's lowest rank, more than :data:`SHARED_CLOCK_NS` away from that rank's, the
   host's ranks are split into clocks, ranks whose medians lie within :data:`SHARED_CLOCK_NS`
   of each other sharing one (``<host>#0``, ``<host>#1``, ... by lowest rank).
2. **Offsets.** The reference clock is the lowest rank's. For each other clock, per instance
   the median end over its ranks minus the reference's; its offset is the median of that over
   the instances, subtracted from its ranks' times.
3. **Cannot be aligned.** A clock that shares no instance with the reference, or whose
   per-instance offset varies by more than :data:`STEADY_OFFSET_NS` (interquartile range: a
   drifting clock, or ends that do not line up at all), gets no offset and an ``issue``; the
   instances it shares with other clocks are not used (:func:`unaligned`), so their time is
   unattributed communication instead of a wait measured on clocks that disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

SHARED_CLOCK_NS = 2_000_000
"""Ranks of one host whose collectives end further apart than this (median) have different
clocks. Ranks that share a clock end microseconds apart (NCCL), a fraction of a ms (gloo)."""
STEADY_OFFSET_NS = 5_000_000
"""A clock whose per-instance offset spreads more than this (interquartile range) cannot be
aligned by one offset."""


@dataclass(frozen=True)
class Clock:
    """One clock of the run: the ranks that share it and its offset to the reference clock."""

    name: str
    """The host name; ``<host>#<k>`` when the ranks of one host have several clocks."""
    host: str
    ranks: tuple[int, ...]
    offset_ns: int
    """What was subtracted from its ranks' times (0 for the reference and unaligned clocks)."""
    spread_ns: int
    """Interquartile range over the instances of the offset estimate (0 for the reference)."""
    issue: str | None = None
    """Why it could not be aligned; None when it was, or is the reference."""


def align_clocks(
    hosts: Mapping[int, str], complete: pd.DataFrame
) -> tuple[dict[int, int], list[Clock]]:
    """Per-rank offsets (ns) and the clocks (see the module docstring) from ``complete``
    (``instance, rank, end_ns`` of the matched instances, own clocks); ``hosts``: rank -> host
    name ("" when unknown), every rank of the run."""
    if complete.empty:  # nothing shows the clocks: one per host, as named
        return dict.fromkeys(hosts, 0), _unmeasured(hosts)
    # relative to the earliest end, so that the medians (floats) stay exact to the ns
    since = complete["end_ns"].to_numpy(np.int64) - int(complete["end_ns"].min())
    ends = complete[["instance", "rank"]].assign(end_ns=since)
    names = _clock_names(hosts, ends)
    reference = names[min(names)]
    per_clock = (
        ends.assign(clock=ends["rank"].map(names))
        .groupby(["instance", "clock"])["end_ns"]
        .median()
        .unstack("clock")
    )
    clocks = []
    for name, ranks in _members(names).items():
        host = hosts[ranks[0]]
        if name == reference:
            clocks.append(Clock(name, host, tuple(ranks), 0, 0))
            continue
        clocks.append(_offset(name, host, ranks, per_clock, reference, min(names)))
    offsets = {r: c.offset_ns for c in clocks for r in c.ranks}
    return offsets, clocks


def _unmeasured(hosts: Mapping[int, str]) -> list[Clock]:
    """One clock per host name, none offset: the run has no matched collective."""
    return [Clock(h, h, tuple(ranks), 0, 0) for h, ranks in _members(hosts).items()]


def _members(names: Mapping[int, str]) -> dict[str, list[int]]:
    """Name -> its ranks, ascending; names in the order of their lowest rank."""
    out: dict[str, list[int]] = {}
    for rank in sorted(names):
        out.setdefault(names[rank], []).append(rank)
    return out


def _offset(
    name: str, host: str, ranks: list[int], per_clock: pd.DataFrame, reference: str, ref_rank: int
) -> Clock:
    """The clock ``name`` and its offset to the ``reference`` clock (step 2, 3)."""
    both = name in per_clock and reference in per_clock
    diff = (per_clock[name] - per_clock[reference]).dropna() if both else pd.Series(dtype=float)
    if diff.empty:
        issue = f"it shares no matched collective with rank {ref_rank}'s clock"
        return Clock(name, host, tuple(ranks), 0, 0, issue)
    low, high = np.percentile(diff.to_numpy(np.float64), [25, 75])
    spread = int(round(high - low))
    if spread > STEADY_OFFSET_NS:
        issue = (
            f"its offset to rank {ref_rank}'s clock varies by {spread / 1e6:.3f} ms over the "
            f"{len(diff)} collectives (interquartile range; a drifting clock?): no single "
            "offset aligns it"
        )
        return Clock(name, host, tuple(ranks), 0, spread, issue)
    return Clock(name, host, tuple(ranks), int(round(float(diff.median()))), spread)


def _clock_names(hosts: Mapping[int, str], ends: pd.DataFrame) -> dict[int, str]:
    """Rank -> the name of its clock (step 1)."""
    by_host = _members(hosts)
    names = dict(hosts)
    lead = {r: ranks[0] for ranks in by_host.values() for r in ranks}
    medians = _median_to_lead(ends, lead)
    for host, ranks in by_host.items():
        groups = _split(ranks, medians)
        if len(groups) > 1:
            base = host or "(no host)"
            names |= {r: f"{base}#{k}" for k, group in enumerate(groups) for r in group}
    return names


def _median_to_lead(ends: pd.DataFrame, lead: Mapping[int, int]) -> pd.Series:
    """Rank -> median over the instances it shares with its host's lowest rank of its end
    minus that rank's (absent: none shared)."""
    mine = ends.assign(lead=ends["rank"].map(lead))
    leads = mine[mine["rank"] == mine["lead"]][["instance", "lead", "end_ns"]]
    pairs = mine.merge(leads, on=["instance", "lead"], suffixes=("", "_lead"))
    diff = pairs["end_ns"].astype(np.float64) - pairs["end_ns_lead"].astype(np.float64)
    return diff.groupby(pairs["rank"]).median()


def _split(ranks: list[int], medians: pd.Series) -> list[list[int]]:
    """The ranks of one host grouped by clock: sorted by their median end offset, a new group
    where one lies more than :data:`SHARED_CLOCK_NS` beyond its group's first; groups in the
    order of their lowest rank (a rank without a shared instance stays with the host's first)."""
    offset = {r: float(medians.get(r, 0.0)) for r in ranks}
    groups: list[list[int]] = []
    start = 0.0
    for rank in sorted(ranks, key=lambda r: (offset[r], r)):
        if not groups or offset[rank] - start > SHARED_CLOCK_NS:
            groups.append([])
            start = offset[rank]
        groups[-1].append(rank)
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def unaligned(complete: pd.DataFrame, clocks: list[Clock]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split off the instances that join a clock that could not be aligned with another clock:
    ``(kept, problems)``, problems with ``group, coll, key, issue, ranks`` (step 3)."""
    columns = ["group", "coll", "key", "issue", "ranks"]
    bad = {r for c in clocks if c.issue is not None for r in c.ranks}
    if not bad or complete.empty:
        return complete, pd.DataFrame(columns=columns)
    clock_of = {r: c.name for c in clocks for r in c.ranks}
    several = complete["rank"].map(clock_of).groupby(complete["instance"]).transform("nunique") > 1
    touches = complete["rank"].isin(bad).groupby(complete["instance"]).transform("any")
    drop = (several & touches).to_numpy()
    rows = [
        {
            "group": mine["group"].iloc[0],
            "coll": mine["coll"].iloc[0],
            "key": mine["key"].iloc[0],
            "issue": "its ranks' clocks cannot be aligned (see the clocks)",
            "ranks": sorted(mine["rank"].tolist()),
        }
        for _, mine in complete[drop].groupby("instance", sort=True)
    ]
    kept = complete[~drop]
    kept = kept.assign(instance=kept.groupby("instance", sort=True).ngroup())
    return kept, pd.DataFrame(rows, columns=columns)
