"""Streaming read of a Kineto file: decompress in pieces and cut ``traceEvents`` between events.

A worker then never holds the whole JSON text, only a few MB of it. The cuts are found by text
search (``},`` followed by ``{``), so a cut can be wrong in theory (the pattern inside a string or
between two objects nested in one event); such a piece is not a list of complete events and fails
to decode, and the caller then reads the file the plain way. Any error here means the same: fall
back, and let the plain path word the error. Local and remote files (:mod:`fsobs.storage`)
are read alike, front to back.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator

import msgspec

from fsobs.storage import Location, Readable, open_binary
from fsobs.trace._decode import GZIP_MAGIC

_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_ARRAY_END = re.compile(rb"\}\s*\]")
_PIECE = 4 * 2**20  # decompressed bytes per piece
_MAX_HEADER = 64 * 2**20  # text before traceEvents (deviceProperties, distributedInfo, ...)
_WS = b" \t\r\n"


class SplitError(Exception):
    """The file is not laid out as expected: read it the plain way instead."""


def _pieces(path: Location, max_bytes: int) -> Iterator[bytes]:
    """The file's text in pieces of about ``_PIECE`` bytes, never more than ``max_bytes`` in all.

    The file is read front to back only (no seek), so a remote file is one stream."""
    total = 0
    try:
        with open_binary(path) as f:
            raw = _first_bytes(f)
            gz = raw.startswith(GZIP_MAGIC)
            inflater = zlib.decompressobj(wbits=31) if gz else None
            while raw:
                while raw:
                    if inflater is None:
                        text, raw = raw, b""
                    else:
                        text = inflater.decompress(raw, _PIECE)
                        raw = inflater.unconsumed_tail
                        if inflater.eof:
                            raw = inflater.unused_data.lstrip(b"\x00")
                            inflater = zlib.decompressobj(wbits=31) if raw else inflater
                    total += len(text)
                    if total > max_bytes:
                        raise SplitError("over the size limit")
                    if text:
                        yield text
                raw = f.read(_PIECE // 8 if gz else _PIECE)
    except OSError as exc:  # the plain read says it again, as a TraceReadError
        raise SplitError(f"cannot read: {exc}") from exc
    if inflater is not None and not inflater.eof:
        raise SplitError("truncated gzip")


def _first_bytes(f: Readable) -> bytes:
    """The first read, at least two bytes long unless the file is shorter (streams may return
    less than asked)."""
    raw = f.read(_PIECE // 8)
    while 0 < len(raw) < len(GZIP_MAGIC) and (more := f.read(_PIECE // 8)):
        raw += more
    return raw


class EventStream:
    """Iterate to get JSON arrays of complete events; afterwards ``skeleton`` is the document
    with an empty ``traceEvents`` (all its other keys, wherever they were)."""

    def __init__(self, path: Location, max_bytes: int) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self.skeleton = b""

    def __iter__(self) -> Iterator[bytes]:
        buf = b""
        header = b""
        for text in _pieces(self._path, self._max_bytes):
            buf += text
            if not header:
                found = _ARRAY_START.search(buf)
                if found is None:
                    if len(buf) > _MAX_HEADER:
                        raise SplitError("no traceEvents array near the start")
                    continue
                header, buf = buf[: found.end()], buf[found.end() :]
            cut = _last_boundary(buf)
            if cut is not None:
                yield b"[" + buf[: cut[0]] + b"]"
                buf = buf[cut[1] :]
        if not header:
            raise SplitError("no traceEvents array")
        events, trailer = _split_tail(buf)
        if events.strip(_WS):
            yield b"[" + events + b"]"
        self.skeleton = header + b"]" + trailer


def _last_boundary(buf: bytes) -> tuple[int, int] | None:
    """(end of the last complete event, start of the next) for the last ``}`` ``,`` ``{``."""
    pos = len(buf)
    while (pos := buf.rfind(b"{", 0, pos)) > 0:
        before = buf[:pos].rstrip(_WS)
        if before.endswith(b","):
            end = len(before[:-1].rstrip(_WS))
            if end and buf[end - 1 : end] == b"}":
                return end, pos
    return None


def _split_tail(buf: bytes) -> tuple[bytes, bytes]:
    """The last events and what follows the array (``]`` excluded): the first ``}]`` whose
    trailer closes the top-level object."""
    stripped = buf.lstrip(_WS)
    if stripped.startswith(b"]"):  # no event left (or an empty array)
        return b"", stripped[1:]
    for found in _ARRAY_END.finditer(buf):
        trailer = buf[found.end() :]
        try:
            msgspec.json.decode(b'{"x": []' + trailer)
        except msgspec.DecodeError:
            continue
        return buf[: found.start() + 1], trailer
    raise SplitError("cannot find the end of traceEvents")
