"""The ``sm_free`` toggle: the embedding all-to-all on the GPU's copy engines, not its SMs.

On a GPU, NCCL's kernels take SMs from the compute they overlap. NCCL >= 2.28 can run an
all-to-all on the copy engines instead ("zero-CTA"), when five things hold (torch's own recipe,
``fully_shard.set_symm_mem_for_comm``; ``shared/notes/overlap_smfree.md`` §B.1):

1. the group's ``config.cta_policy = ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO``;
2. NCCL symmetric memory (``symm_mem.set_backend("NCCL")``);
3. send and receive buffers from the symmetric pool, rendezvoused on the group;
4. an *equal-split* ``all_to_all_single`` (no split lists: uneven splits become send/recv,
   which always launch SM kernels);
5. one node (one NVLink domain), not on the default stream (``async_op=True`` does that).

torchrec's all-to-alls have uneven splits, so :class:`SMFreePath` pads every per-peer chunk to a
capacity ``C`` (rows), exchanges ``W x C`` rows per rank with an equal split, and unpads::

    rank r input   |a a a|b|c c|          splits (3, 1, 2), C = 3
    padded send    |a a a|b . .|c c .|    W x C rows, '.' = padding
    equal-split all_to_all_single ->  recv |x x .|y y y|z . .|  -> output |x x|y y y|z|

The ranks must agree on ``C`` (an equal split is the same size everywhere): it is the largest
chunk of any rank in this call (an all-reduce MAX of one number per call), never below the
configured capacity or the largest seen so far, so the symmetric buffers are reused.
:func:`padding_overhead` says what padding costs in bytes; :attr:`SMFreePath.stats` keeps the
running total. (A bound known to every rank without communication, such as one derived from
the balancer's plan, would save that one number, but it needs the row layout of each torchrec
call; not done.)

Where the copy-engine path cannot apply (gloo, no CUDA, NCCL < 2.28, a torch without
``NCCL_CTA_POLICY_ZERO`` or symmetric memory, more than one node) the toggle is recorded as
requested and not applied, with the exact reason (:func:`decide`); with ``fallback="efficiency"``
on NCCL >= 2.27 the embedding group gets ``NCCL_CTA_POLICY_EFFICIENCY`` instead (fewer SMs, not
zero), recorded as such. Nothing falls back silently.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from optim.config import PriorityConfig, SMFreeConfig, ToggleStatus

MIN_NCCL_COPY_ENGINE = (2, 28)
MIN_NCCL_CTA_POLICY = (2, 27)


# ------------------------------------------------------------------------- what can run here


@dataclass(frozen=True)
class Capability:
    """What the copy-engine all-to-all needs, as found on this machine (:func:`probe`)."""

    backend: str
    cuda: bool
    nccl_version: tuple[int, ...] | None
    has_cta_policy_zero: bool
    has_cta_policy_efficiency: bool
    has_symmetric_memory: bool
    num_nodes: int


def probe(backend: str) -> Capability:
    """Look at torch, NCCL and the launch environment (no collective, nothing changed)."""
    nccl_cls = getattr(dist, "ProcessGroupNCCL", None)
    return Capability(
        backend=backend,
        cuda=torch.cuda.is_available(),
        nccl_version=_nccl_version(),
        has_cta_policy_zero=hasattr(nccl_cls, "NCCL_CTA_POLICY_ZERO"),
        has_cta_policy_efficiency=hasattr(nccl_cls, "NCCL_CTA_POLICY_EFFICIENCY"),
        has_symmetric_memory=_has_symmetric_memory(),
        num_nodes=_num_nodes(),
    )


def _nccl_version() -> tuple[int, ...] | None:
    try:
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # torch: unannotated
    except (AttributeError, RuntimeError):
        return None
    return tuple(int(v) for v in version) if isinstance(version, tuple) else None


def _has_symmetric_memory() -> bool:
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        return False
    return all(hasattr(symm_mem, f) for f in ("set_backend", "get_mem_pool", "rendezvous"))


def _num_nodes() -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return max(1, -(-world // max(local, 1)))


def decide(config: SMFreeConfig, cap: Capability) -> tuple[ToggleStatus, str | None]:
    """(the toggle's status, the mode: ``copy_engine``, ``efficiency`` or None)."""
    if not config.enabled:
        return ToggleStatus(False, False), None
    why = _why_not_copy_engine(cap)
    if why is None:
        return ToggleStatus(True, True), "copy_engine"
    if config.fallback == "efficiency" and _efficiency_possible(cap):
        reason = f"{why}; fallback: NCCL_CTA_POLICY_EFFICIENCY on the embedding group (fewer SMs)"
        return ToggleStatus(True, True, reason), "efficiency"
    return ToggleStatus(True, False, why), None


def _why_not_copy_engine(cap: Capability) -> str | None:
    if cap.backend != "nccl":
        return (
            f"backend {cap.backend}: collectives run on CPU worker threads "
            "(ProcessGroupGloo, 2 per group); there are no SMs or copy engines to free"
            if cap.backend == "gloo"
            else f"backend {cap.backend}: copy-engine all-to-all needs NCCL"
        )
    if not cap.cuda:
        return "no CUDA device"
    if cap.nccl_version is None or cap.nccl_version[:2] < MIN_NCCL_COPY_ENGINE:
        found = ".".join(map(str, cap.nccl_version)) if cap.nccl_version else "unknown"
        return f"NCCL {found} < 2.28: no copy-engine collectives"
    if not cap.has_cta_policy_zero:
        return f"torch {torch.__version__} has no ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO"
    if not cap.has_symmetric_memory:
        return f"torch {torch.__version__} has no NCCL symmetric memory (_symmetric_memory)"
    if cap.num_nodes > 1:
        return f"{cap.num_nodes} nodes: the copy-engine all-to-all needs one NVLink domain"
    return None


def _efficiency_possible(cap: Capability) -> bool:
    return (
        cap.backend == "nccl"
        and cap.cuda
        and cap.nccl_version is not None
        and cap.nccl_version[:2] >= MIN_NCCL_CTA_POLICY
        and cap.has_cta_policy_efficiency
    )


def nccl_options(mode: str | None, high_priority: bool) -> Any | None:
    """``ProcessGroupNCCL.Options`` for the embedding group: a high-priority stream
    (``priority_overlap``; a per-group option, unlike ``TORCH_NCCL_HIGH_PRIORITY``, which would
    apply to every group) and the CTA policy of ``mode``; None when neither applies."""
    if mode is None and not high_priority:
        return None
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=high_priority)
    if mode == "copy_engine":
        # CTA policies: NCCL >= 2.27 builds only (capabilities' hasattr), absent from torch's stubs
        options.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO  # type: ignore[attr-defined]
    elif mode == "efficiency":
        options.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_EFFICIENCY  # type: ignore[attr-defined]
    return options


