"""The dense side: FreeScale's one DDP comm hook, and the gate (torch only, no torchrec).

``optim.dmp.DenseDataParallel`` puts torchrec's DDP on the dense group and registers
:func:`dense_hook`. DDP allows one comm hook, and torchrec registers its fp16 / bf16
compression hook there, so the compression is taken in here and composed with what FreeScale
adds:

1. ``## fsobs:comm:dense:<pg_name> ##`` around the all-reduce's issue (:mod:`optim.markers`);
2. with ``dense_order="after_embedding"`` or ``"auto"``, the :class:`DenseGate`.

Without compression the hook does what DDP does without one: the bucket times ``1 / world_size``
(the same float multiply DDP's reducer applies), then an all-reduce sum; the gradients are
bit-identical (``tests/integration/optim/test_example.py``: the dense order after the
embedding all-to-all changes no number).

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
    """Holds dense buckets until the backward embedding all-to-all is issued (module doc).

    ``auto``: decide at the first backward with dense buckets. Where the backward issues an
    embedding all-to-all (torchrec's own embedding modules), the gate stays: that all-to-all is
    what the next step waits for, and putting it first is what the measurements favour
    (BENCHMARKS.md "Priority overlap as torchrec's PEC"). Where it issues none (PEC took every
    table and sends its gradients after the backward; embeddings frozen), there is nothing to
    put first and holding the buckets would only move every dense all-reduce behind the
    backward, where nothing overlaps it: the gate opens for good (torchrec's own order)::

        an all-to-all in the backward   |b1 b2|a2a|b3 b4|   gated: after_embedding
        none (PEC's gradients after it) |b1 b2 b3 b4|       held to the end: concurrent
    """

    def __init__(self, auto: bool = False) -> None:
        self._open = False
        self._parked: list[tuple[Callable[[], Future[torch.Tensor]], Future[torch.Tensor]]] = []
        self._callback_queued = False
        self.auto = auto
        self.decision: str | None = None
        """``auto``'s choice once made: ``after_embedding`` or ``concurrent``."""
        self.held: tuple[int, int] | None = None
        """``auto``: (buckets ready before the all-to-all, buckets) of the deciding backward."""
        self._seen = 0
        self._held_now: int | None = None

    def submit(self, issue: Callable[[], Future[torch.Tensor]]) -> Future[torch.Tensor]:
        """Issue now when the gate is open, else park and return a future of the result."""
        if torch._C._current_autograd_node() is None:
            # after the backward's last node: DDP's delayed all-reduce (a static graph's first
            # iteration) issues every bucket from a callback and waits for them there, so
            # nothing may wait for the gate's own callback, queued behind it
            return issue()
        self._seen += 1
        self._queue_end_of_backward()
        if self._open or self.decision == "concurrent":
            return issue()
        parked: Future[torch.Tensor] = Future()
        self._parked.append((issue, parked))
        return parked

    def release(self) -> None:
        """The step's backward embedding all-to-all was issued: issue what is parked, and let
        the rest of this backward through."""
        if self._held_now is None:
            self._held_now = self._seen
        self._open = True
        self._queue_end_of_backward()
        self._flush()

    def describe(self) -> str:
        """The order in force, in words (``FreeScale.status()``)."""
        if not self.auto:
            return "after_embedding"
        if self.decision is None or self.held is None:
            return "auto: not decided yet (no backward with dense buckets seen)"
        ready, total = self.held
        if self.decision == "concurrent":
            return (
                f"auto: concurrent (no embedding all-to-all in the backward: nothing to put "
                f"before its {total} dense buckets)"
            )
        return (
            f"auto: after_embedding (the backward's embedding all-to-all came after {ready} of "
            f"its {total} dense buckets: they wait for it)"
        )

    def _end_of_backward(self) -> None:
        self._flush()
        if self.auto and self.decision is None and self._seen:
            held = self._seen if self._held_now is None else self._held_now
            self.held = (held, self._seen)
            self.decision = "concurrent" if self._held_now is None else "after_embedding"
        self._open = False
        self._callback_queued = False
        self._seen, self._held_now = 0, None

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
