"""FreeScale optimizer. Importing ``optim`` imports nothing more; each name loads on first use.

- ``optim.config``: :class:`FreeScaleConfig` with every toggle (:class:`BalanceConfig`,
  :class:`PriorityConfig`, :class:`SMFreeConfig`, :class:`SyncGCConfig`) and
  :class:`ToggleStatus`; ``optim.errors``: :class:`FieldError`, the error of a bad field that
  every config raises (its ``field`` names it).
- ``optim.freescale``: :class:`FreeScale`, the facade a torchrec training loop embeds (torch).
- ``optim.balance``: the per-sample cost model and the partitioners.
- ``optim.plan``: the ``balance`` toggle's per-step plan.
- ``optim.sampler``: the ``balance`` toggle as a ``DataLoader`` batch sampler whose batches
  carry their share (:class:`BalancedBatchSampler`, :class:`ShareDataset`,
  :class:`ShareCollate`, :class:`BatchShare`; torch only to shuffle); ``optim.loader``:
  :class:`ShareLoader`, the ``DataLoader`` made of them (torch).
- ``optim.status``: what each toggle did (``FreeScale.status()``: applied only once it acted).
- ``optim.padded``: the split of a padded cost model (a rank's batch padded to its longest
  sample).
- ``optim.adapter``: :class:`PipelineModel`, :class:`PipelineBatch`: torchrec's train-pipeline
  contract around a loop's own model, loss and batch (torch, torchrec).
- ``optim.weights``: :func:`loss_weight`, the factor on a rank's summed loss for each reduction
  (:data:`REDUCTIONS`) that makes the averaged gradient the global batch's.
- ``optim.pec_setup``, ``optim.pec``: the priority_overlap toggle, torchrec's PEC (which
  modules it takes; the pipeline, exact and runnable on CPU; torch, torchrec);
  ``optim.groups``, ``optim.comm``, ``optim.ddp``, ``optim.dmp``: its dense ordering (torch;
  torchrec in ``optim.dmp`` only).
- ``optim.sm_free``: the sm_free toggle (torch).
- ``optim.sync_gc``: the sync_gc toggle (no torch).
- ``optim.shuffle``: shuffle-mode exchange and the run-time plan check (torch).
- ``optim.markers``: the range names the analyzer reads.
"""

from typing import TYPE_CHECKING

from optim.lazy import lazy_attributes

if TYPE_CHECKING:
    from optim.adapter import PipelineBatch, PipelineModel
    from optim.balance import MAX_COST_MODEL_BYTES, METHODS, CostModel, imbalance, partition
    from optim.config import FreeScaleConfig, PriorityConfig, SMFreeConfig, ToggleStatus
    from optim.errors import FieldError
    from optim.freescale import FreeScale, StepShare
    from optim.loader import ShareLoader
    from optim.plan import MODES, BalanceConfig, StepPlan
    from optim.sampler import BalancedBatchSampler, BatchShare, ShareCollate, ShareDataset
    from optim.sync_gc import SyncGCConfig
    from optim.weights import REDUCTIONS, loss_weight

__all__ = [
    "MAX_COST_MODEL_BYTES",
    "METHODS",
    "MODES",
    "REDUCTIONS",
    "BalanceConfig",
    "BalancedBatchSampler",
    "BatchShare",
    "CostModel",
    "FieldError",
    "FreeScale",
    "FreeScaleConfig",
    "PipelineBatch",
    "PipelineModel",
    "PriorityConfig",
    "SMFreeConfig",
    "ShareCollate",
    "ShareDataset",
    "ShareLoader",
    "StepPlan",
    "StepShare",
    "SyncGCConfig",
    "ToggleStatus",
    "imbalance",
    "loss_weight",
    "partition",
]

# Every name is loaded when first asked for: ``import optim.markers`` (what the trace parser
# reads) then costs nothing more, and FreeScale, StepShare, ShareLoader and the adapter's names
# import torch (the adapter torchrec too) only when used.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "MAX_COST_MODEL_BYTES": ".balance",
        "METHODS": ".balance",
        "CostModel": ".balance",
        "imbalance": ".balance",
        "partition": ".balance",
        "FreeScaleConfig": ".config",
        "PriorityConfig": ".config",
        "SMFreeConfig": ".config",
        "ToggleStatus": ".config",
        "FieldError": ".errors",
        "MODES": ".plan",
        "BalanceConfig": ".plan",
        "StepPlan": ".plan",
        "BalancedBatchSampler": ".sampler",
        "BatchShare": ".sampler",
        "ShareCollate": ".sampler",
        "ShareDataset": ".sampler",
        "SyncGCConfig": ".sync_gc",
        "REDUCTIONS": ".weights",
        "loss_weight": ".weights",
        "FreeScale": ".freescale",
        "StepShare": ".freescale",
        "ShareLoader": ".loader",
        "PipelineBatch": ".adapter",
        "PipelineModel": ".adapter",
    },
)
