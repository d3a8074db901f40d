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

from dataclasses import dataclass, field
from itertools import pairwise
from typing import cast

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
    """Position in :data:`optim.markers.ROLES` (``embedding``, ``dense``, ``other``)."""

    @staticmethod
    def of_ranks(colls: Collectives, ranks: list[int]) -> dict[int, RankWaits]:
        """Those of each rank in ``ranks`` (none for a rank without matched collectives)."""
        inst = colls.instances
        rank = inst["rank"].to_numpy(np.int64)
        shift = np.array([colls.offsets_ns.get(r, 0) for r in rank.tolist()], np.int64)
        last = inst["arrival_last_ns"].to_numpy(np.int64) + shift
        by_priority = np.lexsort((inst["instance"].to_numpy(), -last, rank))
        ranked = rank[by_priority]
        priority = np.empty(len(rank), np.int64)
        priority[by_priority] = np.arange(len(rank)) - np.searchsorted(ranked, ranked)
        order = np.lexsort((inst["row"].to_numpy(), rank))
        columns = {
            "rows": inst["row"].to_numpy(np.int64),
            "start": inst["start_ns"].to_numpy(np.int64) + shift,
            "wait_end": np.minimum(last, inst["end_ns"].to_numpy(np.int64) + shift),
            "end": inst["end_ns"].to_numpy(np.int64) + shift,
            "last_rank": inst["last_rank"].to_numpy(np.int64),
            "priority": priority,
            "role": pd.Categorical(inst["role"], categories=ROLES).codes.astype(np.int64),
        }
        columns = {name: values[order] for name, values in columns.items()}
        first = np.searchsorted(rank[order], ranks, "left")
        stop = np.searchsorted(rank[order], ranks, "right")
        return {
            r: RankWaits(**{name: values[a:b] for name, values in columns.items()})
            for r, a, b in zip(ranks, first.tolist(), stop.tolist(), strict=True)
        }

    def find(self, rows: np.ndarray) -> np.ndarray:
        """Position of each of ``rows`` among the matched collectives, -1 where unmatched."""
        return iv.position(self.rows, rows)


def step_parts(trace: RankTrace, config: BubbleConfig | None = None) -> list[StepParts]:
    """Per-step parts of one rank (every step it recorded)."""
    if trace.device == "gpu":
        return _gpu_parts(trace)
    return _cpu_parts(trace, config or BubbleConfig())


def classify(parts: list[StepParts], waits: RankWaits) -> list[StepBubbles]:
    """Split the step windows of one rank into the classes, given its matched collectives.

    Every class is a pointwise formula of the rank's interval sets, each clipped to its step's
    window, so steps with disjoint windows are classified together, in one pass over all
    their boundaries (:func:`fsobs.analysis.intervals.segments`), and each step gets the part
    of the result inside its window: what it would get alone. Steps whose windows overlap
    (never on a GPU, whose windows tile the timeline) are classified one by one.
    """
    windows = [p.window for p in parts]
    order = sorted(range(len(parts)), key=windows.__getitem__)
    disjoint = all(windows[a][1] <= windows[b][0] for a, b in pairwise(order))
    done: dict[int, StepBubbles] = {}
    for batch in [order] if disjoint else [[i] for i in order]:
        classified = _classify_disjoint([parts[i] for i in batch], waits)
        done.update(zip(batch, classified, strict=True))
    return [done[i] for i in range(len(parts))]


def _classify_disjoint(parts: list[StepParts], waits: RankWaits) -> list[StepBubbles]:
    """:func:`classify` for steps sorted by window, with windows that do not overlap."""
    lo = np.array([p.window[0] for p in parts], np.int64)
    hi = np.array([p.window[1] for p in parts], np.int64)
    step, pos = _matched(parts, waits)
    wait_set = _pieces(waits.start[pos], waits.wait_end[pos], lo[step], hi[step])
    matched = _pieces(waits.start[pos], waits.end[pos], lo[step], hi[step])
    layers = {"window": (lo, hi), "wait_set": wait_set, "matched": matched}
    for name in ("compute", "comm", "transfer", "everything", "loading", "loader_comm"):
        sets = [getattr(p, name) for p in parts]
        layers[name] = (np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))
    bounds, cover = iv.segments(list(layers.values()))
    classes = _formulas(parts[0].device, dict(zip(layers, cover.T, strict=True)))
    label = np.searchsorted(lo, bounds[:-1], "right")  # the window a segment lies in
    split = {name: _split(iv.runs(bounds, mask, label), lo) for name, mask in classes.items()}
    charged = _charge(bounds, classes, waits, (step, pos), (wait_set, matched), len(parts))
    return [
        StepBubbles(
            p.rank,
            p.step,
            p.window,
            {name: split[name][k] for name in CLASSES},
            p.contention_ns,
            *charged[k],
        )
        for k, p in enumerate(parts)
    ]


