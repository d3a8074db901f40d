"""Read one Kineto trace file and decode it with typed msgspec structs.

Only the fields the analyzer uses are declared; msgspec skips everything else while decoding,
and the rarely used collective fields stay raw JSON (``msgspec.Raw``) until they are needed,
so a trace costs a fraction of ``json.load`` in time and memory.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, cast

import msgspec

from fsobs.errors import TraceFormatError, TraceReadError
from fsobs.storage import Location, Readable, open_binary, open_local

RAW_NONE = msgspec.Raw()
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_TRACE_BYTES = 4 * 2**30
"""Largest text of one trace file, decompressed, read as a stream (a few MiB of it held at a
time): 8 times the largest real traces (torchrec GPU traces take 50-500 MB per rank)."""
DEFAULT_MAX_HELD_BYTES = 512 * 2**20
"""Largest text held whole in memory: all of a file that the streaming reader cannot cut into
events (:mod:`fsobs.trace._stream`), or one event or header too long to cut. The largest real
traces fit whole; a real event takes a few KiB. What it bounds is what a hostile file (one huge
string, a gzip bomb, megabytes of junk) costs a parser before it is refused."""
PIECE = 4 * 2**20
"""Decompressed bytes per piece of :func:`text_pieces`."""


class Args(msgspec.Struct, gc=False, omit_defaults=True):
    """The ``args`` of an event: the lifted keys, the rest is skipped (and, written out, the
    absent ones left out: an empty ``Raw`` is no JSON)."""

    stream: int | str = -1
    correlation: int = -1
    # collective metadata (record_param_comms and NCCL kernels), decoded on demand
    coll_name: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Collective name")
    in_nelems: msgspec.Raw = msgspec.field(default=RAW_NONE, name="In msg nelems")
    out_nelems: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Out msg nelems")
    group_size: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Group size")
    dtype: msgspec.Raw = RAW_NONE
    in_split: msgspec.Raw = msgspec.field(default=RAW_NONE, name="In split size")
    out_split: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Out split size")
    pg_name: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Process Group Name")
    pg_desc: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Process Group Ranks")
    seq: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Seq")
    comms_id: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Comms Id")
    input_dims: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Input Dims")
    input_dims_2021: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Input type")
    grid: msgspec.Raw = RAW_NONE  # a kernel's launch shape (contention compares like kernels)
    block: msgspec.Raw = RAW_NONE
    name: msgspec.Raw = RAW_NONE  # thread_name / process_name metadata


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    args: Args | None = None


class PgConfig(msgspec.Struct, gc=False):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    backend_config: str | None = None
    pg_size: int | None = None
    ranks: list[int] | str | None = None


class DistributedInfo(msgspec.Struct, gc=False):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    pg_config: list[PgConfig] | None = None
    nccl_version: str | None = None


class TraceFile(msgspec.Struct, gc=False):
    """The top level; events stay raw JSON slices until :func:`decode_events` takes them in
    batches, so the typed structs of only one batch exist at a time."""

    traceEvents: list[msgspec.Raw]  # noqa: N815 (Kineto's key)
    distributedInfo: DistributedInfo | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    host_name: str | None = None
    deviceProperties: msgspec.Raw = RAW_NONE  # noqa: N815


_DECODER = msgspec.json.Decoder(TraceFile)
_EVENTS_DECODER = msgspec.json.Decoder(list[Event])


def read_trace_bytes(
    path: Location, max_bytes: int = DEFAULT_MAX_HELD_BYTES, *, held: bool = True
) -> bytearray:
    """The JSON text of ``path`` (plain or gzip, local or remote), held whole; refuses anything
    over ``max_bytes``, which is the limit of text held whole (``held``) or per trace.

    The text is gathered piece by piece (:func:`text_pieces`) into one growing buffer, so
    memory follows the text's size: nothing is reserved for the limit, nothing held twice.
    """
    buf = bytearray()
    for piece in text_pieces(path, max_bytes, held=held):
        buf += piece
    return buf


def text_pieces(
    path: Location, max_bytes: int, *, held: bool = False, zlib_only: bool = False
) -> Iterator[bytes]:
    """The file's text in pieces of at most :data:`PIECE` bytes, gzip decompressed (several
    members too), front to back (no seek, so a remote file is one stream).

    Raises :class:`TraceReadError` when the file cannot be read, is not whole gzip, or its text
    passes ``max_bytes``; a local file too big by its size or its gzip trailer is refused
    before anything is decompressed. ``held``: the caller holds the whole text (the error says
    so). ``zlib_only``: zlib decompresses, even where ISA-L is installed (:func:`_inflaters`).
    """
    over = held_over if held else _over
    if isinstance(path, Path):
        _check_local_size(path, max_bytes, over)
    total = 0
    new_inflater, errors = (_zlib_inflater, (zlib.error,)) if zlib_only else _inflaters()
    try:
        with open_binary(path) as f:
            raw = _first_bytes(f)
            gz = raw.startswith(GZIP_MAGIC)
            inflater = new_inflater() if gz else None
            while raw:
                while raw:
                    if inflater is None:
                        text, raw = raw, b""
                    else:
                        text = _inflate(inflater, raw, path, errors)
                        raw = inflater.unconsumed_tail
                        if inflater.eof:
                            raw = inflater.unused_data.lstrip(b"\x00")  # padding between members
                            inflater = new_inflater() if raw else inflater
                    total += len(text)
                    if total > max_bytes:
                        what = "decompressed data" if gz else "file"
                        raise TraceReadError(f"{what} is {over(max_bytes)}", path=path)
                    if text:
                        yield text
                raw = f.read(PIECE // 8 if gz else PIECE)
    except OSError as exc:
        raise TraceReadError(f"cannot read file: {exc.strerror or exc}", path=path) from exc
    if inflater is not None and not inflater.eof:
        raise TraceReadError("truncated gzip file (ends before the end of stream)", path=path)


class _Inflater(Protocol):
    """A gzip decompressor of one member: ``zlib``'s ``decompressobj(wbits=31)`` or ISA-L's."""

    @property
    def eof(self) -> bool: ...

    @property
    def unconsumed_tail(self) -> bytes: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int = 0, /) -> bytes: ...


def _zlib_inflater() -> _Inflater:
    return zlib.decompressobj(wbits=31)


def _inflaters() -> tuple[Callable[[], _Inflater], tuple[type[Exception], ...]]:
    """A maker of gzip decompressors and the errors they raise: ISA-L's (``isal``, 3-4 times
    zlib's speed, the same bytes) when it is installed, else zlib's. Imported on first use, so
    that start-up does not pay for it."""
    try:
        from isal import isal_zlib
    except ImportError:
        return _zlib_inflater, (zlib.error,)

    def isal_inflater() -> _Inflater:
        return isal_zlib.decompressobj(wbits=31)

    isal_error = cast("type[Exception]", isal_zlib.error)  # its stub says an instance
    return isal_inflater, (isal_error, zlib.error)


def _inflate(
    inflater: _Inflater, raw: bytes, path: Location, errors: tuple[type[Exception], ...]
) -> bytes:
    try:
        return inflater.decompress(raw, PIECE)
    except errors as exc:
        if isinstance(exc, zlib.error):  # "Error -3 while decompressing data: <reason>"
            reason = str(exc).rpartition(": ")[2].lower()
        else:  # ISA-L's words: the file read again by zlib raises zlib's error instead
            for _ in text_pieces(path, sys.maxsize, zlib_only=True):
                pass
            reason = str(exc).lower()  # zlib found no fault
        raise TraceReadError(f"corrupt gzip data ({reason})", path=path) from exc


def _first_bytes(f: Readable) -> bytes:
    """The first read, at least two bytes long unless the file is shorter (streams may return
    less than asked)."""
    raw = f.read(PIECE // 8)
    while 0 < len(raw) < len(GZIP_MAGIC) and (more := f.read(PIECE // 8)):
        raw += more
    return raw


def _check_local_size(path: Path, max_bytes: int, over: Callable[[int], str]) -> None:
    """Refuse a local file by its size (plain) or its gzip trailer (ISIZE: the last member's
    uncompressed size mod 2**32), before reading it; and anything but a regular file."""
    claimed = 0
    try:
        with open_local(path) as f:
            size = os.fstat(f.fileno()).st_size
            gz = f.read(2) == GZIP_MAGIC
            if gz and size >= 18:
                f.seek(-4, 2)
                claimed = int.from_bytes(f.read(4), "little")
    except OSError as exc:
        raise TraceReadError(f"cannot read file: {exc.strerror or exc}", path=path) from exc
    if not gz:
        if size > max_bytes:
            raise TraceReadError(f"file is {_size(size)}, {over(max_bytes)}", path=path)
        return
    if size < 18:
        raise TraceReadError("truncated gzip file (shorter than a gzip header)", path=path)
    if claimed > max_bytes:
        raise TraceReadError(
            f"gzip trailer claims {_size(claimed)} uncompressed, {over(max_bytes)}", path=path
        )


def _over(max_bytes: int) -> str:
    return (
        f"over the {_size(max_bytes)} limit per trace "
        "(raise it with --max-trace-gb or LoadConfig.max_trace_bytes)"
    )


def held_over(max_bytes: int) -> str:
    """The end of the error for text over the limit of what is held whole."""
    return (
        f"over the {_size(max_bytes)} limit of text held whole: the streaming reader cannot "
        "cut it into events (raise it with LoadConfig.max_held_bytes)"
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def decode_trace(data: bytes | bytearray, path: Location) -> TraceFile:
    """Decode JSON text into a :class:`TraceFile`.

    Errors name the JSON path of the bad field, and the rank when the file still tells it.
    """
    try:
        return _DECODER.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError) as exc:
        raise _format_error(exc, data, path) from exc


def decode_event_array(text: bytes) -> list[Event]:
    """Typed events of a JSON array of events (msgspec's errors, and ``RecursionError`` for
    text nested too deep, are left to the caller)."""
    return _EVENTS_DECODER.decode(text)


def decode_events(
    raws: list[msgspec.Raw], data: bytes | bytearray, path: Location, offset: int
) -> list[Event]:
    """Typed events of a batch of raw events taken from ``data``, the first of them
    ``traceEvents[offset]`` (which an error names)."""
    try:
        return _EVENTS_DECODER.decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError) as exc:
        raise _format_error(exc, data, path, offset) from exc


_MAX_DEPTH_TEXT = (
    "not valid JSON for fsobs: arrays or objects nested deeper than Python's recursion limit"
)


def _format_error(
    exc: Exception, data: bytes | bytearray, path: Location, offset: int | None = None
) -> TraceFormatError:
    """The one-line error for a decoding failure of ``data``; ``offset``: the failure is in a
    batch of events whose first is ``traceEvents[offset]``."""
    if isinstance(exc, msgspec.ValidationError):
        detail, field = _validation_detail(str(exc))
        if offset is not None and field is not None:
            field = _BATCH_INDEX.sub(lambda m: f"traceEvents[{offset + int(m[1])}]", field)
        return TraceFormatError(detail, path=path, rank=_rank_hint(data), field=field)
    if isinstance(exc, RecursionError):
        return TraceFormatError(_MAX_DEPTH_TEXT, path=path, rank=_rank_hint(data))
    if isinstance(exc, UnicodeDecodeError):  # msgspec checks UTF-8 string by string
        start = data.find(exc.object)
        detail = f"not UTF-8 text: invalid byte 0x{exc.object[exc.start]:02x}"
        if start >= 0:
            detail += _location(data, start + exc.start)
        return TraceFormatError(detail, path=path, rank=_rank_hint(data))
    return TraceFormatError(_syntax_detail(str(exc), data), path=path)


_BATCH_INDEX = re.compile(r"^\[(\d+)\]")


_TYPES = {
    "int": "an integer",
    "float": "a float",
    "number": "a number",
    "str": "a string",
    "bool": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


_BARE_ARRAY = (
    " (a bare array of events is what the autograd profiler writes without Kineto, its legacy "
    "export_chrome_trace: no categories, streams or steps; record with torch.profiler instead)"
)


def _validation_detail(text: str) -> tuple[str, str | None]:
    """msgspec's "Expected `int | null`, got `str` - at `$.a[1].b`" -> (human text, "a[1].b")."""
    message, _, where = text.partition(" - at `")
    field = where.rstrip("`").removeprefix("$").removeprefix(".") or None
    if message.startswith("Object missing required field `"):
        name = message.split("`")[1]
        return "missing", f"{field}.{name}" if field else name
    if message.startswith("Expected `") and "`, got `" in message:
        expected, got = message.removeprefix("Expected `").rstrip("`").split("`, got `")
        types = expected.replace("int | float", "number").split(" | ")
        types = [t for t in types if t != "null"] or ["null"]
        wanted = " or ".join(_TYPES.get(t, t) for t in types)
        detail = f"expected {wanted}, got {_TYPES.get(got, got)}"
        if field:
            return detail, field
        return f"not a Kineto trace: {detail}{_BARE_ARRAY if got == 'array' else ''}", None
    return message[:1].lower() + message[1:], field


