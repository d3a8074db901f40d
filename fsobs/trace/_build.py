"""Turn a decoded Kineto file into a :class:`RankTrace` (columnar, classified, step-attributed)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from fsobs.errors import FsobsError, TraceFormatError, TraceReadError
from fsobs.runformat.runmeta import MAX_WORLD_SIZE
from fsobs.storage import Location
from fsobs.trace._collectives import EventArrays, build_collectives, communication_launches
from fsobs.trace._columns import _MAX_ABS_NS, ColumnBuilder
from fsobs.trace._decode import (
    TraceFile,
    decode_event_array,
    decode_events,
    decode_trace,
    raw_value,
    read_trace_bytes,
)
from fsobs.trace._plausible import describe_outside, far_outside
from fsobs.trace._stream import EventStream, SplitError
from fsobs.trace.classify import (
    COMM_KERNEL_RE,
    classify,
    comm_kernel_re,
    is_device_cat,
    step_number,
)
from fsobs.trace.schema import EVENT_COLUMNS, KINDS, ProcessGroup, RankTrace

BATCH = 16_384  # events decoded to typed structs at a time
_MAX_STEP = 2**31 - 1  # the step column is int32
_COMM, _STEP, _ANNOTATION = (KINDS.index(k) for k in ("comm", "step", "annotation"))
_KIND_DTYPE = pd.CategoricalDtype(list(KINDS))
_DEVICE_DTYPE = pd.CategoricalDtype(["cpu", "gpu"])


def build_rank_trace(
    path: Location,
    max_bytes: int,
    max_held: int,
    step_marker: str | None = None,
    comm_kernels: tuple[str, ...] = (),
) -> RankTrace:
    """Read, decode and tabulate one trace file. Raises :class:`FsobsError` on bad input.
    ``max_bytes``: the most text read; ``max_held``: the most held whole in memory
    (:class:`fsobs.trace.LoadConfig`). ``comm_kernels``: the user's patterns of communication
    kernels (:func:`fsobs.trace.classify.comm_kernel_re`).

    The file is first read as a stream (:mod:`fsobs.trace._stream`): a few MB of JSON text at a
    time. Should that fail for any reason (an unusual layout, or bad input), it is read again
    whole, which also words the error if the input is bad.
    """
    comm = comm_kernel_re(comm_kernels)
    try:
        return _build_streaming(path, max_bytes, max_held, step_marker, comm)
    except TraceReadError:
        raise  # the file itself cannot be read: the whole-file path could not either
    except (SplitError, msgspec.MsgspecError, FsobsError, UnicodeDecodeError, RecursionError):
        return _build_whole(path, min(max_bytes, max_held), max_held < max_bytes, step_marker, comm)


def _build_streaming(
    path: Location,
    max_bytes: int,
    max_held: int,
    step_marker: str | None = None,
    comm: re.Pattern[str] = COMM_KERNEL_RE,
) -> RankTrace:
    stream = EventStream(path, max_bytes, max_held)
    builder = ColumnBuilder(path, -1)
    offset = 0
    for chunk in stream:
        events = decode_event_array(chunk)
        builder.add(events, offset)
        offset += len(events)
    return _finish(decode_trace(stream.skeleton, path), builder, path, step_marker, comm)


def _build_whole(
    path: Location,
    max_bytes: int,
    held: bool,
    step_marker: str | None = None,
    comm: re.Pattern[str] = COMM_KERNEL_RE,
) -> RankTrace:
    """The whole JSON text in memory while its events are decoded, batch by batch;
    ``max_bytes`` is the limit of text held whole (``held``) or per trace."""
    data = read_trace_bytes(path, max_bytes, held=held)
    trace = decode_trace(data, path)
    builder = ColumnBuilder(path, _rank_info(trace, path)[0])
    raws = trace.traceEvents
    for offset in range(0, len(raws), BATCH):
        builder.add(decode_events(raws[offset : offset + BATCH], data, path, offset), offset)
    trace.traceEvents = []
    del raws, data  # nothing references the JSON text any more
    return _finish(trace, builder, path, step_marker, comm)


def _finish(
    trace: TraceFile,
    builder: ColumnBuilder,
    path: Location,
    step_marker: str | None,
    comm: re.Pattern[str],
) -> RankTrace:
    """The events table and the rank's facts, once every event is in ``builder``."""
    rank, world_size, backend = _rank_info(trace, path)
    base_ns = trace.baseTimeNanoseconds or 0
    if abs(base_ns) > _MAX_ABS_NS:
        raise TraceFormatError(
            f"out of range: {base_ns}", path=path, rank=_r(rank), field="baseTimeNanoseconds"
        )
    columns = builder.columns()
    columns["ts_ns"] = _to_ns(columns["ts_raw"], base_ns)
    columns["dur_ns"] = np.rint(columns["dur_raw"] * 1000.0).astype(np.int64)
    warnings: list[str] = []
    structs = builder.structs
    outside = far_outside(columns["ts_ns"], columns["dur_ns"])
    if outside.any():
        warnings.append(_outside_warning(path, columns, outside))
        columns = {key: values[~outside] for key, values in columns.items()}
        row = np.cumsum(~outside) - 1  # old row -> new row
        structs = {int(row[i]): e for i, e in structs.items() if not outside[i]}
    kind, on_cpu = _kind_and_device(columns, comm)
    arrays = EventArrays(
        columns["ts_ns"],
        columns["dur_ns"],
        columns["tid"].codes,
        columns["name"],
        on_cpu,
        columns["correlation"],
    )
    if step_marker:
        _use_step_marker(kind, arrays, step_marker)
    kind[communication_launches(arrays, kind)] = _COMM
    # pandas-stubs: codes are array-likes, not only a Sequence
    columns["kind"] = pd.Categorical.from_codes(kind, dtype=_KIND_DTYPE)  # type: ignore[arg-type]
    device = (~on_cpu).astype(np.int8)
    columns["device"] = pd.Categorical.from_codes(device, dtype=_DEVICE_DTYPE)  # type: ignore[arg-type]
    columns["step"] = _assign_steps(arrays, kind, columns["event_index"], path, rank)
    ts_raw, dur_raw = columns.pop("ts_raw"), columns.pop("dur_raw")
    if builder.hta_round:
        columns["hta_ts"] = np.ceil(ts_raw)
        columns["hta_end"] = np.floor(ts_raw + dur_raw)
    else:
        columns["hta_ts"] = ts_raw
        columns["hta_end"] = ts_raw + dur_raw
    events = pd.DataFrame({key: columns[key] for key in EVENT_COLUMNS})

    whole = not (kind == _STEP).any()
    if whole:
        what = f"no range named {step_marker!r}..." if step_marker else "no ProfilerStep events"
        warnings.append(
            f"{path.name}: {what}; the whole trace is analyzed as one window (step 0)"
            + ("" if step_marker else "; --step-marker NAME splits it at your iteration ranges")
        )
    return RankTrace(
        path=path,
        rank=rank,
        world_size=world_size,
        backend=backend,
        host_name=trace.host_name,
        base_time_ns=trace.baseTimeNanoseconds,
        time_format="relative-us" if trace.baseTimeNanoseconds is not None else "absolute-us",
        process_groups=_process_groups(trace, path, rank),
        device_properties=_device_properties(trace, path),
        thread_names=builder.thread_names,
        events=events,
        collectives=build_collectives(arrays, np.flatnonzero(kind == _COMM), structs),
        warnings=warnings,
        step_source="whole trace" if whole else (step_marker or "ProfilerStep"),
    )


