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
    """Columns: event_index, ts, end (µs), stream, correlation, name, cat, ts_runtime."""


@dataclass
class HtaMetrics:
    """HTA-compatible GPU metrics: the three tables, one or more rows per rank."""

    temporal_breakdown: pd.DataFrame
    comm_comp_overlap: pd.DataFrame
    idle_time_breakdown: pd.DataFrame


@dataclass
class RankHta:
    """One rank's metrics, computed where its events are (a parser worker).

    HTA filters every rank by its last ProfilerStep only when the *whole run* has two or more
    distinct ProfilerStep names, so a rank with fewer than two of its own carries both variants.
    """

    step_names: frozenset[str]
    variants: dict[bool, HtaMetrics]
    """filtered? -> metrics."""


def rank_hta(trace: RankTrace) -> RankHta:
    """HTA's metrics of one rank, for each filter decision the run as a whole may take."""
    frame = _raw_view(trace)
    frame["ts_runtime"] = _runtime_ts_index(frame)
    names = frozenset(n for n in frame["name"].unique() if "ProfilerStep" in n)
    variants = {}
    for filtered in (True,) if len(names) >= 2 else (False, True):
        kept = _filter(frame, names) if filtered else frame
        kept = kept.reset_index(drop=True)
        kept["ts_runtime"] = _resolve_runtime_ts(kept)
        views = {trace.rank: HtaView(rank=trace.rank, frame=kept)}
        variants[filtered] = HtaMetrics(
            temporal_breakdown=temporal_breakdown(views),
            comm_comp_overlap=comm_comp_overlap(views),
            idle_time_breakdown=idle_time_breakdown(views),
        )
    return RankHta(step_names=names, variants=variants)


