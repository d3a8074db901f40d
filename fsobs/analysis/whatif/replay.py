"""Replay of a segment graph (:mod:`fsobs.analysis.whatif.graph`): the what-if's engine.

Every rank walks its pieces in order, from its measured first step start. A local piece lasts
``Σ_c len_c · scale_c``. An arrival inside a local piece happens after the scaled part of the
piece before it; inside a blocked piece, at the same distance from its start. A blocked piece
of instance k waits until every rank of k has arrived::

    rank 0  |--busy x s0-----|a|xx|--busy--|          A'_k  = max_r a'_rk
    rank 1  |--busy x s1--|a|=wait=|xx|--busy--|      e'_rk = A'_k + X_k + (e_rk - E_k)
                                 ^ A'_k              E_k = max_r e_rk, X_k = E_k - A_k
    wait piece     ends at max(start', min(A'_k, e'_rk))
    exposed piece  ends at max(start', e'_rk)

(an instance that follows another one's transfer, ``SegmentGraph.after``, starts its own at
``max(A'_k, E'_j)``). With nothing changed, every piece ends where it ended, so the replay gives
back the measured windows and classes (:func:`replay_error` measures how closely). Toggles act
on the graph: class scales and extra host time per rank and step (:class:`Changes`), moved
arrivals and transfer times (:mod:`fsobs.analysis.whatif.priority`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis.whatif.graph import (
    BUSY,
    EXPOSED,
    GAP,
    IDLE,
    KINDS,
    LOCAL,
    TABLE_COLUMNS,
    WAIT,
    CompiledArrival,
    CompiledPiece,
    Piece,
    SegmentGraph,
    Terms,
    build_graph,
)
from fsobs.errors import RunError

__all__ = [
    "BUSY",
    "EXPOSED",
    "GAP",
    "KINDS",
    "LOCAL",
    "WAIT",
    "Changes",
    "Piece",
    "SegmentGraph",
    "build_graph",
    "replay",
    "replay_batch",
    "replay_error",
    "replay_totals",
    "totals_table",
]


@dataclass
class Changes:
    """What a toggle changes in a replay, per rank and step (arrays ``[rank, step]``)."""

    scale: np.ndarray | None = None
    """``[rank, step, class]`` factors on local time (default 1)."""
    extra_idle_ns: np.ndarray | None = None
    """``[rank, step]`` host time added at the start of the step (e.g. the planner's)."""


def replay(graph: SegmentGraph, changes: Changes | None = None) -> pd.DataFrame:
    """Replay the graph; per rank and step, the windows and classes in ms (columns
    :data:`TABLE_COLUMNS`, like :func:`fsobs.analysis.bubbles.tables.bubble_table`)."""
    return totals_table(graph, replay_totals(graph, changes))


def replay_totals(
    graph: SegmentGraph,
    changes: Changes | None = None,
    by_owner: dict[int, float] | None = None,
) -> np.ndarray:
    """Replay the graph; ns per ``[rank, step, class of KINDS]`` (0 where a rank has no such
    step). ``by_owner``, when given, gets the blocked ns per instance (over all ranks)."""
    totals: np.ndarray = replay_batch(graph, [changes or Changes()], by_owner)[0]
    return totals


def replay_batch(
    graph: SegmentGraph,
    batch: Sequence[Changes],
    by_owner: dict[int, float] | None = None,
    owner_replay: int = 0,
) -> np.ndarray:
    """Replay the graph once per ``Changes`` of ``batch``, all in one walk: ns per
    ``[replay, rank, step, class of KINDS]``, each replay exactly what it gives alone.

    The walk's order (which rank moves, which collective it waits on) depends on the chains
    alone, never on the times, so the replays share it: every time is an array with one entry
    per replay, and each operation acts on every entry as it would on one number (same
    operations, same order). ``by_owner`` gets the blocked ns per instance (over all ranks) of
    one replay, the one at ``owner_replay`` in ``batch`` (the only one whose blocked time the
    what-if reads: summing it for every replay would cost an array operation per piece).
    """
    n_ranks, n_steps, width = len(graph.ranks), len(graph.steps), len(batch)
    # [rank, step, class, replay] and [rank, step, replay]: one replay's numbers side by side
    scale = np.ones((n_ranks, n_steps, len(KINDS), width))
    extra = np.zeros((n_ranks, n_steps, width))
    for b, changes in enumerate(batch):
        if changes.scale is not None:
            scale[..., b] = changes.scale
        if changes.extra_idle_ns is not None:
            extra[..., b] = changes.extra_idle_ns
    totals = np.zeros((n_ranks, n_steps, len(KINDS), width))
    run = _Run(_compiled(graph), graph, scale, totals, extra)
    run.by_owner, run.owner_replay = by_owner, owner_replay
    pending = list(range(n_ranks))
    while pending:
        progressed = False
        for ri in list(pending):
            moved, done = run.advance(ri)
            progressed |= moved
            if done:
                pending.remove(ri)
        if pending and not progressed:
            raise RunError("the replay is stuck: the collectives' order forms a cycle")
    out: np.ndarray = np.moveaxis(totals, 3, 0)
    return out


def _compiled(graph: SegmentGraph) -> list[list[CompiledPiece]]:
    """The chains as plain tuples (cached on the graph until it is copied)."""
    if graph.compiled is None:
        index = {s: i for i, s in enumerate(graph.steps)}
        graph.compiled = [
            [_compiled_piece(p, index.get(p.step, -1)) for p in graph.pieces[rank]]
            for rank in graph.ranks
        ]
    return graph.compiled


def _compiled_piece(piece: Piece, si: int) -> CompiledPiece:
    """The piece as the replay runs it, ``si`` its step's index (cached on the piece: a graph
    and its rewrite share most pieces, :meth:`SegmentGraph.copy`)."""
    if piece.terms is None or piece.terms[1] != si:
        lengths = _terms(piece.lengths.tolist()) if piece.lengths is not None else ()
        arrivals = [(k, _position(pos)) for k, pos in piece.arrivals]
        piece.terms = (piece.kind, si, lengths, arrivals, piece.owner, piece.first_of_step)
    return piece.terms


def _terms(values: list[int] | list[float]) -> Terms:
    """The nonzero values as (class, Python float): ``float`` of an integer rounds to nearest,
    as a cast to float64 does (a numpy call per piece would cost more than the replay of it)."""
    return tuple((c, float(v)) for c, v in enumerate(values) if v)


def _position(position: np.ndarray | int) -> tuple[Terms, float] | int:
    """An arrival's position as the replay reads it: in a local piece, the terms of the step's
    classes before it and the unscaled ``gap`` ns (past the rank's last piece)."""
    if not isinstance(position, np.ndarray):
        return position
    values = position.tolist()
    return _terms(values[:GAP]), float(values[GAP])


class _Run:
    """Where each rank is in its chain, and the arrivals seen so far (one entry per replay)."""

    def __init__(
        self,
        chains: list[list[CompiledPiece]],
        graph: SegmentGraph,
        scale: np.ndarray,
        totals: np.ndarray,
        extra: np.ndarray,
    ) -> None:
        # scale and totals: [rank, step, class, replay]; extra: [rank, step, replay]
        self.chains, self.graph = chains, graph
        # per rank and step, the rows (one per class) of the factors and of the totals
        self.scale = [[list(step) for step in rank] for rank in scale]
        self.totals = [[list(step) for step in rank] for rank in totals]
        self.extra = [list(rank) for rank in extra]
        self.ones = list(np.ones(scale.shape[2:]))
        self.unused = list(np.zeros(totals.shape[2:]))  # the totals of pieces outside every step
        origin = min(graph.start_ns.values())  # float64 keeps ns exact only near 0
        width = scale.shape[-1]
        self.time = [np.full(width, float(graph.start_ns[r] - origin)) for r in graph.ranks]
        self.index = [0] * len(chains)
        self.arrived = [False] * len(chains)
        self.count: dict[int, int] = {}
        self.last: dict[int, np.ndarray] = {}
        # per ready instance, its end and its wait's end where e_rk = E_k (every rank but the
        # latest ones): the same arrays for every such rank, worked out once
        self.ends: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.followers = {j: k for k, j in graph.after.items()}  # whose ends follow j's
        self.ready: set[int] = set()  # instances every rank (and what they follow) reached
        self.by_owner: dict[int, float] | None = None
        self.owner_replay = 0

    def advance(self, ri: int) -> tuple[bool, bool]:
        """Walk rank ``ri`` as far as it can go; (moved, finished)."""
        chain = self.chains[ri]
        rank = self.graph.ranks[ri]
        scale, sums, extra = self.scale[ri], self.totals[ri], self.extra[ri]
        by_owner, b, ready = self.by_owner, self.owner_replay, self.ready
        i, start = self.index[ri], self.index[ri]
        t = self.time[ri]
        while i < len(chain):
            kind, si, lengths, arrivals, owner, first = chain[i]
            inside = si >= 0
            factors = scale[si] if inside else self.ones
            totals = sums[si] if inside else self.unused
            if not self.arrived[ri]:
                if first and inside:
                    t = t + extra[si]
                    totals[IDLE] += extra[si]
                if arrivals:
                    self._arrive(t, arrivals, factors)
                self.arrived[ri] = True
            if kind == LOCAL:
                for c, ns in lengths:
                    part = ns * factors[c]
                    t = t + part
                    totals[c] += part
            else:
                if owner not in ready:  # once ready, always: arrivals only add up
                    if not self._ready(owner):
                        break
                    ready.add(owner)
                target = self._target(kind, owner, rank)
                end = np.where(target > t, target, t)  # max(t, target)
                totals[kind] += end - t
                if by_owner is not None and inside:  # (sum + end) - t, as whole arrays add
                    by_owner[owner] = by_owner.get(owner, 0.0) + float(end[b]) - float(t[b])
                t = end
            i += 1
            self.arrived[ri] = False
        self.index[ri], self.time[ri] = i, t
        return i > start, i == len(chain)

    def _arrive(
        self, t: np.ndarray, arrivals: list[CompiledArrival], factors: list[np.ndarray]
    ) -> None:
        for inst, position in arrivals:
            if isinstance(position, tuple):
                terms, gap = position
                shift: np.ndarray | int = 0
                for c, p in terms:
                    shift = shift + p * factors[c]
                when = t + shift
                if gap:
                    when = when + gap
            else:
                when = t + position
            self.count[inst] = self.count.get(inst, 0) + 1
            last = self.last.get(inst)
            self.last[inst] = when if last is None else np.where(when > last, when, last)
            if self.ends:  # an arrival after the instance was ready: its ends move
                self.ends.pop(inst, None)
                self.ends.pop(self.followers.get(inst, -1), None)

    def _ready(self, k: int) -> bool:
        members = self.graph.members
        j = self.graph.after.get(k)
        return self.count.get(k, 0) >= members[k] and (
            j is None or self.count.get(j, 0) >= members[j]
        )

    def _target(self, kind: int, k: int, rank: int) -> np.ndarray:
        """Where a blocked piece of instance ``k`` ends on ``rank``: ``E'_k + (e_rk - E_k)``
        when exposed, ``min(A'_k, e'_rk)`` for a wait."""
        delta = self.graph.end_delta_ns[(k, rank)]
        ends = self.ends.get(k)
        if ends is None:
            ends = self.ends[k] = self._ends(k)
        if not delta:  # end + 0 is end: the shared arrays
            return ends[1] if kind == WAIT else ends[0]
        last = self.last[k]
        end = ends[0] + delta
        return np.where(end < last, end, last) if kind == WAIT else end  # min(last, end)

    def _ends(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``E'_k`` (the transfer after the last arrival, or after the transfer it follows)
        and ``min(A'_k, E'_k)``."""
        last = self.last[k]
        begin = last
        j = self.graph.after.get(k)
        if j is not None:
            later = self.last[j] + self.graph.transfer_ns[j]
            begin = np.where(later > last, later, last)  # max(last, later)
        end = begin + self.graph.transfer_ns[k]
        return end, np.where(end < last, end, last)


def totals_table(graph: SegmentGraph, totals: np.ndarray) -> pd.DataFrame:
    """Replayed ns ``[rank, step, class]`` as :func:`replay`'s table."""
    rows = []
    for ri, rank in enumerate(graph.ranks):
        present = {p.step for p in graph.pieces[rank]}
        for si, step in enumerate(graph.steps):
            if step not in present:
                continue
            ms = totals[ri, si] / 1e6
            window = float(ms[:GAP].sum())
            row = {"rank": rank, "step": step, "window_ms": window, "busy_ms": float(ms[BUSY])}
            row["bubble_ms"] = window - row["busy_ms"]
            for kind in range(WAIT, GAP):
                row[f"{KINDS[kind]}_ms"] = float(ms[kind])
            rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def replay_error(measured: pd.DataFrame, replayed: pd.DataFrame) -> dict[str, float]:
    """How far a replay is from the measured run, per step.

    ``step_time_*``: ``|t' - t| / t`` of each step's time (its longest window); ``classes_*``:
    ``|c' - c| / window`` of every class of every rank and step (the error as a share of the
    step). Median and p90 of each, and the largest.
    """
    keys = ["rank", "step"]
    both = measured.merge(replayed, on=keys, suffixes=("", "_r"))
    if both.empty:
        raise RunError("the replay shares no (rank, step) with the measured run")
    t = both.groupby("step")["window_ms"].max()
    t_r = both.groupby("step")["window_ms_r"].max()
    step_err = ((t_r - t).abs() / t.where(t > 0)).fillna(0.0).to_numpy()
    window = both["window_ms"].where(both["window_ms"] > 0).to_numpy()
    class_err = np.concatenate(
        [
            np.nan_to_num((both[f"{c}_r"] - both[c]).abs().to_numpy() / window)
            for c in ("busy_ms", *(f"{k}_ms" for k in KINDS[1:6]))
        ]
    )
    return {
        "step_time_median": float(np.median(step_err)),
        "step_time_p90": float(np.percentile(step_err, 90)),
        "step_time_max": float(step_err.max()),
        "classes_median": float(np.median(class_err)),
        "classes_p90": float(np.percentile(class_err, 90)),
        "classes_max": float(class_err.max()),
        "steps": int(len(step_err)),
    }
