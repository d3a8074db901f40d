"""torchrec's Prioritized Embedding Communication (PEC), exact and runnable on CPU / gloo.

torchrec 1.9.2's ``TrainPipelinePEC`` (``distributed/train_pipeline/pec_train_pipeline.py``)
looks up the IDs a batch shares with the previous batch (overlapped, OL) with fresh weights and
the others (non-overlapped, NOL) one step ahead, and applies the NOL gradient one step late.
:class:`ExactTrainPipelinePEC` is that pipeline, same schedule and same communication, with the
changes below.

On a CPU device, the three points where ``TrainPipelinePEC`` assumes CUDA:

1. ``__init__`` builds two ``torch.cuda.Event()``; a CPU build of torch refuses ("Tried to
   instantiate dummy base class Event"). Here they are ``torch.cpu.Event()``: recording one is a
   no-op, and so is ``torch.cpu.Stream.wait_event`` (CPU work runs on one stream, in order).
2. It calls ``record_stream`` on KJTs, tensors, module contexts and the batch with
   ``torch.cpu.current_stream()``, which CPU tensors reject ("unknown parameter type"). While a
   step runs, :func:`cpu_record_stream` makes exactly that call (a CPU tensor, a
   ``torch.cpu.Stream``) a no-op: on the one CPU stream there is nothing to protect.
3. The forwards of the non-PEC sparse modules (an EmbeddingBagCollection beside the PEC tables)
   take their device from the data-dist stream and fall back to CUDA without one
   (``runtime_forwards.BaseForward.__init__``), so they call ``torch.cuda.current_stream()``.
   Here their device is the pipeline's.

On a CUDA device none of the three applies: torchrec's own code runs.

On a CPU device, PEC's mask exchange is made cheaper. torchrec's ``_pec_overlap_dist``, before
the forward of batch N, sends two int32 masks per PEC module (batch N+1's forward mask, batch
N's backward mask) in two all-to-alls, and waits them there: with no data-dist stream the
training thread blocks until both arrive, behind the lookup all-to-alls queued before them.
Here (:meth:`ExactTrainPipelinePEC._pec_overlap_dist`) they go as one all-to-all
(:func:`optim.pec_masks.start_overlap_dist`: one all-to-all fewer per PEC module and step),
and are waited after the forward, where their results are first used (N+1's lookup ahead, or
N's backward; range ``## pec_overlap_wait ##``): the exchange overlaps the forward. Batch N's
forward merges its embeddings before N's backward partition is known, which torchrec's merge
allows (``backward_ctxs=None``); the partition is put into the batch's autograd contexts when
it arrives, before the backward reads it. And the gradient of batch N's overlapped IDs,
whose all-to-all torchrec waits at the end of step N, is applied at the start of step N+1's
overlapped lookup, its first reader (:meth:`ExactTrainPipelinePEC._pec_ol_compute`): the
wait overlaps the loading of the next batch. Those rows are read by nothing in between
(N+1's other IDs were looked up a step ahead, and are not in batch N), and the updates reach
each row in the same order, so this too changes no number; the last step applies its own,
and :meth:`ExactTrainPipelinePEC.drain` applies a pending one. Same values, same collectives
in the same order (only waits move and two messages become one): training stays exact.

On every device, two defects of PEC's gradient, which make its embedding updates differ from
plain torchrec's (``distributed/pec_comm_ops.py``, ``PECGradientApply``):

- Division. Plain torchrec divides an embedding gradient by the group size when gradient
  division is on (``comm_ops.GRADIENT_DIVISION``, on by default, ``set_gradient_division``;
  ``All2All_Seq_Req.backward``). PEC's gradient all-to-all ignores it, so PEC's updates are
  ``world_size`` times plain torchrec's.
- Order, with two or more features in one sharding group (e.g. two tables of one dimension)
  and two or more ranks. The gradient arrives rank-major (each source rank's block: its
  features one after another), but ``PECGradientApply.apply`` pushes it through a re-lookup of
  the partition's KJT, which is feature-major; plain torchrec permutes the gradient first
  (``All2All_Seq_Req.backward``, ``backward_recat_tensor``). PEC thus applies gradients to
  other rows, of other features' tables.

:func:`arrival_order_lookup` fixes both where the gradient is applied: the re-lookup is put in
the order the gradient arrives in (the permutation torchrec's ``RWOverlapHandler.mask_dist``
applies to the masks), and its gradient is divided by the group size when gradient division is
on. Both are exact (a permutation and one division per element, as plain torchrec does them),
so predictions, losses and tables are bit-identical to a plain row-wise ``EmbeddingCollection``
trained with ``TrainPipelineSparseDist`` (``tests/optim/test_pec.py``).

A step's NOL gradient is applied during the next step; :meth:`ExactTrainPipelinePEC.drain`
applies it now (before a checkpoint, and when a run stops before its data ends). PEC's module
nests the plain one, so state dict keys differ (``ec._embedding_collection.embeddings.t.weight``
for ``ec.embeddings.t.weight``): :func:`pec_to_plain_keys` and :func:`plain_to_pec_keys` map a
model's or a fused optimizer's state dict across.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.pec_comm_ops import PECGradUpdateAwaitable
from torchrec.distributed.pec_embedding import (
    BackwardPartitionContext,
    OverlapDistAwaitable,
    PECEmbeddingCollectionContext,
    ShardedPECEmbeddingCollection,
)
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext
from torchrec.distributed.train_pipeline.pec_train_pipeline import TrainPipelinePEC
from torchrec.distributed.train_pipeline.pipeline_context import PECTrainPipelineContext
from torchrec.distributed.train_pipeline.runtime_forwards import PECPipelinedForward
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDist
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from optim.pec_masks import start_overlap_dist, to_rank_major

__all__ = [
    "PEC_INNER",
    "ExactTrainPipelinePEC",
    "arrival_order_lookup",
    "cpu_record_stream",
    "pec_to_plain_keys",
    "plain_to_pec_keys",
]

PEC_INNER = "_embedding_collection"
"""The attribute under which torchrec's PEC module holds the plain EmbeddingCollection."""

