"""The ``balance`` toggle as a batch sampler: plan mode inside a ``torch.utils.data.DataLoader``
(numpy at import; torch only to shuffle, as ``DistributedSampler`` does).

::

    sampler = BalancedBatchSampler(dataset, lengths, batch_size=32, world_size=W, rank=r,
                                   config=BalanceConfig(enabled=True), costs=CostModel(...))
    # or fs.sampler(dataset, lengths, batch_size=32): FreeScale's config and cost model
    loader = DataLoader(ShareDataset(dataset), batch_sampler=sampler,
                        collate_fn=ShareCollate(collate), num_workers=4)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:        # collate(samples, share) puts the BatchShare in the batch
            loss = per_sample_loss(batch).sum() * batch.share.loss_weight("mean")

Each epoch, like ``DistributedSampler(dataset, shuffle, seed)``: the dataset's indices in the
order of ``torch.randperm(len(dataset))`` seeded with ``seed + epoch`` (``range`` without
shuffling), the same on every rank and in every process. The order is cut into global batches
of ``batch_size · world_size`` samples: the same sets of samples as ``DistributedSampler``
with a ``DataLoader(batch_size=batch_size)`` on every rank, which interleaves each global batch
over the ranks. Each global batch is planned with :meth:`optim.plan.StepPlan.make` on the
costs of its samples, exactly as ``FreeScale.split`` plans it, and rank ``r`` yields the
dataset indices of part ``r`` (in global-batch order). With the toggle off that is the
contiguous random split: rank ``r`` the ``r``-th chunk of the shuffled global batch, so A/B runs
see the same global batches.

The ``DataLoader`` asks the sampler for indices on the training thread (also with workers: they
only load). With the toggle on, the plans are no longer made there: a planner thread
(:mod:`optim.ahead`, no torch) plans each global batch (window) while the loader serves the
one before, with the same function on the same inputs, so the shares are the same.

With a window (``BalanceConfig(window=K)``, :mod:`optim.window`) the epoch's global batches
are taken ``K`` at a time (the last window may hold fewer) and their samples dealt into the
window's steps: a step's samples come from the window's batches, the number of samples and
tokens per step varies, and each share's :class:`BatchShare` carries its step's own counts,
so that ``loss_weight`` makes each step's gradient the mean over its own samples. Every sample
is still served exactly once per epoch, at most ``K - 1`` steps from its global batch.

It is a *batch* sampler (``DataLoader(batch_sampler=...)``): with unequal counts
(``BalanceConfig.counts``: ``lpt``, or ``kk`` with ``counts="unequal"``) the shares of a step
differ in size, so no per-sample sampler with a fixed ``batch_size`` can yield them. Every rank
yields one batch per global batch, so the ranks never disagree on the number of steps.

The end of an epoch: with ``drop_last=True`` the last ``len(dataset) % (batch_size·world_size)``
samples of the epoch's order are not served: the samples that ``DistributedSampler`` and
``DataLoader``, both with ``drop_last=True``, leave out. Without it, where ``DistributedSampler``
pads its last batches by repeating samples from the start of the order, these samples form a
smaller last global batch, planned and split like the others: every sample exactly once per
epoch, none twice. Equal counts (``counts="equal"``: ``kk``'s default, ``random``) cannot
split that batch when ``world_size`` does not divide it; it is then split like the toggle off
(contiguous chunks whose sizes differ by at most one, unbalanced). When it has fewer samples
than ranks, some ranks get an empty share for that step (their loss is 0 with
:func:`optim.weights.loss_weight`; take ``drop_last=True`` for a model that cannot run an
empty batch).

The share travels *with* its batch, not by step number: torchrec's pipelines fetch batches
ahead of the step they train. The sampler yields each batch's indices as a :class:`ShareList`
(a list that carries its :class:`BatchShare` and pickles with it to the loader's workers);
:class:`ShareDataset` (``DataLoader`` calls its ``__getitems__`` with the whole list) hands the
samples on in a ``ShareList`` too, and :class:`ShareCollate` calls ``collate(samples, share)``,
which builds the batch with the share as a field.

Shuffle mode (``FreeScale.exchange``) stays for loaders that learn the lengths only after
loading: there each rank loads its random-split share and hands it over as *rows*, each row one
whole sample packed as a 1-D int64 numpy array of any length (ids, lengths, the label; floats
by bit view, ``x.view(np.int64)``), with its length for the cost model; the rows are exchanged
with an all-to-all and each rank receives its part in ascending position order.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from numbers import Integral
from typing import Generic, Protocol, TypeAlias, TypeVar

import numpy as np

from optim.ahead import PlanAhead
from optim.balance import CostModel
from optim.padded import PaddedCosts, split_costs
from optim.plan import BalanceConfig, StepPlan, plan_window
from optim.weights import loss_weight

__all__ = ["BalancedBatchSampler", "BatchShare", "ShareCollate", "ShareDataset", "ShareList"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
B = TypeVar("B")

KEPT_SHARES = 4096
"""Shares :meth:`BalancedBatchSampler.share` finds: the most recent ones yielded."""

Lengths: TypeAlias = Sequence[int] | np.ndarray | Callable[[int], int]
"""Per-sample lengths: one per dataset index, or a function from an index to its length."""


@dataclass(kw_only=True, frozen=True)
class BatchShare:
    """Which global batch a rank's batch is a share of, and what it weighs."""

    epoch: int
    step: int
    """The global batch's number within the epoch."""
    rank: int
    world_size: int
    num_samples: int
    """Samples the step trains on over all ranks: the global batch's, or with a window
    (``BalanceConfig.window``) the step's own."""
    num_tokens: int
    """Tokens the step trains on over all ranks: the sum of those samples' lengths."""
    num_loss_terms: int
    """Loss terms the step averages over, over all ranks: the sum of those samples'
    ``loss_counts`` (masked positions, candidates, ...) when the sampler has them, else
    ``num_tokens``."""
    digest: str
    """The step plan's :func:`optim.plan.plan_digest`, the same on every rank (to compare across
    ranks with ``optim.shuffle.check_plan``)."""

    def loss_weight(self, reduction: str) -> float:
        """The factor on this share's sum of losses (:func:`optim.weights.loss_weight`):
        ``token_mean`` averages over :attr:`num_loss_terms`, ``mean`` over the samples."""
        return loss_weight(
            reduction,
            world_size=self.world_size,
            num_samples=self.num_samples,
            num_tokens=self.num_loss_terms,
        )

    # torchrec's ``Pipelineable`` (``to``, ``record_stream``, ``pin_memory``): the share holds
    # no tensor, so it rides unchanged in a batch that moves, pins or records every attribute.

    def to(self, device: object, non_blocking: bool = False) -> BatchShare:
        """Itself (nothing to move)."""
        return self

    def record_stream(self, stream: object) -> None:
        """Nothing to record."""

    def pin_memory(self) -> BatchShare:
        """Itself (nothing to pin)."""
        return self


