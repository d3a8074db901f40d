"""The dense side: FreeScale's one DDP comm hook, and the gate (torch only, no torchrec).

``optim.dmp.DenseDataParallel`` puts torchrec's DDP on the dense group and registers
:func:`dense_hook`. DDP allows one comm hook, and torchrec registers its fp16 / bf16
compression hook there, so the compression is taken in here and composed with what FreeScale
adds:

1. ``## fsobs:comm:dense:<pg_name> ##`` around the all-reduce's issue (:mod:`optim.markers`);
2. with ``dense_order="after_embedding"``, the :class:`DenseGate`.

Without compression the hook does what DDP does without one: the bucket times ``1 / world_size``
(the same float multiply DDP's reducer applies), then an all-reduce sum; the gradients are
bit-identical (``tests/optim/test_freescale.py``).

The gate holds each step's dense buckets back until the step's backward embedding all-to-all is
issued (:mod:`optim.comm` tells it), so on a shared link the all-to-all the next step waits for
is not queued behind the dense gradients::

    backward    |top MLP grads|---|HSTU grads|----|emb grad a2a issued|----|end|
    buckets        b1 parked         b2 parked       release: b1, b2 issued
    no a2a in the step (e.g. embeddings frozen)  ...........................flush at the end

The first parked bucket of a backward also queues a callback at the end of the backward
(``Variable._execution_engine.queue_callback``). DDP queues its own (which waits for every
bucket) only once the last bucket is ready, so the gate's runs first and releases whatever is
still parked: a step without embedding gradients never hangs.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.futures import Future

from optim.markers import comm_marker

# DDP checks the hook's annotations against the real types: ``from __future__ import
# annotations`` would turn them into strings, so this module does without it.
_COMPRESS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


class DenseGate:
    """Holds dense buckets until the backward embedding all-to-all is issued (module doc)."""

    def __init__(self) -> None:
        self._open = False
        self._parked: list[tuple[Callable[[], Future[torch.Tensor]], Future[torch.Tensor]]] = []
        self._callback_queued = False

    def submit(self, issue: Callable[[], Future[torch.Tensor]]) -> Future[torch.Tensor]:
        """Issue now when the gate is open, else park and return a future of the result."""
        if self._open:
            return issue()
        parked: Future[torch.Tensor] = Future()
        self._parked.append((issue, parked))
        self._queue_end_of_backward()
        return parked

    def release(self) -> None:
        """The step's backward embedding all-to-all was issued: issue what is parked, and let
        the rest of this backward through."""
        self._open = True
        self._queue_end_of_backward()
        self._flush()

    def _end_of_backward(self) -> None:
        self._flush()
        self._open = False
        self._callback_queued = False

    def _flush(self) -> None:
        parked, self._parked = self._parked, []
        for issue, future in parked:
            issue().then(_resolves(future))

    def _queue_end_of_backward(self) -> None:
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True


def _resolves(out: Future[torch.Tensor]) -> Callable[[Future[torch.Tensor]], None]:
    """The callback that hands a finished future's value on to ``out``."""
    return lambda done: out.set_result(done.value())


@dataclass
class DenseHookState:
    """What :func:`dense_hook` needs (DDP passes it back on every bucket)."""

    group: dist.ProcessGroup
    precision: str | None = None
    """``fp16`` / ``bf16`` compression (torchrec's ``allreduce_comm_precision``), or None."""
    gate: DenseGate | None = None
    marker: str = field(init=False)
    scale: float = field(init=False)
    """``1 / world_size`` of the group, the factor on an uncompressed bucket."""

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in _COMPRESS:
            raise ValueError(f"precision: fp16, bf16 or None, got {self.precision!r}")
        self.marker = comm_marker("dense", self.group.group_name)
        self.scale = 1.0 / dist.get_world_size(self.group)


def dense_hook(state: DenseHookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """FreeScale's DDP comm hook (module docstring): marked, optionally gated, optionally
    compressed all-reduce of one bucket."""

    def issue() -> Future[torch.Tensor]:
        with record_function(state.marker):
            if state.precision is not None:
                return _COMPRESS[state.precision](state.group, bucket)
            tensor = bucket.buffer()
            tensor.mul_(state.scale)
            work: dist.Work = dist.all_reduce(tensor, group=state.group, async_op=True)
            return work.get_future().then(lambda done: done.value()[0])

    return state.gate.submit(issue) if state.gate is not None else issue()
