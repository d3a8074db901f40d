"""The segment graph of an analyzed run: per rank, the chain of pieces between its matched
collectives (docs/design.md §7; what :mod:`fsobs.analysis.whatif.replay` replays).

Per rank, the analyzed steps (:mod:`fsobs.analysis.bubbles`) are cut at the matched
collectives into a chain of pieces, and every matched collective instance becomes one joint
event of all its ranks::

    rank 0  |--local------|a|=wait k=|xx|--local--------|a|=wait m===|--local--|
    rank 1  |--local---------------|a|xx|--local---|a|xx|--local-------------|
                                   A_k = max arrival      A_m
    local  time the rank spends on its own: busy, host idle, other, unmatched communication,
           and blocked time that ended for a local reason (compute resumed); kept per class,
           so that a toggle can rescale one class (balance and the oracle: busy)
    wait   blocked until the instance's last arrival A_k                 (ends at A'_k)
    xx     exposed: blocked until the instance ends on this rank, e_rk    (ends at e'_rk)
    a      the rank's arrival, at a position inside a piece

A blocked piece keeps its instance only when it ended exactly at that instance's time (the last
arrival, or its end on the rank); one that ended earlier (compute resumed under an
asynchronous collective) is local.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd

from fsobs.analysis.pipeline import Analysis
from fsobs.errors import RunError

if TYPE_CHECKING:
    from fsobs.analysis.bubbles.classify import StepBubbles

KINDS = (
    "busy",
    "straggler_wait",
    "exposed_comm",
    "unattributed_comm",
    "host_idle",
    "other",
    "gap",
)
"""Classes a local piece is made of (``gap``: between two step windows)."""
BUSY, WAIT, EXPOSED, UNATTRIBUTED, IDLE, OTHER, GAP = range(len(KINDS))
LOCAL = -1
TABLE_COLUMNS = [
    "rank",
    "step",
    "window_ms",
    "busy_ms",
    "bubble_ms",
    *(f"{k}_ms" for k in KINDS[1:6]),
]


Terms = tuple[tuple[int, float], ...]
"""(class, ns) of the nonzero entries of a per-class vector, in class order."""
CompiledArrival = tuple[int, tuple[Terms, float] | int]
"""(instance, position): local: the terms before it of the step's classes and the unscaled
``gap`` ns; blocked: ns after the start."""
CompiledPiece = tuple[int, int, Terms, list[CompiledArrival], int, bool]
"""A piece as the replay runs it (:mod:`.replay`): (kind, step index or -1, the terms of its
lengths, arrivals, owner, first_of_step). Only nonzero terms are kept: a zero adds nothing to a
time (``x + 0 * f == x``), and most of a piece's classes are zero."""


@dataclass
class Piece:
    """One piece of a rank's chain (ns, measured)."""

    step: int
    """The step whose window holds it; -1 between two windows."""
    kind: int
    """``LOCAL``, ``WAIT`` or ``EXPOSED``."""
    lengths: np.ndarray | None = None
    """Local: ns per class of :data:`KINDS`."""
    parts: list[tuple[int, int]] = field(default_factory=list)
    """Local: (class, ns) of its parts in time order (``lengths`` sums them)."""
    length: int = 0
    """Blocked: measured ns."""
    owner: int = -1
    """Blocked: the instance it waits for."""
    arrivals: list[tuple[int, np.ndarray | int]] = field(default_factory=list)
    """(instance, position): local: ns per class before it; blocked: ns after the start."""
    first_of_step: bool = False
    terms: CompiledPiece | None = field(default=None, repr=False, compare=False)
    """The piece as the replay runs it (:func:`.replay._compiled`), built on first use and
    shared by every graph that shares the piece (rebuilt for a graph whose step index of it
    differs); cleared by :meth:`changed` (and absent from a :meth:`copy`)."""

    def changed(self) -> None:
        """Say that a field changed (``lengths``, ``arrivals``, ...): the replay's form of the
        piece is built again."""
        self.terms = None

    def copy(self) -> Piece:
        """A deep copy (its arrays and lists its own): what a rewrite of a shared piece
        changes (:meth:`SegmentGraph.copy`)."""
        return replace(
            self,
            terms=None,
            lengths=None if self.lengths is None else self.lengths.copy(),
            parts=list(self.parts),
            arrivals=[
                (k, pos.copy() if isinstance(pos, np.ndarray) else pos) for k, pos in self.arrivals
            ],
        )


