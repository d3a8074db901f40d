"""torchrec's train-pipeline contract around a model and a loss that were not written for it.

``FreeScale.pipeline`` hands the loop torchrec's ``TrainPipelineSparseDist`` (with
``priority_overlap``: PEC's). Such a pipeline assumes three things of the loop:

1. the model takes the batch and returns ``(loss, output)``: the pipeline calls
   ``model(batch)``, runs the backward of ``loss`` and the optimizer's step itself, and
   ``progress()`` returns ``output``;
2. the batch is ``Pipelineable``: ``to(device, non_blocking)``, ``record_stream(stream)``,
   ``pin_memory()``;
3. the model is traceable by torchrec's pipeline tracer (``torch.fx`` with torchrec's leaves:
   every module beside an embedding module is a leaf, the rest is traced), and each embedding
   module's input is the batch or an attribute / item of it, as it is (the pipeline starts its
   input all-to-all a batch ahead, from the batch alone).

Most loops meet none of them: their model returns logits, the loss is computed in the loop
(often over some positions only), the batch is a dict or a tuple. :class:`PipelineModel` and
:class:`PipelineBatch` give the contract from what the loop has::

    model = PipelineModel(model, loss_fn, inputs=lambda b: (b["features"],))
    model = fs.prepare(model, constraints)               # before DMP, as always
    dmp = DistributedModelParallel(model, ...)
    pipeline = fs.pipeline(dmp, optimizer, device)
    batches = map(PipelineBatch, loader)                 # any batch: dict, tuple, object
    for step in range(steps):
        loss, logits = pipeline.progress(batches)        # backward and optimizer step done

``loss_fn(output, batch)`` runs as a leaf of the tracer (its Python is never traced: masks,
``ignore_index``, loops over candidates all work); ``inputs(batch)`` is traced, so it should
only pick the batch's fields. Point 3 is the model's own: where the tracer cannot follow it,
``FreeScale.status()`` names the file and line before training, and PEC leaves those tables as
they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torchrec.streamable import Pipelineable

__all__ = ["PipelineBatch", "PipelineModel"]


class _Loss(nn.Module):
    """The loop's loss function as a module of its own: a leaf of torchrec's tracer (it holds
    no embedding module), so the tracer does not enter it."""

    def __init__(self, loss_fn: Callable[[Any, Any], torch.Tensor]) -> None:
        super().__init__()
        self.loss_fn = loss_fn

    def forward(self, output: Any, batch: Any) -> torch.Tensor:
        return self.loss_fn(output, batch)


class PipelineModel(nn.Module):
    """``model`` and ``loss_fn`` as torchrec's pipelines call a model: ``forward(batch) ->
    (loss, (loss.detach(), output))`` with ``output = model(*inputs(batch))`` and ``loss =
    loss_fn(output, batch)``, so that ``loss, output = pipeline.progress(batches)`` (module
    docstring). ``inputs`` (default: the batch itself) returns the model's positional
    arguments, a tuple, or one argument. State dict keys gain the prefix ``model.``."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        inputs: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__()
        if not callable(loss_fn):
            raise ValueError(f"loss_fn: must be callable, got {type(loss_fn).__name__}")
        if inputs is not None and not callable(inputs):
            raise ValueError(f"inputs: must be callable, got {type(inputs).__name__}")
        self.model = model
        self.loss = _Loss(loss_fn)
        self._inputs = inputs

    def forward(self, batch: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        args = batch if self._inputs is None else self._inputs(batch)
        if not isinstance(args, tuple):
            args = (args,)
        output = self.model(*args)
        loss = self.loss(output, batch)
        return loss, (loss.detach(), output)


class PipelineBatch(Pipelineable):  # type: ignore[misc]  # torchrec: untyped
    """Any batch (a dict, a tuple, a dataclass, an object with attributes) as a
    ``Pipelineable``: ``to``, ``record_stream`` and ``pin_memory`` reach every tensor and
    ``KeyedJaggedTensor`` inside, through dicts, lists, tuples, dataclasses and objects'
    attributes; what is not a tensor is kept as it is. Items and attributes read through it
    (``batch["features"]``, ``batch.labels``), as the pipeline reads the embedding modules'
    inputs."""

    batch: Any
    """The loop's batch."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch.batch if isinstance(batch, PipelineBatch) else batch

    def __getitem__(self, key: Any) -> Any:
        return self.batch[key]

    def __getattr__(self, name: str) -> Any:
        if name == "batch":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.batch, name)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PipelineBatch:
        return PipelineBatch(_apply(self.batch, lambda t: t.to(device, non_blocking=non_blocking)))

    def pin_memory(self) -> PipelineBatch:
        return PipelineBatch(_apply(self.batch, lambda t: t.pin_memory()))

    def record_stream(self, stream: Any) -> None:
        def record(t: Any) -> Any:
            t.record_stream(stream)
            return t

        _apply(self.batch, record)


def _is_leaf(value: Any) -> bool:
    """A tensor, or a torchrec sparse type (``KeyedJaggedTensor``, ``JaggedTensor``, ...)."""
    return isinstance(value, torch.Tensor) or all(
        callable(getattr(value, m, None)) for m in ("to", "record_stream", "pin_memory")
    )


def _apply(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor-like inside (:func:`_is_leaf`)."""
    if _is_leaf(value):
        return fn(value)
    if isinstance(value, Mapping):
        return type(value)({k: _apply(v, fn) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_apply(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_apply(v, fn) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _apply(getattr(value, f.name), fn) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if hasattr(value, "__dict__") and not callable(value):  # an object of the loop's class
        copy = object.__new__(type(value))
        copy.__dict__.update({k: _apply(v, fn) for k, v in vars(value).items()})
        return copy
    return value
