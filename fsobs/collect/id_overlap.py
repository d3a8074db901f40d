"""How much of each global batch's embedding IDs the previous global batch already had.

torchrec's Prioritized Embedding Communication (PEC) looks up the IDs batch N+1 shares with
batch N with fresh weights and the other IDs one step ahead, so this share is what PEC can put
on the overlapped path. Per embedding table ``t`` and step ``s`` (the step sidecar's
``id_overlap``, :mod:`fsobs.runformat.steps`)::

    ids_t(s)   the IDs of every feature table t looks up, over all samples of global batch s
               (with repeats: one entry per occurrence)
    share_t(s) = |{occurrences in ids_t(s) whose ID is in ids_t(s - 1)}| / |ids_t(s)|

    batch s-1   item ids  3 3 8            batch s   item ids  3 5 8 8 9
    share = |{3, 8, 8}| / 5 = 0.6          (3 and 8 were in s-1; 5 and 9 were not)

The first step has no previous batch (no share), nor has a table without any ID in batch ``s``.
Every rank computes the same shares from the same global batches (no communication). The
recorder computes them from the IDs a loop passes; the reference job from its own samples
(:mod:`fsobs.workload.overlap`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

TableIds = dict[str, np.ndarray]
"""Table -> the IDs its features look up over one global batch (int64, with repeats)."""


def overlap_share(current: np.ndarray, previous: np.ndarray) -> float:
    """The share of the entries of ``current`` whose value occurs in ``previous`` (module
    docstring); ``current`` must not be empty."""
    if not len(current):
        raise ValueError("current: no ids, no share")
    return float(np.isin(current, previous).mean())


def id_overlaps(batches: Iterable[TableIds]) -> list[dict[str, float] | None]:
    """The shares of each batch against the one before it (None for the first; a table with
    no ID in a batch is left out, and a batch with no such table gives None)."""
    out: list[dict[str, float] | None] = []
    previous: dict[str, np.ndarray] | None = None
    for ids in batches:
        shares = {}
        if previous is not None:
            shares = {
                table: overlap_share(values, previous.get(table, values[:0]))
                for table, values in ids.items()
                if len(values)
            }
        out.append(shares or None)
        previous = {table: np.unique(values) for table, values in ids.items()}
    return out
