"""One rank's trace cut into per-step interval sets: the step windows, compute, communication,
data loading and contention (the GPU and CPU rules of :mod:`fsobs.analysis.bubbles`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.analysis.bubbles.optree import op_tree
from fsobs.analysis.bubbles.windows import GpuCoverage, cpu_windows, gpu_coverage, gpu_windows
from fsobs.analysis.collectives.matching import SYNC_COLLECTIVES, arrivals, step_marks
from fsobs.trace.categorical import codes, is_in
from fsobs.trace.classify import KERNEL_CATS
from fsobs.trace.schema import RankTrace
from optim.markers import DATA_MARKER

BUBBLE_CLASSES = ("straggler_wait", "exposed_comm", "unattributed_comm", "host_idle", "other")
CLASSES = ("busy", *BUBBLE_CLASSES)
_GPU_WORK = ("compute", "comm", "memcpy", "memset", "sync")

COMPUTE_OP_PREFIXES = (
    "aten::",
    "fbgemm::",
    "prims::",
    "quantized::",
    "_quantized::",
    "mkldnn::",
    "onednn::",
    "mkl::",
    "torchvision::",
    "torchaudio::",
    "xformers::",
)
"""Namespaces of CPU ops that run kernels. Everything else on the training thread is glue:
autograd nodes (``BmmBackward0``, ``autograd::engine::evaluate_function``), torchrec's
communication functions (``All2All_Seq_ReqBackward``, which sits in the wait), DDP's reducer
ops, ``torch::autograd::AccumulateGrad`` and the ``c10d::*`` ops that only enqueue work."""


@dataclass(kw_only=True, frozen=True)
class BubbleConfig:
    """Knobs of the bubble analysis."""

    data_loader_markers: tuple[str, ...] = ("enumerate(DataLoader)", DATA_MARKER)
    """Name prefixes of training-thread ranges that mean "preparing input data" (CPU traces)."""
    compute_op_prefixes: tuple[str, ...] = COMPUTE_OP_PREFIXES
    """Name prefixes of CPU ops that count as compute (rule 1 above)."""


_EMPTY: iv.Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))


@dataclass
class StepParts:
    """What one rank contributes to one step's classes, before the cross-rank waits are known.

    All interval sets are clipped to ``window`` and in the rank's own clock (ns).
    """

    rank: int
    step: int
    device: str
    window: tuple[int, int]
    compute: iv.Intervals
    """GPU: compute kernels. CPU: instants whose innermost op is a compute op."""
    comm: iv.Intervals
    comm_rows: np.ndarray
    """Event rows of the communication events in the window (to look up their waits)."""
    transfer: iv.Intervals = _EMPTY
    """Communication that synchronizes nothing (point-to-point, copy-engine transfers): never
    a wait, exposed when it blocks."""
    everything: iv.Intervals = _EMPTY
    """GPU: any GPU work."""
    loading: iv.Intervals = _EMPTY
    """CPU: data-loader ranges of the training thread."""
    loader_comm: iv.Intervals = _EMPTY
    """CPU: the collectives that started inside a data-loader range, while inside one."""
    contention_ns: int = 0
    clock: str = ""
    """What times the window (:mod:`.windows`): ``gpu``, the GPU work the step launched, or
    ``cpu``, the step's CPU range (a CPU rank's, or a GPU rank's whose steps launched no GPU
    work). Empty: the device's own (``gpu`` on a GPU, ``cpu`` on a CPU)."""
    cpu_ns: int = 0
    """Length of the step's CPU range (its ProfilerStep or marker range; for a whole-trace
    window, the span of the rank's CPU events); 0 when the rank has no CPU event."""
    coverage: GpuCoverage = GpuCoverage()
    """GPU: the work around the window that no recorded step launched."""

    def __post_init__(self) -> None:
        if not self.clock:
            self.clock = "gpu" if self.device == "gpu" else "cpu"


def step_parts(trace: RankTrace, config: BubbleConfig | None = None) -> list[StepParts]:
    """Per-step parts of one rank (every step it recorded)."""
    if trace.device == "gpu":
        return _gpu_parts(trace)
    return _cpu_parts(trace, config or BubbleConfig())


def _spans(frame: pd.DataFrame) -> iv.Intervals:
    start = frame["ts_ns"].to_numpy()
    return iv.union(start, start + frame["dur_ns"].to_numpy())


