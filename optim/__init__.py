"""FreeScale optimizer (numpy only at import time; ``optim.shuffle`` needs torch).

- ``optim.balance``: the per-sample cost model and the partitioners.
- ``optim.plan``: the ``balance`` toggle's config (:class:`BalanceConfig`) and the per-step plan.
- ``optim.shuffle``: shuffle-mode exchange and the run-time plan check (torch.distributed).
"""

from optim.balance import METHODS, CostModel, imbalance, partition
from optim.plan import MODES, BalanceConfig, StepPlan

__all__ = ["METHODS", "MODES", "BalanceConfig", "CostModel", "StepPlan", "imbalance", "partition"]
