"""torchrec's DDP wrapper on FreeScale's dense group (torchrec needed here, not in optim.ddp).

DMP takes one ``env`` and wraps the dense modules in DDP on ``env.process_group``;
:class:`DenseDataParallel` is the ``data_parallel_wrapper`` that puts DDP on the dense group
instead, keeps torchrec's other DDP settings, and registers :func:`optim.ddp.dense_hook` as the
one comm hook (with torchrec's fp16 / bf16 compression inside it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper
from torchrec.distributed.types import ShardingEnv

from optim.ddp import DenseGate, DenseHookState, dense_hook


class DenseDataParallel(DefaultDataParallelWrapper):  # type: ignore[misc]  # torchrec: untyped
    """torchrec's DDP wrapper, on ``group``, with :func:`dense_hook` as its one comm hook."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        *,
        gate: DenseGate | None = None,
        allreduce_comm_precision: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(allreduce_comm_precision=None, **kwargs)
        self._state = DenseHookState(group, allreduce_comm_precision, gate)
        self._env = ShardingEnv.from_process_group(group)

    def wrap(self, dmp: Any, env: ShardingEnv, device: torch.device) -> None:
        del env  # the embedding group's; DDP goes on the dense group
        super().wrap(dmp, self._env, device)
        ddp = dmp._dmp_wrapped_module
        if isinstance(ddp, DistributedDataParallel):
            ddp.register_comm_hook(self._state, dense_hook)
