"""FreeScale optimizer. Importing ``optim`` needs numpy only; the torch parts load on first use.

- ``optim.config``: :class:`FreeScaleConfig` with every toggle (:class:`BalanceConfig`,
  :class:`PriorityConfig`, :class:`SMFreeConfig`, :class:`SyncGCConfig`) and
  :class:`ToggleStatus`.
- ``optim.freescale``: :class:`FreeScale`, the facade a torchrec training loop embeds (torch).
- ``optim.balance``: the per-sample cost model and the partitioners.
- ``optim.plan``: the ``balance`` toggle's per-step plan.
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

from optim.balance import METHODS, CostModel, imbalance, partition
from optim.config import FreeScaleConfig, PriorityConfig, SMFreeConfig, ToggleStatus
from optim.lazy import lazy_attributes
from optim.plan import MODES, BalanceConfig, StepPlan
from optim.sync_gc import SyncGCConfig

if TYPE_CHECKING:
    from optim.freescale import FreeScale, StepShare

__all__ = [
    "METHODS",
    "MODES",
    "BalanceConfig",
    "CostModel",
    "FreeScale",
    "FreeScaleConfig",
    "PriorityConfig",
    "SMFreeConfig",
    "StepPlan",
    "StepShare",
    "SyncGCConfig",
    "ToggleStatus",
    "imbalance",
    "partition",
]

# ``FreeScale`` and ``StepShare`` import torch: loaded when first asked for.
__getattr__, __dir__ = lazy_attributes(
    __name__, {"FreeScale": ".freescale", "StepShare": ".freescale"}
)
