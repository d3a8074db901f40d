"""Bubble taxonomy per rank and step (DESIGN §5).

For every rank r and step s the **window** is split exactly into

    window = busy + straggler_wait + exposed_comm + unattributed_comm + host_idle + other

and ``contention`` is reported beside it. Each class is computed once, here, as an interval set
(so that ``fsobs export`` can draw it) and then summed. A collective is *matched* when every
rank of its process group recorded it and the ranks agree on it
(:mod:`fsobs.analysis.collectives`); its wait interval on rank r is ``[a_r, min(A, end_r))``
with ``A`` the last rank's arrival.

GPU traces (the resource is the GPU; the window runs from the first GPU event launched in step s
to the first one of the next step, see :func:`_gpu_windows`)::

    compute   |=====|      |====|             |=====|
    comm            |..wait..|xx|   |uuu|                 a_r = own start, A = last start
    memcpy                               |m|
              <--------------------- window ---------------------->
    busy = compute;  straggler_wait = wait intervals minus compute;
    exposed_comm = rest of the matched collectives minus compute;
    unattributed_comm (u) = collectives that could not be matched, minus compute;
    host_idle = no GPU event at all;  other = GPU busy with neither compute nor comm.

CPU traces (the resource is the training thread; the window is its ProfilerStep). At each
instant the training thread's **innermost op** decides (:mod:`fsobs.analysis.optree`)::

    main thread  |aten::bmm|  glue  |All2All_Seq_ReqBackward-----|dddd|aten::cat|dd|
                    |rc|                  |c10d|                   data-loader range
    gloo thread        |~~~~~~~~~~~~~~~~~~~~~~~~~~~|xxxxx|

    1. the innermost op is a compute op (``BubbleConfig.compute_op_prefixes``: aten::,
       fbgemm::, ...) -> busy, whatever is in flight (the bmm and its resolve_conj child);
    2. else, a collective of this rank is in flight -> blocked: straggler_wait before the last
       rank's arrival, exposed_comm after (unattributed_comm if unmatched); inside a
       data-loader range only a collective that started inside it blocks (the loader waits for
       its own exchange, not for an async collective issued before it, such as the pipeline's
       input dist of the next batch: that one overlaps the loading);
    3. else, inside a data-loader range -> host_idle;
    4. else (any other op, or Python between ops) -> busy.  other = 0.

Who caused each piece of straggler wait (for :mod:`fsobs.analysis.stragglers`) comes from the
same intervals: every piece of rank r's straggler_wait is charged to the last rank of the
matched instance that covers it; where several instances' waits overlap, to the one whose last
arrival is latest (the binding one; ties: the lower instance number). So the wait the
stragglers caused adds up to the straggler_wait class exactly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsobs.analysis import intervals as iv
from fsobs.analysis.collectives import SYNC_COLLECTIVES, Collectives, arrivals
from fsobs.analysis.optree import op_tree
from fsobs.trace.schema import RankTrace
from optim.markers import DATA_MARKER, ROLES

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


@dataclass
class StepBubbles:
    """The interval sets of one rank and step, in that rank's own clock (ns)."""

    rank: int
    step: int
    window: tuple[int, int]
    classes: dict[str, iv.Intervals]
    contention_ns: int = 0
    caused_ns: dict[int, int] = field(default_factory=dict)
    """last rank -> ns of this rank's straggler_wait charged to it (see the module doc)."""
    by_role_ns: dict[tuple[str, str], int] = field(default_factory=dict)
    """(class, role) -> ns of straggler_wait / exposed_comm in collectives of that role."""

    def total_ns(self, name: str) -> int:
        return int(iv.length(self.classes[name]))


