"""Full garbage collections held off while the what-if builds and replays its graphs.

The what-if allocates hundreds of thousands of small containers (pieces, their arrivals, the
replay's tuples) beside a loaded run that is itself millions of objects. Python's collector
then runs a full (oldest-generation) collection every few hundred thousand allocations, and
each one walks every object of the process: at 256 ranks a third of the what-if's time, for
garbage that is not there (what the what-if builds lives until it returns). Young collections
(generations 0 and 1, which walk only the new objects) keep running, so short-lived cycles are
still freed.

The threshold is process-wide: nested and concurrent what-ifs (the dashboard runs one per
session thread) share one hold, the first in sets it and the last out puts back the threshold
it found.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

OLDEST_HELD = 1_000_000_000
"""The oldest generation's threshold while held: young collections between full ones."""


class _Hold:
    """The process's one hold: how many are inside, and the threshold found by the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.saved: tuple[int, int, int] | None = None

    def enter(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.saved = gc.get_threshold()
                gc.set_threshold(self.saved[0], self.saved[1], OLDEST_HELD)
            self.holders += 1

    def leave(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0 and self.saved is not None:
                gc.set_threshold(*self.saved)
                self.saved = None


_HOLD = _Hold()


@contextmanager
def full_collections_held() -> Iterator[None]:
    """Inside, no automatic full collection; young ones run as before (see the module)."""
    _HOLD.enter()
    try:
        yield
    finally:
        _HOLD.leave()
