"""Which JSON files of a run folder are Kineto traces: by name, else by their opening bytes.

A run folder may hold JSON that is not a trace (a user's ``losses.json``, a tool's
``metrics.json.gz``). A file named as a trace (``rank<R>.trace.json[.gz]``, torch's
``*.pt.trace.json[.gz]``) is one, whatever it holds: if it is damaged, the loader says so. Any
other ``*.json`` / ``*.json.gz`` is a trace when the first :data:`SNIFF_BYTES` of its text
(gunzipped) name a key that every Kineto trace has near its start (:data:`MARKERS`); a file
whose opening cannot be read or decompressed is kept too, for the loader to report. The files
left out make one note of the run's warnings (:data:`NOT_TRACE_NOTE`); a single file, or a list
of files, given to the loader is read as a trace whatever its name.
"""

from __future__ import annotations

import zlib

from fsobs.runformat.names import is_named_trace
from fsobs.storage import Location, open_binary
from fsobs.trace._decode import GZIP_MAGIC

SNIFF_BYTES = 64 * 2**10
"""How much of a file's text is looked at (torch writes the markers in its first few hundred
bytes; ``deviceProperties`` of 8 GPUs takes about 4 KiB)."""
MARKERS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"', b'"ph"')
"""Keys of a Kineto trace's top level, and of any Chrome trace event (``ph``: a bare array of
events reaches the loader, which says what it is)."""
NOT_TRACE_NOTE = (
    "not read as traces: {names} (JSON without traceEvents, schemaVersion, distributedInfo "
    f"or ph in its first {SNIFF_BYTES // 2**10} KiB)"
)
"""The one note of the files left out; ``names`` is their list."""


def is_trace_file(location: Location) -> bool:
    """Whether a ``*.json`` / ``*.json.gz`` file of a run folder is read as a Kineto trace."""
    if is_named_trace(location.name):
        return True
    try:
        text = _opening(location)
    except (OSError, zlib.error):
        return True
    return any(marker in text for marker in MARKERS)


def _opening(location: Location) -> bytes:
    """The first :data:`SNIFF_BYTES` of the file's text (fewer if it is shorter)."""
    raw = b""
    with open_binary(location) as f:
        while len(raw) < SNIFF_BYTES and (chunk := f.read(SNIFF_BYTES - len(raw))):
            raw += chunk
    if not raw.startswith(GZIP_MAGIC):
        return raw
    return zlib.decompressobj(wbits=31).decompress(raw, SNIFF_BYTES)
