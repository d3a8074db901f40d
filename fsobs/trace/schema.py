"""The trace model: one events table per rank, plus the run that holds them.

``RankTrace.events`` columns (one row per complete event, i.e. every event with a ``dur``, in
file order; profiler spans of cat ``Trace`` are dropped, and so are events far outside the
trace's span, with a warning: :mod:`fsobs.trace._plausible`):

=============  ============  ================================================================
column         dtype         meaning
=============  ============  ================================================================
ts_ns          int64         start, absolute nanoseconds since the epoch (base + ts for new
                             traces, ts * 1000 for old absolute-microsecond traces)
dur_ns         int64         duration in nanoseconds
name           category      event name
cat            category      Kineto category (``kernel``, ``cpu_op``, ...), by today's name
                             (``Operator`` of 2021 traces is ``cpu_op``: :mod:`._legacy`);
                             NaN when absent
kind           category      compute, comm, memcpy, memset, sync, runtime, annotation, step,
                             other (see :mod:`fsobs.trace.classify`)
device         category      ``gpu`` (device-side event) or ``cpu``
pid, tid       category      process / thread (strings; GPU events: device / stream)
stream         int64         CUDA stream, -1 on CPU events
correlation    int64         launch <-> kernel correlation id, -1 when absent
step           int32         step the event belongs to, -1 outside any step; GPU events
                             inherit the step of their launch (via correlation); 0 for every
                             event of a trace without steps (one whole-trace window)
event_index    int32         position of the event in the file's ``traceEvents``
shape_key      int64         hash of a CPU op's ``Input Dims`` or a kernel's ``grid`` and
                             ``block``, 0 when absent (contention compares like with like)
hta_ts         float64       start in the trace's own microseconds with HTA's ns rounding
hta_end        float64       end likewise (only :mod:`fsobs.analysis.hta` uses these two)
=============  ============  ================================================================

``RankTrace.collectives`` has one row per communication event (``kind == "comm"``):

============  ========  ===================================================================
row           int64     row number of the event in ``events``
coll          category  collective: all_reduce, all_to_all, all_gather, reduce_scatter,
                        broadcast, reduce, barrier, send, recv, sendrecv, p2p_copy,
                        transfer, ...
pg_name       category  process group name (``"0"`` or a hash), NaN when unknown (gloo)
pg_desc       category  process group description (``default_pg``, ...)
pg_ranks      category  the group's ranks, as the trace writes them (``"[0, 1]"``)
group_size    int32     number of ranks in the group, -1 when unknown
seq           int64     per-group sequence number (cross-rank matching key), -1 when absent
in_nelems     int64     input elements, -1 when unknown
out_nelems    int64     output elements, -1 when unknown
dtype         category  element type (``Float``, ``float``, ...)
msg_bytes     int64     input message size in bytes, -1 when unknown
in_split      category  input split sizes (all_to_allv), as written
out_split     category  output split sizes, as written
comms_id      uint64    NCCL ``Comms Id`` (can exceed int64), 0 when absent
source        category  where the metadata came from: ``args``, ``record_param_comms``,
                        ``annotation`` (enclosing ``nccl:*``), ``kernel_name``, ``gloo``,
                        ``launch_context`` (a copy or kernel launched inside a collective's
                        call: coll ``transfer``)
role          category  ``embedding``, ``dense`` or ``other`` from FreeScale's marker around the
                        issue, or a PEC role (``pec_overlapped``, ...) from torchrec's PEC range
                        around it (``optim.markers``); NaN when the trace does not say
enqueue_ns    int64     gloo: when the training thread enqueued the collective (the start of
                        its ``c10d::*`` op; the gloo event starts when a worker takes it from the
                        group's queue), -1 when unknown
============  ========  ===================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import numpy as np
import pandas as pd

from fsobs.runformat.runmeta import RunMeta
from fsobs.trace.categorical import is_in

if TYPE_CHECKING:
    from fsobs.storage import Location

KINDS = ("compute", "comm", "memcpy", "memset", "sync", "runtime", "annotation", "step", "other")

EVENT_COLUMNS = (
    "ts_ns",
    "dur_ns",
    "name",
    "cat",
    "kind",
    "device",
    "pid",
    "tid",
    "stream",
    "correlation",
    "step",
    "event_index",
    "shape_key",
    "hta_ts",
    "hta_end",
)

COLLECTIVE_COLUMNS = (
    "row",
    "coll",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "group_size",
    "seq",
    "in_nelems",
    "out_nelems",
    "dtype",
    "msg_bytes",
    "in_split",
    "out_split",
    "comms_id",
    "source",
    "role",
    "enqueue_ns",
)


@dataclass(frozen=True)
class ProcessGroup:
    """One entry of ``distributedInfo.pg_config``."""

    name: str
    desc: str
    size: int
    ranks: tuple[int, ...]


@dataclass
class RankTrace:
    """The trace of one rank."""

    path: Location
    rank: int
    world_size: int
    backend: str | None
    host_name: str | None
    base_time_ns: int | None
    time_format: str
    """``relative-us`` (ts relative to baseTimeNanoseconds) or ``absolute-us``."""
    process_groups: tuple[ProcessGroup, ...]
    device_properties: list[dict[str, Any]]
    thread_names: dict[str, str]
    events: pd.DataFrame
    collectives: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    step_source: str = "ProfilerStep"
    """What the steps are: ``ProfilerStep``, the step marker given, or ``whole trace`` (one
    window, step 0)."""

    @property
    def device(self) -> str:
        """``gpu`` when the trace has device-side events, else ``cpu``."""
        return "gpu" if bool(is_in(self.events["device"], ("gpu",)).any()) else "cpu"

    @cached_property
    def steps(self) -> list[int]:
        """Step numbers recorded on this rank, in order (``[0]`` for a whole-trace window)."""
        if self.step_source == "whole trace":
            return [0]
        marks = self.events["step"].to_numpy()[is_in(self.events["kind"], ("step",))]
        return cast(list[int], np.unique(marks).tolist())


class RankLike(Protocol):
    """What a :class:`Run` asks of its ranks."""

    @property
    def device(self) -> str: ...
    @property
    def steps(self) -> list[int]: ...


R = TypeVar("R", bound=RankLike)


@dataclass
class Run(Generic[R]):
    """All ranks of one run (or the subset that was loaded).

    ``Run[RankTrace]`` holds the full event tables (:func:`fsobs.load_run`); the analyzer's
    streaming path holds a compact summary per rank instead (``Run[RankSummary]``). Both rank
    types have ``device``, ``steps``, ``host_name`` and ``path``.
    """

    path: Location
    world_size: int
    ranks: dict[int, R]
    meta: RunMeta | None
    """The run's ``run.json`` when present (docs/design.md §3), else None."""
    warnings: list[str] = field(default_factory=list)
    sidecar: pd.DataFrame | None = None
    """The step sidecars (:func:`fsobs.runformat.steps.read_sidecars`), None without any."""

    @property
    def rank_ids(self) -> list[int]:
        return sorted(self.ranks)

    @property
    def device(self) -> str:
        return "gpu" if any(r.device == "gpu" for r in self.ranks.values()) else "cpu"

    @cached_property
    def steps(self) -> list[int]:
        """Step numbers recorded on every loaded rank."""
        common: set[int] | None = None
        for trace in self.ranks.values():
            steps = set(trace.steps)
            common = steps if common is None else common & steps
        return sorted(common or ())

    def __getitem__(self, rank: int) -> R:
        return self.ranks[rank]
