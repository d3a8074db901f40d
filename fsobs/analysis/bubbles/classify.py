"""The classes of one rank's steps from its interval sets and its matched collectives (the
rules of :mod:`fsobs.analysis.bubbles`), and who caused each piece of straggler wait."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.analysis.bubbles.parts import CLASSES, StepParts
from fsobs.analysis.collectives.matching import Collectives
from optim.markers import ALL_ROLES

EXPOSED_ORDER = (
    "pec_mask",
    "pec_overlapped",
    "pec_overlapped_grad",
    "pec_ahead",
    "embedding",
    "pec_deferred_grad",
    "dense",
    "other",
)
"""Who owns exposed time that several collectives of a rank cover: the first role in this
order (embedding before dense before other). PEC's roles (:data:`optim.markers.PEC_ROLES`)
rank by how soon a PEC step waits for them after their launch: the mask exchange, the
overlapped lookup and gradient are waited in their own phase, the ahead lookup at the next
forward, the deferred gradient after the forward it overlaps."""
_EXPOSED_RANK = np.array([EXPOSED_ORDER.index(role) for role in ALL_ROLES], np.int64)


@dataclass
class StepBubbles:
    """The interval sets of one rank and step, in that rank's own clock (ns)."""

    rank: int
    step: int
    window: tuple[int, int]
    classes: dict[str, iv.Intervals]
    contention_ns: int = 0
    caused_ns: dict[int, int] = field(default_factory=dict)
    """last rank -> ns of this rank's straggler_wait charged to it (see the module doc)."""
    by_role_ns: dict[tuple[str, str], int] = field(default_factory=dict)
    """(class, role) -> ns of straggler_wait / exposed_comm in collectives of that role."""

    def total_ns(self, name: str) -> int:
        return int(iv.length(self.classes[name]))


@dataclass(frozen=True)
class RankWaits:
    """The matched collective events of one rank, in its own clock, sorted by event row."""

    rows: np.ndarray
    start: np.ndarray
    wait_end: np.ndarray
    """min(last arrival, own end)."""
    end: np.ndarray
    last_rank: np.ndarray
    priority: np.ndarray
    """Charging order for overlapping waits: latest last arrival first."""
    role: np.ndarray
    """Position in :data:`optim.markers.ALL_ROLES` (``embedding``, ``dense``, ``other``, then
    PEC's roles)."""

    @staticmethod
    def of_ranks(colls: Collectives, ranks: list[int]) -> dict[int, RankWaits]:
        """Those of each rank in ``ranks`` (none for a rank without matched collectives)."""
        inst = colls.instances
        rank = inst["rank"].to_numpy(np.int64)
        shift = np.array([colls.offsets_ns.get(r, 0) for r in rank.tolist()], np.int64)
        last = inst["arrival_last_ns"].to_numpy(np.int64) + shift
        by_priority = np.lexsort((inst["instance"].to_numpy(), -last, rank))
        ranked = rank[by_priority]
        priority = np.empty(len(rank), np.int64)
        priority[by_priority] = np.arange(len(rank)) - np.searchsorted(ranked, ranked)
        order = np.lexsort((inst["row"].to_numpy(), rank))
        columns = {
            "rows": inst["row"].to_numpy(np.int64),
            "start": inst["start_ns"].to_numpy(np.int64) + shift,
            "wait_end": np.minimum(last, inst["end_ns"].to_numpy(np.int64) + shift),
            "end": inst["end_ns"].to_numpy(np.int64) + shift,
            "last_rank": inst["last_rank"].to_numpy(np.int64),
            "priority": priority,
            "role": _role_codes(inst["role"]),
        }
        columns = {name: values[order] for name, values in columns.items()}
        first = np.searchsorted(rank[order], ranks, "left")
        stop = np.searchsorted(rank[order], ranks, "right")
        return {
            r: RankWaits(**{name: values[a:b] for name, values in columns.items()})
            for r, a, b in zip(ranks, first.tolist(), stop.tolist(), strict=True)
        }

    def find(self, rows: np.ndarray) -> np.ndarray:
        """Position of each of ``rows`` among the matched collectives, -1 where unmatched."""
        return iv.position(self.rows, rows)


