"""FreeScale's configuration: one object with the paper's three toggles and ``sync_gc``
(no torch here).

::

    FreeScaleConfig(
        balance=BalanceConfig(enabled=True, method="kk", mode="plan"),      # optim.plan
        priority_overlap=PriorityConfig(enabled=True),
        sm_free=SMFreeConfig(enabled=True),
        sync_gc=SyncGCConfig(enabled=True, every=10),                      # optim.sync_gc
    )

Every toggle is off by default, and a toggle that is off changes nothing the job computes
(:class:`optim.freescale.FreeScale` keeps torchrec's defaults for it). What each toggle did is a
:class:`ToggleStatus`: requested, applied, and why not when it was not; the job records
``FreeScale.status()`` in ``run.json`` as it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from optim.errors import FieldError
from optim.plan import BalanceConfig
from optim.sync_gc import SyncGCConfig

__all__ = ["FreeScaleConfig", "PriorityConfig", "SMFreeConfig", "ToggleStatus", "TOGGLES"]

TOGGLES = ("balance", "priority_overlap", "sm_free", "sync_gc")
DenseOrder = Literal["auto", "after_embedding", "concurrent"]
"""When the dense all-reduce runs beside the embedding collectives
(:attr:`PriorityConfig.dense_order`)."""
DENSE_ORDERS: tuple[DenseOrder, ...] = get_args(DenseOrder)


@dataclass(kw_only=True, frozen=True)
class PriorityConfig:
    """The ``priority_overlap`` toggle: torchrec's Prioritized Embedding Communication for the
    model's ``EmbeddingCollection``s (:mod:`optim.pec`, through ``FreeScale.prepare``,
    ``sharders`` and ``pipeline``), and the dense all-reduce ordered behind the embedding
    collectives: embedding collectives on a process group of their own (high-priority streams
    on NCCL), the dense all-reduce on another."""

    enabled: bool = False
    """Embedding collectives on a process group of their own (a high-priority stream on
    NCCL), the dense all-reduce on another."""
    dense_order: DenseOrder = "auto"
    """With the toggle: auto (decided at the first backward), after_embedding (each step's
    dense buckets wait for its backward embedding all-to-all) or concurrent.

    ``auto``: decided at the first backward (:class:`optim.ddp.DenseGate`):
    ``after_embedding`` where the backward issues an embedding all-to-all (torchrec's own
    embedding modules), ``concurrent`` where it issues none (PEC took every table: it sends its
    gradients after the backward, so holding the dense buckets would only delay them).
    ``after_embedding``: each step's dense buckets are held back until the step's backward
    embedding all-to-all has been issued (released at the end of the backward when a step has
    none, so no step can hang); ``concurrent``: the two groups run side by side (torchrec's own
    order). Measured: BENCHMARKS.md "Priority overlap", "Priority overlap as torchrec's PEC",
    "FreeScale in a DataLoader loop"."""

    def __post_init__(self) -> None:
        if self.dense_order not in DENSE_ORDERS:
            raise FieldError(
                "dense_order", f"unknown {self.dense_order!r}, expected one of {list(DENSE_ORDERS)}"
            )


@dataclass(kw_only=True, frozen=True)
class SMFreeConfig:
    """The ``sm_free`` toggle: the embedding all-to-all on the GPU's copy engines (see
    :mod:`optim.sm_free`)."""

    enabled: bool = False
    """The embedding all-to-all on the GPU copy engines (NCCL >= 2.28, one node); elsewhere
    recorded as not applied, with the reason."""
    fallback: str = "none"
    """Where the copy-engine path cannot apply: ``none`` (record why, change nothing) or
    ``efficiency`` (NCCL's ``NCCL_CTA_POLICY_EFFICIENCY`` on the embedding group: fewer SMs,
    not zero; recorded as such)."""
    capacity: int | None = None
    """Rows per peer chunk of the padded all-to-all to start from (grown when a call needs
    more); None: the largest chunk seen so far."""

    def __post_init__(self) -> None:
        if self.fallback not in ("none", "efficiency"):
            raise FieldError("fallback", f"'none' or 'efficiency', got {self.fallback!r}")
        if self.capacity is not None and self.capacity < 1:
            raise FieldError("capacity", f"must be >= 1, got {self.capacity}")


@dataclass(kw_only=True, frozen=True)
class FreeScaleConfig:
    """Every toggle of :data:`TOGGLES`, each with its parameters."""

    balance: BalanceConfig = field(default_factory=BalanceConfig)
    priority_overlap: PriorityConfig = field(default_factory=PriorityConfig)
    sm_free: SMFreeConfig = field(default_factory=SMFreeConfig)
    sync_gc: SyncGCConfig = field(default_factory=SyncGCConfig)
    """Python's garbage collector at the same steps on every rank (:mod:`optim.sync_gc`)."""

    def requested(self) -> dict[str, bool]:
        return {name: getattr(self, name).enabled for name in TOGGLES}


@dataclass(frozen=True)
class ToggleStatus:
    """What a toggle did: the ``run.json`` entry ``{"requested", "applied", "reason"}``."""

    requested: bool
    applied: bool
    reason: str | None = None
    """Why a requested toggle is not (fully) applied; None otherwise."""

    def __post_init__(self) -> None:
        if self.applied and not self.requested:
            raise FieldError("applied", "a toggle that was not requested cannot be applied")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