def _matched(parts: list[StepParts], waits: RankWaits) -> tuple[np.ndarray, np.ndarray]:
    """(step index, position in ``waits``) of every matched collective among each step's
    communication events, by step and then position."""
    pos = waits.find(np.concatenate([p.comm_rows for p in parts]))
    of_step = np.repeat(np.arange(len(parts)), [len(p.comm_rows) for p in parts])
    found = pos >= 0
    order = np.lexsort((pos[found], of_step[found]))
    return of_step[found][order], pos[found][order]


def _pieces(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> iv.Intervals:
    """Each ``[start, end)`` clipped to the window ``[lo, hi)`` of its step (empty ones kept
    empty, so that piece i stays collective i)."""
    clipped_start = np.maximum(start, lo)
    return clipped_start, np.maximum(np.minimum(end, hi), clipped_start)


def _formulas(device: str, on: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The classes as masks over elementary segments, from the layers covering each (the
    rules of the module docstring)."""
    matched = on["matched"] | on["transfer"]
    if device == "gpu":
        blocked = on["comm"] & ~on["compute"]
        idle = on["window"] & ~on["everything"]
        other = on["everything"] & ~(on["compute"] | on["comm"])
        busy = on["compute"]
    else:
        inside = on["loader_comm"] & ~on["compute"]
        blocked = (on["comm"] & ~on["compute"] & ~on["loading"]) | inside
        idle = on["loading"] & ~on["compute"] & ~inside
        other = np.zeros_like(idle)
        busy = on["window"] & ~blocked & ~idle
    wait = blocked & on["wait_set"]
    return {
        "busy": busy,
        "straggler_wait": wait,
        "exposed_comm": blocked & matched & ~wait,
        "unattributed_comm": blocked & ~matched,
        "host_idle": idle,
        "other": other,
    }


def _split(runs: iv.Intervals, lo: np.ndarray) -> list[iv.Intervals]:
    """The runs of each window (every run lies inside one window; windows sorted, disjoint)."""
    cuts = [0, *np.searchsorted(runs[0], lo[1:]).tolist(), len(runs[0])]
    return [(runs[0][a:b], runs[1][a:b]) for a, b in pairwise(cuts)]


Charges = tuple[dict[int, int], dict[tuple[str, str], int]]


def _charge(
    bounds: np.ndarray,
    classes: dict[str, np.ndarray],
    waits: RankWaits,
    matched: tuple[np.ndarray, np.ndarray],
    pieces: tuple[iv.Intervals, iv.Intervals],
    num_steps: int,
) -> list[Charges]:
    """Who caused each piece of straggler wait, and the role of the collective each piece of
    wait and exposed time belongs to, per step (``classes``: masks over the segments between
    ``bounds``; ``matched``: step index and position in ``waits`` of each collective of
    ``pieces``, its wait and its whole span clipped to the step's window).

    Straggler wait goes to the matched instance covering it whose last arrival is latest (the
    binding one), and so to that instance's last rank::

        wait set      |=========|      |====|
        instance a  |-----------)                  last rank 2, arrives at 40
        instance b        |--------------------)   last rank 3, arrives at 70 (charged first)
        charged        2  |  3  |      |  3 |

    Exposed time covered by several collectives goes to embedding before dense before other.
    """
    step, pos = matched
    by_wait = np.argsort(-waits.priority[pos], kind="stable")  # the binding one last
    waited = _owned(bounds, classes["straggler_wait"], pieces[0], by_wait)
    by_role = np.argsort(-waits.role[pos], kind="stable")  # embedding last
    exposed = _owned(bounds, classes["exposed_comm"], pieces[1], by_role)
    charges: list[Charges] = [({}, {}) for _ in range(num_steps)]
    steps, culprits, roles = step.tolist(), waits.last_rank[pos].tolist(), waits.role[pos].tolist()
    for i in np.flatnonzero(waited).tolist():
        caused, by_role = charges[steps[i]]
        culprit, key, ns = culprits[i], ("straggler_wait", ROLES[roles[i]]), int(waited[i])
        caused[culprit] = caused.get(culprit, 0) + ns
        by_role[key] = by_role.get(key, 0) + ns
    for i in np.flatnonzero(exposed).tolist():
        by_role = charges[steps[i]][1]
        key = ("exposed_comm", ROLES[roles[i]])
        by_role[key] = by_role.get(key, 0) + int(exposed[i])
    return charges


def _owned(
    bounds: np.ndarray, target: np.ndarray, pieces: iv.Intervals, order: np.ndarray
) -> np.ndarray:
    """ns of the ``target`` segments (a mask over the segments between ``bounds``) owned by
    each piece; where pieces overlap, the later one in ``order`` owns the segment."""
    owner = np.full(len(target), -1, np.int64)
    first = np.searchsorted(bounds, pieces[0]).tolist()
    stop = np.searchsorted(bounds, pieces[1]).tolist()
    for i in order.tolist():
        owner[first[i] : stop[i]] = i
    owned = target & (owner >= 0)
    ns = np.zeros(len(pieces[0]), np.int64)
    np.add.at(ns, owner[owned], np.diff(bounds)[owned])
    return ns


BUBBLE_TABLE_COLUMNS = [
    "rank",
    "step",
    "window_ms",
    "busy_ms",
    "bubble_ms",
    *(f"{c}_ms" for c in BUBBLE_CLASSES),
    "contention_ms",
]
ROLE_CLASSES = ("straggler_wait", "exposed_comm")
ROLE_TABLE_COLUMNS = ["rank", "step", "role", *(f"{c}_ms" for c in ROLE_CLASSES)]
CAUSED_COLUMNS = ["step", "rank", "culprit", "wait_ns"]
Columns = dict[str, np.ndarray]


def bubble_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """Per rank and step, in ms: window, busy, bubble and its classes, contention beside."""
    return _frame([_bubble_columns(steps)], BUBBLE_TABLE_COLUMNS)


def role_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """Per rank, step and role (:data:`optim.markers.ROLES`), in ms: the straggler_wait and
    exposed_comm spent in collectives of that role (every role on every row, 0 when none)."""
    return _frame([_role_columns(steps)], ROLE_TABLE_COLUMNS)


def caused_table(steps: list[StepBubbles]) -> pd.DataFrame:
    """step, rank (who waited), culprit (who caused it), wait_ns: straggler_wait, charged
    (:attr:`StepBubbles.caused_ns`; no row for 0 ns)."""
    return _frame([_caused_columns(steps)], CAUSED_COLUMNS)


@dataclass
class StepTables:
    """:func:`bubble_table`, :func:`role_table` and :func:`caused_table` of a run, gathered a
    rank at a time (:meth:`add`): only their numbers are kept, not the steps' interval sets."""

    bubbles: list[Columns] = field(default_factory=list)
    roles: list[Columns] = field(default_factory=list)
    caused: list[Columns] = field(default_factory=list)

    def add(self, steps: list[StepBubbles]) -> None:
        self.bubbles.append(_bubble_columns(steps))
        self.roles.append(_role_columns(steps))
        self.caused.append(_caused_columns(steps))

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(bubble table, role table, caused table), rows in the order added."""
        return (
            _frame(self.bubbles, BUBBLE_TABLE_COLUMNS),
            _frame(self.roles, ROLE_TABLE_COLUMNS),
            _frame(self.caused, CAUSED_COLUMNS),
        )


def _frame(chunks: list[Columns], columns: list[str]) -> pd.DataFrame:
    """The rows of ``chunks`` in order (a frame without rows when there are none)."""
    chunks = [c for c in chunks if len(c[columns[0]])]
    if not chunks:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame({n: np.concatenate([c[n] for c in chunks]) for n in columns})


def _bubble_columns(steps: list[StepBubbles]) -> Columns:
    table: Columns = {
        "rank": np.array([sb.rank for sb in steps], np.int64),
        "step": np.array([sb.step for sb in steps], np.int64),
        "window_ms": np.array([sb.window[1] - sb.window[0] for sb in steps], np.int64) / 1e6,
    }
    for name in CLASSES:
        table[f"{name}_ms"] = _total_ns([sb.classes[name] for sb in steps]) / 1e6
    table["bubble_ms"] = table["window_ms"] - table["busy_ms"]
    table["contention_ms"] = np.array([sb.contention_ns for sb in steps], np.int64) / 1e6
    return table


def _role_columns(steps: list[StepBubbles]) -> Columns:
    every = [(sb, role) for sb in steps for role in ROLES]
    return {
        "rank": np.array([sb.rank for sb, _ in every], np.int64),
        "step": np.array([sb.step for sb, _ in every], np.int64),
        "role": np.array([role for _, role in every], object),
        **{
            f"{c}_ms": np.array([sb.by_role_ns.get((c, r), 0) for sb, r in every], np.int64) / 1e6
            for c in ROLE_CLASSES
        },
    }


def _caused_columns(steps: list[StepBubbles]) -> Columns:
    rows = [
        (sb.step, sb.rank, culprit, ns)
        for sb in steps
        for culprit, ns in sb.caused_ns.items()
        if ns > 0
    ]
    table = np.array(rows, np.int64).reshape(len(rows), len(CAUSED_COLUMNS))
    return dict(zip(CAUSED_COLUMNS, table.T, strict=True))


def _total_ns(sets: list[iv.Intervals]) -> np.ndarray:
    """Total length of each canonical set (what :meth:`StepBubbles.total_ns` gives one)."""
    if not sets:
        return np.zeros(0, np.int64)
    pieces = np.concatenate([s[1] for s in sets]) - np.concatenate([s[0] for s in sets])
    running = np.concatenate([[0], np.cumsum(pieces)])
    bounds = np.cumsum([0, *(len(s[0]) for s in sets)])
    return cast(np.ndarray, running[bounds[1:]] - running[bounds[:-1]])


def step_times(steps: pd.DataFrame) -> pd.Series:
    """The step time of each step of a :func:`bubble_table` (ms, indexed by step): its longest
    window over the ranks."""
    return steps.groupby("step")["window_ms"].max().rename("step_time_ms")


def _spans(frame: pd.DataFrame) -> iv.Intervals:
    start = frame["ts_ns"].to_numpy()
    return iv.union(start, start + frame["dur_ns"].to_numpy())


def _gpu_windows(
    step: np.ndarray, start: np.ndarray, end: np.ndarray
) -> dict[int, tuple[int, int]]:
    """GPU window of every step (``step``, ``start``, ``end``: those of the rank's GPU events):
    from its first GPU event to the next step's first one.

    Consecutive windows tile the GPU timeline, so a gap between steps (data loading, a late
    launch) counts once, as host_idle of the step before it, and work of two steps that overlap
    (pipelining) is never counted twice. The last recorded step ends with its own last event::

        step 1 work |====|  |===|         step 2 work  |===| |====|
        window 1    [-----------------)   window 2     [----------]
    """
    mine = step >= 0
    steps, which = np.unique(step[mine], return_inverse=True)
    first = np.full(len(steps), np.iinfo(np.int64).max)
    np.minimum.at(first, which, start[mine])
    last = np.full(len(steps), np.iinfo(np.int64).min)
    np.maximum.at(last, which, end[mine])
    order = np.argsort(first, kind="quicksort")  # as pandas' sort_values
    starts = first[order].tolist()
    ends = [*starts[1:], int(last[order[-1]])] if len(order) else []
    return {
        int(s): (lo, max(hi, lo))
        for s, lo, hi in zip(steps[order].tolist(), starts, ends, strict=True)
    }


def _gpu_parts(trace: RankTrace) -> list[StepParts]:
    ev = trace.events
    rows = np.flatnonzero((ev["stream"].to_numpy() >= 0) & _is_in(ev["kind"], _GPU_WORK))
    start = ev["ts_ns"].to_numpy()[rows]
    end = start + ev["dur_ns"].to_numpy()[rows]
    is_compute = _is_in(ev["kind"], ("compute",))[rows]
    is_comm = _is_in(ev["kind"], ("comm",))[rows]
    is_transfer = is_comm & np.isin(rows, _transfer_rows(trace))
    sm_comm = is_comm & _is_in(ev["cat"], ("kernel",))[rows]  # copy engines take no SMs
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
    out = []
    for s, (lo, hi) in _gpu_windows(step, start, end).items():
        out.append(
            StepParts(
                rank=trace.rank,
                step=s,
                device="gpu",
                window=(lo, hi),
                compute=iv.clip(compute, lo, hi),
                comm=iv.clip(comm, lo, hi),
                comm_rows=comm_rows[(comm_start < hi) & (comm_end > lo)],
                transfer=iv.clip(transfer, lo, hi),
                everything=iv.clip(everything, lo, hi),
                contention_ns=int(contention[step[is_compute] == s].sum()),
            )
        )
    return out


def _is_in(column: pd.Series, values: tuple[str, ...]) -> np.ndarray:
    """Row mask of a categorical column: its value is one of ``values`` (never when NaN)."""
    hit = np.array([c in values for c in column.cat.categories] + [False])
    return hit[column.cat.codes.to_numpy()]


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


def _like(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """One code per kind of op or kernel at ``rows`` of ``events``: its name and, where
    recorded, its shapes."""
    name = events["name"].cat.codes.to_numpy()[rows]
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
    return cast(np.ndarray, np.append(median, np.nan)[iv.position(groups, wanted)])  # -1: the NaN