@dataclass(frozen=True)
class RankWaits:
    """The matched collective events of one rank, in its own clock, sorted by event row."""

    rows: np.ndarray
    start: np.ndarray
    wait_end: np.ndarray
    """min(last arrival, own end)."""
    end: np.ndarray
    last_rank: np.ndarray
    priority: np.ndarray
    """Charging order for overlapping waits: latest last arrival first."""
    role: np.ndarray
    """``embedding``, ``dense`` or ``other`` (:data:`optim.markers.ROLES`)."""

    @staticmethod
    def of(colls: Collectives, rank: int) -> RankWaits:
        mine = colls.instances[colls.instances["rank"] == rank].sort_values("row")
        offset = colls.offsets_ns.get(rank, 0)
        start = mine["start_ns"].to_numpy(np.int64) + offset
        end = mine["end_ns"].to_numpy(np.int64) + offset
        last = mine["arrival_last_ns"].to_numpy(np.int64) + offset
        order = np.lexsort((mine["instance"].to_numpy(), -last))
        priority = np.empty(len(order), np.int64)
        priority[order] = np.arange(len(order))
        return RankWaits(
            rows=mine["row"].to_numpy(np.int64),
            start=start,
            wait_end=np.minimum(last, end),
            end=end,
            last_rank=mine["last_rank"].to_numpy(np.int64),
            priority=priority,
            role=mine["role"].to_numpy(object),
        )

    def select(self, rows: np.ndarray) -> np.ndarray:
        """Positions of the matched ones among ``rows``."""
        pos = np.searchsorted(self.rows, rows)
        pos = pos[pos < len(self.rows)]
        return pos[np.isin(self.rows[pos], rows)]


def step_parts(trace: RankTrace, config: BubbleConfig | None = None) -> list[StepParts]:
    """Per-step parts of one rank (every step it recorded)."""
    if trace.device == "gpu":
        return _gpu_parts(trace)
    return _cpu_parts(trace, config or BubbleConfig())


def classify(parts: StepParts, waits: RankWaits) -> StepBubbles:
    """Split one rank's step window into the classes, given its matched collectives."""
    lo, hi = parts.window
    sel = waits.select(parts.comm_rows)
    wait_set = iv.clip(iv.union(waits.start[sel], waits.wait_end[sel]), lo, hi)
    matched = iv.merge(iv.clip(iv.union(waits.start[sel], waits.end[sel]), lo, hi), parts.transfer)
    full = (np.array([lo]), np.array([hi]))
    if parts.device == "gpu":
        blocked = iv.subtract(parts.comm, parts.compute)
        idle = iv.subtract(full, parts.everything)
        other = iv.subtract(parts.everything, iv.merge(parts.compute, parts.comm))
        busy = parts.compute
    else:
        outside = iv.subtract(iv.subtract(parts.comm, parts.compute), parts.loading)
        inside = iv.subtract(parts.loader_comm, parts.compute)
        blocked = iv.merge(outside, inside)
        idle = iv.subtract(iv.subtract(parts.loading, parts.compute), inside)
        other = _EMPTY
        busy = iv.subtract(iv.subtract(full, blocked), idle)
    wait = iv.intersect(blocked, wait_set)
    classes = {
        "busy": busy,
        "straggler_wait": wait,
        "exposed_comm": iv.subtract(iv.intersect(blocked, matched), wait),
        "unattributed_comm": iv.subtract(blocked, matched),
        "host_idle": idle,
        "other": other,
    }
    caused, by_role = _charge(classes, waits, sel)
    return StepBubbles(
        parts.rank, parts.step, parts.window, classes, parts.contention_ns, caused, by_role
    )


def _charge(
    classes: dict[str, iv.Intervals], waits: RankWaits, sel: np.ndarray
) -> tuple[dict[int, int], dict[tuple[str, str], int]]:
    """Who caused each piece of straggler wait, and the role of the collective each piece of
    wait and exposed time belongs to.

    Straggler wait goes to the matched instance covering it whose last arrival is latest (the
    binding one), and so to that instance's last rank::

        wait set      |=========|      |====|
        instance a  |-----------)                  last rank 2, arrives at 40
        instance b        |--------------------)   last rank 3, arrives at 70 (charged first)
        charged        2  |  3  |      |  3 |

    Exposed time covered by several collectives goes to embedding before dense before other.
    """
    if not len(sel):
        return {}, {}
    by_wait = sel[np.argsort(-waits.priority[sel], kind="stable")]  # the binding one last
    wait_owner = _owners(classes["straggler_wait"], waits.start, waits.wait_end, by_wait)
    rank_of_role = np.array([ROLES.index(r) for r in waits.role[sel]])
    by_role = sel[np.argsort(-rank_of_role, kind="stable")]  # embedding last
    exposed_owner = _owners(classes["exposed_comm"], waits.start, waits.end, by_role)
    caused: dict[int, int] = defaultdict(int)
    roles: dict[tuple[str, str], int] = defaultdict(int)
    for i, ns in wait_owner.items():
        caused[int(waits.last_rank[i])] += ns
        roles["straggler_wait", str(waits.role[i])] += ns
    for i, ns in exposed_owner.items():
        roles["exposed_comm", str(waits.role[i])] += ns
    return dict(caused), dict(roles)