@dataclass
class SegmentGraph:
    """Per rank the chain of pieces, per matched instance its ranks and transfer."""

    ranks: list[int]
    steps: list[int]
    start_ns: dict[int, int]
    """Per rank, the measured (clock-aligned) start of its first piece."""
    pieces: dict[int, list[Piece]]
    transfer_ns: dict[int, int]
    """Per instance, ``X_k = E_k - A_k``."""
    end_delta_ns: dict[tuple[int, int], int]
    """Per (instance, rank), ``e_rk - E_k`` (<= 0)."""
    members: dict[int, int]
    """Per instance, how many ranks take part."""
    instances: pd.DataFrame
    """``instance, role, group, coll, step, last_arrival_ns, end_ns, msg_bytes`` (one row each;
    ``msg_bytes`` 0 where unknown)."""
    spans: pd.DataFrame
    """``instance, rank, start_ns, end_ns``: each rank's measured (aligned) span."""
    after: dict[int, int] = field(default_factory=dict)
    """instance -> the instance whose transfer it follows (starts at ``max(A'_k, E'_j)``)."""
    compiled: list[list[CompiledPiece]] | None = field(default=None, repr=False)
    """The chains as plain tuples for :func:`replay` (built on first use)."""

    def copy(self) -> SegmentGraph:
        """A copy to rewrite, without the compiled chains: its own containers, but the pieces
        are shared (copy on write: a rewrite replaces a piece by its :meth:`Piece.copy` before
        it changes it, and a rewrite changes few of them; the chains are most of the graph)."""
        return replace(
            self,
            ranks=list(self.ranks),
            steps=list(self.steps),
            start_ns=dict(self.start_ns),
            pieces={rank: list(chain) for rank, chain in self.pieces.items()},
            transfer_ns=dict(self.transfer_ns),
            end_delta_ns=dict(self.end_delta_ns),
            members=dict(self.members),
            instances=self.instances.copy(deep=True),
            spans=self.spans.copy(deep=True),
            after=dict(self.after),
            compiled=None,
        )


def build_graph(analysis: Analysis) -> SegmentGraph:
    """The segment graph of an analyzed run (see the module docstring)."""
    colls = analysis.collectives
    inst = colls.instances
    if not analysis.bubbles:
        raise RunError("the run has no analyzed step: nothing to replay", path=analysis.run.path)
    ranks = analysis.bubbles.ranks
    pieces: dict[int, list[Piece]] = {}
    starts: dict[int, int] = {}
    by_rank = _RankColls.by_rank(inst)
    for rank in ranks:
        own = sorted(analysis.bubbles.of_rank(rank), key=lambda b: b.window)
        shift = int(colls.offsets_ns.get(rank, 0))
        pieces[rank], starts[rank] = _rank_chain(own, shift, by_rank(rank))
    ends = inst.groupby("instance")["end_ns"].max()
    last = inst.groupby("instance")["arrival_last_ns"].first()
    delta = inst["end_ns"].to_numpy(np.int64) - inst["instance"].map(ends).to_numpy(np.int64)
    first = inst.groupby("instance").first()
    sizes = inst.groupby("instance")["msg_bytes"].max().fillna(0).clip(lower=0)
    table = pd.DataFrame(
        {
            "instance": first.index.to_numpy(),
            "role": first["role"].astype(str).to_numpy(),
            "group": first["group"].astype(str).to_numpy(),
            "coll": first["coll"].astype(str).to_numpy(),
            "step": first["step"].to_numpy(),
            "last_arrival_ns": last.reindex(first.index).to_numpy(np.int64),
            "end_ns": ends.reindex(first.index).to_numpy(np.int64),
            "msg_bytes": sizes.reindex(first.index).to_numpy(np.int64),
        }
    )
    return SegmentGraph(
        ranks=ranks,
        steps=sorted(set(analysis.steps["step"].tolist())),
        start_ns=starts,
        pieces=pieces,
        transfer_ns={int(k): int(ends[k] - last[k]) for k in ends.index},
        end_delta_ns={
            (int(k), int(r)): int(d)
            for k, r, d in zip(inst["instance"], inst["rank"], delta, strict=True)
        },
        members=cast(
            dict[int, int], inst.groupby("instance")["rank"].nunique().astype(int).to_dict()
        ),
        instances=table,
        spans=inst[["instance", "rank", "start_ns", "end_ns"]].reset_index(drop=True),
    )


