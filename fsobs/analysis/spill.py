"""Per-rank data too big to hold for every rank at once, kept on this machine's disk.

The analysis keeps a bounded amount of memory whatever the number of ranks: what grows with
the ranks' event counts (each rank's per-step interval sets before the classification, the
class interval sets after it) is appended to an anonymous temporary file (:class:`SpillFile`,
in ``$TMPDIR``) as it arrives and read back one rank at a time. The file has no name: the
system removes it when it is closed (once nothing refers to it), or when the process ends,
however it ends.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from dataclasses import dataclass


class SpillFile:
    """An anonymous temporary file that blobs are appended to and read back from."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="fsobs-spill-")
        self._fd = self._file.fileno()
        self.size = 0
        """Bytes written so far."""
        self._close = weakref.finalize(self, self._file.close)

    def put(self, blob: bytes) -> Spilled:
        """Append ``blob``."""
        offset, view, written = self.size, memoryview(blob), 0
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], offset + written)
        self.size += len(blob)
        return Spilled(self, offset, len(blob))

    def read(self, offset: int, size: int) -> bytes:
        parts = []
        while size:
            part = os.pread(self._fd, size, offset)
            if not part:
                raise EOFError(f"spill file ends before byte {offset + size}")
            parts.append(part)
            offset, size = offset + len(part), size - len(part)
        return b"".join(parts)


@dataclass(frozen=True)
class Spilled:
    """One blob of a :class:`SpillFile`; refers to the file, so that the file outlives it."""

    file: SpillFile
    offset: int
    size: int

    def read(self) -> bytes:
        return self.file.read(self.offset, self.size)
