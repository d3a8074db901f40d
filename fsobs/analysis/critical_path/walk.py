"""The back-trace of one step across ranks (the rule of :mod:`fsobs.analysis.critical_path`).

Everything here is on the aligned clock (rank 0's host clock, as the matched collectives).
Each rank is a :class:`Lane`: its chain (:mod:`.chain`) and its matched collectives. The walk
stands at ``(rank, t)`` and asks what the rank was doing just before ``t``, first match wins:

1. a busy piece ``[s, e)`` with ``s < t <= e``: segment ``[s, t)`` of its kind and name;
2. a matched collective in flight (``a < t <= end``; of several, the one whose last member
   arrived latest, ``A``, last rank ``L``):

   - ``t > A``: the transfer after the last arrival is on the path: segment ``collective``
     from ``b = max(A, the end of the rank's last busy piece before t)`` to ``t``; at ``b == A``
     the walk jumps to ``L`` (it stays when this rank was the last);
   - ``t <= A``: the rank is waiting for ``L``, which is not on the path: the walk jumps to
     ``L`` at ``t`` without a segment (a ``wait`` segment down to the rank's own arrival only
     when ``L`` was already visited at ``t``: circular waits of overlapping collectives);
3. another piece (``other`` tier) covering ``t``: segment ``[b, t)`` with ``b`` its start or
   the latest end before ``t`` of any busy piece or collective, whichever is later;
4. on a GPU rank whose GPU is idle, the training thread's op covering ``t`` (``host`` tier):
   segment ``op`` from its start or the latest end of any GPU piece or collective;
5. else ``idle`` from the latest end before ``t`` of anything on the rank.

Every segment starts where the next one (in time) ends and is clipped at the step's start, so
the segments tile the step's window; each move lowers ``t`` or jumps to a rank not visited at
this ``t``, so the walk ends::

    rank 0   |=a=|[C wait......|xx]|=c=|          a, c: busy;  C: rank 0 arrives early
    rank 1   |=====b=====|[C|xx]|=c=|              rank 1 arrives last, at A
    path     |=====b=====|xx|=c=|                  b on rank 1, C's transfer, c on rank 1
             (walk: from the end back on rank 1, through C's transfer, on to A, then b)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fsobs.analysis.critical_path.chain import KINDS, Chain, Pieces

_INF = np.iinfo(np.int64).max
COLLECTIVE, WAIT, IDLE = (KINDS.index(k) for k in ("collective", "wait", "idle"))


@dataclass(frozen=True)
class _Tier:
    """One tier's :class:`Pieces` as Python lists: the walk asks one instant at a time, and a
    bisect on a list costs a fraction of a numpy call on one value."""

    start: list[int]
    end: list[int]
    kind: list[int]
    name: list[int]

    @staticmethod
    def of(pieces: Pieces, offset_ns: int) -> _Tier:
        shifted = pieces.shifted(offset_ns)
        return _Tier(
            shifted.start.tolist(), shifted.end.tolist(), pieces.kind.tolist(), pieces.name.tolist()
        )

    def covering(self, t: int) -> tuple[int, int]:
        """(index of the piece covering just before ``t`` or -1, the latest end before ``t``)."""
        i = bisect_left(self.end, t)
        prev = self.end[i - 1] if i > 0 else -_INF
        return (i if i < len(self.start) and self.start[i] < t else -1), prev


@dataclass(frozen=True)
class Lane:
    """One rank on the aligned clock: its chain's tiers and its matched collectives (sorted by
    arrival ``a``; ``end``, the last arrival ``last``, its rank ``last_rank``, ``instance``
    and collective ``coll``), as lists."""

    rank: int
    busy: _Tier
    other: _Tier
    host: _Tier
    names: tuple[str, ...]
    a: list[int]
    end: list[int]
    last: list[int]
    last_rank: list[int]
    instance: list[int]
    coll: list[str]
    longest: int
    """The longest collective's span (bounds the search for those in flight)."""
    end_max: list[int]
    """The running maximum of ``end``."""

    @staticmethod
    def of(rank: int, chain: Chain, offset_ns: int, colls: dict[str, np.ndarray]) -> Lane:
        """``colls``: this rank's rows of :attr:`Collectives.instances`, by column, sorted by
        ``start_ns``."""
        a, end = colls["start_ns"], colls["end_ns"]
        return Lane(
            rank=rank,
            busy=_Tier.of(chain.busy, offset_ns),
            other=_Tier.of(chain.other, offset_ns),
            host=_Tier.of(chain.host, offset_ns),
            names=chain.names,
            a=a.tolist(),
            end=end.tolist(),
            last=colls["arrival_last_ns"].tolist(),
            last_rank=colls["last_rank"].tolist(),
            instance=colls["instance"].tolist(),
            coll=[str(c) for c in colls["coll"]],
            longest=int((end - a).max(initial=0)),
            end_max=(np.maximum.accumulate(end) if len(end) else end).tolist(),
        )

    def _window(self, t: int) -> range:
        """The collectives that arrived in ``[t - longest, t)``: every one in flight at ``t``."""
        return range(bisect_left(self.a, t - self.longest), bisect_left(self.a, t))

    def in_flight(self, t: int) -> int:
        """Index of the binding collective in flight just before ``t`` (latest last arrival;
        ties: the lower instance), -1 when none."""
        best = -1
        for i in self._window(t):
            if self.end[i] >= t and (
                best < 0
                or self.last[i] > self.last[best]
                or (self.last[i] == self.last[best] and self.instance[i] < self.instance[best])
            ):
                best = i
        return best

    def ended_before(self, t: int) -> int:
        """The latest end before ``t`` of a collective (one in flight at ``t`` excluded)."""
        window = self._window(t)
        latest = self.end_max[window.start - 1] if window.start else -_INF  # before t - longest
        for i in window:
            if latest < self.end[i] < t:
                latest = self.end[i]
        return latest


