"""``FreeScale``: the toggles, embedded in any torchrec training loop.

::

    fs = FreeScale(FreeScaleConfig(balance=..., priority_overlap=..., sm_free=...),
                   cost_model=CostModel(...))
    fs.setup()                                     # collective: the toggles' process groups
    model = fs.prepare(model, constraints)         # priority_overlap: PEC where PEC can
    sharders = fs.sharders(sharders)               # + PEC's sharder (for the planner too)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders,
                                   **fs.dmp_kwargs())         # env + the dense DDP wrapper
    pipeline = fs.pipeline(dmp, optimizer, device)  # PEC's or TrainPipelineSparseDist
    # (a loop without a pipeline: fs.attach(dmp) instead; PEC needs the pipeline)
    for step, global_batch in enumerate(batches):  # every rank sees the same global batch ids
        share = fs.split(step, lengths[global_batch])          # plan mode: this rank's part
        batch = build(global_batch[share.positions], loss_scale=share.loss_scale)
        # or, planned one step ahead on a planner thread: for share in fs.shares(lengths_iter)
        ...
        fs.after_step(step)                        # sync_gc: collect at the same steps
    run_json["toggles"] = fs.status()              # requested / applied / reason, per toggle
    fs.close()                                     # PEC: the last deferred gradient applied

Shuffle mode (lengths known only after loading): ``rows, share = fs.exchange(step, rows,
lengths)`` with this rank's random-split share as int64 rows.

Every toggle that is off is an exact no-op: ``dmp_kwargs`` keeps DMP on WORLD with torchrec's
DDP settings, ``split`` returns torchrec's usual contiguous share with no communication and a
loss scale of exactly 1.0. What FreeScale always adds is observability that does not change a
number: ranges naming each collective's role and group for the analyzer (:mod:`optim.markers`),
and DDP's all-reduce through one comm hook that computes what DDP computes (:mod:`optim.ddp`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch.distributed as dist
from torch.autograd.profiler import record_function

from optim.ahead import PlanAhead
from optim.balance import CostModel
from optim.comm import CommRouter, install
from optim.config import FreeScaleConfig, ToggleStatus
from optim.ddp import DenseGate
from optim.groups import Groups, make_groups
from optim.markers import BALANCE_CHECK_MARKER, BALANCE_MARKER, BALANCE_WAIT_MARKER
from optim.padded import split_costs
from optim.plan import StepPlan, loss_scale, plan_window
from optim.sampler import BalancedBatchSampler, BatchShare, Lengths
from optim.shuffle import ShuffleBalancer, check_plan
from optim.sm_free import SMFreePath, setup_sm_free
from optim.status import balance_status, priority_status, sync_gc_status
from optim.sync_gc import SyncGC

if TYPE_CHECKING:
    from torch import nn
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.distributed.types import ModuleSharder

    from optim.loader import ShareLoader
    from optim.pec_setup import PECSetup

T = TypeVar("T")
M = TypeVar("M", bound="nn.Module")


@dataclass(frozen=True)
class StepShare:
    """This rank's part of one global batch."""

    step: int
    positions: np.ndarray
    """Ascending positions into the global batch (int64)."""
    loss_scale: float
    """Factor on this rank's mean loss (exactly 1.0 with equal counts; :func:`loss_scale`)."""
    plan: StepPlan | None
    """The step's plan; None in shuffle mode with the toggle off (no rank knows all costs)."""