def _rank_info(trace: TraceFile, path: Location) -> tuple[int, int, str | None]:
    """(rank, world_size, backend); rank -1 when the file has no ``distributedInfo.rank``."""
    info = trace.distributedInfo
    if info is None or info.rank is None:
        return -1, -1, info.backend if info else None
    if info.rank < 0:
        raise TraceFormatError(
            f"rank must be >= 0, got {info.rank}", path=path, field="distributedInfo.rank"
        )
    for key, value in (("rank", info.rank), ("world_size", info.world_size)):
        if value is not None and value > MAX_WORLD_SIZE:
            raise TraceFormatError(
                f"{value} is beyond any run (at most {MAX_WORLD_SIZE} ranks)",
                path=path,
                field=f"distributedInfo.{key}",
            )
    world_size = info.world_size if info.world_size is not None else -1
    if info.world_size is not None and not 0 <= info.rank < info.world_size:
        raise TraceFormatError(
            f"rank {info.rank} is outside world_size {info.world_size}",
            path=path,
            rank=info.rank,
            field="distributedInfo.world_size",
        )
    return info.rank, world_size, info.backend


def _r(rank: int) -> int | None:
    return rank if rank >= 0 else None


def _to_ns(ts: npt.NDArray[np.float64], base_ns: int) -> np.ndarray:
    """Microseconds (relative to ``base_ns``, or absolute when it is 0) -> absolute int64 ns.

    Whole and fractional microseconds are converted apart, so absolute timestamps (about 1.7e15
    µs, exact in float64) keep their nanoseconds."""
    whole = np.floor(ts)
    frac_ns = np.rint((ts - whole) * 1000.0).astype(np.int64)
    return whole.astype(np.int64) * 1000 + frac_ns + base_ns


