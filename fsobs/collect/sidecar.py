"""Write the step sidecar ``steps.rank<R>.jsonl`` (format: :mod:`fsobs.trace.sidecar`).

Lifecycle of one rank's file::

    SidecarWriter(run_dir, rank)   creates  steps.rank<R>.jsonl.partial   (refuses if either exists)
    .write(step, ...)              appends one JSON line and flushes it
    .close()                       fsyncs and renames it to steps.rank<R>.jsonl   (atomic)

A rank that is killed, or whose ``with`` block ends with an exception, leaves only the
``.partial`` file: every flushed line is whole except possibly the last. The reader ignores
``.partial`` files; :func:`fsobs.collect.finalize_incomplete` publishes them after dropping a torn
last line (:func:`recover_partial`), so what was written stays analyzable and the run is marked
incomplete. This module does not import torch.
"""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fsobs.collect._atomic import fsync_dir, write_atomic

if TYPE_CHECKING:
    import numpy as np
    import torch

    Lengths = Sequence[int] | np.ndarray | torch.Tensor
    """A step's sequence lengths: any 1-D sequence of integers."""

__all__ = [
    "MAX_LISTED_LENGTHS",
    "PARTIAL_SUFFIX",
    "SidecarWriter",
    "recover_partial",
    "sidecar_file_name",
    "step_record",
]

MAX_LISTED_LENGTHS = 4096
"""Steps with more samples store ``len_sum``/``len_sq_sum``/``len_max`` instead of the list."""
PARTIAL_SUFFIX = ".partial"


def sidecar_file_name(rank: int) -> str:
    """The sidecar of ``rank`` in a run directory: ``steps.rank<R>.jsonl``."""
    return f"steps.rank{rank}.jsonl"


def step_record(
    step: int,
    lengths: Lengths,
    est_cost: float | None,
    wall_start_ns: int,
    wall_end_ns: int,
    loss: float | None = None,
    *,
    imbalance_before: float | None = None,
    imbalance_after: float | None = None,
    batch_digest: str | None = None,
    gc_count: int | None = None,
    gc_ms: float | None = None,
    gc_max_gen: int | None = None,
    cpu_ms: float | None = None,
    nivcsw: int | None = None,
) -> dict[str, Any]:
    """One sidecar line as a dict; raises ValueError naming the bad field.

    ``lengths`` may be any sequence of integers (also a numpy array or a 1-D tensor). The
    optional balance fields are the same on every rank of a step: ``imbalance_before`` /
    ``imbalance_after`` (max / mean estimated cost over the ranks for the random split and for
    the split used) and ``batch_digest`` (a digest of the step's global batch). The optional
    pause fields are this rank's (:mod:`fsobs.collect.pauses`): GC pauses, the training
    thread's CPU time and its involuntary context switches.
    """
    step = _non_negative_int(step, "step")
    values = _lengths(lengths)
    start = _non_negative_int(wall_start_ns, "wall_start_ns")
    end = _non_negative_int(wall_end_ns, "wall_end_ns")
    if end < start:
        raise ValueError(f"wall_end_ns {end} is before wall_start_ns {start}")
    if est_cost is not None:
        est_cost = float(est_cost)
        if not math.isfinite(est_cost):
            raise ValueError(f"est_cost must be finite or None, got {est_cost}")
    record: dict[str, Any] = {"step": step, "num_samples": len(values)}
    if len(values) <= MAX_LISTED_LENGTHS:
        record["seq_lengths"] = values
    else:
        record["len_sum"] = sum(values)
        record["len_sq_sum"] = sum(v * v for v in values)
        record["len_max"] = max(values)
    record.update(est_cost=est_cost, wall_start_ns=start, wall_end_ns=end)
    if loss is not None:
        record["loss"] = float(loss)  # the step's training loss on this rank (NaN is refused)
    for name, value in (
        ("imbalance_before", imbalance_before),
        ("imbalance_after", imbalance_after),
    ):
        if value is not None:
            if not (math.isfinite(value) and value >= 1.0 - 1e-9):
                raise ValueError(f"{name} must be a finite ratio >= 1, got {value}")
            record[name] = float(value)
    if batch_digest is not None:
        if not isinstance(batch_digest, str) or not batch_digest:
            raise ValueError(f"batch_digest must be a non-empty string, got {batch_digest!r}")
        record["batch_digest"] = batch_digest
    for name, value, low in (("gc_count", gc_count, 0), ("gc_max_gen", gc_max_gen, -1)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
            record[name] = value
    for name, value in (("gc_ms", gc_ms), ("cpu_ms", cpu_ms)):
        if value is not None:
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
            record[name] = float(value)
    if nivcsw is not None:
        record["nivcsw"] = _non_negative_int(nivcsw, "nivcsw")
    return record


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

    def write(
        self,
        step: int,
        lengths: Lengths,
        est_cost: float | None,
        wall_start_ns: int,
        wall_end_ns: int,
        loss: float | None = None,
        **balance: Any,
    ) -> None:
        """Append the record of one step (steps must increase) and flush it; ``balance``:
        the keyword-only fields of :func:`step_record`."""
        if self._file.closed:
            raise ValueError(f"{self.partial_path}: writer is closed")
        record = step_record(step, lengths, est_cost, wall_start_ns, wall_end_ns, loss, **balance)
        if self._last_step is not None and record["step"] <= self._last_step:
            raise ValueError(f"step {record['step']} after step {self._last_step}: must increase")
        self._file.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._file.flush()
        self._last_step = record["step"]

    def close(self) -> None:
        """Finish the file and rename it to its final name (idempotent)."""
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.partial_path, self.path)
        fsync_dir(self.path.parent)

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


def recover_partial(partial: Path) -> int:
    """Publish an interrupted ``steps.rank<R>.jsonl.partial`` under its final name.

    Keeps the longest prefix of lines that are whole JSON objects with a ``step`` (a write cut
    short can only tear the last line), writes it atomically to the final name and removes the
    partial file. Returns the number of lines dropped.
    """
    if not partial.name.endswith(PARTIAL_SUFFIX):
        raise ValueError(f"{partial}: not a {PARTIAL_SUFFIX} file")
    final = partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)])
    pieces = [p for p in partial.read_bytes().split(b"\n") if p.strip()]
    kept = 0
    for piece in pieces:
        if not _is_record(piece):
            break
        kept += 1
    write_atomic(final, b"".join(p + b"\n" for p in pieces[:kept]))
    partial.unlink()
    return len(pieces) - kept


def _is_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and "step" in record


def _non_negative_int(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # any value: TypeError if not
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


def _lengths(lengths: Lengths) -> list[int]:
    raw = lengths.tolist() if hasattr(lengths, "tolist") else list(lengths)
    if not isinstance(raw, list):  # a 0-d array or tensor
        raise ValueError(f"seq lengths must be a 1-D sequence, got {lengths!r}")
    return [_non_negative_int(v, "seq length") for v in raw]
