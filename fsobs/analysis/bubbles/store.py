"""The class interval sets of an analyzed run, one rank at a time.

Every rank's :class:`~fsobs.analysis.bubbles.classify.StepBubbles` (its steps' interval sets
of every class) grow with the rank's event count, so an analysis does not keep them in memory:
each rank's are pickled (:func:`~fsobs.analysis.bubbles.packing.pack_bubbles`) into a
:class:`~fsobs.analysis.spill.SpillFile` as soon as the rank is classified, and read back on
demand, a rank at a time (the export, the dashboard's timeline of the chosen ranks, the
what-if's segment graph). A pickled store (the dashboard's disk cache)
carries every rank's blob and keeps them in memory once unpickled.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fsobs.analysis.bubbles.classify import StepBubbles
from fsobs.analysis.bubbles.packing import pack_bubbles, unpack_bubbles
from fsobs.analysis.spill import Spilled, SpillFile


class BubbleStore:
    """rank -> its :class:`StepBubbles`, in step order; iterating gives every rank's in turn
    (rank order)."""

    def __init__(self) -> None:
        self._file: SpillFile | None = None
        self._blobs: dict[int, Spilled | bytes] = {}
        self._count = 0

    def put(self, rank: int, steps: list[StepBubbles]) -> None:
        """Keep the steps of ``rank`` (on disk)."""
        if rank in self._blobs:
            raise ValueError(f"rank {rank} is already stored")
        if self._file is None:
            self._file = SpillFile()
        self._blobs[rank] = self._file.put(pack_bubbles(steps))
        self._count += len(steps)

    @property
    def ranks(self) -> list[int]:
        return sorted(self._blobs)

    def of_rank(self, rank: int) -> list[StepBubbles]:
        """The steps of ``rank`` (none for a rank not stored)."""
        blob = self._blobs.get(rank)
        if blob is None:
            return []
        return unpack_bubbles(blob.read() if isinstance(blob, Spilled) else blob)

    def of_ranks(self, ranks: Iterable[int]) -> list[StepBubbles]:
        """The steps of each of ``ranks``, rank by rank (in the order given)."""
        return [sb for rank in ranks for sb in self.of_rank(rank)]

    def __iter__(self) -> Iterator[StepBubbles]:
        for rank in self.ranks:
            yield from self.of_rank(rank)

    @property
    def nbytes(self) -> int:
        """Size of the pickled steps of every rank (on disk, or in memory once unpickled)."""
        return sum(b.size if isinstance(b, Spilled) else len(b) for b in self._blobs.values())

    def __len__(self) -> int:
        """Number of (rank, step) stored."""
        return self._count

    def __getstate__(self) -> dict[str, Any]:
        blobs = {r: b.read() if isinstance(b, Spilled) else b for r, b in self._blobs.items()}
        return {"blobs": blobs, "count": self._count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._file = None
        self._blobs = dict(state["blobs"])
        self._count = state["count"]