def _kind_and_device(
    columns: dict[str, Any], comm: re.Pattern[str]
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.bool_]]:
    """The ``kind`` codes (into :data:`KINDS`) and the CPU mask of the events: classified once
    per distinct (cat, name) pair, then broadcast to the rows."""
    cat_codes = columns["cat"].codes.astype(np.int64)
    name_codes = columns["name"].codes.astype(np.int64)
    cats = columns["cat"].categories.tolist()
    names = columns["name"].categories.tolist()
    pair = (cat_codes + 1) * (len(names) + 1) + name_codes
    uniq, inverse = np.unique(pair, return_inverse=True)
    kind_of_pair = []
    device_cat = []
    for key in uniq.tolist():
        cat_code, name_code = divmod(key, len(names) + 1)
        cat = cats[cat_code - 1] if cat_code > 0 else None
        kind_of_pair.append(KINDS.index(classify(cat, names[name_code], comm)))
        device_cat.append(is_device_cat(cat))
    kind = np.array(kind_of_pair, dtype=np.int8)[inverse]
    on_device = np.array(device_cat, dtype=bool)[inverse] | (columns["stream"] >= 0)
    return kind, ~on_device


def _use_step_marker(kind: np.ndarray, arrays: EventArrays, marker: str) -> None:
    """Make the CPU ranges named ``marker...`` the steps (in ``kind``, the codes of the
    events' kinds), the outermost ones only (a marker range inside another is part of that
    step); ProfilerSteps become plain annotations."""
    matches = np.array([n.startswith(marker) for n in arrays.names], dtype=bool)
    is_mark = matches[arrays.codes] & arrays.on_cpu
    rows = np.flatnonzero(is_mark)
    rows = rows[np.argsort(arrays.ts[rows], kind="stable")]
    start = arrays.ts[rows]
    reach = np.maximum.accumulate(arrays.end[rows])
    nested = np.zeros(len(rows), dtype=bool)
    nested[1:] = start[1:] < reach[:-1]
    is_mark[rows[nested]] = False
    kind[(kind == _STEP) & ~is_mark] = _ANNOTATION
    kind[is_mark] = _STEP


