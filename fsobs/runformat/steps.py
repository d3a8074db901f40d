"""The step sidecar ``steps.rank<R>.jsonl``: what data each rank got in each step.

One JSON object per line, a :class:`StepRecord`::

    {"step": 12, "num_samples": 64, "seq_lengths": [310, 17, ...],   # or the three sums below
     "len_sum": 20480, "len_sq_sum": 9123456, "len_max": 4096,
     "sample_ids": [81723, 402, ...],        # the dataset indices trained, as seq_lengths
     "est_cost": 1.84e7,                     # cost-model estimate of the rank's compute
     "wall_start_ns": 1790..., "wall_end_ns": 1790...,
     "loss": 0.69,                           # the step's training loss on this rank
     "imbalance_before": 1.41, "imbalance_after": 1.01, "batch_digest": "9f2c...",
     "id_overlap": {"t_item": 0.74, "t_cat": 1.0},   # per table: ids the previous batch had
     "gc_count": 1, "gc_max_gen": 0, "gc_ms": 4.2,   # this rank's GC pauses in the step
     "cpu_ms": 171.3, "nivcsw": 12}          # training thread's CPU time, preemptions

``seq_lengths`` is replaced by ``len_sum``/``len_sq_sum``/``len_max`` when a step has more than
:data:`MAX_LISTED_LENGTHS` samples, and ``sample_ids`` (optional: the dataset index of each
sample, in the order of ``seq_lengths``; what makes "every sample trained exactly once" checkable
from a run, with a balance window too) is then left out; everything after ``wall_end_ns`` is
optional. The balance
fields are the same on every rank of a step: max / mean estimated cost over the ranks for the
random split and for the split used, and a digest of the step's global batch (equal digests:
the same samples). The pause fields are this rank's (:mod:`fsobs.collect.pauses`).

``id_overlap`` is the same on every rank too: per embedding table, the share of the ID
occurrences of the step's global batch (all ranks' samples, every feature the table looks up)
whose ID also occurs in the previous step's global batch, in [0, 1]. This is the part of a
batch that torchrec's PEC looks up with fresh weights (the rest goes one step ahead). Absent
on the first step (no previous batch), for a table the batch has no ID of, and in sidecars
written without it; when present it names at least one table.

Lifecycle of one rank's file::

    SidecarWriter(run_dir, rank)   creates  steps.rank<R>.jsonl.partial   (refuses if either exists)
    .write(record)                 appends one JSON line and flushes it
    .close()                       fsyncs and renames it to steps.rank<R>.jsonl   (atomic)

A rank that is killed, or whose ``with`` block ends with an exception, leaves only the
``.partial`` file: every flushed line is whole except possibly the last. The reader ignores
``.partial`` files; :func:`fsobs.runformat.finalize_incomplete` publishes them after dropping a
torn last line (:func:`recover_partial`), so what was written stays analyzable. The reader
takes a file line by line and refuses a line over 64 MiB (:mod:`fsobs.runformat.bounded`).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Mapping, Sequence
from numbers import Real
from pathlib import Path
from types import TracebackType
from typing import Any, SupportsFloat, SupportsIndex, cast

import msgspec
import numpy as np
import pandas as pd

from fsobs.errors import TraceFormatError, TraceReadError
from fsobs.runformat.atomic import publish, temp_path, write_atomic
from fsobs.runformat.bounded import MAX_SIDECAR_LINE_BYTES, iter_lines
from fsobs.runformat.files import run_files
from fsobs.runformat.names import PARTIAL_SUFFIX, sidecar_file_name
from fsobs.runformat.structs import FieldError, convert
from fsobs.storage import Location, as_location

MAX_LISTED_LENGTHS = 4096
"""Steps with more samples store ``len_sum``/``len_sq_sum``/``len_max`` instead of the list."""
COLUMNS = (
    "rank",
    "step",
    "num_samples",
    "len_sum",
    "len_sq_sum",
    "len_max",
    "est_cost",
    "loss",
    "imbalance_before",
    "imbalance_after",
    "batch_digest",
    "wall_ms",
    "gc_count",
    "gc_ms",
    "gc_max_gen",
    "cpu_ms",
    "nivcsw",
    "seq_lengths",
    "sample_ids",
    "id_overlap",
)
"""The columns of :func:`read_sidecars`: the record's numbers (NaN where a record lacks an
optional one), ``wall_ms`` (``wall_end_ns - wall_start_ns``), ``seq_lengths`` (an int64
array, None where the record has only the sums), ``sample_ids`` (likewise, None where the
record has none) and ``id_overlap`` (a dict table -> share, None where the record has none)."""


class StepRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One line of a step sidecar, its fields declared here once (a msgspec Struct, in the
    order a line writes them); every field is checked when it is made (``ValueError`` naming
    the field)."""

    step: int
    """The profiler's step number (``ProfilerStep#N``)."""
    num_samples: int
    seq_lengths: tuple[int, ...] | None
    """Per-sample lengths; None when only the sums below are known."""
    len_sum: int
    len_sq_sum: int
    len_max: int
    sample_ids: tuple[int, ...] | None = None
    """The dataset index of each sample (the order of ``seq_lengths``); None when not known."""
    est_cost: float | None
    """The cost model's estimate of this rank's compute."""
    wall_start_ns: int | None
    wall_end_ns: int | None
    loss: float | None = None
    """The first of the optional fields: a line has those that are not None."""
    imbalance_before: float | None = None
    """Max / mean estimated cost over the ranks under the random split."""
    imbalance_after: float | None = None
    """The same under the split used."""
    batch_digest: str | None = None
    id_overlap: dict[str, float] | None = None
    """Per embedding table, the share of the global batch's ID occurrences that the previous
    step's global batch had (module docstring)."""
    gc_count: int | None = None
    gc_max_gen: int | None = None
    gc_ms: float | None = None
    cpu_ms: float | None = None
    nivcsw: int | None = None

    def __post_init__(self) -> None:
        _check_record(self)

    @classmethod
    def of(
        cls,
        step: int,
        lengths: Sequence[int] | np.ndarray,
        est_cost: float | None,
        wall_start_ns: int,
        wall_end_ns: int,
        **optional: Any,
    ) -> StepRecord:
        """A record from the step's per-sample ``lengths`` (any integer sequence, a numpy array
        or a 1-D tensor too); ``optional``: ``sample_ids`` (the same kinds of sequence),
        ``loss``, the balance fields, ``id_overlap`` (any mapping of table -> share) and the
        pause fields."""
        values = _lengths(lengths)
        extra: dict[str, Any] = {k: _number(k, v) for k, v in optional.items()}
        return cls(
            step=_non_negative_int(step, "step"),
            num_samples=len(values),
            seq_lengths=tuple(values),
            **_sums(values),
            est_cost=None if est_cost is None else float(est_cost),
            wall_start_ns=_non_negative_int(wall_start_ns, "wall_start_ns"),
            wall_end_ns=_non_negative_int(wall_end_ns, "wall_end_ns"),
            **extra,
        )

    def to_json(self) -> dict[str, Any]:
        """The line's object, keys in the order of the fields: the lengths listed, or their
        three sums past :data:`MAX_LISTED_LENGTHS` (and the ids then left out), the optional
        fields only when set."""
        many = self.num_samples > MAX_LISTED_LENGTHS
        left_out = {"seq_lengths"} if many or self.seq_lengths is None else set(_SUMS)
        if many:
            left_out.add("sample_ids")
        out: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if name in left_out or value is None and name in _UNSET_LEFT_OUT:
                continue
            out[name] = list(value) if name in _LISTS else value
        return out

    def to_line(self) -> str:
        """The line, without its newline (compact, strict JSON)."""
        return json.dumps(self.to_json(), allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, record: object) -> StepRecord:
        """Parse one line's object strictly: ``ValueError`` naming the bad field."""
        if not isinstance(record, dict):
            raise ValueError(f"a step record must be a JSON object, got {_kind(record)}")
        fields = dict.fromkeys(("seq_lengths", "est_cost", "wall_start_ns", "wall_end_ns"))
        fields.update(record)
        lengths = fields["seq_lengths"]
        if isinstance(lengths, list):  # the sums, and the count if not given, from the list
            values = _non_negative_ints(lengths, "seq_lengths")
            fields = {"num_samples": len(values), **fields, **_sums(values)}
        elif lengths is not None:
            raise FieldError("seq_lengths", f"must be a list, got {_kind(lengths)}")
        if fields.get("id_overlap") is not None:
            _check_id_overlap(fields["id_overlap"])  # naming the table
        return convert(fields, cls)

    def frame_row(self, rank: int) -> dict[str, Any]:
        """This record as a row of :func:`read_sidecars`."""
        row: dict[str, Any] = {"rank": rank}
        for name in _FIELDS:
            value = getattr(self, name)
            if name in _LISTS:
                row[name] = None if value is None else np.asarray(value, dtype=np.int64)
            elif name in _NUMBERS:
                row[name] = float(value) if value is not None else float("nan")
            elif name not in ("wall_start_ns", "wall_end_ns"):
                row[name] = dict(value) if isinstance(value, dict) else value
        start, end = self.wall_start_ns, self.wall_end_ns
        row["wall_ms"] = (end - start) / 1e6 if start is not None and end is not None else None
        return row


