"""PEC's two mask all-to-alls of a step sent as one (:func:`start_overlap_dist`).

torchrec's ``ShardedPECEmbeddingCollection.overlap_dist`` (``distributed/pec_embedding.py``)
exchanges two int32 masks per sharding group and step: batch N+1's forward mask (which of
its IDs batch N had) and batch N's backward mask (which of its IDs batch N+1 has), one
``RWOverlapHandler.mask_dist`` all-to-all each. Both go the same way between the same ranks:
each shard owner sends, to every rank that sent it IDs, one value per ID, in the rank-major
order of the input dist. Here they travel as one all-to-all: per peer, the forward mask's
segment, then the backward mask's, with the split sizes summed; the received buffer is split
back the same way::

    send to peer:       r0             r1               (one all-to-all, splits f_r + b_r)
                  |fwd r0|bwd r0|fwd r1|bwd r1|
    received from r:  |fwd r|bwd r|  ->  fwd = fwd r0 fwd r1 ...,  bwd = bwd r0 bwd r1 ...

Everything else is torchrec's: the remap, the overlap check, the split of the KJTs, and on
wait ``OverlapDistAwaitable`` (the splits, with their ``.tolist()``, and the permutes). A
concatenation and a split move values unchanged, so every mask, split and permute is the one
torchrec computes, and training stays exact. The launch is still torchrec's
``TensorAllToAllValuesAwaitable`` (range ``## all2all_data:ids ##``, inside the pipeline's
``## pec_overlap_dist ##``) waited through torchrec's ``MaskDistAwaitable``: the analyzer's
``pec_mask`` role and the range names stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torchrec.distributed.dist_data import TensorAllToAllValuesAwaitable
from torchrec.distributed.pec_collision_handlers import (
    MaskDistAwaitable,
    OverlapHandler,
    split_kjt_by_values_mask,
)
from torchrec.distributed.pec_embedding import (
    OverlapDistAwaitable,
    PECEmbeddingCollectionContext,
    ShardedPECEmbeddingCollection,
)
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = ["FusedMasks", "MaskPartAwaitable", "start_overlap_dist", "to_rank_major"]

Masks = tuple[torch.Tensor, torch.Tensor]
"""(post-dist mask, pre-dist mask), as ``MaskDistAwaitable.wait`` returns them."""


@dataclass(frozen=True)
class _Side:
    """One batch's part in a group's overlap check: its features after input dist, their
    sharding context and their remapped values."""

    features: KeyedJaggedTensor
    sharding_ctx: SequenceShardingContext
    remapped: torch.Tensor


def start_overlap_dist(
    pec: ShardedPECEmbeddingCollection,
    ctx: PECEmbeddingCollectionContext | None,
    dist_input: list[KeyedJaggedTensor] | None,
    prev_ctx: PECEmbeddingCollectionContext | None,
    prev_dist_input: list[KeyedJaggedTensor] | None,
) -> list[OverlapDistAwaitable]:
    """``pec.overlap_dist(ctx, dist_input, prev_ctx, prev_dist_input)`` with one mask
    all-to-all per sharding group (module docstring); same arguments, same results: one
    ``OverlapDistAwaitable`` per group, ``ctx.remapped_kjt_values`` set."""
    if ctx is None and prev_ctx is None:
        raise ValueError("ctx, prev_ctx: at least one batch is needed")
    remapped: list[torch.Tensor] = []
    awaitables: list[OverlapDistAwaitable] = []
    for i, handler in enumerate(cast(list[OverlapHandler], pec._overlap_handlers)):
        current = previous = None
        if ctx is not None:
            assert dist_input is not None, "dist_input: needed with ctx"
            features = dist_input[i]
            current = _Side(features, ctx.sharding_contexts[i], handler.remap_kjt_values(features))
            remapped.append(current.remapped)
        if prev_ctx is not None:
            assert prev_dist_input is not None and prev_ctx.remapped_kjt_values is not None
            previous = _Side(
                prev_dist_input[i], prev_ctx.sharding_contexts[i], prev_ctx.remapped_kjt_values[i]
            )
        masks = handler.detect_overlap(
            current.remapped if current else None, previous.remapped if previous else None
        )
        halves = _exchange(
            handler,
            {
                "fwd": (current, masks.forward_overlap_mask),
                "bwd": (previous, masks.backward_overlap_mask),
            },
        )
        fwd, ol, nol = halves.get("fwd", (None, None, None))
        bwd, bwd_ol, bwd_nol = halves.get("bwd", (None, None, None))
        awaitables.append(
            OverlapDistAwaitable(
                handler=handler,
                ol_features=ol,
                nol_features=nol,
                forward_mask_dist=fwd,
                forward_sharding_ctx=current.sharding_ctx if current else None,
                backward_mask_dist=bwd,
                backward_sharding_ctx=previous.sharding_ctx if previous else None,
                bwd_ol_features=bwd_ol,
                bwd_nol_features=bwd_nol,
            )
        )
    if ctx is not None:
        ctx.remapped_kjt_values = remapped
    return awaitables


_Half = tuple["MaskPartAwaitable", KeyedJaggedTensor, KeyedJaggedTensor]


def _exchange(
    handler: OverlapHandler, halves: dict[str, tuple[_Side | None, torch.Tensor | None]]
) -> dict[str, _Half]:
    """torchrec's ``_mask_dist`` and ``_split_kjt`` (pec_embedding.py) for the halves (forward,
    backward) whose batch and mask are present, with one all-to-all for their masks: per half,
    its mask's awaitable and its (overlapped, non-overlapped) KJTs."""
    present = {k: (s, m) for k, (s, m) in halves.items() if s is not None and m is not None}
    fused = FusedMasks(
        handler._pg,  # RWOverlapHandler's group
        [
            (to_rank_major(s.features, s.sharding_ctx.sparse_features_recat, m), s.sharding_ctx)
            for s, m in present.values()
        ],
    )
    return {
        key: (part, *split_kjt_by_values_mask(side.features, mask))
        for (key, (side, mask)), part in zip(present.items(), fused.parts(), strict=True)
    }


