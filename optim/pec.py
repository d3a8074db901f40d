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
trained with ``TrainPipelineSparseDist`` (``tests/integration/optim/test_pec.py``).

A step's NOL gradient is applied during the next step; :meth:`ExactTrainPipelinePEC.drain`
applies it now (before a checkpoint, and when a run stops before its data ends). PEC's module
nests the plain one, so state dict keys differ (``ec._embedding_collection.embeddings.t.weight``
for ``ec.embeddings.t.weight``): :func:`pec_to_plain_keys` and :func:`plain_to_pec_keys` map a
model's or a fused optimizer's state dict across.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.pec_comm_ops import PECGradUpdateAwaitable
from torchrec.distributed.pec_embedding import (
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
    (to show its defects); the CPU changes apply on a CPU ``device`` only."""

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
    ) -> None:
        self._divide_gradients = divide_gradients
        self._reorder_gradients = reorder_gradients
        self._on_cpu = device.type == "cpu"
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

    steps_run = 0
    """Steps :meth:`progress` has trained (``FreeScale.status``: PEC acted once one has)."""

    @property
    def pec_module_paths(self) -> tuple[str, ...]:
        """The PEC modules torchrec pipelined (their paths in the model; known after the first
        batch): those PEC runs on."""
        return tuple(self._pec_modules)

    def drain(self) -> None:
        """Apply the last step's deferred NOL gradient now. Collective: every rank calls it.

        Call it before a checkpoint and when a run stops before its data ends: the tables then
        hold every finished step's whole update, as plain torchrec's do. Training goes on as
        before (the next step finds nothing deferred; the IDs of a deferred gradient are not in
        the next batch, so applying it earlier changes no number). A no-op before the first
        step and after the last (the last step applies its own)."""
        if not self.contexts:
            return
        with self._cpu_steps():
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
        """torchrec's step (CPU points 2 and 3), counted in :attr:`steps_run`."""
        with self._cpu_steps():
            out = super().progress(dataloader_iter)
        self.steps_run += 1
        return out

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

    # ---------------------------------------------------------------------- the gradient

    def _start_pec_ol_grad(
        self, context: PECTrainPipelineContext
    ) -> dict[str, list[Awaitable[None]]]:
        # TrainPipelinePEC._start_pec_ol_grad (pec_train_pipeline.py), through _grad_dist
        return {
            name: self._grad_dist(
                pec,
                self._pec_module_ctx(context, name),
                [bc.ol_features for bc in context.pec_backward_ctxs[name]],
                is_overlapped=True,
            )
            for name, pec in self._pec_modules.items()
        }

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
    to_rank_major = torch.ops.fbgemm.invert_permute(recat)
    positions = torch.arange(features.values().numel(), device=features.values().device)
    _, order, _ = torch.ops.fbgemm.permute_2D_sparse_data(
        to_rank_major,
        features.lengths().view(to_rank_major.shape[0], -1),
        positions,
        None,
        positions.numel(),
    )
    return cast(torch.Tensor, order)


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
