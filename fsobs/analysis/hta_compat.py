"""HTA-compatible GPU metrics, computed by our own code with HolisticTraceAnalysis 0.5.0's rules.

Temporal breakdown, communication/computation overlap and per-stream idle-time breakdown give the
same numbers as ``hta.trace_analysis.TraceAnalysis`` 0.5.0 with default settings (the test suite
runs HTA live on every GPU reference trace and compares). The rules (``shared/notes/kineto_hta.md``
§4) are reproduced on purpose, quirks included:

1. HTA keeps events that have ``dur`` and ``cat`` (not ``Trace``), in the trace's own microseconds,
   rounded (``ceil(ts)``, ``floor(ts + dur)``) when any timestamp is fractional.
2. When two or more distinct ``ProfilerStep`` names exist across the loaded ranks, each rank drops
   CPU rows starting at or after its last ProfilerStep and keeps a GPU row once per kept CPU row
   with the same correlation id (so a kernel whose launch is dropped disappears with it).
3. Kernel classes come from the name only (``^nccl`` = communication, ``Memcpy``/``Memset`` =
   memory, other non-compute patterns = other, the rest = computation).
4. Unions are HTA's ``merge_kernel_intervals`` (:func:`_hta_merge`), not a plain union. After
   rule 1 an event shorter than 1 µs can have ``ceil(ts) > floor(ts + dur)``, i.e. length -1
   (e.g. ``ts=…085.167, dur=0.768`` -> ``[086, 085)``). HTA sorts by ``ts`` with pandas' default
   quicksort (ties in no fixed order), starts a group where ``ts`` exceeds every earlier end,
   and sums ``max end - min ts`` per group. A -1 event that starts a group therefore counts -1
   µs; one inside another event's span, or sorted after a tie partner, counts 0. A -1
   ``Memset (Device)`` between kernels thus adds 1 µs of idle time (and removes 1 µs of
   non-compute). A -1 compute kernel under an NCCL/RCCL kernel adds nothing to the all-GPU
   union but removes 1 µs of compute (and adds it to non-compute). Such events made a plain
   union differ from HTA by 12 µs of idle on an H100 trace and by 21 µs of compute on an MI300X
   trace (``traces/reference/tracelens_*``). The temporal breakdown merges all GPU rows first;
   that sorts HTA's frame in place, so the computation rows are merged in that sorted order.
   ``kernel_time`` is the last merged group's end minus the first group's start. Both are
   taken after the groups are sorted again by start. When the all-GPU union loses more -1
   groups than the compute union does, ``non_compute`` comes out negative. HTA then fails its
   own ``assert non_compute_time >= 0`` (seen on TraceLens' H100
   ``Qwen_Qwen1.5-0.5B-Chat__1016005``: 22 isolated -1 memsets against 5 µs of other
   non-compute time give -17 µs); we return the value.
5. Comm/comp overlap is HTA's sweep over the merged groups' boundaries (+1/-1 communication,
   +2/-2 computation, overlapped where the running sum is 3). Its denominator is the
   communication groups' summed length, -1 groups included.

All times are microseconds; the column names say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.trace.categorical import codes, is_in
from fsobs.trace.schema import RankTrace

_COMM_RE = re.compile(r"(^nccl)")
_MEMORY_RE = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
_NON_COMPUTE_RE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(cuda.*LaunchKernel)|(^runFunction)"
)
_GPU_SYNC_NAMES = ("Event Sync", "Context Sync")
_IDLE_KERNEL_CATS = ("kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy")
_IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")  # HTA's IdleTimeType order
DEFAULT_KERNEL_DELAY_US = 30


def kernel_type(name: str) -> str:
    """HTA 0.5.0's ``get_kernel_type``: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    if _COMM_RE.match(name):
        return "COMMUNICATION"
    if _MEMORY_RE.match(name):
        return "MEMORY"
    if not _NON_COMPUTE_RE.match(name):
        return "COMPUTATION"
    return "OTHER"


@dataclass
class HtaView:
    """One rank as HTA sees it after loading and filtering: a frame in HTA's row order."""

    rank: int
    frame: pd.DataFrame
    """Columns: ts, end (µs), stream, name, cat, ts_runtime."""


