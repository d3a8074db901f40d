"""The training batch: torchrec ``KeyedJaggedTensor``s that ``TrainPipelineSparseDist`` can move."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchrec import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

from fsobs.workload.data import Sample

POOLED_KEYS = ("user_id", "ctx")
"""Features of ``Batch.sparse_pooled`` (looked up by the EmbeddingBagCollection)."""
SEQ_KEYS = ("item_seq", "cat_seq", "target_item")
"""Features of ``Batch.sparse_seq`` (looked up by the EmbeddingCollection). ``target_item`` has
one id per sample and shares the item table with ``item_seq``."""


@dataclass
class Batch(Pipelineable):  # type: ignore[misc]  # torchrec: untyped
    """One rank's batch of ``B`` samples.

    ``sparse_pooled``: KJT with keys ``POOLED_KEYS`` (1 user id, 1-3 context ids per sample).
    ``sparse_seq``: KJT with keys ``SEQ_KEYS``; ``item_seq`` and ``cat_seq`` are jagged by the
    per-sample history lengths, ``target_item`` has length 1.
    ``labels``: float32 [B]; ``sample_ids``: int64 [B] (dataset indices); ``lengths``: int64 [B].
    ``loss_scale``: factor on the batch's mean loss (``optim.plan.loss_scale``; 1.0 with equal
    sample counts per rank, where the multiplication is exact).
    """

    sparse_pooled: KeyedJaggedTensor
    sparse_seq: KeyedJaggedTensor
    labels: torch.Tensor
    sample_ids: torch.Tensor
    lengths: torch.Tensor
    loss_scale: float = 1.0

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(
            sparse_pooled=self.sparse_pooled.to(device, non_blocking=non_blocking),
            sparse_seq=self.sparse_seq.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            sample_ids=self.sample_ids.to(device, non_blocking=non_blocking),
            lengths=self.lengths.to(device, non_blocking=non_blocking),
            loss_scale=self.loss_scale,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.sparse_pooled.record_stream(stream)
        self.sparse_seq.record_stream(stream)
        for tensor in (self.labels, self.sample_ids, self.lengths):
            tensor.record_stream(stream)

    def pin_memory(self) -> Batch:
        return Batch(
            sparse_pooled=self.sparse_pooled.pin_memory(),
            sparse_seq=self.sparse_seq.pin_memory(),
            labels=self.labels.pin_memory(),
            sample_ids=self.sample_ids.pin_memory(),
            lengths=self.lengths.pin_memory(),
            loss_scale=self.loss_scale,
        )

    @property
    def batch_size(self) -> int:
        return int(self.labels.numel())


def _kjt(keys: Sequence[str], columns: Sequence[Sequence[np.ndarray]]) -> KeyedJaggedTensor:
    """KJT from one list of per-sample id arrays per key (values key-major, then sample-major)."""
    lengths = [len(ids) for column in columns for ids in column]
    values = np.concatenate([ids for column in columns for ids in column])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys),
        values=torch.from_numpy(values.astype(np.int64)),
        lengths=torch.tensor(lengths, dtype=torch.int32),
    )


def collate(samples: Sequence[Sample], loss_scale: float = 1.0) -> Batch:
    """Stack samples into a ``Batch`` (in the given order)."""
    if not samples:
        raise ValueError("samples: a batch needs at least one sample")
    users = [np.array([s.user_id]) for s in samples]
    targets = [np.array([s.target_item]) for s in samples]
    return Batch(
        sparse_pooled=_kjt(POOLED_KEYS, [users, [s.ctx_ids for s in samples]]),
        sparse_seq=_kjt(
            SEQ_KEYS, [[s.item_seq for s in samples], [s.cat_seq for s in samples], targets]
        ),
        labels=torch.tensor([s.label for s in samples], dtype=torch.float32),
        sample_ids=torch.tensor([s.index for s in samples], dtype=torch.int64),
        lengths=torch.tensor([s.length for s in samples], dtype=torch.int64),
        loss_scale=float(loss_scale),
    )
