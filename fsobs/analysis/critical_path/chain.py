"""One rank's chain: what occupies its resource at every instant, as disjoint named pieces.

The rank-side half of the critical path (:mod:`fsobs.analysis.critical_path`), computed where
each rank is reduced (:func:`fsobs.analysis.summary.summarize_rank`). Tiers of pieces, each
a sorted set of disjoint ``[start, end)`` with a kind and a name:

- ``busy``: GPU: the compute kernels; CPU: the instants whose innermost op on the training
  thread is a compute op (the busy rule of :mod:`fsobs.analysis.bubbles`);
- ``other``: GPU: every other GPU event (memcpy, memset, sync, communication kernels: a
  matched collective is taken from the matching instead, so only unmatched ones are read
  here); CPU: the instants whose innermost op is any other op (glue, enqueues);
- ``host`` (GPU ranks only): the training thread's innermost op at each instant, compute or
  not: where the GPU is idle, the host is what it waits for (a late launch, data loading).

Overlapping events of one tier (kernels on several streams) become disjoint pieces by
clipping each event's start to the latest end of the events that started before it; an event
inside an earlier one leaves no piece::

    stream 7   |==A==========|
    stream 8        |==B==|     |==C==|
    pieces     |==A==========|  |==C==|     (B is inside A)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fsobs.analysis.bubbles.optree import OpTree, op_tree
from fsobs.analysis.bubbles.parts import BubbleConfig, main_thread
from fsobs.analysis.collectives.matching import step_marks
from fsobs.trace.categorical import codes, is_in
from fsobs.trace.schema import RankTrace

KINDS = ("kernel", "op", "collective", "wait", "idle")
"""The kinds of a critical-path segment."""
_GPU_WORK = ("compute", "comm", "memcpy", "memset", "sync")


@dataclass(frozen=True)
class Pieces:
    """Disjoint pieces sorted by start (so by end too); ``name``: codes into the chain's
    ``names``; ``kind``: positions in :data:`KINDS`."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    name: np.ndarray

    def shifted(self, offset_ns: int) -> Pieces:
        """The pieces on another clock (``offset_ns`` subtracted)."""
        return Pieces(self.start - offset_ns, self.end - offset_ns, self.kind, self.name)


_NO_PIECES = Pieces(*(np.zeros(0, t) for t in (np.int64, np.int64, np.int8, np.int64)))


@dataclass(frozen=True)
class Chain:
    """One rank's :class:`Pieces` of both tiers (module docstring), in its own clock."""

    busy: Pieces
    other: Pieces
    names: tuple[str, ...]
    host: Pieces = _NO_PIECES
    """GPU ranks: the training thread's innermost ops (kind ``op``), what the path follows
    where the GPU is idle (the host had not launched the work yet); empty on CPU ranks."""


def rank_chain(trace: RankTrace, config: BubbleConfig | None = None) -> Chain:
    """The chain of one rank (module docstring)."""
    config = config or BubbleConfig()
    if trace.device == "gpu":
        return _gpu_chain(trace, config)
    busy, other = _thread_ops(trace, config)
    return _named(trace, busy, other, _NO_PIECES)


