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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.pec_embedding_modules import PECEmbeddingCollection

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
    tables = tuple(c.name for _, m in chosen for c in m.embedding_configs())
    return PECSetup(tuple(path for path, _ in chosen), tables, skipped)


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


class _LeafTracer(fx.Tracer):
    """Traces a model as torchrec's pipeline does (``train_pipeline/tracing.py``: ``Tracer``,
    ``_get_leaf_module_names``): the embedding modules, and every module without one inside,
    are leaves."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _EMBEDDING) or not any(isinstance(s, _EMBEDDING) for s in m.modules())


def _untraceable(model: nn.Module, paths: list[str]) -> str | None:
    """Why the pipeline could not rewrite ``model`` around the PEC modules at ``paths``."""
    if not paths:
        return None
    try:
        graph = _LeafTracer().trace(model)
    except Exception as exc:  # any tracing failure: the model is not fx-traceable
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"torch.fx cannot trace the model ({first})"
    calls = [n.target for n in graph.nodes if n.op == "call_module"]
    twice = [p for p in paths if calls.count(p) > 1]
    if twice:
        return f"the model calls {', '.join(twice)} more than once (PEC needs one call)"
    return None


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not name:
        raise ValueError("the model itself is an embedding module: wrap it in a model first")
    setattr(parent, name, module)