_FIELDS = StepRecord.__struct_fields__
_SUMS = frozenset({"len_sum", "len_sq_sum", "len_max"})
"""Written instead of ``seq_lengths`` when the step lists too many samples."""
_LISTS = frozenset({"seq_lengths", "sample_ids"})
"""Written only when the step's samples are listed."""
_OPTIONAL = frozenset(_FIELDS[_FIELDS.index("loss") :])
"""The optional fields, from ``loss`` on."""
_UNSET_LEFT_OUT = _OPTIONAL | {"sample_ids"}
"""Written only when set (``est_cost`` and the wall bounds are written as null)."""
_NUMBERS = frozenset(
    name for name in _OPTIONAL | {"est_cost"} if name not in ("batch_digest", "id_overlap")
)
"""The frame's float columns (NaN where a record lacks one)."""


def _sums(values: list[int]) -> dict[str, Any]:
    """``len_sum``, ``len_sq_sum`` and ``len_max`` of the per-sample lengths ``values``."""
    return {
        "len_sum": sum(values),
        "len_sq_sum": sum(v * v for v in values),
        "len_max": max(values, default=0),
    }


def _check_record(r: StepRecord) -> None:
    for name in ("step", "num_samples", "len_sum", "len_sq_sum", "len_max"):
        _non_negative_int(getattr(r, name), name)
    for name in ("seq_lengths", "sample_ids"):
        listed = getattr(r, name)
        if listed is not None and len(listed) != r.num_samples:
            raise FieldError(name, f"lists {len(listed)} samples, num_samples {r.num_samples}")
    if r.sample_ids is not None:
        _non_negative_ints(list(r.sample_ids), "sample_ids")
    for name in ("wall_start_ns", "wall_end_ns"):
        if getattr(r, name) is not None:
            _non_negative_int(getattr(r, name), name)
    if r.wall_start_ns is not None and r.wall_end_ns is not None:
        if r.wall_end_ns < r.wall_start_ns:
            raise FieldError("wall_end_ns", f"{r.wall_end_ns} is before wall_start_ns")
    for name in ("est_cost", "loss"):
        _finite(name, getattr(r, name))
    for name in ("imbalance_before", "imbalance_after"):
        value = _finite(name, getattr(r, name))
        if value is not None and value < 1.0 - 1e-9:
            raise FieldError(name, f"must be a finite ratio >= 1, got {value}")
    if r.batch_digest is not None and (not isinstance(r.batch_digest, str) or not r.batch_digest):
        raise FieldError("batch_digest", f"must be a non-empty string, got {r.batch_digest!r}")
    if r.id_overlap is not None:
        _check_id_overlap(r.id_overlap)
    for name, low in (("gc_count", 0), ("gc_max_gen", -1), ("nivcsw", 0)):
        value = getattr(r, name)
        if value is not None and (type(value) is not int or value < low):
            raise FieldError(name, f"must be an integer >= {low}, got {value!r}")
    for name in ("gc_ms", "cpu_ms"):
        value = _finite(name, getattr(r, name))
        if value is not None and value < 0:
            raise FieldError(name, f"must be a finite number >= 0, got {value!r}")