class ShareList(list[T]):
    """A list (of indices, or of samples) that carries the :class:`BatchShare` it belongs to;
    it pickles with it."""

    share: BatchShare

    def __init__(self, items: Iterable[T], share: BatchShare) -> None:
        super().__init__(items)
        self.share = share


def _share_of(items: object, name: str) -> BatchShare:
    if not isinstance(items, ShareList):
        raise ValueError(
            f"{name}: a {type(items).__name__} carries no BatchShare; load with "
            "DataLoader(ShareDataset(dataset), batch_sampler=BalancedBatchSampler(...), "
            "collate_fn=ShareCollate(collate))"
        )
    return items.share


class _MapDataset(Protocol[T_co]):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> T_co: ...


class ShareDataset(Generic[T]):
    """A map-style dataset whose batch of samples carries the share of its indices."""

    def __init__(self, dataset: _MapDataset[T]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> T:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> ShareList[T]:
        """The samples of ``indices`` (the dataset's own ``__getitems__`` when it has one), with
        the share of ``indices`` (a :class:`ShareList`; ValueError otherwise)."""
        share = _share_of(indices, "indices")
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            samples = list(getitems(list(indices)))
        else:
            samples = [self.dataset[i] for i in indices]
        return ShareList(samples, share)


class ShareCollate(Generic[T, B]):
    """A ``collate_fn`` that passes the batch's share on: ``collate(samples, share)``."""

    def __init__(self, collate: Callable[[list[T], BatchShare], B]) -> None:
        self.collate = collate

    def __call__(self, samples: list[T]) -> B:
        """``collate(samples, share)`` for the samples of a :class:`ShareDataset`."""
        return self.collate(samples, _share_of(samples, "samples"))


def _count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
        raise ValueError(f"{name}: must be an int >= {least}, got {value!r}")
    return int(value)


class BalancedBatchSampler:
    """This rank's balanced share of every global batch of an epoch (module docstring)."""

    def __init__(
        self,
        dataset: Sized,
        lengths: Lengths,
        *,
        batch_size: int,
        world_size: int,
        rank: int,
        config: BalanceConfig,
        costs: CostModel | Callable[[np.ndarray], np.ndarray],
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        loss_counts: Lengths | None = None,
    ) -> None:
        """``lengths``: per dataset index (or a function of it), what the cost model reads;
        ``costs``: per-sample costs of an int64 array of lengths (an
        :class:`optim.balance.CostModel`, ``FreeScale.costs``; a padded ``CostModel`` plans each
        global batch from its lengths instead); ``loss_counts``: per dataset index (or a
        function of it), the number of terms the sample adds to a mean loss (its masked
        positions, its candidates), for :attr:`BatchShare.num_loss_terms`; without it the
        lengths."""
        self.num_samples = len(dataset)
        self.batch_size = _count("batch_size", batch_size, 1)
        self.world_size = _count("world_size", world_size, 1)
        self.rank = _count("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank: must be < world_size {self.world_size}, got {rank}")
        self.seed = _count("seed", seed, 0)
        self.config, self.costs = config, costs
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.epoch = 0
        self._lengths = _PerSample("lengths", lengths, self.num_samples)
        self._loss_counts = (
            None if loss_counts is None else _PerSample("loss_counts", loss_counts, len(dataset))
        )
        self._shares: dict[tuple[int, int], BatchShare] = {}
        self._iterated: int | None = None
        """The epoch of the last iteration begun, until ``set_epoch`` is called."""
        self.served = 0
        """Batches yielded so far (every epoch)."""

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration yields (as ``DistributedSampler``)."""
        self.epoch = _count("epoch", epoch, 0)
        self._iterated = None

    def share(self, step: int, epoch: int | None = None) -> BatchShare:
        """The share of the ``step``-th batch of ``epoch`` (default: the current one) that this
        sampler has yielded, for a loop whose batches cannot carry it. By step, not "the last
        one": right under a pipeline or loader that fetches batches ahead. The last
        :data:`KEPT_SHARES` shares yielded are kept."""
        epoch = self.epoch if epoch is None else epoch
        found = self._shares.get((epoch, step))
        if found is None:
            served = sorted(s for e, s in self._shares if e == epoch)
            shown = f"steps {served[0]}..{served[-1]}" if served else "none"
            raise ValueError(
                f"step: the sampler has not yielded step {step} of epoch {epoch} (served: "
                f"{shown}); a batch's share exists once the loader has fetched it"
            )
        return found

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per epoch (on every rank)."""
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + int(rest > 0 and not self.drop_last)

    def global_batches(self) -> list[np.ndarray]:
        """The epoch's global batches: dataset indices (int64), in the epoch's order."""
        size = self.global_batch_size
        order = self._order()
        return [order[k * size : (k + 1) * size] for k in range(len(self))]

    def __iter__(self) -> Iterator[ShareList[int]]:
        """This rank's share of each global batch (of each window's steps). With the toggle
        on, the plans are made on a planner thread one global batch (one window) ahead of the
        loader (:mod:`optim.ahead`); ``lengths``, when a function, is called there."""
        if self._iterated == self.epoch and self.shuffle:
            warnings.warn(
                f"BalancedBatchSampler: epoch {self.epoch} is iterated again without "
                "set_epoch: the same order as before. With DataLoader(batch_sampler=...), "
                "call loader.batch_sampler.set_epoch(epoch) (loader.sampler is the "
                "DataLoader's own); FreeScale.loader's loader.sampler.set_epoch works too",
                stacklevel=2,
            )
        self._iterated = self.epoch
        batches = self.global_batches()
        size = self.config.window if self.config.enabled else 1
        groups = [batches[first : first + size] for first in range(0, len(batches), size)]
        if not self.config.enabled:
            for k, group in enumerate(groups):
                yield from self._group_shares(k, self._plan_group(group))
            return
        with PlanAhead(lambda _, group: self._plan_group(group), groups, stride=size) as plans:
            for k, planned in enumerate(plans):
                yield from self._group_shares(k * size, planned)

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).numpy()

    def _costs(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | PaddedCosts]:
        """The lengths and the estimated costs of a batch's samples (its lengths under a padded
        cost model: :func:`optim.padded.split_costs`)."""
        lengths = self._lengths.of(batch)
        costs = split_costs(self.costs, lengths)
        if isinstance(costs, np.ndarray) and costs.shape != lengths.shape:
            raise ValueError(f"costs: shape {costs.shape} for lengths of shape {lengths.shape}")
        return lengths, costs

    def _plan_group(self, batches: list[np.ndarray]) -> _Planned:
        """The dataset indices, lengths and loss counts of a global batch (of a window's,
        concatenated) and its plan (one per step of the window)."""
        found = [self._costs(batch) for batch in batches]
        lengths = np.concatenate([lens for lens, _ in found])
        indices = np.concatenate(batches)
        counts = lengths if self._loss_counts is None else self._loss_counts.of(indices)
        costs = [cost for _, cost in found]
        if self.config.enabled and self.config.window > 1:
            return indices, lengths, counts, plan_window(costs, self.world_size)
        config = self._config_for(batches[0].size)
        return indices, lengths, counts, [StepPlan.make(costs[0], self.world_size, config)]

    def _group_shares(self, first: int, planned: _Planned) -> Iterator[ShareList[int]]:
        """This rank's share of each step ``first, first + 1, ...`` of ``planned``, the plan of
        a global batch or a window (:meth:`_plan_group`)."""
        indices, lengths, counts, plans = planned
        for k, plan in enumerate(plans):
            share = BatchShare(
                epoch=self.epoch,
                step=first + k,
                rank=self.rank,
                world_size=self.world_size,
                num_samples=sum(int(p.size) for p in plan.parts),
                num_tokens=sum(int(lengths[p].sum()) for p in plan.parts),
                num_loss_terms=sum(int(counts[p].sum()) for p in plan.parts),
                digest=plan.digest,
            )
            self._shares[(share.epoch, share.step)] = share
            if len(self._shares) > KEPT_SHARES:
                del self._shares[next(iter(self._shares))]  # the oldest
            self.served += 1
            yield ShareList(indices[plan.parts[self.rank]].tolist(), share)

    def _config_for(self, num_samples: int) -> BalanceConfig:
        """The toggle's config, or the toggle off for a last batch that an equal-count method
        cannot split (module docstring)."""
        config = self.config
        if config.enabled and config.equal_size and num_samples % self.world_size:
            return dataclasses.replace(config, enabled=False)
        return config