@dataclass
class SMFreeSetup:
    """The decision for this job, before the groups exist (:func:`setup_sm_free`)."""

    config: SMFreeConfig
    status: ToggleStatus
    mode: str | None

    @property
    def applied(self) -> bool:
        return self.mode == "copy_engine"

    def path(self, group: dist.ProcessGroup) -> SMFreePath:
        return SMFreePath(group, capacity=self.config.capacity)


def setup_sm_free(config: SMFreeConfig, priority: PriorityConfig) -> tuple[SMFreeSetup, Any | None]:
    """Decide the toggle and the embedding group's NCCL options. The copy-engine all-to-all
    needs a group of its own with the zero-CTA policy: with ``priority_overlap`` off it still
    gets one (``optim.groups`` makes it when these options are not None)."""
    cap = probe(str(dist.get_backend()))
    status, mode = decide(config, cap)
    options = nccl_options(mode, priority.enabled) if cap.backend == "nccl" else None
    if mode is not None:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
    return SMFreeSetup(config, status, mode), options


# ------------------------------------------------------------------ the padded all-to-all


def chunk_offsets(splits: Sequence[int]) -> np.ndarray:
    """Start of each chunk in a tensor cut into ``splits`` rows (one more entry: the total)."""
    return np.concatenate([[0], np.cumsum(np.asarray(splits, dtype=np.int64))])