def _check_id_overlap(shares: object) -> None:
    """``id_overlap``: a non-empty object of table name -> share in [0, 1]."""
    if not isinstance(shares, dict) or not shares:
        raise FieldError(
            "id_overlap", f"must be a non-empty object of table -> share, got {shares!r}"
        )
    for table, share in shares.items():
        if not isinstance(table, str) or not table:
            raise FieldError("id_overlap", f"table names must be non-empty strings, got {table!r}")
        value = _finite(f"id_overlap.{table}", share)
        if value is None or not 0.0 <= value <= 1.0:
            raise FieldError(f"id_overlap.{table}", f"must be a share in [0, 1], got {share!r}")


class SidecarWriter:
    """Appends one line per step to this rank's sidecar; see the module docstring."""

    def __init__(self, run_dir: str | Path, rank: int) -> None:
        rank = _non_negative_int(rank, "rank")
        self.rank = rank
        self.path = Path(run_dir) / sidecar_file_name(rank)
        """The final name, present once :meth:`close` has run."""
        self.partial_path = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        for existing in (self.path, self.partial_path):
            if existing.exists():
                raise FileExistsError(f"{existing}: a step sidecar of this rank is already there")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.partial_path, "x", encoding="utf-8")
        self._last_step: int | None = None

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, record: StepRecord) -> None:
        """Append the record of one step (steps must increase) and flush it."""
        if self._file.closed:
            raise ValueError(f"{self.partial_path}: writer is closed")
        if self._last_step is not None and record.step <= self._last_step:
            raise ValueError(f"step {record.step} after step {self._last_step}: must increase")
        self._file.write(record.to_line() + "\n")
        self._file.flush()
        self._last_step = record.step

    def close(self) -> None:
        """Finish the file and rename it to its final name (idempotent)."""
        if self._file.closed:
            return
        self._file.close()
        publish(self.partial_path, self.path)

    def abandon(self) -> None:
        """Close the handle but keep the ``.partial`` name: the rank did not finish."""
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> SidecarWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()