def _owners(
    target: iv.Intervals, starts: np.ndarray, ends: np.ndarray, order: np.ndarray
) -> dict[int, int]:
    """ns of ``target`` covered by each interval ``[starts[i], ends[i])`` of ``order``; where
    they overlap, the later one in ``order`` owns the piece."""
    if not len(target[0]):
        return {}
    points = np.unique(np.concatenate([target[0], target[1], starts[order], ends[order]]))
    seg_lo, seg_len = points[:-1], np.diff(points)
    inside = np.searchsorted(target[0], seg_lo, "right") > np.searchsorted(
        target[1], seg_lo, "right"
    )
    owner = np.full(len(seg_lo), -1, np.int64)
    for i in order:
        owner[np.searchsorted(points, starts[i]) : np.searchsorted(points, ends[i])] = i
    owned = inside & (owner >= 0)
    keys, which = np.unique(owner[owned], return_inverse=True)
    totals = np.zeros(len(keys), np.int64)
    np.add.at(totals, which.reshape(-1), seg_len[owned])
    return {int(i): int(ns) for i, ns in zip(keys.tolist(), totals.tolist(), strict=True)}


def bubble_intervals(
    parts: dict[int, list[StepParts]], steps: list[int], colls: Collectives
) -> list[StepBubbles]:
    """Classes of every rank for every step in ``steps`` (the steps common to all ranks)."""
    wanted = set(steps)
    result = []
    for rank in sorted(parts):
        waits = RankWaits.of(colls, rank)
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
        *(f"{c}_ms" for c in BUBBLE_CLASSES),
        "contention_ms",
    ]
    return pd.DataFrame(rows, columns=columns)


ROLE_CLASSES = ("straggler_wait", "exposed_comm")


def role_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """Per rank, step and role (:data:`optim.markers.ROLES`), in ms: the straggler_wait and
    exposed_comm spent in collectives of that role (every role on every row, 0 when none)."""
    rows = [
        {
            "rank": sb.rank,
            "step": sb.step,
            "role": role,
            **{f"{c}_ms": sb.by_role_ns.get((c, role), 0) / 1e6 for c in ROLE_CLASSES},
        }
        for sb in steps
        for role in ROLES
    ]
    return pd.DataFrame(rows, columns=["rank", "step", "role", *(f"{c}_ms" for c in ROLE_CLASSES)])


def _spans(frame: pd.DataFrame) -> iv.Intervals:
    start = frame["ts_ns"].to_numpy()
    return iv.union(start, start + frame["dur_ns"].to_numpy())


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
    is_transfer = is_comm & np.isin(gpu.index.to_numpy(), _transfer_rows(trace))
    sm_comm = is_comm & (gpu["cat"] == "kernel").to_numpy()  # copy engines take no SMs
    contention = _contention(
        end[is_compute] - start[is_compute],
        _like(gpu[is_compute]),
        (start[is_compute], end[is_compute]),
        iv.union(start[sm_comm], end[sm_comm]),
    )
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
                transfer=iv.clip(
                    iv.union(start[comm & is_transfer], end[comm & is_transfer]), lo, hi
                ),
                everything=iv.clip(iv.union(start[sel], end[sel]), lo, hi),
                contention_ns=int(contention[launched_in == step].sum()),
            )
        )
    return out