@dataclass
class HtaMetrics:
    """HTA-compatible GPU metrics: the three tables, one or more rows per rank."""

    temporal_breakdown: pd.DataFrame
    comm_comp_overlap: pd.DataFrame
    idle_time_breakdown: pd.DataFrame


@dataclass
class HtaRows:
    """One rank's rows of the three tables of :class:`HtaMetrics`."""

    temporal: dict[str, float]
    overlap: dict[str, float]
    idle: list[dict[str, object]]


@dataclass
class RankHta:
    """One rank's metrics, computed where its events are (a parser worker).

    HTA filters every rank by its last ProfilerStep only when the *whole run* has two or more
    distinct ProfilerStep names, so a rank with fewer than two of its own carries both variants.
    """

    step_names: frozenset[str]
    variants: dict[bool, HtaRows]
    """filtered? -> rows."""


@dataclass(frozen=True)
class _Rows:
    """One rank's events as HTA loads them (rule 1), as arrays in trace order."""

    event_index: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    kind: np.ndarray
    """:func:`kernel_type` of the name, on the GPU rows (``stream != -1``, the only ones the
    tables classify); None elsewhere."""
    is_step: np.ndarray
    """The name is a ProfilerStep's."""
    is_gpu: np.ndarray
    idle_kernel: np.ndarray
    """The category is one the idle-time breakdown looks at."""
    step_names: frozenset[str]
    """The distinct ProfilerStep names."""

    @staticmethod
    def of(trace: RankTrace) -> _Rows:
        ev = trace.events
        cat = codes(ev["cat"])
        keep = np.flatnonzero(cat >= 0)
        names = [str(n) for n in ev["name"].cat.categories]
        name = codes(ev["name"])[keep]
        stream = ev["stream"].to_numpy()[keep]
        correlation = ev["correlation"].to_numpy()[keep]
        is_step = np.array(["ProfilerStep" in n for n in names], bool)
        is_sync = np.array([n in _GPU_SYNC_NAMES for n in names], bool)
        kinds = np.full(len(names), None, object)
        for c in np.unique(name[stream != -1]).tolist():  # the kernels' names only
            kinds[c] = kernel_type(names[c])
        return _Rows(
            event_index=ev["event_index"].to_numpy()[keep],
            ts=ev["hta_ts"].to_numpy()[keep],
            end=ev["hta_end"].to_numpy()[keep],
            stream=stream,
            correlation=correlation,
            kind=kinds[name],
            is_step=is_step[name],
            is_gpu=((stream >= 0) & (correlation >= 0)) | is_sync[name],
            idle_kernel=is_in(ev["cat"], _IDLE_KERNEL_CATS)[keep],
            step_names=frozenset(names[c] for c in np.unique(name[is_step[name]]).tolist()),
        )


def rank_hta(trace: RankTrace) -> RankHta:
    """HTA's metrics of one rank, for each filter decision the run as a whole may take."""
    rows = _Rows.of(trace)
    runtime_index = _runtime_ts_index(rows)
    variants = {}
    for filtered in (True,) if len(rows.step_names) >= 2 else (False, True):
        kept = _filter(rows) if filtered else np.arange(len(rows.ts))
        runtime = _resolve_runtime_ts(rows, kept, runtime_index[kept])
        variants[filtered] = _metric_rows(trace.rank, rows, kept, runtime)
    return RankHta(step_names=rows.step_names, variants=variants)


def _metric_rows(rank: int, rows: _Rows, kept: np.ndarray, runtime: np.ndarray) -> HtaRows:
    """The three tables' rows of one rank's ``kept`` rows (positions, in HTA's row order;
    ``runtime``: the ts of each one's launch)."""
    gpu = np.flatnonzero(rows.stream[kept] != -1)  # positions in kept
    kernels = gpu[rows.idle_kernel[kept[gpu]]]
    ts, end, kind = rows.ts[kept[gpu]], rows.end[kept[gpu]], rows.kind[kept[gpu]]
    return HtaRows(
        temporal=_temporal_row(rank, ts, end, kind),
        overlap=_overlap_row(rank, ts, end, kind),
        idle=_idle_rows(
            rank,
            rows.ts[kept[kernels]],
            rows.end[kept[kernels]],
            rows.stream[kept[kernels]],
            runtime[kernels],
            DEFAULT_KERNEL_DELAY_US,
        ),
    )


