"""The store's persistent analysis cache: each run's :class:`fsobs.Analysis` on disk (no Streamlit).

Parsing a big run takes seconds (an 8-rank run of ~100 MB per rank: ~10 s); reading its analysis
back takes a tenth of a second. So besides Streamlit's in-memory cache (:mod:`dashboard.cache`),
every analysis is kept in the store::

    <store>/.fsobs-cache/
      .gitignore                       "*": a store inside a git checkout stays clean
      <sha256 of the run id>.pkl       one JSON header line, the pickled Analysis, an end line

The header holds :data:`FORMAT`, a digest of fsobs's source code and of the Python / pandas /
numpy versions (:func:`code_digest`), the run id and the run's (name, mtime, size) signature
(:func:`dashboard.store.signature_of`). An entry is used only when all of them match the run as
it is now; a stale, corrupt or unreadable entry is ignored, and the next analysis replaces it.

The end line (``fsobs-cache-end <size> <sha256>\\n`` right after the pickle, fixed length)
gives the pickle's length and digest: an entry is fresh only if the file is exactly header +
pickle + end line long (a file cut short, by a crash or a full disk, is not), and is unpickled
only if the pickle's digest matches.

- **Safety.** Unpickling runs code, so an entry is read only if the cache folder and the file are
  not symbolic links, belong to this process's user and nobody else may write them (the folder
  is created 0700, the files 0600). Uploads cannot write here: they land in
  ``uploads/<sanitized name>`` (no leading dot), archive members are flattened to base names
  and only run files are kept, and the store scan skips hidden folders.
- **Atomic writes:** a temporary file in the same folder, then ``os.replace``.
- **Bounded:** after each write, the least recently used entries (by modification time, which
  every read refreshes) are deleted until the folder holds at most :func:`max_bytes`
  (``FSOBS_CACHE_MAX_MB``, default :data:`DEFAULT_MAX_MB`; ``0`` turns the disk cache off).
  The entry just written is always kept.
- **Several servers, one store:** readers, writers and evictions in other processes only race
  on whole files: a reader holds an open file (still readable after another process deletes
  it), a writer renames a complete file over the old one, and an entry deleted, replaced or
  half-written (a ``.tmp-`` file) by someone else is skipped, never an error. Temporary files a
  crashed writer left are removed after :data:`STALE_TEMP_S`.
- **Never in the way:** every failure (read-only store, full disk, a bad entry) is logged and
  swallowed; the page then analyzes the run as if there were no cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

import fsobs
from dashboard.store import Signature
from fsobs import Analysis

CACHE_DIR = ".fsobs-cache"
FORMAT = 2
"""Bump when the file layout changes."""
_MAX_HEADER = 1 << 20
_END = "fsobs-cache-end"
DEFAULT_MAX_MB = 2048
"""Default size cap of the cache folder (MiB)."""
MAX_MB_ENV = "FSOBS_CACHE_MAX_MB"
STALE_TEMP_S = 3600.0
"""A temporary file older than this is a crashed writer's leftover."""

logger = logging.getLogger(__name__)


def entry_path(store: Path, run_id: str) -> Path:
    """Where the analysis of ``run_id`` is kept."""
    return store / CACHE_DIR / f"{hashlib.sha256(run_id.encode()).hexdigest()}.pkl"