_Planned: TypeAlias = tuple[np.ndarray, np.ndarray, np.ndarray, list[StepPlan]]
"""A global batch's (a window's) dataset indices, lengths, loss counts and plans (one per
step)."""


class _PerSample:
    """A number per dataset index: an array, or a function of the index (``name``: the field,
    for errors)."""

    def __init__(self, name: str, values: Lengths, num_samples: int) -> None:
        self.name = name
        self._function: Callable[[int], int] | None = None
        self._values = np.empty(0, dtype=np.int64)
        if callable(values):
            self._function = values
            return
        self._values = self._check(np.asarray(values))
        if self._values.size != num_samples:
            raise ValueError(
                f"{name}: {self._values.size} values for a dataset of {num_samples} samples"
            )

    def of(self, indices: np.ndarray) -> np.ndarray:
        """The values of ``indices`` (int64)."""
        if self._function is None:
            picked: np.ndarray = self._values[indices]
            return picked
        function = self._function
        found = np.fromiter((function(int(i)) for i in indices), np.int64, count=indices.size)
        return self._check(found)

    def _check(self, values: np.ndarray) -> np.ndarray:
        name = self.name
        if values.ndim != 1:
            raise ValueError(f"{name}: must be 1-D, got shape {values.shape}")
        if values.size and not np.issubdtype(values.dtype, np.integer):
            raise ValueError(f"{name}: must be integers, got dtype {values.dtype}")
        if values.size and values.min() < 0:
            raise ValueError(f"{name}: must be >= 0, got {int(values.min())}")
        return values.astype(np.int64, copy=False)
