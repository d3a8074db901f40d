"""Record a run from any training loop: the per-rank trace, the step sidecar and ``run.json``.

::

    rec = RunRecorder(run_dir, freescale=fs, cost_model=fs.cost_model,
                      profiler=ProfilerConfig.every_step(num_steps))
    for step, batch in enumerate(loader):
        with rec.step(step, lengths=batch_lengths, ids=table_ids) as s:
            losses = per_sample_loss(batch); train_step(losses)
            s.loss_sum, s.loss_count = losses.sum().item(), len(losses)
    rec.close()

or, without re-indenting the loop, the same two calls the block makes::

    for step, batch in enumerate(loader):
        rec.begin_step(step, lengths=batch_lengths)
        losses = per_sample_loss(batch); train_step(losses)
        ids = rec.global_ids(my_table_ids)  # collective: every rank, every step
        rec.end_step(ids=ids, loss_sum=losses.sum(), loss_count=len(losses))
    rec.close()

``rec.step`` is :meth:`RunRecorder.begin_step` on entry, :meth:`RunRecorder.end_step` on a
normal exit and :meth:`RunRecorder.fail` with the error when the block raises (one
implementation). The loss recorded is the rank's own unweighted mean (:class:`StepState`), so
that every arm of an A/B records the same quantity. :meth:`RunRecorder.global_ids` gathers the
global batch's IDs per table from each rank's own (:mod:`fsobs.collect.batch_ids`) on a gloo
group of the recorder's own (``fsobs_recorder`` in a trace's process groups), made in
``__init__`` (collective then) when the world size is > 1.

**A step that raised**, with begin/end: ``fail(error)`` records it (the loop's ``except``),
as the block does. A loop that does not call it is noticed: :meth:`RunRecorder.close` inside
the open step (a ``finally``) fails the run with the exception being handled as the reason and
lets it propagate; with no exception, or a :meth:`RunRecorder.begin_step` while a step is open
(a loop that caught the error and went on), the run is failed ("step N never ended") and a
``RuntimeError`` says so. ``end_step()`` without ``begin_step()`` raises ``RuntimeError`` and
changes nothing.

Everything goes through the run format (:mod:`fsobs.runformat`): ``rank<R>.trace.json.gz``
(:class:`~fsobs.collect.profiler.StepProfiler`), ``steps.rank<R>.jsonl`` (one
:class:`~fsobs.runformat.StepRecord` per step: the lengths, the cost model's estimate, the
loss, the GC pauses and CPU time of :class:`~fsobs.collect.pauses.StepMonitor`, the ID
overlap with the previous step when the loop passes the ids (or the shares themselves), and
the sample ids and balance fields the loop sets on its :class:`StepState`) and ``run.json``
(rank 0). Rank
and world size come from ``torch.distributed`` when it is initialized, else 0 and 1.

**Step windows.** The profiler is advanced when the next block begins (``begin_step``), not
when a block ends, so ``ProfilerStep#N`` runs from the start of block N to the start of block
N+1 (the last one to :meth:`RunRecorder.close`)::

    loop:     [== block 0 ==] fetch [== block 1 ==] fetch [== block 2 ==] close()
    trace:    |ProfilerStep#0 ......|ProfilerStep#1 ......|ProfilerStep#2 .....|
    sidecar:  [wall 0       ]       [wall 1       ]       [wall 2       ]

The range open when the profiler stops is therefore always a whole step. torch's own
convention (``prof.step()`` after each step) leaves a range open after the last step, which
stopping cuts and exports as a trailing step that no sidecar line has (``fsobs whatif`` then
fails: "the sidecar of rank 0 has none for step N"). With live windows
(``ProfilerConfig(every=N)``) ``close()`` advances the profiler once more, so a window that
ends with the last step closes whole and is published, and a window the loop ends inside is
dropped (:mod:`fsobs.collect.live_windows`). The schedule is the
:class:`~fsobs.collect.profiler.ProfilerConfig`'s, counted in blocks; a loop that ends before
the active window does exports the steps recorded so far, each whole; one that ends before
any step was recorded leaves no trace. Whatever the loop does between two blocks (fetching
the next batch) counts in the step before; the sidecar's wall bounds are the block's.

**Status.** Rank 0 writes ``run.json`` as ``incomplete`` (reason ``running``) when the recorder
is made; :meth:`RunRecorder.close` publishes each rank's files, all-gathers the ranks' host
names and whether each left a trace (so every rank has closed its files), and rank 0 rewrites
it ``complete``, or ``incomplete`` naming the ranks without a trace. A block that raises gets
no sidecar line: the rank stops profiling (the profiler keeps an earlier whole cycle, else
exports what it recorded, the failing step cut where it raised) and leaves its sidecar
``.partial``. Alone (world size 1) it then finalizes the run
(:func:`fsobs.runformat.finalize_incomplete`: the sidecar published, ``run.json`` incomplete
with the error as the reason); with more ranks rank 0 records its error as the reason, and
``finalize_incomplete`` is for whoever sees every rank exit (as ``fsobs run`` does for the
reference job).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from fsobs.collect.batch_ids import IntArray, gather_ids, int_array
from fsobs.collect.id_overlap import TableIds, id_overlaps
from fsobs.collect.pauses import StepMonitor
from fsobs.collect.profiler import ProfilerConfig, StepProfiler
from fsobs.runformat import (
    RunMeta,
    SidecarWriter,
    StepRecord,
    ToggleStatus,
    finalize_incomplete,
    mark_incomplete,
    write_run_json,
)
from optim.config import TOGGLES
from optim.padded import rank_cost

logger = logging.getLogger(__name__)

__all__ = ["RunRecorder", "StepState", "ToggleSource"]

CostFn = Callable[[np.ndarray], np.ndarray]
"""Per-sample cost from per-sample lengths (an ``optim.balance.CostModel`` without ids term)."""


class ToggleSource(Protocol):
    """What the recorder reads from ``optim.FreeScale`` (duck-typed: fsobs never needs it)."""

    def status(self) -> Mapping[str, Mapping[str, Any]]:
        """Per toggle, ``{"requested", "applied", "reason"}``."""
        ...

    def layout(self) -> Mapping[str, Any]:
        """The process groups by role (``run.json``'s ``process_groups``)."""
        ...


@dataclass
class StepState:
    """One step as the loop describes it: :meth:`RunRecorder.begin_step` returns it (``with
    rec.step(...) as s`` yields it), and the loop may set its fields until the step ends.

    **The loss** is the rank's own mean over its own loss terms, *unweighted*: ``loss``, or
    ``loss_sum`` (the plain sum of the rank's per-sample, or per-token, losses) and
    ``loss_count`` (how many terms), recorded as ``loss_sum / loss_count``. Not the number the
    loop backpropagates: with FreeScale that is ``loss_weight · Σ l`` (``W/N`` for a mean over
    a global batch of ``N`` samples on ``W`` ranks, :func:`optim.weights.loss_weight`), whose
    scale depends on the share's size, while the baseline's ``mean(l)`` does not. The
    unweighted mean means the same in every arm, so the arms' losses compare."""

    step: int
    lengths: IntArray | None = None
    """Per-sample sequence lengths of this rank's samples (required by the block's end)."""
    ids: Mapping[str, IntArray] | None = None
    """Per embedding table, the IDs of the step's global batch (every rank's samples, every
    feature the table looks up): the same on every rank. Gives the sidecar's ``id_overlap``."""
    loss: float | torch.Tensor | None = None
    """This rank's unweighted mean loss of the step (class docstring)."""
    loss_sum: float | torch.Tensor | None = None
    """Instead of ``loss``: the unweighted sum of this rank's loss terms ..."""
    loss_count: int | torch.Tensor | None = None
    """... and their number (0: an empty share, no loss recorded)."""
    sample_ids: IntArray | None = None
    """The dataset index of each sample, in the order of ``lengths`` (optional)."""
    imbalance_before: float | None = None
    """Max / mean estimated cost over the ranks under the random split (the balance's plan)."""
    imbalance_after: float | None = None
    """The same under the split used."""
    batch_digest: str | None = None
    """A digest of the step's global batch (``optim.plan.batch_digest``): equal digests, the
    same samples."""
    id_overlap: Mapping[str, float] | None = None
    """Instead of ``ids``, for a loop that works the shares out itself (off the step): per
    table, the share of the global batch's ID occurrences the previous step's had."""


class RunRecorder:
    """Writes one rank's part of a run into ``run_dir`` (module docstring).

    ``freescale``: the toggles' status and process groups (``optim.FreeScale``); without one
    every toggle is recorded off. ``cost_model``: the sidecar's ``est_cost`` (the sum over the
    rank's samples; a padded ``CostModel``'s batch cost); without one it is null.
    ``profiler``: the schedule, in blocks (default :class:`ProfilerConfig`'s). ``name``
    (default: the directory's name) and ``workload`` (free-form) go into ``run.json``.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        freescale: ToggleSource | None = None,
        cost_model: CostFn | None = None,
        profiler: ProfilerConfig | None = None,
        name: str | None = None,
        workload: Mapping[str, Any] | None = None,
    ) -> None:
        for method in ("status", "layout"):
            if freescale is not None and not callable(getattr(freescale, method, None)):
                raise ValueError(
                    f"freescale: needs a {method}() method, got {type(freescale).__name__}"
                )
        if cost_model is not None and not callable(cost_model):
            raise ValueError(f"cost_model: must be callable, got {type(cost_model).__name__}")
        if workload is not None and not isinstance(workload, Mapping):
            raise ValueError(f"workload: must be a mapping, got {type(workload).__name__}")
        self.run_dir = Path(run_dir)
        self.rank, self.world_size, backend = _process_group()
        self._freescale = freescale
        self._cost_model = cost_model
        self._profiler = StepProfiler(self.run_dir, self.rank, profiler or ProfilerConfig())
        self._monitor = StepMonitor(trace_ranges=self._profiler.enabled)
        self._sidecar = SidecarWriter(self.run_dir, self.rank)  # refuses a used directory
        self._run_fields: dict[str, Any] = {
            "name": name or self.run_dir.resolve().name,
            "world_size": self.world_size,
            "backend": backend,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "workload": dict(workload or {}),
        }
        self._group = (
            dist.new_group(backend="gloo", group_desc="fsobs_recorder")
            if self.world_size > 1
            else None
        )
        """The recorder's own group (gloo): its collectives never run on the training's."""
        self._next_step = 0
        self._started = False
        """Whether the profiler and the monitor run (from the first step's block on)."""
        self._current: tuple[StepState, int] | None = None
        """The open step and its wall-clock start (ns), between begin_step and end_step."""
        self._state = "open"
        self._previous_ids: TableIds | None = None
        if self.rank == 0:
            write_run_json(self.run_dir, self._run_meta("incomplete", "running", ()))

    def begin_step(
        self,
        step: int,
        *,
        lengths: IntArray | None = None,
        ids: Mapping[str, IntArray] | None = None,
    ) -> StepState:
        """Begin step ``step``: its profiler step starts here and its sidecar line's wall clock
        (:meth:`end_step` ends both). Steps are numbered 0, 1, 2, ... as the profiler numbers
        them (``ValueError`` naming ``step`` otherwise). Inside an open step it fails the run
        and raises ``RuntimeError`` (see "A step that raised" in the class docstring)."""
        if self._state != "open":
            raise RuntimeError(f"RunRecorder is {self._state}: no step can be recorded")
        if self._current is not None:
            open_step = self._current[0].step
            self._fail_open(f"begin_step({step!r}) inside step {open_step}, never ended")
            raise RuntimeError(
                f"RunRecorder.begin_step({step!r}): step {open_step} has not ended (call "
                "end_step(), or fail(error) when it raised); the run is marked failed"
            )
        self._advance(step)
        self._current = (StepState(step=int(step), lengths=lengths, ids=ids), time.time_ns())
        return self._current[0]

    def end_step(
        self,
        *,
        lengths: IntArray | None = None,
        ids: Mapping[str, IntArray] | None = None,
        loss: float | torch.Tensor | None = None,
        loss_sum: float | torch.Tensor | None = None,
        loss_count: int | torch.Tensor | None = None,
    ) -> None:
        """End the open step and write its sidecar line. What is given here replaces what
        :meth:`begin_step` was given or the loop set on its :class:`StepState`; ``lengths`` are
        required by now. The loss is the rank's own *unweighted* mean (:class:`StepState`):
        ``loss``, or ``loss_sum / loss_count`` over its loss terms (none with a count of 0).
        Bad input fails the run (the step is lost) and raises ``ValueError`` naming the field."""
        if self._current is None:
            raise RuntimeError(
                "RunRecorder.end_step() without begin_step()"
                if self._state == "open"
                else f"RunRecorder is {self._state}: no step can be recorded"
            )
        state, start = self._current
        end = time.time_ns()
        try:
            for name, value in (
                ("lengths", lengths),
                ("ids", ids),
                ("loss", loss),
                ("loss_sum", loss_sum),
                ("loss_count", loss_count),
            ):
                if value is not None:
                    setattr(state, name, value)
            self._record(state, start, end)
        except BaseException as error:
            self.fail(error)
            raise
        self._current = None

    @contextlib.contextmanager
    def step(
        self,
        step: int,
        *,
        lengths: IntArray | None = None,
        ids: Mapping[str, IntArray] | None = None,
    ) -> Iterator[StepState]:
        """One training step as a block: :meth:`begin_step` on entry, :meth:`end_step` on a
        normal exit, :meth:`fail` with the error when the block raises."""
        state = self.begin_step(step, lengths=lengths, ids=ids)
        try:
            yield state
        except BaseException as error:
            self.fail(error)
            raise
        self.end_step()

    def fail(self, error: BaseException) -> None:
        """Record that the loop failed with ``error``: inside a step (after
        :meth:`begin_step`) the step gets no sidecar line and is cut in the trace where this is
        called; between steps the recorded steps stay. Either way the run is marked incomplete
        with the error as the reason (module docstring, "Status"), and nothing more is
        recorded. Does nothing after a close or an earlier failure."""
        where = "between steps" if self._current is None else f"in step {self._current[0].step}"
        self._fail(f"rank {self.rank}: {type(error).__name__} {where}: {error}", error)

    def global_ids(self, local: Mapping[str, IntArray]) -> dict[str, np.ndarray]:
        """Per table, the IDs of the step's global batch from each rank's own ``local`` IDs:
        every rank's concatenated in rank order, the same on every rank (what ``ids`` wants).
        Collective on the recorder's own gloo group (call it on every rank, with the same table
        names, a rank's table may be empty); ``local`` as int64 arrays when alone. With
        torchrec, ``local`` can be :func:`~fsobs.collect.batch_ids.table_ids` of the rank's
        ``KeyedJaggedTensor``."""
        return gather_ids(local, self._group, self.world_size)

    def close(self) -> None:
        """Finish this rank's files and, on rank 0, write the final ``run.json``. Collective
        when ``torch.distributed`` is initialized: call it on every rank. Does nothing after a
        failed step or a first close.

        Inside an open step (:meth:`begin_step` without :meth:`end_step`) it fails the run
        instead: with the exception being handled when there is one (``close()`` in a
        ``finally`` as the step's error propagates: that error is the reason, and it goes on
        alone), else with "close() inside step N" and a ``RuntimeError``."""
        if self._state != "open":
            return
        if self._current is not None:
            handling = sys.exc_info()[1]
            if handling is not None:
                self.fail(handling)
                return
            open_step = self._current[0].step
            self._fail_open(f"close() inside step {open_step}, never ended")
            raise RuntimeError(
                f"RunRecorder.close() inside step {open_step}: end_step() was never called "
                "(fail(error) when the step raised); the run is marked failed"
            )
        self._state = "closed"
        export_error: Exception | None = None
        if self._started:
            try:
                if self._profiler.live is not None:  # the last step's window closes whole
                    self._profiler.step()
                self._profiler.__exit__(None, None, None)
            except Exception as error:  # the trace is missing: say so in run.json, then raise
                export_error = error
            self._monitor.__exit__()
        self._sidecar.close()
        self._write_final_meta()
        if export_error is not None:
            raise export_error

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.fail(exc)

    def _advance(self, step: int) -> None:
        """Check ``step`` and start its profiler step and pause monitoring."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step: must be an integer, got {step!r}")
        if step != self._next_step:
            raise ValueError(
                f"step: expected {self._next_step} (steps are numbered 0, 1, 2, ... like the "
                f"profiler's ProfilerStep#N), got {step!r}"
            )
        if self._started:
            self._profiler.step()  # ends ProfilerStep#(step-1) here: see the module docstring
        else:
            self._profiler.__enter__()  # ProfilerStep#0 begins
            self._monitor.__enter__()
            self._started = True
        self._monitor.begin()

    def _record(self, state: StepState, start: int, end: int) -> None:
        pauses = self._monitor.end().fields() if self._profiler.enabled else {}
        if state.lengths is None:
            raise ValueError(
                f"lengths: step {self._next_step} ended without them (begin_step(step, "
                "lengths=...), end_step(lengths=...) or s.lengths = ... before the end)"
            )
        lengths = int_array(state.lengths, "lengths")
        loss = _mean_loss(state)
        cost = None if self._cost_model is None else rank_cost(self._cost_model, lengths)
        overlap = self._id_overlap(state.ids)
        if state.id_overlap is not None:
            if state.ids is not None:
                raise ValueError("id_overlap: give either ids or id_overlap, not both")
            overlap = dict(state.id_overlap)
        record = StepRecord.of(
            self._next_step,
            lengths,
            cost,
            start,
            end,
            sample_ids=state.sample_ids,
            loss=loss,
            imbalance_before=state.imbalance_before,
            imbalance_after=state.imbalance_after,
            batch_digest=state.batch_digest,
            id_overlap=overlap,
            **pauses,
        )
        self._sidecar.write(record)
        self._next_step += 1

    def _id_overlap(self, ids: Mapping[str, IntArray] | None) -> dict[str, float] | None:
        """The share per table of this step's IDs the previous step had (None without the ids
        of both)."""
        if ids is not None and not isinstance(ids, Mapping):
            raise ValueError(f"ids: must map table -> IDs, got {type(ids).__name__}")
        current = None if ids is None else {t: int_array(v, f"ids[{t!r}]") for t, v in ids.items()}
        previous, self._previous_ids = self._previous_ids, current
        if previous is None or current is None:
            return None
        return id_overlaps((previous, current))[1]

    def _fail_open(self, reason: str) -> None:
        """Fail the run for a step left open by the loop (no exception to hand on)."""
        self._fail(f"rank {self.rank}: {reason}", RuntimeError(reason))

    def _fail(self, reason: str, error: BaseException) -> None:
        if self._state != "open":
            return
        self._state = "failed"
        self._current = None
        logger.error("run %s, %s", self.run_dir, reason)
        if self._started:
            self._profiler.__exit__(type(error), error, error.__traceback__)
            self._monitor.__exit__()
        self._sidecar.abandon()
        if self.world_size == 1:
            finalize_incomplete(self.run_dir, reason)
        elif self.rank == 0:
            mark_incomplete(self.run_dir, reason, ())

    def _write_final_meta(self) -> None:
        """All-gather (host, has a trace) and write the final ``run.json`` on rank 0."""
        mine = (socket.gethostname(), self._profiler.published)
        everyone: list[Any] = [mine]
        if self.world_size > 1:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine, group=self._group)
        if self.rank != 0:
            return
        present = tuple(rank for rank, (_, traced) in enumerate(everyone) if traced)
        missing = sorted(set(range(self.world_size)) - set(present))
        hosts = tuple(sorted({host for host, _ in everyone}))
        if missing:
            reason = (
                f"no trace from ranks {missing} (profiling disabled, the loop ended before a "
                "step was recorded, or the export failed)"
            )
            meta = self._run_meta("incomplete", reason, present, hosts)
        else:
            meta = self._run_meta("complete", None, present, hosts)
        write_run_json(self.run_dir, meta)

    def _run_meta(
        self,
        status: str,
        reason: str | None,
        present: tuple[int, ...],
        hosts: tuple[str, ...] = (),
    ) -> RunMeta:
        toggles = {name: ToggleStatus(requested=False, applied=False) for name in TOGGLES}
        groups = None
        if self._freescale is not None:
            toggles = {n: ToggleStatus(**t) for n, t in self._freescale.status().items()}
            groups = dict(self._freescale.layout()) if status == "complete" else None
        return RunMeta.now(
            **self._run_fields,
            hosts=hosts,
            toggles=toggles,
            status=status,
            reason=reason,
            ranks_present=present,
            process_groups=groups,
        )


def _process_group() -> tuple[int, int, str | None]:
    """Rank, world size and backend of the default group; 0, 1, None without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    return 0, 1, None


def _mean_loss(state: StepState) -> float | None:
    """The step's loss as recorded: ``state.loss``, or ``loss_sum / loss_count`` (None with
    no terms); ``ValueError`` naming the field for a mix of both or a bad count."""
    if state.loss_sum is None and state.loss_count is None:
        return None if state.loss is None else float(state.loss)
    if state.loss is not None:
        raise ValueError("loss: give either loss or loss_sum and loss_count, not both")
    if state.loss_sum is None or state.loss_count is None:
        raise ValueError("loss_count: loss_sum and loss_count go together")
    count = state.loss_count
    count = int(count.item()) if isinstance(count, torch.Tensor) else count
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"loss_count: must be an integer >= 0, got {state.loss_count!r}")
    return None if count == 0 else float(state.loss_sum) / int(count)
