"""Streaming read of a Kineto file: decompress in pieces and cut ``traceEvents`` between events.

A worker then never holds the whole JSON text, only a few MB of it. The cuts are found by text
search (``},`` followed by ``{``), so a cut can be wrong in theory (the pattern inside a string or
between two objects nested in one event); such a piece is not a list of complete events and fails
to decode, and the caller then reads the file the plain way. Any error here but a
:class:`~fsobs.errors.TraceReadError` (the file cannot be read: the plain way could not either)
means the same: fall back, and let the plain path word the error. Local and remote files
(:mod:`fsobs.storage`) are read alike, front to back (:func:`fsobs.trace._decode.text_pieces`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import msgspec

from fsobs.errors import TraceReadError
from fsobs.storage import Location
from fsobs.trace._decode import held_over, text_pieces

_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_ARRAY_END = re.compile(rb"\}\s*\]")
_EVENT_END = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\Z")
"""The end of an event before a ``{``: ``}`` then ``,``, with whitespace around it."""
_LOOKBACK = 256  # bytes before a `{` searched for that end; more whitespace: no cut there
_MAX_HEADER = 64 * 2**20  # text before traceEvents (deviceProperties, distributedInfo, ...)
_WS = b" \t\r\n"
_WS_RUN = re.compile(rb"[ \t\r\n]*")


class SplitError(Exception):
    """The file is not laid out as expected: read it the plain way instead."""


class EventStream:
    """Iterate to get JSON arrays of complete events; afterwards ``skeleton`` is the document
    with an empty ``traceEvents`` (all its other keys, wherever they were).

    The text is kept in one buffer that the pieces are appended to and the events cut from,
    each byte of it searched for a cut once: time and memory follow the size of the text, even
    for gigabytes of whitespace (dropped where it leads the document or the events). The buffer
    never passes ``max_held`` bytes: text that long without a cut (one huge event) is refused
    in a :class:`~fsobs.errors.TraceReadError`, as reading the file whole would refuse it.
    """

    def __init__(self, path: Location, max_bytes: int, max_held: int) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._max_held = max_held
        self.skeleton = b""

    def __iter__(self) -> Iterator[bytes]:
        buf = bytearray()
        header = b""
        searched = 0  # no cut starts before this offset of buf
        for text in text_pieces(self._path, self._max_bytes):
            buf += text.lstrip(_WS) if not buf else text
            if not header:
                found = _ARRAY_START.search(buf)
                if found is None:
                    if len(buf) > _MAX_HEADER:
                        raise SplitError("no traceEvents array near the start")
                    continue
                header = bytes(buf[: found.end()])
                blank = _WS_RUN.match(buf, found.end())  # found without copying buf
                assert blank is not None  # "*": an empty run matches too
                del buf[: blank.end()]
            cut = _last_boundary(buf, searched)
            searched = len(buf)
            if cut is not None:
                yield _as_array(buf, cut[0])
                del buf[: cut[1]]
                searched -= cut[1]
            elif len(buf) > self._max_held:
                raise TraceReadError(f"one event is {held_over(self._max_held)}", path=self._path)
        if not header:
            raise SplitError("no traceEvents array")
        events, trailer = _split_tail(bytes(buf))
        if events.strip(_WS):
            yield b"[" + events + b"]"
        self.skeleton = header + b"]" + trailer


def _as_array(buf: bytearray, end: int) -> bytes:
    """``b"[" + buf[:end] + b"]"``, copied once (a slice of a bytearray is a copy, and so is
    each ``+``: for MBs of text, each copy costs as much as the rest of the cut)."""
    with memoryview(buf) as view:
        return b"".join((b"[", view[:end], b"]"))


def _last_boundary(buf: bytearray, start: int) -> tuple[int, int] | None:
    """(end of the last complete event, start of the next) for the last ``}`` ``,`` ``{``
    whose ``{`` is at ``start`` or after."""
    pos = len(buf)
    while (pos := buf.rfind(b"{", start, pos)) > 0:
        end = _EVENT_END.search(buf, max(0, pos - _LOOKBACK), pos)
        if end is not None:
            return end.start() + 1, pos
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
        except (msgspec.DecodeError, RecursionError):
            continue
        return buf[: found.start() + 1], trailer
    raise SplitError("cannot find the end of traceEvents")