class FreeScale:
    """The facade a training loop embeds (module docstring)."""

    def __init__(
        self, config: FreeScaleConfig | None = None, *, cost_model: CostModel | None = None
    ) -> None:
        self.config = config or FreeScaleConfig()
        if self.config.balance.enabled and cost_model is None:
            raise ValueError("cost_model: the balance toggle needs one (optim.balance.CostModel)")
        self.cost_model = cost_model
        self._groups: Groups | None = None
        self._statuses: dict[str, ToggleStatus] = {}
        self._sm_free: SMFreePath | None = None
        order = self.config.priority_overlap.dense_order
        self._gate = DenseGate(auto=order == "auto") if self._gated else None
        self._shuffle: ShuffleBalancer | None = None
        self._uninstall: Callable[[], None] | None = None
        self._gc = SyncGC(self.config.sync_gc)
        self._pec: PECSetup | None = None
        self._pipeline: Any = None
        self._planners: list[PlanAhead[list[np.ndarray], list[StepPlan]]] = []
        self._samplers: list[BalancedBatchSampler] = []
        self._closed_status: dict[str, dict[str, Any]] | None = None
        self._shares_served = 0
        """Shares of :meth:`split`, :meth:`shares` and :meth:`exchange` (the samplers count
        their own): balance is applied once one was served."""

    @property
    def _gated(self) -> bool:
        priority = self.config.priority_overlap
        return priority.enabled and priority.dense_order != "concurrent"

    # ------------------------------------------------------------------ set-up (collective)

    def setup(self) -> None:
        """Create the toggles' process groups and probe what this machine can do. Collective:
        call it on every rank, after ``init_process_group`` and before building DMP."""
        if self._groups is not None:
            raise RuntimeError("FreeScale.setup() was already called")
        sm_free, nccl_options = setup_sm_free(self.config.sm_free, self.config.priority_overlap)
        self._groups, priority = make_groups(self.config, nccl_options)
        self._sm_free = sm_free.path(self._groups.embedding) if sm_free.applied else None
        self._statuses = {
            "balance": ToggleStatus(self.config.balance.enabled, self.config.balance.enabled),
            "priority_overlap": priority,
            "sm_free": sm_free.status,
            "sync_gc": ToggleStatus(self.config.sync_gc.enabled, self.config.sync_gc.enabled),
        }
        if self.config.balance.enabled and self.config.balance.mode == "shuffle":
            self._shuffle = ShuffleBalancer(self.config.balance, self._groups.balance)

    @property
    def groups(self) -> Groups:
        if self._groups is None:
            raise RuntimeError("call FreeScale.setup() first")
        return self._groups

    def dmp_kwargs(self, **ddp_wrapper_kwargs: Any) -> dict[str, Any]:
        """Keyword arguments for ``DistributedModelParallel``: the embedding group's ``env`` and
        the DDP wrapper on the dense group (``ddp_wrapper_kwargs``: torchrec's
        ``DefaultDataParallelWrapper`` options, e.g. ``allreduce_comm_precision``)."""
        from torchrec.distributed.types import ShardingEnv

        from optim.dmp import DenseDataParallel

        groups = self.groups
        wrapper = DenseDataParallel(groups.dense, gate=self._gate, **ddp_wrapper_kwargs)
        kwargs: dict[str, Any] = {"data_parallel_wrapper": wrapper}
        if groups.embedding is not dist.group.WORLD:
            kwargs["env"] = ShardingEnv.from_process_group(groups.embedding)
        return kwargs

    # ------------------------------------------------------ the model (priority_overlap: PEC)

    def prepare(self, model: M, constraints: Mapping[str, Any] | None = None) -> M:
        """Before DMP: with ``priority_overlap`` on, turn the model's ``EmbeddingCollection``s
        that PEC can take into PEC ones, in place (:func:`optim.pec_setup.to_pec`; what it
        cannot take is said in :meth:`status`); ``constraints``: the planner's, by table.
        Returns ``model``. Toggle off: the model as it is."""
        if self.config.priority_overlap.enabled:
            from optim.pec_setup import to_pec

            self._pec = to_pec(model, constraints)
        return model

    def sharders(
        self, sharders: Sequence[ModuleSharder[nn.Module]]
    ) -> list[ModuleSharder[nn.Module]]:
        """The sharders for the planner and DMP: ``sharders``, and PEC's sharder around their
        ``EmbeddingCollectionSharder`` (the same fused optimizer) when PEC took tables."""
        out = list(sharders)
        if self._pec is not None and self._pec.applied:
            from torchrec.distributed.embedding import EmbeddingCollectionSharder
            from torchrec.distributed.pec_embedding import PECEmbeddingCollectionSharder

            ec = next((s for s in out if isinstance(s, EmbeddingCollectionSharder)), None)
            out.append(PECEmbeddingCollectionSharder(ec_sharder=ec))
        return out

    def pipeline(
        self, model: nn.Module, optimizer: Any, device: Any
    ) -> TrainPipelineSparseDist[Any, Any]:
        """The train pipeline with the toggles applied, attached (:meth:`attach`): PEC's
        (:class:`optim.pec.ExactTrainPipelinePEC`) when PEC took tables, torchrec's
        ``TrainPipelineSparseDist`` otherwise."""
        if self._pec is not None and self._pec.applied:
            from optim.pec import ExactTrainPipelinePEC

            pipeline: TrainPipelineSparseDist[Any, Any] = ExactTrainPipelinePEC(
                model, optimizer, device
            )
        else:
            from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

            pipeline = TrainPipelineSparseDist(model, optimizer, device)
        self._pipeline = pipeline
        return self.attach(pipeline)

    def drain(self) -> None:
        """Apply PEC's deferred gradient of the last step now (before a checkpoint; collective).
        A no-op without PEC."""
        drain = getattr(self._pipeline, "drain", None)
        if drain is not None:
            drain()

    def attach(self, pipeline: T) -> T:
        """Route torchrec's embedding collectives through FreeScale (:mod:`optim.comm`); returns
        ``pipeline`` (a ``TrainPipelineSparseDist``, or the DMP of a plain loop) unchanged."""
        if self._uninstall is not None:
            raise RuntimeError("FreeScale.attach() was already called")
        router = CommRouter(
            on_backward_issue=self._gate.release if self._gate is not None else None,
            embedding_group=self.groups.embedding,
            all_to_all_single=self._sm_free.all_to_all_single if self._sm_free else None,
        )
        self._uninstall = install(router)
        self._gc.start()
        return pipeline

    def after_step(self, step: int) -> None:
        """Call after each training step (the ``sync_gc`` toggle collects here)."""
        self._gc.after_step(step)

    def close(self) -> None:
        """Stop the planner threads of :meth:`shares`, apply PEC's deferred gradient
        (:meth:`drain`; collective) and put torchrec's comm modules back as they were."""
        for planner in self._planners:
            planner.close()
        self._planners.clear()
        self.drain()
        if self._statuses and self._closed_status is None:
            self._closed_status = self.status()  # what the toggles did, as the run ends
        self._pipeline = None
        if self._uninstall is not None:
            self._uninstall()
            self._uninstall = None
        self._gc.stop()

    def __enter__(self) -> FreeScale:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ this rank's share (balance)

    def split(self, step: int, lengths: np.ndarray) -> StepShare:
        """Plan mode: this rank's part of a global batch whose samples have ``lengths`` (the
        same array on every rank). Toggle off: the contiguous random-split share."""
        if self.window > 1:
            raise ValueError(
                f"balance.window: {self.window} plans steps together; use split_window"
            )
        (plan,) = self._plan(self.world_size, [lengths])
        self._check(step, plan)
        return self._share(step, plan)

    def split_window(self, first_step: int, lengths: Sequence[np.ndarray]) -> list[StepShare]:
        """Plan mode with a window (``BalanceConfig(window=K)``): this rank's part of each step
        ``first_step, first_step + 1, ...`` of a window whose global batches have ``lengths``
        (one array each, the same on every rank; :attr:`window` of them, fewer at an epoch's
        end). Positions are into the window (the batches concatenated); each share's loss scale
        is for its own step's sample count. A window of 1 (the toggle off, or ``window=1``) is
        :meth:`split` of its one global batch, so that a loop can call this alone."""
        if not 1 <= len(lengths) <= self.window:
            raise ValueError(
                f"lengths: a window of {self.window} takes 1..{self.window} global batches, "
                f"got {len(lengths)}"
            )
        plans = self._plan(self.world_size, lengths)
        for k, plan in enumerate(plans):
            self._check(first_step + k, plan)
        return [self._share(first_step + k, plan) for k, plan in enumerate(plans)]

    def shares(
        self, lengths: Iterable[np.ndarray], *, first_step: int = 0, ahead: bool = True
    ) -> Iterator[StepShare]:
        """Plan mode for a loop that knows its global batches ahead: this rank's share of each
        step ``first_step, first_step + 1, ...``, whose global batch has the next array of
        ``lengths``; the shares :meth:`split` (with a window: :meth:`split_window`) gives.

        With the toggle on and ``ahead``, the plans are made on a planner thread one step (one
        window) ahead of the loop, while the current step trains (:mod:`optim.ahead`):
        ``lengths`` is iterated on that thread, ``## fsobs:balance ##`` is recorded there, a
        failed plan raises its error at the step that needs it (with a note naming the step),
        and the digest check stays on the calling thread. ``ahead=False`` (or the toggle off):
        each plan is made when its share is asked for, on the calling thread. The planner
        thread stops when the shares are exhausted or closed (``.close()``), or at
        :meth:`close`::

            for step, share in enumerate(fs.shares(lengths[b] for b in batches)):
                batch = build(batches[step][share.positions], loss_scale=share.loss_scale)
        """
        balance = self.config.balance
        if balance.enabled and balance.mode != "plan":
            raise ValueError(
                f"balance.mode: shares plans up front (mode 'plan'), got {balance.mode!r}; "
                "shuffle mode is FreeScale.exchange"
            )
        world, window = self.world_size, self.window

        def plan(step: int, group: list[np.ndarray]) -> list[StepPlan]:
            return self._plan(world, group)

        groups = _groups(lengths, window)
        if not (ahead and balance.enabled):
            return self._take(first_step, (plan(0, g) for g in groups), None)
        wait = partial(record_function, BALANCE_WAIT_MARKER)
        planner = PlanAhead(plan, groups, first_step=first_step, stride=window, wait_range=wait)
        self._planners.append(planner)
        return self._take(first_step, planner, planner)

    def _take(
        self,
        first_step: int,
        plans: Iterator[list[StepPlan]],
        planner: PlanAhead[list[np.ndarray], list[StepPlan]] | None,
    ) -> Iterator[StepShare]:
        """The shares of ``plans`` (one list per step or window), each checked when taken."""
        step = first_step
        try:
            for group in plans:
                for plan in group:
                    self._check(step, plan)
                    yield self._share(step, plan)
                    step += 1
        finally:
            if planner is not None and planner in self._planners:  # not closed by close()
                planner.close()
                self._planners.remove(planner)

    def _plan(self, world: int, lengths: Sequence[np.ndarray]) -> list[StepPlan]:
        """The plan of one global batch (one array), or of a window's, under
        ``## fsobs:balance ##`` on the calling thread (the training thread's or the planner's)."""
        with record_function(BALANCE_MARKER):
            costs = [split_costs(self.cost_model, np.asarray(b)) for b in lengths]
            if self.window > 1:
                return plan_window(costs, world)
            return [StepPlan.make(costs[0], world, self.config.balance)]

    def _check(self, step: int, plan: StepPlan) -> None:
        """The cross-rank digest check of ``step``'s plan, when the toggle checks at ``step``
        (a collective: on the training thread, under ``## fsobs:balance_check ##``)."""
        balance = self.config.balance
        if balance.enabled and balance.checks_at(step):
            with record_function(BALANCE_CHECK_MARKER):
                check_plan(plan.digest, step, self.groups.balance)

    def _share(self, step: int, plan: StepPlan) -> StepShare:
        """This rank's share of ``plan``; its loss scale for the step's own sample count (0.0
        for a window's empty step)."""
        mine = plan.parts[self.rank]
        total = sum(len(p) for p in plan.parts)
        self._shares_served += 1
        if not total and self.window > 1:
            return StepShare(step, mine, 0.0, plan)
        return StepShare(step, mine, loss_scale(len(mine), total, self.world_size), plan)

    @property
    def window(self) -> int:
        """Global batches planned together: ``balance.window`` with the toggle on, else 1."""
        balance = self.config.balance
        return balance.window if balance.enabled else 1

    def exchange(
        self, step: int, rows: Sequence[np.ndarray], lengths: np.ndarray
    ) -> tuple[list[np.ndarray], StepShare]:
        """Shuffle mode: given this rank's random-split share as int64 ``rows`` with their
        ``lengths``, the rows this rank trains on (in global-batch order) and its share.
        Toggle off (or plan mode): the rows as they are."""
        if self._shuffle is not None and self.window > 1:
            raise ValueError(
                f"balance.window: {self.window} exchanges steps together; use exchange_window"
            )
        if self._shuffle is None:
            start = self.rank * len(rows)
            positions = np.arange(start, start + len(rows), dtype=np.int64)
            return list(rows), StepShare(step, positions, 1.0, None)
        with record_function(BALANCE_MARKER):
            received, plan = self._shuffle(step, rows, self.costs(np.asarray(lengths)))
        return received, self._share(step, plan)

    def exchange_window(
        self,
        first_step: int,
        rows: Sequence[Sequence[np.ndarray]],
        lengths: Sequence[np.ndarray],
    ) -> list[tuple[list[np.ndarray], StepShare]]:
        """Shuffle mode with a window (``BalanceConfig(window=K)``): given this rank's random-
        split share of each global batch of a window (``rows[k]`` with ``lengths[k]``; :attr:`
        window` of them, fewer at the end), per step the rows this rank trains on (in window
        order) and its share: the shares :meth:`split_window` gives in plan mode, the rows
        exchanged once for the whole window. A window of 1 is :meth:`exchange` of its batch."""
        if len(rows) != len(lengths) or not 1 <= len(rows) <= self.window:
            raise ValueError(
                f"rows, lengths: a window of {self.window} takes 1..{self.window} global batches "
                f"of rows and lengths each, got {len(rows)} and {len(lengths)}"
            )
        if self.window == 1 or self._shuffle is None:
            return [
                self.exchange(first_step + k, r, n)
                for k, (r, n) in enumerate(zip(rows, lengths, strict=True))
            ]
        with record_function(BALANCE_MARKER):
            costs = [self.costs(np.asarray(n)) for n in lengths]
            received, plans = self._shuffle.window(first_step, rows, costs)
        return [
            (mine, self._share(first_step + k, plan))
            for k, (mine, plan) in enumerate(zip(received, plans, strict=True))
        ]

    def sampler(
        self,
        dataset: Sized,
        lengths: Lengths,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        loss_counts: Lengths | None = None,
    ) -> BalancedBatchSampler:
        """Plan mode inside the data loader: this rank's :class:`optim.sampler.
        BalancedBatchSampler` over ``dataset`` (``batch_size`` samples per rank and step), with
        the balance toggle's config and :meth:`costs`, so its shares are :meth:`split`'s.
        ``lengths`` drive the costs; ``loss_counts`` (the same forms) are the terms each sample
        adds to a mean loss, for ``share.loss_weight("token_mean")`` (default: the lengths)."""
        if self.config.balance.enabled and self.config.balance.mode != "plan":
            raise ValueError(
                f"balance.mode: the sampler plans up front (mode 'plan'), got "
                f"{self.config.balance.mode!r}; shuffle mode is FreeScale.exchange"
            )
        sampler = BalancedBatchSampler(
            dataset,
            lengths,
            batch_size=batch_size,
            world_size=self.world_size,
            rank=self.rank,
            config=self.config.balance,
            costs=self.costs if self.cost_model is None else self.cost_model,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            loss_counts=loss_counts,
        )
        self._samplers.append(sampler)
        return sampler

    def loader(
        self,
        dataset: Any,
        lengths: Lengths,
        *,
        batch_size: int,
        collate_fn: Callable[[list[Any], BatchShare], Any],
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        loss_counts: Lengths | None = None,
        **loader_kwargs: Any,
    ) -> ShareLoader:
        """A ``DataLoader`` over :meth:`sampler` whose ``collate_fn(samples, share)`` gets each
        batch's share (:class:`optim.loader.ShareLoader`; ``loader.sampler.set_epoch(e)``
        works). ``loader_kwargs``: ``DataLoader``'s other options (``num_workers``, ...)."""
        from optim.loader import ShareLoader

        sampler = self.sampler(
            dataset,
            lengths,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            loss_counts=loss_counts,
        )
        return ShareLoader(dataset, sampler, collate_fn, **loader_kwargs)

    def share(self, step: int, epoch: int | None = None) -> BatchShare:
        """The share of the ``step``-th batch of ``epoch`` (default: the current one) that the
        sampler of :meth:`sampler` / :meth:`loader` served, for a loop whose batches cannot
        carry it (:meth:`optim.sampler.BalancedBatchSampler.share`): by step, so right under a
        pipeline that fetches batches ahead."""
        if not self._samplers:
            raise ValueError("step: no sampler to ask; make one with fs.sampler or fs.loader")
        return self._samplers[-1].share(step, epoch)

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """The cost model's estimate per sample (the lengths themselves without a model)."""
        if self.cost_model is None:
            return np.asarray(lengths, dtype=np.float64)
        return self.cost_model(lengths)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    # ----------------------------------------------------------------------------- report

    def status(self) -> dict[str, dict[str, Any]]:
        """Per toggle, ``{"requested", "applied", "reason"}`` (what ``run.json`` records): what
        each toggle has done so far (after :meth:`close`, what it did)."""
        if self._closed_status is not None:
            return self._closed_status
        if not self._statuses:
            return {
                name: ToggleStatus(on, False, "FreeScale.setup() was not called").to_json()
                if on
                else ToggleStatus(False, False).to_json()
                for name, on in self.config.requested().items()
            }
        statuses = dict(self._statuses)
        if statuses["balance"].requested:
            served = self._shares_served + sum(s.served for s in self._samplers)
            statuses["balance"] = balance_status(served)
        if statuses["sync_gc"].requested:
            statuses["sync_gc"] = sync_gc_status(self._gc)
        if statuses["priority_overlap"].requested:
            statuses["priority_overlap"] = priority_status(
                statuses["priority_overlap"], self._pec, self._pipeline, self._gate
            )
        return {name: s.to_json() for name, s in statuses.items()}

    def layout(self) -> dict[str, Any]:
        """The process groups by role (``run.json``'s ``process_groups``)."""
        return self.groups.layout()


def _groups(lengths: Iterable[np.ndarray], size: int) -> Iterator[list[np.ndarray]]:
    """``lengths`` in lists of ``size`` (the last one shorter)."""
    it = iter(lengths)
    while group := [np.asarray(b) for b in islice(it, size)]:
        yield group