def write_sidecar(run_dir: str | Path, rank: int, records: Sequence[StepRecord]) -> Path:
    """Write a whole sidecar at once, atomically (a writer that has every step up front)."""
    path = Path(run_dir) / sidecar_file_name(rank)
    write_atomic(path, "".join(r.to_line() + "\n" for r in records).encode())
    return path


def recover_partial(partial: Path) -> int:
    """Publish an interrupted ``steps.rank<R>.jsonl.partial`` under its final name.

    Keeps the longest prefix of lines that are whole JSON objects with a ``step`` (a write cut
    short can only tear the last line), writes it atomically to the final name and removes the
    partial file. Returns the number of lines dropped. The file is read a line at a time: what
    is held is one line, however long the run was.
    """
    if not partial.name.endswith(PARTIAL_SUFFIX):
        raise ValueError(f"{partial}: not a {PARTIAL_SUFFIX} file")
    final = partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)])
    # every line is taken, however long (the limit is the file's size): the reader refuses
    # one over MAX_SIDECAR_LINE_BYTES later, naming it
    lines = (line for _, line in iter_lines(partial, partial.stat().st_size + 1) if line.strip())
    dropped = 0
    temp = temp_path(final)
    try:
        with open(temp, "xb") as out:
            for line in lines:
                if not _is_record(line):
                    dropped = 1 + sum(1 for _ in lines)
                    break
                out.write(line + b"\n")
        publish(temp, final)
    finally:
        temp.unlink(missing_ok=True)
    partial.unlink()
    return dropped


def read_sidecar(path: Location, rank: int) -> list[StepRecord]:
    """The records of one sidecar file, read line by line; one
    :class:`~fsobs.errors.FsobsError` naming the file, the rank and the line on the first bad
    one, or one over :data:`~fsobs.runformat.bounded.MAX_SIDECAR_LINE_BYTES`."""
    records = []
    try:
        for number, line in iter_lines(path, MAX_SIDECAR_LINE_BYTES, rank):
            if line.strip():
                records.append(_parse_line(line, path, rank, number))
    except OSError as exc:
        raise TraceReadError(
            f"unreadable step sidecar ({exc.strerror or exc})", path=path, rank=rank
        ) from exc
    return records


def _parse_line(line: bytes, path: Location, rank: int, number: int) -> StepRecord:
    try:
        return StepRecord.from_json(json.loads(line.decode()))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as exc:
        raise TraceFormatError(
            f"bad step record ({exc})", path=path, rank=rank, field=f"line {number}"
        ) from exc
    except RecursionError as exc:
        raise TraceFormatError(
            "bad step record (nested deeper than Python's recursion limit)",
            path=path,
            rank=rank,
            field=f"line {number}",
        ) from exc


