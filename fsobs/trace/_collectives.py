"""Collective metadata for every communication event of one rank.

The metadata is taken from the first source that has it:

1. the event's own args (NCCL kernels since PyTorch 2.2 carry ``Collective name``, sizes,
   process group and ``Seq``);
2. the ``record_param_comms`` op that enclosed the kernel's launch on the CPU;
3. the ``nccl:<collective>`` annotation that enclosed the launch (older traces; this is what
   tells an all_to_all apart from point-to-point SendRecv kernels);
4. the kernel name (``ncclKernel_AllReduce_*`` -> all_reduce);
5. for gloo, the ``gloo:<collective>`` annotation itself, sizes from ``Input Dims``.

The ``role`` of a collective (embedding, dense, other) and, on gloo, its process group come from
the range ``## fsobs:comm:<role>:<pg_name> ##`` that FreeScale records around the issue of every
collective it sees (:mod:`optim.markers`): for a GPU kernel, the range around its launch. gloo
annotations run on the group's worker threads, away from the issue; each gloo collective takes
the role of the range around the latest enqueue (``c10d::*`` op) of the same collective before
it, and votes with that range's group for its worker thread. A gloo group runs its collectives
on worker threads of its own, so every collective of a thread gets the thread's majority group
(unmarked enqueues vote for the default group)::

    main   |comm:dense:2 |c10d::allreduce_|      |c10d::alltoall_base_|   (unmarked)
    gloo t7                |gloo:all_reduce----|                           t7 -> group "2"
    gloo t5                                          |gloo:all_to_all--|   t5 -> default

torchrec's PEC pipeline records ranges of its own around the launch of its collectives
(:data:`optim.markers.PEC_RANGES`); a collective launched inside one takes that range's PEC
role (``pec_overlapped``, ``pec_ahead``, ``pec_mask``, ...) over the marker's role, which is
coarser (FreeScale marks every embedding collective ``embedding``); the marker still gives the
group. Inside ``## pec_overlap_dist ##`` only the launches under ``## all2all_data:ids ##`` are
the mask exchange. The launch is where the marker's is: a GPU kernel's ``cudaLaunchKernel``, a
gloo collective's enqueue (the ``c10d::*`` op it is paired with in FIFO order)::

    main   |## pec_ol_compute ##----------------|    |## pec_ol_grad_a2a ##-|
           |  |c10d::alltoall_base_|            |    |  |c10d::alltoall_base_|
    gloo                 |gloo:all_to_all---|               |gloo:all_to_all---|
                          pec_overlapped                     pec_overlapped_grad

A job without FreeScale's markers still says the role of most of its collectives: torchrec and
DDP record ranges of their own around the issue (:data:`fsobs.trace.classify.FRAMEWORK_ROLE_RANGES`:
torchrec's input dist, pooled and sequence all-to-alls, reduce-scatter and their backward are
``embedding``, DDP's gradient all-reduce ``dense``). The innermost such range around the launch
gives the role when neither PEC's range nor a marker does; a collective none of them encloses
has no role here (the analysis then looks at its group, :mod:`fsobs.analysis.matching`)::

    main   |## sparse_data_dist ##-------------------------------|
             |## all2all_data:kjt splits ##|  |cudaLaunchKernel|       -> embedding
    bwd    |evaluate_function: torch::autograd::AccumulateGrad-|
             |c10d::allreduce_|cudaLaunchKernel|                      -> dense
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any, cast

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from fsobs.trace._decode import Args, Event, raw_value
from fsobs.trace.classify import (
    collective_from_annotation,
    collective_from_c10d,
    collective_from_kernel,
    dtype_bytes,
    framework_role,
    normalize_collective,
)
from fsobs.trace.schema import COLLECTIVE_COLUMNS
from optim.markers import PEC_MASK_RANGE, PEC_RANGES, parse_comm_marker

_INT_COLUMNS = {"row": np.int64, "group_size": np.int32, "seq": np.int64}
_INT_COLUMNS |= {"in_nelems": np.int64, "out_nelems": np.int64, "msg_bytes": np.int64}
_INT_COLUMNS |= {"enqueue_ns": np.int64}
_MAX_UNPAIRED_HEAD = 8
"""Collectives at the start of a trace whose enqueue can predate the trace (a queue's depth)."""
DEFAULT_PG_NAME = "0"
"""torch's name for the default process group (``dist.group.WORLD.group_name``)."""


class _Enclosing:
    """Finds, per thread, the innermost event of a set that covers a time: of the events
    around it, the one that started last (ranges nest on a thread)::

        |## sparse_data_dist ##----------------------------|
           |## kjt splits ##|        ^ t: the outer one (the inner one has ended)
    """

    def __init__(self, ts: np.ndarray, end: np.ndarray, tid: np.ndarray, mask: np.ndarray) -> None:
        self._by_tid: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        rows = np.flatnonzero(mask)
        for thread in np.unique(tid[rows]):
            mine = rows[tid[rows] == thread]
            mine = mine[np.lexsort((-end[mine], ts[mine]))]  # an outer range before its inner
            starts, ends = ts[mine], end[mine]
            self._by_tid[int(thread)] = (starts, ends, mine, _open_before(starts, ends))

    def find(self, thread: int, when: int) -> int:
        found = self._by_tid.get(thread)
        if found is None:
            return -1
        starts, ends, rows, parent = found
        pos = int(np.searchsorted(starts, when, side="right")) - 1
        while pos >= 0 and ends[pos] < when:
            pos = int(parent[pos])
        return int(rows[pos]) if pos >= 0 else -1

    def covers(self, thread: np.ndarray, when: np.ndarray) -> npt.NDArray[np.bool_]:
        """``find(thread[i], when[i]) >= 0`` for every ``i``, at once."""
        out = np.zeros(len(when), dtype=bool)
        for tid, (starts, ends, _, _) in self._by_tid.items():
            mine = np.flatnonzero(thread == tid)
            pos = np.searchsorted(starts, when[mine], side="right") - 1
            inside = pos >= 0
            reach = np.maximum.accumulate(ends) if len(ends) else ends
            out[mine[inside]] = reach[pos[inside]] >= when[mine[inside]]
        return out


def _open_before(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each event (sorted by start), the latest earlier one still open when it starts
    (-1: none): walking these from the latest event started before ``t`` reaches every event
    that covers ``t``, the innermost first."""
    parent = np.full(len(starts), -1, np.int64)
    stack: list[int] = []
    end = ends.tolist()
    for i, start in enumerate(starts.tolist()):
        while stack and end[stack[-1]] < start:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _name_mask(events: pd.DataFrame, test: Callable[[str], bool]) -> np.ndarray:
    """Row mask of events whose name passes ``test`` (evaluated once per distinct name)."""
    per_name = np.array([test(str(n)) for n in events["name"].cat.categories], dtype=bool)
    return per_name[events["name"].cat.codes.to_numpy()]


def communication_launches(events: pd.DataFrame) -> np.ndarray:
    """Rows of the GPU kernels and copies launched inside a collective's call on the CPU (a
    ``record_param_comms`` op, an ``nccl:*`` range or FreeScale's ``## fsobs:comm:... ##``):
    communication whatever their names, e.g. the copy-engine memcpys of an NCCL zero-CTA
    all-to-all, or a copy kernel that moves a collective's data."""
    on_cpu = (events["device"] == "cpu").to_numpy()
    kind = events["kind"].to_numpy()
    candidates = np.flatnonzero(~on_cpu & np.isin(kind, ("memcpy", "compute")))
    if not len(candidates):
        return candidates
    context = on_cpu & _name_mask(
        events,
        lambda n: n == "record_param_comms"
        or n.startswith("nccl:")
        or parse_comm_marker(n) is not None,
    )
    if not context.any():
        return candidates[:0]
    ts = events["ts_ns"].to_numpy()
    tid = events["tid"].cat.codes.to_numpy()
    enclosing = _Enclosing(ts, ts + events["dur_ns"].to_numpy(), tid, context)
    launches = _launches(events, on_cpu)
    corr = events["correlation"].to_numpy()[candidates].tolist()
    launch = np.array([launches.get(c, -1) for c in corr], dtype=np.int64)
    candidates, launch = candidates[launch >= 0], launch[launch >= 0]
    return candidates[enclosing.covers(tid[launch], ts[launch])]


def build_collectives(events: pd.DataFrame, structs: dict[int, Event]) -> pd.DataFrame:
    """One row per ``kind == "comm"`` event; columns documented in :mod:`fsobs.trace.schema`.

    ``structs`` holds the decoded events of the rows whose args may carry collective metadata.
    """
    comm_rows = np.flatnonzero((events["kind"] == "comm").to_numpy())
    if not len(comm_rows):
        return _frame([])
    on_cpu = (events["device"] == "cpu").to_numpy()
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    tid = events["tid"].cat.codes.to_numpy()
    names = events["name"].cat.categories
    name_codes = events["name"].cat.codes.to_numpy()
    param_comms = _Enclosing(
        ts, end, tid, on_cpu & _name_mask(events, lambda n: n == "record_param_comms")
    )
    annotations = _Enclosing(
        ts, end, tid, on_cpu & _name_mask(events, lambda n: n.startswith("nccl:"))
    )
    launches = _launches(events, on_cpu)

    records: list[dict[str, Any]] = []
    for row in comm_rows:
        name = str(names[name_codes[row]])
        event = structs.get(int(row))
        if event is None:  # a copy or kernel that is communication by where it was launched
            records.append({"coll": "transfer", "source": "launch_context", "row": int(row)})
            continue
        record = _from_args(event.args)
        if record is None and on_cpu[row]:
            record = _from_gloo(name, event.args)
        if record is None and event.cat == "gpu_memcpy":
            record = {"coll": "p2p_copy", "source": "memcpy"}
        if record is None:
            launch = launches.get(int(cast(np.int64, events.at[row, "correlation"])))
            if launch is not None:
                thread, when = int(tid[launch]), int(ts[launch])
                record = _from_enclosing(
                    param_comms.find(thread, when), structs, "record_param_comms"
                )
                if record is None:
                    enclosing = annotations.find(thread, when)
                    coll = (
                        collective_from_annotation(str(names[name_codes[enclosing]]))
                        if enclosing >= 0
                        else None
                    )
                    record = {"coll": coll, "source": "annotation"} if coll else None
        if record is None:
            record = {"coll": collective_from_kernel(name), "source": "kernel_name"}
        record["row"] = int(row)
        records.append(record)
    _comm_markers(events, records, on_cpu, launches)
    return _frame(records)


def _comm_markers(
    events: pd.DataFrame,
    records: list[dict[str, Any]],
    on_cpu: np.ndarray,
    launches: dict[int, int],
) -> None:
    """Set ``role`` from the ranges around each collective's issue (for a GPU kernel: around
    its launch; :func:`_role_at`), and link every gloo collective to its enqueue
    (:func:`_link_gloo`)."""
    parsed = [parse_comm_marker(str(n)) for n in events["name"].cat.categories]
    ts = events["ts_ns"].to_numpy()
    tid = events["tid"].cat.codes.to_numpy()
    codes = events["name"].cat.codes.to_numpy()
    is_marker = np.array([p is not None for p in parsed], dtype=bool)[codes] & on_cpu
    markers = _Enclosing(ts, ts + events["dur_ns"].to_numpy(), tid, is_marker)

    def marker_at(row: int) -> tuple[str, str] | None:
        found = markers.find(int(tid[row]), int(ts[row]))
        return parsed[int(codes[found])] if found >= 0 else None

    role_at = _role_at(events, on_cpu, marker_at)
    for record in records:
        if record["source"] != "gloo":
            launch = launches.get(int(cast(np.int64, events.at[record["row"], "correlation"])))
            role = role_at(launch) if launch is not None else None
            if role:
                record["role"] = role
    gloo = [r for r in records if r["source"] == "gloo"]
    if gloo:
        _link_gloo(events, gloo, on_cpu, marker_at, role_at)


def _role_at(
    events: pd.DataFrame,
    on_cpu: np.ndarray,
    marker_at: Callable[[int], tuple[str, str] | None],
) -> Callable[[int], str | None]:
    """The role of a collective issued at a CPU row: PEC's range around it, else FreeScale's
    marker, else torchrec's or DDP's own range (:func:`_framework_roles`); None when none of
    them is there."""
    pec_at = _pec_roles(events, on_cpu)
    framework_at = _framework_roles(events, on_cpu)

    def role_at(row: int) -> str | None:
        marker = marker_at(row)
        return pec_at(row) or (marker[0] if marker else None) or framework_at(row)

    return role_at


def _framework_roles(events: pd.DataFrame, on_cpu: np.ndarray) -> Callable[[int], str | None]:
    """The role of the innermost torchrec or DDP range around a CPU row (a function of the
    row, None outside them)."""
    roles = [framework_role(str(n)) for n in events["name"].cat.categories]
    codes = events["name"].cat.codes.to_numpy()
    mask = np.array([r is not None for r in roles], dtype=bool)[codes] & on_cpu
    if not mask.any():
        return lambda row: None
    ts = events["ts_ns"].to_numpy()
    tid = events["tid"].cat.codes.to_numpy()
    ranges = _Enclosing(ts, ts + events["dur_ns"].to_numpy(), tid, mask)

    def role_at(row: int) -> str | None:
        found = ranges.find(int(tid[row]), int(ts[row]))
        return roles[int(codes[found])] if found >= 0 else None

    return role_at


def _pec_roles(events: pd.DataFrame, on_cpu: np.ndarray) -> Callable[[int], str | None]:
    """The PEC role of a CPU row from the PEC range around it (module docstring): a function
    of the row, None outside PEC's ranges."""
    names = [str(n) for n in events["name"].cat.categories]
    codes = events["name"].cat.codes.to_numpy()
    in_pec = np.array([n in PEC_RANGES for n in names], dtype=bool)[codes] & on_cpu
    if not in_pec.any():
        return lambda row: None
    ts = events["ts_ns"].to_numpy()
    end = ts + events["dur_ns"].to_numpy()
    tid = events["tid"].cat.codes.to_numpy()
    pec = _Enclosing(ts, end, tid, in_pec)
    is_ids = np.array([n == PEC_MASK_RANGE for n in names], dtype=bool)[codes] & on_cpu
    ids = _Enclosing(ts, end, tid, is_ids)

    def role_at(row: int) -> str | None:
        thread, when = int(tid[row]), int(ts[row])
        found = pec.find(thread, when)
        if found < 0:
            return None
        role = PEC_RANGES[names[int(codes[found])]]
        if role == "pec_mask" and ids.find(thread, when) < 0:
            return None  # another collective of overlap_dist, not the mask exchange
        return role

    return role_at


def _link_gloo(
    events: pd.DataFrame,
    gloo: list[dict[str, Any]],
    on_cpu: np.ndarray,
    marker_at: Callable[[int], tuple[str, str] | None],
    role_at: Callable[[int], str | None],
) -> None:
    """Group, enqueue time and role of every gloo collective (see the module docstring).

    1. Each collective votes for its worker thread with the group of the marker around the
       latest enqueue (``c10d::*`` op) of the same collective before it; every collective of
       a thread gets the thread's majority group (unmarked: the default group, None).
    2. A gloo group runs its queue in order (FIFO), so per group and collective the k-th
       enqueue is the k-th collective to start: paired in that order (an enqueue at or before
       the collective's start; collectives whose enqueue predates the trace stay unpaired).
       ``enqueue_ns`` is the enqueue's start, when the rank asked for the collective (the
       analyzer's arrival); ``role`` is the role of the ranges around that enqueue
       (:func:`_role_at`).
    """
    ts = events["ts_ns"].to_numpy()
    tid = events["tid"].cat.codes.to_numpy()
    codes = events["name"].cat.codes.to_numpy()
    colls = np.array([collective_from_c10d(str(n)) or "" for n in events["name"].cat.categories])
    enqueue = np.flatnonzero(on_cpu & (colls[codes] != ""))
    enqueue = enqueue[np.argsort(ts[enqueue], kind="stable")]
    marks = {int(row): marker_at(int(row)) for row in enqueue}
    roles = {int(row): role_at(int(row)) for row in enqueue}
    if any(m is not None and m[1] == DEFAULT_PG_NAME for m in marks.values()):
        # the markers name the default group: an unmarked enqueue (the loop's own collective)
        # is on that same group, and its queue holds it too
        marks = {row: m or ("other", DEFAULT_PG_NAME) for row, m in marks.items()}
    by_coll = {c: enqueue[colls[codes[enqueue]] == c] for c in {r["coll"] for r in gloo}}
    votes: dict[int, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
    for record in gloo:
        mine = by_coll[record["coll"]]
        pos = int(np.searchsorted(ts[mine], ts[record["row"]], side="right")) - 1
        found = marks[int(mine[pos])] if pos >= 0 else None
        votes[int(tid[record["row"]])][found[1] if found else None] += 1
    for record in gloo:
        tally = votes[int(tid[record["row"]])]
        record["pg_name"] = max(tally, key=lambda g: (tally[g], g is None))
    queues: dict[tuple[str | None, str], list[dict[str, Any]]] = defaultdict(list)
    for record in sorted(gloo, key=lambda r: ts[r["row"]]):
        queues[record["pg_name"], record["coll"]].append(record)
    for (group, coll), queue in queues.items():
        asked = [
            int(row)
            for row in by_coll[coll]
            if (mark[1] if (mark := marks[int(row)]) else None) == group
        ]
        _pair_in_order(queue, asked, ts, roles)


def _pair_in_order(
    queue: list[dict[str, Any]],
    asked: list[int],
    ts: np.ndarray,
    roles: dict[int, str | None],
) -> None:
    """Pair a group's collectives (in start order) with its enqueues (in time order), FIFO.

    The trace window cuts both ends: a collective enqueued before the window opened has no
    enqueue in the trace (only at the start), one enqueued but not started when it closed has
    no collective (only at the end). So the k-th collective pairs with enqueue ``k - a`` for the
    smallest ``a`` that never pairs a collective with a later enqueue."""
    starts = [int(ts[r["row"]]) for r in queue]
    times = [int(ts[row]) for row in asked]
    for skip in range(min(len(queue), _MAX_UNPAIRED_HEAD) + 1):
        pairs = list(zip(range(skip, len(queue)), range(len(times)), strict=False))
        if all(times[j] <= starts[i] for i, j in pairs):
            break
    else:
        return  # no consistent FIFO pairing: leave the collectives without an enqueue
    for i, j in pairs:
        record = queue[i]
        record["enqueue_ns"] = times[j]
        role = roles[asked[j]]
        if role:
            record["role"] = role


def _launches(events: pd.DataFrame, on_cpu: np.ndarray) -> dict[int, int]:
    """correlation id -> row of the CPU runtime call that launched it."""
    corr = events["correlation"].to_numpy()
    mask = on_cpu & (corr >= 0)
    rows = np.flatnonzero(mask)
    return dict(zip(corr[rows].tolist(), rows.tolist(), strict=True))


def _from_enclosing(row: int, structs: dict[int, Event], source: str) -> dict[str, Any] | None:
    if row < 0 or row not in structs:
        return None
    record = _from_args(structs[row].args)
    if record is not None:
        record["source"] = source
    return record


def _from_args(args: Args | None) -> dict[str, Any] | None:
    if args is None or not args.coll_name:
        return None
    try:
        coll = raw_value(args.coll_name)
        record: dict[str, Any] = {
            "coll": normalize_collective(str(coll)),
            "in_nelems": _int(raw_value(args.in_nelems)),
            "out_nelems": _int(raw_value(args.out_nelems)),
            "group_size": _int(raw_value(args.group_size), bits=31),
            "dtype": _str(raw_value(args.dtype)),
            "in_split": _str(raw_value(args.in_split)),
            "out_split": _str(raw_value(args.out_split)),
            "pg_name": _str(raw_value(args.pg_name)),
            "pg_desc": _str(raw_value(args.pg_desc)),
            "pg_ranks": _str(raw_value(args.pg_ranks)),
            "seq": _int(raw_value(args.seq)),
            "comms_id": _uint(raw_value(args.comms_id)),
            "source": "args",
        }
    except msgspec.DecodeError:
        return None
    record["msg_bytes"] = _bytes(record["in_nelems"], record["dtype"])
    return record


def _from_gloo(name: str, args: Args | None) -> dict[str, Any] | None:
    coll = collective_from_annotation(name)
    if coll is None:
        return None
    record: dict[str, Any] = {"coll": coll, "source": "gloo"}
    if args is None:
        return record
    try:
        dims = raw_value(args.input_dims)
        types = raw_value(args.input_type)
    except msgspec.DecodeError:
        return record
    if isinstance(dims, list):
        shapes = [d for d in dims if isinstance(d, list) and d]
        nelems = sum(math.prod(int(x) for x in d if isinstance(x, int)) for d in shapes)
        if shapes:
            record["in_nelems"] = _int(nelems)
    if isinstance(types, list) and types and isinstance(types[0], str):
        record["dtype"] = types[0]
        record["msg_bytes"] = _bytes(record.get("in_nelems", -1), types[0])
    return record


def _bytes(nelems: int, dtype: str | None) -> int:
    """Message size in bytes, -1 when unknown or beyond int64."""
    size = dtype_bytes(dtype)
    total = nelems * size if nelems >= 0 and size > 0 else -1
    return total if total < 2**63 else -1


def _int(value: object, bits: int = 63) -> int:
    """An integer field, -1 when absent, malformed or outside the column's range."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return -1
    if not isinstance(value, int):
        return -1
    return int(value) if -(2**bits) <= value < 2**bits else -1


def _uint(value: object) -> int:
    number = _int(value, bits=64)
    return number if number >= 0 else 0


def _str(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    columns: dict[str, list[Any]] = defaultdict(list)
    for record in records:
        for col in COLLECTIVE_COLUMNS:
            columns[col].append(record.get(col))
    data: dict[str, Any] = {}
    for col in COLLECTIVE_COLUMNS:
        values = columns[col]
        if col in _INT_COLUMNS:
            data[col] = np.array([-1 if v is None else v for v in values], dtype=_INT_COLUMNS[col])
        elif col == "comms_id":
            data[col] = np.array([0 if v is None else v for v in values], dtype=np.uint64)
        else:
            data[col] = pd.Categorical(values)
    return pd.DataFrame(data, columns=list(COLLECTIVE_COLUMNS))
