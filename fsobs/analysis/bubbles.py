"""Bubble taxonomy per rank and step (DESIGN §5).

For every rank r and step s the **window** is split exactly into

    window = busy + straggler_wait + exposed_comm + host_idle + other

and ``contention`` is reported beside it. Each class is computed once, here, as an interval set
(so that ``fsobs export`` can draw it) and then summed.

GPU traces (the resource is the GPU; the window runs from the first GPU event launched in step s
to the first one of the next step, see :func:`_gpu_windows`)::

    compute   |=====|      |====|             |=====|
    comm            |..wait..|xx|                            a_r = own start, A = last start
    memcpy                         |m|
              <--------------------- window ---------------------->
    busy = compute;  straggler_wait = [a_r, A) of each collective minus compute;
    exposed_comm = rest of comm minus compute;  host_idle = no GPU event at all;
    other = GPU busy with neither compute nor comm (memcpy, memset, sync).

CPU traces (the resource is the training thread; the window is its ProfilerStep)::

    main thread  |op|op|  glue  |op|          (blocked)           |op|
    gloo thread                     |..wait..|xxxxx|
    blocked = collective in flight while the main thread runs no leaf op (an op that encloses
    no other op; see :func:`_leaves`: an op that waits for a collective counts as blocked);
    straggler_wait = blocked before the last rank arrived, exposed_comm = blocked after;
    host_idle = inside a data-loader range; busy = the rest of the window; other = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.analysis.collectives import Collectives
from fsobs.trace.schema import RankTrace

CLASSES = ("busy", "straggler_wait", "exposed_comm", "host_idle", "other")
_GPU_WORK = ("compute", "comm", "memcpy", "memset", "sync")


@dataclass(kw_only=True, frozen=True)
class BubbleConfig:
    """Knobs of the bubble analysis."""

    data_loader_markers: tuple[str, ...] = ("enumerate(DataLoader)", "## fsobs:data ##")
    """Name prefixes of main-thread ranges that mean "waiting for input data" (CPU traces)."""


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
    """GPU: compute kernels. CPU: leaf ops of the training thread."""
    comm: iv.Intervals
    comm_rows: np.ndarray
    """Event rows of the communication events in the window (to look up their waits)."""
    everything: iv.Intervals = _EMPTY
    """GPU: any GPU work."""
    loading: iv.Intervals = _EMPTY
    """CPU: data-loader ranges of the training thread."""
    contention_ns: int = 0


@dataclass
class StepBubbles:
    """The interval sets of one rank and step, in that rank's own clock (ns)."""

    rank: int
    step: int
    window: tuple[int, int]
    classes: dict[str, iv.Intervals]
    contention_ns: int = 0

    def total_ns(self, name: str) -> int:
        return int(iv.length(self.classes[name]))


def step_parts(trace: RankTrace, config: BubbleConfig | None = None) -> list[StepParts]:
    """Per-step parts of one rank (every step it recorded)."""
    if trace.device == "gpu":
        return _gpu_parts(trace)
    return _cpu_parts(trace, config or BubbleConfig())


def classify(parts: StepParts, waits: dict[int, tuple[int, int]]) -> StepBubbles:
    """Split one rank's step window into the classes, given every collective's wait interval."""
    lo, hi = parts.window
    wait_set = iv.clip(_wait_set(parts.comm_rows, waits), lo, hi)
    full = (np.array([lo]), np.array([hi]))
    if parts.device == "gpu":
        wait = iv.subtract(wait_set, parts.compute)
        classes = {
            "busy": parts.compute,
            "straggler_wait": wait,
            "exposed_comm": iv.subtract(iv.subtract(parts.comm, wait), parts.compute),
            "host_idle": iv.subtract(full, parts.everything),
            "other": iv.subtract(parts.everything, iv.merge(parts.compute, parts.comm)),
        }
    else:
        blocked = iv.subtract(parts.comm, parts.compute)
        wait = iv.intersect(blocked, wait_set)
        idle = iv.subtract(parts.loading, blocked)
        classes = {
            "busy": iv.subtract(iv.subtract(full, blocked), idle),
            "straggler_wait": wait,
            "exposed_comm": iv.subtract(blocked, wait),
            "host_idle": idle,
            "other": _EMPTY,
        }
    return StepBubbles(parts.rank, parts.step, parts.window, classes, parts.contention_ns)


