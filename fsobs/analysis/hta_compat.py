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

All times are microseconds; the column names say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis.intervals import intersect, length, union
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
            pd.concat([getattr(m, table) for m in chosen], ignore_index=True)
            for table in ("temporal_breakdown", "comm_comp_overlap", "idle_time_breakdown")
        )
    )


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
    """
    rows = []
    for rank, view in views.items():
        gpu = view.frame[view.frame["stream"] != -1]
        if gpu.empty:
            rows.append({"rank": rank} | dict.fromkeys(_TB_VALUES, np.nan))
            continue
        busy = union(gpu["ts"].to_numpy(), gpu["end"].to_numpy())
        kernel_time = float(busy[1][-1] - busy[0][0])
        idle = kernel_time - length(busy)
        comp = gpu[_kernel_types(gpu) == "COMPUTATION"]
        compute = length(union(comp["ts"].to_numpy(), comp["end"].to_numpy()))
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
    """
    rows = []
    for rank, view in views.items():
        gpu = view.frame[view.frame["stream"] != -1]
        types = _kernel_types(gpu)
        comm = union(*(gpu.loc[types == "COMMUNICATION", c].to_numpy() for c in ("ts", "end")))
        comp = union(*(gpu.loc[types == "COMPUTATION", c].to_numpy() for c in ("ts", "end")))
        comm_time = length(comm)
        ratio = length(intersect(comm, comp)) / comm_time if comm_time > 0 else np.nan
        rows.append({"rank": rank, "comp_comm_overlap_pctg": round(100 * ratio, 2)})
    return pd.DataFrame(rows, columns=["rank", "comp_comm_overlap_pctg"])


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