def combine_hta(ranks: dict[int, RankHta]) -> HtaMetrics:
    """The run's tables from its ranks' (rule 2: filter iff >= 2 ProfilerStep names in all)."""
    names = frozenset().union(*(r.step_names for r in ranks.values()))
    chosen = [ranks[r].variants[len(names) >= 2] for r in sorted(ranks)]
    return HtaMetrics(
        temporal_breakdown=_temporal_table([rows.temporal for rows in chosen]),
        comm_comp_overlap=_overlap_table([rows.overlap for rows in chosen]),
        idle_time_breakdown=_idle_table([row for rows in chosen for row in rows.idle]),
    )


def _runtime_ts_index(rows: _Rows) -> np.ndarray:
    """HTA's ``index_correlation``: the event index of the partner event, else min(corr, 0).

    A GPU row's partner is the last CPU row (in trace order) with its correlation id."""
    corr = rows.correlation
    index_corr: np.ndarray = np.minimum(corr, 0)
    has = corr != -1
    cpu = np.flatnonzero(has & ~rows.is_gpu)[::-1]  # last first
    gpu = np.flatnonzero(has & rows.is_gpu)
    ids, last = np.unique(corr[cpu], return_index=True)
    at = iv.position(ids, corr[gpu])
    index_corr[gpu[at >= 0]] = rows.event_index[cpu[last[at[at >= 0]]]]
    return index_corr


def _filter(rows: _Rows) -> np.ndarray:
    """Rule 2: the kept rows (positions), GPU rows first. The last step's CPU rows are dropped,
    and each GPU row is kept once per kept CPU row with its correlation id (so a kernel whose
    launch is dropped disappears with it)."""
    cpu = np.flatnonzero(~rows.is_gpu)
    gpu = np.flatnonzero(rows.is_gpu)
    steps = rows.ts[cpu[rows.is_step[cpu]]]
    cpu_kept = cpu[rows.ts[cpu] < steps.max()] if len(steps) else cpu[:0]
    launches = np.sort(rows.correlation[cpu_kept])
    corr = rows.correlation[gpu]
    repeat = np.searchsorted(launches, corr, "right") - np.searchsorted(launches, corr, "left")
    return np.concatenate([np.repeat(gpu, repeat), cpu_kept])


def _resolve_runtime_ts(rows: _Rows, kept: np.ndarray, index: np.ndarray) -> np.ndarray:
    """ts of the first kept row whose event index is ``index`` (NaN when absent)."""
    ids, first = np.unique(rows.event_index[kept], return_index=True)
    at = iv.position(ids, index)
    return np.where(at >= 0, rows.ts[kept][first[np.maximum(at, 0)]], np.nan)


def _kernel_types(frame: pd.DataFrame) -> np.ndarray:
    names = frame["name"]
    per_name = {n: kernel_type(n) for n in names.unique()}
    return names.map(per_name).to_numpy()


def _gpu_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ts, end and kernel type of a view's GPU rows (``stream != -1``), in its row order."""
    gpu = frame[frame["stream"] != -1]
    return gpu["ts"].to_numpy(), gpu["end"].to_numpy(), _kernel_types(gpu)


def temporal_breakdown(views: dict[int, HtaView]) -> pd.DataFrame:
    """HTA's ``get_temporal_breakdown``: idle, compute and non-compute time of the GPU per rank.

    ``kernel_time`` is the span from the first GPU event's start to the last one's end;
    ``idle`` is the part of it with no GPU event at all; ``compute`` the union of computation
    kernels; ``non_compute`` the rest::

        stream 7 |==comp==|   |==comp====|        |=comp=|
        stream 9      |====nccl======|
                 <------------- kernel_time ------------->
                          idle: ......        ....

    The unions are HTA's (:func:`_hta_merge`, rule 4 of the module docstring), so a rounded
    event of negative length can count -1 µs, and ``non_compute`` can come out negative where
    HTA itself stops on ``assert non_compute_time >= 0``.
    """
    return _temporal_table(
        [_temporal_row(rank, *_gpu_rows(view.frame)) for rank, view in views.items()]
    )