def _role_codes(roles: pd.Series) -> np.ndarray:
    """Positions in :data:`ALL_ROLES` (a role outside it counts as ``other``)."""
    codes = pd.Categorical(roles, categories=ALL_ROLES).codes.astype(np.int64)
    return np.where(codes >= 0, codes, ALL_ROLES.index("other"))


def classify(parts: list[StepParts], waits: RankWaits) -> list[StepBubbles]:
    """Split the step windows of one rank into the classes, given its matched collectives.

    Every class is a pointwise formula of the rank's interval sets, each clipped to its step's
    window, so steps with disjoint windows are classified together, in one pass over all
    their boundaries (:func:`fsobs.analysis.intervals.segments`), and each step gets the part
    of the result inside its window: what it would get alone. Steps whose windows overlap
    (never on a GPU, whose windows tile the timeline) are classified one by one.
    """
    if not parts:  # a rank without any window
        return []
    windows = [p.window for p in parts]
    order = sorted(range(len(parts)), key=windows.__getitem__)
    disjoint = all(windows[a][1] <= windows[b][0] for a, b in pairwise(order))
    done: dict[int, StepBubbles] = {}
    for batch in [order] if disjoint else [[i] for i in order]:
        classified = _classify_disjoint([parts[i] for i in batch], waits)
        done.update(zip(batch, classified, strict=True))
    return [done[i] for i in range(len(parts))]


def _classify_disjoint(parts: list[StepParts], waits: RankWaits) -> list[StepBubbles]:
    """:func:`classify` for steps sorted by window, with windows that do not overlap."""
    lo = np.array([p.window[0] for p in parts], np.int64)
    hi = np.array([p.window[1] for p in parts], np.int64)
    step, pos = _matched(parts, waits)
    wait_set = _pieces(waits.start[pos], waits.wait_end[pos], lo[step], hi[step])
    matched = _pieces(waits.start[pos], waits.end[pos], lo[step], hi[step])
    layers = {"window": (lo, hi), "wait_set": wait_set, "matched": matched}
    for name in ("compute", "comm", "transfer", "everything", "loading", "loader_comm"):
        sets = [getattr(p, name) for p in parts]
        layers[name] = (np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))
    bounds, cover = iv.segments(list(layers.values()))
    classes = _formulas(parts[0].device, dict(zip(layers, cover.T, strict=True)))
    label = np.searchsorted(lo, bounds[:-1], "right")  # the window a segment lies in
    split = {name: _split(iv.runs(bounds, mask, label), lo) for name, mask in classes.items()}
    charged = _charge(bounds, classes, waits, (step, pos), (wait_set, matched), len(parts))
    return [
        StepBubbles(
            p.rank,
            p.step,
            p.window,
            {name: split[name][k] for name in CLASSES},
            p.contention_ns,
            *charged[k],
        )
        for k, p in enumerate(parts)
    ]


def _matched(parts: list[StepParts], waits: RankWaits) -> tuple[np.ndarray, np.ndarray]:
    """(step index, position in ``waits``) of every matched collective among each step's
    communication events, by step and then position."""
    pos = waits.find(np.concatenate([p.comm_rows for p in parts]))
    of_step = np.repeat(np.arange(len(parts)), [len(p.comm_rows) for p in parts])
    found = pos >= 0
    order = np.lexsort((pos[found], of_step[found]))
    return of_step[found][order], pos[found][order]