def combine_hta(ranks: dict[int, RankHta]) -> HtaMetrics:
    """The run's tables from its ranks' (rule 2: filter iff >= 2 ProfilerStep names in all)."""
    names = frozenset().union(*(r.step_names for r in ranks.values()))
    chosen = [ranks[r].variants[len(names) >= 2] for r in sorted(ranks)]
    return HtaMetrics(
        *(
            _stack([getattr(m, table) for m in chosen])
            for table in ("temporal_breakdown", "comm_comp_overlap", "idle_time_breakdown")
        )
    )


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The rows of ``frames`` in order (a rank's all-NaN row included, keeping float dtypes)."""
    rows = [row for frame in frames for row in frame.to_dict("records")]
    return pd.DataFrame(rows, columns=frames[0].columns).astype(frames[0].dtypes.to_dict())


def _raw_view(trace: RankTrace) -> pd.DataFrame:
    ev = trace.events
    keep = ev["cat"].notna().to_numpy()
    frame = pd.DataFrame(
        {
            "event_index": ev["event_index"].to_numpy()[keep],
            "ts": ev["hta_ts"].to_numpy()[keep],
            "end": ev["hta_end"].to_numpy()[keep],
            "stream": ev["stream"].to_numpy()[keep],
            "correlation": ev["correlation"].to_numpy()[keep],
            "name": ev["name"].astype(object).to_numpy()[keep],
            "cat": ev["cat"].astype(object).to_numpy()[keep],
        }
    )
    frame["is_gpu"] = ((frame["stream"] >= 0) & (frame["correlation"] >= 0)) | frame["name"].isin(
        _GPU_SYNC_NAMES
    )
    return frame


def _runtime_ts_index(frame: pd.DataFrame) -> np.ndarray:
    """HTA's ``index_correlation``: the event index of the partner event, else min(corr, 0)."""
    corr = frame["correlation"].to_numpy()
    index_corr = np.minimum(corr, 0)
    has = corr != -1
    cpu = frame.loc[has & ~frame["is_gpu"], ["event_index", "correlation"]]
    gpu = frame.loc[has & frame["is_gpu"], ["event_index", "correlation"]]
    last_cpu = cpu.drop_duplicates("correlation", keep="last").set_index("correlation")
    partner = gpu["correlation"].map(last_cpu["event_index"])
    matched = partner.notna().to_numpy()
    index_corr[gpu.index.to_numpy()[matched]] = partner.to_numpy()[matched].astype(np.int64)
    return index_corr


def _filter(frame: pd.DataFrame, step_names: set[str]) -> pd.DataFrame:
    """Rule 2: drop the last step's CPU rows and every GPU row whose launch was dropped."""
    cpu = frame[~frame["is_gpu"]]
    gpu = frame[frame["is_gpu"]]
    last_start = cpu.loc[cpu["name"].isin(step_names), "ts"].max()
    cpu_kept = cpu[cpu["ts"] < last_start]
    counts = cpu_kept["correlation"].value_counts()
    repeat = gpu["correlation"].map(counts).fillna(0).to_numpy(np.int64)
    gpu_kept = gpu.loc[gpu.index.repeat(repeat)]
    return pd.concat([gpu_kept, cpu_kept], axis=0)


def _resolve_runtime_ts(kept: pd.DataFrame) -> np.ndarray:
    """ts of the row whose event index is ``index_correlation`` (NaN when absent)."""
    first = kept.drop_duplicates("event_index").set_index("event_index")["ts"]
    return kept["ts_runtime"].map(first).to_numpy(np.float64)


def _kernel_types(frame: pd.DataFrame) -> np.ndarray:
    names = frame["name"]
    per_name = {n: kernel_type(n) for n in names.unique()}
    return names.map(per_name).to_numpy()


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
    rows = []
    for rank, view in views.items():
        gpu = view.frame[view.frame["stream"] != -1]
        if gpu.empty:
            rows.append({"rank": rank} | dict.fromkeys(_TB_VALUES, np.nan))
            continue
        starts, ends = _hta_merge(gpu["ts"].to_numpy(), gpu["end"].to_numpy())
        # That merge sorts HTA's frame in place: the computation rows are taken (and sorted
        # again, ties included) in the order it left.
        gpu = gpu.iloc[_hta_argsort(gpu["ts"].to_numpy())]
        kernel_time = float(ends[-1] - starts[0])  # HTA: merged.iloc[-1].end - .iloc[0].ts
        idle = kernel_time - _hta_length(starts, ends)
        comp = gpu[_kernel_types(gpu) == "COMPUTATION"]
        compute = _hta_length(*_hta_merge(comp["ts"].to_numpy(), comp["end"].to_numpy()))
        rows.append(
            {
                "rank": rank,
                "idle_time_us": idle,
                "compute_time_us": compute,
                "non_compute_time_us": kernel_time - compute - idle,
                "kernel_time_us": kernel_time,
            }
        )
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
    rows = []
    for rank, view in views.items():
        gpu = view.frame[view.frame["stream"] != -1]
        types = _kernel_types(gpu)
        comp = _hta_merge(*(gpu.loc[types == "COMPUTATION", c].to_numpy() for c in ("ts", "end")))
        comm = _hta_merge(*(gpu.loc[types == "COMMUNICATION", c].to_numpy() for c in ("ts", "end")))
        times = np.concatenate([comm[0], comm[1], comp[0], comp[1]]).astype(np.float64)
        steps = np.repeat([1, -1, 2, -2], [len(comm[0])] * 2 + [len(comp[0])] * 2)
        order = np.argsort(times, kind="stable")  # ties cannot change the sum
        times, running = times[order], np.cumsum(steps[order])
        both = np.flatnonzero(running[:-1] == 3)
        overlapped = float((times[both + 1] - times[both]).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.float64(overlapped) / np.float64(_hta_length(*comm))
        # HTA rounds a Series: numpy's rounding, which can differ from Python's round().
        rows.append({"rank": rank, "comp_comm_overlap_pctg": float(np.round(100 * ratio, 2))})
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
    parts = []
    for rank, view in views.items():
        frame = view.frame
        kernels = frame[(frame["stream"] != -1) & frame["cat"].isin(_IDLE_KERNEL_CATS)]
        for stream in kernels["stream"].unique():
            part = _stream_idle(kernels[kernels["stream"] == stream], consecutive_kernel_delay_us)
            part.insert(0, "stream", int(stream))
            part.insert(0, "rank", rank)
            parts.append(part)
    columns = ["rank", "stream", "idle_category", "idle_time_us", "idle_time_ratio"]
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)[columns]


def _stream_idle(kernels: pd.DataFrame, delay: float) -> pd.DataFrame:
    ts = _as_hta_dtype(kernels["ts"].to_numpy())
    order = np.argsort(ts, kind="quicksort")  # pandas sort_values' default, ties included
    ts = kernels["ts"].to_numpy()[order]
    end = kernels["end"].to_numpy()[order]
    runtime = kernels["ts_runtime"].to_numpy()[order]
    prev_end = np.concatenate([[np.nan], end[:-1]])
    gap = ts - prev_end
    with np.errstate(invalid="ignore"):
        host = runtime > prev_end
        kernel_wait = ~host & (gap < delay)
    category = np.where(host, 0, np.where(kernel_wait, 1, 2))
    present = sorted(set(category.tolist()))
    sums = np.array([np.nansum(gap[category == c]) for c in present])
    total = sums.sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = sums / total
    return pd.DataFrame(
        {
            "idle_category": [_IDLE_CATEGORIES[c] for c in present],
            "idle_time_us": np.round(sums, 2),
            "idle_time_ratio": np.round(ratio, 2),
        }
    )


def _as_hta_dtype(ts: np.ndarray) -> np.ndarray:
    """HTA holds rounded timestamps as int64; sort the same dtype so ties break the same way."""
    if len(ts) and np.all(np.mod(ts, 1) == 0):
        return ts.astype(np.int64)
    return ts