def _temporal_row(rank: int, ts: np.ndarray, end: np.ndarray, kind: np.ndarray) -> dict[str, float]:
    """:func:`temporal_breakdown` of one rank's GPU rows (in HTA's row order)."""
    if not len(ts):
        return {"rank": rank} | dict.fromkeys(_TB_VALUES, np.nan)
    starts, ends = _hta_merge(ts, end)
    # That merge sorts HTA's frame in place: the computation rows are taken (and sorted
    # again, ties included) in the order it left.
    order = _hta_argsort(ts)
    kernel_time = float(ends[-1] - starts[0])  # HTA: merged.iloc[-1].end - .iloc[0].ts
    idle = kernel_time - _hta_length(starts, ends)
    comp = order[kind[order] == "COMPUTATION"]
    compute = _hta_length(*_hta_merge(ts[comp], end[comp]))
    return {
        "rank": rank,
        "idle_time_us": idle,
        "compute_time_us": compute,
        "non_compute_time_us": kernel_time - compute - idle,
        "kernel_time_us": kernel_time,
    }


def _temporal_table(rows: list[dict[str, float]]) -> pd.DataFrame:
    result = pd.DataFrame(rows, columns=["rank", *_TB_VALUES])
    for part in ("idle_time", "compute_time", "non_compute_time"):
        ratio = result[f"{part}_us"] / result["kernel_time_us"]
        result[f"{part}_pctg"] = np.round(100 * ratio, 2)
    return result


_TB_VALUES = ("idle_time_us", "compute_time_us", "non_compute_time_us", "kernel_time_us")


def comm_comp_overlap(views: dict[int, HtaView]) -> pd.DataFrame:
    """HTA's ``get_comm_comp_overlap``: % of communication time overlapped by computation.

    ``100 * |comm ∩ comp| / |comm|`` over the unions of each class; NaN without comm kernels::

        comp |=======|      |====|
        comm     |=====|  |===|
                 ^^^^         ^^  overlapped

    As in HTA, the intersection is a sweep over the merged intervals' boundaries (+1/-1 at a
    communication start/end, +2/-2 at a computation one; overlapped where the running sum is 3),
    and the unions are HTA's (:func:`_hta_merge`), negative-length groups included.
    """
    return _overlap_table(
        [_overlap_row(rank, *_gpu_rows(view.frame)) for rank, view in views.items()]
    )


