"""Read one Kineto trace file and decode it with typed msgspec structs.

Only the fields the analyzer uses are declared; msgspec skips everything else while decoding,
and the rarely used collective fields stay raw JSON (``msgspec.Raw``) until they are needed,
so a trace costs a fraction of ``json.load`` in time and memory.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec

from fsobs.errors import TraceFormatError, TraceReadError

RAW_NONE = msgspec.Raw()
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_TRACE_BYTES = 16 * 2**30  # decompressed size limit per file


class Args(msgspec.Struct, gc=False):
    """The ``args`` of an event: the lifted keys, the rest is skipped."""

    stream: int | str | None = None
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
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
    input_type: msgspec.Raw = msgspec.field(default=RAW_NONE, name="Input type")
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
    traceEvents: list[Event]  # noqa: N815 (Kineto's key)
    distributedInfo: DistributedInfo | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    host_name: str | None = None
    deviceProperties: msgspec.Raw = RAW_NONE  # noqa: N815


_DECODER = msgspec.json.Decoder(TraceFile)


def read_trace_bytes(path: Path, max_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> bytes:
    """The JSON text of ``path`` (plain or gzip); refuses anything over ``max_bytes``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceReadError(f"cannot read file: {exc.strerror or exc}", path=path) from exc
    if not raw.startswith(GZIP_MAGIC):
        if len(raw) > max_bytes:
            raise TraceReadError(_too_big(len(raw), max_bytes), path=path)
        return raw
    if len(raw) < 18:
        raise TraceReadError("truncated gzip file (shorter than a gzip header)", path=path)
    claimed = int.from_bytes(raw[-4:], "little")  # ISIZE: uncompressed size mod 2**32
    if claimed > max_bytes:
        raise TraceReadError(
            f"gzip trailer claims {claimed / 2**30:.1f} GiB uncompressed; "
            + _too_big(claimed, max_bytes),
            path=path,
        )
    return _gunzip(raw, path, max_bytes)


def _gunzip(raw: bytes, path: Path, max_bytes: int) -> bytes:
    out: list[bytes] = []
    size = 0
    data = raw
    while data:  # a gzip file may hold several members
        inflater = zlib.decompressobj(wbits=31)
        try:
            chunk = inflater.decompress(data, max_bytes + 1 - size)
        except zlib.error as exc:
            raise TraceReadError(f"corrupt gzip data ({exc})", path=path) from exc
        size += len(chunk)
        out.append(chunk)
        if size > max_bytes or inflater.unconsumed_tail:
            raise TraceReadError(_too_big(size, max_bytes), path=path)
        if not inflater.eof:
            raise TraceReadError("truncated gzip file (ends before the end of stream)", path=path)
        data = inflater.unused_data.lstrip(b"\x00")
    return b"".join(out)


def _too_big(size: int, max_bytes: int) -> str:
    return (
        f"over the {max_bytes / 2**30:.1f} GiB limit per trace "
        f"(size {size / 2**30:.1f} GiB or more; raise LoadConfig.max_trace_bytes)"
    )


def decode_trace(data: bytes, path: Path) -> TraceFile:
    """Decode JSON text into a :class:`TraceFile`; errors name the JSON path of the bad field."""
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `")
        field = where.rstrip("`").removeprefix("$.") if where else None
        if field is None and "missing required field" in message:
            field = message.split("`")[1] if "`" in message else None
        raise TraceFormatError(message, path=path, field=field) from exc
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "invalid utf-8" in text.lower() or "utf" in text.lower():
            raise TraceFormatError(f"not UTF-8 text ({text})", path=path) from exc
        raise TraceFormatError(f"not valid JSON ({text})", path=path) from exc


def raw_value(raw: msgspec.Raw) -> object:
    """Decode one lazily kept field; ``None`` when absent."""
    return msgspec.json.decode(raw) if raw else None
