"""The ``balance`` toggle's config and the per-step plan that assigns a global batch to the ranks
(numpy only, no torch).

Both modes of DESIGN §6 use :func:`plan_step` on the costs of one global batch, listed in
*global-batch order* (position ``p`` is the ``p``-th sample of the global batch):

- **plan** mode: every rank knows all lengths up front and calls :func:`plan_step` itself: the
  same inputs give the same plan on every rank, with no communication;
- **shuffle** mode (:mod:`optim.shuffle`, torch): each rank knows only its own random-split share;
  the costs are all-gathered in rank order (which is global-batch order, because the random split
  is contiguous), planned here, and the samples exchanged.

The baseline (toggle off) is the random split: rank ``r`` takes the ``r``-th of ``world_size``
contiguous chunks of the already shuffled global batch (``partition(..., method="random")``).
Every rank of a step then checks the plan's :func:`plan_digest` against the others now and then
(:mod:`optim.shuffle`), so a plan that diverged (different costs, lengths or versions) fails
loudly instead of training on duplicated or dropped samples.

With unequal counts (``method="lpt"``) each rank scales its mean loss by :func:`loss_scale`, so
that the all-reduced (averaged) gradient is the gradient of the global mean loss. ``lpt`` also
plans a global batch that is not a multiple of the world size (so does the toggle off: the random
split's chunks then differ by one sample); the equal-count methods ``kk`` and ``random`` raise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optim.balance import METHODS, imbalance, partition

__all__ = ["MODES", "BalanceConfig", "StepPlan", "batch_digest", "loss_scale", "plan_digest"]

MODES: tuple[str, ...] = ("plan", "shuffle")


@dataclass(kw_only=True, frozen=True)
class BalanceConfig:
    """The ``balance`` toggle (off by default: the random split, an exact no-op)."""

    enabled: bool = False
    method: str = "kk"
    """``kk`` (equal counts, default), ``lpt`` (unequal counts, loss rescaled) or ``random``."""
    mode: str = "plan"
    """``plan`` (lengths known up front) or ``shuffle`` (exchange after loading)."""
    check_every: int = 10
    """All-gather and compare the plan digest every this many steps (and at step 0); 0: never."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method: unknown {self.method!r}, expected one of {list(METHODS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode: unknown {self.mode!r}, expected one of {list(MODES)}")
        if self.check_every < 0:
            raise ValueError(f"check_every: must be >= 0, got {self.check_every}")

    @property
    def equal_size(self) -> bool:
        """Whether every rank gets the same number of samples (all methods but ``lpt``)."""
        return self.method != "lpt"

    def checks_at(self, step: int) -> bool:
        """Whether the plan digest is compared across ranks at ``step``."""
        return self.check_every > 0 and step % self.check_every == 0


@dataclass(frozen=True)
class StepPlan:
    """Which positions of one global batch each rank trains on."""

    parts: list[np.ndarray]
    """Per rank, ascending int64 positions into the global batch; together each position once."""
    imbalance_before: float
    """Max / mean estimated rank cost of the random split."""
    imbalance_after: float
    """The same for ``parts`` (equal to ``imbalance_before`` when balancing is off)."""
    digest: str
    """:func:`plan_digest` of ``parts``."""

    @classmethod
    def make(cls, costs: np.ndarray, world_size: int, config: BalanceConfig) -> StepPlan:
        """Plan one global batch whose samples cost ``costs`` (global-batch order)."""
        # The random split; when world_size does not divide the batch, chunks differ by one.
        before = partition(costs, world_size, method="random", equal_size=False)
        if config.enabled:
            after = partition(costs, world_size, method=config.method, equal_size=config.equal_size)
        else:
            after = before
        # Any fixed order of the parts is a valid assignment: rank r takes part r.
        parts = [np.asarray(p, dtype=np.int64) for p in after]
        return cls(
            parts=parts,
            imbalance_before=imbalance(costs, before),
            imbalance_after=imbalance(costs, after),
            digest=plan_digest(parts),
        )


def plan_digest(parts: Sequence[np.ndarray]) -> str:
    """A 16-hex-digit digest of an assignment (rank order and positions both count)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        arr = np.ascontiguousarray(part, dtype=np.int64)
        h.update(np.int64(arr.size).tobytes())
        h.update(arr.tobytes())
    return h.hexdigest()


def batch_digest(sample_ids: np.ndarray) -> str:
    """A 16-hex-digit digest of the *set* of samples of a global batch (order-free): two runs
    that trained a step on the same samples, however split, give the same digest."""
    ids = np.sort(np.asarray(sample_ids, dtype=np.int64))
    return hashlib.blake2b(ids.tobytes(), digest_size=8).hexdigest()


def loss_scale(num_local: int, num_global: int, world_size: int) -> float:
    """Factor on a rank's mean loss so that the ranks' averaged gradients equal the gradient of
    the global mean loss: ``world_size · num_local / num_global``::

        (1/W) Σ_r s_r · (1/n_r) Σ_{i∈r} ∇l_i  =  (1/N) Σ_i ∇l_i   with  s_r = W·n_r/N

    Equal counts (the toggle off, ``kk``, ``random``) get exactly 1.0 without arithmetic, so the
    baseline never depends on the formula that only unequal counts (``lpt``) need.
    """
    if num_global <= 0 or world_size <= 0 or num_local < 0:
        raise ValueError(
            f"loss_scale: need num_global, world_size > 0 and num_local >= 0, "
            f"got {num_local}, {num_global}, {world_size}"
        )
    if num_local * world_size == num_global:
        return 1.0
    return world_size * num_local / num_global
