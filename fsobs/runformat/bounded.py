"""Reading the run's small files with a size bound: memory stays bounded whatever the file holds.

``run.json`` is read whole, but never more than :data:`MAX_RUN_JSON_BYTES` of it; a step
sidecar is read line by line, and no line may pass :data:`MAX_SIDECAR_LINE_BYTES` (a step of
4096 listed lengths takes about 40 KiB; more samples are stored as three sums). A file or a line
over its bound is refused in one :class:`~fsobs.errors.TraceReadError` naming the file and the
bound, after reading at most the bound and one chunk (a 2 GB ``run.json`` or a sidecar line of
1 GB costs what the bound costs, no more).
"""

from __future__ import annotations

from collections.abc import Iterator

from fsobs.errors import TraceReadError
from fsobs.storage import Location, open_binary

MAX_RUN_JSON_BYTES = 16 * 2**20
"""The largest ``run.json`` read (16 MiB; the reference job writes about 2 KiB)."""
MAX_SIDECAR_LINE_BYTES = 64 * 2**20
"""The largest line of a step sidecar read (64 MiB)."""
CHUNK = 2**20
"""Bytes asked of the file at a time."""


def read_limited(path: Location, limit: int, what: str) -> bytes:
    """The whole file, refused once it passes ``limit`` bytes (``what`` names the file's kind
    in the error); OSError when it cannot be read."""
    data = bytearray()
    with open_binary(path) as f:
        while chunk := f.read(min(CHUNK, limit + 1 - len(data))):
            data += chunk
            if len(data) > limit:
                raise TraceReadError(f"{what} is over the {_mib(limit)} limit", path=path)
    return bytes(data)


def iter_lines(path: Location, limit: int, rank: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line without its ``\\n``) of the file, front to back; a line longer
    than ``limit`` bytes is refused (naming the file, ``rank`` and the line) before it is
    held whole. OSError when the file cannot be read."""
    number, line = 1, bytearray()
    with open_binary(path) as f:
        while chunk := f.read(CHUNK):
            pieces = chunk.split(b"\n")
            for piece in pieces[:-1]:
                _check(line, len(piece), limit, path, rank, number)
                yield number, bytes(line + piece)
                number, line = number + 1, bytearray()
            _check(line, len(pieces[-1]), limit, path, rank, number)
            line += pieces[-1]
    if line:
        yield number, bytes(line)


def _check(
    line: bytearray, more: int, limit: int, path: Location, rank: int | None, number: int
) -> None:
    if len(line) + more > limit:
        raise TraceReadError(
            f"step record is over the {_mib(limit)} limit of a line",
            path=path,
            rank=rank,
            field=f"line {number}",
        )


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"