def _gpu_parts(trace: RankTrace) -> list[StepParts]:
    ev = trace.events
    kind = ev["kind"]
    rows = np.flatnonzero((ev["stream"].to_numpy() >= 0) & is_in(kind, _GPU_WORK))
    start = ev["ts_ns"].to_numpy()[rows]
    end = start + ev["dur_ns"].to_numpy()[rows]
    is_compute = is_in(kind, ("compute",))[rows]
    is_comm = is_in(kind, ("comm",))[rows]
    is_transfer = is_comm & _transfers(trace)[rows]
    sm_comm = is_comm & is_in(ev["cat"], tuple(KERNEL_CATS))[rows]  # copy engines take none
    contention = _contention(
        end[is_compute] - start[is_compute],
        _like(ev, rows[is_compute]),
        (start[is_compute], end[is_compute]),
        iv.union(start[sm_comm], end[sm_comm]),
    )
    step = ev["step"].to_numpy()[rows]
    compute = iv.union(start[is_compute], end[is_compute])
    comm = iv.union(start[is_comm], end[is_comm])
    transfer = iv.union(start[is_transfer], end[is_transfer])
    everything = iv.union(start, end)
    comm_rows, comm_start, comm_end = rows[is_comm], start[is_comm], end[is_comm]
    ranges = cpu_windows(ev, step_marks(ev))
    windows, clock = gpu_windows(step, start, end), "gpu"
    if not windows:  # no step launched GPU work: the GPU during the steps' CPU ranges
        windows, clock = ranges, "cpu"
    coverage = gpu_coverage(windows, step, start, end)
    lo = np.array([w[0] for w in windows.values()], np.int64)
    hi = np.array([w[1] for w in windows.values()], np.int64)
    compute_in, comm_in, transfer_in, everything_in = (
        iv.clip_each(s, lo, hi) for s in (compute, comm, transfer, everything)
    )
    contention_in = _sums_by_step(step[is_compute], contention, list(windows))
    out = []
    for k, (s, (lo_s, hi_s)) in enumerate(windows.items()):
        out.append(
            StepParts(
                rank=trace.rank,
                step=s,
                device="gpu",
                window=(lo_s, hi_s),
                clock=clock,
                cpu_ns=_length(ranges.get(s)),
                coverage=coverage[s],
                compute=compute_in[k],
                comm=comm_in[k],
                comm_rows=comm_rows[(comm_start < hi_s) & (comm_end > lo_s)],
                transfer=transfer_in[k],
                everything=everything_in[k],
                contention_ns=contention_in[k],
            )
        )
    return out


def _sums_by_step(step: np.ndarray, values: np.ndarray, steps: list[int]) -> list[int]:
    """The sum of the ``values`` of each of ``steps`` (``step``: each value's step), 0 for a
    step without values; integer sums, exact."""
    order = np.argsort(step, kind="stable")
    ordered, total = step[order], np.concatenate(([0], np.cumsum(values[order])))
    wanted = np.array(steps, np.int64)
    right = total[np.searchsorted(ordered, wanted, "right")]
    return cast(list[int], (right - total[np.searchsorted(ordered, wanted, "left")]).tolist())


def main_thread(ev: pd.DataFrame, marks: np.ndarray) -> object:
    """The training thread: the one with the step marks (rows), else the one with the most
    ops."""
    if len(marks):  # the most frequent, the first in category order among equals (as mode())
        tid = ev["tid"]
        marked = codes(tid)[marks]
        counts = np.bincount(marked[marked >= 0], minlength=1)
        return tid.cat.categories[int(np.argmax(counts))]
    ops = ev[(ev["cat"] == "cpu_op") & (ev["device"] == "cpu")]
    return ops["tid"].value_counts().index[0] if len(ops) else None


def _length(window: tuple[int, int] | None) -> int:
    return 0 if window is None else window[1] - window[0]