def disjoint(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions and clipped starts of the pieces of possibly overlapping ``[start, end)``
    (module docstring): returns ``(kept, clipped_start)``, ``kept`` in start order."""
    order = np.lexsort((start - end, start))  # by start, longer first
    s, e = start[order], end[order]
    before = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], e)))[:-1]
    clipped = np.maximum(s, before)
    keep = e > clipped
    return order[keep], clipped[keep]


def _pieces(start: np.ndarray, end: np.ndarray, kind: np.ndarray, name: np.ndarray) -> Pieces:
    kept, clipped = disjoint(start, end)
    return Pieces(clipped, end[kept], kind[kept].astype(np.int8), name[kept].astype(np.int64))


def _named(trace: RankTrace, busy: Pieces, other: Pieces, host: Pieces) -> Chain:
    """The chain with only the names its pieces use (a trace names thousands of events; the
    chain travels to the analysis and stays there), its pieces' codes renumbered."""
    tiers = (busy, other, host)
    used, code = np.unique(np.concatenate([p.name for p in tiers]), return_inverse=True)
    categories = trace.events["name"].cat.categories
    cuts = np.cumsum([0, *(len(p.name) for p in tiers)])
    busy, other, host = (
        Pieces(p.start, p.end, p.kind, code[lo:hi].astype(np.int64))
        for p, lo, hi in zip(tiers, cuts[:-1], cuts[1:], strict=True)
    )
    return Chain(busy, other, tuple(str(categories[c]) for c in used.tolist()), host)


def _gpu_chain(trace: RankTrace, config: BubbleConfig) -> Chain:
    ev = trace.events
    rows = np.flatnonzero((ev["stream"].to_numpy() >= 0) & is_in(ev["kind"], _GPU_WORK))
    start = ev["ts_ns"].to_numpy()[rows].astype(np.int64)
    end = start + ev["dur_ns"].to_numpy()[rows]
    name = codes(ev["name"])[rows]
    is_compute = is_in(ev["kind"], ("compute",))[rows]
    kind = np.where(
        is_in(ev["kind"], ("comm",))[rows], KINDS.index("collective"), KINDS.index("kernel")
    )
    busy = _pieces(start[is_compute], end[is_compute], kind[is_compute], name[is_compute])
    other = _pieces(start[~is_compute], end[~is_compute], kind[~is_compute], name[~is_compute])
    compute_ops, other_ops = _thread_ops(trace, config)
    host = _pieces(
        *(
            np.concatenate((a, b))
            for a, b in zip(_fields(compute_ops), _fields(other_ops), strict=True)
        )
    )
    return _named(trace, busy, other, host)


def _fields(p: Pieces) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return p.start, p.end, p.kind, p.name


def _thread_ops(trace: RankTrace, config: BubbleConfig) -> tuple[Pieces, Pieces]:
    """The instants of the training thread whose innermost op is a compute op, and those whose
    innermost op is another op (kind ``op``)."""
    ev = trace.events
    tid = main_thread(ev, step_marks(ev))
    on_thread = (ev["tid"] == tid).to_numpy(bool) & is_in(ev["device"], ("cpu",))
    rows = np.flatnonzero(on_thread & is_in(ev["cat"], ("cpu_op",)) & ~is_in(ev["kind"], ("step",)))
    start = ev["ts_ns"].to_numpy()[rows].astype(np.int64)
    tree = op_tree(start, start + ev["dur_ns"].to_numpy()[rows])
    categories = ev["name"].cat.categories
    is_compute_name = np.array([str(n).startswith(config.compute_op_prefixes) for n in categories])
    name = codes(ev["name"])[rows][tree.rows]
    bounds, owner = _innermost(tree)
    found = owner >= 0
    lo, hi, op = bounds[:-1][found], bounds[1:][found], owner[found]
    code = name[op]
    compute = is_compute_name[code] if len(code) else np.zeros(0, bool)
    kind = np.full(len(code), KINDS.index("op"), np.int8)
    busy = _merged(lo[compute], hi[compute], kind[compute], code[compute], op[compute])
    other = _merged(lo[~compute], hi[~compute], kind[~compute], code[~compute], op[~compute])
    return busy, other


def _innermost(tree: OpTree) -> tuple[np.ndarray, np.ndarray]:
    """The elementary segments between every op boundary and, for each, the innermost op
    covering it (an index into ``tree``, -1 where none). Ops of one depth are disjoint, so a
    segment's op at each depth is found by one search; the deepest one found wins."""
    bounds = np.unique(np.concatenate((tree.start, tree.end)))
    if len(bounds) < 2:
        return bounds, np.zeros(0, np.int64)
    mid = bounds[:-1]
    owner = np.full(len(mid), -1, np.int64)
    for d in range(int(tree.depth.max(initial=-1)) + 1):
        at = np.flatnonzero(tree.depth == d)
        pos = np.searchsorted(tree.start[at], mid, "right") - 1
        inside = (pos >= 0) & (tree.end[at][np.maximum(pos, 0)] > mid)
        owner[inside] = at[pos[inside]]
    return bounds, owner


def _merged(
    lo: np.ndarray, hi: np.ndarray, kind: np.ndarray, name: np.ndarray, op: np.ndarray
) -> Pieces:
    """Sorted disjoint pieces with the contiguous ones of one op (``op``: its index) joined:
    an op's instants, cut apart by the boundaries of ops that own none (a zero-length child)."""
    join = np.zeros(len(lo), bool)
    join[1:] = (lo[1:] == hi[:-1]) & (op[1:] == op[:-1])
    first = np.flatnonzero(~join)
    last = np.concatenate((first[1:], [len(lo)]))[: len(first)] - 1  # none without pieces
    return Pieces(lo[first], hi[last], kind[first], name[first].astype(np.int64))