Segment = tuple[int, int, str, int, int, int]
"""rank, kind (position in KINDS), name, start_ns, end_ns, instance (-1: none)."""


def walk(lanes: Mapping[int, Lane], start_rank: int, t: int, stop: int) -> list[Segment]:
    """The segments from ``stop`` to ``t`` back-traced from ``(start_rank, t)``, in time
    order (module docstring)."""
    out: list[Segment] = []
    rank, visited = start_rank, {start_rank}
    while t > stop:
        lane = lanes[rank]
        seg, jump = _step_back(lane, t, stop, visited)
        if seg is None:
            rank = jump
            visited.add(rank)
            continue
        out.append(seg)  # it starts before t: a new instant, nobody visited there yet
        t, rank, visited = seg[3], jump, {jump}
    out.reverse()
    return out


def _step_back(lane: Lane, t: int, stop: int, visited: set[int]) -> tuple[Segment | None, int]:
    """The segment that ends at ``t`` on ``lane`` and the rank to go on from (rules 1-5)."""
    here = lane.rank
    i, busy_end = lane.busy.covering(t)
    if i >= 0:
        start = max(lane.busy.start[i], stop)
        kind, name = lane.busy.kind[i], lane.names[lane.busy.name[i]]
        return (here, kind, name, start, t, -1), here
    k = lane.in_flight(t)
    if k >= 0:
        last, late = lane.last[k], lane.last_rank[k]
        inst, coll = lane.instance[k], lane.coll[k]
        if t > last:
            start = max(last, busy_end, stop)
            go = late if start == last else here
            return (here, COLLECTIVE, coll, start, t, inst), go
        if late not in visited:
            return None, late
        start = max(lane.a[k], busy_end, stop)
        return (here, WAIT, coll, start, t, inst), here
    j, other_end = lane.other.covering(t)
    floor = max(busy_end, lane.ended_before(t), stop)
    if j >= 0:
        start = max(lane.other.start[j], floor)
        kind, name = lane.other.kind[j], lane.names[lane.other.name[j]]
        return (here, kind, name, start, t, -1), here
    floor = max(floor, other_end)
    h, host_end = lane.host.covering(t)
    if h >= 0:
        start = max(lane.host.start[h], floor)
        kind, name = lane.host.kind[h], lane.names[lane.host.name[h]]
        return (here, kind, name, start, t, -1), here
    return (here, IDLE, "", max(floor, host_end), t, -1), here
