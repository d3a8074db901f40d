"""Columns of the events table, built batch by batch from typed events.

Only one batch of typed msgspec structs exists at a time; strings become integer codes through
dictionaries shared across batches; the few events the collective metadata needs later
(communication kernels, gloo annotations, ``record_param_comms``) are kept by row.
"""

from __future__ import annotations

import itertools
import zlib
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fsobs.errors import TraceFormatError
from fsobs.storage import Location
from fsobs.trace._decode import Args, Event, decode_event_array, raw_value
from fsobs.trace._legacy import modern_category
from fsobs.trace.categorical import string_dtype
from fsobs.trace.classify import COMM_KERNEL_RE

_MAX_ABS_NS = 2**62  # times and durations in ns, so that base + ts stays inside int64
_MAX_ABS_US = _MAX_ABS_NS // 1000
_FIELD = {
    name: attrgetter(name)
    for name in ("ph", "ts", "dur", "name", "cat", "pid", "tid", "args", "stream", "correlation")
}
_NO_ARGS = Args()
"""The ``args`` of an event without them: no stream (-1), no correlation (-1), no shape."""
_ENCODER = msgspec.json.Encoder()


def _keeps_struct(name: object) -> bool:
    """Events whose args the collective metadata may need (see ``_collectives``)."""
    if not isinstance(name, str):
        return False
    return (
        bool(COMM_KERNEL_RE.search(name))
        or name.startswith("gloo:")
        or name == "record_param_comms"
        or "PtoP" in name
    )