V = TypeVar("V")
Lookup = Callable[[KeyedJaggedTensor], torch.Tensor]


class ExactTrainPipelinePEC(TrainPipelinePEC):  # type: ignore[misc]  # torchrec: untyped
    """torchrec's ``TrainPipelinePEC`` with plain torchrec's gradients, runnable on CPU (module
    docstring); the arguments are ``TrainPipelinePEC``'s.

    ``divide_gradients=False`` and ``reorder_gradients=False`` keep torchrec's own gradient
    (to show its defects); ``torchrec_schedule=True`` keeps torchrec's own mask exchange and
    waits on CPU too (module docstring). The CPU changes apply on a CPU ``device`` only."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        execute_all_batches: bool = True,
        apply_jit: bool = False,
        custom_model_fwd: Callable[[Any], tuple[torch.Tensor, Any]] | None = None,
        *,
        divide_gradients: bool = True,
        reorder_gradients: bool = True,
        torchrec_schedule: bool = False,
    ) -> None:
        self._divide_gradients = divide_gradients
        self._reorder_gradients = reorder_gradients
        self._on_cpu = device.type == "cpu"
        self._cpu_schedule = self._on_cpu and not torchrec_schedule
        self._overlap_pending: list[_PendingOverlap] = []
        self._ol_grad_pending: dict[str, list[Awaitable[None]]] = {}
        if not self._on_cpu:
            super().__init__(
                model, optimizer, device, execute_all_batches, apply_jit, custom_model_fwd
            )
            return
        # CPU point 1: TrainPipelinePEC.__init__ (pec_train_pipeline.py), torch.cpu.Event for
        # its two torch.cuda.Event
        TrainPipelineSparseDist.__init__(
            self,
            model=model,
            optimizer=optimizer,
            device=device,
            execute_all_batches=execute_all_batches,
            apply_jit=apply_jit,
            context_type=PECTrainPipelineContext,
            custom_model_fwd=custom_model_fwd,
        )
        self._pec_modules: dict[str, ShardedPECEmbeddingCollection] = {}
        self._input_dist_event = torch.cpu.Event()
        self._overlap_dist_event = torch.cpu.Event()

    def drain(self) -> None:
        """Apply the last step's deferred gradients now (the NOL one, and on CPU the OL one:
        module docstring). Collective: every rank calls it.

        Call it before a checkpoint and when a run stops before its data ends: the tables then
        hold every finished step's whole update, as plain torchrec's do. Training goes on as
        before (the next step finds nothing deferred; the IDs of a deferred gradient are not in
        the next batch, so applying it earlier changes no number). A no-op before the first
        step and after the last (the last step applies its own)."""
        with self._cpu_steps():
            self._apply_ol_grad()
            if self.contexts:
                self._wait_pec_grad(self._start_deferred_nol_grad(self.contexts[0]))

    def enqueue_batch(self, dataloader_iter: Iterator[Any]) -> bool:
        """torchrec's, refusing a batch PEC cannot take before any of its work starts
        (:func:`variable_batch_fields`)."""
        if not super().enqueue_batch(dataloader_iter):
            return False
        vbe = variable_batch_fields(self.batches[-1])
        if vbe:
            raise ValueError(
                f"priority_overlap: torchrec's PEC takes no variable batch size per feature "
                f"(VBE), and this batch has one in {', '.join(vbe)}; train it without "
                "priority_overlap, or with one batch size for every feature"
            )
        return True

    # ------------------------------------------------------------------ CPU points 2 and 3

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        with self._cpu_steps():
            output = super().progress(dataloader_iter)
            self._finish_overlap_dist()  # the last batch out of training: nothing needed it
            return output

    def fill_pipeline(self, dataloader_iter: Iterator[Any]) -> None:
        with self._cpu_steps():
            super().fill_pipeline(dataloader_iter)

    @contextmanager
    def _cpu_steps(self) -> Iterator[None]:
        if not self._on_cpu:
            yield
            return
        with cpu_record_stream():
            yield

    def _pipeline_model(
        self, batch: Any, context: Any, pipelined_forward: Any = PECPipelinedForward
    ) -> None:
        super()._pipeline_model(batch, context, pipelined_forward)
        if self._on_cpu:
            for module in self._pipelined_modules:
                if not isinstance(module, ShardedPECEmbeddingCollection):
                    module.forward._device = self._device

    # ----------------------------------------------------------- the mask exchange (CPU)

    def _pec_overlap_dist(
        self,
        current_ctx: PECTrainPipelineContext | None,
        prev_ctx: PECTrainPipelineContext | None,
    ) -> None:
        # TrainPipelinePEC._pec_overlap_dist (pec_train_pipeline.py), on CPU with one mask
        # all-to-all per group, waited by _finish_overlap_dist (module docstring)
        if not self._cpu_schedule:
            super()._pec_overlap_dist(current_ctx, prev_ctx)
            return
        self._finish_overlap_dist()
        for name, pec in self._pec_modules.items():
            dist_input, module_ctx = None, None
            if current_ctx is not None:
                dist_input = current_ctx.input_dist_tensors_requests.pop(name).wait()
                current_ctx.pec_dist_inputs[name] = dist_input
                module_ctx = self._pec_module_ctx(current_ctx, name)
            prev_input, prev_module_ctx = None, None
            if prev_ctx is not None:
                prev_input = prev_ctx.pec_dist_inputs[name]
                prev_module_ctx = self._pec_module_ctx(prev_ctx, name)
                # the forward of prev_ctx's batch merges without them (torchrec's
                # merge_partitioned_embeddings takes None); _finish_overlap_dist adds them
                prev_ctx.pec_backward_ctxs[name] = None
            results = start_overlap_dist(pec, module_ctx, dist_input, prev_module_ctx, prev_input)
            self._overlap_pending.append(_PendingOverlap(name, results, current_ctx, prev_ctx))

    def _finish_overlap_dist(self) -> None:
        """Wait the mask exchange :meth:`_pec_overlap_dist` started and hand its results where
        torchrec's ``_pec_overlap_dist`` does; a batch whose forward has run gets its backward
        partition where ``merge_partitioned_embeddings`` puts it. A no-op when nothing waits."""
        if not self._overlap_pending:
            return
        with record_function("## pec_overlap_wait ##"):
            stream = torch.cpu.current_stream()
            for pending in self._overlap_pending:
                fwd_ctxs, bwd_ctxs = self._wait_pec_overlap_results(pending.results, stream)
                if pending.current is not None:
                    pending.current.pec_forward_ctxs[pending.name] = fwd_ctxs
                if pending.prev is not None:
                    pending.prev.pec_backward_ctxs[pending.name] = bwd_ctxs
                    module_ctx = self._pec_module_ctx(pending.prev, pending.name)
                    _attach_backward(module_ctx, bwd_ctxs)
        self._overlap_pending.clear()

    def _pec_nol_compute(self, context: PECTrainPipelineContext) -> None:
        self._finish_overlap_dist()  # the first use of a forward partition
        super()._pec_nol_compute(context)

    def _backward(self, losses: torch.Tensor) -> None:
        self._finish_overlap_dist()  # the first use of a backward partition (last batch)
        super()._backward(losses)

    # ---------------------------------------------------------------------- the gradient

    def _start_pec_ol_grad(
        self, context: PECTrainPipelineContext
    ) -> dict[str, list[Awaitable[None]]]:
        # TrainPipelinePEC._start_pec_ol_grad (pec_train_pipeline.py), through _grad_dist; on
        # CPU, but for the last batch, kept for _apply_ol_grad (the caller waits nothing)
        awaitables = {
            name: self._grad_dist(
                pec,
                self._pec_module_ctx(context, name),
                [bc.ol_features for bc in context.pec_backward_ctxs[name]],
                is_overlapped=True,
            )
            for name, pec in self._pec_modules.items()
        }
        if not self._cpu_schedule or len(self.contexts) < 2:
            return awaitables
        self._ol_grad_pending = awaitables
        return {}

    def _pec_ol_compute(self, context: PECTrainPipelineContext) -> None:
        self._apply_ol_grad()  # the previous batch's OL gradient, before its rows are read
        super()._pec_ol_compute(context)

    def _apply_ol_grad(self) -> None:
        """Wait and apply the OL gradient :meth:`_start_pec_ol_grad` kept; a no-op if none."""
        if not self._ol_grad_pending:
            return
        with record_function("## pec_ol_grad_apply ##"):
            self._wait_pec_grad(self._ol_grad_pending)
        self._ol_grad_pending = {}

    def _start_deferred_nol_grad(
        self, context: PECTrainPipelineContext
    ) -> dict[str, list[Awaitable[None]]]:
        # TrainPipelinePEC._start_deferred_nol_grad (pec_train_pipeline.py), through _grad_dist
        awaitables = {
            name: self._grad_dist(
                self._pec_modules[name], module_ctx, nol_features, is_overlapped=False
            )
            for name, (module_ctx, nol_features) in context.pec_deferred_nol_grad.items()
        }
        context.pec_deferred_nol_grad.clear()
        return awaitables

    def _grad_dist(
        self,
        pec: ShardedPECEmbeddingCollection,
        ctx: PECEmbeddingCollectionContext,
        features: list[KeyedJaggedTensor],
        *,
        is_overlapped: bool,
    ) -> list[Awaitable[None]]:
        """``ShardedPECEmbeddingCollection.grad_dist`` (pec_embedding.py): start one partition's
        gradient all-to-all per sharding group and return the awaitables that apply it, through
        :func:`arrival_order_lookup` in place of the group's plain lookup."""
        assert ctx.autograd_ctx_per_sharding is not None, "the batch's forward has not run"
        ec = pec._embedding_collection
        divide = self._divide_gradients and get_gradient_division()
        awaitables: list[Awaitable[None]] = []
        for info, feature, lookup, sharding_type, sharding_ctx in zip(
            ctx.autograd_ctx_per_sharding,
            features,
            ec._lookups,
            ec._sharding_type_to_sharding,
            ctx.sharding_contexts,
            strict=True,
        ):
            dim = ec._embedding_dim_for_sharding_type(sharding_type)
            applier = info.ol_grad_apply if is_overlapped else info.nol_grad_apply
            assert applier is not None, "the batch's backward has not run"
            applier.dist()
            lookup_fn = arrival_order_lookup(
                lookup,
                sharding_ctx if self._reorder_gradients else None,
                dim,
                divisor=dist.get_world_size(info.pg) if divide else 1,
            )
            awaitables.append(PECGradUpdateAwaitable(applier, feature, lookup_fn, dim))
        return awaitables