def _assign_steps(
    arrays: EventArrays, kind: np.ndarray, event_index: np.ndarray, path: Location, rank: int
) -> np.ndarray:
    """The step of every event: CPU events by window, GPU events through their launch.

    A CPU event belongs to step ``s`` when ``s.start <= ts < s.end`` (HTA's rule). A GPU event
    belongs to the step of the CPU event that shares its correlation id, whenever it ran.
    Steps are the ``ProfilerStep#N`` numbers, or 0, 1, ... in time order for a step marker;
    a trace without any step is one window, step 0, every event in it.
    """
    on_cpu, ts = arrays.on_cpu, arrays.ts
    marks = np.flatnonzero((kind == _STEP) & on_cpu)
    if not len(marks):
        return np.zeros(len(kind), dtype=np.int32)
    steps = np.full(len(kind), -1, dtype=np.int32)
    # in start order; "quicksort" (not stable) orders ties as the pandas sort this replaced
    marks = marks[np.argsort(ts[marks], kind="quicksort")]
    starts, ends = ts[marks], arrays.end[marks]
    names = [arrays.names[code] for code in arrays.codes[marks].tolist()]
    numbers = _step_numbers(names, event_index[marks].tolist(), path, rank)
    if (numbers < 0).any():  # a step marker: number the ranges in time order
        numbers = np.arange(len(marks), dtype=np.int32)
    pos = np.searchsorted(starts, ts, side="right") - 1
    inside = on_cpu & (pos >= 0) & (ts < ends[np.maximum(pos, 0)])
    steps[inside] = numbers[pos[inside]]

    corr = arrays.corr
    launches = on_cpu & (corr >= 0) & (steps >= 0)
    if launches.any():
        # the step of each correlation id's first launch, looked up for the GPU events
        ids, first = np.unique(corr[launches], return_index=True)
        launch_steps = steps[launches][first]
        gpu = ~on_cpu & (corr >= 0)
        wanted = corr[gpu]
        pos = np.minimum(np.searchsorted(ids, wanted), len(ids) - 1)
        steps[gpu] = np.where(ids[pos] == wanted, launch_steps[pos], -1)
    return steps


def _step_numbers(names: list[str], index: list[int], path: Location, rank: int) -> np.ndarray:
    """The ``ProfilerStep#N`` numbers of the step ranges (their names and event indices; -1
    for other names); a number beyond the int32 ``step`` column is an error naming the event."""
    numbers = []
    for name, event in zip(names, index, strict=True):
        try:
            number = step_number(name)
        except ValueError:  # more digits than Python converts to an int
            number = _MAX_STEP + 1
        if number > _MAX_STEP:
            raise TraceFormatError(
                f"step number out of range (at most {_MAX_STEP}) in {name[:48]!r}",
                path=path,
                rank=_r(rank),
                field=f"traceEvents[{event}].name",
            )
        numbers.append(number)
    return np.array(numbers, dtype=np.int32)


def _outside_warning(path: Location, columns: dict[str, Any], outside: np.ndarray) -> str:
    """The warning for the events left out as far outside the trace's span."""
    first = int(np.flatnonzero(outside)[0])
    index, name = columns["event_index"][first], columns["name"][first]
    how = describe_outside(columns["ts_ns"], columns["dur_ns"], outside)
    return (
        f"{path.name}: {int(outside.sum())} event(s) far outside the trace's span left out, "
        f"not counted (traceEvents[{index}] {str(name)!r} {how}; more than a day from the "
        "rest of the trace is a wrong time, not a measurement)"
    )


def _process_groups(trace: TraceFile, path: Location, rank: int) -> tuple[ProcessGroup, ...]:
    info = trace.distributedInfo
    if info is None or not info.pg_config:
        return ()
    groups = []
    for i, pg in enumerate(info.pg_config):
        ranks: Sequence[int] | str | None = pg.ranks
        if isinstance(ranks, str):
            try:
                ranks = [int(r) for r in ranks.strip("[] ").split(",") if r.strip()]
            except ValueError as exc:
                raise TraceFormatError(
                    f"cannot parse ranks {pg.ranks!r}",
                    path=path,
                    rank=_r(rank),
                    field=f"distributedInfo.pg_config[{i}].ranks",
                ) from exc
        ranks = tuple(ranks or ())
        groups.append(
            ProcessGroup(
                name=str(pg.pg_name),
                desc=pg.pg_desc or "",
                size=pg.pg_size if pg.pg_size is not None else len(ranks),
                ranks=ranks,
            )
        )
    return tuple(groups)


def _device_properties(trace: TraceFile, path: Location) -> list[dict[str, Any]]:
    try:
        value = raw_value(trace.deviceProperties)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(str(exc), path=path, field="deviceProperties") from exc
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
