"""A ``DataLoader`` over the balanced batch sampler whose batches carry their share (torch).

::

    loader = fs.loader(dataset, lengths, batch_size=32, collate_fn=collate,   # collate(samples,
                       loss_counts=counts, num_workers=4)                     #         share)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)        # the DistributedSampler habit works here
        for batch in loader: ...

:class:`ShareLoader` is a ``torch.utils.data.DataLoader`` over ``ShareDataset(dataset)`` with
``batch_sampler=`` the :class:`optim.sampler.BalancedBatchSampler` and ``collate_fn=
ShareCollate(collate)``: the three pieces :mod:`optim.sampler` documents, in one object. A plain
``DataLoader(batch_sampler=...)`` makes a ``SequentialSampler`` of its own as ``.sampler``,
which has no ``set_epoch``; here ``.sampler`` is the batch sampler itself, so that
``loader.sampler.set_epoch(e)`` and ``loader.batch_sampler.set_epoch(e)`` are the same call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from optim.sampler import BalancedBatchSampler, BatchShare, ShareCollate, ShareDataset

__all__ = ["ShareLoader"]


class ShareLoader(DataLoader[Any]):
    """A ``DataLoader`` of ``dataset`` over ``batch_sampler``, whose ``collate(samples, share)``
    gets each batch's :class:`optim.sampler.BatchShare` (module docstring). ``loader_kwargs``:
    ``DataLoader``'s other options (``num_workers``, ``pin_memory``, ``prefetch_factor``, ...;
    not ``batch_size``, ``shuffle``, ``sampler`` or ``drop_last``, which the batch sampler
    decides)."""

    def __init__(
        self,
        dataset: Any,
        batch_sampler: BalancedBatchSampler,
        collate_fn: Callable[[list[Any], BatchShare], Any],
        **loader_kwargs: Any,
    ) -> None:
        taken = sorted({"batch_size", "shuffle", "sampler", "drop_last"} & set(loader_kwargs))
        if taken:
            raise ValueError(
                f"{taken[0]}: the balanced batch sampler decides it (FreeScale.loader's own "
                "batch_size, shuffle and drop_last)"
            )
        self._batch_sampler = batch_sampler
        super().__init__(
            ShareDataset(dataset),  # type: ignore[arg-type]  # map-style: len and getitem
            batch_sampler=batch_sampler,
            collate_fn=ShareCollate(collate_fn),
            **loader_kwargs,
        )

    @property
    def sampler(self) -> BalancedBatchSampler:
        """The balanced batch sampler (``set_epoch`` as ``DistributedSampler``'s)."""
        return self._batch_sampler

    @sampler.setter
    def sampler(self, value: object) -> None:
        """``DataLoader.__init__`` sets its own default sampler here: not used."""