class ColumnBuilder:
    """Accumulates the kept events (those with a ``dur``, except ``Trace`` spans) of one file."""

    def __init__(self, path: Location, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.hta_round = False
        """HTA rounds timestamps when any ``ts`` of the file is not an integer (or missing)."""
        self.structs: dict[int, Event] = {}
        self.thread_names: dict[str, str] = {}
        self._tables = {c: _CodeTable() for c in ("name", "cat", "pid", "tid")}
        self._chunks: dict[str, list[np.ndarray]] = {}
        self._keep_flags: list[bool] = []
        self._rows = 0

    def add(self, events: list[Event], offset: int) -> None:
        """Add a batch whose first event is ``traceEvents[offset]``.

        The fields are gathered with ``map`` over ``attrgetter`` and the strings coded through
        dictionaries (:meth:`_codes`), loops that run in C: Python code runs per event only to
        pick the kept ones, and for the kernels' and shaped ops' keys (:func:`_shape_keys`).
        """
        index = [i for i, e in enumerate(events) if e.dur is not None and e.cat != "Trace"]
        kept = list(map(events.__getitem__, index))
        times, names, tids = (list(map(_FIELD[f], kept)) for f in ("ts", "name", "tid"))
        undurated = {e.ph for e in events if e.dur is None}
        if None in times or None in names or None in tids or "X" in undurated:
            self._check_complete(events, offset)  # raises, naming the first such event
        if not self.hta_round:
            self.hta_round = bool({e.ts.__class__ for e in events} - {int})
        if "M" in undurated or "M" in set(map(_FIELD["ph"], kept)):
            self._collect_thread_names(events)
        where = np.asarray(index, dtype=np.int64) + offset
        ts = self._array(times, np.float64, "ts", where)
        dur = self._array(list(map(_FIELD["dur"], kept)), np.float64, "dur", where)
        self._check_values(ts, dur, where)
        args = [_NO_ARGS if a is None else a for a in map(_FIELD["args"], kept)]
        columns = {
            "ts_raw": ts,
            "dur_raw": dur,
            "event_index": where.astype(np.int32),
            "name": self._codes("name", names),
            "cat": self._codes("cat", list(map(_FIELD["cat"], kept))),
            "pid": self._codes("pid", list(map(_FIELD["pid"], kept))),
            "tid": self._codes("tid", tids),
            "stream": self._streams(list(map(_FIELD["stream"], args)), where),
            "correlation": self._array(
                list(map(_FIELD["correlation"], args)), np.int64, "args.correlation", where
            ),
            "shape_key": _shape_keys(args),
        }
        for key, values in columns.items():
            self._chunks.setdefault(key, []).append(values)
        self._keep_structs(kept, columns["name"])
        self._rows += len(kept)

    def columns(self) -> dict[str, Any]:
        """The finished columns: raw times (float µs), codes as Categoricals, ints."""
        data: dict[str, Any] = {}
        for key, chunks in self._chunks.items():
            values = np.concatenate(chunks) if chunks else np.zeros(0)
            data[key] = self._categorical(key, values) if key in self._tables else values
        if not self._chunks:
            for key in ("ts_raw", "dur_raw"):
                data[key] = np.zeros(0)
            for key in ("event_index", "stream", "correlation", "shape_key"):
                data[key] = np.zeros(0, np.int64)
            for key in self._tables:
                data[key] = pd.Categorical([])
        return data

    def _codes(self, key: str, values: list[Any]) -> np.ndarray:
        """Codes in the file-wide table of ``key``, new values added in the order they first
        appear (one pass in C; Python code runs once per new value)."""
        table = self._tables[key]
        return np.fromiter(map(table.__getitem__, values), dtype=np.int32, count=len(values))

    def _categorical(self, key: str, codes: np.ndarray) -> pd.Categorical:
        """Codes -> Categorical of strings; ``None`` -> NaN; 7 and "7" become one category;
        historical categories get today's names (:mod:`fsobs.trace._legacy`)."""
        labels = [None if v is None else str(v) for v in self._tables[key]]
        if key == "cat":
            labels = [modern_category(v) for v in labels]
        unique: dict[str, int] = {}
        remap = np.array(
            [-1 if v is None else unique.setdefault(v, len(unique)) for v in labels] or [-1],
            dtype=np.int32,
        )
        # pandas-stubs: codes and categories are array-likes, not only a Sequence and an Index
        dtype = string_dtype(tuple(unique))
        return pd.Categorical.from_codes(remap[codes] if len(codes) else codes, dtype=dtype)  # type: ignore[arg-type]

    def _keep_structs(self, kept: list[Event], name_codes: np.ndarray) -> None:
        flags = self._keep_flags
        flags.extend(map(_keeps_struct, itertools.islice(self._tables["name"], len(flags), None)))
        if not kept:
            return
        chosen = np.flatnonzero(np.asarray(flags, dtype=bool)[name_codes]).tolist()
        for pos, event in zip(chosen, _detached([kept[i] for i in chosen]), strict=True):
            self.structs[self._rows + pos] = event

    def _collect_thread_names(self, events: list[Event]) -> None:
        for event in events:
            if event.ph != "M" or event.name != "thread_name" or event.args is None:
                continue
            try:
                value = raw_value(event.args.name)
            except msgspec.DecodeError:
                continue
            key = str(event.tid)
            if isinstance(value, str) and "pt_gloo_runloop" not in self.thread_names.get(key, ""):
                self.thread_names[key] = value

    def _check_complete(self, events: list[Event], offset: int) -> None:
        """Complete events need ``ts``, ``dur``, ``name`` and ``tid``.

        An ``X`` event without ``dur`` is an error rather than an instant: Kineto always writes
        ``dur`` on complete events (and a name and a thread or stream on every event), and
        dropping the event would silently change the answer.
        """
        for i, event in enumerate(events):
            if event.dur is None and event.ph == "X":
                missing, key = "duration", "dur"
            elif event.dur is None or event.cat == "Trace":
                continue
            elif event.ts is None:
                missing, key = "timestamp", "ts"
            elif event.name is None:
                missing, key = "name", "name"
            elif event.tid is None:
                missing, key = "thread (tid)", "tid"
            else:
                continue
            raise self._error(f"complete event without a {missing}", offset + i, key)

    def _array(self, values: list[Any], dtype: type, key: str, where: np.ndarray) -> np.ndarray:
        try:
            return np.array(values, dtype=dtype)
        except OverflowError:  # msgspec decodes integers of any size
            pos = next(i for i, v in enumerate(values) if v is not None and abs(v) >= 2**63)
            raise self._error(f"out of range: {values[pos]}", int(where[pos]), key) from None

    def _streams(self, values: list[int | str], where: np.ndarray) -> np.ndarray:
        """HTA's rule: ``int(stream)``, -1 when that fails; beyond int64 an error."""
        if str in set(map(type, values)):  # msgspec gives ints and strs, no subclasses
            return self._array(
                [_int_or_minus_one(v) for v in values], np.int64, "args.stream", where
            )
        return self._array(values, np.int64, "args.stream", where)

    def _check_values(self, ts: np.ndarray, dur: np.ndarray, where: np.ndarray) -> None:
        for key, values in (("ts", ts), ("dur", dur)):
            bad = ~np.isfinite(values) | (values > _MAX_ABS_US)
            bad |= values < (0 if key == "dur" else -_MAX_ABS_US)
            if bad.any():
                pos = int(np.flatnonzero(bad)[0])
                value = values[pos].item()
                what = "negative duration" if key == "dur" and value < 0 else "out of range"
                raise self._error(f"{what}: {value}", int(where[pos]), key)

    def _error(self, message: str, i: int, key: str) -> TraceFormatError:
        rank = self.rank if self.rank >= 0 else None
        return TraceFormatError(message, path=self.path, rank=rank, field=f"traceEvents[{i}].{key}")


class _CodeTable(dict[Any, int]):
    """Value -> code, a value missing from it taking the next code as it is looked up."""

    def __missing__(self, value: Any) -> int:
        code = self[value] = len(self)
        return code


def _detached(events: list[Event]) -> list[Event]:
    """Copies whose raw JSON fields no longer point into the file's text (so it can be freed):
    the events written out and decoded again, all at once; their categories by today's names."""
    copies = decode_event_array(_ENCODER.encode(events)) if events else []
    return [
        e if e.cat == (cat := modern_category(e.cat)) else msgspec.structs.replace(e, cat=cat)
        for e in copies
    ]


def _shape_keys(args: list[Args]) -> np.ndarray:
    """A hash of what makes two events of one name alike: a CPU op's ``Input Dims`` (with
    ``record_shapes``; ``Input dims`` in 2021 traces), a kernel's ``grid`` and ``block``; 0 when
    the trace has neither."""
    keys = np.zeros(len(args), dtype=np.int64)
    shaped = [
        i for i, a in enumerate(args) if a.input_dims or a.input_dims_2021 or a.grid or a.block
    ]  # most events have none: nothing hashed for them
    keys[shaped] = [
        zlib.crc32(b"|".join((a.input_dims or a.input_dims_2021, a.grid, a.block))) + 1
        for a in map(args.__getitem__, shaped)
    ]
    return keys


def _int_or_minus_one(value: int | str) -> int:
    try:
        return int(value)
    except ValueError:
        return -1
