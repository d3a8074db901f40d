"""Record a run from any training loop: the per-rank trace, the step sidecar and ``run.json``.

::

    rec = RunRecorder(run_dir, freescale=fs, cost_model=fs.cost_model,
                      profiler=ProfilerConfig.every_step(num_steps))
    for step, batch in enumerate(loader):
        with rec.step(step, lengths=batch_lengths, ids=table_ids) as s:
            loss = train_step(batch); s.loss = loss.item()
    rec.close()

Everything goes through the run format (:mod:`fsobs.runformat`): ``rank<R>.trace.json.gz``
(:class:`~fsobs.collect.profiler.StepProfiler`), ``steps.rank<R>.jsonl`` (one
:class:`~fsobs.runformat.StepRecord` per step: the lengths, the cost model's estimate, the
loss, the GC pauses and CPU time of :class:`~fsobs.collect.pauses.StepMonitor`, and the ID
overlap with the previous step when the loop passes the ids) and ``run.json`` (rank 0). Rank
and world size come from ``torch.distributed`` when it is initialized, else 0 and 1.

**Step windows.** The profiler is advanced when the next block begins, not when a block ends,
so ``ProfilerStep#N`` runs from the start of block N to the start of block N+1 (the last one
to :meth:`RunRecorder.close`)::

    loop:     [== block 0 ==] fetch [== block 1 ==] fetch [== block 2 ==] close()
    trace:    |ProfilerStep#0 ......|ProfilerStep#1 ......|ProfilerStep#2 .....|
    sidecar:  [wall 0       ]       [wall 1       ]       [wall 2       ]

The range open when the profiler stops is therefore always a whole step. torch's own
convention (``prof.step()`` after each step) leaves a range open after the last step, which
stopping cuts and exports as a trailing step that no sidecar line has (``fsobs whatif`` then
fails: "the sidecar of rank 0 has none for step N"). The schedule is the
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
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

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
from fsobs.workload.overlap import TableIds, id_overlaps
from optim.config import TOGGLES
from optim.padded import rank_cost

logger = logging.getLogger(__name__)

__all__ = ["RunRecorder", "StepState", "ToggleSource"]

IntArray = Sequence[int] | np.ndarray | torch.Tensor
"""Integers per sample or per ID: a sequence, a 1-D numpy array or a 1-D tensor."""
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
    """One step as the loop describes it; the block may set ``lengths``, ``ids`` and ``loss``."""

    step: int
    lengths: IntArray | None = None
    """Per-sample sequence lengths of this rank's samples (required by the block's end)."""
    ids: Mapping[str, IntArray] | None = None
    """Per embedding table, the IDs of the step's global batch (every rank's samples, every
    feature the table looks up): the same on every rank. Gives the sidecar's ``id_overlap``."""
    loss: float | None = None
    """This rank's training loss of the step."""


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
        self._next_step = 0
        self._started = False
        """Whether the profiler and the monitor run (from the first step's block on)."""
        self._in_step = False
        self._state = "open"
        self._previous_ids: TableIds | None = None
        if self.rank == 0:
            write_run_json(self.run_dir, self._run_meta("incomplete", "running", ()))

    @contextlib.contextmanager
    def step(
        self,
        step: int,
        *,
        lengths: IntArray | None = None,
        ids: Mapping[str, IntArray] | None = None,
    ) -> Iterator[StepState]:
        """One training step: its profiler step and its sidecar line. Steps are numbered 0, 1,
        2, ... as the profiler numbers them (``ValueError`` naming ``step`` otherwise)."""
        self._begin(step)
        state = StepState(step=int(step), lengths=lengths, ids=ids)
        start = time.time_ns()
        try:
            yield state
            self._record(state, start, time.time_ns())
        except BaseException as error:
            self._fail(f"rank {self.rank}: {type(error).__name__} in step {step}: {error}", error)
            raise
        finally:
            self._in_step = False

    def close(self) -> None:
        """Finish this rank's files and, on rank 0, write the final ``run.json``. Collective
        when ``torch.distributed`` is initialized: call it on every rank. Does nothing after a
        failed step or a first close."""
        if self._state != "open":
            return
        if self._in_step:
            raise RuntimeError("RunRecorder.close() called inside a step block")
        self._state = "closed"
        export_error: Exception | None = None
        if self._started:
            try:
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
            self._fail(f"rank {self.rank}: {type(exc).__name__} between steps: {exc}", exc)

    def _begin(self, step: int) -> None:
        if self._state != "open":
            raise RuntimeError(f"RunRecorder is {self._state}: no step can be recorded")
        if self._in_step:
            raise RuntimeError(f"step {step} begun inside step {self._next_step}'s block")
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
        self._in_step = True
        self._monitor.begin()

    def _record(self, state: StepState, start: int, end: int) -> None:
        pauses = self._monitor.end().fields() if self._profiler.enabled else {}
        if state.lengths is None:
            raise ValueError(
                f"lengths: step {self._next_step} ended without them (rec.step(step, lengths=...) "
                "or s.lengths = ... in the block)"
            )
        lengths = _array(state.lengths, "lengths")
        cost = None if self._cost_model is None else rank_cost(self._cost_model, lengths)
        record = StepRecord.of(
            self._next_step,
            lengths,
            cost,
            start,
            end,
            loss=state.loss,
            id_overlap=self._id_overlap(state.ids),
            **pauses,
        )
        self._sidecar.write(record)
        self._next_step += 1

    def _id_overlap(self, ids: Mapping[str, IntArray] | None) -> dict[str, float] | None:
        """The share per table of this step's IDs the previous step had (None without the ids
        of both)."""
        if ids is not None and not isinstance(ids, Mapping):
            raise ValueError(f"ids: must map table -> IDs, got {type(ids).__name__}")
        current = None if ids is None else {t: _array(v, f"ids[{t!r}]") for t, v in ids.items()}
        previous, self._previous_ids = self._previous_ids, current
        if previous is None or current is None:
            return None
        return id_overlaps((previous, current))[1]

    def _fail(self, reason: str, error: BaseException) -> None:
        if self._state != "open":
            return
        self._state = "failed"
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
        mine = (socket.gethostname(), self._profiler.trace_path.exists())
        everyone: list[Any] = [mine]
        if self.world_size > 1:
            everyone = [None] * self.world_size
            dist.all_gather_object(everyone, mine)
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


def _array(values: IntArray, name: str) -> np.ndarray:
    """``values`` as a 1-D int64 array (``ValueError`` naming the field otherwise)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name}: must be a 1-D sequence of integers, got {values!r}")
    return array.astype(np.int64, copy=False)
