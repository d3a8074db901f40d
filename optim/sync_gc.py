"""The ``sync_gc`` toggle: Python's garbage collector at the same step on every rank.

Automatic collection pauses one rank at a time, at whatever step its allocation counters cross
a threshold; every other rank then waits for it at the next collective. With the toggle on,
automatic collection is off during training and every rank collects the young generation
(``generation``, 0 by default: the cheap one) after every ``every``-th step, so the pauses line
up across ranks instead of making stragglers. No communication is needed: every rank counts
the same steps. Older generations are left to the end of training (or to a step the user
chooses), which is the usual trade of large training codebases doing this by hand. No torch.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from optim.errors import FieldError

__all__ = ["SyncGC", "SyncGCConfig"]


@dataclass(kw_only=True, frozen=True)
class SyncGCConfig:
    """The ``sync_gc`` toggle (off by default: Python's automatic collection, untouched)."""

    enabled: bool = False
    """Automatic garbage collection off; every rank collects the young generation at the same
    steps (every 10)."""
    every: int = 10
    """Collect after every this many steps (the same steps on every rank)."""
    generation: int = 0
    """The oldest generation collected then (0: young only)."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise FieldError("every", f"must be >= 1, got {self.every}")
        if self.generation not in (0, 1, 2):
            raise FieldError("generation", f"0, 1 or 2, got {self.generation}")


class SyncGC:
    """Start with :meth:`start`, call :meth:`after_step` after each step, :meth:`stop` at the
    end (automatic collection comes back as it was)."""

    def __init__(self, config: SyncGCConfig) -> None:
        self.config = config
        self._was_enabled: bool | None = None
        self.collections = 0

    @property
    def started(self) -> bool:
        """Whether automatic collection is off under the toggle (between start and stop)."""
        return self._was_enabled is not None

    def start(self) -> None:
        if self.config.enabled and self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()

    def after_step(self, step: int) -> None:
        """Collect after every ``every``-th step, once started (before :meth:`start`, or after
        :meth:`stop`, Python's own collection runs and this does nothing)."""
        if self.started and (step + 1) % self.config.every == 0:
            gc.collect(self.config.generation)
            self.collections += 1

    def stop(self) -> None:
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