def bubble_intervals(
    parts: dict[int, list[StepParts]], steps: list[int], colls: Collectives
) -> list[StepBubbles]:
    """Classes of every rank for every step in ``steps`` (the steps common to all ranks)."""
    wanted = set(steps)
    result = []
    for rank in sorted(parts):
        waits = _wait_intervals(colls, rank)
        result.extend(classify(p, waits) for p in parts[rank] if p.step in wanted)
    return result


def bubble_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """Per rank and step, in ms: window, busy, bubble and its classes, contention beside."""
    rows = []
    for sb in steps:
        row = {"rank": sb.rank, "step": sb.step, "window_ms": (sb.window[1] - sb.window[0]) / 1e6}
        for name in CLASSES:
            row[f"{name}_ms"] = sb.total_ns(name) / 1e6
        row["bubble_ms"] = row["window_ms"] - row["busy_ms"]
        row["contention_ms"] = sb.contention_ns / 1e6
        rows.append(row)
    columns = [
        "rank",
        "step",
        "window_ms",
        "busy_ms",
        "bubble_ms",
        "straggler_wait_ms",
        "exposed_comm_ms",
        "host_idle_ms",
        "other_ms",
        "contention_ms",
    ]
    return pd.DataFrame(rows, columns=columns)


def _wait_intervals(colls: Collectives, rank: int) -> dict[int, tuple[int, int]]:
    """event row -> [own start, min(last arrival, own end)) in the rank's own clock."""
    mine = colls.instances[colls.instances["rank"] == rank]
    offset = colls.offsets_ns.get(rank, 0)
    start = mine["start_ns"].to_numpy(np.int64) + offset
    end = mine["end_ns"].to_numpy(np.int64) + offset
    last = np.minimum(mine["arrival_last_ns"].to_numpy(np.int64) + offset, end)
    return {int(r): (int(s), int(e)) for r, s, e in zip(mine["row"], start, last, strict=True)}


def _spans(frame: pd.DataFrame) -> iv.Intervals:
    start = frame["ts_ns"].to_numpy()
    return iv.union(start, start + frame["dur_ns"].to_numpy())


def _wait_set(rows: np.ndarray, waits: dict[int, tuple[int, int]]) -> iv.Intervals:
    pairs = [waits[r] for r in rows.tolist() if r in waits]
    return iv.union(
        np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)
    )


def _gpu_windows(gpu: pd.DataFrame) -> dict[int, tuple[int, int]]:
    """GPU window of every step: from its first GPU event to the next step's first one.

    Consecutive windows tile the GPU timeline, so a gap between steps (data loading, a late
    launch) counts once, as host_idle of the step before it, and work of two steps that overlap
    (pipelining) is never counted twice. The last recorded step ends with its own last event::

        step 1 work |====|  |===|         step 2 work  |===| |====|
        window 1    [-----------------)   window 2     [----------]
    """
    mine = gpu[gpu["step"] >= 0]
    first = mine.groupby("step")["ts_ns"].min().sort_values()
    last = (mine["ts_ns"] + mine["dur_ns"]).groupby(mine["step"]).max()
    starts = first.to_numpy()
    windows = {}
    for i, step in enumerate(first.index):
        end = starts[i + 1] if i + 1 < len(starts) else last[step]
        windows[int(step)] = (int(starts[i]), int(max(end, starts[i])))
    return windows


def _gpu_parts(trace: RankTrace) -> list[StepParts]:
    ev = trace.events
    gpu = ev[(ev["stream"] >= 0) & ev["kind"].isin(_GPU_WORK)]
    kind = gpu["kind"].to_numpy()
    start = gpu["ts_ns"].to_numpy()
    end = start + gpu["dur_ns"].to_numpy()
    is_compute, is_comm = kind == "compute", kind == "comm"
    contention = _contention(gpu[is_compute], iv.union(start[is_comm], end[is_comm]))
    launched_in = gpu.loc[is_compute, "step"].to_numpy()
    out = []
    for step, (lo, hi) in _gpu_windows(gpu).items():
        sel = (start < hi) & (end > lo)
        comm = sel & is_comm
        out.append(
            StepParts(
                rank=trace.rank,
                step=step,
                device="gpu",
                window=(lo, hi),
                compute=iv.clip(iv.union(start[sel & is_compute], end[sel & is_compute]), lo, hi),
                comm=iv.clip(iv.union(start[comm], end[comm]), lo, hi),
                comm_rows=gpu.index.to_numpy()[comm],
                everything=iv.clip(iv.union(start[sel], end[sel]), lo, hi),
                contention_ns=int(contention[launched_in == step].sum()),
            )
        )
    return out


