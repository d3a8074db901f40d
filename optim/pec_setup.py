"""Which of a model's embedding modules the ``priority_overlap`` toggle turns into PEC ones.

PEC (:mod:`optim.pec`) takes an ``EmbeddingCollection`` whose tables are sharded row-wise,
in a model that ``torch.fx`` can trace with each PEC module called once. :func:`to_pec` wraps
every ``EmbeddingCollection`` of an unsharded model that qualifies in a
``PECEmbeddingCollection`` (in place, before ``DistributedModelParallel``) and says, module by
module, why the others were left as they are:

- an ``EmbeddingBagCollection`` (pooled lookups: PEC takes sequence lookups only);
- an ``EmbeddingCollection`` whose tables the planner's constraints put table-wise or
  column-wise (PEC shards row-wise only: such a plan fails when sharding);
- a model ``torch.fx`` cannot trace, or that calls a PEC module more than once (the pipeline
  rewrites the traced model: it would fail at its first batch).

So what PEC cannot take is known before training starts, and reported by
``FreeScale.status()``; nothing fails in the middle of training. A variable batch size per
feature (VBE) shows only in the data: the pipeline refuses such a batch in one line when it
fetches it, before PEC's work on it starts (:func:`optim.pec.variable_batch_fields`;
torchrec's PEC assumes one stride).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torchrec
from torch import nn
from torchrec.distributed.train_pipeline.tracing import Tracer
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.pec_embedding_modules import PECEmbeddingCollection

import optim

ROW_WISE = "row_wise"


@dataclass(frozen=True)
class PECSetup:
    """What :func:`to_pec` did to a model."""

    modules: tuple[str, ...] = ()
    """Paths of the modules now PEC (``PECEmbeddingCollection``)."""
    tables: tuple[str, ...] = ()
    """Their tables."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Path of each embedding module left as it was -> why."""
    tables_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Path of each module now PEC -> its tables."""

    @property
    def applied(self) -> bool:
        return bool(self.modules)

    def describe(self) -> str:
        """One line for ``status()``: what PEC took, and what it did not and why."""
        parts = []
        if self.tables:
            parts.append(
                "torchrec's PEC (TrainPipelinePEC, gradients exact) on tables "
                + ", ".join(self.tables)
            )
        parts += [f"not on {path}: {why}" for path, why in self.skipped.items()]
        return "; ".join(parts) or "no embedding module in the model"


def to_pec(model: nn.Module, constraints: Mapping[str, Any] | None = None) -> PECSetup:
    """Wrap every qualifying ``EmbeddingCollection`` of ``model`` in a
    ``PECEmbeddingCollection`` (module docstring); ``constraints``: the planner's
    ``ParameterConstraints`` by table name, as the loop passes them to the planner."""
    skipped: dict[str, str] = {}
    chosen: list[tuple[str, EmbeddingCollection]] = []
    for path, module in model.named_modules():
        if isinstance(module, PECEmbeddingCollection):
            raise ValueError(f"{path or 'the model'} is PEC already: give the plain model")
        if isinstance(module, EmbeddingBagCollection):
            skipped[path] = "an EmbeddingBagCollection (PEC takes EmbeddingCollections only)"
        elif isinstance(module, EmbeddingCollection):
            why = _not_row_wise(module, constraints or {})
            if why:
                skipped[path] = why
            else:
                chosen.append((path, module))
    for path, module in chosen:
        _replace(model, path, PECEmbeddingCollection(module))
    why = _untraceable(model, [path for path, _ in chosen])
    if why:
        for path, module in chosen:
            _replace(model, path, module)
            skipped[path] = why
        chosen = []
    tables_of = {path: tuple(c.name for c in m.embedding_configs()) for path, m in chosen}
    tables = tuple(t for names in tables_of.values() for t in names)
    return PECSetup(tuple(tables_of), tables, skipped, tables_of)


def _not_row_wise(module: EmbeddingCollection, constraints: Mapping[str, Any]) -> str | None:
    bad = {}
    for config in module.embedding_configs():
        kinds = getattr(constraints.get(config.name), "sharding_types", None)
        if kinds and ROW_WISE not in kinds:
            bad[config.name] = kinds
    if not bad:
        return None
    shown = ", ".join(f"{t} ({'/'.join(k)})" for t, k in bad.items())
    return f"tables constrained to other shardings than row-wise: {shown} (PEC is row-wise only)"


_EMBEDDING = (PECEmbeddingCollection, EmbeddingCollection, EmbeddingBagCollection)


class _LeafTracer(Tracer):  # type: ignore[misc]  # torchrec: untyped
    """torchrec's pipeline tracer (``train_pipeline/tracing.py``: ``Tracer``) with the leaves
    it would have once the model is sharded: the embedding modules stand for the sharded ones
    (:func:`leaf_module_names`)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(leaf_modules=leaf_module_names(model))

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _EMBEDDING) or bool(super().is_leaf_module(m, module_qualified_name))


def leaf_module_names(model: nn.Module) -> list[str]:
    """torchrec's ``_get_leaf_module_names`` on an unsharded model, an embedding module standing
    for a ``ShardedModule``: in every module with an embedding module below it, each child
    without one (and not marked ``_is_pytorch_fx_traceable``) is a leaf, by qualified name."""
    leaves: list[str] = []

    def visit(module: nn.Module, path: str) -> bool:
        embedded = {
            name
            for name, child in module.named_children()
            if isinstance(child, _EMBEDDING) or visit(child, f"{path}{name}.")
        }
        if embedded:
            leaves.extend(
                f"{path}{name}"
                for name, child in module.named_children()
                if name not in embedded and not getattr(child, "_is_pytorch_fx_traceable", False)
            )
        return bool(embedded)

    visit(model, "")
    return sorted(leaves)


def _untraceable(model: nn.Module, paths: list[str]) -> str | None:
    """Why the pipeline could not rewrite ``model`` around the PEC modules at ``paths``."""
    if not paths:
        return None
    try:
        graph = _LeafTracer(model).trace(model)
    except Exception as exc:  # any tracing failure: the model is not fx-traceable
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = _user_line(exc)
        return f"torch.fx cannot trace the model{f' at {where}' if where else ''} ({first})"
    calls = [n.target for n in graph.nodes if n.op == "call_module"]
    twice = [p for p in paths if calls.count(p) > 1]
    if twice:
        return f"the model calls {', '.join(twice)} more than once (PEC needs one call)"
    return None


_LIBRARIES = tuple(
    str(Path(str(m.__file__)).resolve().parent) + os.sep for m in (torch, torchrec, optim)
)


def _user_line(exc: BaseException) -> str | None:
    """``file.py:line`` of the innermost frame of ``exc``'s traceback in the user's code (not in
    torch, torchrec or optim), where tracing met what it cannot follow; None without one."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if not str(Path(frame.filename).resolve()).startswith(_LIBRARIES):
            found = f"{Path(frame.filename).name}:{frame.lineno}"
    return found


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not name:
        raise ValueError("the model itself is an embedding module: wrap it in a model first")
    setattr(parent, name, module)