@dataclass(frozen=True)
class _PendingOverlap:
    """One PEC module's mask exchange in flight: its results, for ``current`` (forward
    partitions) and ``prev`` (backward partitions)."""

    name: str
    results: list[OverlapDistAwaitable]
    current: PECTrainPipelineContext | None
    prev: PECTrainPipelineContext | None


def _attach_backward(
    module_ctx: PECEmbeddingCollectionContext, backward_ctxs: list[BackwardPartitionContext]
) -> None:
    """Put the backward partitions into a batch's autograd contexts, as
    ``merge_partitioned_embeddings`` does when it has them (pec_embedding.py); nothing when
    the batch's forward has not run (its merge will)."""
    infos = module_ctx.autograd_ctx_per_sharding
    if infos is None:
        return
    for info, bwd in zip(infos, backward_ctxs, strict=True):
        info.backward_splits = bwd.splits
        info.backward_ol_permute = bwd.ol_permute
        info.backward_nol_permute = bwd.nol_permute


def variable_batch_fields(batch: Any) -> list[str]:
    """The fields of ``batch`` that are a ``KeyedJaggedTensor`` with a variable batch size per
    feature (VBE): PEC's overlap split assumes one stride (``lengths().view(-1, stride())``)."""
    fields = vars(batch) if hasattr(batch, "__dict__") else {}
    return [
        name
        for name, value in fields.items()
        if isinstance(value, KeyedJaggedTensor) and value.variable_stride_per_key()
    ]