@dataclass(frozen=True)
class _RankColls:
    """One rank's matched instances (aligned ns), sorted by arrival: Python lists, read an
    item at a time by :func:`_owned` and :func:`_attach` (numpy per item costs more)."""

    ids: list[int]
    arrival: list[int]
    end: list[int]
    last: list[int]
    target: dict[int, list[int]] = field(init=False)
    """Per blocked kind, where it ends for each instance: ``min(last, end)`` for a wait,
    ``end`` when exposed."""
    key: dict[int, list[int]] = field(init=False)
    """Per blocked kind, what picks the owner among covering instances (the latest wins):
    ``last`` for a wait, ``end`` when exposed."""
    reach: dict[int, list[int]] = field(init=False)
    """Per blocked kind, the running maximum of its targets: no instance before the first
    index where it passes ``t`` covers ``t`` (what :func:`_owned` bisects)."""
    position: dict[int, int] = field(init=False)
    """Instance -> its (first) index."""

    def __post_init__(self) -> None:
        wait = [min(a, b) for a, b in zip(self.last, self.end, strict=True)]
        target = {WAIT: wait, EXPOSED: self.end}
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "key", {WAIT: self.last, EXPOSED: self.end})
        reach = {k: list(accumulate(v, max)) for k, v in target.items()}
        object.__setattr__(self, "reach", reach)
        first = {k: i for i, k in reversed(list(enumerate(self.ids)))}
        object.__setattr__(self, "position", first)

    @staticmethod
    def by_rank(inst: pd.DataFrame) -> Callable[[int], _RankColls]:
        """Each rank's instances of ``inst``, sorted once by (rank, arrival, instance)."""
        frame = inst.sort_values(["rank", "start_ns", "instance"])
        rank, ids, arrival, end, last = (
            frame[c].to_numpy(np.int64)
            for c in ("rank", "instance", "start_ns", "end_ns", "arrival_last_ns")
        )

        def of(r: int) -> _RankColls:
            lo, hi = np.searchsorted(rank, r, "left"), np.searchsorted(rank, r, "right")
            cut = (a[lo:hi].tolist() for a in (ids, arrival, end, last))
            return _RankColls(*cut)

        return of


def _rank_chain(own: list[StepBubbles], shift: int, colls: _RankColls) -> tuple[list[Piece], int]:
    """The pieces of one rank, from the interval sets of its steps (own clock - ``shift``)."""
    elementary: list[tuple[int, int, int, int, int]] = []  # (lo, hi, kind, owner, step)
    previous_end = None
    for sb in own:
        lo, hi = sb.window[0] - shift, sb.window[1] - shift
        if previous_end is not None and lo > previous_end:
            elementary.append((previous_end, lo, GAP, -1, -1))
        parts = []
        for kind, name in enumerate(KINDS[:GAP]):
            starts, ends = sb.classes[name]
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                if b > a:
                    parts.append((a - shift, b - shift, kind))
        parts.sort()
        for a, b, kind in parts:
            if kind in (WAIT, EXPOSED):
                elementary.extend(_owned(a, b, kind, sb.step, colls))
            else:
                elementary.append((a, b, kind, -1, sb.step))
        previous_end = hi if previous_end is None else max(previous_end, hi)
    return _assemble(elementary, colls), elementary[0][0] if elementary else 0


