"""What each rank trains on at each step, through the optimizer API (``optim.FreeScale``).

:class:`StepInputs` turns the run's global batches into this rank's batches, one per step, and
records a :class:`StepInput` for each (what the step sidecar logs). Every rank knows the lengths
of all samples (``SyntheticHistories.lengths``), so plan mode asks ``FreeScale.shares`` for this
rank's positions and materializes only those samples; with ``balance`` off that is the random
split (contiguous chunks), no communication, loss unscaled. With ``balance`` on, each step's plan
is made on FreeScale's planner thread while the step before trains (``ahead=False``: on the
training thread when the step's input is prepared, as ``FreeScale.split`` does; the same
shares). Shuffle mode materializes this rank's random-split share, as a loader that learns
lengths only after loading would, and lets ``FreeScale.exchange`` balance it (samples packed
with ``pack_sample``).

Either way the rank's samples are in global-batch position order, so both modes train on the
same batches, and with unequal counts (``lpt``, or ``kk`` with ``counts="unequal"``) each batch
carries its loss scale. Each step's input is prepared under ``## fsobs:data ##``: a data-loader
range for the CPU bubble classes.

With a balance window (``BalanceConfig(window=K)``, plan mode) the global batches are taken
``K`` at a time and ``FreeScale.split_window`` deals their samples into those ``K`` steps: a
step trains samples of any of the window's batches, the number per step and per rank varies,
and each share's loss scale is for its own step's count (each step's gradient is the mean over
its own samples). The windows are planned when :class:`StepInputs` is made (every rank at the
same point: the plan check communicates), because the ID overlap below needs each step's
samples: before the profiled loop, so off the training steps too; a step's ``batch_digest`` is
then the digest of the samples it trained.

Each step also carries, per embedding table, the share of its global batch's ID occurrences
that the previous global batch had (:mod:`fsobs.workload.overlap`, the sidecar's
``id_overlap``), whatever the toggles (with a window: of the samples each step trains). It
needs every rank's samples, which a rank does not otherwise build, so :class:`StepInputs`
computes it for all steps when it is made (before the profiled loop), not inside a step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from torch.autograd.profiler import record_function

from fsobs.workload.batch import Batch, collate
from fsobs.workload.data import (
    Sample,
    SyntheticHistories,
    pack_sample,
    random_split,
    unpack_sample,
)
from fsobs.workload.model import EBC_TABLES, EC_TABLES
from fsobs.workload.overlap import global_batch_overlaps
from optim.freescale import FreeScale, StepShare
from optim.markers import DATA_MARKER
from optim.plan import batch_digest


@dataclass(frozen=True)
class StepInput:
    """One step on one rank (the sidecar's balance fields are the same on every rank)."""

    step: int
    sample_ids: np.ndarray
    lengths: np.ndarray
    imbalance_before: float
    imbalance_after: float
    batch_digest: str
    """:func:`optim.plan.batch_digest` of the samples the step trains over all ranks (its
    global batch, or with a window the step's own samples)."""
    loss_scale: float
    id_overlap: dict[str, float] | None = None
    """Per embedding table, the share of the global batch's ID occurrences that the previous
    step's global batch had; None on the first step."""


class StepInputs:
    """This rank's ``(Batch, StepInput)`` per step; iterate once, in step order, on every rank
    at the same point (shuffle mode and the plan check communicate)."""

    def __init__(
        self,
        data: SyntheticHistories,
        batches: Sequence[np.ndarray],
        freescale: FreeScale,
        *,
        ahead: bool = True,
    ) -> None:
        self.data, self.batches, self.fs = data, batches, freescale
        balance = freescale.config.balance
        self._shuffle = balance.enabled and balance.mode == "shuffle"
        self._shares: Iterator[StepShare] | None = None
        window = freescale.window
        self._windowed = self._plan_windows(window) if window > 1 else None
        if not self._shuffle and self._windowed is None:
            # the planner thread starts now: step 0's plan before the loop
            lengths = (data.lengths[b] for b in batches)
            self._shares = freescale.shares(lengths, ahead=ahead)
        trained = batches if self._windowed is None else [w[0] for w in self._windowed]
        self.id_overlap = global_batch_overlaps(data, trained, {**EBC_TABLES, **EC_TABLES})
        """Per step, :attr:`StepInput.id_overlap`."""

    def __iter__(self) -> Iterator[tuple[Batch, StepInput]]:
        for step, global_batch in enumerate(self.batches):
            with record_function(DATA_MARKER):
                trained, samples, share = self._share(step, global_batch)
                item = self._emit(step, trained, samples, share)
            yield item

    def _plan_windows(
        self, window: int
    ) -> list[tuple[np.ndarray, np.ndarray | list[Sample], StepShare]]:
        """Per step: the samples it trains over all ranks (in window order), this rank's (plan
        mode: their dataset ids; shuffle mode: the samples received) and its share; the global
        batches ``window`` at a time (the last window may be shorter)."""
        out: list[tuple[np.ndarray, np.ndarray | list[Sample], StepShare]] = []
        for first in range(0, len(self.batches), window):
            batches = self.batches[first : first + window]
            ids = np.concatenate(batches)
            steps: list[tuple[StepShare, list[Sample] | None]]
            if self._shuffle:
                got = self.fs.exchange_window(first, *self._loaded(batches))
                steps = [(share, [unpack_sample(r) for r in rows]) for rows, share in got]
            else:
                lengths = [self.data.lengths[b] for b in batches]
                steps = [(share, None) for share in self.fs.split_window(first, lengths)]
            for share, samples in steps:
                assert share.plan is not None  # a window plans every step
                trained = np.sort(np.concatenate(share.plan.parts))
                out.append(
                    (ids[trained], ids[share.positions] if samples is None else samples, share)
                )
        return out

    def _loaded(
        self, batches: Sequence[np.ndarray]
    ) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
        """Shuffle mode: this rank's random-split share of each batch, as the rows and lengths
        a loader that learns lengths only after loading would hold."""
        rows, lengths = [], []
        for batch in batches:
            samples = [
                self.data.sample(int(i))
                for i in random_split(batch, self.fs.world_size, self.fs.rank)
            ]
            rows.append([pack_sample(x) for x in samples])
            lengths.append(np.array([x.length for x in samples], dtype=np.int64))
        return rows, lengths

    def _share(
        self, step: int, global_batch: np.ndarray
    ) -> tuple[np.ndarray, list[Sample], StepShare]:
        """The step's samples over all ranks, this rank's samples and its share."""
        if self._windowed is not None:
            trained, mine, share = self._windowed[step]
            if isinstance(mine, np.ndarray):
                return trained, [self.data.sample(int(i)) for i in mine], share
            return trained, mine, share
        if self._shares is not None:
            share = next(self._shares)
            assert share.step == step
            samples = [self.data.sample(int(i)) for i in global_batch[share.positions]]
            return global_batch, samples, share
        mine = random_split(global_batch, self.fs.world_size, self.fs.rank)
        samples = [self.data.sample(int(i)) for i in mine]
        lengths = np.array([s.length for s in samples], dtype=np.int64)
        rows, share = self.fs.exchange(step, [pack_sample(s) for s in samples], lengths)
        return global_batch, [unpack_sample(r) for r in rows], share

    def _emit(
        self, step: int, trained: np.ndarray, samples: list[Sample], share: StepShare
    ) -> tuple[Batch, StepInput]:
        lengths = np.array([s.length for s in samples], dtype=np.int64)
        plan = share.plan
        assert plan is not None  # the job plans every step (plan mode, or shuffle with balance)
        info = StepInput(
            step=step,
            sample_ids=np.array([s.index for s in samples], dtype=np.int64),
            lengths=lengths,
            imbalance_before=plan.imbalance_before,
            imbalance_after=plan.imbalance_after,
            batch_digest=batch_digest(trained),
            loss_scale=share.loss_scale,
            id_overlap=self.id_overlap[step],
        )
        return collate(samples, loss_scale=share.loss_scale), info
