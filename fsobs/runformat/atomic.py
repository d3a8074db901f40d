"""Atomic file publication: write under a temporary name in the same directory, then rename.

A reader (or a crash) never sees a half-written file under its final name: either the old file
(or none) or the complete new one. Temporary names start with a dot and end in ``.tmp`` so that
the loader, which picks up every ``*.json`` / ``*.json.gz`` in a run directory, never reads one.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

TEMP_RE = re.compile(r"^\..+\.(?:[a-z]+-)?\d+\.[0-9a-f]{8}\.tmp$")
"""Names made by :func:`temp_path` (leftovers of an interrupted write)."""


def temp_path(final: Path, tag: str = "") -> Path:
    """A fresh temporary name next to ``final`` (``.<name>.[<tag>-]<pid>.<hex>.tmp``)."""
    prefix = f"{tag}-" if tag else ""
    return final.with_name(f".{final.name}.{prefix}{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish(temp: Path, final: Path) -> None:
    """Flush ``temp`` to disk and rename it to ``final`` (replacing any older file)."""
    with open(temp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temp, final)
    fsync_dir(final.parent)


def write_atomic(final: Path, data: bytes) -> None:
    """Write ``data`` to ``final`` atomically; no temporary file is left behind on failure."""
    temp = temp_path(final)
    try:
        with open(temp, "xb") as handle:
            handle.write(data)
        publish(temp, final)
    finally:
        temp.unlink(missing_ok=True)
