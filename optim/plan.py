"""The ``balance`` toggle's config and the per-step plan that assigns a global batch to the ranks
(numpy only, no torch).

Both modes of docs/design.md §6 use :func:`plan_step` on the costs of one global batch, listed in
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

A window (``BalanceConfig(window=K)``, plan mode) plans ``K`` global batches at once with
:func:`plan_window` (:mod:`optim.window`): one plan per step, positions into the window.

A padded cost model (``CostModel.shape == "padded"``: a rank's cost is not the sum of its
samples') has no per-sample costs: its global batch is planned from the lengths
(:class:`optim.padded.PaddedCosts`, made by :func:`optim.padded.split_costs`) with the padded
objective, similar lengths on one rank (:func:`optim.padded.partition_padded`), in plan mode
and one global batch at a time (shuffle mode all-gathers per-sample costs, a window deals
them: both refuse a padded model).

With unequal counts (``BalanceConfig.counts``: ``lpt`` always, ``kk`` with
``counts="unequal"``) each rank scales its mean loss by :func:`loss_scale`, so that the
all-reduced (averaged) gradient is the gradient of the global mean loss. Unequal counts also
plan a global batch that is not a multiple of the world size (so does the toggle off: the random
split's chunks then differ by one sample); equal counts raise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from optim.balance import METHODS, Method, imbalance, partition
from optim.errors import FieldError
from optim.padded import PaddedCosts, partition_padded
from optim.window import deal_window

__all__ = [
    "COUNTS",
    "MODES",
    "BalanceConfig",
    "StepPlan",
    "batch_digest",
    "loss_scale",
    "plan_digest",
    "plan_window",
]

Mode = Literal["plan", "shuffle"]
"""Where the lengths are known: up front (``plan``) or after loading (``shuffle``)."""
Counts = Literal["equal", "unequal"]
"""Samples per rank: the same on every rank, or any (each rank's loss rescaled)."""
MODES: tuple[Mode, ...] = get_args(Mode)
COUNTS: tuple[Counts, ...] = get_args(Counts)
_COUNTS_OF: dict[Method, tuple[Counts, ...]] = {
    "kk": COUNTS,
    "lpt": ("unequal",),
    "random": ("equal",),
}
"""The counts each method plans with; the first is its default."""


@dataclass(kw_only=True, frozen=True)
class BalanceConfig:
    """The ``balance`` toggle (off by default: the random split, an exact no-op).

    The first paragraph of each field's docstring is its flag's help (``fsobs run``,
    ``fsobs simulate``: :mod:`fsobs.cli.flags`)."""

    enabled: bool = False
    """Balance each global batch's cost across ranks."""
    method: Method = "kk"
    """Partitioner: kk (Karmarkar-Karp), lpt (greedy, unequal counts) or random."""
    counts: Counts | None = None
    """Samples per rank: equal, or unequal with each rank's loss rescaled (default: the
    method's own, equal for kk, unequal for lpt and for a window).

    ``kk`` takes either, ``lpt`` only ``unequal`` (:func:`loss_scale`), ``random`` only
    ``equal``. Set to the resolved value when the config is made."""
    mode: Mode = "plan"
    """plan: every rank plans from the lengths; shuffle: all-gather the costs and exchange
    samples."""
    check_every: int = 10
    """All-gather and compare the plan digest every this many steps (and at step 0); 0: never."""
    window: int = 1
    """Deal the samples of K consecutive global batches into K steps (unequal counts; 1: each
    global batch alone).

    :mod:`optim.window`: counts differ per rank and per step, so a window implies
    ``counts="unequal"`` (``kk``'s counts resolve to it; ``random`` refuses a window); the deal
    is the same for ``kk`` and ``lpt``, and the same in both modes: shuffle mode exchanges a
    window's rows once, :meth:`optim.shuffle.ShuffleBalancer.window`."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise FieldError("method", f"unknown {self.method!r}, expected one of {list(METHODS)}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise FieldError("window", f"must be an int >= 1, got {self.window!r}")
        allowed = _COUNTS_OF[self.method]
        if self.counts is None:
            implied = "unequal" if self.window > 1 and "unequal" in allowed else allowed[0]
            object.__setattr__(self, "counts", implied)
        elif self.counts not in allowed:
            raise FieldError(
                "counts",
                f"method {self.method!r} plans with {list(allowed)} counts, got {self.counts!r}",
            )
        if self.mode not in MODES:
            raise FieldError("mode", f"unknown {self.mode!r}, expected one of {list(MODES)}")
        if self.check_every < 0:
            raise FieldError("check_every", f"must be >= 0, got {self.check_every}")
        if self.window > 1 and self.counts != "unequal":
            raise FieldError(
                "window",
                f"{self.window} needs counts 'unequal' (counts differ per step), got "
                f"counts {self.counts!r}",
            )

    @property
    def equal_size(self) -> bool:
        """Whether every rank gets the same number of samples (:attr:`counts`)."""
        return self.counts == "equal"

    def checks_at(self, step: int) -> bool:
        """Whether the plan digest is compared across ranks at ``step``."""
        return self.check_every > 0 and step % self.check_every == 0


@dataclass(frozen=True)
class StepPlan:
    """Which positions of one global batch each rank trains on."""

    parts: list[np.ndarray]
    """Per rank, ascending int64 positions into the global batch (into the window, for
    :func:`plan_window`); together each position once (a window's: over its steps)."""
    imbalance_before: float
    """Max / mean estimated rank cost of the random split."""
    imbalance_after: float
    """The same for ``parts`` (equal to ``imbalance_before`` when balancing is off)."""
    digest: str
    """:func:`plan_digest` of ``parts``."""

    @classmethod
    def make(
        cls, costs: np.ndarray | PaddedCosts, world_size: int, config: BalanceConfig
    ) -> StepPlan:
        """Plan one global batch whose samples cost ``costs`` (global-batch order): per-sample
        costs (an additive cost model), or the lengths under a padded one
        (:func:`optim.padded.split_costs`), which ``kk`` and ``lpt`` split with the padded
        objective (:func:`optim.padded.partition_padded`, the config's counts) and whose
        imbalance is of the ranks' batch costs."""
        # The random split; when world_size does not divide the batch, chunks differ by one.
        sizes = np.zeros(costs.size) if isinstance(costs, PaddedCosts) else costs
        before = partition(sizes, world_size, method="random", equal_size=False)
        if not config.enabled:
            after = before
        elif isinstance(costs, PaddedCosts) and config.method != "random":
            after = partition_padded(
                costs.lengths, world_size, costs.model, equal_size=config.equal_size
            )
        else:
            after = partition(sizes, world_size, method=config.method, equal_size=config.equal_size)
        # Any fixed order of the parts is a valid assignment: rank r takes part r.
        parts = [np.asarray(p, dtype=np.int64) for p in after]
        return cls(
            parts=parts,
            imbalance_before=_imbalance(costs, before),
            imbalance_after=_imbalance(costs, after),
            digest=plan_digest(parts),
        )


def _imbalance(costs: np.ndarray | PaddedCosts, parts: list[list[int]]) -> float:
    """Max / mean estimated rank cost of ``parts`` (per-sample sums, or batch costs)."""
    if not isinstance(costs, PaddedCosts):
        return imbalance(costs, parts)
    loads = costs.loads(parts)
    mean = float(loads.mean())
    return float(loads.max()) / mean if mean > 0 else 1.0


def plan_window(costs: Sequence[np.ndarray | PaddedCosts], world_size: int) -> list[StepPlan]:
    """Plan a window (:mod:`optim.window`): ``costs`` of its global batches, one array each in
    global-batch order; one plan per step of the window, whose ``parts`` are positions into the
    window (the batches concatenated in order). ``imbalance_before`` is the random split of the
    step's own global batch. The deal moves per-sample costs between steps: a padded cost
    model's batches (:class:`optim.padded.PaddedCosts`) are a ValueError naming ``window``."""
    batches = [c for c in costs if not isinstance(c, PaddedCosts)]
    if len(batches) != len(costs):
        raise FieldError(
            "window",
            "a balance window deals per-sample costs; a padded cost model plans one "
            "global batch at a time (window=1)",
        )
    steps = deal_window(batches, world_size)
    pooled = np.concatenate([np.asarray(c, dtype=np.float64) for c in batches])
    plans = []
    for batch, parts in zip(batches, steps, strict=True):
        before = partition(batch, world_size, method="random", equal_size=False)
        plans.append(
            StepPlan(
                parts=parts,
                imbalance_before=imbalance(batch, before),
                imbalance_after=imbalance(pooled, [p.tolist() for p in parts]),
                digest=plan_digest(parts),
            )
        )
    return plans


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

    Equal counts (the toggle off, ``counts="equal"``) get exactly 1.0 without arithmetic, so the
    baseline never depends on the formula that only unequal counts need.
    """
    if num_global <= 0 or world_size <= 0 or num_local < 0:
        raise ValueError(
            f"loss_scale: need num_global, world_size > 0 and num_local >= 0, "
            f"got {num_local}, {num_global}, {world_size}"
        )
    if num_local * world_size == num_global:
        return 1.0
    return world_size * num_local / num_global