def _cpu_parts(trace: RankTrace, config: BubbleConfig) -> list[StepParts]:
    ev = trace.events
    marks = step_marks(ev)
    main_tid = main_thread(ev, marks)
    main = ev[(ev["tid"] == main_tid) & (ev["device"] == "cpu")]
    comm_all = ev[(ev["kind"] == "comm") & (ev["device"] == "cpu")]
    colls = trace.collectives.set_index("row").reindex(comm_all.index)
    # in flight from its enqueue on gloo
    comm_start = arrivals(trace, comm_all.index.to_numpy(), colls["enqueue_ns"].to_numpy())
    comm_end = (comm_all["ts_ns"] + comm_all["dur_ns"]).to_numpy()
    ops = main[(main["cat"] == "cpu_op") & (main["kind"] != "step")]
    tree = op_tree(ops["ts_ns"].to_numpy(), (ops["ts_ns"] + ops["dur_ns"]).to_numpy())
    names = ops["name"].cat.categories
    is_compute_name = np.array([str(n).startswith(config.compute_op_prefixes) for n in names])
    codes = ops["name"].cat.codes.to_numpy()[tree.rows]
    chosen = is_compute_name[codes] if len(codes) else np.zeros(0, bool)
    compute = tree.innermost(chosen)
    op_start = tree.start[chosen]
    like = _like(ev, ops.index.to_numpy()[tree.rows[chosen]])
    contention = _contention(
        tree.self_ns()[chosen], like, (op_start, tree.end[chosen]), iv.union(comm_start, comm_end)
    )
    markers = [
        n for n in main["name"].cat.categories if str(n).startswith(config.data_loader_markers)
    ]
    loading = _spans(main[main["name"].isin(markers)])
    in_loader = iv.covered(loading, comm_start)
    loader_comm = iv.intersect(iv.union(comm_start[in_loader], comm_end[in_loader]), loading)
    out = []
    for step, (lo, hi) in cpu_windows(ev, marks).items():
        comm = (comm_start < hi) & (comm_end > lo)
        out.append(
            StepParts(
                rank=trace.rank,
                step=step,
                device="cpu",
                window=(lo, hi),
                cpu_ns=hi - lo,
                compute=iv.clip(compute, lo, hi),
                comm=iv.clip(iv.union(comm_start[comm], comm_end[comm]), lo, hi),
                comm_rows=comm_all.index.to_numpy()[comm],
                loading=iv.clip(loading, lo, hi),
                loader_comm=iv.clip(loader_comm, lo, hi),
                contention_ns=int(contention[(op_start >= lo) & (op_start < hi)].sum()),
            )
        )
    return out


def _transfers(trace: RankTrace) -> np.ndarray:
    """Event mask of the communication events that are no synchronizing collective."""
    colls = trace.collectives
    mask = np.zeros(len(trace.events), bool)
    mask[colls["row"].to_numpy()[~is_in(colls["coll"], SYNC_COLLECTIVES)]] = True
    return mask


def _like(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """One code per kind of op or kernel at ``rows`` of ``events``: its name and, where
    recorded, its shapes."""
    name = codes(events["name"])[rows]
    shape = events["shape_key"].to_numpy()[rows]
    order = np.lexsort((shape, name))
    new = np.ones(len(rows), bool)
    new[1:] = (np.diff(name[order]) != 0) | (np.diff(shape[order]) != 0)
    code = np.empty(len(rows), np.int64)
    code[order] = np.cumsum(new) - 1
    return code


def _contention(
    dur: np.ndarray, names: np.ndarray, spans: iv.Intervals, comm: iv.Intervals
) -> np.ndarray:
    """Extra duration (ns) of each op or kernel whose span overlaps communication, against the
    median duration of the same op (``names``: one code per name and shapes, :func:`_like`)
    when nothing overlaps it; ops never seen alone count 0. On a GPU the communication is that
    of SM-based kernels (NCCL's; copy-engine transfers take no SMs, which is what the sm_free
    toggle buys); on a CPU, the gloo collectives (core contention, not SMs), and ``dur`` is
    the op's self time (the same compute set as busy)::

        comm        |=========|
        op  alone |==|        |==|      median 3
        op  during    |=====|           extra 5 - 3 = 2
    """
    if not len(dur) or not len(comm[0]):
        return np.zeros(len(dur), np.int64)
    start, end = spans
    pos = np.searchsorted(comm[0], end, "left") - 1
    overlaps = (pos >= 0) & (comm[1][np.maximum(pos, 0)] > start)
    extra = dur - _median_of(dur[~overlaps], names[~overlaps], names)
    extra = np.where(overlaps & ~np.isnan(extra), np.maximum(extra, 0), 0)
    return extra.astype(np.int64)


def _median_of(values: np.ndarray, labels: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Median (float64) of the ``values`` with each label of ``wanted``, NaN for a label
    without values. As pandas' group median: the middle value, or the mean of the middle two."""
    order = np.lexsort((values, labels))
    ordered = values[order].astype(np.float64)
    groups, first, count = np.unique(labels[order], return_index=True, return_counts=True)
    median = (ordered[first + (count - 1) // 2] + ordered[first + count // 2]) / 2
    return cast(np.ndarray, np.append(median, np.nan)[iv.position(groups, wanted)])  # -1: NaN