def arrival_order_lookup(
    lookup: Lookup,
    sharding_ctx: SequenceShardingContext | None,
    dim: int,
    *,
    divisor: int = 1,
) -> Lookup:
    """The re-lookup ``PECGradientApply.apply`` pushes a received gradient through, in the order
    that gradient arrives in, with the gradient divided by ``divisor`` on its way back.

    The partition's KJT is feature-major (per feature, every source rank's values); the
    gradient all-to-all delivers rank-major blocks (per source rank, every feature's values).
    The rows of the lookup are permuted from the one order to the other, as torchrec's
    ``RWOverlapHandler.mask_dist`` permutes the masks, unless ``sharding_ctx`` is None (then
    they stay as torchrec has them). Both steps are exact: the permutation moves values, the
    division divides each element once, as plain torchrec's sequence all-to-all does."""

    def relookup(features: KeyedJaggedTensor) -> torch.Tensor:
        embeddings = lookup(features).view(-1, dim)
        if sharding_ctx is not None and sharding_ctx.sparse_features_recat is not None:
            order = _rank_major_order(features, sharding_ctx.sparse_features_recat)
            embeddings = embeddings.index_select(0, order)
        if divisor != 1:
            embeddings = _DivideGradient.apply(embeddings, divisor)  # type: ignore[no-untyped-call]
        return embeddings

    return relookup


