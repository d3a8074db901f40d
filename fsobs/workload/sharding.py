"""Wrap ``SeqRecModel`` in torchrec ``DistributedModelParallel`` on CPU (gloo) or GPU.

Follows ``shared/examples/torchrec_cpu_dmp.py`` and the CPU rules in
``shared/notes/torch_torchrec_cpu.md`` §3: the planner with one sharding type per module
(an EmbeddingCollection must not be data_parallel; on CPU an EmbeddingBagCollection cannot be
row_wise), the fused compute kernel (the planner picks it), and the fused embedding optimizer
combined with a dense optimizer that leaves the fused parameters out (Adagrad by default; plain
SGD for tests, ``fsobs.workload.config.OPTIMIZERS``).

Defaults: the pooled tables (user, context: one to four ids per sample) are table_wise; the
sequence tables (item, category: every history event) are row_wise, so that every rank does the
same share of the per-event lookups and their backward. With the sequence tables table_wise, the
rank holding the item table did all item-embedding backward work (~10 ms per step, "small"
model, 2 ranks): a straggler that no balancing of samples can remove (found by ``fsobs
analyze`` on a balanced run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.types import ModuleSharder, ShardingEnv, ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from fsobs.workload.config import OPTIMIZERS
from fsobs.workload.model import EBC_TABLES, EC_TABLES, SeqRecModel

EMBEDDING_LR = 0.01


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer: unknown {optimizer!r}, expected one of {list(OPTIMIZERS)}")


def sharders(
    embedding_lr: float = EMBEDDING_LR, optimizer: str = "adagrad"
) -> list[ModuleSharder[torch.nn.Module]]:
    """EBC and EC sharders whose fused optimizer is exact row-wise Adagrad (or exact SGD)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    _check_optimizer(optimizer)
    kind = EmbOptimType.EXACT_SGD if optimizer == "sgd" else EmbOptimType.EXACT_ROWWISE_ADAGRAD
    fused = {"optimizer": kind, "learning_rate": embedding_lr}
    return [
        EmbeddingBagCollectionSharder(fused_params=fused),
        EmbeddingCollectionSharder(fused_params=fused),
    ]


def table_constraints(
    *, ebc_sharding: str = "table_wise", ec_sharding: str = "row_wise"
) -> dict[str, ParameterConstraints]:
    """The planner's constraints: the EBC tables ``ebc_sharding``, the EC tables
    ``ec_sharding``."""
    if ec_sharding == "data_parallel":
        raise ValueError("ec_sharding: an EmbeddingCollection must not be data_parallel")
    return {
        table: ParameterConstraints(sharding_types=[kind])
        for tables, kind in ((EBC_TABLES, ebc_sharding), (EC_TABLES, ec_sharding))
        for table in tables
    }


def plan_sharding(
    model: SeqRecModel,
    module_sharders: list[ModuleSharder[torch.nn.Module]],
    pg: dist.ProcessGroup,
    *,
    ebc_sharding: str = "table_wise",
    ec_sharding: str = "row_wise",
    compute_device: str = "cpu",
) -> ShardingPlan:
    """The planner's plan with the EBC tables constrained to ``ebc_sharding`` and the EC tables
    to ``ec_sharding``; rank 0 plans and broadcasts, so all ranks of ``pg`` get the same plan."""
    world_size = dist.get_world_size(pg)
    constraints = table_constraints(ebc_sharding=ebc_sharding, ec_sharding=ec_sharding)
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world_size, local_world_size=world_size),
        kernel_config=KernelConfig(compute_device=compute_device),
    )
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    return planner.collective_plan(model, module_sharders, pg)


def wrap_model(
    model: SeqRecModel,
    device: torch.device,
    *,
    dmp_kwargs: dict[str, Any] | None = None,
    ebc_sharding: str = "table_wise",
    ec_sharding: str = "row_wise",
    embedding_lr: float = EMBEDDING_LR,
    optimizer: str = "adagrad",
    add_sharders: Callable[
        [list[ModuleSharder[torch.nn.Module]]], list[ModuleSharder[torch.nn.Module]]
    ] = list,
) -> DistributedModelParallel:
    """DMP around a model built with ``device="meta"`` (see ``SeqRecModel``); ``dmp_kwargs``
    (``optim.FreeScale.dmp_kwargs()``: the embedding group's ``env``, the dense DDP wrapper)
    go to DMP as they are, and the plan is agreed on that ``env``'s group (else WORLD);
    ``optimizer`` (one of ``OPTIMIZERS``) picks the fused optimizer of the tables;
    ``add_sharders`` completes the sharders (``optim.FreeScale.sharders``: PEC's)."""
    dmp_kwargs = dict(dmp_kwargs or {})
    env = dmp_kwargs.pop("env", None) or ShardingEnv.from_process_group(dist.GroupMember.WORLD)
    module_sharders = add_sharders(sharders(embedding_lr, optimizer))
    plan = plan_sharding(
        model,
        module_sharders,
        env.process_group,
        ebc_sharding=ebc_sharding,
        ec_sharding=ec_sharding,
        compute_device=device.type,
    )
    return DistributedModelParallel(
        model, env=env, device=device, plan=plan, sharders=module_sharders, **dmp_kwargs
    )


def build_optimizer(
    dmp: DistributedModelParallel, dense_lr: float = 0.01, optimizer: str = "adagrad"
) -> CombinedOptimizer:
    """The fused (sparse) optimizer + Adagrad (or SGD: the ``optimizer`` given to
    :func:`wrap_model`) over the dense parameters.

    The fused keys are left out of the dense optimizer: CombinedOptimizer otherwise raises
    ``ValueError: Duplicate param key``.
    """
    _check_optimizer(optimizer)
    dense_cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad
    fused_keys = set(dmp.fused_optimizer.params.keys())
    dense = {k: v for k, v in dmp.named_parameters() if k not in fused_keys}
    dense_opt = KeyedOptimizerWrapper(dense, lambda ps: dense_cls(ps, lr=dense_lr))
    return CombinedOptimizer([dmp.fused_optimizer, dense_opt])