def to_rank_major(
    features: KeyedJaggedTensor, recat: torch.Tensor | None, values: torch.Tensor
) -> torch.Tensor:
    """``values`` (one per ID of ``features``, feature-major: per feature, every source rank's
    IDs) in rank-major order (per source rank, every feature's IDs) by the input dist's
    ``recat`` (``SequenceShardingContext.sparse_features_recat``), as
    ``RWOverlapHandler.mask_dist`` (pec_collision_handlers.py) puts a mask before its
    all-to-all; a bool mask becomes int32 there, and here."""
    if recat is None:
        raise ValueError("recat: a row-wise sharding context has one")
    to_rank = torch.ops.fbgemm.invert_permute(recat)
    values = values.to(torch.int32) if values.dtype == torch.bool else values
    _, permuted, _ = torch.ops.fbgemm.permute_2D_sparse_data(
        to_rank, features.lengths().view(to_rank.shape[0], -1), values, None, values.numel()
    )
    return cast(torch.Tensor, permuted)


class FusedMasks:
    """One all-to-all of several rank-major masks, each with its sharding context's splits
    (module docstring), started on construction; :meth:`parts` gives one awaitable per mask."""

    def __init__(
        self,
        pg: torch.distributed.ProcessGroup,
        masks: list[tuple[torch.Tensor, SequenceShardingContext]],
    ) -> None:
        if not masks:
            raise ValueError("masks: at least one mask to send")
        # A mask goes back the way its IDs came: it sends what its batch's input dist
        # received (output_splits) and receives what that input dist sent (input_splits).
        sends = [torch.split(mask, ctx.output_splits) for mask, ctx in masks]
        self._receives = [list(ctx.input_splits) for _, ctx in masks]
        self._pre = [mask for mask, _ in masks]
        send = torch.cat([piece for peer in zip(*sends, strict=True) for piece in peer])
        send_splits = [sum(s) for s in zip(*(ctx.output_splits for _, ctx in masks), strict=True)]
        receive_splits = [sum(s) for s in zip(*self._receives, strict=True)]
        values = TensorAllToAllValuesAwaitable(
            pg,
            send,
            input_splits=torch.tensor(send_splits, dtype=torch.int32),
            output_splits=torch.tensor(receive_splits, dtype=torch.int32),
            device=send.device,
        )
        self._awaitable = MaskDistAwaitable(values, send)
        self._receive_splits = receive_splits
        self._posts: list[torch.Tensor] | None = None

    def parts(self) -> list[MaskPartAwaitable]:
        """One awaitable per mask, in the order given: its (post-dist, pre-dist) masks."""
        return [MaskPartAwaitable(self, k) for k in range(len(self._pre))]

    def wait_part(self, index: int) -> Masks:
        """Mask ``index``'s (post-dist bool, pre-dist int32) masks; the all-to-all is waited
        once, at the first call."""
        if self._posts is None:
            received, _ = self._awaitable.wait()
            per_peer = [
                chunk.split(sizes)
                for chunk, sizes in zip(
                    received.split(self._receive_splits),
                    zip(*self._receives, strict=True),
                    strict=True,
                )
            ]
            self._posts = [torch.cat([peer[k] for peer in per_peer]) for k in range(len(self._pre))]
        return self._posts[index], self._pre[index]


class MaskPartAwaitable(Awaitable[Masks]):  # type: ignore[misc]  # torchrec: untyped
    """One mask of a :class:`FusedMasks`, waited like torchrec's ``MaskDistAwaitable``."""

    def __init__(self, fused: FusedMasks, index: int) -> None:
        super().__init__()
        self._fused = fused
        self._index = index

    def _wait_impl(self) -> Masks:
        return self._fused.wait_part(self._index)