def _owned(
    lo: int, hi: int, kind: int, step: int, colls: _RankColls
) -> list[tuple[int, int, int, int, int]]:
    """Split a blocked interval by the instance it waits for: among the instances covering each
    instant (``arrival <= t < target``, target: ``min(last, end)`` for a wait, ``end`` when
    exposed), the one with the latest key (``last`` for a wait, ``end`` when exposed; then the
    smallest id). A piece that ends exactly at its owner's target is bound to it (owner kept);
    otherwise it ended for a local reason (owner -1)."""
    target, key, arrival, ids = colls.target[kind], colls.key[kind], colls.arrival, colls.ids
    # arrivals are sorted: only instances in [first reaching past lo, first arriving at hi)
    begin, stop = bisect_right(colls.reach[kind], lo), bisect_left(arrival, hi)
    near = [i for i in range(begin, stop) if target[i] > lo]
    inner = {p for i in near for p in (arrival[i], target[i]) if lo < p < hi}
    points = sorted({lo, hi} | inner)
    out: list[tuple[int, int, int, int, int]] = []
    for a, b in zip(points[:-1], points[1:], strict=True):
        cover = [i for i in near if arrival[i] <= a and target[i] > a]
        owner = ids[min(cover, key=lambda i: (-key[i], ids[i]))] if cover else -1
        if out and out[-1][3] == owner:
            out[-1] = (out[-1][0], b, kind, owner, step)
        else:
            out.append((a, b, kind, owner, step))
    bound = []
    for a, b, k, owner, s in out:
        if owner >= 0 and b != target[colls.position[owner]]:
            owner = -1
        bound.append((a, b, k, owner, s))
    return bound


def _assemble(elementary: list[tuple[int, int, int, int, int]], colls: _RankColls) -> list[Piece]:
    """Merge runs of local parts into local pieces and attach the arrivals."""
    pieces: list[Piece] = []
    bounds: list[_Bounds] = []
    last_step = None
    open_parts: list[tuple[int, int]] | None = None  # the local piece still taking parts
    for lo, hi, kind, owner, step in elementary:
        first = step >= 0 and step != last_step
        if step >= 0:
            last_step = step
        if owner >= 0:
            pieces.append(Piece(step, kind, length=hi - lo, owner=owner, first_of_step=first))
            bounds.append(_Bounds(lo, hi, []))
            open_parts = None
            continue
        if open_parts is not None and pieces[-1].step == step and not first:
            open_parts.append((kind, hi - lo))
            where = bounds[-1]
            where.hi = hi
            where.parts.append((lo, hi, kind))
            continue
        open_parts = [(kind, hi - lo)]
        pieces.append(Piece(step, LOCAL, parts=open_parts, first_of_step=first))
        bounds.append(_Bounds(lo, hi, [(lo, hi, kind)]))
    _lengths([p for p in pieces if p.kind == LOCAL])
    _attach(pieces, bounds, colls)
    return pieces


@dataclass
class _Bounds:
    """Where a piece lies (aligned ns) and, local, its parts ``(lo, hi, class)``."""

    lo: int
    hi: int
    parts: list[tuple[int, int, int]]


def _lengths(local: list[Piece]) -> None:
    """Each local piece's ``lengths``: its parts summed per class (in Python: one numpy call
    per rank, not one per part)."""
    rows = []
    for piece in local:
        row = [0] * len(KINDS)
        for kind, ns in piece.parts:
            row[kind] += ns
        rows.append(row)
    for piece, lengths in zip(local, np.array(rows, np.int64).reshape(-1, len(KINDS)), strict=True):
        piece.lengths = lengths


def _attach(pieces: list[Piece], bounds: list[_Bounds], c: _RankColls) -> None:
    """Each arrival of the rank goes to the piece that holds it (before the first piece: the
    first one, at a negative distance; after the last: the last one, past its end)."""
    if not pieces:
        return
    lows = [b.lo for b in bounds]
    for inst, when in zip(c.ids, c.arrival, strict=True):
        i = max(bisect_right(lows, when) - 1, 0)
        piece, where = pieces[i], bounds[i]
        if piece.kind != LOCAL or when < where.lo:
            piece.arrivals.append((inst, int(when - where.lo)))
            continue
        before = [0] * len(KINDS)
        for a, b, kind in where.parts:
            before[kind] += max(0, min(b, when) - a)
        before[GAP] += max(0, when - where.hi)  # past the rank's last piece: unscaled
        piece.arrivals.append((inst, np.array(before, np.int64)))