def _pieces(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> iv.Intervals:
    """Each ``[start, end)`` clipped to the window ``[lo, hi)`` of its step (empty ones kept
    empty, so that piece i stays collective i)."""
    clipped_start = np.maximum(start, lo)
    return clipped_start, np.maximum(np.minimum(end, hi), clipped_start)


def _formulas(device: str, on: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The classes as masks over elementary segments, from the layers covering each (the
    rules of the module docstring)."""
    matched = on["matched"] | on["transfer"]
    if device == "gpu":
        blocked = on["comm"] & ~on["compute"]
        idle = on["window"] & ~on["everything"]
        other = on["everything"] & ~(on["compute"] | on["comm"])
        busy = on["compute"]
    else:
        inside = on["loader_comm"] & ~on["compute"]
        blocked = (on["comm"] & ~on["compute"] & ~on["loading"]) | inside
        idle = on["loading"] & ~on["compute"] & ~inside
        other = np.zeros_like(idle)
        busy = on["window"] & ~blocked & ~idle
    wait = blocked & on["wait_set"]
    return {
        "busy": busy,
        "straggler_wait": wait,
        "exposed_comm": blocked & matched & ~wait,
        "unattributed_comm": blocked & ~matched,
        "host_idle": idle,
        "other": other,
    }


def _split(runs: iv.Intervals, lo: np.ndarray) -> list[iv.Intervals]:
    """The runs of each window (every run lies inside one window; windows sorted, disjoint)."""
    cuts = [0, *np.searchsorted(runs[0], lo[1:]).tolist(), len(runs[0])]
    return [(runs[0][a:b], runs[1][a:b]) for a, b in pairwise(cuts)]


Charges = tuple[dict[int, int], dict[tuple[str, str], int]]


def _charge(
    bounds: np.ndarray,
    classes: dict[str, np.ndarray],
    waits: RankWaits,
    matched: tuple[np.ndarray, np.ndarray],
    pieces: tuple[iv.Intervals, iv.Intervals],
    num_steps: int,
) -> list[Charges]:
    """Who caused each piece of straggler wait, and the role of the collective each piece of
    wait and exposed time belongs to, per step (``classes``: masks over the segments between
    ``bounds``; ``matched``: step index and position in ``waits`` of each collective of
    ``pieces``, its wait and its whole span clipped to the step's window).

    Straggler wait goes to the matched instance covering it whose last arrival is latest (the
    binding one), and so to that instance's last rank::

        wait set      |=========|      |====|
        instance a  |-----------)                  last rank 2, arrives at 40
        instance b        |--------------------)   last rank 3, arrives at 70 (charged first)
        charged        2  |  3  |      |  3 |

    Exposed time covered by several collectives goes to the first role in
    :data:`EXPOSED_ORDER` (embedding before dense before other).
    """
    step, pos = matched
    by_wait = np.argsort(-waits.priority[pos], kind="stable")  # the binding one last
    waited = _owned(bounds, classes["straggler_wait"], pieces[0], by_wait)
    by_role = np.argsort(-_EXPOSED_RANK[waits.role[pos]], kind="stable")  # the first role last
    exposed = _owned(bounds, classes["exposed_comm"], pieces[1], by_role)
    charges: list[Charges] = [({}, {}) for _ in range(num_steps)]
    steps, culprits, roles = step.tolist(), waits.last_rank[pos].tolist(), waits.role[pos].tolist()
    for i in np.flatnonzero(waited).tolist():
        caused, by_role = charges[steps[i]]
        culprit, key, ns = culprits[i], ("straggler_wait", ALL_ROLES[roles[i]]), int(waited[i])
        caused[culprit] = caused.get(culprit, 0) + ns
        by_role[key] = by_role.get(key, 0) + ns
    for i in np.flatnonzero(exposed).tolist():
        by_role = charges[steps[i]][1]
        key = ("exposed_comm", ALL_ROLES[roles[i]])
        by_role[key] = by_role.get(key, 0) + int(exposed[i])
    return charges


def _owned(
    bounds: np.ndarray, target: np.ndarray, pieces: iv.Intervals, order: np.ndarray
) -> np.ndarray:
    """ns of the ``target`` segments (a mask over the segments between ``bounds``) owned by
    each piece; where pieces overlap, the later one in ``order`` owns the segment."""
    owner = np.full(len(target), -1, np.int64)
    first = np.searchsorted(bounds, pieces[0]).tolist()
    stop = np.searchsorted(bounds, pieces[1]).tolist()
    for i in order.tolist():
        owner[first[i] : stop[i]] = i
    owned = target & (owner >= 0)
    ns = np.zeros(len(pieces[0]), np.int64)
    np.add.at(ns, owner[owned], np.diff(bounds)[owned])
    return ns
