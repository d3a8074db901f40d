"""What each rank trains on at each step: the random split (baseline) or a balanced plan.

:class:`StepInputs` turns the run's global batches into this rank's batches, one per step, and
records a :class:`StepInput` for each (what the step sidecar logs). With ``balance`` off it is
exactly the baseline: ``random_split`` of each global batch, no communication, loss unscaled.
With it on (``optim.plan`` / ``optim.shuffle``):

- ``plan`` mode: every rank knows the lengths of all samples (``SyntheticHistories.lengths``),
  plans the whole global batch itself and materializes only its own part; the plan digest is
  all-gathered every ``check_every`` steps;
- ``shuffle`` mode: the rank materializes only its random-split share, as a loader that learns
  lengths only after loading would; the costs are all-gathered, planned and the samples
  exchanged (packed with ``pack_sample``).

Either way the rank's samples are in global-batch position order, so both modes train on the
same batches, and with ``lpt`` (unequal counts) each batch carries ``optim.plan.loss_scale``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch.distributed as dist
from torch.autograd.profiler import record_function

from fsobs.workload.batch import Batch, collate
from fsobs.workload.data import (
    Sample,
    SyntheticHistories,
    pack_sample,
    random_split,
    unpack_sample,
)
from optim.balance import CostModel
from optim.markers import BALANCE_MARKER, DATA_MARKER
from optim.plan import BalanceConfig, StepPlan, batch_digest, loss_scale
from optim.shuffle import ShuffleBalancer, check_plan


@dataclass(frozen=True)
class StepInput:
    """One step on one rank (the sidecar's balance fields are the same on every rank)."""

    step: int
    sample_ids: np.ndarray
    lengths: np.ndarray
    est_cost: float
    """The cost model's estimate of this rank's compute."""
    imbalance_before: float
    imbalance_after: float
    batch_digest: str
    loss_scale: float


class StepInputs:
    """This rank's ``(Batch, StepInput)`` per step; iterate once, in step order, on every rank
    at the same point (shuffle mode and the digest check communicate over ``group``)."""

    def __init__(
        self,
        data: SyntheticHistories,
        batches: Sequence[np.ndarray],
        cost_model: CostModel,
        balance: BalanceConfig,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.data, self.batches, self.cost_model = data, batches, cost_model
        self.balance = balance
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        shuffle = balance.enabled and balance.mode == "shuffle"
        self._shuffle = ShuffleBalancer(balance, group) if shuffle else None

    def __iter__(self) -> Iterator[tuple[Batch, StepInput]]:
        """Each step's input is prepared under ``## fsobs:data ##`` (a data-loader range for
        the CPU bubble classes), the balance work under ``## fsobs:balance ##`` inside it."""
        for step, global_batch in enumerate(self.batches):
            with record_function(DATA_MARKER):
                with record_function(BALANCE_MARKER):
                    if self._shuffle is not None:
                        samples, plan = self._exchange(self._shuffle, step, global_batch)
                    else:
                        samples, plan = self._planned(step, global_batch)
                item = self._emit(step, global_batch, samples, plan)
            yield item

    def _planned(self, step: int, global_batch: np.ndarray) -> tuple[list[Sample], StepPlan]:
        costs = self.cost_model(self.data.lengths[global_batch])
        plan = StepPlan.make(costs, self.world_size, self.balance)
        if self.balance.enabled and self.balance.checks_at(step):
            check_plan(plan.digest, step, self.group)
        mine = global_batch[plan.parts[self.rank]]
        return [self.data.sample(int(i)) for i in mine], plan

    def _exchange(
        self, balancer: ShuffleBalancer, step: int, global_batch: np.ndarray
    ) -> tuple[list[Sample], StepPlan]:
        share = [
            self.data.sample(int(i)) for i in random_split(global_batch, self.world_size, self.rank)
        ]
        costs = self.cost_model(np.array([s.length for s in share], dtype=np.int64))
        rows, plan = balancer(step, [pack_sample(s) for s in share], costs)
        return [unpack_sample(r) for r in rows], plan

    def _emit(
        self, step: int, global_batch: np.ndarray, samples: list[Sample], plan: StepPlan
    ) -> tuple[Batch, StepInput]:
        lengths = np.array([s.length for s in samples], dtype=np.int64)
        scale = loss_scale(len(samples), len(global_batch), self.world_size)
        info = StepInput(
            step=step,
            sample_ids=np.array([s.index for s in samples], dtype=np.int64),
            lengths=lengths,
            est_cost=float(self.cost_model(lengths).sum()),
            imbalance_before=plan.imbalance_before,
            imbalance_after=plan.imbalance_after,
            batch_digest=batch_digest(global_batch),
            loss_scale=scale,
        )
        return collate(samples, loss_scale=scale), info
