"""Turn a decoded Kineto file into a :class:`RankTrace` (columnar, classified, step-attributed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fsobs.errors import TraceFormatError
from fsobs.trace._collectives import build_collectives
from fsobs.trace._decode import Args, Event, TraceFile, raw_value
from fsobs.trace.classify import classify, is_device_cat, step_number
from fsobs.trace.schema import KINDS, ProcessGroup, RankTrace

_MAX_ABS_NS = 2**62  # times and durations in ns, so that base + ts stays inside int64
_MAX_ABS_US = _MAX_ABS_NS // 1000


def build_rank_trace(trace: TraceFile, path: Path) -> RankTrace:
    """Columnar view of one decoded trace file. Raises :class:`TraceFormatError` on bad values."""
    rank, world_size, backend = _rank_info(trace, path)
    base_ns = trace.baseTimeNanoseconds or 0
    if abs(base_ns) > _MAX_ABS_NS:
        raise TraceFormatError(
            f"out of range: {base_ns}", path=path, rank=_r(rank), field="baseTimeNanoseconds"
        )
    all_events = trace.traceEvents
    _check_complete(all_events, path, rank)
    # HTA rounds timestamps to whole microseconds when the ts column is not all integers.
    hta_round = any(e.ts.__class__ is not int for e in all_events)
    index = [i for i, e in enumerate(all_events) if e.dur is not None and e.cat != "Trace"]
    kept = [all_events[i] for i in index]

    where = (index, path, rank)
    ts_raw = _array([e.ts for e in kept], np.float64 if hta_round else np.int64, "ts", *where)
    dur_raw = _array([e.dur for e in kept], np.float64, "dur", *where)
    _check_values(ts_raw, dur_raw, *where)
    args = [e.args for e in kept]

    events = pd.DataFrame(
        {
            "ts_ns": _to_ns(ts_raw, base_ns),
            "dur_ns": np.rint(dur_raw * 1000.0).astype(np.int64),
            "name": _categorical([e.name or "" for e in kept]),
            "cat": _categorical([e.cat for e in kept]),
            "pid": _id_categorical([e.pid for e in kept]),
            "tid": _id_categorical([e.tid for e in kept]),
            "stream": _array([_stream(a) for a in args], np.int64, "args.stream", *where),
            "correlation": _array(
                [_arg(a, "correlation") for a in args], np.int64, "args.correlation", *where
            ),
            "external_id": _array(
                [_arg(a, "external_id") for a in args], np.int64, "args.External id", *where
            ),
            "event_index": np.array(index, dtype=np.int32),
        }
    )
    _add_kind_and_device(events)
    if hta_round:
        events["hta_ts"] = np.ceil(ts_raw)
        events["hta_end"] = np.floor(ts_raw + dur_raw)
    else:
        events["hta_ts"] = ts_raw.astype(np.float64)
        events["hta_end"] = ts_raw + dur_raw
    events["step"] = _assign_steps(events)

    thread_names = _thread_names(all_events)
    warnings = []
    if not (events["kind"] == "step").any():
        warnings.append(f"{path.name}: no ProfilerStep events; per-step analysis unavailable")
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
        thread_names=thread_names,
        events=events,
        collectives=build_collectives(events, kept),
        warnings=warnings,
    )


def _rank_info(trace: TraceFile, path: Path) -> tuple[int, int, str | None]:
    """(rank, world_size, backend); rank -1 when the file has no ``distributedInfo.rank``."""
    info = trace.distributedInfo
    if info is None or info.rank is None:
        return -1, -1, info.backend if info else None
    if info.rank < 0:
        raise TraceFormatError(
            f"rank must be >= 0, got {info.rank}", path=path, field="distributedInfo.rank"
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


def _check_complete(events: list[Event], path: Path, rank: int) -> None:
    """Complete events need ``ts`` and ``dur``.

    An ``X`` event without ``dur`` is an error rather than an instant: Kineto always writes
    ``dur`` on complete events, and dropping the event would silently change the answer.
    """
    for i, event in enumerate(events):
        if event.dur is None and event.ph == "X":
            missing, key = "duration", "dur"
        elif event.ts is None and event.dur is not None and event.cat != "Trace":
            missing, key = "timestamp", "ts"
        else:
            continue
        raise _event_error(f"complete event without a {missing}", i, key, path, rank)


def _array(
    values: list[Any], dtype: type, key: str, index: list[int], path: Path, rank: int
) -> np.ndarray:
    try:
        return np.array(values, dtype=dtype)
    except OverflowError:  # msgspec decodes integers of any size
        pos = next(i for i, v in enumerate(values) if v is not None and abs(v) >= 2**63)
        error = _event_error(f"out of range: {values[pos]}", index[pos], key, path, rank)
        raise error from None


def _check_values(ts: np.ndarray, dur: np.ndarray, index: list[int], path: Path, rank: int) -> None:
    for key, values in (("ts", ts), ("dur", dur)):
        bad = (values > _MAX_ABS_US) | (values < (0 if key == "dur" else -_MAX_ABS_US))
        if values.dtype.kind == "f":
            bad |= ~np.isfinite(values)
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            value = values[pos].item()
            what = "negative duration" if key == "dur" and value < 0 else "out of range"
            raise _event_error(f"{what}: {value}", index[pos], key, path, rank)


def _event_error(message: str, i: int, key: str, path: Path, rank: int) -> TraceFormatError:
    return TraceFormatError(message, path=path, rank=_r(rank), field=f"traceEvents[{i}].{key}")


def _r(rank: int) -> int | None:
    return rank if rank >= 0 else None


def _to_ns(ts: np.ndarray, base_ns: int) -> np.ndarray:
    """Microseconds (relative to ``base_ns``, or absolute when it is 0) -> absolute int64 ns."""
    if ts.dtype.kind == "i":
        return ts * 1000 + base_ns
    whole = np.floor(ts)
    frac_ns = np.rint((ts - whole) * 1000.0).astype(np.int64)
    return whole.astype(np.int64) * 1000 + frac_ns + base_ns


def _categorical(values: list[str | None]) -> pd.Categorical:
    """Categorical of strings (``None`` -> NaN)."""
    return pd.Categorical(values)


def _id_categorical(values: list[int | str | None]) -> pd.Categorical:
    """Categorical of pid/tid values, which Kineto writes as ints or strings."""
    codes, uniques = pd.factorize(np.array(values, dtype=object))
    labels = [str(u) for u in uniques]
    if len(set(labels)) < len(labels):  # both 7 and "7": compare as strings
        return pd.Categorical([None if v is None else str(v) for v in values])
    return pd.Categorical.from_codes(codes, categories=labels)


def _stream(args: Args | None) -> int:
    if args is None or args.stream is None:
        return -1
    try:
        return int(args.stream)
    except ValueError:
        return -1


def _arg(args: Args | None, attr: str) -> int:
    value = getattr(args, attr) if args is not None else None
    return -1 if value is None else value


def _add_kind_and_device(events: pd.DataFrame) -> None:
    """Classify once per distinct (cat, name) pair, then broadcast to the rows."""
    cat_codes = events["cat"].cat.codes.to_numpy(np.int64)
    name_codes = events["name"].cat.codes.to_numpy(np.int64)
    pair = (cat_codes + 1) * (len(events["name"].cat.categories) + 1) + name_codes
    uniq, inverse = np.unique(pair, return_inverse=True)
    cats = events["cat"].cat.categories
    names = events["name"].cat.categories
    kind_of_pair = []
    device_cat = []
    for key in uniq:
        cat_code, name_code = divmod(int(key), len(names) + 1)
        cat = cats[cat_code - 1] if cat_code > 0 else None
        kind_of_pair.append(KINDS.index(classify(cat, names[name_code])))
        device_cat.append(is_device_cat(cat))
    kinds = np.array(kind_of_pair, dtype=np.int8)[inverse]
    events["kind"] = pd.Categorical.from_codes(kinds, categories=list(KINDS))
    on_device = np.array(device_cat, dtype=bool)[inverse] | (events["stream"].to_numpy() >= 0)
    events["device"] = pd.Categorical.from_codes(on_device.astype(np.int8), ["cpu", "gpu"])


def _assign_steps(events: pd.DataFrame) -> np.ndarray:
    """ProfilerStep of every event: CPU events by window, GPU events through their launch.

    A CPU event belongs to step ``s`` when ``s.start <= ts < s.end`` (HTA's rule). A GPU event
    belongs to the step of the CPU event that shares its correlation id, whenever it ran.
    """
    steps = np.full(len(events), -1, dtype=np.int32)
    is_step = (events["kind"] == "step").to_numpy() & (events["device"] == "cpu").to_numpy()
    if not is_step.any():
        return steps
    marks = events.loc[is_step, ["ts_ns", "dur_ns", "name"]].sort_values("ts_ns")
    starts = marks["ts_ns"].to_numpy()
    ends = starts + marks["dur_ns"].to_numpy()
    numbers = np.array([step_number(str(n)) for n in marks["name"]], dtype=np.int32)
    ts = events["ts_ns"].to_numpy()
    on_cpu = (events["device"] == "cpu").to_numpy()
    pos = np.searchsorted(starts, ts, side="right") - 1
    inside = on_cpu & (pos >= 0) & (ts < ends[np.maximum(pos, 0)])
    steps[inside] = numbers[pos[inside]]

    corr = events["correlation"].to_numpy()
    launches = on_cpu & (corr >= 0) & (steps >= 0)
    if launches.any():
        by_corr = pd.Series(steps[launches], index=corr[launches])
        by_corr = by_corr[~by_corr.index.duplicated(keep="first")]
        gpu = ~on_cpu & (corr >= 0)
        mapped = pd.Series(corr[gpu]).map(by_corr).fillna(-1).to_numpy(np.int32)
        steps[gpu] = mapped
    return steps


def _thread_names(all_events: list[Event]) -> dict[str, str]:
    names: dict[str, str] = {}
    for event in all_events:
        if event.ph != "M" or event.name != "thread_name" or event.args is None:
            continue
        try:
            value = raw_value(event.args.name)
        except msgspec.DecodeError:
            continue
        if isinstance(value, str):
            key = str(event.tid)
            if "pt_gloo_runloop" not in names.get(key, ""):
                names[key] = value
    return names


def _process_groups(trace: TraceFile, path: Path, rank: int) -> tuple[ProcessGroup, ...]:
    info = trace.distributedInfo
    if info is None or not info.pg_config:
        return ()
    groups = []
    for i, pg in enumerate(info.pg_config):
        ranks = pg.ranks
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


def _device_properties(trace: TraceFile, path: Path) -> list[dict[str, Any]]:
    try:
        value = raw_value(trace.deviceProperties)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(str(exc), path=path, field="deviceProperties") from exc
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
