"""The critical path of every step across ranks, and the rank each step's time is charged to.

Per step ``s`` the **window** runs from the earliest start of any rank's step window to the
latest end (windows of :mod:`fsobs.analysis.bubbles.windows`, clock-aligned). The path:

1. starts at the window's end on the rank whose window ends last (ties: the lower rank);
2. walks back in time (:mod:`.walk`): along the rank's busy pieces (kernels, compute ops),
   then through the matched collective it is in; at a collective's last arrival it jumps to
   the rank that arrived last (the waiting rank's wait is not on the path) and walks on there;
   other pieces and idle time fill what is left;
3. stops at the window's start: the segments tile the window exactly.

**Root rank** of a step: the rank on which the path spends the most time outside collectives
(kernels, ops, waits and idle time: the work, or the lack of it, that held the others back;
ties: the lower rank); a path made of collectives only is rooted where it ends. Its **phase**
and **cause**: see :mod:`.charge`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsobs.analysis.bubbles.windows import Windows
from fsobs.analysis.collectives.matching import Collectives
from fsobs.analysis.critical_path.chain import KINDS, Chain
from fsobs.analysis.critical_path.charge import CHARGED_COLUMNS, charged
from fsobs.analysis.critical_path.walk import Lane, Segment, walk
from fsobs.analysis.stragglers.causes import Causes

SEGMENT_COLUMNS = ["step", "rank", "kind", "name", "start_ns", "end_ns", "instance"]
"""One row per segment of a step's path, in time order (``instance``: the matched collective
of a ``collective`` or ``wait`` segment, else -1)."""
STEP_COLUMNS = ["step", "root_rank", "end_rank", "start_ns", "end_ns"]
_OFF_PATH = ("collective",)


@dataclass
class CriticalPath:
    """The critical path of a run's steps (module docstring), on the aligned clock."""

    segments: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SEGMENT_COLUMNS))
    """:data:`SEGMENT_COLUMNS`: every step's segments, by step and in time order."""
    steps: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=[*STEP_COLUMNS, *CHARGED_COLUMNS])
    )
    """Per step: :data:`STEP_COLUMNS` and the charge (:data:`.charge.CHARGED_COLUMNS`)."""


def critical_path(
    chains: Mapping[int, Chain],
    colls: Collectives,
    windows: Mapping[int, Windows],
    bubble_steps: pd.DataFrame,
    causes: Causes | None,
) -> CriticalPath:
    """The path of every step of the bubble table ``bubble_steps`` (:func:`step_paths`),
    each step charged (:func:`.charge.charged`)."""
    steps = sorted({int(s) for s in bubble_steps["step"]})
    segments, facts = step_paths(chains, colls, windows, steps)
    return CriticalPath(segments, charged(facts, bubble_steps, colls, causes))


def step_paths(
    chains: Mapping[int, Chain],
    colls: Collectives,
    windows: Mapping[int, Windows],
    steps: list[int],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The segments (:data:`SEGMENT_COLUMNS`) and the per-step facts (:data:`STEP_COLUMNS`)
    of the path of each of ``steps`` (module docstring); ``chains`` and ``windows`` per rank in
    its own clock, everything returned on the aligned clock."""
    lanes = _Lanes(chains, colls)
    rows: list[tuple[object, ...]] = []
    facts = []
    for step in steps:
        spans = {
            r: (w[step][0] - colls.offsets_ns.get(r, 0), w[step][1] - colls.offsets_ns.get(r, 0))
            for r, w in windows.items()
            if step in w and r in chains
        }
        if not spans:
            continue
        start = min(lo for lo, _ in spans.values())
        end = max(hi for _, hi in spans.values())
        end_rank = min(r for r, (_, hi) in spans.items() if hi == end)
        path = walk(lanes, end_rank, end, start)
        rows.extend((step, r, KINDS[k], name, lo, hi, i) for r, k, name, lo, hi, i in path)
        facts.append((step, root_rank(path, end_rank), end_rank, start, end))
    segments = pd.DataFrame(rows, columns=SEGMENT_COLUMNS)
    return segments.astype({"start_ns": np.int64, "end_ns": np.int64}), pd.DataFrame(
        facts, columns=STEP_COLUMNS
    )


def root_rank(path: list[Segment], end_rank: int) -> int:
    """The rank the path spends most time on outside collectives (module docstring)."""
    time: dict[int, int] = {}
    for rank, kind, _, lo, hi, _ in path:
        if KINDS[kind] not in _OFF_PATH:
            time[rank] = time.get(rank, 0) + hi - lo
    if not time:
        return end_rank
    most = max(time.values())
    return min(r for r, ns in time.items() if ns == most)


class _Lanes(Mapping[int, Lane]):
    """The :class:`Lane` of every rank, each built the first time the walk visits the rank
    (a path visits few of a run's ranks)."""

    _COLUMNS = ("start_ns", "end_ns", "arrival_last_ns", "last_rank", "instance", "coll")

    def __init__(self, chains: Mapping[int, Chain], colls: Collectives) -> None:
        self._chains, self._offsets = chains, colls.offsets_ns
        inst = colls.instances
        rank = inst["rank"].to_numpy(np.int64)
        order = np.lexsort((inst["start_ns"].to_numpy(np.int64), rank))
        self._rank = rank[order]
        self._columns = {
            c: inst[c].to_numpy(object if c == "coll" else np.int64)[order] for c in self._COLUMNS
        }
        self._built: dict[int, Lane] = {}

    def __getitem__(self, rank: int) -> Lane:
        if rank not in self._built:
            lo, hi = np.searchsorted(self._rank, [rank, rank + 1])
            mine = {c: v[lo:hi] for c, v in self._columns.items()}
            chain, offset = self._chains[rank], self._offsets.get(rank, 0)
            self._built[rank] = Lane.of(rank, chain, offset, mine)
        return self._built[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self._chains)

    def __len__(self) -> int:
        return len(self._chains)