def _rank_major_order(features: KeyedJaggedTensor, recat: torch.Tensor) -> torch.Tensor:
    """Positions into ``features.values()`` in rank-major order (as in
    ``RWOverlapHandler.mask_dist``, pec_collision_handlers.py)."""
    positions = torch.arange(features.values().numel(), device=features.values().device)
    return to_rank_major(features, recat, positions)


class _DivideGradient(torch.autograd.Function):
    """Identity forward; the backward divides the gradient by ``divisor``."""

    @staticmethod
    def forward(ctx: Any, embeddings: torch.Tensor, divisor: int) -> torch.Tensor:
        ctx.divisor = divisor
        return embeddings.view_as(embeddings)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad / ctx.divisor, None


@contextmanager
def cpu_record_stream() -> Iterator[None]:
    """While active, ``Tensor.record_stream(torch.cpu.Stream)`` on a CPU tensor is a no-op (it
    raises otherwise); every other call goes to torch's ``record_stream`` unchanged.

    It replaces ``torch.Tensor.record_stream`` for its duration (process-wide: every thread
    sees it) and puts torch's back on exit; nested uses are fine."""
    had_own = "record_stream" in torch.Tensor.__dict__
    previous = torch.Tensor.record_stream

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        if self.device.type == "cpu" and isinstance(stream, torch.cpu.Stream):
            return
        previous(self, stream)

    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        if had_own:
            torch.Tensor.record_stream = previous  # type: ignore[method-assign]
        else:
            del torch.Tensor.record_stream


# ------------------------------------------------------------------------ state dict keys


def pec_to_plain_keys(state_dict: Mapping[str, V]) -> dict[str, V]:
    """``ec._embedding_collection.embeddings.t.weight`` -> ``ec.embeddings.t.weight``, and
    likewise every key under a PEC module (fused optimizer states too); others unchanged."""
    return {_without_inner(key): value for key, value in state_dict.items()}


def plain_to_pec_keys(state_dict: Mapping[str, V], pec_modules: Iterable[str]) -> dict[str, V]:
    """``ec.embeddings.t.weight`` -> ``ec._embedding_collection.embeddings.t.weight`` for every key
    under one of the module paths ``pec_modules`` (e.g. ``["ec"]``); other keys unchanged."""
    prefixes = tuple(f"{fqn}." for fqn in pec_modules)
    out: dict[str, V] = {}
    for key, value in state_dict.items():
        prefix = next((p for p in prefixes if key.startswith(p)), None)
        out[key if prefix is None else f"{prefix}{PEC_INNER}.{key[len(prefix) :]}"] = value
    return out


def _without_inner(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != PEC_INNER)