@functools.cache
def code_digest() -> str:
    """Digest of fsobs's source files and of the Python, pandas and numpy versions: an entry
    written by other code is stale."""
    digest = hashlib.sha256(
        f"{sys.version_info[:2]} pandas {pd.__version__} numpy {np.__version__}".encode()
    )
    package = Path(fsobs.__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def max_bytes() -> int:
    """The size cap of the cache folder: ``FSOBS_CACHE_MAX_MB`` MiB (default
    :data:`DEFAULT_MAX_MB`; a bad value is ignored with a warning)."""
    text = os.environ.get(MAX_MB_ENV, "").strip()
    if text:
        try:
            return max(0, int(float(text) * 2**20))
        except ValueError:
            _warn_once(f"ignoring {MAX_MB_ENV}={text!r}: not a number of MiB")
    return DEFAULT_MAX_MB * 2**20


def _header(run_id: str, signature: Signature) -> dict[str, object]:
    return {
        "format": FORMAT,
        "code": code_digest(),
        "run_id": run_id,
        "signature": [list(row) for row in signature],
    }


def _private(info: os.stat_result, kind: int) -> bool:
    """Of the expected kind (not a link), ours, and writable by no one else."""
    return (
        stat.S_IFMT(info.st_mode) == kind
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _end_line(size: int, digest: str) -> bytes:
    """The last line of an entry: the pickle's length and sha256 (fixed length)."""
    return f"{_END} {size:016x} {digest}\n".encode()


_END_LEN = len(_end_line(0, hashlib.sha256().hexdigest()))


class _Entry:
    """An open entry, positioned at its pickle: ``size`` bytes whose sha256 is ``digest``."""

    def __init__(self, handle: IO[bytes], size: int, digest: str, path: Path) -> None:
        self.handle, self.size, self.digest, self.path = handle, size, digest, path

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> _Entry:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def load(self) -> Any:
        """Unpickle the analysis, checking the digest of what is read (ValueError if it differs,
        or if the pickle ends before its declared length)."""
        reader = _HashingReader(self.handle, self.size)
        analysis = pickle.load(reader)
        if reader.left or reader.digest.hexdigest() != self.digest:
            raise ValueError("the pickle does not match its digest")
        return analysis


class _HashingReader:
    """The file object ``pickle.load`` reads from: at most ``size`` bytes, hashed on the way."""

    def __init__(self, handle: IO[bytes], size: int) -> None:
        self.handle, self.left, self.digest = handle, size, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.handle.read(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        self.digest.update(data)
        return data

    def readline(self) -> bytes:
        data = self.handle.readline(self.left)
        self.left -= len(data)
        self.digest.update(data)
        return data


class _HashingWriter:
    """The file object ``pickle.dump`` writes to: counts and hashes what goes through."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.size, self.digest = out, 0, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.digest.update(data)
        size = memoryview(data).nbytes
        self.size += size
        return size


def _open_entry(
    store: Path, run_id: str, signature: Signature, *, touch: bool = False
) -> _Entry | None:
    """The entry opened at its pickle, if it is safe to read, matches and is whole; else None.
    ``touch``: mark it as used now (its modification time, which eviction goes by)."""
    path = entry_path(store, run_id)
    try:
        if not _private(os.lstat(path.parent), stat.S_IFDIR):
            _warn_once(f"ignoring {path.parent}: not a private directory of this user")
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None  # no entry (the usual case)
    handle = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        if not _private(info, stat.S_IFREG):
            _warn_once(f"ignoring {path}: not a private file of this user")
        elif json.loads(handle.readline(_MAX_HEADER)) == _header(run_id, signature):
            entry = _whole(handle, info.st_size, path)
            if entry is None:
                _warn_once(f"ignoring {path}: cut short (no end line, or not at its end)")
            else:
                if touch:
                    _touch(fd)
                return entry
    except (OSError, ValueError) as exc:
        logger.warning("ignoring %s: unreadable header (%s)", path, exc)
    handle.close()
    return None


def _whole(handle: IO[bytes], file_size: int, path: Path) -> _Entry | None:
    """The entry if the file ends with an end line whose length is the pickle's; ``handle`` is
    just past the header, and is left there."""
    start = handle.tell()
    size = file_size - start - _END_LEN
    if size <= 0:
        return None
    handle.seek(start + size)
    end = handle.read(_END_LEN).decode("ascii", errors="replace").split()
    handle.seek(start)
    if len(end) != 3 or end[0] != _END or end[1] != f"{size:016x}":
        return None
    return _Entry(handle, size, end[2], path)


def _touch(fd: int) -> None:
    """Mark an entry as used now (the last to be evicted); a read-only store keeps its order."""
    try:
        os.utime(fd)
    except OSError:
        pass


def is_fresh(store: Path, run_id: str, signature: Signature) -> bool:
    """Whether a whole entry for this version of the run is there (its header and length are
    checked, not the analysis)."""
    entry = _open_entry(store, run_id, signature)
    if entry is None:
        return False
    entry.close()
    return True


def read(store: Path, run_id: str, signature: Signature) -> Analysis | None:
    """The cached analysis of this version of the run, its paths pointing into the store as it
    is now (:func:`relocate`); None if there is no usable entry."""
    entry = _open_entry(store, run_id, signature, touch=True)
    if entry is None:
        return None
    with entry:
        try:
            analysis = entry.load()
        except Exception as exc:  # a damaged or foreign pickle: analyze again
            logger.warning("ignoring %s: %s: %s", entry.path, type(exc).__name__, exc)
            return None
    if not isinstance(analysis, Analysis):
        logger.warning("ignoring %s: holds a %s", entry.path, type(analysis).__name__)
        return None
    return relocate(analysis, store / run_id)


def write(store: Path, run_id: str, signature: Signature, analysis: Analysis) -> bool:
    """Keep ``analysis`` for this version of the run (replacing any older entry), then evict the
    least recently used entries beyond :func:`max_bytes`; False, with a warning logged, if it
    cannot be written (or the disk cache is off)."""
    path = entry_path(store, run_id)
    cap = max_bytes()
    if cap <= 0:
        return False
    tmp: str | None = None
    try:
        _make_folder(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
        with os.fdopen(fd, "wb") as out:
            out.write(json.dumps(_header(run_id, signature)).encode() + b"\n")
            payload = _HashingWriter(out)
            pickle.dump(analysis, payload, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(_end_line(payload.size, payload.digest.hexdigest()))
        os.replace(tmp, path)
    except Exception as exc:  # read-only store, full disk, an unpicklable object, ...
        _warn_once(f"cannot cache analyses in {path.parent}: {exc}")
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False
    try:
        evict(path.parent, cap, keep=path)
    except OSError as exc:
        _warn_once(f"cannot evict old analyses in {path.parent}: {exc}")
    return True


def evict(folder: Path, cap: int, *, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used entries (oldest modification time first) until the
    entries in ``folder`` take at most ``cap`` bytes, never ``keep``; also temporary files
    older than :data:`STALE_TEMP_S`. Entries that vanish meanwhile (another server evicted or
    replaced them) are skipped. Returns the entries deleted."""
    now, entries = time.time(), []
    for path in folder.iterdir():
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if path.name.startswith(".tmp-"):
            if now - info.st_mtime > STALE_TEMP_S:
                path.unlink(missing_ok=True)
        elif path.suffix == ".pkl" and stat.S_ISREG(info.st_mode):
            entries.append((info.st_mtime_ns, path.name, path, info.st_size))
    total = sum(size for *_, size in entries)
    deleted = []
    for _, _, path, size in sorted(entries):
        if total <= cap:
            break
        if path == keep:
            continue
        path.unlink(missing_ok=True)
        total -= size
        deleted.append(path)
    if deleted:
        logger.info("disk cache: evicted %d least recently used entries", len(deleted))
    return deleted


@functools.cache
def _warn_once(message: str) -> None:
    """Log a problem of the cache folder once per server, not on every page run."""
    logger.warning(message)


def _make_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, exist_ok=True)
    if not _private(os.lstat(folder), stat.S_IFDIR):
        raise PermissionError(f"{folder} is not a private directory of this user")
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n", encoding="utf-8")


def relocate(analysis: Analysis, folder: Path) -> Analysis:
    """Point the run's and its ranks' paths into ``folder`` (trace files keep their names): an
    analysis made in an upload's staging folder, or before the store moved, names files that
    are now elsewhere. Changes ``analysis`` in place and returns it."""
    run = analysis.run
    run.path = folder
    for summary in run.ranks.values():
        summary.path = folder / summary.path.name
    return analysis
