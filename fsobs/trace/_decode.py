"""Read one Kineto trace file and decode it with typed msgspec structs.

Only the fields the analyzer uses are declared; msgspec skips everything else while decoding,
and the rarely used collective fields stay raw JSON (``msgspec.Raw``) until they are needed,
so a trace costs a fraction of ``json.load`` in time and memory.
"""

from __future__ import annotations

import gzip
import io
import zlib

import msgspec

from fsobs.errors import TraceFormatError, TraceReadError
from fsobs.storage import Location, read_bytes

RAW_NONE = msgspec.Raw()
GZIP_MAGIC = b"\x1f\x8b"
_MAX_RATIO = 64  # trusted gzip expansion for the first buffer (Kineto JSON compresses ~10x)
DEFAULT_MAX_TRACE_BYTES = 16 * 2**30  # decompressed size limit per file


class Args(msgspec.Struct, gc=False):
    """The ``args`` of an event: the lifted keys, the rest is skipped."""

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


class _StrictTraceFile(TraceFile):
    """Everything typed at once: used only to word the error of a file that failed to decode."""

    # the same field, typed: a subclass that narrows it on purpose
    traceEvents: list[Event]  # type: ignore[assignment]  # noqa: N815


_DECODER = msgspec.json.Decoder(TraceFile)
_STRICT_DECODER = msgspec.json.Decoder(_StrictTraceFile)
_EVENTS_DECODER = msgspec.json.Decoder(list[Event])


def read_trace_bytes(path: Location, max_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> bytes | bytearray:
    """The JSON text of ``path`` (plain or gzip, local or remote); refuses anything over
    ``max_bytes``."""
    try:
        raw = read_bytes(path)
    except OSError as exc:
        raise TraceReadError(f"cannot read file: {exc.strerror or exc}", path=path) from exc
    if not raw.startswith(GZIP_MAGIC):
        if len(raw) > max_bytes:
            raise TraceReadError(f"file is {_size(len(raw))}, {_over(max_bytes)}", path=path)
        return raw
    if len(raw) < 18:
        raise TraceReadError("truncated gzip file (shorter than a gzip header)", path=path)
    claimed = int.from_bytes(raw[-4:], "little")  # ISIZE: uncompressed size mod 2**32
    if claimed > max_bytes:
        raise TraceReadError(
            f"gzip trailer claims {_size(claimed)} uncompressed, {_over(max_bytes)}", path=path
        )
    return _gunzip(raw, path, max_bytes)


def _gunzip(raw: bytes, path: Location, max_bytes: int) -> bytes | bytearray:
    """Decompress into one buffer of the size the trailer announces (no second copy).

    The trailer's size is the last member's, modulo 2**32: when the stream holds more, the rest
    is read in chunks, still never past ``max_bytes``.
    """
    claimed = int.from_bytes(raw[-4:], "little")
    buf = bytearray(min(claimed, _MAX_RATIO * len(raw)))  # a lying trailer gets no huge buffer
    view = memoryview(buf)
    size = 0
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            while size < len(buf) and (n := stream.readinto(view[size:])):
                size += n
            rest = stream.read(max_bytes + 1 - size)
    except EOFError as exc:
        raise TraceReadError(
            "truncated gzip file (ends before the end of stream)", path=path
        ) from exc
    except (OSError, zlib.error) as exc:  # "Error -3 while decompressing data: <reason>"
        reason = str(exc).rpartition(": ")[2].lower()
        raise TraceReadError(f"corrupt gzip data ({reason})", path=path) from exc
    finally:
        view.release()
    if size + len(rest) > max_bytes:
        raise TraceReadError(f"decompressed data is {_over(max_bytes)}", path=path)
    if size < len(buf) or rest:
        del buf[size:]
        buf += rest
    return buf


def _over(max_bytes: int) -> str:
    return (
        f"over the {_size(max_bytes)} limit per trace "
        "(raise it with --max-trace-gb or LoadConfig.max_trace_bytes)"
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
    return _decode(_DECODER, data, path)


def decode_event_array(text: bytes) -> list[Event]:
    """Typed events of a JSON array of events (msgspec's errors are left to the caller)."""
    return _EVENTS_DECODER.decode(text)


def decode_events(raws: list[msgspec.Raw], data: bytes | bytearray, path: Location) -> list[Event]:
    """Typed events of a batch of raw events taken from ``data``."""
    try:
        return _EVENTS_DECODER.decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.MsgspecError, UnicodeDecodeError):
        _decode(_STRICT_DECODER, data, path)  # raises the error, worded for the whole file
        raise


def _decode(
    decoder: msgspec.json.Decoder[TraceFile] | msgspec.json.Decoder[_StrictTraceFile],
    data: bytes | bytearray,
    path: Location,
) -> TraceFile:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        detail, field = _validation_detail(str(exc))
        raise TraceFormatError(detail, path=path, rank=_rank_hint(data), field=field) from exc
    except msgspec.DecodeError as exc:
        raise TraceFormatError(_syntax_detail(str(exc), data), path=path) from exc
    except UnicodeDecodeError as exc:  # msgspec checks UTF-8 string by string
        start = data.find(exc.object)
        detail = f"not UTF-8 text: invalid byte 0x{exc.object[exc.start]:02x}"
        if start >= 0:
            detail += _location(data, start + exc.start)
        raise TraceFormatError(detail, path=path, rank=_rank_hint(data)) from exc


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
    """The ``distributedInfo.rank`` of a file that failed to decode, when it still tells it."""
    try:
        info = _RANK_DECODER.decode(data).distributedInfo
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None
    rank = info.rank if info is not None else None
    return rank if type(rank) is int and rank >= 0 else None


def raw_value(raw: msgspec.Raw) -> object:
    """Decode one lazily kept field; ``None`` when absent."""
    return msgspec.json.decode(raw) if raw else None