def _main_thread(ev: pd.DataFrame, marks: pd.DataFrame) -> object:
    """The training thread: the one with the step marks, else the one with the most ops."""
    if len(marks):
        return marks["tid"].mode().iloc[0]
    ops = ev[(ev["cat"] == "cpu_op") & (ev["device"] == "cpu")]
    return ops["tid"].value_counts().index[0] if len(ops) else None


def _cpu_windows(cpu: pd.DataFrame, marks: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(step, start, end) of each window: the step marks, else (a trace without steps) the
    span of all the rank's CPU events, as step 0."""
    if len(marks):
        return [
            (int(s), int(lo), int(lo) + int(dur))
            for s, lo, dur in marks[["step", "ts_ns", "dur_ns"]].itertuples(index=False)
        ]
    if cpu.empty:
        return []
    start = cpu["ts_ns"].to_numpy()
    return [(0, int(start.min()), int((start + cpu["dur_ns"].to_numpy()).max()))]


def _cpu_parts(trace: RankTrace, config: BubbleConfig) -> list[StepParts]:
    ev = trace.events
    marks = ev[(ev["kind"] == "step") & (ev["device"] == "cpu")]
    main_tid = _main_thread(ev, marks)
    main = ev[(ev["tid"] == main_tid) & (ev["device"] == "cpu")]
    comm_all = ev[(ev["kind"] == "comm") & (ev["device"] == "cpu")]
    colls = trace.collectives.set_index("row").reindex(comm_all.index).rename_axis("row")
    comm_start = arrivals(trace, colls.reset_index())  # in flight from its enqueue on gloo
    comm_end = (comm_all["ts_ns"] + comm_all["dur_ns"]).to_numpy()
    ops = main[(main["cat"] == "cpu_op") & (main["kind"] != "step")]
    tree = op_tree(ops["ts_ns"].to_numpy(), (ops["ts_ns"] + ops["dur_ns"]).to_numpy())
    names = ops["name"].cat.categories
    is_compute_name = np.array([str(n).startswith(config.compute_op_prefixes) for n in names])
    codes = ops["name"].cat.codes.to_numpy()[tree.rows]
    chosen = is_compute_name[codes] if len(codes) else np.zeros(0, bool)
    compute = tree.innermost(chosen)
    op_start = tree.start[chosen]
    like = _like(ops.iloc[tree.rows[chosen]])
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
    for step, lo, hi in _cpu_windows(ev[ev["device"] == "cpu"], marks):
        comm = (comm_start < hi) & (comm_end > lo)
        out.append(
            StepParts(
                rank=trace.rank,
                step=step,
                device="cpu",
                window=(lo, hi),
                compute=iv.clip(compute, lo, hi),
                comm=iv.clip(iv.union(comm_start[comm], comm_end[comm]), lo, hi),
                comm_rows=comm_all.index.to_numpy()[comm],
                loading=iv.clip(loading, lo, hi),
                loader_comm=iv.clip(loader_comm, lo, hi),
                contention_ns=int(contention[(op_start >= lo) & (op_start < hi)].sum()),
            )
        )
    return out


def _transfer_rows(trace: RankTrace) -> np.ndarray:
    """Rows of the communication events that are no synchronizing collective."""
    colls = trace.collectives
    return colls.loc[~colls["coll"].isin(SYNC_COLLECTIVES), "row"].to_numpy()


def _like(events: pd.DataFrame) -> np.ndarray:
    """One code per kind of op or kernel: its name and, where recorded, its shapes."""
    pairs = np.stack([events["name"].cat.codes.to_numpy(), events["shape_key"].to_numpy()], 1)
    return (
        np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1) if len(pairs) else pairs[:, 0]
    )


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
    alone = pd.Series(dur[~overlaps]).groupby(names[~overlaps]).median()
    baseline = pd.Series(names).map(alone).to_numpy(np.float64)
    extra = dur - baseline
    extra = np.where(overlaps & ~np.isnan(extra), np.maximum(extra, 0), 0)
    return extra.astype(np.int64)
