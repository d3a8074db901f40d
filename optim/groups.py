"""The process groups of FreeScale's toggles, created collectively (same order on every rank).

=============  ===================  ==========================================================
group          toggle               what runs on it
=============  ===================  ==========================================================
embedding      priority_overlap     torchrec's input dist, output dist and their backward
               (else WORLD)         (DMP's ``env``); on NCCL a high-priority stream
dense          priority_overlap     DDP's all-reduce of the dense gradients
               (else WORLD)
balance        balance              the balance toggle's cost all-gather, sample exchange and
                                    plan check (gloo: CPU tensors, also on NCCL jobs)
=============  ===================  ==========================================================

With ``priority_overlap`` off, embedding and dense are both WORLD: exactly torchrec's default.
NCCL stream priority is a per-group option (``ProcessGroupNCCL.Options``); the environment
variable ``TORCH_NCCL_HIGH_PRIORITY`` would apply to every group, so it cannot rank one above
another. gloo ignores group options; there every group has its own queue and two worker
threads, which is what lets the embedding all-to-all run beside the dense all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from optim.config import FreeScaleConfig, ToggleStatus
from optim.markers import BALANCE_DESC, DENSE_DESC, EMB_DESC


@dataclass(frozen=True)
class Groups:
    """The groups of one job (see the module docstring)."""

    embedding: dist.ProcessGroup
    dense: dist.ProcessGroup
    balance: dist.ProcessGroup | None
    backend: str
    high_priority: bool
    """Whether the embedding group got a high-priority NCCL stream."""

    def layout(self) -> dict[str, Any]:
        """What ``run.json`` records as ``process_groups``: role -> name, description, size."""
        groups = {"embedding": self.embedding, "dense": self.dense, "balance": self.balance}
        return {
            role: {
                "pg_name": pg.group_name,
                "pg_desc": pg.group_desc,
                "size": dist.get_world_size(pg),
                "backend": dist.get_backend(pg),
                "high_priority": self.high_priority and role == "embedding",
            }
            for role, pg in groups.items()
            if pg is not None
        }


def make_groups(
    config: FreeScaleConfig, nccl_options: Any | None = None
) -> tuple[Groups, ToggleStatus]:
    """Create the groups the toggles need and return them with the ``priority_overlap`` status.

    ``nccl_options`` (``optim.sm_free.nccl_options``: high priority and the sm_free CTA policy)
    are the embedding group's on NCCL; when given, the embedding group is a group of its own
    even with ``priority_overlap`` off (the copy-engine all-to-all needs its policy there)."""
    world = dist.group.WORLD
    assert world is not None, "init_process_group first"
    backend = str(dist.get_backend())
    priority = config.priority_overlap.enabled
    balance = (
        dist.new_group(backend="gloo", group_desc=BALANCE_DESC) if config.balance.enabled else None
    )
    embedding = dense = world
    if priority or nccl_options is not None:
        embedding = dist.new_group(backend=backend, pg_options=nccl_options, group_desc=EMB_DESC)
    if priority:
        dense = dist.new_group(backend=backend, group_desc=DENSE_DESC)
    high = priority and backend == "nccl"
    groups = Groups(embedding, dense, balance, backend, high)
    if not priority:
        return groups, ToggleStatus(False, False)
    if high:
        return groups, ToggleStatus(True, True)
    return groups, ToggleStatus(
        True,
        True,
        f"{backend}: embedding and dense collectives on groups of their own (separate queues "
        "and worker threads); stream priority exists on NCCL only",
    )