def _syntax_detail(text: str, data: bytes | bytearray) -> str:
    """msgspec's "JSON is malformed: invalid character (byte 12)" -> where and what, for humans."""
    if not data.strip():
        return "empty file"
    if text == "Input data was truncated":
        return "not valid JSON: truncated (the file ends in the middle of the JSON text)"
    reason, _, byte = text.removeprefix("JSON is malformed: ").rpartition(" (byte ")
    if not byte.rstrip(")").isdigit():
        return f"not valid JSON: {text}"
    pos = int(byte.rstrip(")"))
    token = next((t for t in ("NaN", "Infinity") if data.startswith(t.encode(), pos)), None)
    if token:
        reason = f"{token} is not a JSON number"
    return f"not valid JSON: {reason}{_location(data, pos)}"


def _location(data: bytes | bytearray, pos: int) -> str:
    """Where byte ``pos`` of ``data`` is, for a message: at line, column, near some text."""
    line = data.count(b"\n", 0, pos) + 1
    column = pos - data.rfind(b"\n", 0, pos)
    near = " ".join(data[max(0, pos - 24) : pos + 24].decode("utf-8", "backslashreplace").split())
    return f" at line {line}, column {column} near '{near}'"


class _RankInfo(msgspec.Struct, gc=False):
    rank: object = None


class _RankOnly(msgspec.Struct, gc=False):
    distributedInfo: _RankInfo | None = None  # noqa: N815


_RANK_DECODER = msgspec.json.Decoder(_RankOnly)


def _rank_hint(data: bytes | bytearray) -> int | None:
    """The ``distributedInfo.rank`` of a file that failed to decode, when it still tells it
    (found by text search when the file is nested too deep to decode)."""
    try:
        info = _RANK_DECODER.decode(data).distributedInfo
        rank = info.rank if info is not None else None
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None
    except RecursionError:
        found = _RANK_TEXT.search(data)
        rank = int(found[1]) if found else None
    return rank if type(rank) is int and 0 <= rank < 2**31 else None


_RANK_TEXT = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d{1,10})[\s,}]')


def raw_value(raw: msgspec.Raw) -> object:
    """Decode one lazily kept field; ``None`` when absent."""
    return msgspec.json.decode(raw) if raw else None
