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
DDP record ranges of their own around the issue (:func:`fsobs.trace.classify.framework_role`:
torchrec's input dist, pooled and sequence all-to-alls, reduce-scatter and their backward are
``embedding``, DDP's gradient all-reduce ``dense``). The innermost such range around the launch
gives the role when neither PEC's range nor a marker does; a collective none of them encloses
has no role here (the analysis then looks at its group,
:mod:`fsobs.analysis.collectives.matching`)::

    main   |## sparse_data_dist ##-------------------------------|
             |## all2all_data:kjt splits ##|  |cudaLaunchKernel|       -> embedding
    bwd    |evaluate_function: torch::autograd::AccumulateGrad-|
             |c10d::allreduce_|cudaLaunchKernel|                      -> dense
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from fsobs.trace._decode import Args, Event, raw_value
from fsobs.trace.categorical import string_dtype
from fsobs.trace.classify import (
    collective_from_annotation,
    collective_from_c10d,
    collective_from_kernel,
    dtype_bytes,
    framework_role,
    normalize_collective,
)
from fsobs.trace.schema import COLLECTIVE_COLUMNS, KINDS
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

    def find(self, thread: np.ndarray, when: np.ndarray) -> np.ndarray:
        """For every ``i``, the row of the innermost event around ``when[i]`` on thread
        ``thread[i]``; -1 where none is."""
        out = np.full(len(when), -1, dtype=np.int64)
        for tid, (starts, ends, rows, parent) in self._by_tid.items():
            mine = np.flatnonzero(thread == tid)
            at = when[mine]
            pos = np.searchsorted(starts, at, side="right") - 1
            # from the latest event started by then, climb to the innermost still open
            ended = pos >= 0
            ended[ended] = ends[pos[ended]] < at[ended]
            while ended.any():
                pos[ended] = parent[pos[ended]]
                ended &= pos >= 0
                ended[ended] = ends[pos[ended]] < at[ended]
            hit = pos >= 0
            out[mine[hit]] = rows[pos[hit]]
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


class EventArrays:
    """The columns of one rank's events that the collective metadata reads, as numpy arrays
    taken once (each read of a pandas column costs microseconds, and they are read often)."""

    def __init__(
        self,
        ts: np.ndarray,
        dur: np.ndarray,
        tid: np.ndarray,
        name: pd.Categorical,
        on_cpu: np.ndarray,
        corr: np.ndarray,
    ) -> None:
        self.ts = ts
        self.end = ts + dur
        self.tid = tid
        """Thread codes."""
        self.codes: np.ndarray = name.codes
        """Name codes, into :attr:`names`."""
        self.names: list[str] = name.categories.tolist()
        self.on_cpu = on_cpu
        self.corr = corr
        rows = np.flatnonzero(on_cpu & (corr >= 0))
        self.launches: dict[int, int] = dict(zip(corr[rows].tolist(), rows.tolist(), strict=True))
        """correlation id -> row of the CPU runtime call that launched it."""
        self.markers = [parse_comm_marker(n) for n in self.names]
        """FreeScale's marker (:func:`optim.markers.parse_comm_marker`) of each name."""

    def launch_of(self, rows: Sequence[int] | np.ndarray) -> npt.NDArray[np.int64]:
        """The row of the CPU call that launched each of ``rows`` (by correlation id); -1
        where none did."""
        corr = self.corr[np.asarray(rows, dtype=np.int64)].tolist()
        return np.array([self.launches.get(c, -1) for c in corr], dtype=np.int64)

    def cpu_rows(self, per_name: Sequence[bool]) -> npt.NDArray[np.bool_]:
        """Row mask of the CPU events whose name is flagged in ``per_name`` (one flag a name)."""
        rows: npt.NDArray[np.bool_] = np.array(per_name, dtype=bool)[self.codes] & self.on_cpu
        return rows

    def enclosing(self, per_name: Sequence[bool]) -> _Enclosing:
        """An :class:`_Enclosing` of the CPU events whose name is flagged in ``per_name``."""
        return _Enclosing(self.ts, self.end, self.tid, self.cpu_rows(per_name))


def communication_launches(arrays: EventArrays, kind: np.ndarray) -> np.ndarray:
    """Rows of the GPU kernels and copies launched inside a collective's call on the CPU (a
    ``record_param_comms`` op, an ``nccl:*`` range or FreeScale's ``## fsobs:comm:... ##``):
    communication whatever their names, e.g. the copy-engine memcpys of an NCCL zero-CTA
    all-to-all, or a copy kernel that moves a collective's data. ``kind``: the codes of the
    ``kind`` column (into :data:`fsobs.trace.schema.KINDS`)."""
    copy_or_compute = np.isin(kind, (KINDS.index("memcpy"), KINDS.index("compute")))
    candidates = np.flatnonzero(~arrays.on_cpu & copy_or_compute)
    if not len(candidates):
        return candidates
    flags = [
        n == "record_param_comms" or n.startswith("nccl:") or marker is not None
        for n, marker in zip(arrays.names, arrays.markers, strict=True)
    ]
    context = arrays.cpu_rows(flags)
    if not context.any():
        return candidates[:0]
    enclosing = _Enclosing(arrays.ts, arrays.end, arrays.tid, context)
    launch = arrays.launch_of(candidates)
    candidates, launch = candidates[launch >= 0], launch[launch >= 0]
    return candidates[enclosing.find(arrays.tid[launch], arrays.ts[launch]) >= 0]


def build_collectives(
    arrays: EventArrays, comm_rows: np.ndarray, structs: dict[int, Event]
) -> pd.DataFrame:
    """One row per communication event (``comm_rows``, the rows of ``kind == "comm"``);
    columns documented in :mod:`fsobs.trace.schema`.

    ``structs`` holds the decoded events of the rows whose args may carry collective metadata.
    """
    rows = comm_rows.tolist()
    own = [_own_metadata(arrays, row, structs.get(row)) for row in rows]
    lacking = [row for row, record in zip(rows, own, strict=True) if record is None]
    around = dict(zip(lacking, _around_launches(arrays, lacking, structs), strict=True))
    records = []
    for row, record in zip(rows, own, strict=True):
        if record is None:
            name = arrays.names[arrays.codes[row]]
            record = around[row] or {"coll": collective_from_kernel(name), "source": "kernel_name"}
        record["row"] = row
        records.append(record)
    if records:
        _comm_markers(arrays, records)
    return _frame(records)


def _own_metadata(arrays: EventArrays, row: int, event: Event | None) -> dict[str, Any] | None:
    """What a communication event says of itself (module docstring, sources 1 and 5): its
    args, its gloo annotation, or that it is a peer-to-peer copy; None: nothing."""
    if event is None:  # a copy or kernel that is communication by where it was launched
        return {"coll": "transfer", "source": "launch_context"}
    record = _from_args(event.args)
    if record is None and arrays.on_cpu[row]:
        record = _from_gloo(arrays.names[arrays.codes[row]], event.args)
    if record is None and event.cat == "gpu_memcpy":
        record = {"coll": "p2p_copy", "source": "memcpy"}
    return record


def _around_launches(
    arrays: EventArrays, rows: list[int], structs: dict[int, Event]
) -> list[dict[str, Any] | None]:
    """What the CPU ranges around the launch of each row say (module docstring, sources 2
    and 3): the ``record_param_comms`` op's args, else the ``nccl:*`` annotation; None where
    neither does, or the row has no launch."""
    found: list[dict[str, Any] | None] = [None] * len(rows)
    launch = arrays.launch_of(rows)
    has = np.flatnonzero(launch >= 0)
    if not len(has):
        return found
    names, codes = arrays.names, arrays.codes
    thread, when = arrays.tid[launch[has]], arrays.ts[launch[has]]
    param_comms = arrays.enclosing([n == "record_param_comms" for n in names]).find(thread, when)
    annotations = arrays.enclosing([n.startswith("nccl:") for n in names]).find(thread, when)
    for i, op, annotation in zip(
        has.tolist(), param_comms.tolist(), annotations.tolist(), strict=True
    ):
        record = _from_enclosing(op, structs, "record_param_comms")
        if record is None and annotation >= 0:
            coll = collective_from_annotation(names[codes[annotation]])
            record = {"coll": coll, "source": "annotation"} if coll else None
        found[i] = record
    return found


def _comm_markers(arrays: EventArrays, records: list[dict[str, Any]]) -> None:
    """Set ``role`` from the ranges around each collective's issue (for a GPU kernel: around
    its launch; :func:`_roles_at`), and link every gloo collective to its enqueue
    (:func:`_link_gloo`)."""
    markers = arrays.enclosing([m is not None for m in arrays.markers])
    issued = [r for r in records if r["source"] != "gloo"]
    launch = arrays.launch_of([r["row"] for r in issued])
    launched = [record for record, row in zip(issued, launch.tolist(), strict=True) if row >= 0]
    rows = launch[launch >= 0]
    roles = _roles_at(arrays, rows, _markers_at(arrays, markers, rows))
    for record, role in zip(launched, roles, strict=True):
        if role:
            record["role"] = role
    gloo = [r for r in records if r["source"] == "gloo"]
    if gloo:
        _link_gloo(arrays, gloo, markers)


def _markers_at(
    arrays: EventArrays, markers: _Enclosing, rows: np.ndarray
) -> list[tuple[str, str] | None]:
    """FreeScale's marker (``(role, pg_name)``) around each of the CPU ``rows``."""
    found = markers.find(arrays.tid[rows], arrays.ts[rows]).tolist()
    return [arrays.markers[arrays.codes[f]] if f >= 0 else None for f in found]


def _roles_at(
    arrays: EventArrays, rows: np.ndarray, marks: list[tuple[str, str] | None]
) -> list[str | None]:
    """The role of a collective issued at each of the CPU ``rows`` (``marks``: the markers
    around them): PEC's range around it, else FreeScale's marker, else torchrec's or DDP's
    own range (:func:`_framework_roles`); None when none of them is there."""
    pec = _pec_roles(arrays, rows)
    framework = _framework_roles(arrays, rows)
    return [p or (m[0] if m else None) or f for p, m, f in zip(pec, marks, framework, strict=True)]


def _framework_roles(arrays: EventArrays, rows: np.ndarray) -> list[str | None]:
    """The role of the innermost torchrec or DDP range around each of the CPU ``rows`` (None
    outside them)."""
    roles = [framework_role(n) for n in arrays.names]
    mask = arrays.cpu_rows([r is not None for r in roles])
    if not mask.any():
        return [None] * len(rows)
    ranges = _Enclosing(arrays.ts, arrays.end, arrays.tid, mask)
    found = ranges.find(arrays.tid[rows], arrays.ts[rows]).tolist()
    return [roles[arrays.codes[f]] if f >= 0 else None for f in found]


def _pec_roles(arrays: EventArrays, rows: np.ndarray) -> list[str | None]:
    """The PEC role of each of the CPU ``rows`` from the PEC range around it (module
    docstring); None outside PEC's ranges."""
    names = arrays.names
    in_pec = arrays.cpu_rows([n in PEC_RANGES for n in names])
    if not in_pec.any():
        return [None] * len(rows)
    thread, when = arrays.tid[rows], arrays.ts[rows]
    pec = _Enclosing(arrays.ts, arrays.end, arrays.tid, in_pec).find(thread, when)
    ids = arrays.enclosing([n == PEC_MASK_RANGE for n in names]).find(thread, when)
    roles: list[str | None] = []
    for found, in_ids in zip(pec.tolist(), ids.tolist(), strict=True):
        role = PEC_RANGES[names[arrays.codes[found]]] if found >= 0 else None
        if role == "pec_mask" and in_ids < 0:
            role = None  # another collective of overlap_dist, not the mask exchange
        roles.append(role)
    return roles


def _link_gloo(arrays: EventArrays, gloo: list[dict[str, Any]], markers: _Enclosing) -> None:
    """Group, enqueue time and role of every gloo collective (see the module docstring).

    1. Each collective votes for its worker thread with the group of the marker around the
       latest enqueue (``c10d::*`` op) of the same collective before it; every collective of
       a thread gets the thread's majority group (unmarked: the default group, None).
    2. A gloo group runs its queue in order (FIFO), so per group and collective the k-th
       enqueue is the k-th collective to start: paired in that order (an enqueue at or before
       the collective's start; collectives whose enqueue predates the trace stay unpaired).
       ``enqueue_ns`` is the enqueue's start, when the rank asked for the collective (the
       analyzer's arrival); ``role`` is the role of the ranges around that enqueue
       (:func:`_roles_at`).
    """
    ts, tid, codes = arrays.ts, arrays.tid, arrays.codes
    colls = np.array([collective_from_c10d(n) or "" for n in arrays.names])
    enqueue = np.flatnonzero(arrays.on_cpu & (colls[codes] != ""))
    enqueue = enqueue[np.argsort(ts[enqueue], kind="stable")]
    enqueue_marks = _markers_at(arrays, markers, enqueue)
    marks = dict(zip(enqueue.tolist(), enqueue_marks, strict=True))
    roles = dict(zip(enqueue.tolist(), _roles_at(arrays, enqueue, enqueue_marks), strict=True))
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


def _from_enclosing(row: int, structs: dict[int, Event], source: str) -> dict[str, Any] | None:
    if row < 0 or row not in structs:
        return None
    record = _from_args(structs[row].args)
    if record is not None:
        record["source"] = source
    return record


_ARG_FIELDS = operator.attrgetter(
    "coll_name",
    "in_nelems",
    "out_nelems",
    "group_size",
    "dtype",
    "in_split",
    "out_split",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "seq",
    "comms_id",
)
"""The raw collective fields of an :class:`Args`, in the order :func:`_from_args` reads them."""


def _from_args(args: Args | None) -> dict[str, Any] | None:
    if args is None or not args.coll_name:
        return None
    # the fields as one JSON array (an absent field as null): one decode instead of twelve
    text = b"[" + b",".join([raw or b"null" for raw in _ARG_FIELDS(args)]) + b"]"
    try:
        values = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    coll, in_nelems, out_nelems, group_size, dtype, in_split, out_split = values[:7]
    pg_name, pg_desc, pg_ranks, seq, comms_id = values[7:]
    record: dict[str, Any] = {
        "coll": normalize_collective(str(coll)),
        "in_nelems": _int(in_nelems),
        "out_nelems": _int(out_nelems),
        "group_size": _int(group_size, limit=2**31),
        "dtype": _str(dtype),
        "in_split": _str(in_split),
        "out_split": _str(out_split),
        "pg_name": _str(pg_name),
        "pg_desc": _str(pg_desc),
        "pg_ranks": _str(pg_ranks),
        "seq": _int(seq),
        "comms_id": _uint(comms_id),
        "source": "args",
    }
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


def _int(value: object, limit: int = 2**63) -> int:
    """An integer field, -1 when absent, malformed or outside the column's range
    ``[-limit, limit)``."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return -1
    if not isinstance(value, int):
        return -1
    return int(value) if -limit <= value < limit else -1


def _uint(value: object) -> int:
    number = _int(value, limit=2**64)
    return number if number >= 0 else 0


def _str(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def _frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    data: dict[str, Any] = {}
    for col in COLLECTIVE_COLUMNS:
        values = [record.get(col) for record in records]
        if col in _INT_COLUMNS:
            data[col] = np.array([-1 if v is None else v for v in values], dtype=_INT_COLUMNS[col])
        elif col == "comms_id":
            data[col] = np.array([0 if v is None else v for v in values], dtype=np.uint64)
        else:
            data[col] = _categorical(values)
    return pd.DataFrame(data)  # in COLLECTIVE_COLUMNS order


_NO_STRINGS = pd.CategoricalDtype(pd.Index([], dtype=np.float64))
_NO_VALUES = pd.CategoricalDtype(pd.Index([], dtype=object))


def _categorical(values: list[str | None]) -> pd.Categorical:
    """``pd.Categorical(values)`` (the distinct strings, sorted, are the categories; None is
    missing) without pandas' type inference, which costs tens of microseconds a column."""
    categories = sorted({v for v in values if v is not None})
    if not categories:  # pandas infers float64 categories from Nones, object ones from []
        dtype = _NO_STRINGS if values else _NO_VALUES
        codes = np.full(len(values), -1)
    else:
        dtype = string_dtype(tuple(categories))
        code = {v: i for i, v in enumerate(categories)}
        codes = np.array([-1 if v is None else code[v] for v in values])
    # pandas-stubs: codes are array-likes, not only a Sequence
    return pd.Categorical.from_codes(codes, dtype=dtype)  # type: ignore[arg-type]