def _cpu_parts(trace: RankTrace, config: BubbleConfig) -> list[StepParts]:
    ev = trace.events
    marks = ev[(ev["kind"] == "step") & (ev["device"] == "cpu")]
    main_tid = marks["tid"].mode().iloc[0] if len(marks) else None
    main = ev[(ev["tid"] == main_tid) & (ev["device"] == "cpu")]
    comm_all = ev[(ev["kind"] == "comm") & (ev["device"] == "cpu")]
    ops = _leaves(main[main["kind"].isin(("compute", "runtime"))])
    ops = ops[ops["kind"] == "compute"]  # runtime ops (c10d::* enqueue) nest but are not busy
    contention = _contention(ops, _spans(comm_all))
    names = main["name"].cat.categories
    markers = [n for n in names if str(n).startswith(config.data_loader_markers)]
    loading = _spans(main[main["name"].isin(markers)])
    op_spans = _spans(ops)
    op_start = ops["ts_ns"].to_numpy()
    comm_start = comm_all["ts_ns"].to_numpy()
    comm_end = comm_start + comm_all["dur_ns"].to_numpy()
    out = []
    for step, lo, dur in marks[["step", "ts_ns", "dur_ns"]].itertuples(index=False):
        hi = int(lo) + int(dur)
        lo = int(lo)
        comm = (comm_start < hi) & (comm_end > lo)
        out.append(
            StepParts(
                rank=trace.rank,
                step=int(step),
                device="cpu",
                window=(lo, hi),
                compute=iv.clip(op_spans, lo, hi),
                comm=iv.clip(iv.union(comm_start[comm], comm_end[comm]), lo, hi),
                comm_rows=comm_all.index.to_numpy()[comm],
                loading=iv.clip(loading, lo, hi),
                contention_ns=int(contention[(op_start >= lo) & (op_start < hi)].sum()),
            )
        )
    return out


def _leaves(ops: pd.DataFrame) -> pd.DataFrame:
    """Ops of one thread that enclose no other op: where the thread really computes.

    A parent's own time is glue, or waiting: torchrec's ``All2All_Seq_ReqBackward`` sits for the
    whole all-to-all with a single short child, so counting parents as busy would hide the wait::

        All2All_Seq_ReqBackward |-----------------------------|
        children                  |c10d|                         leaves: only |c10d|
    """
    ops = ops.sort_values(["ts_ns", "dur_ns"], ascending=[True, False], kind="stable")
    start = ops["ts_ns"].to_numpy()
    end = start + ops["dur_ns"].to_numpy()
    next_start = np.append(start[1:], np.iinfo(np.int64).max)
    return ops[next_start >= end]


def _contention(work: pd.DataFrame, comm: iv.Intervals) -> pd.Series:
    """Extra duration (ns) of each op that overlaps communication, against the median duration
    of the same op (by name) when nothing overlaps it. Ops never seen alone count 0::

        comm        |=========|
        op  alone |==|        |==|      median 3
        op  during    |=====|           extra 5 - 3 = 2
    """
    if work.empty or not len(comm[0]):
        return pd.Series(0, index=work.index, dtype=np.int64)
    start = work["ts_ns"].to_numpy()
    end = start + work["dur_ns"].to_numpy()
    pos = np.searchsorted(comm[0], end, "left") - 1
    overlaps = (pos >= 0) & (comm[1][np.maximum(pos, 0)] > start)
    names = work["name"].cat.codes.to_numpy()
    alone = pd.Series(work["dur_ns"].to_numpy()[~overlaps]).groupby(names[~overlaps]).median()
    baseline = pd.Series(names).map(alone).to_numpy(np.float64)
    extra = work["dur_ns"].to_numpy() - baseline
    extra = np.where(overlaps & ~np.isnan(extra), np.maximum(extra, 0), 0)
    return pd.Series(extra.astype(np.int64), index=work.index)