def read_sidecars(run_dir: Location) -> pd.DataFrame | None:
    """The sidecars of a run directory (a path or a URL) as one frame (:data:`COLUMNS`); None
    without any."""
    return sidecar_frame(sidecar_files(run_dir))


def sidecar_frame(files: Sequence[tuple[Location, int]]) -> pd.DataFrame | None:
    """The sidecars ``files`` ((file, rank), :attr:`~fsobs.runformat.files.RunFiles.sidecars`)
    as one frame (:data:`COLUMNS`); None without any."""
    if not files:
        return None
    rows = [r.frame_row(rank) for path, rank in files for r in read_sidecar(path, rank)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def read_step_lengths(run_dir: str | Location, step: int) -> dict[int, np.ndarray]:
    """Per rank, the per-sample lengths (int64) of ``step``, from the sidecars that list them
    (a rank whose record has only the sums, or lacks the step, is left out)."""
    out: dict[int, np.ndarray] = {}
    for path, rank in sidecar_files(as_location(run_dir)):
        for record in read_sidecar(path, rank):
            if record.step == step and record.seq_lengths is not None:
                out[rank] = np.asarray(record.seq_lengths, dtype=np.int64)
                break
    return out


def sidecar_files(run_dir: Location) -> tuple[tuple[Location, int], ...]:
    """(file, rank) of every ``steps.rank<R>.jsonl`` of the run directory, sorted by name
    (:attr:`~fsobs.runformat.files.RunFiles.sidecars`; links are no files of the run);
    TraceReadError when the folder cannot be listed."""
    try:
        return run_files(run_dir).sidecars
    except OSError as exc:
        raise TraceReadError(f"cannot list the run folder: {exc}", path=run_dir) from exc


def _is_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(record, dict) and "step" in record


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _non_negative_int(value: object, name: str) -> int:
    if isinstance(value, bool) or isinstance(value, float):
        raise FieldError(name, f"must be an integer, got {value!r}")
    try:
        number = operator.index(cast(SupportsIndex, value))  # TypeError if it has no __index__
    except TypeError:
        raise FieldError(name, f"must be an integer, got {value!r}") from None
    if number < 0:
        raise FieldError(name, f"must be >= 0, got {number}")
    if number >= 2**63:
        raise FieldError(name, f"must be < 2**63, got {number}")
    return number


def _finite(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(name, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise FieldError(name, f"must be finite, got {value}")
    return float(value)


def _number(name: str, value: object) -> object:
    """An optional field as the record stores it: floats as float (numpy scalars too),
    counts as int, the digest as it is."""
    if value is None or name == "batch_digest":
        return value
    if name == "sample_ids":
        return tuple(_lengths(cast(Sequence[int], value), "sample_ids"))
    if name == "id_overlap":  # numpy shares as float; anything else is left to the checks
        if not isinstance(value, Mapping):
            return value
        return {
            table: float(share)
            if isinstance(share, Real) and not isinstance(share, bool)
            else share
            for table, share in value.items()
        }
    if name in ("gc_count", "gc_max_gen", "nivcsw"):
        return value if isinstance(value, bool) else operator.index(cast(SupportsIndex, value))
    return value if isinstance(value, bool) else float(cast(SupportsFloat, value))


def _lengths(lengths: Sequence[int] | np.ndarray, name: str = "seq lengths") -> list[int]:
    """``lengths`` (a sequence, array or tensor of integers >= 0) as a list of ints."""
    raw = lengths.tolist() if hasattr(lengths, "tolist") else list(lengths)
    if not isinstance(raw, list):  # a 0-d array or tensor
        raise FieldError(name, f"must be a 1-D sequence, got {lengths!r}")
    return _non_negative_ints(raw, name)


def _non_negative_ints(values: list[Any], name: str) -> list[int]:
    """``values`` as ints >= 0 (:func:`_non_negative_int` of each; the first bad one's error).
    A list of plain ints in range, as JSON gives, is returned as it is, checked at C speed."""
    if all(type(v) is int for v in values) and (
        not values or 0 <= min(values) <= max(values) < 2**63
    ):
        return values
    return [_non_negative_int(v, name) for v in values]
