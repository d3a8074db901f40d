"""One rank's step sidecar read as it grows: only new bytes, whole lines, from the tail first.

The file is ``steps.rank<R>.jsonl.partial`` while the rank writes it and ``steps.rank<R>.jsonl``
once published (the same bytes, less a torn last line): the reader follows the rename at the
same offset. A first read starts near the end (the last lines wanted, at most
:data:`FIRST_READ_BYTES`), so a day-long sidecar opens in the time of its last lines; the
lines of a window's steps are found by bisection on the file (:meth:`SidecarTail.lines`),
whose lines are in step order.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from fsobs.runformat.names import PARTIAL_SUFFIX, sidecar_file_name

FIRST_READ_BYTES = 4 * 2**20
"""The most of a sidecar's end the first read takes."""
_STEP = re.compile(rb'^\{"step":\s*(\d+)')
_FIELDS = (
    "est_cost",
    "gc_ms",
    "gc_count",
    "cpu_ms",
    "nivcsw",
    "imbalance_before",
    "imbalance_after",
)


@dataclass(frozen=True, slots=True)
class StepRow:
    """What a live view keeps of one sidecar line."""

    step: int
    wall_ms: float
    end_ns: int
    values: dict[str, float]
    """The optional numbers of :data:`_FIELDS` the line has."""


class SidecarTail:
    """Incremental reader of one rank's sidecar."""

    def __init__(self, run_dir: Path, rank: int, first_lines: int = 50) -> None:
        self.rank = rank
        self.first_lines = first_lines
        """Lines the first read wants from the end (it reads back in growing chunks until it
        has them, :data:`FIRST_READ_BYTES` at most)."""
        self.final = run_dir / sidecar_file_name(rank)
        self.partial = self.final.with_name(self.final.name + PARTIAL_SUFFIX)
        self._offset: int | None = None
        """Bytes read so far (whole lines); None before the first read."""
        self.mtime_ns: int | None = None
        """When the file last grew (None: no file yet)."""
        self.bad_lines = 0

    @property
    def path(self) -> Path | None:
        """The file as it is now (published, else partial), None when there is none."""
        for path in (self.final, self.partial):
            if path.is_file() and not path.is_symlink():
                return path
        return None

    @property
    def closed(self) -> bool:
        return self.final.is_file()

    def read_new(self) -> list[StepRow]:
        """The whole lines written since the last call (from near the end the first time)."""
        path = self.path
        if path is None:
            return []
        try:
            with open(path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                self.mtime_ns = stat.st_mtime_ns
                start = self._offset
                if start is None:
                    start = self._first_start(handle, stat.st_size)
                if stat.st_size < start:  # rewritten shorter (a torn line dropped): go on
                    start = stat.st_size
                handle.seek(start)
                data = handle.read()
        except FileNotFoundError:  # renamed between the two looks: next poll
            return []
        end = data.rfind(b"\n") + 1
        body = data[:end]
        if self._offset is None and start > 0:
            body = body[body.find(b"\n") + 1 :]  # the first line is cut
        self._offset = start + end
        rows = []
        for line in body.splitlines():
            row = _row(line)
            if row is None:
                self.bad_lines += 1
            else:
                rows.append(row)
        return rows

    def _first_start(self, handle: BinaryIO, size: int) -> int:
        """Where the first read starts: far enough back for ``first_lines`` whole lines."""
        chunk = 65536
        while True:
            start = max(0, size - min(chunk, FIRST_READ_BYTES))
            handle.seek(start)
            if start == 0 or handle.read().count(b"\n") > self.first_lines:
                return start
            if chunk >= FIRST_READ_BYTES:
                return start
            chunk *= 4

    def lines(self, first: int, last: int) -> list[bytes]:
        """The raw lines of steps ``first`` .. ``last`` (found by bisection)."""
        path = self.path
        if path is None:
            return []
        out = []
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            low, high = 0, size
            while high - low > 65536:
                middle = (low + high) // 2
                handle.seek(middle)
                handle.readline()
                step = _step(handle.readline())
                if step is not None and step < first:
                    low = middle
                else:
                    high = middle
            handle.seek(low)
            if low:
                handle.readline()
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                step = _step(line)
                if step is None:
                    continue
                if step > last:
                    break
                if step >= first:
                    out.append(line.rstrip(b"\n"))
        return out


def _step(line: bytes) -> int | None:
    match = _STEP.match(line)
    if match is not None:
        return int(match.group(1))
    try:
        value = json.loads(line)
    except ValueError:
        return None
    step = value.get("step") if isinstance(value, dict) else None
    return step if type(step) is int else None


def _row(line: bytes) -> StepRow | None:
    try:
        value: Any = json.loads(line)
        step, start, end = value["step"], value["wall_start_ns"], value["wall_end_ns"]
    except (ValueError, KeyError, TypeError):
        return None
    if type(step) is not int or type(start) is not int or type(end) is not int:
        return None
    values = {
        k: float(v)
        for k in _FIELDS
        if isinstance(v := value.get(k), (int, float)) and not isinstance(v, bool)
    }
    return StepRow(step=step, wall_ms=(end - start) / 1e6, end_ns=end, values=values)