def pad_chunks(
    tensor: torch.Tensor, splits: Sequence[int], capacity: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``[sum(splits), ...]`` -> ``[len(splits) * capacity, ...]``: chunk j at row j·capacity,
    zeros after it (into ``out`` when given). Raises ValueError when a chunk exceeds the
    capacity."""
    if max(splits, default=0) > capacity:
        raise ValueError(f"capacity: a chunk of {max(splits)} rows exceeds {capacity}")
    if int(sum(splits)) != tensor.shape[0]:
        raise ValueError(f"splits: sum {sum(splits)} != {tensor.shape[0]} rows")
    if out is None:
        out = tensor.new_zeros((len(splits) * capacity, *tensor.shape[1:]))
    else:
        out.zero_()
    offsets = chunk_offsets(splits)
    for j, n in enumerate(splits):
        out[j * capacity : j * capacity + n] = tensor[offsets[j] : offsets[j] + n]
    return out


def unpad_chunks(
    padded: torch.Tensor, splits: Sequence[int], capacity: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The inverse of :func:`pad_chunks`: the first ``splits[j]`` rows of each chunk, packed
    (into ``out`` when given)."""
    offsets = chunk_offsets(splits)
    if out is None:
        out = padded.new_empty((int(offsets[-1]), *padded.shape[1:]))
    for j, n in enumerate(splits):
        out[offsets[j] : offsets[j] + n] = padded[j * capacity : j * capacity + n]
    return out


def padding_overhead(splits: Sequence[int], capacity: int, row_bytes: int) -> tuple[int, int]:
    """(useful bytes, bytes sent) of one rank's padded all-to-all."""
    return int(sum(splits)) * row_bytes, len(splits) * capacity * row_bytes


@dataclass
class PaddingStats:
    useful_bytes: int = 0
    sent_bytes: int = 0
    calls: int = 0

    @property
    def overhead(self) -> float:
        """Extra bytes sent over the useful ones (0.5 = 50% more)."""
        return self.sent_bytes / self.useful_bytes - 1 if self.useful_bytes else float("nan")


class _Unpadding:
    """The ``Work`` of a padded all-to-all: ``wait()`` waits, then unpads into the output."""

    def __init__(self, work: Any, finish: Any) -> None:
        self._work, self._finish = work, finish

    def wait(self, timeout: Any = None) -> bool:
        done = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._finish()
        return bool(done) if done is not None else True

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


@dataclass
class SMFreePath:
    """The padded equal-split all-to-all on the copy engines (module docstring), for the
    embedding group (:class:`optim.comm.CommRouter` hands it torchrec's calls)."""

    group: dist.ProcessGroup
    capacity: int | None = None
    stats: PaddingStats = field(default_factory=PaddingStats)
    _buffers: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        group: dist.ProcessGroup | None = None,
        async_op: bool = False,
    ) -> Any:
        world = dist.get_world_size(self.group)
        send_splits = list(input_split_sizes or [input.shape[0] // world] * world)
        recv_splits = list(output_split_sizes or [output.shape[0] // world] * world)
        capacity = self._agree_capacity(max(send_splits + recv_splits, default=0))
        send, recv = self._symmetric(capacity * world, input)
        pad_chunks(input, send_splits, capacity, out=send)
        work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
        row_bytes = input[0].numel() * input.element_size() if input.shape[0] else 0
        useful, sent = padding_overhead(send_splits, capacity, row_bytes)
        self.stats.useful_bytes += useful
        self.stats.sent_bytes += sent
        self.stats.calls += 1
        finish = _Unpadding(work, lambda: unpad_chunks(recv, recv_splits, capacity, output))
        if async_op:
            return finish
        finish.wait()
        return None

    def _agree_capacity(self, local_max: int) -> int:
        """The capacity every rank uses for this call: the largest chunk of any rank (an
        all-reduce MAX of one number, on every call: a rank that skipped it while another
        needed more would hang both), never below the capacity kept so far."""
        needed = torch.tensor([local_max], device=_device(self.group))
        dist.all_reduce(needed, op=dist.ReduceOp.MAX, group=self.group)
        self.capacity = max(int(needed.item()), self.capacity or 0)
        return self.capacity

    def _symmetric(self, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Send and receive buffers from NCCL's symmetric pool, allocated and rendezvoused once
        per shape (the first window registration is expensive) and reused."""
        key = (rows, tuple(like.shape[1:]), like.dtype)
        if key not in self._buffers:
            import torch.distributed._symmetric_memory as symm_mem

            device = like.device
            with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
                send = torch.empty((rows, *like.shape[1:]), dtype=like.dtype, device=device)
                recv = torch.empty_like(send)
            symm_mem.rendezvous(send, group=self.group)
            symm_mem.rendezvous(recv, group=self.group)
            self._buffers[key] = (send, recv)
        return self._buffers[key]


def _device(group: dist.ProcessGroup) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