def _overlap_row(rank: int, ts: np.ndarray, end: np.ndarray, kind: np.ndarray) -> dict[str, float]:
    """:func:`comm_comp_overlap` of one rank's GPU rows (in HTA's row order)."""
    is_comp, is_comm = kind == "COMPUTATION", kind == "COMMUNICATION"
    comp = _hta_merge(ts[is_comp], end[is_comp])
    comm = _hta_merge(ts[is_comm], end[is_comm])
    times = np.concatenate([comm[0], comm[1], comp[0], comp[1]]).astype(np.float64)
    steps = np.repeat([1, -1, 2, -2], [len(comm[0])] * 2 + [len(comp[0])] * 2)
    order = np.argsort(times, kind="stable")  # ties cannot change the sum
    times, running = times[order], np.cumsum(steps[order])
    both = np.flatnonzero(running[:-1] == 3)
    overlapped = float((times[both + 1] - times[both]).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.float64(overlapped) / np.float64(_hta_length(*comm))
    # HTA rounds a Series: numpy's rounding, which can differ from Python's round().
    return {"rank": rank, "comp_comm_overlap_pctg": float(np.round(100 * ratio, 2))}


def _overlap_table(rows: list[dict[str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rank", "comp_comm_overlap_pctg"])


def _hta_argsort(ts: np.ndarray) -> np.ndarray:
    """The order of pandas' ``sort_values("ts")`` in HTA (quicksort: ties are not kept stable)."""
    return np.argsort(_as_hta_dtype(ts), kind="quicksort")


def _hta_merge(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA 0.5.0's ``merge_kernel_intervals``: (starts, ends) of its merged groups.

    Rows sorted by ``ts`` (:func:`_hta_argsort`, from the order given); a row starts a new group
    when ``ts`` exceeds the largest ``end`` of all rows before it; a group spans from its first
    ``ts`` to the largest ``end`` *within* the group; the groups are sorted by start once more.
    Unlike a plain union, a rounded event of negative length (``ceil(ts) > floor(ts + dur)``, a
    sub-microsecond event) that starts a group stays a group of its own with length -1; one
    that sorts after a tie partner, or lies inside an earlier event, is absorbed.
    """
    if not len(ts):
        return ts[:0], end[:0]
    order = _hta_argsort(ts)
    ts, end = ts[order], end[order]
    reach = np.maximum.accumulate(end)
    new_group = np.empty(len(ts), dtype=bool)
    new_group[0] = True
    new_group[1:] = ts[1:] > reach[:-1]
    first = np.flatnonzero(new_group)
    starts, ends = ts[first], np.maximum.reduceat(end, first)
    order = _hta_argsort(starts)
    return starts[order], ends[order]


def _hta_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """``merged.end.sum() - merged.ts.sum()``, summed per group so that it stays exact."""
    return float((ends - starts).sum())


def idle_time_breakdown(
    views: dict[int, HtaView], consecutive_kernel_delay_us: float = DEFAULT_KERNEL_DELAY_US
) -> pd.DataFrame:
    """HTA's ``get_idle_time_breakdown`` for every rank: the idle gaps of each stream, by cause.

    Per stream, events sorted by start; the gap before event i is ``ts_i - end_{i-1}`` (with the
    previous event in that order, so gaps can be negative)::

        CPU   launch0              launch1
        GPU     |--kernel0--|          |--kernel1--|
                            <- gap ->

    - ``host_wait``: kernel i was launched after kernel i-1 ended (the CPU was late);
    - ``kernel_wait``: otherwise, when the gap is under ``consecutive_kernel_delay_us``;
    - ``other``: the rest.
    """
    rows = []
    for rank, view in views.items():
        frame = view.frame
        kernels = frame[(frame["stream"] != -1) & frame["cat"].isin(_IDLE_KERNEL_CATS)]
        ts, end, stream, runtime = (
            kernels[c].to_numpy() for c in ("ts", "end", "stream", "ts_runtime")
        )
        rows += _idle_rows(rank, ts, end, stream, runtime, consecutive_kernel_delay_us)
    return _idle_table(rows)


def _idle_rows(
    rank: int,
    ts: np.ndarray,
    end: np.ndarray,
    stream: np.ndarray,
    runtime: np.ndarray,
    delay: float,
) -> list[dict[str, object]]:
    """:func:`idle_time_breakdown` of one rank's kernels (in HTA's row order), streams in the
    order they first appear."""
    streams, first = np.unique(stream, return_index=True)
    rows: list[dict[str, object]] = []
    for s in streams[np.argsort(first)].tolist():
        mine = stream == s
        present, sums, ratio = _stream_idle(ts[mine], end[mine], runtime[mine], delay)
        rows += [
            {
                "rank": rank,
                "stream": s,
                "idle_category": _IDLE_CATEGORIES[c],
                "idle_time_us": us,
                "idle_time_ratio": share,
            }
            for c, us, share in zip(present, sums.tolist(), ratio.tolist(), strict=True)
        ]
    return rows


def _idle_table(rows: list[dict[str, object]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["rank", "stream", "idle_category", "idle_time_us", "idle_time_ratio"]
    )


def _stream_idle(
    ts: np.ndarray, end: np.ndarray, runtime: np.ndarray, delay: float
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The idle categories present on one stream, their idle time (µs) and share, rounded."""
    order = np.argsort(_as_hta_dtype(ts), kind="quicksort")  # pandas' default, ties included
    ts, end, runtime = ts[order], end[order], runtime[order]
    prev_end = np.concatenate([[np.nan], end[:-1]])
    gap = ts - prev_end
    with np.errstate(invalid="ignore"):
        host = runtime > prev_end
        kernel_wait = ~host & (gap < delay)
    category = np.where(host, 0, np.where(kernel_wait, 1, 2))
    present = np.unique(category).tolist()
    known = np.where(np.isnan(gap), 0.0, gap)  # as np.nansum: NaN counts 0, the sum is np.sum's
    sums = np.array([known[category == c].sum() for c in present])
    total = sums.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = sums / total
    return present, np.round(sums, 2), np.round(ratio, 2)


def _as_hta_dtype(ts: np.ndarray) -> np.ndarray:
    """HTA holds rounded timestamps as int64; sort the same dtype so ties break the same way."""
    if len(ts) and np.all(np.mod(ts, 1) == 0):
        return ts.astype(np.int64)
    return ts
